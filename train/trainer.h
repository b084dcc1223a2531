// The training loop behind `egeria train`, usable from C++ as well: data, model,
// optimizer and schedule from a TrainConfig; progress on the terminal; metrics,
// summary and atomic, resumable checkpoints in the output directory. Image models
// train here; Transformers on sentence pairs in train/translate.cpp, with the same files.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace eg::optim {
class LrSchedule;
}

namespace eg::train {

struct TrainConfig {
  std::string model = "resnet20", dataset = "fashion-mnist", data_dir, out = "runs/latest";
  int64_t epochs = 15, batch_size = 128;
  double lr = 0.1, momentum = 0.9, weight_decay = 5e-4, gamma = 0.1;
  std::string optimizer = "sgd", lr_schedule = "step";
  bool nesterov = false;
  std::vector<int64_t> milestones;  // epochs; default: 50% and 75% of the epochs, rounded down
  int64_t warmup_steps = 0;
  std::string device = "cpu";
  int threads = 0;
  uint64_t seed = 0;
  int64_t train_limit = 0, test_limit = 0;
  double target_accuracy = 0;  // 0..1 or 0..100; time_to_target_seconds reports when reached
  bool resume = false;
  int64_t checkpoint_every = 0;  // steps; 0: at the end of every epoch only
  int64_t log_every = 50;
  bool augment = true;
  std::string augment_mode = "epoch";  // a new crop/flip every epoch, or "sample": one per sample for the run
  int workers = 1;
  int64_t stop_after_steps = 0;  // testing: end this invocation after N steps (as if killed)
  // Layer freezing (freeze/policy.h): none, static, freezeout, autofreeze, egeria.
  std::string freeze = "none";
  std::string freeze_modules = "auto";  // freezing units: auto | layers (freeze/partition.h)
  std::string freeze_module_regex;      // non-empty: units by parameter name
  int64_t freeze_interval = 0;        // egeria/autofreeze n (0: the paper's guideline)
  // egeria: steps between bootstrapping checks (0: an epoch or a tenth of a shorter run,
  // at least n; -1: n, the paper; Note [The bootstrapping check's span] in freeze/tracker.h)
  int64_t freeze_bootstrap_interval = 0;
  int64_t freeze_window = 10;         // egeria W
  int64_t freeze_window_min = 1;      // egeria: W halves after an unfreeze down to this (1: the paper)
  double freeze_tolerance = 0.2;      // egeria: T = this x the largest of a module's first 3 slopes
  std::string freeze_tolerance_from = "first3";  // egeria: ... or "peak": of all its slopes so far
  // egeria: the T a module refreezes with after an unfreeze: "remeasure", "keep", "scaled"
  // (freeze/tracker.h, Note [Egeria's freezing decisions])
  std::string freeze_refreeze_tolerance = "remeasure";
  std::string freeze_bn = "batch";       // frozen BatchNorms: batch statistics, or "running" (layers.h)
  std::string freeze_last_phase = "on";  // egeria: "off": the schedule's last LR phase trains whole
  std::string freeze_first_phase = "on";  // egeria: "off": freezes held until the LR first falls 10x
  std::string freeze_unfreeze = "lr";     // egeria: "never": an LR fall does not unfreeze
  // egeria, for embedders with cyclic LR schedules: called at every step while a unit is
  // frozen with (step, LR); true unfreezes every unit (freeze::PolicyConfig::unfreeze_hook).
  std::function<bool(int64_t, double)> freeze_unfreeze_hook;
  std::string freeze_reference = "int8";
  // egeria, int8 reference: convolution inputs calibrated on this many batches after
  // each refresh, then fixed (0: every batch its own scales; Note [Static activation scales]).
  int64_t freeze_reference_calibration = 3;  // quant::kCalibrationBatches
  // egeria: what the reference runs for an evaluation. "unit": only the front unit, on the
  // training model's input to it (the output of the units before it); "network": from the images
  // through the front unit (the paper). Note [The reference's scope] in
  // freeze/controller.h. Transformers always run "network".
  std::string freeze_reference_scope = "unit";
  // The activation cache of the frozen prefix (cache/, the paper's §4.3): "on" skips
  // the prefix's forward for samples it has seen since the last freeze; it needs
  // freeze_bn "running" and augment_mode "sample" (or no augmentation).
  std::string freeze_cache = "off";
  std::string freeze_cache_dir;  // set: its entries go to a file there; empty: in memory when they take at
                                 // most half the available memory, else in a file in the output directory
  bool freeze_sync = false;           // egeria: evaluate plasticity inline (deterministic)
  std::string freeze_apply = "next";
  // CPU Winograd convolutions (core/device.h): "on", "off", or "" to leave the process's
  // setting (on unless EG_CPU_WINOGRAD=0).
  std::string cpu_winograd;  // egeria: act on a background evaluation at the next one, or on "arrival"
  int freeze_threads = 1;             // egeria: threads of each background thread
  // egeria: the reference forward runs only while the machine's CPU load is at most this
  // percentage ("auto": 50 when training on a GPU with freeze_apply "arrival", as the
  // paper; else 100, never waiting: CPU training keeps the cores busy by design, and with
  // "next" training would wait for a held-back reference at the next evaluation).
  std::string freeze_reference_max_load = "auto";
  int64_t static_modules = -1, static_epoch = -1;
  double freezeout_t0 = 0.5, autofreeze_percentile = 50;
  double adam_beta1 = 0.9, adam_beta2 = 0.999;
  // Translation (Transformers): shared SentencePiece vocabulary, tokens per side
  // (longer training pairs are dropped), and batching by a token budget when > 0.
  int64_t vocab_size = 8000, max_len = 128, max_tokens = 0;
};

// Note [Model-dependent defaults]
// TrainConfig's initialisers are the image models' defaults (SGD, lr 0.1, ...). A
// Transformer trains with other ones (AdamW with betas 0.9/0.98, lr 5e-4, inverse
// square root schedule with warmup, no weight decay, 64 sentences, dataset en-es).
// apply_model_defaults(c, given) sets those for c.model, leaving alone the fields whose
// flags are in `given` ("--lr", "--optimizer", ...: what the user set explicitly); for
// image models it changes nothing. The CLI calls it with the flags it parsed; library
// users call default_config(model) and then set what they want.
void apply_model_defaults(TrainConfig& c, const std::set<std::string>& given = {});
TrainConfig default_config(const std::string& model);

struct Summary {
  double final_test_accuracy = 0, best_test_accuracy = 0, final_test_loss = 0, train_seconds = 0,
         images_per_second = 0, time_to_target_seconds = -1;
  double final_test_bleu = 0, best_valid_bleu = 0, tokens_per_second = 0;  // translation
  int64_t steps = 0;
  bool completed = false;
  std::string freeze_report;  // one line on the freezing (train/freezing.h freeze_report); empty for none
};

// Validates the configuration (every problem named in the flag's terms), then trains.
// Throws eg::Error on bad input or a non-finite loss (after which the last good
// checkpoint is still in place).
Summary run_training(const TrainConfig& c);
void validate(const TrainConfig& c);

// Evaluates a checkpoint directory's model on its dataset's test split.
struct EvalResult {
  double accuracy = 0, loss = 0;
  int64_t samples = 0;
  bool translation = false;  // then `bleu` is set and `accuracy` is not
  double bleu = 0;
};
// precision "int8" evaluates the int8 reference model built from the checkpoint
// (quant/: what Egeria measures plasticity against), "fp32" the model itself.
// int8's convolution inputs are calibrated on the first `calibration_batches` test
// batches (0: each batch its own scales).
EvalResult evaluate_checkpoint(const std::string& out_dir, const std::string& data_dir, int64_t test_limit,
                               const std::string& precision = "fp32",
                               int64_t calibration_batches = 3);  // quant::kCalibrationBatches

// One training step's throughput (median over iterations after warm-up).
struct StepBench {
  double samples_per_second = 0, median_step_ms = 0;
  int iterations = 0;
};
StepBench bench_step(const std::string& model, int64_t batch_size, const std::string& device, int iterations, int threads);

// Shared by the image loop and the translation loop; not part of the API.
namespace detail {
void make_dirs(const std::string& dir);
std::unique_ptr<optim::LrSchedule> make_schedule(const TrainConfig& c, int64_t steps_per_epoch);
std::string human_time(double seconds);
// One step's progress: on a terminal, a bar with the epoch's mean loss, rate and ETA
// (redrawn in place); otherwise a plain line every `log_every` steps.
struct Progress {
  int64_t epoch = 0, epochs = 0, done = 0, total = 0, step = 0;  // epoch 0-based; done of total batches
  double mean_loss = 0, loss = 0, lr = 0, rate = 0, eta_seconds = 0;
  const char* unit = "img/s";
};
void print_progress(const Progress& p, bool tty, int64_t log_every);
std::string config_json_text(const TrainConfig& c);  // the configuration as a JSON object
bool file_exists(const std::string& path);
// Appends one JSON line (metrics.jsonl, freeze.jsonl); throws naming the file when it
// cannot (disk full).
void append_json_line(const std::string& path, const std::string& line);
}  // namespace detail

}  // namespace eg::train
