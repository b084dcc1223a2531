// Model-dependent defaults, validation, the resume check and the LR schedule of a
// TrainConfig (train/config.h); the option table itself is in train/options.cpp.
#include "train/config.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "core/device.h"
#include "core/error.h"
#include "freeze/policy.h"
#include "models/model.h"
#include "optim/schedule.h"
#include "quant/reference.h"

namespace eg::train {

using json = nlohmann::json;

bool is_translation_model(const std::string& m) { return m.rfind("transformer", 0) == 0; }

void apply_model_defaults(TrainConfig& c, const std::set<std::string>& given, int world_size) {
  // See Note [Model-dependent defaults].
  auto set = [&](const char* flag, auto& field, auto value) {
    if (!given.count(flag)) field = value;
  };
  if (is_translation_model(c.model)) {
    // Transformer recipe of Vaswani et al. / fairseq, with a shorter warmup for the
    // 2+2-layer model, which sees fewer steps.
    set("--dataset", c.dataset, std::string("en-es"));
    set("--optimizer", c.optimizer, OptimizerKind::adamw);
    set("--lr", c.lr, 5e-4);
    set("--lr-schedule", c.lr_schedule, Schedule::inverse_sqrt);
    set("--warmup-steps", c.warmup_steps, int64_t(c.model == "transformer-base" ? 4000 : 1000));
    set("--weight-decay", c.weight_decay, 0.0);
    set("--batch-size", c.batch_size, int64_t(64));
    set("--label-smoothing", c.label_smoothing, 0.1);
    if (!given.count("--adam-betas")) {
      c.adam_beta1 = 0.9;
      c.adam_beta2 = 0.98;
    }
    return;
  }
  if (c.dataset != "imagefolder") return;  // TrainConfig's initialisers are the other image defaults
  const double global_batch = double(c.batch_size) * double(std::max(world_size, 1));
  set("--optimizer", c.optimizer, OptimizerKind::sgd);
  set("--momentum", c.momentum, 0.9);
  if (c.model == "mobilenetv2") {
    set("--lr", c.lr, 0.05 * global_batch / 256);
    set("--weight-decay", c.weight_decay, 4e-5);
    set("--epochs", c.epochs, int64_t(150));
    set("--lr-schedule", c.lr_schedule, Schedule::cosine);
    return;
  }
  set("--lr", c.lr, 0.1 * global_batch / 256);
  set("--weight-decay", c.weight_decay, 1e-4);
  set("--epochs", c.epochs, int64_t(90));
  set("--lr-schedule", c.lr_schedule, Schedule::step);
  if (c.lr_schedule == Schedule::step && !given.count("--milestones")) {
    const int64_t e = c.epochs;  // 30, 60, 80 of 90
    c.milestones.clear();
    for (int64_t m : {e / 3, 2 * e / 3, 8 * e / 9})
      if (m > 0 && (c.milestones.empty() || m > c.milestones.back())) c.milestones.push_back(m);
  }
}

TrainConfig default_config(const std::string& model, const std::string& dataset) {
  TrainConfig c;
  c.model = model;
  if (!dataset.empty()) c.dataset = dataset;
  apply_model_defaults(c, dataset.empty() ? std::set<std::string>{} : std::set<std::string>{"--dataset"});
  return c;
}

namespace {
std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}
bool member(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}
}  // namespace

void validate(const TrainConfig& c) {
  EG_CHECK(member(models::model_names(), c.model), "--model: unknown model '", c.model,
           "' (known: ", joined(models::model_names()), ")");
  EG_CHECK(c.epochs > 0, "--epochs must be positive, got ", c.epochs);
  EG_CHECK(c.batch_size > 0, "--batch-size must be positive, got ", c.batch_size);
  EG_CHECK(c.bucket_cap_mb > 0 && c.bucket_cap_mb <= 4096, "--bucket-cap-mb must be in (0, 4096] MiB, got ",
           c.bucket_cap_mb);
  EG_CHECK(c.lr > 0 && std::isfinite(c.lr), "--lr must be a positive number, got ", c.lr);
  EG_CHECK(c.momentum >= 0 && c.momentum < 1, "--momentum must be in [0, 1), got ", c.momentum);
  EG_CHECK(c.weight_decay >= 0, "--weight-decay must be non-negative, got ", c.weight_decay);
  EG_CHECK(c.gamma > 0 && c.gamma <= 1, "--gamma must be in (0, 1], got ", c.gamma);
  EG_CHECK(c.warmup_steps >= 0, "--warmup-steps must be non-negative, got ", c.warmup_steps);
  EG_CHECK(c.grad_clip >= 0, "--grad-clip must be non-negative (0: no clipping), got ", c.grad_clip);
  EG_CHECK(std::is_sorted(c.milestones.begin(), c.milestones.end()), "--milestones must be ascending");
  for (int64_t m : c.milestones) EG_CHECK(m > 0, "--milestones must be positive epochs, got ", m);
  EG_CHECK(c.adam_beta1 >= 0 && c.adam_beta1 < 1 && c.adam_beta2 >= 0 && c.adam_beta2 < 1,
           "--adam-betas must both be in [0, 1), got ", c.adam_beta1, ",", c.adam_beta2);
  EG_CHECK(c.threads >= 0, "--threads must be 0 (all cores) or a positive count, got ", c.threads);
  EG_CHECK(c.checkpoint_every >= 0, "--checkpoint-every must be non-negative, got ", c.checkpoint_every);
  EG_CHECK(c.keep_checkpoints >= 1, "--keep-checkpoints must be at least 1, got ", c.keep_checkpoints);
  EG_CHECK(c.log_every >= 1, "--log-every must be at least 1, got ", c.log_every);
  EG_CHECK(c.eval_every >= 0, "--eval-every must be 0 (epoch ends only) or a number of steps, got ", c.eval_every);
  EG_CHECK(c.workers >= 0,
           "--workers must be 0 (one less than the cores a rank has, at least 1) or a positive "
           "count, got ",
           c.workers);
  EG_CHECK(c.label_smoothing >= 0 && c.label_smoothing < 1, "--label-smoothing must be in [0, 1), got ",
           c.label_smoothing);
  EG_CHECK(c.stop_after_steps >= 0, "--stop-after-steps must be non-negative, got ", c.stop_after_steps);
  EG_CHECK(c.train_limit >= 0, "--train-limit must be non-negative, got ", c.train_limit);
  EG_CHECK(c.test_limit >= 0, "--test-limit must be non-negative, got ", c.test_limit);
  EG_CHECK(c.val_fraction >= 0 && c.val_fraction < 1, "--val-fraction must be in [0, 1), got ", c.val_fraction);
  EG_CHECK(c.target_accuracy >= 0 && c.target_accuracy <= 100, "--target-accuracy must be in [0, 1] or [0, 100], got ",
           c.target_accuracy);
  EG_CHECK(!c.out.empty(), "--out must name a directory");
  Device::parse(c.device);  // throws naming the device string
  // Freezing.
  EG_CHECK(member(freeze::policy_names(), c.freeze), "--freeze: unknown policy '", c.freeze,
           "' (known: ", joined(freeze::policy_names()), ")");
  EG_CHECK(c.freeze_interval >= 0, "--freeze-interval must be non-negative, got ", c.freeze_interval);
  EG_CHECK(c.freeze_bootstrap_interval >= -1,
           "--freeze-bootstrap-interval must be auto, n or a positive number of iterations, got ",
           c.freeze_bootstrap_interval);
  EG_CHECK(c.freeze_window >= 1, "--freeze-window must be at least 1, got ", c.freeze_window);
  EG_CHECK(c.freeze_window_min >= 1, "--freeze-window-min must be at least 1, got ", c.freeze_window_min);
  EG_CHECK(c.freeze_tolerance > 0, "--freeze-tolerance must be positive, got ", c.freeze_tolerance);
  EG_CHECK(c.freeze_threads >= 1, "--freeze-threads must be at least 1, got ", c.freeze_threads);
  EG_CHECK(c.freezeout_t0 > 0 && c.freezeout_t0 <= 1, "--freezeout-t0 must be in (0, 1], got ", c.freezeout_t0);
  EG_CHECK(c.autofreeze_percentile >= 0 && c.autofreeze_percentile <= 100,
           "--autofreeze-percentile must be in [0, 100], got ", c.autofreeze_percentile);
  EG_CHECK(member(quant::reference_precisions(), c.freeze_reference), "--freeze-reference must be one of ",
           joined(quant::reference_precisions()), ", got '", c.freeze_reference, "'");
  EG_CHECK(c.freeze_reference_calibration >= 0, "--freeze-reference-calibration must be >= 0 batches (0: every batch ",
           "its own scales), got ", c.freeze_reference_calibration);
  EG_CHECK(c.freeze_reference_max_load == 0 || (c.freeze_reference_max_load > 0 && c.freeze_reference_max_load <= 100),
           "--freeze-reference-max-load must be auto or a percentage of the machine's CPU, a number in (0, 100] "
           "without %, got ",
           c.freeze_reference_max_load);
  if (c.freeze == "egeria")
    EG_CHECK(!quant::reference_on_gpu(c.freeze_reference) || Device::parse(c.device).is_cuda(), "--freeze-reference ",
             c.freeze_reference,
             " runs the reference model on the training GPU; it needs --device cuda[:N] (training on ", c.device, ")");
  if (c.freeze_cache) {
    // See Note [Activation cache validity].
    EG_CHECK(!is_translation_model(c.model), "--freeze-cache on caches image models' frozen prefix; ", c.model,
             " batches sentences of varying length, use --freeze-cache off");
    EG_CHECK(c.freeze != "none", "--freeze-cache on caches the frozen prefix; with --freeze none nothing freezes");
    EG_CHECK(c.freeze_bn == FrozenBn::running,
             "--freeze-cache on needs --freeze-bn running: with batch statistics a "
             "frozen sample's output depends on the rest of its batch, so a cached one would be wrong");
    EG_CHECK(!c.augment || c.augment_mode == AugmentMode::sample,
             "--freeze-cache on needs --augment-mode sample (or "
             "--no-augment): with a new crop and flip every epoch no cached output is ever reused");
  }
  if (is_translation_model(c.model)) {
    EG_CHECK(c.dataset == "en-es", "--model ", c.model,
             " trains on sentence pairs: use --dataset en-es (with --data-dir ",
             "pointing at a directory of train/valid/test.tsv), not '", c.dataset, "'");
    EG_CHECK(c.vocab_size > 4, "--vocab-size must exceed the 4 special tokens (pad, bos, eos, unk), got ",
             c.vocab_size);
    EG_CHECK(c.max_len >= 2, "--max-len must be at least 2 tokens, got ", c.max_len);
    EG_CHECK(c.max_tokens >= 0, "--max-tokens must be non-negative, got ", c.max_tokens);
    EG_CHECK(c.target_accuracy == 0, "--target-accuracy applies to image models; translation runs report BLEU");
    EG_CHECK(c.val_fraction == 0, "--val-fraction holds out training images; translation has its own validation split ",
             "(valid.tsv), on which it chooses its best epoch");
  } else {
    EG_CHECK(c.dataset != "en-es", "--dataset en-es is English-Spanish sentence pairs: train it with --model ",
             "transformer-tiny, transformer-small or transformer-base, not ", c.model);
  }
  EG_CHECK(c.image_size >= 0, "--image-size must be positive (or 0: the default), got ", c.image_size);
  EG_CHECK(c.image_size == 0 || c.dataset == "imagefolder", "--image-size applies to --dataset imagefolder; ",
           c.dataset, " has images of its own size");
  const bool folder = c.dataset == "imagefolder";
  EG_CHECK(
      folder || (c.image_channels == 3 && c.crop_pct == 224.0 / 256.0 && c.image_mean.empty() && c.image_std.empty()),
      "--image-channels, --crop-pct, --image-mean and --image-std apply to --dataset imagefolder; ", c.dataset,
      " has its own");
  EG_CHECK(c.image_channels == 1 || c.image_channels == 3, "--image-channels must be 1 (grey) or 3 (RGB), got ",
           c.image_channels);
  EG_CHECK(c.crop_pct > 0 && c.crop_pct <= 1, "--crop-pct must be in (0, 1], got ", c.crop_pct);
  for (auto* list : {&c.image_mean, &c.image_std}) {
    const char* flag = list == &c.image_mean ? "--image-mean" : "--image-std";
    EG_CHECK(list->empty() || int64_t(list->size()) == c.image_channels, flag, " needs one value per channel (",
             c.image_channels, "), got ", list->size());
    for (double v : *list)
      EG_CHECK(list == &c.image_mean ? std::isfinite(v) : v > 0 && std::isfinite(v), flag,
               list == &c.image_mean ? " must be finite numbers" : " must be positive numbers", ", got ", v);
  }
  if (c.dataset == "imagefolder") {
    EG_CHECK(!c.data_dir.empty(), "--dataset imagefolder needs --data-dir DIR, holding DIR/train/<class>/* and ",
             "DIR/val/<class>/* (the ImageNet layout)");
    EG_CHECK(c.val_fraction == 0, "--val-fraction holds out images of an in-memory dataset; an image folder's ",
             "val/ split is evaluated as its test split");
  }
}

std::unique_ptr<optim::LrSchedule> make_schedule(const TrainConfig& c, int64_t spe) {
  const int64_t total = c.epochs * spe;
  std::unique_ptr<optim::LrSchedule> s;
  switch (c.lr_schedule) {
    case Schedule::step: {
      std::vector<int64_t> ms = c.milestones;
      if (ms.empty()) ms = {std::max<int64_t>(1, c.epochs / 2), std::max<int64_t>(1, c.epochs * 3 / 4)};
      for (auto& m : ms) m *= spe;
      s = optim::multistep_lr(c.lr, ms, c.gamma);
      break;
    }
    case Schedule::cosine: s = optim::cosine_lr(c.lr, total); break;
    case Schedule::constant: s = optim::constant_lr(c.lr); break;
    case Schedule::inverse_sqrt: return optim::inverse_sqrt_lr(c.lr, std::max<int64_t>(1, c.warmup_steps));
    case Schedule::linear: s = optim::linear_decay_lr(c.lr, total); break;
  }
  return c.warmup_steps > 0 ? optim::linear_warmup(std::move(s), c.warmup_steps) : std::move(s);
}

namespace {
std::string shown(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }
}  // namespace

void check_resume(const TrainConfig& c, const json& saved, int64_t spe, int64_t resume_step, const std::string& ckpt) {
  // Checkpoints from before an option existed ran with its then behaviour: the reference
  // read the network, and the int8 reference quantised every batch with its own scales.
  const json legacy = {{"freeze_reference_scope", "network"}, {"freeze_reference_calibration", 0}};
  const json now = to_json(c);
  for (auto& o : options()) {
    if (o.group == OptionGroup::hidden || !now.contains(o.key)) continue;
    json was = saved.contains(o.key) ? saved[o.key] : legacy.value(o.key, json());
    if (was.is_null()) continue;
    try {  // in today's form: an alias ("multistep") or an older spelling compares as its value
      TrainConfig as_saved;
      o.set(as_saved, was);
      was = o.get(as_saved);
    } catch (const Error&) {
    }
    if (was == now[o.key]) continue;
    if (o.on_resume == OnResume::warn) {
      std::printf(
          "warning: --resume with %s %s (the checkpoint's run used %s): results are no longer bit-identical "
          "to an uninterrupted run\n",
          o.flag.c_str(), shown(now[o.key]).c_str(), shown(was).c_str());
      continue;
    }
    if (o.on_resume == OnResume::free) continue;
    if (o.key == "epochs") {
      // Extension: the run so far must be the one the new length would have trained. A
      // freezing policy derives its schedule from the run's length (the default n and
      // bootstrapping span, static's epoch, FreezeOut's times, the final LR phase).
      EG_CHECK(c.freeze == "none", "--resume: '", ckpt, "' was trained with --epochs ", shown(was),
               "; a run with --freeze ", c.freeze, " cannot change its length, as the policy's decisions so far ",
               "depend on it");
      EG_CHECK(c.epochs * spe >= resume_step, "--resume: '", ckpt, "' has trained ", resume_step, " steps, more than ",
               "--epochs ", c.epochs, " holds (", c.epochs * spe, ")");
      TrainConfig before = c;
      before.epochs = was.get<int64_t>();
      auto a = make_schedule(before, spe), b = make_schedule(c, spe);
      int64_t differs = -1;
      for (int64_t s = 0; s <= resume_step && differs < 0; ++s)
        if (a->lr_at(s) != b->lr_at(s)) differs = s;
      EG_CHECK(differs < 0, "--resume: '", ckpt, "' was trained with --epochs ", shown(was), "; --epochs ", c.epochs,
               " would change the learning rate of step ", differs, " (", a->lr_at(differs), " -> ", b->lr_at(differs),
               "), which the run has already taken. Only a schedule whose past does not depend on ",
               "the run's length can be extended (constant, inverse-sqrt, or step with explicit --milestones)");
      continue;
    }
    EG_THROW("--resume: '", ckpt, "' was trained with ", o.flag, " ", shown(was), ", not ", shown(now[o.key]),
             "; pass ", o.flag, " ", shown(was), " to continue that run, or choose another --out for a new one");
  }
}

// ---- the option table's uses (the table itself: train/options.cpp)

const char* group_title(OptionGroup g) {
  switch (g) {
    case OptionGroup::run: return "Run";
    case OptionGroup::data: return "Data";
    case OptionGroup::optimisation: return "Optimisation";
    case OptionGroup::parallel: return "Data-parallel training (under mpirun)";
    case OptionGroup::freezing: return "Layer freezing";
    case OptionGroup::reference: return "Reference model (egeria)";
    case OptionGroup::cache: return "Activation cache";
    case OptionGroup::translation: return "Translation";
    case OptionGroup::hidden: return "";
  }
  return "";
}

const Option& option(const std::string& name) {
  for (auto& o : options())
    if (o.flag == name || o.key == name) return o;
  EG_THROW("unknown option '", name, "'");
}

void set_option(TrainConfig& c, const std::string& flag, const std::string& text) { option(flag).set(c, json(text)); }

json to_json(const TrainConfig& c) {
  json j = json::object();
  for (auto& o : options())
    if (o.group != OptionGroup::hidden && o.key != "resume") j[o.key] = o.get(c);
  return j;
}

TrainConfig from_json(const json& j, TrainConfig c, const std::set<std::string>& extra) {
  EG_CHECK(j.is_object(), "a configuration must be a JSON object, got ", j.dump().substr(0, 80));
  for (auto& [k, v] : j.items()) {
    if (extra.count(k)) continue;
    const Option* o = nullptr;
    for (auto& x : options())
      if (x.key == k) o = &x;
    EG_CHECK(o != nullptr, "unknown option \"", k, "\" in the configuration");
    o->set(c, v);
  }
  return c;
}

}  // namespace eg::train
