#include "freeze/policies.h"

#include <utility>

#include "core/error.h"

namespace eg::freeze {

using json = nlohmann::json;

namespace {

// Freezes the first K modules at the start of epoch E.
class StaticPolicy : public FreezePolicy {
 public:
  StaticPolicy(const PolicyConfig& c, int64_t modules) {
    k_ = c.static_modules >= 0 ? c.static_modules : modules / 2;
    epoch_ = c.static_epoch >= 0 ? c.static_epoch : (c.steps_per_epoch ? c.total_steps / c.steps_per_epoch / 2 : 0);
    EG_CHECK(k_ < modules, "--freeze static: ", k_, " modules would freeze the whole model (it has ", modules,
             "; the last is never frozen)");
  }
  void after_step(const StepInfo& s, const Tensor&, const Tensor&, models::Model&) override {
    const int64_t want = s.epoch >= epoch_ || (s.step > 0 && epoch_ == 0) ? k_ : 0;
    if (want != prefix_) log_.push_back({{"type", "freeze"}, {"step", s.step}, {"modules", want}, {"lr", s.lr}});
    prefix_ = want;
  }
  int64_t frozen_prefix() const override { return prefix_; }
  std::vector<json> take_log() override { return std::exchange(log_, {}); }
  json state() const override { return {{"prefix", prefix_}}; }
  void load_state(const json& j) override { prefix_ = j.value("prefix", int64_t(0)); }

 private:
  int64_t k_, epoch_, prefix_ = 0;
  std::vector<json> log_;
};

}  // namespace

std::unique_ptr<FreezePolicy> make_static_policy(const PolicyConfig& c, int64_t units) {
  return std::make_unique<StaticPolicy>(c, units);
}

}  // namespace eg::freeze
