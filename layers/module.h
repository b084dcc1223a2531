// Module: named parameters, buffers and children; train/eval; device moves; state
// dicts; and freezing as a first-class state.
//
// Note [Freezing a module]
// freeze() sets requires_grad=false on every parameter below the module and marks it
// and its children frozen. A frozen BatchNorm normalises with its running statistics
// and does not update them, unless told to keep batch statistics, as the trainer does
// by default (see Note [Frozen BatchNorm semantics]). Because autograd
// records an edge only for inputs that require grad, a frozen layer's weight gradient
// is never computed (Note [Frozen layers skip weight gradients]), and a frozen prefix
// run under NoGradGuard records no Node and keeps no activation at all. Optimizers
// skip parameters that do not require grad but keep their state (momentum, Adam
// moments), so unfreeze() resumes exactly where the parameter left off.
//
// Note [Frozen layers skip weight gradients]
// conv2d/linear backward ask Node::needs_input_grad(i) before allocating dw/db; an
// undefined output tells the kernel to skip that computation entirely.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "autograd/functions.h"
#include "core/tensor.h"

namespace eg::nn {

class Module {
 public:
  virtual ~Module() = default;
  // Single-input forward; modules with other signatures define their own call.
  virtual Tensor forward(const Tensor& x);
  Tensor operator()(const Tensor& x) { return forward(x); }
  virtual std::string type_name() const = 0;

  std::vector<std::pair<std::string, Tensor>> named_parameters(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> named_buffers(bool recurse = true) const;
  std::vector<Tensor> parameters(bool recurse = true) const;
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children() const { return children_; }
  std::vector<std::pair<std::string, Module*>> named_modules(const std::string& prefix = "");
  int64_t num_parameters() const;

  virtual void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // Moves parameters and buffers in place: every handle to them sees the new device.
  void to(Device d);
  Device device() const;

  // Parameters and buffers by dotted name ("layer1.0.conv1.weight"): the live tensors, as
  // PyTorch's (training goes on changing them; clone() each to keep a copy, e.g. the best
  // weights so far).
  std::map<std::string, Tensor> state_dict() const;
  // Copies values in. strict: every key must match both ways. Names the first
  // mismatch (missing, unexpected, or wrong shape) in the error.
  void load_state_dict(const std::map<std::string, Tensor>& sd, bool strict = true);

  // See Note [Freezing a module].
  void freeze();
  void unfreeze();
  bool is_frozen() const { return frozen_; }
  void zero_grad();

 protected:
  Tensor& register_parameter(const std::string& name, Tensor t);
  Tensor& register_buffer(const std::string& name, Tensor t);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    children_.emplace_back(name, m);
    return m;
  }
  virtual void on_freeze_changed() {}
  // Throws when a layer's public field (weight, bias) no longer holds the parameter
  // registered as `name`: reassigned rather than written into, it would be trained and
  // used by forward while the optimizer, state dicts and device moves see the old one.
  void check_registered(const Tensor& field, const char* name) const;

  bool training_ = true;
  bool frozen_ = false;

 private:
  std::vector<std::pair<std::string, Tensor>> params_, buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
};

using ModulePtr = std::shared_ptr<Module>;

// Runs children in order.
class Sequential : public Module {
 public:
  Sequential() = default;
  explicit Sequential(std::vector<ModulePtr> mods);
  ModulePtr add(ModulePtr m);
  ModulePtr add(const std::string& name, ModulePtr m);
  Tensor forward(const Tensor& x) override;
  size_t size() const { return children().size(); }
  ModulePtr operator[](size_t i) const {
    EG_CHECK(i < children().size(), "Sequential: no module ", i, " (it has ", children().size(), ")");
    return children()[i].second;
  }
  std::string type_name() const override { return "Sequential"; }
};

}  // namespace eg::nn
