#include "models/torchvision.h"

namespace eg::models {

namespace {

const char kCounter[] = "num_batches_tracked";

bool ends_with(const std::string& s, const std::string& end) {
  return s.size() >= end.size() && s.compare(s.size() - end.size(), end.size(), end) == 0;
}

}  // namespace

std::map<std::string, std::string> torchvision_names(const Model& m) {
  const TorchvisionNames tv = m.torchvision();
  EG_CHECK(tv.any(), m.type_name(), " has no torchvision counterpart (torchvision's names are known for resnet18, ",
           "resnet50 and mobilenetv2)");
  std::map<std::string, std::string> names;
  for (auto& [k, t] : m.state_dict()) {
    size_t best = 0;
    for (auto& [ours, theirs] : tv.modules)
      if (ours.size() > best && k.size() > ours.size() && k.compare(0, ours.size(), ours) == 0 &&
          k[ours.size()] == '.') {
        best = ours.size();
        names[k] = theirs + k.substr(ours.size());
      }
    // The table is the model's own: a tensor outside it is a table left behind by its model.
    EG_CHECK(best > 0, m.type_name(), ": the torchvision table of '", tv.model, "' has no entry for '", k, "'");
  }
  return names;
}

TensorDict to_torchvision(const Model& m) {
  const TorchvisionNames tv = m.torchvision();
  const auto names = torchvision_names(m);
  EG_CHECK(tv.differs.empty(), "this ", m.type_name(), " is not torchvision's ", tv.model, ": it is ", tv.differs,
           "; its weights would compute something else there");
  TensorDict out;
  for (auto& [k, t] : m.state_dict()) {
    const std::string& name = names.at(k);
    out[name] = t;
    if (ends_with(name, ".running_mean"))
      out[name.substr(0, name.size() - std::string("running_mean").size()) + kCounter] = Tensor::zeros({}, DType::s64);
  }
  return out;
}

bool has_torchvision_names(const Model& m, const TensorDict& file) {
  if (!m.torchvision().any()) return false;
  const TensorDict own = m.state_dict();
  std::map<std::string, bool> theirs;
  for (auto& [ours, name] : torchvision_names(m)) theirs[name] = true;
  for (auto& [k, t] : file)
    if (!own.count(k) && theirs.count(k)) return true;
  return false;
}

TensorDict from_torchvision(const Model& m, const TensorDict& file) {
  std::map<std::string, std::string> ours;
  for (auto& [o, theirs] : torchvision_names(m)) ours[theirs] = o;
  TensorDict out;
  for (auto& [k, t] : file) {
    if (ends_with(k, std::string(".") + kCounter)) continue;
    auto it = ours.find(k);
    out[it == ours.end() ? k : it->second] = t;
  }
  return out;
}

}  // namespace eg::models
