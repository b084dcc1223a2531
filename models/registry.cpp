// Model names -> builders.
#include <functional>
#include <map>

#include "autograd/node.h"

#include "models/mobilenet_v2.h"
#include "models/resnet.h"
#include "models/transformer.h"

namespace eg::models {

namespace {
using Builder = std::function<ModelPtr(const ModelConfig&, Generator&)>;
const std::map<std::string, Builder>& builders() {
  static const std::map<std::string, Builder> b = [] {
    std::map<std::string, Builder> m;
    for (int d : {20, 32, 44, 56, 110})
      m["resnet" + std::to_string(d)] = [d](const ModelConfig& c, Generator& g) {
        return ResNet::cifar(d, c.num_classes, c.in_channels, g);
      };
    for (int d : {18, 50})
      m["resnet" + std::to_string(d)] = [d](const ModelConfig& c, Generator& g) {
        return ResNet::imagenet(d, c.num_classes, c.in_channels, c.image_size, c.small_input, g);
      };
    m["mobilenetv2"] = [](const ModelConfig& c, Generator& g) {
      return std::make_shared<MobileNetV2>(c.num_classes, c.in_channels, c.image_size, c.width, c.small_input, g);
    };
    for (const char* n : {"transformer-base", "transformer-tiny"})
      m[n] = [n](const ModelConfig& c, Generator& g) {
        return std::make_shared<Transformer>(transformer_preset(n, c.vocab), g);
      };
    return m;
  }();
  return b;
}
}  // namespace

Tensor Model::layer_output(const Tensor& x, const Tensor&, int64_t layer) { return layers_output(x, 0, layer); }

Tensor Model::layers_output(const Tensor& h, int64_t begin, int64_t last) {
  EG_CHECK(sequential(), type_name(), ": layer_output needs a sequence of layer modules");
  auto units = layer_modules();
  EG_CHECK(last >= 0 && last < int64_t(units.size()), type_name(), ": no layer module ", last, " (it has ",
           units.size(), ")");
  EG_CHECK(begin >= 0 && begin <= last, type_name(), ": layer modules ", begin, "..", last, " are no range");
  autograd::NoGradGuard ng;
  Tensor y = h;
  for (int64_t i = begin; i <= last; ++i) y = units[size_t(i)].second->forward(y);
  return y;
}

std::vector<std::string> model_names() {
  std::vector<std::string> v;
  for (auto& [n, b] : builders()) v.push_back(n);
  return v;
}

ModelPtr build_model(const ModelConfig& c, Generator& g) {
  auto it = builders().find(c.name);
  if (it == builders().end()) {
    std::string known;
    for (auto& n : model_names()) known += (known.empty() ? "" : ", ") + n;
    EG_THROW("unknown model '", c.name, "' (known: ", known, ")");
  }
  EG_CHECK(c.num_classes > 0 && c.in_channels > 0 && c.image_size > 0, "model '", c.name,
           "': classes, channels and image size must be positive");
  return it->second(c, g);
}

}  // namespace eg::models
