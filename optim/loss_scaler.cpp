#include "optim/loss_scaler.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "kernels/ops.h"

namespace eg::optim {

LossScaler::LossScaler(LossScaleOptions o)
    : o_(o), state_(Tensor::from_vector(std::vector<double>{o.init, 0, 0}, {3})) {
  EG_CHECK(o.init > 0 && std::isfinite(o.init), "--loss-scale-init must be a positive number, got ", o.init);
  EG_CHECK(o.growth_interval >= 1, "--loss-scale-growth-interval must be at least 1, got ", o.growth_interval);
}

std::vector<double> LossScaler::read() const { return state_.to_vector<double>(); }

double LossScaler::scale() const { return read()[0]; }

int64_t LossScaler::skipped() const { return int64_t(read()[2]); }

Tensor LossScaler::scale_on(Device device) {
  if (state_.device() != device) state_ = state_.to(device);  // once: the state stays there
  return state_.slice(0, 1);
}

Tensor LossScaler::unscale_on_device(const GradBuckets& buckets) {
  if (buckets.buckets().empty()) return Tensor::zeros({1}, DType::f32, state_.device());
  const Device dev = buckets.buckets().front().flat.device();
  const Tensor s = scale_on(dev);
  Tensor found = Tensor::zeros({1}, DType::f32, dev);
  for (const GradBucket& b : buckets.buckets()) {
    Tensor flat = b.flat;
    ops::call(ops::amp_unscale, flat, found, s);
  }
  return found;
}

void LossScaler::update(const Tensor& found_inf) {
  if (state_.device() != found_inf.device()) state_ = state_.to(found_inf.device());
  ops::call(ops::amp_update_scale, state_, found_inf, o_.growth_interval);
}

void LossScaler::save(nlohmann::json& state) const {
  const std::vector<double> s = read();
  state["loss_scale"] = {{"scale", s[0]}, {"clean_steps", int64_t(s[1])}, {"skipped_steps", int64_t(s[2])}};
}

void LossScaler::load(const nlohmann::json& state) {
  if (!state.contains("loss_scale")) return;  // a checkpoint of a run without scaling
  const auto& s = state["loss_scale"];
  state_ =
      Tensor::from_vector(std::vector<double>{s.at("scale").get<double>(), double(s.at("clean_steps").get<int64_t>()),
                                              double(s.at("skipped_steps").get<int64_t>())},
                          {3})
          .to(state_.device());
}

}  // namespace eg::optim
