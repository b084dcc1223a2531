// The egeria command line, as a library function (tools/cli.h), so that a program that
// registers its own models (models::register_model) is an egeria CLI that trains them:
//   egeria train --model resnet20 --dataset fashion-mnist --epochs 15 --out runs/r20
//   egeria train --model transformer-tiny --dataset en-es --data-dir datasets/en-es --out runs/tt
//   egeria eval  --out runs/r20
//   egeria report --out runs/r20 --against runs/r20-none
//   egeria bench step --model resnet56 --batch-size 128 --device cpu
#include <CLI/CLI.hpp>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <exception>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "core/parallel.h"
#include "data/dataset.h"
#include "dist/communicator.h"
#include "freeze/policy.h"
#include "models/model.h"
#include "quant/reference.h"
#include "tools/cli.h"
#include "train/export.h"
#include "train/report.h"
#include "train/safetensors.h"
#include "train/smartfrz_train.h"
#include "train/trainer.h"

namespace {

using eg::train::OnResume;
using eg::train::Option;

std::string joined(const std::vector<std::string>& v, const char* sep) {
  std::string s;
  for (auto& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

std::string shown(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_array()) {
    std::string s;
    for (auto& e : v) s += (s.empty() ? "" : ",") + shown(e);
    return s;
  }
  return v.dump();
}

// The values an option takes, from its registry where there is one.
std::string value_text(const Option& o) {
  if (o.key == "model") return joined(eg::models::model_names(), "|");
  if (o.key == "dataset") return joined(eg::data::dataset_names(), "|");
  if (o.key == "freeze") return joined(eg::freeze::policy_names(), "|");
  if (o.key == "freeze_reference") return joined(eg::quant::reference_precisions(), "|");
  return o.value_text;
}

// `egeria train`'s options, one per row of the option table (train/config.h), in its
// groups; their text is parsed by the table after CLI11 has split the command line.
std::vector<std::pair<const Option*, CLI::Option*>> add_train_options(CLI::App* train,
                                                                      std::vector<std::string>& texts) {
  const eg::train::TrainConfig defaults;
  const auto& table = eg::train::options();
  texts.resize(table.size());
  std::vector<std::pair<const Option*, CLI::Option*>> added;
  for (size_t i = 0; i < table.size(); ++i) {
    const Option& o = table[i];
    std::string help = o.help;
    if (o.on_resume == OnResume::free && o.key != "resume") help += " [may change on --resume]";
    if (o.on_resume == OnResume::warn)
      help += " [may change on --resume, with a warning: the run is then no longer bit-identical]";
    CLI::Option* x = nullptr;
    if (o.is_switch) {
      x = train->add_flag(o.flag)->description(help);
    } else {
      x = train->add_option(o.flag, texts[i], help);
      const std::string d = shown(o.get(defaults));
      x->option_text(value_text(o) + (d.empty() || o.key == "threads" || o.key == "cpu_winograd" ? "" : "=" + d));
    }
    x->group(eg::train::group_title(o.group));
    added.emplace_back(&o, x);
  }
  return added;
}

// CLI11's range validators name their bound as a 300-digit number: the same checks, in
// the words the training options use ("--iterations: must be positive, got 0").
CLI::Validator at_least(double lo, bool strict, const char* says) {
  return CLI::Validator(
      [lo, strict, says](std::string& s) -> std::string {
        try {
          size_t used = 0;
          const double v = std::stod(s, &used);
          if (used == s.size() && std::isfinite(v) && (strict ? v > lo : v >= lo)) return "";
        } catch (const std::exception&) {  // not a number: said below
        }
        return std::string("must be ") + says + ", got " + s;
      },
      "");
}
const CLI::Validator kPositive = at_least(0, true, "positive"), kNonNegative = at_least(0, false, "0 or more");

// `egeria eval`: a run's checkpoint (--out) or a weights file (--init-from) on a test split.
struct EvalArgs {
  std::string out, data_dir, init_from, classes, precision = "fp32";
  int64_t test_limit = 0, calibration = eg::quant::kCalibrationBatches;
  bool per_class = false;
  eg::train::WeightsEval weights;
};

CLI::App* add_eval(CLI::App& app, EvalArgs& a) {
  CLI::App* eval = app.add_subcommand("eval", "evaluate a run's checkpoint, or a weights file, on its test split");
  auto* eval_run = eval->add_option("--out", a.out, "the run's output directory");
  auto* eval_file =
      eval->add_option("--init-from", a.init_from,
                       "instead of a run: these weights (torchvision's, in safetensors, or a model.safetensors) "
                       "with --model, --dataset and its options")
          ->option_text("FILE")
          ->check(CLI::ExistingFile)
          ->excludes(eval_run);
  eval_run->excludes(eval_file);
  eval->add_option("--model", a.weights.model, "with --init-from: the model the weights are of")->needs(eval_file);
  eval->add_option("--dataset", a.weights.dataset, "with --init-from: the dataset to evaluate on")
      ->capture_default_str()
      ->needs(eval_file);
  eval->add_option("--image-size", a.weights.image_size,
                   "with --init-from and --dataset imagefolder: the centre crop's side (0: 224)")
      ->check(kNonNegative)
      ->needs(eval_file);
  eval->add_option("--classes", a.classes, "with --init-from and an IDX dataset: as train's --classes")
      ->option_text("K1,K2,...")
      ->needs(eval_file);
  eval->add_option("--data-dir", a.data_dir);
  eval->add_option("--test-limit", a.test_limit)->check(kNonNegative);
  eval->add_flag("--per-class", a.per_class, "image models: the accuracy of each class too (per_class in the JSON)");
  eval->add_option("--precision", a.precision, "fp32, or int8: the int8 reference model Egeria would build from it")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "int8"}));
  eval->add_option("--calibration-batches", a.calibration,
                   "int8: calibrate each convolution's input scale on the first N test batches, then keep it; 0: "
                   "every batch its own scales")
      ->capture_default_str()
      ->check(kNonNegative);
  return eval;
}

struct SmartFrzTrainArgs {
  eg::train::SmartFrzTrainOptions o;
  std::string json_out, input = "movement";
  int threads = 0;
};

CLI::App* add_smartfrz_train(CLI::App& app, SmartFrzTrainArgs& a) {
  auto* sft = app.add_subcommand("smartfrz-train",
                                 "train SmartFRZ's predictor from runs' smartfrz-records.safetensors "
                                 "(--smartfrz-record on), labelled by representational similarity");
  sft->add_option("--records", a.o.records, "the runs' records files")->required()->check(CLI::ExistingFile);
  sft->add_option("--out", a.o.out, "the predictor file to write (--smartfrz-predictor takes it)")->option_text("FILE");
  sft->add_option("--hold-out", a.o.hold_out, "a model whose runs are left out of training and evaluated");
  sft->add_option("--window", a.o.window, "records in a window")->capture_default_str()->check(CLI::Range(2, 100000));
  sft->add_option("--cka-tolerance", a.o.cka_tolerance,
                  "a unit is labelled freeze from the record after which its CKA with the run's end stays at or "
                  "above 1 - this")
      ->capture_default_str()
      ->check(CLI::Range(1e-6, 1.0));
  sft->add_option("--input", a.input,
                  "what the predictor reads: movement (of the weights within the window, relative to their size) "
                  "or movement-per-lr (each step between records divided by the mean LR of its steps)")
      ->capture_default_str()
      ->check(CLI::IsMember({"movement", "movement-per-lr"}));
  sft->add_option("--stride", a.o.stride, "a sample every N records")->capture_default_str()->check(kPositive);
  sft->add_option("--epochs", a.o.epochs)->capture_default_str()->check(kPositive);
  sft->add_option("--batch-size", a.o.batch_size)->capture_default_str()->check(kPositive);
  sft->add_option("--lr", a.o.lr, "AdamW")->capture_default_str()->check(CLI::PositiveNumber);
  sft->add_option("--seed", a.o.seed)->capture_default_str();
  sft->add_option("--threads", a.threads, "0: all cores")->capture_default_str();
  sft->add_option("--json", a.json_out, "write the labels, the training and the evaluation here")->option_text("FILE");
  return sft;
}

void run_smartfrz_train(const SmartFrzTrainArgs& a) {
  eg::set_num_threads(a.threads);
  eg::train::SmartFrzTrainOptions o = a.o;
  o.geometry.input = eg::freeze::parse_smartfrz_input(a.input);
  const nlohmann::json r = eg::train::train_smartfrz_predictor(o);
  if (!a.json_out.empty()) eg::train::write_file_atomic(a.json_out, r.dump(1) + "\n");
  nlohmann::json brief = {{"train", r["train"]}, {"gain", r["gain"]}, {"train_seconds", r["train_seconds"]}};
  if (r.contains("held_out")) brief["held_out"] = r["held_out"];
  std::printf("%s\n", brief.dump().c_str());
}

nlohmann::json run_eval(EvalArgs a) {
  if (a.out.empty() && a.init_from.empty())
    throw eg::Error("egeria eval needs --out DIR (a run) or --init-from FILE (weights, with --model)");
  eg::train::EvalResult r;
  if (!a.init_from.empty()) {
    if (a.weights.model.empty()) throw eg::Error("eval --init-from needs --model, the model the weights are of");
    eg::train::TrainConfig parsed;  // --classes as train reads it
    if (!a.classes.empty()) eg::train::set_option(parsed, "--classes", a.classes);
    a.weights.classes = parsed.classes;
    a.weights.data_dir = a.data_dir;
    r = eg::train::evaluate_weights(a.init_from, a.weights, a.test_limit, a.precision, a.calibration, a.per_class);
  } else {
    r = eg::train::evaluate_checkpoint(a.out, a.data_dir, a.test_limit, a.precision, a.calibration, a.per_class);
  }
  nlohmann::json j = r.translation
                         ? nlohmann::json{{"test_bleu", r.bleu}, {"test_loss", r.loss}, {"samples", r.samples}}
                         : nlohmann::json{{"test_accuracy", r.accuracy}, {"test_loss", r.loss}, {"samples", r.samples}};
  if (!r.classes.empty()) {
    nlohmann::json pc = nlohmann::json::object();
    for (size_t k = 0; k < r.classes.size(); ++k)
      pc[r.classes[k]] = {
          {"accuracy", r.per_class.total[k] ? double(r.per_class.correct[k]) / double(r.per_class.total[k]) : 0.0},
          {"samples", r.per_class.total[k]}};
    j["per_class"] = pc;
  }
  return j;
}

}  // namespace

namespace eg {

int run_cli(int argc, char** argv) {
  // Over a file size limit (ulimit -f) a write would kill the process without a word;
  // ignored, it fails with EFBIG, and the atomic writes say so, the previous file kept.
  std::signal(SIGXFSZ, SIG_IGN);
  CLI::App app{"egeria: DNN training with knowledge-guided layer freezing"};
  app.require_subcommand(1);

  auto* train = app.add_subcommand("train", "train a model (built-in, or registered by the program)");
  train->footer(
      "Options whose defaults differ for Transformers (AdamW 0.9,0.98, lr 5e-4, inverse-sqrt with 1000 "
      "or 4000 warmup steps, no weight decay, 64 sentences, dataset en-es) take those unless given.");
  std::vector<std::string> texts;
  const auto train_options = add_train_options(train, texts);
  std::string config_file;
  train->add_option("--config", config_file, "start from a run's config.json (the options given here override it)")
      ->option_text("FILE")
      ->group("Run")
      ->check(CLI::ExistingFile);

  EvalArgs ea;
  auto* eval = add_eval(app, ea);

  std::string report_out, report_against;
  auto* report = app.add_subcommand("report", "what a finished run froze, when and why, and what it saved");
  report->add_option("--out", report_out, "the run's output directory")->required()->check(CLI::ExistingDirectory);
  report
      ->add_option("--against", report_against,
                   "another run's directory or summary.json (e.g. the same command with --freeze none), "
                   "whose accuracy and training time are shown beside")
      ->check(CLI::ExistingPath);

  std::string export_out, export_format = "torchvision", export_to;
  auto* exp = app.add_subcommand("export", "write a run's weights for another framework (torchvision's state dict)");
  exp->add_option("--out", export_out, "the run's output directory")->required()->check(CLI::ExistingDirectory);
  exp->add_option("--format", export_format,
                  "torchvision: the names and tensors torchvision.models.<model>().load_state_dict(strict=True) "
                  "takes (resnet18, resnet50, mobilenetv2 at more than 64 pixels)")
      ->capture_default_str()
      ->check(CLI::IsMember({"torchvision"}));
  exp->add_option("--to", export_to, "the safetensors file to write (safetensors.torch.load_file reads it)")
      ->required()
      ->option_text("FILE");

  SmartFrzTrainArgs sa;
  auto* sft = add_smartfrz_train(app, sa);

  eg::train::StepBenchOptions bo;
  auto* bench = app.add_subcommand("bench", "benchmarks");
  bench->require_subcommand(1);
  auto* step = bench->add_subcommand("step", "training-step throughput (JSON line)");
  step->add_option("--model", bo.model)->capture_default_str();
  step->add_option("--batch-size", bo.batch_size, "per rank under mpirun")->capture_default_str()->check(kPositive);
  step->add_option("--device", bo.device)->capture_default_str();
  std::string bunits = "auto";
  step->add_option("--freeze-modules", bunits, "the freezing units --frozen-units counts in: auto or layers")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "layers"}));
  step->add_option("--seq-len", bo.seq_len,
                   "Transformers: tokens per source and target sentence (throughput in target tokens)")
      ->capture_default_str();
  step->add_option("--iterations", bo.iterations)->capture_default_str()->check(kPositive);
  step->add_option("--threads", bo.threads)->capture_default_str();
  step->add_option(
          "--frozen-units", bo.frozen_units,
          "freeze the first N freezing units (the paper's partition): out of backward and of the gradient sync")
      ->capture_default_str()
      ->check(kNonNegative);
  std::string boverlap = "on";
  step->add_option("--grad-sync-overlap", boverlap, eg::train::option("--grad-sync-overlap").help)
      ->capture_default_str()
      ->check(CLI::IsMember({"on", "off"}));
  step->add_option("--bucket-cap-mb", bo.bucket_cap_mb, eg::train::option("--bucket-cap-mb").help)
      ->capture_default_str()
      ->check(kPositive);
  std::string bprecision = "f32";
  step->add_option("--precision", bprecision, eg::train::option("--precision").help)
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "bf16", "fp16"}));
  std::string bsyncdtype = "f32";
  step->add_option("--grad-sync-dtype", bsyncdtype, eg::train::option("--grad-sync-dtype").help)
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "bf16"}));
  std::string bwino;
  step->add_option("--cpu-winograd", bwino, eg::train::option("--cpu-winograd").help)
      ->check(CLI::IsMember({"on", "off"}));
  step->add_flag("--profile", bo.profile,
                 "CPU: each op's time per step and the layout conversions, as \"profile\" in the JSON");
  std::string bgraphs = "off";
  step->add_option("--cuda-graphs", bgraphs,
                   "on: capture the step as a CUDA graph after the warm-up and replay it (one GPU, one process)")
      ->capture_default_str()
      ->check(CLI::IsMember({"on", "off"}));

  CLI11_PARSE(app, argc, argv);
  try {
    if (*eval && eg::dist::launched_by_mpi() && eg::dist::world().size() > 1)
      throw eg::Error("egeria eval runs as one process; it was started as " + std::to_string(eg::dist::world().size()) +
                      " (an MPI launcher)");
    if (*train) {
      eg::train::TrainConfig c;
      std::set<std::string> given;
      if (!config_file.empty()) {
        std::ifstream f(config_file);
        nlohmann::json j;
        try {
          j = nlohmann::json::parse(f);
        } catch (const nlohmann::json::exception& e) {
          throw eg::Error("--config '" + config_file + "' is not valid JSON: " + e.what());
        }
        c = eg::train::from_json(j, c, {"arch", "tokenizer", "classes", "num_classes"});  // what the task resolved
        for (auto& o : eg::train::options()) given.insert(o.flag);  // the file holds every value
      }
      for (auto& [o, x] : train_options)
        if (x->count() > 0) {
          o->set(c, nlohmann::json(o->is_switch ? std::string() : texts[size_t(o - eg::train::options().data())]));
          given.insert(o->flag);
        }
      eg::train::apply_model_defaults(c, given, eg::dist::world().size());
      bool out_given = false;
      for (auto& [o, x] : train_options) out_given |= o->key == "out" && x->count() > 0;
      if (!config_file.empty() && !out_given && !c.resume)
        throw eg::Error("--config '" + config_file + "' names the run directory '" + c.out + "'; a new run from it " +
                        "needs its own --out (or --resume to continue that run)");
      auto s = eg::train::run_training(c);
      if (eg::dist::world().rank() != 0) return 0;  // rank 0 reports for the job
      if (s.completed && !s.freeze_report.empty()) std::printf("%s\n", s.freeze_report.c_str());
      if (s.completed && s.tokens_per_second > 0)
        std::printf(
            "final test BLEU %.2f (best epoch %lld by validation loss: BLEU %.2f), %.1f s, %.0f tokens/s; "
            "summary in %s/summary.json\n",
            s.final_test_bleu, (long long)s.best_epoch, s.best_valid_bleu, s.train_seconds, s.tokens_per_second,
            c.out.c_str());
      else if (s.completed)
        std::printf(
            "final test accuracy %.2f%% (best epoch %lld: test accuracy %.2f%%), %.1f s, %.0f images/s; "
            "summary in %s/summary.json\n",
            100 * s.final_test_accuracy, (long long)s.best_epoch, 100 * s.best_test_accuracy, s.train_seconds,
            s.images_per_second, c.out.c_str());
    } else if (*eval) {
      std::printf("%s\n", run_eval(ea).dump().c_str());
    } else if (*exp) {
      const auto r = eg::train::export_weights(export_out, export_format, export_to);
      std::printf("%s: %lld tensors of %s written to %s, in torchvision's names: torchvision.models.%s\n",
                  r.from.c_str(), (long long)r.tensors, r.model.c_str(), export_to.c_str(), r.model.c_str());
    } else if (*sft) {
      run_smartfrz_train(sa);
    } else if (*report) {
      std::printf("%s", eg::train::run_report(report_out, report_against).c_str());
    } else if (*step) {
      if (!bwino.empty()) eg::set_cpu_winograd(bwino == "on");
      bo.unit_per_layer = bunits == "layers";
      bo.cuda_graphs = bgraphs == "on";
      eg::train::TrainConfig parsed;  // the words, as the training options read them
      eg::train::set_option(parsed, "--precision", bprecision);
      eg::train::set_option(parsed, "--grad-sync-overlap", boverlap);
      eg::train::set_option(parsed, "--grad-sync-dtype", bsyncdtype);
      bo.precision = parsed.precision;
      bo.sync = parsed.grad_sync;
      eg::dist::Communicator& w = eg::dist::world();
      auto r = eg::train::bench_step(bo, w);
      nlohmann::json j = {{"model", bo.model},
                          {"precision", bprecision},
                          {"batch_size", bo.batch_size},
                          {"device", bo.device},
                          {"cpu_winograd", eg::cpu_winograd() ? "on" : "off"},
                          {"cpu_layout", eg::cpu_layout_name(eg::cpu_layout())},
                          {eg::models::is_translation_model(bo.model) ? "tokens_per_second" : "images_per_second",
                           r.samples_per_second},
                          {"median_step_ms", r.median_step_ms},
                          {"step_ms", r.step_ms},
                          {"median_host_ms", r.median_host_ms},
                          {"system_allocs", r.system_allocs},
                          {"system_frees", r.system_frees},
                          {"iterations", r.iterations},
                          {"frozen_units", r.frozen_units},
                          {"frozen_parameters", r.frozen_parameters},
                          {"parameters", r.parameters},
                          {"host_syncs_per_step", r.host_syncs_per_step},
                          {"cuda_graphs", bgraphs},
                          {"machine", eg::train::machine_json()}};
      if (bo.cuda_graphs) j["graph_replays"] = r.graph_replays, j["graph_bytes"] = r.graph_bytes;
      if (bo.profile) j["profile"] = eg::train::step_profile_json(r);
      if (eg::models::is_translation_model(bo.model)) j["seq_len"] = bo.seq_len;
      if (r.world_size > 1) {
        j["world_size"] = r.world_size;
        j["global_batch_size"] = bo.batch_size * r.world_size;
        j["grad_sync_overlap"] = bo.sync.overlap;
        j["grad_sync_dtype"] = bsyncdtype;
        j["gradient_sync_bytes_per_step"] = r.sync_bytes_per_step;
        j["median_sync_wait_ms"] = r.median_sync_wait_ms;
        j["median_allreduce_ms"] = r.median_comm_ms;
      }
      if (w.rank() == 0) std::printf("%s\n", j.dump().c_str());
    }
  } catch (const std::exception& e) {
    return eg::dist::fail_process("egeria", e);
  }
  return 0;
}

}  // namespace eg
