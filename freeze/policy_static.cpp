#include "freeze/policies.h"

#include <algorithm>
#include <utility>

#include "core/error.h"

namespace eg::freeze {

using json = nlohmann::json;

namespace {

// Freezes the first K units, or the set --static-units names, at the start of epoch E.
class StaticPolicy : public FreezePolicy {
 public:
  StaticPolicy(const PolicyConfig& c, int64_t units) {
    epoch_ = c.static_epoch >= 0 ? c.static_epoch : (c.steps_per_epoch ? c.total_steps / c.steps_per_epoch / 2 : 0);
    if (c.static_units.empty()) {
      const int64_t k = c.static_modules >= 0 ? c.static_modules : units / 2;
      EG_CHECK(k < units, "--freeze static: ", k, " units would freeze the whole model (it has ", units,
               "; the last is never frozen)");
      set_ = first_units(k);
      return;
    }
    set_ = c.static_units;
    std::sort(set_.begin(), set_.end());
    for (size_t i = 0; i < set_.size(); ++i) {
      EG_CHECK(set_[i] >= 0 && set_[i] < units - 1, "--static-units: unit ", set_[i],
               " is out of range: the model has ", units, " freezing units, 0 to ", units - 2,
               " can freeze (the last, the head, never does)");
      EG_CHECK(i == 0 || set_[i] != set_[i - 1], "--static-units names unit ", set_[i], " twice");
    }
  }
  void after_step(const StepInfo& s, const Tensor&, const Tensor&, models::Model&) override {
    const bool on = s.epoch >= epoch_ || (s.step > 0 && epoch_ == 0);
    if (on != on_ && !set_.empty()) {
      json e = {{"type", "freeze"}, {"step", s.step}, {"modules", on ? int64_t(set_.size()) : 0}, {"lr", s.lr}};
      if (on && prefix_length(set_) != int64_t(set_.size())) e["units"] = set_;
      log_.push_back(std::move(e));
    }
    on_ = on;
  }
  UnitSet frozen_units() const override { return on_ ? set_ : UnitSet(); }
  std::vector<json> take_log() override { return std::exchange(log_, {}); }
  // "prefix" as checkpoints before frozen sets had it (the number of units frozen then).
  json state() const override { return {{"prefix", on_ ? int64_t(set_.size()) : 0}, {"on", on_}}; }
  void load_state(const json& j) override { on_ = j.contains("on") ? j["on"].get<bool>() : j.value("prefix", 0) > 0; }

 private:
  int64_t epoch_;
  UnitSet set_;  // what freezes at epoch_
  bool on_ = false;
  std::vector<json> log_;
};

}  // namespace

std::unique_ptr<FreezePolicy> make_static_policy(const PolicyConfig& c, int64_t units) {
  return std::make_unique<StaticPolicy>(c, units);
}

}  // namespace eg::freeze
