#include "freeze/policy.h"

#include <cmath>
#include <string>
#include <utility>

#include "core/error.h"
#include "freeze/policies.h"

namespace eg::freeze {

UnitSet first_units(int64_t k) {
  UnitSet s;
  for (int64_t u = 0; u < k; ++u) s.push_back(u);
  return s;
}

int64_t prefix_length(const UnitSet& s) {
  int64_t p = 0;
  while (p < int64_t(s.size()) && s[size_t(p)] == p) ++p;
  return p;
}

double constant_prediction_loss(const std::vector<int64_t>& counts, double label_smoothing) {
  EG_CHECK(label_smoothing >= 0 && label_smoothing < 1, "label smoothing must be in [0, 1), got ", label_smoothing);
  int64_t total = 0;
  for (int64_t n : counts) {
    EG_CHECK(n >= 0, "a class count is negative (", n, ")");
    total += n;
  }
  if (total == 0) return 0;
  const double uniform = label_smoothing / double(counts.size());
  double h = 0;
  for (int64_t n : counts) {
    const double q = (1 - label_smoothing) * double(n) / double(total) + uniform;
    if (q > 0) h -= q * std::log(q);
  }
  return h;
}

void StepLosses::add(const DeferredScalar& loss) {
  unread_.push_back(loss);
  ++n_;
  if (unread_.size() > 64) read(false);
}

double StepLosses::sum() const {
  read(true);
  return sum_;
}

void StepLosses::restore(double sum, int64_t count) {
  unread_.clear();
  sum_ = sum;
  n_ = count;
}

void StepLosses::read(bool all) const {
  if (unread_.empty()) return;
  const size_t n = all ? unread_.size() : unread_.size() - 1;
  for (size_t i = 0; i < n; ++i) sum_ += all ? unread_[i].value() : unread_[i].lagged_value();
  unread_.erase(unread_.begin(), unread_.begin() + std::ptrdiff_t(n));
}

bool apply_frozen_layers(models::Model& m, const std::vector<int64_t>& layers) {
  bool changed = false;
  int64_t i = 0;
  size_t next = 0;  // the first of `layers` not yet passed
  for (auto& [name, mod] : m.layer_modules()) {
    while (next < layers.size() && layers[next] < i) ++next;
    const bool want = next < layers.size() && layers[next] == i++;
    if (want == mod->is_frozen()) continue;
    changed = true;
    if (want) {
      mod->freeze();
      for (auto& p : mod->parameters()) p.set_grad(Tensor());  // a frozen parameter owns no gradient memory
    } else {
      mod->unfreeze();
    }
  }
  return changed;
}

bool apply_frozen_prefix(models::Model& m, int64_t k) {
  std::vector<int64_t> layers;
  for (int64_t i = 0; i < k; ++i) layers.push_back(i);
  return apply_frozen_layers(m, layers);
}

double FreezeOptions::max_cpu_load(Device training) const {
  // auto: the paper's gate where it fits, beside GPU training whose results are acted
  // on when they arrive; acting at the next evaluation, training waits for each result
  // there, so a reference held back by the gate would stall it.
  if (reference_max_load == 0) return training.is_cuda() && apply_on_arrival ? 0.5 : 1.0;
  return reference_max_load / 100;
}

namespace {

class NonePolicy : public FreezePolicy {
 public:
  void after_step(const StepInfo&, const Tensor&, const Tensor&, models::Model&) override {}
  UnitSet frozen_units() const override { return {}; }
};

std::unique_ptr<FreezePolicy> make_none_policy(const PolicyConfig&, int64_t) { return std::make_unique<NonePolicy>(); }

// --freeze's values, in the order the help lists them (freeze/policies.h).
const struct {
  const char* name;
  std::unique_ptr<FreezePolicy> (*make)(const PolicyConfig&, int64_t units);
} kPolicies[] = {{"none", make_none_policy},           {"static", make_static_policy},
                 {"freezeout", make_freezeout_policy}, {"autofreeze", make_autofreeze_policy},
                 {"egeria", make_egeria_policy},       {"smartfrz", make_smartfrz_policy}};

}  // namespace

std::vector<std::string> policy_names() {
  std::vector<std::string> names;
  for (auto& p : kPolicies) names.push_back(p.name);
  return names;
}

std::unique_ptr<FreezePolicy> make_policy(const PolicyConfig& cin, int64_t layers) {
  EG_CHECK(layers >= 2, "layer freezing needs a model with at least two layer modules");
  PolicyConfig c = cin;
  if (c.partition.size() == 0) {
    std::vector<FreezeUnit> u;
    for (int64_t i = 0; i < layers; ++i) u.push_back({std::to_string(i), i, i + 1, 0});
    c.partition = Partition(std::move(u));
  }
  EG_CHECK(c.partition.units().back().end == layers, "the freezing units cover ", c.partition.units().back().end,
           " layer modules, but the model has ", layers);
  for (auto& p : kPolicies)
    if (c.policy == p.name) return p.make(c, c.partition.size());
  std::string names;
  for (auto& p : kPolicies) names += std::string(names.empty() ? "" : ", ") + p.name;
  EG_THROW("--freeze: unknown policy '", c.policy, "' (", names, ")");
}

}  // namespace eg::freeze
