// MobileNetV2 (Sandler et al. 2018): 3x3 stem, 17 inverted-residual blocks
// (expand 1x1 -> depthwise 3x3 -> project 1x1, ReLU6, identity shortcut when the
// shape is kept), 1x1 conv to 1280, global pool, dropout, linear. Channel counts are
// scaled by the width multiplier and rounded to multiples of 8; 3.5M parameters at
// width 1.0 and 1000 classes. The 32x32 variant uses a stride-1 stem and keeps
// stride 1 in the first downsampling stage, as usual for CIFAR-size inputs.
#pragma once
#include "core/rng.h"
#include "models/model.h"

namespace eg::models {

class MobileNetV2 : public Model {
 public:
  MobileNetV2(int64_t num_classes, int64_t in_channels, int64_t image_size, double width, bool small_input,
              Generator& g);
  Tensor forward(const Tensor& x) override;
  std::vector<std::pair<std::string, nn::ModulePtr>> layer_modules() const override { return units_; }
  double flops_per_sample() const override { return flops_; }
  std::vector<double> module_flops() const override { return module_flops_; }
  std::string type_name() const override { return "MobileNetV2"; }
  TorchvisionNames torchvision() const override { return tv_; }

 private:
  void add_unit(const std::string& name, nn::ModulePtr m) {
    register_module(name, m);
    units_.emplace_back(name, m);
    double before = 0;
    for (double f : module_flops_) before += f;
    module_flops_.push_back(flops_ - before);
  }
  std::vector<std::pair<std::string, nn::ModulePtr>> units_;
  double flops_ = 0;
  std::vector<double> module_flops_;  // flops_ added since the previous unit, per unit
  TorchvisionNames tv_;  // Note [torchvision names]
};

}  // namespace eg::models
