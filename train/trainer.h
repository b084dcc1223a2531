// The training loop behind `egeria train`, usable from C++ as well: data, model,
// optimizer and schedule from a TrainConfig; progress on the terminal; metrics,
// summary and atomic, resumable checkpoints in the output directory.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace eg::train {

struct TrainConfig {
  std::string model = "resnet20", dataset = "fashion-mnist", data_dir, out = "runs/latest";
  int64_t epochs = 15, batch_size = 128;
  double lr = 0.1, momentum = 0.9, weight_decay = 5e-4, gamma = 0.1;
  std::string optimizer = "sgd", lr_schedule = "step";
  bool nesterov = false;
  std::vector<int64_t> milestones;  // epochs; default: 50% and 75% of the run
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
  int workers = 1;
  int64_t stop_after_steps = 0;  // testing: end this invocation after N steps (as if killed)
  std::string freeze = "none";
};

struct Summary {
  double final_test_accuracy = 0, best_test_accuracy = 0, final_test_loss = 0, train_seconds = 0,
         images_per_second = 0, time_to_target_seconds = -1;
  int64_t steps = 0;
  bool completed = false;
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
};
EvalResult evaluate_checkpoint(const std::string& out_dir, const std::string& data_dir, int64_t test_limit);

// One training step's throughput (median over iterations after warm-up).
struct StepBench {
  double samples_per_second = 0, median_step_ms = 0;
  int iterations = 0;
};
StepBench bench_step(const std::string& model, int64_t batch_size, const std::string& device, int iterations, int threads);

}  // namespace eg::train
