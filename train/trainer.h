// The training API behind `egeria train` and `egeria eval`: a run of a built-in model
// from a TrainConfig (train/config.h), through the one training loop (train/run.h) with
// the image or translation task; evaluation of a run's checkpoint; a step benchmark.
#pragma once
#include <cstdint>
#include <string>

#include "train/config.h"
#include "train/run.h"

namespace eg::models {
struct TransformerConfig;
}

namespace eg::train {

// Validates the configuration (every problem named in the flag's terms), then trains
// c.model with the task it needs. Throws eg::Error on bad input or a non-finite loss
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
StepBench bench_step(const std::string& model, int64_t batch_size, const std::string& device, int iterations,
                     int threads);

}  // namespace eg::train
