#include "train/init_from.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "models/torchvision.h"
#include "train/checkpoint.h"
#include "train/safetensors.h"

namespace eg::train {

namespace {

bool under(const std::string& name, const std::string& path) {
  return name == path ||
         (name.size() > path.size() && name.compare(0, path.size(), path) == 0 && name[path.size()] == '.');
}

std::string join(const std::vector<std::string>& v) {
  std::string t;
  for (size_t i = 0; i < v.size(); ++i) t += (i ? ", " : "") + v[i];
  return t;
}

// The file's model tensors: all of a weights file's, a checkpoint's "model/" ones.
TensorMap model_tensors_of(TensorMap file) {
  const bool checkpoint =
      std::any_of(file.begin(), file.end(), [](auto& kv) { return kv.first.rfind("model/", 0) == 0; });
  return checkpoint ? model_tensors(file) : file;
}

// The sample shape a run recorded beside its weights (sample_shape in model.safetensors).
Shape recorded_sample_shape(const Metadata& meta) {
  auto it = meta.find("sample_shape");
  if (it == meta.end()) return {};
  try {
    return nlohmann::json::parse(it->second).get<Shape>();
  } catch (const nlohmann::json::exception&) {
    return {};  // not egeria's record (another program's metadata): nothing to compare
  }
}

std::string image_shape_text(const Shape& s) {
  if (s.size() != 3) return shape_str(s);
  return std::to_string(s[0]) + "-channel " + std::to_string(s[1]) + "x" + std::to_string(s[2]) + " images";
}

}  // namespace

InitFromReport init_from(models::Model& m, const std::string& path, const InitFromOptions& o) {
  Metadata meta;
  TensorMap file = model_tensors_of(load_safetensors(path, &meta));
  InitFromReport r;
  std::map<std::string, std::string> theirs;  // egeria's name -> the file's, where they differ
  if (models::has_torchvision_names(m, file)) {
    const models::TorchvisionNames tv = m.torchvision();
    EG_CHECK(tv.differs.empty(), "--init-from '", path, "' holds torchvision's ", tv.model,
             " weights, for ImageNet-sized images; this ", m.type_name(), " is ", tv.differs,
             ". Fine-tuning them needs images of more than 64 pixels (--image-size resizes an image folder's)");
    r.names = "torchvision's " + tv.model;
    theirs = models::torchvision_names(m);
    file = models::from_torchvision(m, file);
  }
  const Shape recorded = recorded_sample_shape(meta);
  EG_CHECK(recorded.empty() || o.sample_shape.empty() || recorded == o.sample_shape, "--init-from '", path,
           "' was trained on ", image_shape_text(recorded), "; this data has ", image_shape_text(o.sample_shape),
           ": fine-tuning needs the pretrained model's image shape and channels");

  const TensorMap own = m.state_dict();
  auto file_name = [&](const std::string& k) { return theirs.count(k) ? theirs.at(k) : k; };
  std::vector<bool> used(o.exclude.size(), false);
  auto excluded = [&](const std::string& k) {
    bool any = false;
    for (size_t i = 0; i < o.exclude.size(); ++i)
      if (under(k, o.exclude[i]) || under(file_name(k), o.exclude[i])) used[i] = any = true;
    return any;
  };
  const auto units = m.layer_modules();
  const std::string head = units.empty() ? std::string() : units.back().first;
  std::vector<std::string> wrong;  // other shapes outside the head: not a fine-tuning of this model
  bool channels = false;
  TensorMap take;
  for (auto& [k, t] : own) {
    if (excluded(k)) {
      r.excluded.push_back(k);
      continue;
    }
    auto it = file.find(k);
    if (it == file.end()) {
      r.missing.push_back(k);
      continue;
    }
    const Shape& fs = it->second.shape();
    if (fs == t.shape()) {
      take[k] = it->second;
      continue;
    }
    const std::string line = file_name(k) + " " + shape_str(fs) + " vs " + shape_str(t.shape());
    if (!head.empty() && under(k, head)) r.mismatched.push_back(line);
    else wrong.push_back(line);
    // A first convolution's weight [out, in, kh, kw] whose input channels alone differ.
    channels |= !units.empty() && under(k, units.front().first) && fs.size() == 4 && t.shape().size() == 4 &&
                fs[1] != t.shape()[1] && fs[0] == t.shape()[0];
  }
  for (size_t i = 0; i < o.exclude.size(); ++i) {
    std::string modules;
    for (auto& [n, u] : units) modules += (modules.empty() ? "" : ", ") + n;
    EG_CHECK(used[i], "--init-exclude '", o.exclude[i], "' names no tensor of this model (a tensor's name or a ",
             "module's path, such as one of its layer modules: ", modules, ")");
  }
  for (auto& [k, t] : file)
    if (!own.count(k)) r.unexpected.push_back(k);
  EG_CHECK(!channels, "--init-from '", path, "' takes images of other channels than this data's (", join(wrong),
           "): fine-tuning needs the pretrained model's image channels (--image-channels for an image folder)");
  EG_CHECK(wrong.empty(), "--init-from '", path, "': ", wrong.size(),
           " tensors of this model have other shapes in the file, outside its head (", head, "): ", join(wrong),
           ". It is the weights of another architecture or configuration; --init-exclude NAMES leaves named "
           "tensors at their initialisation");
  EG_CHECK(!take.empty(), "--init-from '", path, "': none of its ", file.size(), " tensors fits this model (",
           r.text(path), ")");
  m.load_state_dict(take, false);
  r.loaded = int64_t(take.size());
  return r;
}

std::string InitFromReport::text(const std::string& path) const {
  std::string t = "--init-from " + path + ": " + std::to_string(loaded) + " tensors loaded";
  if (names != "egeria") t += " (in " + names + " names)";
  if (!excluded.empty()) t += "; excluded, left as initialised: " + join(excluded);
  if (!missing.empty()) t += "; missing from the file, left as initialised: " + join(missing);
  if (!mismatched.empty()) t += "; other shapes, left as initialised: " + join(mismatched);
  if (!unexpected.empty()) t += "; not in the model, ignored: " + join(unexpected);
  return t;
}

}  // namespace eg::train
