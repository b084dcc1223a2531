// The reference model of Egeria (§4.1): a frozen copy of a snapshot of the training
// model that runs on CPU threads beside training and returns activations at layer-
// module boundaries, against which plasticity is measured.
//
// Precisions: "int8" (batch norm folded into the convolutions, s8 weights per output
// channel, u8/s8 activations with static scales calibrated on the first batches, oneDNN
// int8 convolutions and dynamically quantised linear layers; quant/int8.h), "fp32" (the snapshot as it is,
// on the CPU), and "fp32-gpu": the snapshot on the training GPU, for machines whose CPU
// cores are busy (data loading) or few. The GPU reference is evaluated on the training
// thread, in the training stream (freeze/controller.h), so it needs no second set of
// CUDA handles; its cost is one forward of the front modules every n steps.
// "fp16-gpu" is the same with batch norm folded and the convolutions and linear layers
// in f16 on tensor cores (f32 accumulation; the rest f32, as torch.autocast), the
// paper's GPU fallback.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "models/model.h"
#include "quant/int8.h"

namespace eg::quant {

// The int8 reference's calibration (Note [Static activation scales]): each
// convolution's observed input range, by the convolution's module name.
using Calibration = std::map<std::string, ActRange>;
// Convolution inputs are calibrated on this many batches by default.
constexpr int64_t kCalibrationBatches = 3;

class ReferenceModel {
 public:
  virtual ~ReferenceModel() = default;
  // Output of layer module `module` (0-based, in layer_modules() order) for input x
  // (CPU: f32 images [b, ...], or a Transformer's source ids with its target input ids
  // in x2), as models::Model::layer_output. Thread-compatible: one caller at a time.
  virtual Tensor activation(const Tensor& x, int64_t module, const Tensor& x2 = Tensor()) = 0;
  // Output of layer module `module` given h, the input of layer module `begin` (<=
  // module; any device): only layer modules begin..module run. Sequential models only.
  virtual Tensor activation_from(const Tensor& h, int64_t begin, int64_t module) = 0;
  virtual std::string precision() const = 0;
  // The int8 reference's calibration so far (empty for the other precisions), and its
  // restoration into a reference built from the same snapshot (a resumed run).
  virtual Calibration calibration() const { return {}; }
  virtual void set_calibration(const Calibration&) {}
};

// Note [The reference's batch norm]
// The paper's int8 reference folds each batch norm into its convolution with the
// snapshot's running statistics (the inference form), while the training model's front,
// in training mode, normalises each batch with that batch's own statistics. A reading
// then measures, beside the weights' change since the snapshot, the gap between the
// snapshot's running statistics (an average over its last few dozen batches) and this
// batch's. With ReferenceBn::batch the reference's batch norms normalise each batch
// with its own statistics, as the training front does, and the reading is the change
// of the weights alone: right after a refresh it is the quantisation error (0 in
// fp32), and it grows with the distance the front moves since, the sawtooth Note
// [Egeria's freezing decisions] in freeze/tracker.h assumes. Such batch norms are not
// folded: the int8 reference then runs its convolutions in int8 and their batch norms
// (with the activation they carry) in f32, one pass more for each. running stays the
// default: measured, batch froze less at the same accuracy and cost more
// (docs/results/2026-12-02-reference-batch-norm.md).
enum class ReferenceBn { running, batch };

// Builds a reference of `precision` from a snapshot of a model's state (copied: the
// caller may keep training). `make_model` builds an untrained model of the same
// architecture (the overload with a ModelConfig uses models::build_model).
// Folds every BatchNorm2d that a module registers right after a Conv2d (the order in
// which the built-in models also run them) into that convolution's weight and bias,
// using the running statistics; the BatchNorm then passes its input through. One that
// normalises with each batch's statistics (eval_batch_stats) is left as it is. For
// inference copies only: puts the module in eval mode. Returns the number of pairs folded.
int64_t fold_batchnorm(nn::Module& m);

// Turns an inference copy of a model into its int8 version in place: eval mode, batch
// norm folded (a folded batch norm's fused activation moves into its convolution's
// epilogue), every Conv2d run by ConvInt8 with its input scale calibrated on its
// first `calibration_batches` inputs (0: every input's own; Note [Static activation
// scales]), and every Linear by LinearInt8. Returns the number of layers converted.
// With `observers`, each convolution's ActObserver is recorded under its module name.
int64_t convert_to_int8(nn::Module& m, int64_t calibration_batches = kCalibrationBatches,
                        std::map<std::string, std::shared_ptr<ActObserver>>* observers = nullptr);

// Turns an inference copy of a model into its fp16 GPU version in place: eval mode, batch
// norm folded, every Conv2d and Linear run in f16 on `gpu` (weights converted once,
// inputs cast per call; convolutions return f32, linear layers add an f32 bias to
// their f32 output). The model's other layers must already be on `gpu`. Returns the
// number of layers converted.
int64_t convert_to_fp16(nn::Module& m, Device gpu);

using ModelFactory = std::function<models::ModelPtr()>;
// `gpu`: the CUDA device of the "-gpu" precisions (ignored by the CPU ones);
// `calibration_batches`: int8's, as convert_to_int8; `bn`: Note [The reference's batch norm].
std::unique_ptr<ReferenceModel> make_reference(const std::string& precision, const ModelFactory& make_model,
                                               const std::map<std::string, Tensor>& snapshot,
                                               Device gpu = Device::cuda(0),
                                               int64_t calibration_batches = kCalibrationBatches,
                                               ReferenceBn bn = ReferenceBn::running);
// The precisions make_reference knows; "-gpu" ones run on the GPU.
std::vector<std::string> reference_precisions();
inline bool reference_on_gpu(const std::string& precision) {
  return precision.size() > 4 && precision.compare(precision.size() - 4, 4, "-gpu") == 0;
}
std::unique_ptr<ReferenceModel> make_reference(const std::string& precision, const models::ModelConfig& mc,
                                               const std::map<std::string, Tensor>& snapshot);
// models::build_model(mc) with a fixed seed (the weights are replaced by a snapshot).
ModelFactory model_factory(const models::ModelConfig& mc);

}  // namespace eg::quant
