// Learning-rate schedules as pure functions of the step (an iteration or an epoch,
// as the caller counts): resuming a run needs only the step number.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace eg::optim {

class LrSchedule {
 public:
  virtual ~LrSchedule() = default;
  virtual double lr_at(int64_t step) const = 0;
  virtual std::string describe() const = 0;
};

std::unique_ptr<LrSchedule> constant_lr(double base);
// base * gamma^(step / step_size)
std::unique_ptr<LrSchedule> step_lr(double base, int64_t step_size, double gamma = 0.1);
// base * gamma^(number of milestones <= step); milestones ascending
std::unique_ptr<LrSchedule> multistep_lr(double base, std::vector<int64_t> milestones, double gamma = 0.1);
// min + (base - min) (1 + cos(pi step / total)) / 2, then min
std::unique_ptr<LrSchedule> cosine_lr(double base, int64_t total, double min_lr = 0.0);
// Linear warmup over `warmup` steps to the value of `after` (which sees the absolute
// step), then `after` itself.
std::unique_ptr<LrSchedule> linear_warmup(std::unique_ptr<LrSchedule> after, int64_t warmup);
// Transformer schedule (Vaswani et al.): base * min((s+1)^-0.5, (s+1) warmup^-1.5) * sqrt(warmup)
// so that the peak at s+1 = warmup equals base.
std::unique_ptr<LrSchedule> inverse_sqrt_lr(double base, int64_t warmup);
// Linear decay from base to end over total steps, then end.
std::unique_ptr<LrSchedule> linear_decay_lr(double base, int64_t total, double end = 0.0);

}  // namespace eg::optim
