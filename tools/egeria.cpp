// The egeria command line:
//   egeria train --model resnet20 --dataset fashion-mnist --epochs 15 --out runs/r20
//   egeria train --model transformer-tiny --dataset en-es --data-dir datasets/en-es --out runs/tt
//   egeria eval  --out runs/r20
//   egeria bench step --model resnet56 --batch-size 128 --device cpu
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "core/error.h"
#include "quant/reference.h"
#include "train/trainer.h"

int main(int argc, char** argv) {
  CLI::App app{"egeria: DNN training with knowledge-guided layer freezing"};
  app.require_subcommand(1);
  eg::train::TrainConfig c;

  auto* train = app.add_subcommand("train", "train a built-in model");
  // Flags marked (*) default differently for Transformers: see Note [Model-dependent defaults].
  train->add_option("--model", c.model, "resnet20|32|44|56|110, resnet18|50, mobilenetv2, transformer-tiny|base")
      ->capture_default_str();
  train->add_option("--dataset", c.dataset, "fashion-mnist, mnist, cifar10, cifar100, synthetic; en-es (*)")
      ->capture_default_str();
  train->add_option("--data-dir", c.data_dir,
                    "dataset directory (fashion-mnist defaults to Debian's package, en-es to datasets/en-es)");
  train->add_option("--epochs", c.epochs)->capture_default_str()->check(CLI::PositiveNumber);
  train->add_option("--batch-size", c.batch_size)->capture_default_str()->check(CLI::PositiveNumber);
  train->add_option("--lr", c.lr, "base learning rate")->capture_default_str()->check(CLI::PositiveNumber);
  train->add_option("--optimizer", c.optimizer)->capture_default_str()->check(CLI::IsMember({"sgd", "adamw"}));
  train->add_option("--momentum", c.momentum)->capture_default_str()->check(CLI::Range(0.0, 0.999999));
  train->add_flag("--nesterov", c.nesterov);
  train->add_option("--weight-decay", c.weight_decay)->capture_default_str()->check(CLI::NonNegativeNumber);
  train->add_option("--lr-schedule", c.lr_schedule)
      ->capture_default_str()
      ->check(CLI::IsMember({"step", "multistep", "cosine", "constant", "inverse-sqrt", "linear"}));
  train->add_option("--milestones", c.milestones,
                    "epochs at which step/multistep multiply the LR by --gamma (default: half and three quarters of "
                    "--epochs, rounded down)")
      ->delimiter(',');
  train->add_option("--gamma", c.gamma)->capture_default_str();
  train->add_option("--warmup-steps", c.warmup_steps)->capture_default_str()->check(CLI::NonNegativeNumber);
  train->add_option("--device", c.device, "cpu or cuda:N")->capture_default_str();
  train->add_option("--threads", c.threads, "CPU threads (0: all cores)")->capture_default_str();
  const char* wino_help =
      "Winograd for the CPU's 3x3 convolutions with >= 32 channels where oneDNN has it (AVX-512); off: all "
      "direct, as PyTorch (default on, or off when EG_CPU_WINOGRAD=0)";
  train->add_option("--cpu-winograd", c.cpu_winograd, wino_help)->check(CLI::IsMember({"on", "off"}));
  train->add_option("--seed", c.seed)->capture_default_str();
  train->add_option("--train-limit", c.train_limit, "use the first N training images (or sentence pairs)")
      ->check(CLI::NonNegativeNumber);
  train->add_option("--test-limit", c.test_limit, "use the first N test images (translation: valid and test pairs)")
      ->check(CLI::NonNegativeNumber);
  train->add_option("--target-accuracy", c.target_accuracy, "report time to reach this test accuracy");
  train->add_option("--out", c.out, "output directory")->capture_default_str();
  train->add_flag("--resume", c.resume, "continue from DIR/checkpoint.safetensors");
  train->add_option("--checkpoint-every", c.checkpoint_every, "also checkpoint every N steps")->check(CLI::NonNegativeNumber);
  train->add_option("--log-every", c.log_every)->capture_default_str()->check(CLI::PositiveNumber);
  train->add_option("--workers", c.workers, "data loader threads")->capture_default_str()->check(CLI::PositiveNumber);
  train->add_flag("!--no-augment", c.augment, "disable random crop and flip");
  train->add_option("--augment-mode", c.augment_mode,
                    "epoch: a new random crop and flip for every sample every epoch; sample: one per sample for the "
                    "whole run (stateless, as --freeze-cache on needs)")
      ->capture_default_str()
      ->check(CLI::IsMember({"epoch", "sample"}));
  train->add_option("--freeze", c.freeze, "layer freezing policy: none, static, freezeout, autofreeze, egeria")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "static", "freezeout", "autofreeze", "egeria"}));
  train->add_option("--freeze-modules", c.freeze_modules,
                    "freezing units: auto (the paper's: stages, large ones split) or layers (every layer module)")
      ->check(CLI::IsMember({"auto", "layers"}));
  train->add_option("--freeze-module-regex", c.freeze_module_regex,
                    "freezing units by parameter name: parameters whose match of this regex (its first group, if "
                    "any) is the same form one unit, e.g. '^(layer[0-9]+)\\.'");
  train->add_option("--freeze-interval", c.freeze_interval,
                    "egeria/autofreeze: iterations between evaluations n (0: egeria, the paper's guideline, at "
                    "least 10; autofreeze, one epoch)")
      ->check(CLI::NonNegativeNumber);
  train->add_option("--freeze-bootstrap-interval", c.freeze_bootstrap_interval,
                    "egeria: iterations between the bootstrapping stage's checks, each comparing the mean training "
                    "loss over its iterations with the previous check's: auto (an epoch, or a tenth of a shorter run, "
                    "and at least n), n (every n iterations, the paper) or a number")
      ->default_str("auto")
      ->option_text("auto|n|N=auto")
      ->transform(
          [](std::string v) -> std::string {
            // TrainConfig::freeze_bootstrap_interval: 0 is auto, -1 is n.
            if (v == "auto") return "0";
            if (v == "n") return "-1";
            try {
              size_t end = 0;
              if (std::stoll(v, &end) >= 1 && end == v.size()) return v;
            } catch (const std::exception&) {
            }
            throw CLI::ValidationError("must be auto, n or a positive number of iterations, got '" + v + "'");
          },
          "auto|n|N");
  train->add_option("--freeze-window", c.freeze_window, "egeria: W, stale readings before freezing")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  train->add_option("--freeze-window-min", c.freeze_window_min,
                    "egeria: W halves after each unfreeze, but not below this (1: the paper)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  train->add_option("--freeze-tolerance", c.freeze_tolerance, "egeria: T coefficient")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  train->add_option("--freeze-tolerance-from", c.freeze_tolerance_from,
                    "egeria: T = coefficient x the largest |slope| of a module's first 3 fits (first3, the paper) or "
                    "of all its fits so far (peak: for modules already settled when bootstrapping ends)")
      ->capture_default_str()
      ->check(CLI::IsMember({"first3", "peak"}));
  train->add_option("--freeze-refreeze-tolerance", c.freeze_refreeze_tolerance,
                    "egeria: the T a module refreezes with after an LR unfreeze: measured again from its first 3 "
                    "fits at the new LR (remeasure), the T of its first fits ever (keep, the paper), or that T "
                    "scaled by the LR's fall (scaled)")
      ->capture_default_str()
      ->check(CLI::IsMember({"remeasure", "keep", "scaled"}));
  train->add_option("--freeze-first-phase", c.freeze_first_phase,
                    "egeria: on (the paper) freezes as soon as a module is found converged; off holds those "
                    "freezes until the LR first falls 10x below its peak, then applies them at once")
      ->capture_default_str()
      ->check(CLI::IsMember({"on", "off"}));
  train->add_option("--freeze-unfreeze", c.freeze_unfreeze,
                    "egeria: lr (the paper) unfreezes every module when the LR has fallen 10x since the front "
                    "one froze; never keeps what froze frozen to the end, as AutoFreeze")
      ->capture_default_str()
      ->check(CLI::IsMember({"lr", "never"}));
  train->add_option("--freeze-last-phase", c.freeze_last_phase,
                    "egeria: on (the paper) freezes in every LR phase; off trains the schedule's last phase (LR "
                    "within 10x of its final value) whole, unfreezing what is frozen when it begins")
      ->capture_default_str()
      ->check(CLI::IsMember({"on", "off"}));
  train->add_option("--freeze-bn", c.freeze_bn,
                    "frozen BatchNorms keep batch statistics as in training (batch: as PyTorch's requires_grad_(False)) "
                    "or normalise with their running statistics (running: a fixed function, as the paper's activation "
                    "cache needs)")
      ->capture_default_str()
      ->check(CLI::IsMember({"running", "batch"}));
  train->add_option("--freeze-cache", c.freeze_cache,
                    "on: keep the frozen prefix's output per sample on disk and skip its forward when the sample "
                    "comes again (the paper's activation cache; needs --freeze-bn running and --augment-mode sample)")
      ->capture_default_str()
      ->check(CLI::IsMember({"on", "off"}));
  train->add_option("--freeze-cache-dir", c.freeze_cache_dir,
                    "keep the activation cache in a file in this directory (deleted when the run ends); by default "
                    "it is kept in memory when it takes at most half the available memory, else in a file in --out");
  train->add_option("--freeze-reference", c.freeze_reference,
                    "egeria: reference model: int8 or fp32 on spare CPU cores, or fp32-gpu or fp16-gpu on the training GPU")
      ->capture_default_str()
      ->check(CLI::IsMember(eg::quant::reference_precisions()));
  train->add_option("--freeze-reference-calibration", c.freeze_reference_calibration,
                    "egeria, int8 reference: calibrate each convolution's input scale on this many batches after "
                    "every refresh of the reference, then keep it (static quantisation, the paper); 0: every batch "
                    "its own scales (dynamic)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  train->add_option("--freeze-reference-scope", c.freeze_reference_scope,
                    "egeria: what the reference runs for an evaluation: only the front unit, on the training model's "
                    "input to it (unit: its cost does not grow with the depth of the front), or the network from "
                    "the images through the front unit (network, the paper); Transformers always run network")
      ->capture_default_str()
      ->check(CLI::IsMember({"network", "unit"}));
  train->add_flag("--freeze-sync", c.freeze_sync, "egeria: evaluate plasticity inline (deterministic, slower)");
  train->add_option("--freeze-apply", c.freeze_apply,
                    "egeria: act on a background evaluation's result at the next evaluation step, waiting for it "
                    "if late (next: the same run makes the same decisions), or as soon as it arrives (arrival: "
                    "never waits, as the paper; decisions then depend on timing)")
      ->capture_default_str()
      ->check(CLI::IsMember({"next", "arrival"}));
  train->add_option("--freeze-reference-max-load", c.freeze_reference_max_load,
                    "egeria: run the reference forward only while the machine's CPU load is at most this percentage "
                    "(auto: 50 when training on a GPU with --freeze-apply arrival, as the paper; else 100, never "
                    "waiting)")
      ->capture_default_str();
  train->add_option("--freeze-threads", c.freeze_threads, "egeria: threads of each background thread")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  train->add_option("--static-modules", c.static_modules, "static: number of front modules to freeze");
  train->add_option("--static-epoch", c.static_epoch, "static: epoch at which they freeze");
  train->add_option("--freezeout-t0", c.freezeout_t0, "freezeout: fraction of training when the first module freezes")
      ->capture_default_str();
  train->add_option("--autofreeze-percentile", c.autofreeze_percentile, "autofreeze: gradient-change percentile")
      ->capture_default_str();
  train->add_option("--stop-after-steps", c.stop_after_steps, "end after N steps of this invocation (testing)");
  std::vector<double> betas;
  train->add_option("--adam-betas", betas, "AdamW beta1,beta2 (0.9,0.999; 0.9,0.98 for Transformers)")
      ->delimiter(',')
      ->expected(2);
  train->add_option("--vocab-size", c.vocab_size, "translation: SentencePiece vocabulary, shared by both languages")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  train->add_option("--max-len", c.max_len, "translation: tokens per sentence; longer training pairs are dropped")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  train->add_option("--max-tokens", c.max_tokens, "translation: batch by this many tokens instead of --batch-size")
      ->check(CLI::NonNegativeNumber);

  std::string eval_out, eval_data;
  int64_t eval_limit = 0;
  auto* eval = app.add_subcommand("eval", "evaluate a run's checkpoint on its test split");
  eval->add_option("--out", eval_out, "the run's output directory")->required();
  eval->add_option("--data-dir", eval_data);
  eval->add_option("--test-limit", eval_limit)->check(CLI::NonNegativeNumber);
  std::string eval_precision = "fp32";
  eval->add_option("--precision", eval_precision, "fp32, or int8: the int8 reference model Egeria would build from it")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "int8"}));
  int64_t eval_calibration = eg::quant::kCalibrationBatches;
  eval->add_option("--calibration-batches", eval_calibration,
                   "int8: calibrate each convolution's input scale on the first N test batches, then keep it; 0: "
                   "every batch its own scales")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);

  std::string bmodel = "resnet56", bdevice = "cpu";
  int64_t bbatch = 128;
  int biters = 10, bthreads = 0;
  auto* bench = app.add_subcommand("bench", "benchmarks");
  bench->require_subcommand(1);
  auto* step = bench->add_subcommand("step", "training-step throughput (JSON line)");
  step->add_option("--model", bmodel)->capture_default_str();
  step->add_option("--batch-size", bbatch)->capture_default_str()->check(CLI::PositiveNumber);
  step->add_option("--device", bdevice)->capture_default_str();
  step->add_option("--iterations", biters)->capture_default_str()->check(CLI::PositiveNumber);
  step->add_option("--threads", bthreads)->capture_default_str();
  std::string bwino;
  step->add_option("--cpu-winograd", bwino, wino_help)->check(CLI::IsMember({"on", "off"}));

  CLI11_PARSE(app, argc, argv);
  try {
    if (*train) {
      std::set<std::string> given;
      for (const CLI::Option* o : train->get_options())
        if (o->count() > 0) given.insert(o->get_name());
      eg::train::apply_model_defaults(c, given);
      if (!betas.empty()) c.adam_beta1 = betas[0], c.adam_beta2 = betas[1];
      auto s = eg::train::run_training(c);
      if (s.completed && !s.freeze_report.empty()) std::printf("%s\n", s.freeze_report.c_str());
      if (s.completed && s.tokens_per_second > 0)
        std::printf("final test BLEU %.2f (best valid BLEU %.2f), %.1f s, %.0f tokens/s; summary in %s/summary.json\n",
                    s.final_test_bleu, s.best_valid_bleu, s.train_seconds, s.tokens_per_second, c.out.c_str());
      else if (s.completed)
        std::printf("final test accuracy %.2f%% (best %.2f%%), %.1f s, %.0f images/s; summary in %s/summary.json\n",
                    100 * s.final_test_accuracy, 100 * s.best_test_accuracy, s.train_seconds, s.images_per_second,
                    c.out.c_str());
    } else if (*eval) {
      auto r = eg::train::evaluate_checkpoint(eval_out, eval_data, eval_limit, eval_precision, eval_calibration);
      nlohmann::json j = r.translation ? nlohmann::json{{"test_bleu", r.bleu}, {"test_loss", r.loss}, {"samples", r.samples}}
                                       : nlohmann::json{{"test_accuracy", r.accuracy}, {"test_loss", r.loss},
                                                        {"samples", r.samples}};
      std::printf("%s\n", j.dump().c_str());
    } else if (*step) {
      if (!bwino.empty()) eg::set_cpu_winograd(bwino == "on");
      auto r = eg::train::bench_step(bmodel, bbatch, bdevice, biters, bthreads);
      std::printf("%s\n", nlohmann::json{{"model", bmodel}, {"batch_size", bbatch}, {"device", bdevice},
                                         {"cpu_winograd", eg::cpu_winograd() ? "on" : "off"},
                                         {"images_per_second", r.samples_per_second},
                                         {"median_step_ms", r.median_step_ms}, {"iterations", r.iterations}}
                              .dump()
                              .c_str());
    }
  } catch (const eg::Error& e) {
    std::fprintf(stderr, "egeria: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "egeria: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
