// A built-in model: a Module that exposes its ordered "layer modules" — the units
// freezing acts on (stem, residual / inverted-residual blocks, encoder and decoder
// layers, head) — and its forward FLOPs per sample.
#pragma once
#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "layers/module.h"

namespace eg::models {

// What a forward keeps besides its output (Note [The frozen-prefix forward]): the
// detached output of layer module `layer` (Egeria's reading of a unit that ends there)
// and of `input_layer` (the input of that unit, --freeze-reference-scope unit); -1: none;
// and of the layer modules in `more` (the units read ahead of the front).
struct Capture {
  int64_t layer = -1, input_layer = -1;
  Tensor output, input;
  // More layer modules whose outputs are kept (egeria's readings ahead of the front).
  std::vector<int64_t> more;
  std::map<int64_t, Tensor> more_output;
  bool any() const { return layer >= 0 || input_layer >= 0 || !more.empty(); }
  bool wants(int64_t i) const {
    return i == layer || i == input_layer || std::find(more.begin(), more.end(), i) != more.end();
  }
  // Keeps h when it is the output of layer module i.
  void keep(int64_t i, const Tensor& h) {
    if (i == layer) output = h.detach();
    if (i == input_layer) input = h.detach();
    if (std::find(more.begin(), more.end(), i) != more.end()) more_output[i] = h.detach();
  }
};

// Note [torchvision names]
// A built-in model that torchvision also has (resnet18/34/50/101, mobilenet_v2) says how
// its module paths read there: pairs of (egeria's path, torchvision's path), e.g.
// ("stem.conv", "conv1"), so that "stem.conv.weight" is torchvision's "conv1.weight"; a
// tensor takes the pair of its longest matching path. Tensor layouts are PyTorch's
// already (OIHW convolutions, [out, in] linears). The table is the model's own, in its
// file, beside the code that names the modules, so the two change together.
struct TorchvisionNames {
  std::string model;  // torchvision's builder ("resnet50", "mobilenet_v2"); empty: none
  // Empty when the network computes what torchvision's does; else how it differs (the
  // 32x32 variants' stems), so that an export, which would compute something else
  // there, is refused with the reason.
  std::string differs;
  std::vector<std::pair<std::string, std::string>> modules;
  bool any() const { return !model.empty(); }
};

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
  // Note [The frozen-prefix forward]
  // One forward serves training with a frozen front, the activation cache on either side
  // of the prefix's boundary and Egeria's readings. Ranges of layer modules are half-open,
  // [begin, end), everywhere; modules below `frozen` run under no-grad (no Node, no saved
  // activation), so a frozen prefix costs its forward only.
  //
  // The whole model with layer modules [0, frozen) under no-grad, filling `capture`
  // (when given). x is the input (a Transformer's source token ids, whose target input
  // ids are x2; x2 is unused by vision models). The default runs the layer modules of a
  // sequential model; a model that is not sequential overrides it.
  virtual Tensor forward_frozen(const Tensor& x, const Tensor& x2, int64_t frozen, Capture* capture = nullptr);
  // Layer modules [begin, end) of a sequential model given h, the input of module `begin`
  // (end -1: through the last), those below `frozen` under no-grad, filling `capture`.
  Tensor forward_layers(const Tensor& h, int64_t begin, int64_t end, int64_t frozen, Capture* capture = nullptr);
  // The output of layer module `layer` for one batch, without recording gradients: what
  // Egeria's reference model compares. The default runs layer modules [0, layer] of a
  // sequential model.
  virtual Tensor layer_output(const Tensor& x, const Tensor& x2, int64_t layer);
  // The same network in torchvision's state-dict names (models/torchvision.h); a model
  // with no torchvision counterpart returns an empty one.
  virtual TorchvisionNames torchvision() const { return {}; }
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
// the known names. `g` initialises the weights, and the built-in models' dropout layers
// (MobileNetV2's head, the Transformers') draw their masks from it (nn::Dropout keeps a
// pointer to it): it must outlive any training of the model (a training forward after
// it is gone is an error).
ModelPtr build_model(const ModelConfig& c, Generator& g);
std::vector<std::string> model_names();  // sorted
// Whether `name` is one of egeria's own models rather than one a program registered.
bool is_builtin_model(const std::string& name);
// Whether `name` trains on sentence pairs (the built-in Transformers); every other model,
// a user's registered ones included, classifies images.
bool is_translation_model(const std::string& name);

// A model's builder: a new model for the configuration (its classes, input channels and
// size come from the data), initialised from `g`. Egeria builds its reference model
// through it too, then loads a snapshot of the training weights, so it must build the
// same architecture whenever it is called with the same configuration. It is kept for the
// life of the process and called again on the reference's thread: capture by value.
// train::fit refuses an image model whose Dropout (p > 0) draws from another generator.
using ModelBuilder = std::function<ModelPtr(const ModelConfig&, Generator&)>;
// Makes a user's model known by `name` to build_model, and so to train::fit, the
// freezing policies and `--model` of a CLI built with it. A built-in name is refused;
// registering a name again replaces its builder.
void register_model(const std::string& name, ModelBuilder builder);

}  // namespace eg::models
