#include "optim/loss_scaler.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "kernels/ops.h"

namespace eg::optim {

LossScaler::LossScaler(LossScaleOptions o) : o_(o), scale_(o.init) {
  EG_CHECK(o.init > 0 && std::isfinite(o.init), "--loss-scale-init must be a positive number, got ", o.init);
  EG_CHECK(o.growth_interval >= 1, "--loss-scale-growth-interval must be at least 1, got ", o.growth_interval);
}

bool LossScaler::unscale(const GradBuckets& buckets) {
  if (buckets.buckets().empty()) return false;
  const Device dev = buckets.buckets().front().flat.device();
  Tensor found = Tensor::zeros({1}, DType::f32, dev);
  for (const GradBucket& b : buckets.buckets()) {
    Tensor flat = b.flat;
    ops::call(ops::amp_unscale, flat, found, 1.0 / scale_);
  }
  return found.item() != 0;
}

void LossScaler::update(bool overflow) {
  if (overflow) {
    scale_ *= 0.5;
    clean_ = 0;
    ++skipped_;
    return;
  }
  if (++clean_ < o_.growth_interval) return;
  scale_ *= 2;
  clean_ = 0;
}

void LossScaler::save(nlohmann::json& state) const {
  state["loss_scale"] = {{"scale", scale_}, {"clean_steps", clean_}, {"skipped_steps", skipped_}};
}

void LossScaler::load(const nlohmann::json& state) {
  if (!state.contains("loss_scale")) return;  // a checkpoint of a run without scaling
  const auto& s = state["loss_scale"];
  scale_ = s.at("scale").get<double>();
  clean_ = s.at("clean_steps").get<int64_t>();
  skipped_ = s.at("skipped_steps").get<int64_t>();
}

}  // namespace eg::optim
