// The training API behind `egeria train` and `egeria eval`: a run of a built-in model
// from a TrainConfig (train/config.h), through the one training loop (train/run.h) with
// the image or translation task; evaluation of a run's checkpoint; a step benchmark.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "train/config.h"
#include "train/image_task.h"
#include "train/run.h"

namespace eg::models {
struct TransformerConfig;
}

namespace eg::train {

// The task c.model trains with: translation for a Transformer (with the architecture
// `arch` when given, replacing the preset c.model names), image classification otherwise.
std::unique_ptr<Task> make_task(const TrainConfig& c, const models::TransformerConfig* arch = nullptr);
// Trains c.model with the task it needs (fit() validates the configuration first, every
// problem named in the flag's terms). Throws eg::Error on bad input or a non-finite loss
// (after which the last good checkpoint is still in place).
Summary run_training(const TrainConfig& c);
// A Transformer run whose architecture `arch`, when given, replaces the preset named
// by c.model (its vocabulary is set from the tokenizer): tests train small models this way.
Summary run_translation(const TrainConfig& c, const models::TransformerConfig* arch = nullptr);

// Evaluates a run directory's newest checkpoint on its dataset's test split.
struct EvalResult {
  double accuracy = 0, loss = 0;
  int64_t samples = 0;
  bool translation = false;  // then `bleu` is set and `accuracy` is not
  double bleu = 0;
  // Image models with `per_class`: each class's name (its folder, or its label) and counts.
  std::vector<std::string> classes;
  PerClass per_class;
};
// precision "int8" evaluates the int8 reference model built from the checkpoint
// (quant/: what Egeria measures plasticity against), "fp32" the model itself.
// int8's convolution inputs are calibrated on the first `calibration_batches` test
// batches (0: each batch its own scales).
EvalResult evaluate_checkpoint(const std::string& out_dir, const std::string& data_dir, int64_t test_limit,
                               const std::string& precision = "fp32",
                               int64_t calibration_batches = 3,  // quant::kCalibrationBatches
                               bool per_class = false);

// `egeria eval --init-from FILE`: weights without their run (torchvision's, or a
// model.safetensors), on a dataset's test split (an image folder's val/, its classes
// sorted as torchvision's ImageFolder sorts them); every tensor of the model must be in
// the file.
struct WeightsEval {
  std::string model, dataset = "fashion-mnist", data_dir;
  int64_t image_size = 0;  // image folders: the centre crop's side (0: 224)
  std::vector<int64_t> classes;  // IDX datasets: --classes
};
EvalResult evaluate_weights(const std::string& file, const WeightsEval& w, int64_t test_limit,
                            const std::string& precision = "fp32", int64_t calibration_batches = 3,
                            bool per_class = false);

// One training step's throughput (median over iterations after warm-up): forward,
// backward and the optimizer on random data of the model's input size. On several ranks
// (`comm`, under mpirun) it is the data-parallel step of train/run.cpp: the per-step
// agreement, gradient buckets all-reduced during backward (or after it, `overlap` false),
// with the first `frozen_units` freezing units frozen (out of backward and of the sync).
struct StepBenchOptions {
  std::string model = "resnet56", device = "cpu";
  int64_t batch_size = 128;  // per rank (sentences for a Transformer)
  int64_t seq_len = 32;  // Transformers: source and target tokens per sentence
  int iterations = 10, threads = 0;
  dist::GradSyncOptions sync;  // --grad-sync-overlap, --grad-sync-dtype
  int64_t frozen_units = 0;
  bool unit_per_layer = false;  // --freeze-modules layers: every layer module a unit (else the paper's)
  double bucket_cap_mb = 25;
  DType precision = DType::f32;  // the forward and loss under autograd::Autocast (--precision)
  bool cuda_graphs =
      false;  // --cuda-graphs on: the step captured after the warm-up, then replayed (Note [Graphed steps])
  bool profile = false;  // --profile: the timed steps' op times (CPU; Note [Op profiles] in kernels/ops.h)
};
struct StepBench {
  double samples_per_second = 0, median_step_ms = 0;  // samples (target tokens) of every rank
  std::vector<double> step_ms;  // each timed step's, in order: a slow start shows apart from a slow run
  int iterations = 0, world_size = 1;
  int64_t frozen_units = 0, frozen_parameters = 0, parameters = 0;
  int64_t sync_bytes_per_step = 0;  // all-reduced by each rank
  double median_sync_wait_ms = 0;  // after backward, waiting for the all-reduces
  double median_comm_ms = 0;  // inside the all-reduces; what exceeds the wait was hidden behind backward
  int64_t host_syncs_per_step = 0;  // the median step's, forward to optimizer (Note [Host syncs] in core/device.h)
  // The host's time to issue a step, before the benchmark waits for the device (a host
  // sync inside the step waits in it): on a GPU, a median near median_step_ms says the
  // kernels wait for their launches, well below it that the device is the limit. On the
  // CPU, where kernels run as they are issued, the whole step.
  double median_host_ms = 0;
  // What the timed steps took from and gave back to the system (cudaMalloc, cudaFree:
  // each may wait for the device) through the device's caching allocator: 0 when a step's
  // blocks all come from the cache (Note [Caching allocators] in core/caching_allocator.cpp).
  int64_t system_allocs = 0, system_frees = 0;
  int64_t graph_replays = 0;  // --cuda-graphs on: the timed steps that were replays (all of them)
  int64_t graph_bytes = 0;  // what the graph's allocations hold on the device
  // --profile: the timed steps' ops (rank 0's thread; the slowest first) and the layout
  // conversions made meanwhile, summed over all timed steps.
  std::vector<ops::OpTime> op_times;
  LayoutConversions conversions;
};
StepBench bench_step(const StepBenchOptions& o, dist::Communicator& comm);
// --profile's JSON: per step (the timed steps' mean), each op's calls and milliseconds and
// its share of the step; the ops' total, the rest of the step (the host's own), and the
// layout conversions (a share of those, Note [Op profiles]).
nlohmann::json step_profile_json(const StepBench& r);

}  // namespace eg::train
