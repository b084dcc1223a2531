#include "layers/module.h"

namespace eg::nn {

Tensor Module::forward(const Tensor&) { EG_THROW(type_name(), " has no single-input forward"); }

Tensor& Module::register_parameter(const std::string& name, Tensor t) {
  if (is_floating(t.dtype())) t.set_requires_grad(true);
  params_.emplace_back(name, t);
  return params_.back().second;
}

void Module::check_registered(const Tensor& field, const char* name) const {
  for (auto& [n, t] : params_)
    if (n == name) {
      EG_CHECK(field.is_same(t), type_name(), ": its ", name, " was replaced by another tensor, which the ",
               "optimizer, state dicts and device moves do not see; write into it in place (copy_, zero_) or use ",
               "load_state_dict");
      return;
    }
}

Tensor& Module::register_buffer(const std::string& name, Tensor t) {
  buffers_.emplace_back(name, t);
  return buffers_.back().second;
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> r = params_;
  if (recurse)
    for (auto& [cn, c] : children_)
      for (auto& [n, t] : c->named_parameters(true)) r.emplace_back(cn + "." + n, t);
  return r;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> r = buffers_;
  if (recurse)
    for (auto& [cn, c] : children_)
      for (auto& [n, t] : c->named_buffers(true)) r.emplace_back(cn + "." + n, t);
  return r;
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> r;
  for (auto& [n, t] : named_parameters(recurse)) r.push_back(t);
  return r;
}

std::vector<std::pair<std::string, Module*>> Module::named_modules(const std::string& prefix) {
  std::vector<std::pair<std::string, Module*>> r{{prefix, this}};
  for (auto& [cn, c] : children_)
    for (auto& m : c->named_modules(prefix.empty() ? cn : prefix + "." + cn)) r.push_back(m);
  return r;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (auto& t : parameters()) n += t.numel();
  return n;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, c] : children_) c->train(on);
}

void Module::to(Device d) {
  auto move = [d](Tensor& t) {
    if (t.device() == d) return;
    Tensor m = t.to(d);
    t.impl().storage = m.impl().storage;
    t.impl().offset = m.impl().offset;
    t.impl().grad = nullptr;
  };
  for (auto& [n, t] : params_) move(t);
  for (auto& [n, t] : buffers_) move(t);
  for (auto& [n, c] : children_) c->to(d);
}

Device Module::device() const {
  auto ps = parameters();
  return ps.empty() ? Device::cpu() : ps[0].device();
}

std::map<std::string, Tensor> Module::state_dict() const {
  std::map<std::string, Tensor> sd;
  for (auto& [n, t] : named_parameters()) sd[n] = t;
  for (auto& [n, t] : named_buffers()) sd[n] = t;
  return sd;
}

void Module::load_state_dict(const std::map<std::string, Tensor>& sd, bool strict) {
  auto own = state_dict();
  if (strict)
    for (auto& [n, t] : sd)
      EG_CHECK(own.count(n), "load_state_dict: unexpected key '", n, "' (not in this ", type_name(), ")");
  for (auto& [n, t] : own) {
    auto it = sd.find(n);
    if (it == sd.end()) {
      EG_CHECK(!strict, "load_state_dict: missing key '", n, "'");
      continue;
    }
    EG_CHECK(it->second.shape() == t.shape(), "load_state_dict: '", n, "' has shape ", shape_str(it->second.shape()),
             " but this model expects ", shape_str(t.shape()));
    Tensor src = it->second.dtype() == t.dtype() ? it->second : it->second.to(t.dtype());
    Tensor dst = t;
    dst.copy_(src);
  }
}

void Module::freeze() {
  frozen_ = true;
  for (auto& [n, t] : params_) t.set_requires_grad(false);
  on_freeze_changed();
  for (auto& [n, c] : children_) c->freeze();
}

void Module::unfreeze() {
  frozen_ = false;
  for (auto& [n, t] : params_) t.set_requires_grad(true);
  on_freeze_changed();
  for (auto& [n, c] : children_) c->unfreeze();
}

void Module::zero_grad() {
  for (auto& t : parameters())
    if (t.grad().defined()) t.grad().zero_();
}

Sequential::Sequential(std::vector<ModulePtr> mods) {
  for (auto& m : mods) add(m);
}

ModulePtr Sequential::add(ModulePtr m) { return add(std::to_string(children().size()), std::move(m)); }
ModulePtr Sequential::add(const std::string& name, ModulePtr m) { return register_module(name, std::move(m)); }

Tensor Sequential::forward(const Tensor& x) {
  Tensor h = x;
  for (auto& [n, c] : children()) h = c->forward(h);
  return h;
}

}  // namespace eg::nn
