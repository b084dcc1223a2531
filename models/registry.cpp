// Model names -> builders.
#include <algorithm>
#include <functional>
#include <map>
#include <mutex>
#include <set>

#include "autograd/node.h"

#include "models/mobilenet_v2.h"
#include "models/resnet.h"
#include "models/transformer.h"

namespace eg::models {

namespace {
// The built-in models' builders, and which of them translate (the Transformers).
struct Builtins {
  std::map<std::string, ModelBuilder> builders;
  std::set<std::string> translation;
};
const Builtins& builtin_models() {
  static const Builtins b = [] {
    Builtins r;
    auto& m = r.builders;
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
    for (const char* n : {"transformer-base", "transformer-small", "transformer-tiny"}) {
      m[n] = [n](const ModelConfig& c, Generator& g) {
        return std::make_shared<Transformer>(transformer_preset(n, c.vocab), g);
      };
      r.translation.insert(n);
    }
    return r;
  }();
  return b;
}
const std::map<std::string, ModelBuilder>& builtins() { return builtin_models().builders; }

// A user's models (register_model), beside the built-in ones; guarded because loader
// workers and the reference's thread build models while a program may still register.
struct UserModels {
  std::mutex mu;
  std::map<std::string, ModelBuilder> builders;
};
UserModels& user_models() {
  static UserModels u;
  return u;
}

ModelBuilder find_builder(const std::string& name) {
  if (auto it = builtins().find(name); it != builtins().end()) return it->second;
  UserModels& u = user_models();
  std::lock_guard<std::mutex> lock(u.mu);
  auto it = u.builders.find(name);
  return it == u.builders.end() ? ModelBuilder() : it->second;
}
}  // namespace

bool is_builtin_model(const std::string& name) { return builtins().count(name) > 0; }
bool is_translation_model(const std::string& name) { return builtin_models().translation.count(name) > 0; }

void register_model(const std::string& name, ModelBuilder builder) {
  EG_CHECK(!name.empty(), "register_model: a model needs a name");
  EG_CHECK(name.find_first_of(" \t\n,") == std::string::npos, "register_model: '", name,
           "' holds a space or comma; model names are one word (they are --model values)");
  EG_CHECK(builder, "register_model: '", name, "' has no builder");
  EG_CHECK(!builtins().count(name), "register_model: '", name, "' is a built-in model's name; choose another");
  UserModels& u = user_models();
  std::lock_guard<std::mutex> lock(u.mu);
  u.builders[name] = std::move(builder);  // registering again replaces, as re-running a cell would
}

Tensor Model::forward_frozen(const Tensor& x, const Tensor&, int64_t frozen, Capture* capture) {
  if (frozen <= 0 && !(capture && capture->any())) return forward(x);
  return forward_layers(x, 0, -1, frozen, capture);
}

Tensor Model::forward_layers(const Tensor& h0, int64_t begin, int64_t end, int64_t frozen, Capture* capture) {
  EG_CHECK(sequential(), type_name(), " is not a sequence of layer modules; it cannot run a range of them");
  auto units = layer_modules();
  if (end < 0) end = int64_t(units.size());
  EG_CHECK(begin >= 0 && begin <= end && end <= int64_t(units.size()), type_name(), ": layer modules [", begin, ", ",
           end, ") of ", units.size());
  Tensor h = h0;
  for (int64_t i = begin; i < end; ++i) {
    if (i < frozen) {
      autograd::NoGradGuard ng;  // no Node, no saved activation
      h = units[size_t(i)].second->forward(h);
    } else {
      h = units[size_t(i)].second->forward(h);
    }
    if (capture) capture->keep(i, h);
  }
  return h;
}

Tensor Model::layer_output(const Tensor& x, const Tensor&, int64_t layer) {
  const int64_t n = int64_t(layer_modules().size());
  EG_CHECK(layer >= 0 && layer < n, type_name(), ": no layer module ", layer, " (it has ", n, ")");
  autograd::NoGradGuard ng;
  return forward_layers(x, 0, layer + 1, layer + 1);
}

std::vector<std::string> model_names() {
  std::vector<std::string> v;
  for (auto& [n, b] : builtins()) v.push_back(n);
  UserModels& u = user_models();
  std::lock_guard<std::mutex> lock(u.mu);
  for (auto& [n, b] : u.builders) v.push_back(n);
  std::sort(v.begin(), v.end());
  return v;
}

ModelPtr build_model(const ModelConfig& c, Generator& g) {
  const ModelBuilder builder = find_builder(c.name);
  if (!builder) {
    std::string known;
    for (auto& n : model_names()) known += (known.empty() ? "" : ", ") + n;
    EG_THROW("unknown model '", c.name, "' (known: ", known, ")");
  }
  EG_CHECK(c.num_classes > 0 && c.in_channels > 0 && c.image_size > 0, "model '", c.name,
           "': classes, channels and image size must be positive");
  ModelPtr m = builder(c, g);
  EG_CHECK(m, "model '", c.name, "': its builder returned no model");
  EG_CHECK(!m->layer_modules().empty(), "model '", c.name,
           "' names no layer modules: freezing acts on them, front to back (Model::layer_modules)");
  return m;
}

}  // namespace eg::models
