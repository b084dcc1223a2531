// A training run's configuration: typed values, and the one table of options that
// drives the command line (tools/egeria.cpp), config.json (both ways) and the check a
// resumed run makes against its checkpoint. Every option a user can give is a row of
// that table (train/options.cpp); values are parsed and validated there, once, so
// nothing below train/ reads a flag's text.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <set>
#include <string>
#include <vector>

#include "dist/grad_sync.h"
#include "freeze/policy.h"
#include "optim/loss_scaler.h"

namespace eg::optim {
class LrSchedule;
}

namespace eg::train {

enum class OptimizerKind { sgd, adamw };
enum class Schedule { step, cosine, constant, inverse_sqrt, linear };
enum class AugmentMode { epoch, sample };  // a new crop/flip every epoch, or one per sample
using FreezeUnits = freeze::PartitionMode;
using FrozenBn = freeze::FrozenBn;
using ReferenceScope = freeze::ReferenceScope;
// A process-wide kernel choice: process leaves the environment's (EG_CPU_WINOGRAD,
// EG_ALLOW_TF32); config.json records what the run used.
enum class Switch { process, on, off };

struct TrainConfig {
  // ---- run
  std::string model = "resnet20", out = "runs/latest", device = "cpu";
  int64_t epochs = 15;
  uint64_t seed = 0;
  int threads = 0;  // 0: all cores (config.json records the count used)
  Switch cpu_winograd = Switch::process;
  // TF32 tensor cores for CUDA f32 convolutions and GEMMs (torch.backends.cudnn.allow_tf32
  // and torch.backends.cuda.matmul.allow_tf32); off keeps IEEE f32.
  Switch tf32 = Switch::process;
  // f32, or bf16 mixed precision (autograd::Autocast around the forward and the loss; Note
  // [Autocast] in autograd/autocast.h), on the CPU and CUDA; or fp16, the same on CUDA
  // with loss scaling.
  DType precision = DType::f32;
  // The training step captured as a CUDA graph after a warm-up and replayed (Note
  // [Graphed steps] in train/graphed_step.h): one GPU, one process; a graph per batch
  // shape, at most cuda_graph_limit of them (the most used shapes'; 0: the task's
  // default, Task::default_graph_limit).
  bool cuda_graphs = false;
  int64_t cuda_graph_limit = 0;
  bool resume = false;
  int64_t checkpoint_every = 0;  // steps; 0: at the end of every epoch only
  int64_t keep_checkpoints = 1;  // the newest N checkpoints are kept (checkpoint-<step>)
  int64_t log_every = 50;
  double target_accuracy = 0;  // 0..1 or 0..100; time_to_target_seconds reports when reached
  int64_t eval_every = 0;  // steps between loss-only evaluations of the first split (0: epoch ends only)
  int64_t stop_after_steps = 0;  // testing: end this invocation after N steps (as if killed)
  std::string init_from;  // a fresh run starts from these weights (safetensors; train/checkpoint.h)
  std::vector<std::string> init_exclude;  // ... except these tensors or modules (train/init_from.h)
  std::vector<int64_t> classes;  // IDX datasets: keep these classes, relabelled 0.. in this order (empty: all)
  // ---- data
  std::string dataset = "fashion-mnist", data_dir;
  int64_t train_limit = 0, test_limit = 0;
  double val_fraction = 0;  // held out of the training set, seeded; the best epoch is chosen on it
  bool augment = true;
  int64_t image_size = 0;  // image folders: the side of the crops trained on (0: 224)
  int64_t image_channels = 3;  // image folders: 3 (RGB) or 1 (grey, as torchvision's Grayscale())
  double crop_pct = 224.0 / 256.0;  // image folders: evaluation's centre crop of the resized short side
  std::vector<double> image_mean, image_std;  // image folders' normalisation per channel (empty: ImageNet's)
  bool skip_bad_images = false;  // a file that cannot be read or decoded is left out and counted, not an error
  AugmentMode augment_mode = AugmentMode::epoch;
  int64_t augment_variants = 1;  // --augment-mode sample: the fixed augmentations a sample is seen in, in turn
  int workers = 0;  // loader threads; 0: max(1, this rank's cores - training threads)
  // ---- optimisation
  int64_t batch_size = 128;
  OptimizerKind optimizer = OptimizerKind::sgd;
  double lr = 0.1, momentum = 0.9, weight_decay = 5e-4, gamma = 0.1;
  bool nesterov = false;
  double adam_beta1 = 0.9, adam_beta2 = 0.999;
  Schedule lr_schedule = Schedule::step;
  std::vector<int64_t> milestones;  // epochs; default: 50% and 75% of the epochs, rounded down
  int64_t warmup_steps = 0;
  double grad_clip = 0;  // the gradients' global L2 norm clipped to this before each step (0: off)
  double label_smoothing = 0;  // of the training loss (Transformers: 0.1); evaluation losses are plain
  // ---- data-parallel training (several ranks under an MPI launcher; train/run.h)
  double bucket_cap_mb = 25;  // gradient buckets after the first (1 MiB), as PyTorch DDP
  dist::GradSyncOptions grad_sync;  // overlapped with backward, and in which dtype
  optim::LossScaleOptions loss_scale;  // dynamic loss scaling (default: with fp16)
  // ---- layer freezing (freeze/policy.h): the policy (none, static, freezeout, autofreeze,
  // egeria), its units, egeria's tracker and reference model, the activation cache
  freeze::FreezeOptions freezing;
  // ---- translation (Transformers): shared SentencePiece vocabulary, tokens per side
  // (longer training pairs are dropped), batching by a token budget when > 0, and
  // training batches' lengths padded up to a multiple (data::BatcherOptions).
  int64_t vocab_size = 8000, max_len = 128, max_tokens = 0, pad_to_multiple = 1;
};

// Note [Model-dependent defaults]
// TrainConfig's initialisers are the image models' defaults on the built-in datasets
// (SGD, lr 0.1, wd 5e-4, 15 epochs, ...: the CIFAR ResNet recipe of He et al.). Two
// other recipes replace them:
// - A Transformer: AdamW with betas 0.9/0.98, lr 5e-4, inverse square root schedule with
//   warmup (4000 steps for transformer-base, 1000 for the smaller ones), no weight decay,
//   label smoothing 0.1, 64 sentences, dataset en-es.
// - An image folder (--dataset imagefolder), the ImageNet recipes: SGD with momentum 0.9,
//   lr 0.1 x global batch / 256 (Goyal et al.'s linear scaling), weight decay 1e-4, 90
//   epochs with the LR falling 10x at a third, two thirds and 8/9 of them (30, 60, 80:
//   torchvision's ResNet-50); for MobileNetV2 lr 0.05 x global batch / 256 with a cosine
//   schedule over 150 epochs and weight decay 4e-5.
// Each option's row holds its own recipe defaults (Option::recipe_default).
// apply_model_defaults(c, given, world_size) applies them for c.model and c.dataset, in
// the table's order, leaving alone the fields whose flags are in `given` ("--lr",
// "--optimizer", ...: what the user set explicitly); `world_size` is the number of ranks
// (the global batch is c.batch_size x world_size). The CLI calls it with the flags it parsed; library users
// call default_config(model, dataset) and then set what they want.
void apply_model_defaults(TrainConfig& c, const std::set<std::string>& given = {}, int world_size = 1);
TrainConfig default_config(const std::string& model, const std::string& dataset = "");

// Every problem named in the flag's terms (eg::Error): each option's own rule
// (Option::check), then the rules between options.
void validate(const TrainConfig& c);
// A thread count's rule (--threads, --workers, bench step's --threads): 0 for the
// default (`zero` says what it is) or up to the machine's CPUs; throws eg::Error naming `flag`.
void check_cpu_count(const char* flag, int v, const char* zero);
// The rule validate() cannot check before the GPU is known: a 16-bit precision on a GPU
// that has its kernels (cuDNN's bf16 from compute capability 8.0, f16 from 7.0).
void check_precision_on(Device d, DType precision);

// Which of the recipes of Note [Model-dependent defaults] c.model and c.dataset train with.
enum class Recipe { images, transformer, image_folder, image_folder_mobilenet };
Recipe recipe_of(const TrainConfig& c);

// ---- the table of options
enum class OptionGroup { run, data, optimisation, parallel, freezing, reference, cache, translation, hidden };
const char* group_title(OptionGroup g);

// What a resumed run may do with an option: `fixed` options change the result and must
// equal the checkpoint's; `free` ones (paths, logging) may change; `warn` ones may change
// with a printed warning (results are then no longer bit-identical).
enum class OnResume { fixed, free, warn };

struct Option {
  std::string flag;  // "--lr"
  std::string key;  // "lr" in config.json
  OptionGroup group;
  OnResume on_resume;
  std::string help;
  std::string value_text;  // "auto|n|N", "sgd|adamw", ...; empty for a switch
  bool is_switch = false;  // takes no value (--nesterov, --no-augment)
  std::function<nlohmann::json(const TrainConfig&)> get;
  // Sets the value from config.json's form or, as a JSON string, from the command line's
  // text; throws eg::Error naming the flag and the accepted values.
  std::function<void(TrainConfig&, const nlohmann::json&)> set;
  // The value's own rule (a range, a known name), checked by validate(): throws eg::Error
  // naming the flag. Empty: every value parses to a valid one.
  std::function<void(const TrainConfig&)> check;
  // The default under the recipes other than TrainConfig's initialisers (Note
  // [Model-dependent defaults]): sets the field for c.model and c.dataset on
  // `world_size` ranks, or leaves it. Empty: the initialiser's value everywhere.
  std::function<void(TrainConfig&, int world_size)> recipe_default;
};
const std::vector<Option>& options();
const Option& option(const std::string& flag_or_key);

// Parses one option's command-line text into c (throws eg::Error naming the flag).
void set_option(TrainConfig& c, const std::string& flag, const std::string& text);

// config.json: every option, with `threads`, `cpu_winograd` and `tf32` as this process resolved
// them. from_json starts from `base` and sets each key present; an unknown key is an error
// naming it (keys a task adds beside the options, such as "arch", are listed in `extra`).
nlohmann::json to_json(const TrainConfig& c);
TrainConfig from_json(const nlohmann::json& j, TrainConfig base = {}, const std::set<std::string>& extra = {});

// The check `--resume` makes: each fixed option equal to the checkpoint's config (an
// error names the option and both values), `--epochs` changed only without a freezing
// policy and when the LR of every step up to `resume_step` is unchanged, and a warning
// for each `warn` option changed.
void check_resume(const TrainConfig& c, const nlohmann::json& saved, int64_t steps_per_epoch, int64_t resume_step,
                  const std::string& ckpt);

// The machine this process runs on (core/machine.h), as summary.json and `egeria bench step`
// record it.
nlohmann::json machine_json();

std::unique_ptr<optim::LrSchedule> make_schedule(const TrainConfig& c, int64_t steps_per_epoch);

}  // namespace eg::train
