#include "freeze/policies.h"

#include <algorithm>
#include <utility>

#include "core/error.h"

namespace eg::freeze {

using json = nlohmann::json;

namespace {

// FreezeOut's schedule: module i stops training at fraction t_i of the run.
class FreezeOutPolicy : public FreezePolicy {
 public:
  FreezeOutPolicy(const PolicyConfig& c, int64_t modules)
      : total_(c.total_steps), modules_(modules), t0_(c.freezeout_t0) {
    EG_CHECK(t0_ > 0 && t0_ <= 1, "--freezeout-t0 must be in (0, 1], got ", t0_);
  }
  void after_step(const StepInfo& s, const Tensor&, const Tensor&, models::Model&) override {
    int64_t k = 0;
    for (int64_t i = 0; i + 1 < modules_; ++i) {
      const double ti = t0_ + (1 - t0_) * double(i) / double(std::max<int64_t>(1, modules_ - 1));
      if (double(s.step) >= ti * double(total_)) k = i + 1;
    }
    if (k != prefix_) log_.push_back({{"type", "freeze"}, {"step", s.step}, {"modules", k}, {"lr", s.lr}});
    prefix_ = k;
  }
  UnitSet frozen_units() const override { return first_units(prefix_); }
  std::vector<json> take_log() override { return std::exchange(log_, {}); }
  json state() const override { return {{"prefix", prefix_}}; }
  void load_state(const json& j) override { prefix_ = j.value("prefix", int64_t(0)); }

 private:
  int64_t total_, modules_;
  double t0_;
  int64_t prefix_ = 0;
  std::vector<json> log_;
};

}  // namespace

std::unique_ptr<FreezePolicy> make_freezeout_policy(const PolicyConfig& c, int64_t units) {
  return std::make_unique<FreezeOutPolicy>(c, units);
}

}  // namespace eg::freeze
