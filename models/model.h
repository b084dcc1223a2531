// A built-in model: a Module that exposes its ordered "layer modules" — the units
// freezing acts on (stem, residual / inverted-residual blocks, encoder and decoder
// layers, head) — and its forward FLOPs per sample.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "layers/module.h"

namespace eg::models {

class Model : public nn::Module {
 public:
  // Front to back. Freezing a prefix of this list freezes the front of the network.
  virtual std::vector<std::pair<std::string, nn::ModulePtr>> layer_modules() const = 0;
  // Multiply-adds count 2; convolutions and matmuls only (norms and activations are
  // a few percent and omitted, as in the papers' tables). 0: not known (a user's model
  // may leave it), and freezing reports then weigh the units by their parameters.
  virtual double flops_per_sample() const { return 0; }
  // True when forward(x) is the composition of the layer modules' forwards, front to
  // back (vision models). Freezing policies and the reference model rely on it.
  virtual bool sequential() const { return true; }
  // Forward FLOPs per sample of each layer module (same order), when known.
  virtual std::vector<double> module_flops() const { return {}; }
  // The output of layer module `layer` for one batch, without recording gradients:
  // what Egeria's reference model compares. x is the input (token ids of the source
  // for a Transformer, whose target input ids are x2; x2 is unused by vision models).
  // The default runs the layer modules 0..layer of a sequential model.
  virtual Tensor layer_output(const Tensor& x, const Tensor& x2, int64_t layer);
  // The output of layer module `last` given h, the input of layer module `begin`
  // (<= last), without recording gradients: layer modules begin..last of a sequential
  // model. What a reference that evaluates one freezing unit runs
  // (--freeze-reference-scope unit).
  Tensor layers_output(const Tensor& h, int64_t begin, int64_t last);
};

using ModelPtr = std::shared_ptr<Model>;

struct ModelConfig {
  std::string name;  // "resnet56", "resnet50", "mobilenetv2", "transformer-tiny", ...
  int64_t num_classes = 10;  // vision
  int64_t in_channels = 3;
  int64_t image_size = 32;  // vision input H = W
  bool small_input = true;  // ImageNet-style nets: 3x3 stride-1 stem, no max pool
  double width = 1.0;  // MobileNetV2 width multiplier
  int64_t vocab = 8000;  // Transformers: shared source/target vocabulary
};

// Builds a model by name (a built-in one or a registered one); throws eg::Error listing
// the known names.
ModelPtr build_model(const ModelConfig& c, Generator& g);
std::vector<std::string> model_names();  // sorted

// A model's builder: a new model for the configuration (its classes, input channels and
// size come from the data), initialised from `g`. Egeria builds its reference model
// through it too, then loads a snapshot of the training weights, so it must build the
// same architecture whenever it is called with the same configuration.
using ModelBuilder = std::function<ModelPtr(const ModelConfig&, Generator&)>;
// Makes a user's model known by `name` to build_model, and so to train::fit, the
// freezing policies and `--model` of a CLI built with it. A built-in name is refused;
// registering a name again replaces its builder.
void register_model(const std::string& name, ModelBuilder builder);

}  // namespace eg::models
