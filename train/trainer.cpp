#include "train/trainer.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/parallel.h"
#include "data/loader.h"
#include "models/model.h"
#include "quant/reference.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "freeze/policy.h"
#include "train/freezing.h"
#include "train/safetensors.h"
#include "train/translate.h"

namespace eg::train {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

const char* kCheckpoint = "checkpoint.safetensors";

using detail::file_exists;

}  // namespace

bool detail::file_exists(const std::string& p) { return std::ifstream(p).good(); }

void detail::append_json_line(const std::string& path, const std::string& line) {
  std::ofstream f(path, std::ios::app);
  f << line << "\n";
  EG_CHECK(f.good(), "cannot append to '", path, "' (disk full?)");
}

void detail::make_dirs(const std::string& dir) {
  std::string cur;
  for (size_t i = 0; i <= dir.size(); ++i) {
    if (i == dir.size() || dir[i] == '/') {
      if (!cur.empty() && ::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST)
        EG_THROW("cannot create output directory '", cur, "': ", std::strerror(errno));
    }
    if (i < dir.size()) cur += dir[i];
  }
}

namespace {

using detail::make_dirs;

void append_line(const std::string& path, const json& j) { detail::append_json_line(path, j.dump()); }

json config_json(const TrainConfig& c) {
  return {{"model", c.model}, {"dataset", c.dataset}, {"data_dir", c.data_dir}, {"epochs", c.epochs},
          {"batch_size", c.batch_size}, {"lr", c.lr}, {"optimizer", c.optimizer}, {"momentum", c.momentum},
          {"weight_decay", c.weight_decay}, {"nesterov", c.nesterov}, {"lr_schedule", c.lr_schedule},
          {"milestones", c.milestones}, {"gamma", c.gamma}, {"warmup_steps", c.warmup_steps}, {"device", c.device},
          {"threads", c.threads}, {"seed", c.seed}, {"train_limit", c.train_limit}, {"test_limit", c.test_limit},
          {"target_accuracy", c.target_accuracy}, {"augment", c.augment}, {"freeze", c.freeze},
          {"adam_betas", {c.adam_beta1, c.adam_beta2}}, {"freeze_modules", c.freeze_modules},
          {"freeze_module_regex", c.freeze_module_regex}, {"freeze_interval", c.freeze_interval},
          {"freeze_bootstrap_interval", c.freeze_bootstrap_interval},
          {"freeze_window", c.freeze_window}, {"freeze_window_min", c.freeze_window_min}, {"freeze_tolerance", c.freeze_tolerance},
          {"freeze_tolerance_from", c.freeze_tolerance_from},
          {"freeze_refreeze_tolerance", c.freeze_refreeze_tolerance}, {"freeze_last_phase", c.freeze_last_phase},
          {"freeze_first_phase", c.freeze_first_phase}, {"freeze_unfreeze", c.freeze_unfreeze},
          {"freeze_bn", c.freeze_bn}, {"augment_mode", c.augment_mode}, {"freeze_cache", c.freeze_cache},
          {"freeze_reference", c.freeze_reference}, {"freeze_reference_scope", c.freeze_reference_scope},
          {"freeze_reference_calibration", c.freeze_reference_calibration},
          {"freeze_reference_max_load", c.freeze_reference_max_load},
          {"freeze_sync", c.freeze_sync}, {"freeze_apply", c.freeze_apply},
          {"cpu_winograd", c.cpu_winograd.empty() ? (cpu_winograd() ? "on" : "off") : c.cpu_winograd}};
}

struct Run {
  TrainConfig cfg;
  Device device;
  std::shared_ptr<data::ImageDataset> train, test;
  models::ModelPtr model;
  std::unique_ptr<optim::Optimizer> opt;
  std::unique_ptr<optim::LrSchedule> sched;
  int64_t steps_per_epoch = 0;
};

}  // namespace

std::unique_ptr<optim::LrSchedule> detail::make_schedule(const TrainConfig& c, int64_t spe) {
  const int64_t total = c.epochs * spe;
  std::unique_ptr<optim::LrSchedule> s;
  if (c.lr_schedule == "step" || c.lr_schedule == "multistep") {
    std::vector<int64_t> ms = c.milestones;
    if (ms.empty()) ms = {std::max<int64_t>(1, c.epochs / 2), std::max<int64_t>(1, c.epochs * 3 / 4)};
    for (auto& m : ms) m *= spe;
    s = optim::multistep_lr(c.lr, ms, c.gamma);
  } else if (c.lr_schedule == "cosine") {
    s = optim::cosine_lr(c.lr, total);
  } else if (c.lr_schedule == "constant") {
    s = optim::constant_lr(c.lr);
  } else if (c.lr_schedule == "inverse-sqrt") {
    return optim::inverse_sqrt_lr(c.lr, std::max<int64_t>(1, c.warmup_steps));
  } else if (c.lr_schedule == "linear") {
    s = optim::linear_decay_lr(c.lr, total);
  }
  return c.warmup_steps > 0 ? optim::linear_warmup(std::move(s), c.warmup_steps) : std::move(s);
}

std::string detail::config_json_text(const TrainConfig& c) { return config_json(c).dump(); }

namespace {

using detail::human_time;
using detail::make_schedule;

Run setup(const TrainConfig& c) {
  Run r;
  r.cfg = c;
  r.device = Device::parse(c.device);
  if (r.device.is_cuda())
    EG_CHECK(cuda_available(), "--device ", c.device, ": ",
             built_with_cuda() ? "no CUDA GPU is visible" : "this build has no CUDA support (rebuild with -DEG_CUDA=ON)");
  set_num_threads(c.threads);
  if (!c.cpu_winograd.empty()) set_cpu_winograd(c.cpu_winograd == "on");
  r.train = std::make_shared<data::ImageDataset>(data::load_image_dataset({c.dataset, c.data_dir, c.train_limit}, true));
  r.test = std::make_shared<data::ImageDataset>(data::load_image_dataset({c.dataset, c.data_dir, c.test_limit}, false));
  EG_CHECK(r.train->size() >= c.batch_size, "--batch-size ", c.batch_size, " is larger than the training set (",
           r.train->size(), " images)");
  models::ModelConfig mc;
  mc.name = c.model;
  mc.in_channels = r.train->images.size(1);
  mc.image_size = r.train->images.size(2);
  mc.num_classes = c.dataset == "cifar100" ? 100 : 10;
  Generator g(c.seed);
  r.model = models::build_model(mc, g);
  r.model->to(r.device);
  if (c.optimizer == "sgd")
    r.opt = std::make_unique<optim::SGD>(r.model->parameters(), c.lr,
                                         optim::SgdOptions{c.momentum, 0.0, c.weight_decay, c.nesterov});
  else
    r.opt = std::make_unique<optim::AdamW>(r.model->parameters(), c.lr,
                                           optim::AdamWOptions{c.adam_beta1, c.adam_beta2, 1e-8, c.weight_decay});
  r.steps_per_epoch = r.train->size() / c.batch_size;
  r.sched = make_schedule(c, r.steps_per_epoch);
  return r;
}

struct EvalOut {
  double acc = 0, loss = 0;
};

EvalOut evaluate(models::Model& m, const data::ImageDataset& d, const std::string& ds, Device dev) {
  autograd::NoGradGuard ng;
  m.eval();
  data::LoaderOptions o;
  o.batch_size = 500;
  o.shuffle = false;
  o.drop_last = false;
  o.aug.norm = data::default_normalization(ds);
  data::Loader l(std::make_shared<data::ImageDataset>(d), o);
  l.start_epoch(0);
  data::Batch b;
  double loss = 0;
  int64_t correct = 0;
  while (l.next(b)) {
    Tensor logits = m.forward(b.x.to(dev));
    loss += fn::cross_entropy(logits, b.y.to(dev)).item() * double(b.y.numel());
    std::vector<float> lv = logits.to_vector<float>();
    const int64_t k = logits.size(1);
    for (int64_t i = 0; i < b.y.numel(); ++i) {
      const float* row = lv.data() + i * k;
      correct += int64_t(std::max_element(row, row + k) - row) == b.y.data<int64_t>()[i];
    }
  }
  m.train();
  return {double(correct) / double(d.size()), loss / double(d.size())};
}

}  // namespace

std::string detail::human_time(double s) {
  char buf[32];
  int t = int(s);
  std::snprintf(buf, sizeof buf, "%d:%02d:%02d", t / 3600, t / 60 % 60, t % 60);
  return buf;
}

void detail::print_progress(const Progress& p, bool tty, int64_t log_every) {
  if (tty) {
    std::printf("\repoch %lld/%lld [%-30s] %lld/%lld  loss %.4f  %.0f %s  ETA %s   ", (long long)p.epoch + 1,
                (long long)p.epochs, std::string(size_t(30 * p.done / std::max<int64_t>(p.total, 1)), '=').c_str(),
                (long long)p.done, (long long)p.total, p.mean_loss, p.rate, p.unit, human_time(p.eta_seconds).c_str());
  } else if (p.step % log_every == 0) {
    std::printf("epoch %lld step %lld  loss %.4f  lr %.4g  %.0f %s\n", (long long)p.epoch + 1, (long long)p.step, p.loss,
                p.lr, p.rate, p.unit);
  } else {
    return;
  }
  std::fflush(stdout);
}

void apply_model_defaults(TrainConfig& c, const std::set<std::string>& given) {
  if (!is_translation_model(c.model)) return;  // TrainConfig's initialisers are the image defaults
  // See Note [Model-dependent defaults]. Transformer recipe of Vaswani et al. / fairseq,
  // with a shorter warmup for the 2+2-layer model, which sees fewer steps.
  auto set = [&](const char* flag, auto& field, auto value) {
    if (!given.count(flag)) field = value;
  };
  set("--dataset", c.dataset, std::string("en-es"));
  set("--optimizer", c.optimizer, std::string("adamw"));
  set("--lr", c.lr, 5e-4);
  set("--lr-schedule", c.lr_schedule, std::string("inverse-sqrt"));
  set("--warmup-steps", c.warmup_steps, int64_t(c.model == "transformer-tiny" ? 1000 : 4000));
  set("--weight-decay", c.weight_decay, 0.0);
  set("--batch-size", c.batch_size, int64_t(64));
  if (!given.count("--adam-betas")) {
    c.adam_beta1 = 0.9;
    c.adam_beta2 = 0.98;
  }
}

TrainConfig default_config(const std::string& model) {
  TrainConfig c;
  c.model = model;
  apply_model_defaults(c);
  return c;
}

void validate(const TrainConfig& c) {
  auto known = models::model_names();
  EG_CHECK(std::find(known.begin(), known.end(), c.model) != known.end(), "--model: unknown model '", c.model, "'");
  EG_CHECK(c.epochs > 0, "--epochs must be positive, got ", c.epochs);
  EG_CHECK(c.batch_size > 0, "--batch-size must be positive, got ", c.batch_size);
  EG_CHECK(c.lr > 0 && std::isfinite(c.lr), "--lr must be a positive number, got ", c.lr);
  EG_CHECK(c.momentum >= 0 && c.momentum < 1, "--momentum must be in [0, 1), got ", c.momentum);
  EG_CHECK(c.weight_decay >= 0, "--weight-decay must be non-negative, got ", c.weight_decay);
  EG_CHECK(c.optimizer == "sgd" || c.optimizer == "adamw", "--optimizer must be sgd or adamw, got '", c.optimizer, "'");
  const std::vector<std::string> scheds = {"step", "multistep", "cosine", "constant", "inverse-sqrt", "linear"};
  EG_CHECK(std::find(scheds.begin(), scheds.end(), c.lr_schedule) != scheds.end(),
           "--lr-schedule must be one of step, multistep, cosine, constant, inverse-sqrt, linear; got '", c.lr_schedule, "'");
  EG_CHECK(std::is_sorted(c.milestones.begin(), c.milestones.end()), "--milestones must be ascending");
  EG_CHECK(c.train_limit >= 0 && c.test_limit >= 0, "--train-limit/--test-limit must be non-negative");
  EG_CHECK(c.target_accuracy >= 0 && c.target_accuracy <= 100, "--target-accuracy must be in [0, 1] or [0, 100]");
  {
    auto pols = freeze::policy_names();
    EG_CHECK(std::find(pols.begin(), pols.end(), c.freeze) != pols.end(), "--freeze: unknown policy '", c.freeze,
             "' (none, static, freezeout, autofreeze, egeria)");
    EG_CHECK(c.freeze_interval >= 0, "--freeze-interval must be non-negative, got ", c.freeze_interval);
    EG_CHECK(c.freeze_bootstrap_interval >= -1,
             "--freeze-bootstrap-interval must be auto (0), n (-1) or a positive number of steps, got ",
             c.freeze_bootstrap_interval);
    EG_CHECK(c.freeze_window >= 1, "--freeze-window must be at least 1, got ", c.freeze_window);
    EG_CHECK(c.freeze_window_min >= 1, "--freeze-window-min must be at least 1, got ", c.freeze_window_min);
    EG_CHECK(c.freeze_tolerance > 0, "--freeze-tolerance must be positive, got ", c.freeze_tolerance);
    EG_CHECK(c.freeze_tolerance_from == "first3" || c.freeze_tolerance_from == "peak",
             "--freeze-tolerance-from must be first3 or peak, got '", c.freeze_tolerance_from, "'");
    freeze::parse_refreeze_tolerance(c.freeze_refreeze_tolerance);  // throws naming the flag
    EG_CHECK(c.freeze_first_phase == "on" || c.freeze_first_phase == "off",
             "--freeze-first-phase must be on or off, got '", c.freeze_first_phase, "'");
    EG_CHECK(c.freeze_unfreeze == "lr" || c.freeze_unfreeze == "never",
             "--freeze-unfreeze must be lr or never, got '", c.freeze_unfreeze, "'");
    EG_CHECK(c.freeze_last_phase == "on" || c.freeze_last_phase == "off",
             "--freeze-last-phase must be on or off, got '", c.freeze_last_phase, "'");
    EG_CHECK(c.freeze_bn == "running" || c.freeze_bn == "batch",
             "--freeze-bn must be running or batch, got '", c.freeze_bn, "'");
    EG_CHECK(c.freeze_cache == "on" || c.freeze_cache == "off", "--freeze-cache must be on or off, got '",
             c.freeze_cache, "'");
    if (c.freeze_cache == "on") {
      // See Note [Activation cache validity].
      EG_CHECK(!is_translation_model(c.model), "--freeze-cache on caches image models' frozen prefix; ", c.model,
               " batches sentences of varying length, use --freeze-cache off");
      EG_CHECK(c.freeze != "none", "--freeze-cache on caches the frozen prefix; with --freeze none nothing freezes");
      EG_CHECK(c.freeze_bn == "running", "--freeze-cache on needs --freeze-bn running: with batch statistics a "
               "frozen sample's output depends on the rest of its batch, so a cached one would be wrong");
      EG_CHECK(!c.augment || c.augment_mode == "sample", "--freeze-cache on needs --augment-mode sample (or "
               "--no-augment): with a new crop and flip every epoch no cached output is ever reused");
    }
    EG_CHECK(c.freeze_apply == "next" || c.freeze_apply == "arrival", "--freeze-apply must be next or arrival, got '",
             c.freeze_apply, "'");
    const auto precisions = quant::reference_precisions();
    EG_CHECK(std::find(precisions.begin(), precisions.end(), c.freeze_reference) != precisions.end(),
             "--freeze-reference must be int8, fp32, fp32-gpu or fp16-gpu, got '", c.freeze_reference, "'");
    (void)reference_max_cpu_load(c);  // a clear error before anything runs
    EG_CHECK(c.freeze_reference_calibration >= 0, "--freeze-reference-calibration must be >= 0 batches (0: every "
             "batch its own scales), got ", c.freeze_reference_calibration);
    EG_CHECK(c.freeze_reference_scope == "network" || c.freeze_reference_scope == "unit",
             "--freeze-reference-scope must be network or unit, got '", c.freeze_reference_scope, "'");
    EG_CHECK(!quant::reference_on_gpu(c.freeze_reference) || Device::parse(c.device).is_cuda(),
             "--freeze-reference ", c.freeze_reference, " runs the reference model on the training GPU; it needs "
             "--device cuda[:N] (training on ", c.device, ")");
  }
  EG_CHECK(c.cpu_winograd.empty() || c.cpu_winograd == "on" || c.cpu_winograd == "off",
           "--cpu-winograd must be on or off, got '", c.cpu_winograd, "'");
  EG_CHECK(c.augment_mode == "epoch" || c.augment_mode == "sample", "--augment-mode must be epoch or sample, got '",
           c.augment_mode, "'");
  EG_CHECK(c.adam_beta1 >= 0 && c.adam_beta1 < 1 && c.adam_beta2 >= 0 && c.adam_beta2 < 1,
           "--adam-betas must both be in [0, 1), got ", c.adam_beta1, ",", c.adam_beta2);
  if (is_translation_model(c.model)) {
    EG_CHECK(c.dataset == "en-es", "--model ", c.model, " trains on sentence pairs: use --dataset en-es (with --data-dir ",
             "pointing at a directory of train/valid/test.tsv), not '", c.dataset, "'");
    EG_CHECK(c.vocab_size > 4, "--vocab-size must exceed the 4 special tokens (pad, bos, eos, unk), got ", c.vocab_size);
    EG_CHECK(c.max_len >= 2, "--max-len must be at least 2 tokens, got ", c.max_len);
    EG_CHECK(c.max_tokens >= 0, "--max-tokens must be non-negative, got ", c.max_tokens);
    EG_CHECK(c.target_accuracy == 0, "--target-accuracy applies to image models; translation runs report BLEU");
  } else {
    EG_CHECK(c.dataset != "en-es", "--dataset en-es is English-Spanish sentence pairs: train it with --model ",
             "transformer-tiny or transformer-base, not ", c.model);
  }
  Device::parse(c.device);
}

Summary run_training(const TrainConfig& cin) {
  validate(cin);
  if (is_translation_model(cin.model)) return run_translation(cin);
  Run r = setup(cin);
  const TrainConfig& c = r.cfg;
  make_dirs(c.out);
  const std::string ckpt = c.out + "/" + kCheckpoint, metrics = c.out + "/metrics.jsonl";
  freeze::PolicyConfig pc = policy_config(c);
  pc.model.in_channels = r.train->images.size(1);
  pc.model.image_size = r.train->images.size(2);
  pc.model.num_classes = c.dataset == "cifar100" ? 100 : 10;
  pc.total_steps = c.epochs * r.steps_per_epoch;
  pc.tracker.final_lr = r.sched->lr_at(std::max<int64_t>(pc.total_steps - 1, 0));
  pc.steps_per_epoch = r.steps_per_epoch;
  FreezeRun fr(c, *r.model, pc, c.out, !(c.resume && file_exists(ckpt)));
  if (c.freeze_cache == "on")
    fr.use_cache(c.freeze_cache_dir.empty() ? c.out : c.freeze_cache_dir, r.train->size(), !c.freeze_cache_dir.empty());
  const double target = c.target_accuracy > 1 ? c.target_accuracy / 100 : c.target_accuracy;

  json state = {{"epoch", 0}, {"batch", 0}, {"step", 0}, {"train_seconds", 0.0}, {"best_acc", 0.0},
                {"time_to_target", -1.0}, {"images", 0}};
  if (c.resume && file_exists(ckpt)) {
    Metadata meta;
    TensorMap all = load_safetensors(ckpt, &meta);
    json saved = json::parse(meta.at("state"));
    json scfg = json::parse(meta.at("config"));
    EG_CHECK(scfg.at("model") == c.model, "--resume: '", ckpt, "' is a checkpoint of model '",
             scfg.at("model").get<std::string>(), "', not '", c.model, "'");
    EG_CHECK(scfg.at("dataset") == c.dataset, "--resume: '", ckpt, "' was trained on '",
             scfg.at("dataset").get<std::string>(), "', not '", c.dataset, "'");
    EG_CHECK(scfg.value("freeze", std::string("none")) == c.freeze, "--resume: '", ckpt, "' was trained with --freeze ",
             scfg.value("freeze", std::string("none")), ", not ", c.freeze);
    // The scope changes what every reading measures; a checkpoint without it predates
    // the flag and the "unit" default, and was read with the network.
    const std::string scope = scfg.value("freeze_reference_scope", std::string("network"));
    EG_CHECK(c.freeze != "egeria" || scope == c.freeze_reference_scope, "--resume: '", ckpt,
             "' was trained with --freeze-reference-scope ", scope, "; pass --freeze-reference-scope ", scope,
             " to continue its freezing decisions");
    // Likewise the int8 reference's calibration: a checkpoint without it predates the
    // flag and quantised every batch with its own scales.
    const int64_t calibration = scfg.value("freeze_reference_calibration", int64_t(0));
    EG_CHECK(c.freeze != "egeria" || c.freeze_reference != "int8" || calibration == c.freeze_reference_calibration,
             "--resume: '", ckpt, "' was trained with --freeze-reference-calibration ", calibration,
             "; pass --freeze-reference-calibration ", calibration, " to continue its freezing decisions");
    TensorMap ms, os;
    for (auto& [k, t] : all) {
      if (k.rfind("model/", 0) == 0) ms[k.substr(6)] = t;
      if (k.rfind("optim/", 0) == 0) os[k.substr(6)] = t;
    }
    r.model->load_state_dict(ms);
    r.opt->load_state_dict(os);
    fr.load(all, saved, ckpt);
    default_generator().set_state(saved.at("rng_seed"), saved.at("rng_offset"));
    state = saved;
    std::printf("resuming %s from epoch %lld, batch %lld (step %lld)\n", ckpt.c_str(),
                (long long)state["epoch"].get<int64_t>() + 1, (long long)state["batch"].get<int64_t>(),
                (long long)state["step"].get<int64_t>());
  } else {
    if (c.resume) std::printf("--resume: no checkpoint in '%s' yet; starting from the beginning\n", c.out.c_str());
    std::ofstream(metrics, std::ios::trunc);
  }
  write_file_atomic(c.out + "/config.json", config_json(c).dump(2) + "\n");

  auto save = [&](int64_t epoch, int64_t batch) {
    TensorMap all;
    for (auto& [k, t] : r.model->state_dict()) all["model/" + k] = t;
    for (auto& [k, t] : r.opt->state_dict()) all["optim/" + k] = t;
    fr.save(all, state);
    state["epoch"] = epoch;
    state["batch"] = batch;
    state["rng_seed"] = default_generator().seed();
    state["rng_offset"] = default_generator().offset();
    save_safetensors(ckpt, all, {{"state", state.dump()}, {"config", config_json(c).dump()}});
  };

  data::LoaderOptions lo;
  lo.batch_size = c.batch_size;
  lo.augment = c.augment;
  lo.augment_per_sample = c.augment_mode == "sample";
  lo.aug.crop_padding = c.augment ? (r.train->images.size(2) >= 32 ? 4 : 2) : 0;
  lo.aug.hflip = c.augment;
  lo.aug.norm = data::default_normalization(c.dataset);
  lo.workers = c.workers;
  lo.seed = c.seed;
  data::Loader loader(r.train, lo);

  const bool tty = ::isatty(STDOUT_FILENO);
  Summary s;
  int64_t step = state["step"], this_run = 0, images = state["images"];
  double train_secs = state["train_seconds"];
  r.model->train();
  const int64_t start_epoch = state["epoch"], start_batch = state["batch"];
  for (int64_t epoch = start_epoch; epoch < c.epochs; ++epoch) {
    loader.start_epoch(epoch, epoch == start_epoch ? start_batch : 0);
    double loss_sum = 0;
    int64_t loss_n = 0;
    auto t_epoch = Clock::now();
    data::Batch b;
    while (loader.next(b)) {
      auto t0 = Clock::now();
      const double lr = r.sched->lr_at(step);
      r.opt->set_lr(lr);
      const int64_t capture = fr.capture_layer(step);
      Tensor captured;
      Tensor logits = fr.forward(b.x, b.ids, r.device, capture, &captured);
      if (fr.caching()) fr.prefetch(loader.upcoming_ids(1));  // gathered while this step runs
      Tensor loss = fn::cross_entropy(logits, b.y.to(r.device));
      const double lv = loss.item();
      if (!std::isfinite(lv)) {
        append_line(metrics, {{"type", "error"}, {"step", step}, {"epoch", epoch + 1}, {"loss", std::to_string(lv)}});
        EG_THROW("the training loss became ", lv, " at step ", step, " (epoch ", epoch + 1, ", batch ", b.index,
                 "); stopped without saving. The last good checkpoint is ",
                 file_exists(ckpt) ? "'" + ckpt + "'" : std::string("absent (none was written yet)"),
                 ". Try a lower --lr.");
      }
      r.opt->zero_grad();
      loss.backward();
      r.opt->step();
      ++step;
      ++this_run;
      fr.after_step({step, epoch, lr, lv, Tensor(), Tensor()}, b.x, captured, train_secs);
      images += b.y.numel();
      loss_sum += lv;
      ++loss_n;
      train_secs += std::chrono::duration<double>(Clock::now() - t0).count();
      const double ips = double(images) / std::max(train_secs, 1e-9);
      if (step % c.log_every == 0) {
        json j = {{"type", "step"}, {"step", step}, {"epoch", epoch + 1}, {"loss", lv}, {"lr", lr},
                  {"train_seconds", train_secs}, {"images_per_second", ips}};
        j.update(fr.step_fields());
        append_line(metrics, j);
      }
      const int64_t done = b.index + 1, total = r.steps_per_epoch;
      const double el = std::chrono::duration<double>(Clock::now() - t_epoch).count();
      detail::print_progress({epoch, c.epochs, done, total, step, loss_sum / double(loss_n), lv, lr, ips,
                              el / double(loss_n) * double(total - done), "img/s"},
                             tty, c.log_every);
      if (c.checkpoint_every > 0 && step % c.checkpoint_every == 0) {
        state["step"] = step;
        state["train_seconds"] = train_secs;
        state["images"] = images;
        save(epoch, b.index + 1);
      }
      if (c.stop_after_steps > 0 && this_run >= c.stop_after_steps) {
        s.steps = step;
        return s;  // as if killed here
      }
    }
    if (tty) std::printf("\n");
    EvalOut ev = evaluate(*r.model, *r.test, c.dataset, r.device);
    double best = std::max(state["best_acc"].get<double>(), ev.acc);
    state["best_acc"] = best;
    if (target > 0 && ev.acc >= target && state["time_to_target"].get<double>() < 0) state["time_to_target"] = train_secs;
    append_line(metrics, {{"type", "epoch"}, {"epoch", epoch + 1}, {"step", step},
                          {"train_loss", loss_n ? loss_sum / double(loss_n) : NAN}, {"test_loss", ev.loss},
                          {"test_accuracy", ev.acc}, {"lr", r.sched->lr_at(std::max<int64_t>(step - 1, 0))},
                          {"train_seconds", train_secs}});
    std::printf("epoch %lld/%lld: test accuracy %.2f%%  test loss %.4f  (best %.2f%%)  %s\n", (long long)epoch + 1,
                (long long)c.epochs, 100 * ev.acc, ev.loss, 100 * best, human_time(train_secs).c_str());
    std::fflush(stdout);
    state["step"] = step;
    state["train_seconds"] = train_secs;
    state["images"] = images;
    state["last_acc"] = ev.acc;
    state["last_loss"] = ev.loss;
    save(epoch + 1, 0);
  }
  s.completed = true;
  s.steps = step;
  s.final_test_accuracy = state.value("last_acc", 0.0);
  s.final_test_loss = state.value("last_loss", 0.0);
  s.best_test_accuracy = state["best_acc"];
  s.train_seconds = train_secs;
  s.images_per_second = double(images) / std::max(train_secs, 1e-9);
  s.time_to_target_seconds = state["time_to_target"];
  TensorMap weights = r.model->state_dict();
  save_safetensors(c.out + "/model.safetensors", weights, {{"model", c.model}, {"dataset", c.dataset}});
  json sj = {{"model", c.model}, {"dataset", c.dataset}, {"epochs", c.epochs},
             {"final_test_accuracy", s.final_test_accuracy}, {"best_test_accuracy", s.best_test_accuracy},
             {"final_test_loss", s.final_test_loss}, {"train_seconds", s.train_seconds},
             {"time_to_target_seconds", s.time_to_target_seconds < 0 ? json(nullptr) : json(s.time_to_target_seconds)},
             {"images_per_second", s.images_per_second}, {"steps", s.steps}, {"parameters", r.model->num_parameters()},
             {"flops_per_sample", r.model->flops_per_sample()}, {"freeze", c.freeze}};
  fr.summarize(sj, s.steps, s.train_seconds);
  s.freeze_report = freeze_report(sj);
  write_file_atomic(c.out + "/summary.json", sj.dump(2) + "\n");
  return s;
}

EvalResult evaluate_checkpoint(const std::string& out, const std::string& data_dir, int64_t test_limit,
                               const std::string& precision, int64_t calibration_batches) {
  EG_CHECK(precision == "fp32" || precision == "int8", "eval: unknown precision '", precision, "' (fp32, int8)");
  Metadata meta;
  const std::string p = out + "/" + kCheckpoint;
  TensorMap all = load_safetensors(p, &meta);
  EG_CHECK(meta.count("config"), "'", p, "' has no training configuration in its metadata");
  json cfg = json::parse(meta.at("config"));
  if (is_translation_model(cfg.at("model"))) return evaluate_translation_checkpoint(out, data_dir, test_limit, precision);
  TrainConfig c;
  c.model = cfg.at("model");
  c.dataset = cfg.at("dataset");
  c.data_dir = data_dir.empty() ? cfg.value("data_dir", "") : data_dir;
  c.test_limit = test_limit;
  data::ImageDataset test = data::load_image_dataset({c.dataset, c.data_dir, test_limit}, false);
  models::ModelConfig mc;
  mc.name = c.model;
  mc.in_channels = test.images.size(1);
  mc.image_size = test.images.size(2);
  mc.num_classes = c.dataset == "cifar100" ? 100 : 10;
  Generator g(0);
  auto m = models::build_model(mc, g);
  TensorMap ms;
  for (auto& [k, t] : all)
    if (k.rfind("model/", 0) == 0) ms[k.substr(6)] = t;
  m->load_state_dict(ms);
  if (precision == "int8") quant::convert_to_int8(*m, calibration_batches);
  EvalOut e = evaluate(*m, test, c.dataset, Device::cpu());
  return {e.acc, e.loss, test.size()};
}

StepBench bench_step(const std::string& model, int64_t bs, const std::string& device, int iters, int threads) {
  EG_CHECK(bs > 0 && iters > 0, "bench step: batch size and iterations must be positive");
  set_num_threads(threads);
  Device dev = Device::parse(device);
  models::ModelConfig mc;
  mc.name = model;
  mc.image_size = model == "resnet50" || model == "resnet18" ? 224 : 32;
  mc.small_input = mc.image_size == 32;
  mc.num_classes = model == "resnet50" || model == "resnet18" ? 1000 : 10;
  Generator g(0);
  auto m = models::build_model(mc, g);
  m->to(dev);
  optim::SGD opt(m->parameters(), 0.01, {0.9, 0, 5e-4, false});
  Tensor x = Tensor::randn({bs, 3, mc.image_size, mc.image_size}, g).to(dev);
  std::vector<int64_t> labels(static_cast<size_t>(bs));
  for (int64_t i = 0; i < bs; ++i) labels[size_t(i)] = i % mc.num_classes;
  Tensor y = Tensor::from_vector(labels, {bs}, dev);
  std::vector<double> ms;
  const int warmup = 3;
  for (int i = 0; i < warmup + iters; ++i) {
    auto t0 = Clock::now();
    Tensor loss = fn::cross_entropy(m->forward(x), y);
    opt.zero_grad();
    loss.backward();
    opt.step();
    (void)loss.item();  // waits for the device
    if (i >= warmup) ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  StepBench r;
  r.iterations = iters;
  r.median_step_ms = ms[ms.size() / 2];
  r.samples_per_second = double(bs) / (r.median_step_ms / 1000);
  return r;
}

}  // namespace eg::train
