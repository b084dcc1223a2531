#include "freeze/policies.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "core/error.h"
#include "kernels/ops.h"

namespace eg::freeze {

using json = nlohmann::json;

namespace {

// Gradient-norm change (AutoFreeze): every n steps, for each active module, the
// relative change of its gradient norm since the previous evaluation; the front module
// freezes when its change is at or below the given percentile of the active modules'.
class AutoFreezePolicy : public FreezePolicy {
 public:
  AutoFreezePolicy(const PolicyConfig& c, int64_t modules)
      // AutoFreeze compares gradient norms between evaluations far apart: by default once
      // an epoch. (At Egeria's n, a few steps, "at or below the median change" is close
      // to a coin flip, and every module froze within an epoch.)
      : n_(c.tracker.interval > 0  ? c.tracker.interval
           : c.steps_per_epoch > 0 ? c.steps_per_epoch
                                   : default_interval(std::max<int64_t>(1, c.total_steps), modules, c.tracker.window)),
        pct_(c.autofreeze_percentile),
        modules_(modules),
        partition_(c.partition),
        prev_(size_t(modules), -1.0) {
    EG_CHECK(pct_ > 0 && pct_ < 100, "--autofreeze-percentile must be in (0, 100), got ", pct_);
  }
  void after_step(const StepInfo& s, const Tensor&, const Tensor&, models::Model& m) override {
    // A step that trained nothing has zero gradients: the reading waits for the next one that trained.
    due_ = due_ || s.step % n_ == 0;
    if (!due_ || !s.trained) return;
    due_ = false;
    auto layers = m.layer_modules();
    std::vector<double> change;
    double front_change = -1;
    for (int64_t i = prefix_; i < modules_; ++i) {
      double ss = 0;
      const FreezeUnit& u = partition_.units()[size_t(i)];
      for (int64_t l = u.begin; l < u.end; ++l)
        for (auto& p : layers[size_t(l)].second->parameters()) {
          if (!p.grad().defined()) continue;
          Tensor out = Tensor::empty({1}, p.grad().dtype(), p.grad().device());
          ops::call(ops::sum_squares, p.grad(), out);
          ss += out.item();
        }
      const double norm = std::sqrt(ss);
      if (prev_[size_t(i)] > 0) {
        const double c = std::abs(norm - prev_[size_t(i)]) / prev_[size_t(i)];
        change.push_back(c);
        if (i == prefix_) front_change = c;
      }
      prev_[size_t(i)] = norm;
    }
    if (front_change < 0 || change.size() < 2 || prefix_ + 1 >= modules_) return;
    std::vector<double> sorted = change;
    std::sort(sorted.begin(), sorted.end());
    const double cut = sorted[size_t(std::floor(pct_ / 100.0 * double(sorted.size() - 1)))];
    json e = {{"type", "evaluation"},  {"step", s.step}, {"module", prefix_}, {"grad_norm_change", front_change},
              {"percentile_cut", cut}, {"lr", s.lr}};
    log_.push_back(e);
    if (front_change <= cut) {
      log_.push_back({{"type", "freeze"}, {"step", s.step}, {"module", prefix_}, {"lr", s.lr}});
      ++prefix_;
    }
  }
  UnitSet frozen_units() const override { return first_units(prefix_); }
  std::vector<json> take_log() override { return std::exchange(log_, {}); }
  json state() const override { return {{"prefix", prefix_}, {"prev", prev_}, {"due", due_}}; }
  void load_state(const json& j) override {
    prefix_ = j.value("prefix", int64_t(0));
    if (j.contains("prev")) prev_ = j["prev"].get<std::vector<double>>();
    due_ = j.value("due", false);
  }

 private:
  int64_t n_;
  double pct_;
  int64_t modules_, prefix_ = 0;
  bool due_ = false;  // a reading is due and waits for a step that trained
  Partition partition_;
  std::vector<double> prev_;
  std::vector<json> log_;
};

}  // namespace

std::unique_ptr<FreezePolicy> make_autofreeze_policy(const PolicyConfig& c, int64_t units) {
  return std::make_unique<AutoFreezePolicy>(c, units);
}

}  // namespace eg::freeze
