// ResNets (He et al. 2016).
//  - CIFAR family resnet20/32/44/56/110: 3x3 stem of 16 channels, three stages of
//    16/32/64 channels with n = (depth - 2) / 6 basic blocks each, global average
//    pool, linear head. Shortcuts are the paper's option A: parameter-free identity,
//    subsampled and zero-padded in channels where the shape changes (ResNet-56 has
//    0.85M parameters).
//  - ImageNet family resnet18 (basic blocks) and resnet50 (bottlenecks, stride on
//    the 3x3 conv as in torchvision), 1x1-conv projection shortcuts; small_input uses
//    a 3x3 stride-1 stem without max pooling for 32x32 images.
#pragma once
#include "core/rng.h"
#include "layers/layers.h"
#include "models/model.h"

namespace eg::models {

class ResNet : public Model {
 public:
  Tensor forward(const Tensor& x) override;
  std::vector<std::pair<std::string, nn::ModulePtr>> layer_modules() const override { return units_; }
  double flops_per_sample() const override { return flops_; }
  std::vector<double> module_flops() const override { return module_flops_; }
  std::string type_name() const override { return "ResNet"; }
  TorchvisionNames torchvision() const override { return tv_; }

  static std::shared_ptr<ResNet> cifar(int depth, int64_t num_classes, int64_t in_channels, Generator& g);
  static std::shared_ptr<ResNet> imagenet(int depth, int64_t num_classes, int64_t in_channels, int64_t image_size,
                                          bool small_input, Generator& g);

 private:
  void add_unit(const std::string& name, nn::ModulePtr m);
  std::vector<std::pair<std::string, nn::ModulePtr>> units_;
  double flops_ = 0;
  std::vector<double> module_flops_;  // flops_ added since the previous unit, per unit
  TorchvisionNames tv_;  // the ImageNet family's (Note [torchvision names])
};

}  // namespace eg::models
