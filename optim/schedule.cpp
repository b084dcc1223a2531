#include "optim/schedule.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace eg::optim {

namespace {

template <class F>
class FnSchedule : public LrSchedule {
 public:
  FnSchedule(F f, std::string d) : f_(std::move(f)), d_(std::move(d)) {}
  double lr_at(int64_t s) const override { return f_(std::max<int64_t>(s, 0)); }
  std::string describe() const override { return d_; }

 private:
  F f_;
  std::string d_;
};

template <class F>
std::unique_ptr<LrSchedule> make(F f, std::string d) {
  return std::make_unique<FnSchedule<F>>(std::move(f), std::move(d));
}

void check_base(double base) {
  EG_CHECK(base >= 0 && std::isfinite(base), "learning rate must be finite and non-negative, got ", base);
}

}  // namespace

std::unique_ptr<LrSchedule> constant_lr(double base) {
  check_base(base);
  return make([base](int64_t) { return base; }, "constant");
}

std::unique_ptr<LrSchedule> step_lr(double base, int64_t step_size, double gamma) {
  check_base(base);
  EG_CHECK(step_size > 0, "step schedule: step size must be positive, got ", step_size);
  return make([=](int64_t s) { return base * std::pow(gamma, double(s / step_size)); }, "step");
}

std::unique_ptr<LrSchedule> multistep_lr(double base, std::vector<int64_t> ms, double gamma) {
  check_base(base);
  EG_CHECK(std::is_sorted(ms.begin(), ms.end()), "multistep schedule: milestones must be ascending");
  return make(
      [=](int64_t s) {
    auto n = std::upper_bound(ms.begin(), ms.end(), s) - ms.begin();
    return base * std::pow(gamma, double(n));
      },
      "multistep");
}

std::unique_ptr<LrSchedule> cosine_lr(double base, int64_t total, double min_lr) {
  check_base(base);
  EG_CHECK(total > 0, "cosine schedule: total steps must be positive, got ", total);
  return make(
      [=](int64_t s) {
    if (s >= total) return min_lr;
    return min_lr + (base - min_lr) * 0.5 * (1 + std::cos(M_PI * double(s) / double(total)));
      },
      "cosine");
}

std::unique_ptr<LrSchedule> linear_warmup(std::unique_ptr<LrSchedule> after, int64_t warmup) {
  EG_CHECK(warmup >= 0, "warmup steps must be non-negative, got ", warmup);
  std::shared_ptr<LrSchedule> a(std::move(after));
  std::string d = "linear warmup + " + a->describe();
  return make(
      [a, warmup](int64_t s) {
    double target = a->lr_at(s);
    return s < warmup ? target * double(s + 1) / double(warmup) : target;
      },
      d);
}

std::unique_ptr<LrSchedule> inverse_sqrt_lr(double base, int64_t warmup) {
  check_base(base);
  EG_CHECK(warmup > 0, "inverse square root schedule: warmup must be positive, got ", warmup);
  return make(
      [=](int64_t s) {
    double t = double(s + 1), w = double(warmup);
    return base * std::sqrt(w) * std::min(1.0 / std::sqrt(t), t * std::pow(w, -1.5));
      },
      "inverse sqrt");
}

std::unique_ptr<LrSchedule> linear_decay_lr(double base, int64_t total, double end) {
  check_base(base);
  EG_CHECK(total > 0, "linear decay schedule: total steps must be positive, got ", total);
  return make([=](int64_t s) { return s >= total ? end : base + (end - base) * double(s) / double(total); },
              "linear decay");
}

}  // namespace eg::optim
