#include "models/resnet.h"

namespace eg::models {

namespace {

using nn::Conv2d;
using nn::Conv2dOptions;

// Kaiming-normal (fan_out, ReLU gain) initialisation for conv weights, as torchvision.
std::shared_ptr<Conv2d> conv(int64_t in, int64_t out, int64_t k, int64_t stride, Generator& g, int64_t groups = 1) {
  auto c = std::make_shared<Conv2d>(in, out, k, Conv2dOptions{stride, k / 2, 1, groups, false}, g);
  double std = std::sqrt(2.0 / double(out / groups * k * k));
  Tensor w = Tensor::randn(c->weight.shape(), g);
  float* p = w.data<float>();
  for (int64_t i = 0; i < w.numel(); ++i) p[i] = float(p[i] * std);
  c->weight.copy_(w);
  return c;
}

// A batch norm with the ReLU after it fused (fn::batch_norm): no pass of its own each
// way (ResNet-50's stem activation is the network's largest), and in the int8 reference
// the convolution's epilogue applies it (quant/reference.cpp). The blocks' last batch
// norms take theirs at the call, after the residual add.
std::shared_ptr<nn::BatchNorm2d> relu_bn(int64_t channels) {
  auto bn = std::make_shared<nn::BatchNorm2d>(channels);
  bn->fused_act = ops::BnAct::relu;
  return bn;
}

// A unit tracks its spatial output size and FLOPs while it is built.
struct Shape2 {
  int64_t c, h;
};

// Option A shortcut: x[:, :, ::s, ::s] zero-padded to `out` channels, done as a fixed
// 1x1 stride-s convolution whose weight is an identity on the first `in` channels.
// The weight is a buffer (not a parameter): no gradient, no optimizer state.
class PadShortcut : public nn::Module {
 public:
  PadShortcut(int64_t in, int64_t out, int64_t stride) : p_{stride, stride, 0, 0, 1, 1, 1} {
    Tensor w = Tensor::zeros({out, in, 1, 1});
    for (int64_t i = 0; i < in; ++i) w.data<float>()[i * in + i] = 1.f;
    w_ = register_buffer("select", w);
  }
  Tensor forward(const Tensor& x) override { return fn::conv2d(x, w_, Tensor(), p_); }
  std::string type_name() const override { return "PadShortcut"; }

 private:
  ops::Conv2dParams p_;
  Tensor w_;
};

class BasicBlock : public nn::Module {
 public:
  BasicBlock(int64_t in, int64_t out, int64_t stride, bool option_a, Generator& g, Shape2& s, double& flops) {
    conv1 = register_module("conv1", conv(in, out, 3, stride, g));
    bn1 = register_module("bn1", relu_bn(out));
    conv2 = register_module("conv2", conv(out, out, 3, 1, g));
    bn2 = register_module("bn2", std::make_shared<nn::BatchNorm2d>(out));
    int64_t h = (s.h + stride - 1) / stride;
    flops += conv1->flops_per_sample(s.h, s.h) + conv2->flops_per_sample(h, h);
    if (stride != 1 || in != out) {
      if (option_a) {
        shortcut = register_module("shortcut", std::make_shared<PadShortcut>(in, out, stride));
      } else {
        auto sc = std::make_shared<nn::Sequential>();
        auto c = conv(in, out, 1, stride, g);
        flops += c->flops_per_sample(s.h, s.h);
        sc->add("0", c);
        sc->add("1", std::make_shared<nn::BatchNorm2d>(out));
        shortcut = register_module("shortcut", sc);
      }
    }
    s = {out, h};
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = bn1->forward(conv1->forward(x));
    return bn2->forward(conv2->forward(h), ops::BnAct::relu, shortcut ? shortcut->forward(x) : x);
  }
  std::string type_name() const override { return "BasicBlock"; }
  std::shared_ptr<Conv2d> conv1, conv2;
  std::shared_ptr<nn::BatchNorm2d> bn1, bn2;
  nn::ModulePtr shortcut;
};

class Bottleneck : public nn::Module {
 public:
  Bottleneck(int64_t in, int64_t width, int64_t stride, Generator& g, Shape2& s, double& flops) {
    const int64_t out = width * 4;
    conv1 = register_module("conv1", conv(in, width, 1, 1, g));
    bn1 = register_module("bn1", relu_bn(width));
    conv2 = register_module("conv2", conv(width, width, 3, stride, g));
    bn2 = register_module("bn2", relu_bn(width));
    conv3 = register_module("conv3", conv(width, out, 1, 1, g));
    bn3 = register_module("bn3", std::make_shared<nn::BatchNorm2d>(out));
    int64_t h = (s.h + stride - 1) / stride;
    flops += conv1->flops_per_sample(s.h, s.h) + conv2->flops_per_sample(s.h, s.h) + conv3->flops_per_sample(h, h);
    if (stride != 1 || in != out) {
      auto sc = std::make_shared<nn::Sequential>();
      auto c = conv(in, out, 1, stride, g);
      flops += c->flops_per_sample(s.h, s.h);
      sc->add("0", c);
      sc->add("1", std::make_shared<nn::BatchNorm2d>(out));
      shortcut = register_module("downsample", sc);
    }
    s = {out, h};
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = bn1->forward(conv1->forward(x));
    h = bn2->forward(conv2->forward(h));
    return bn3->forward(conv3->forward(h), ops::BnAct::relu, shortcut ? shortcut->forward(x) : x);
  }
  std::string type_name() const override { return "Bottleneck"; }
  std::shared_ptr<Conv2d> conv1, conv2, conv3;
  std::shared_ptr<nn::BatchNorm2d> bn1, bn2, bn3;
  nn::ModulePtr shortcut;
};

std::shared_ptr<nn::Sequential> head(int64_t in, int64_t classes, Generator& g, double& flops) {
  auto h = std::make_shared<nn::Sequential>();
  h->add("pool", std::make_shared<nn::GlobalAvgPool>());
  h->add("fc", std::make_shared<nn::Linear>(in, classes, true, g));
  flops += 2.0 * double(in * classes);
  return h;
}

}  // namespace

void ResNet::add_unit(const std::string& name, nn::ModulePtr m) {
  register_module(name, m);
  units_.emplace_back(name, m);
  double before = 0;
  for (double f : module_flops_) before += f;
  module_flops_.push_back(flops_ - before);
}

Tensor ResNet::forward(const Tensor& x) {
  Tensor h = x;
  for (auto& [n, m] : units_) h = m->forward(h);
  return h;
}

std::shared_ptr<ResNet> ResNet::cifar(int depth, int64_t classes, int64_t in_ch, Generator& g) {
  EG_CHECK(depth >= 8 && (depth - 2) % 6 == 0, "CIFAR ResNet depth must be 6n+2 (20, 32, 44, 56, 110), got ", depth);
  const int n = (depth - 2) / 6;
  auto r = std::shared_ptr<ResNet>(new ResNet());
  Shape2 s{in_ch, 32};
  auto stem = std::make_shared<nn::Sequential>();
  auto c = conv(in_ch, 16, 3, 1, g);
  r->flops_ += c->flops_per_sample(32, 32);
  stem->add("conv", c);
  stem->add("bn", relu_bn(16));
  r->add_unit("stem", stem);
  s.c = 16;
  const int64_t widths[3] = {16, 32, 64};
  for (int st = 0; st < 3; ++st)
    for (int b = 0; b < n; ++b) {
      int64_t stride = (st > 0 && b == 0) ? 2 : 1;
      auto blk = std::make_shared<BasicBlock>(s.c, widths[st], stride, true, g, s, r->flops_);
      r->add_unit("layer" + std::to_string(st + 1) + "." + std::to_string(b), blk);
    }
  r->add_unit("head", head(64, classes, g, r->flops_));
  return r;
}

std::shared_ptr<ResNet> ResNet::imagenet(int depth, int64_t classes, int64_t in_ch, int64_t image, bool small,
                                         Generator& g) {
  EG_CHECK(depth == 18 || depth == 34 || depth == 50 || depth == 101,
           "ImageNet ResNet depth must be 18, 34, 50 or 101, got ", depth);
  const bool bottleneck = depth >= 50;
  const int counts[4][4] = {{2, 2, 2, 2}, {3, 4, 6, 3}, {3, 4, 6, 3}, {3, 4, 23, 3}};
  const int* cnt = counts[depth == 18 ? 0 : depth == 34 ? 1 : depth == 50 ? 2 : 3];
  auto r = std::shared_ptr<ResNet>(new ResNet());
  Shape2 s{in_ch, image};
  auto stem = std::make_shared<nn::Sequential>();
  auto c = small ? conv(in_ch, 64, 3, 1, g) : conv(in_ch, 64, 7, 2, g);
  r->flops_ += c->flops_per_sample(image, image);
  stem->add("conv", c);
  stem->add("bn", relu_bn(64));
  s = {64, small ? image : (image + 1) / 2};
  if (!small) {
    stem->add("pool", nn::MaxPool2d(3, 2, 1));
    s.h = (s.h + 1) / 2;
  }
  r->add_unit("stem", stem);
  const int64_t widths[4] = {64, 128, 256, 512};
  for (int st = 0; st < 4; ++st)
    for (int b = 0; b < cnt[st]; ++b) {
      int64_t stride = (st > 0 && b == 0) ? 2 : 1;
      nn::ModulePtr blk =
          bottleneck ? nn::ModulePtr(std::make_shared<Bottleneck>(s.c, widths[st], stride, g, s, r->flops_))
                     : nn::ModulePtr(std::make_shared<BasicBlock>(s.c, widths[st], stride, false, g, s, r->flops_));
      const std::string name = "layer" + std::to_string(st + 1) + "." + std::to_string(b);
      r->add_unit(name, blk);
      r->tv_.modules.emplace_back(name, name);  // conv1, bn1, ... as torchvision's blocks
      for (auto& [child, m] : blk->children())  // a basic block's projection is torchvision's downsample
        if (child == "shortcut") r->tv_.modules.emplace_back(name + ".shortcut", name + ".downsample");
    }
  r->add_unit("head", head(s.c, classes, g, r->flops_));
  // See Note [torchvision names]: torchvision.models.resnetN.
  r->tv_.model = "resnet" + std::to_string(depth);
  r->tv_.modules.insert(r->tv_.modules.end(), {{"stem.conv", "conv1"}, {"stem.bn", "bn1"}, {"head.fc", "fc"}});
  if (small)
    r->tv_.differs =
        "built for images of 64 pixels or fewer: a 3x3 stride-1 stem without max pooling, where "
        "torchvision's has a 7x7 stride-2 convolution and a 3x3 max pooling";
  return r;
}

}  // namespace eg::models
