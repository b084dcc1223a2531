// The uses of the option table (train/options.cpp, where each row holds its own rule and
// recipe defaults): the recipes applied, validation (the rules between options), the
// resume check, config.json, and the LR schedule of a TrainConfig (train/config.h).
#include "train/config.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "core/device.h"
#include "core/error.h"
#include "core/gpu_info.h"
#include "core/machine.h"
#include "data/dataset.h"
#include "freeze/policy.h"
#include "models/model.h"
#include "optim/schedule.h"
#include "quant/reference.h"

namespace eg::train {

using json = nlohmann::json;

using models::is_translation_model;

// Where --dataset is one of the table's (data::datasets()), of kind `k`; false for a user's data.
bool dataset_is(const TrainConfig& c, data::DataKind k) {
  const data::DatasetInfo* d = data::find_dataset(c.dataset);
  return d && d->kind == k;
}

Recipe recipe_of(const TrainConfig& c) {
  if (is_translation_model(c.model)) return Recipe::transformer;
  if (!dataset_is(c, data::DataKind::image_folder)) return Recipe::images;
  return c.model == "mobilenetv2" ? Recipe::image_folder_mobilenet : Recipe::image_folder;
}

void apply_model_defaults(TrainConfig& c, const std::set<std::string>& given, int world_size) {
  // See Note [Model-dependent defaults]. In the table's order: a default may depend on
  // rows above it (the image folders' LR on the batch size, their milestones on the
  // epochs and the schedule).
  for (auto& o : options())
    if (o.recipe_default && !given.count(o.flag)) o.recipe_default(c, world_size);
}

void check_precision_on(Device d, DType precision) {
  if (!d.is_cuda() || precision == DType::f32) return;
  const int cc = cuda_compute_capability(d.index), need = precision == DType::bf16 ? 80 : 70;
  EG_CHECK(cc >= need, "--precision ", precision == DType::bf16 ? "bf16" : "fp16", " on ", d.str(),
           ": its GPU has compute capability ", cc / 10, ".", cc % 10, ", and ",
           precision == DType::bf16 ? "bf16 needs 8.0 (Ampere) or newer; use --precision fp16 or f32 there"
                                    : "fp16 needs 7.0 (Volta) or newer; use --precision f32 there");
}

TrainConfig default_config(const std::string& model, const std::string& dataset) {
  TrainConfig c;
  c.model = model;
  if (!dataset.empty()) c.dataset = dataset;
  apply_model_defaults(c, dataset.empty() ? std::set<std::string>{} : std::set<std::string>{"--dataset"});
  return c;
}

void validate(const TrainConfig& c) {
  for (auto& o : options())
    if (o.check) o.check(c);
  // ---- the rules between options
  // bf16 trains on the CPU and CUDA, fp16 on CUDA (PyTorch's CPU autocast is bf16 only).
  EG_CHECK(!(Device::parse(c.device).is_cpu() && c.precision == DType::f16), "--precision fp16 is for GPUs (fp16 with ",
           "loss scaling); on the CPU train with --precision bf16 (as PyTorch's CPU autocast) or f32");
  if (c.freezing.policy == "egeria")
    EG_CHECK(!quant::reference_on_gpu(c.freezing.reference.precision) || Device::parse(c.device).is_cuda(),
             "--freeze-reference ", c.freezing.reference.precision,
             " runs the reference model on the training GPU; it needs --device cuda[:N] (training on ", c.device, ")");
  EG_CHECK(c.augment_variants == 1 || (c.augment && c.augment_mode == AugmentMode::sample), "--augment-variants ",
           c.augment_variants, " chooses among each sample's fixed augmentations: it needs ",
           c.augment ? "--augment-mode sample" : "augmentation (not --no-augment)");
  EG_CHECK(c.freezing.bn_settle <= 0 || c.freezing.bn == FrozenBn::running, "--freeze-bn-settle ", c.freezing.bn_settle,
           " settles the running statistics a frozen BatchNorm switches to, which only --freeze-bn running does "
           "(with batch, the default, it keeps each batch's)");
  if (c.freezing.cache) {
    // See Note [Activation cache validity].
    EG_CHECK(!is_translation_model(c.model), "--freeze-cache on caches image models' frozen prefix; ", c.model,
             " batches sentences of varying length, use --freeze-cache off");
    EG_CHECK(c.freezing.policy != "none",
             "--freeze-cache on caches the frozen prefix; with --freeze none nothing freezes");
    EG_CHECK(c.freezing.bn == FrozenBn::running,
             "--freeze-cache on needs --freeze-bn running: with batch statistics a "
             "frozen sample's output depends on the rest of its batch, so a cached one would be wrong");
    EG_CHECK(!c.augment || c.augment_mode == AugmentMode::sample,
             "--freeze-cache on needs --augment-mode sample (or "
             "--no-augment): with a new crop and flip every epoch no cached output is ever reused");
  }
  if (is_translation_model(c.model)) {
    EG_CHECK(dataset_is(c, data::DataKind::sentence_pairs), "--model ", c.model,
             " trains on sentence pairs: use --dataset en-es (with --data-dir ",
             "pointing at a directory of train/valid/test.tsv), not '", c.dataset, "'");
    EG_CHECK(c.target_accuracy == 0, "--target-accuracy applies to image models; translation runs report BLEU");
    EG_CHECK(c.val_fraction == 0, "--val-fraction holds out training images; translation has its own validation split ",
             "(valid.tsv), on which it chooses its best epoch");
  } else {
    EG_CHECK(c.pad_to_multiple == 1, "--pad-to-multiple applies to translation (--model transformer-*); ", c.model,
             " takes batches of one image shape");
    EG_CHECK(!dataset_is(c, data::DataKind::sentence_pairs), "--dataset ", c.dataset,
             " is sentence pairs: train it with --model transformer-tiny, transformer-small or transformer-base, not ",
             c.model);
  }
  const bool folder = dataset_is(c, data::DataKind::image_folder);
  EG_CHECK(c.classes.empty() || dataset_is(c, data::DataKind::images), "--classes applies to the in-memory image ",
           "datasets (fashion-mnist, mnist, cifar10, cifar100); ",
           folder ? "an image folder's classes are its class folders: give --data-dir a folder of those you want"
                  : c.dataset + " has no classes");
  EG_CHECK(c.init_exclude.empty() || !c.init_from.empty(), "--init-exclude applies to --init-from's weights; ",
           "no --init-from was given");
  EG_CHECK(c.image_size == 0 || folder, "--image-size applies to --dataset imagefolder; ", c.dataset,
           " has images of its own size");
  EG_CHECK(
      folder || (c.image_channels == 3 && c.crop_pct == 224.0 / 256.0 && c.image_mean.empty() && c.image_std.empty()),
      "--image-channels, --crop-pct, --image-mean and --image-std apply to --dataset imagefolder; ", c.dataset,
      " has its own");
  for (auto* list : {&c.image_mean, &c.image_std})
    EG_CHECK(list->empty() || int64_t(list->size()) == c.image_channels,
             list == &c.image_mean ? "--image-mean" : "--image-std", " needs one value per channel (", c.image_channels,
             "), got ", list->size());
  if (folder) {
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
  // An auto that means one value or another by the run compares as what it means for this run,
  // so that a checkpoint naming that value (from before auto) resumes under auto: the T of a
  // run from --init-from comes from the steepest fit, of others from the first 3 (Note [T for
  // a pretrained network]).
  auto meant = [&](const std::string& key, const json& v) {
    if (key == "freeze_tolerance_from" && v == "auto") return json(c.init_from.empty() ? "first3" : "peak");
    return v;
  };
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
    if (meant(o.key, was) == meant(o.key, now[o.key])) continue;
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
      EG_CHECK(c.freezing.policy == "none", "--resume: '", ckpt, "' was trained with --epochs ", shown(was),
               "; a run with --freeze ", c.freezing.policy,
               " cannot change its length, as the policy's decisions so far ", "depend on it");
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

json machine_json() {
  const Machine& m = this_machine();
  json j = {{"cpu", m.cpu},
            {"cpu_isa", m.cpu_isa},
            {"hardware_threads", m.hardware_threads},
            {"host", m.host},
            {"boot_id", m.boot_id}};
  if (!m.gpu.empty()) j["gpu"] = m.gpu;
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
