#include "models/mobilenet_v2.h"

#include <cmath>

#include "layers/layers.h"

namespace eg::models {

namespace {

int64_t make_divisible(double v, int64_t d = 8) {
  int64_t r = std::max<int64_t>(d, int64_t(v + d / 2.0) / d * d);
  if (double(r) < 0.9 * v) r += d;
  return r;
}

// conv -> BN -> optional ReLU6 (fused into the batch norm's pass), tracking FLOPs and
// spatial size.
std::shared_ptr<nn::Sequential> conv_bn(int64_t in, int64_t out, int64_t k, int64_t stride, int64_t groups, bool act,
                                        Generator& g, int64_t& h, double& flops) {
  auto s = std::make_shared<nn::Sequential>();
  auto c = std::make_shared<nn::Conv2d>(in, out, k, nn::Conv2dOptions{stride, k / 2, 1, groups, false}, g);
  flops += c->flops_per_sample(h, h);
  h = (h + stride - 1) / stride;
  s->add("conv", c);
  auto bn = std::make_shared<nn::BatchNorm2d>(out);
  if (act) bn->fused_act = ops::BnAct::relu6;
  s->add("bn", bn);
  return s;
}

class InvertedResidual : public nn::Module {
 public:
  InvertedResidual(int64_t in, int64_t out, int64_t stride, int64_t expand, Generator& g, int64_t& h, double& flops)
      : residual_(stride == 1 && in == out) {
    auto body = std::make_shared<nn::Sequential>();
    const int64_t hidden = in * expand;
    if (expand != 1) body->add("expand", conv_bn(in, hidden, 1, 1, 1, true, g, h, flops));
    body->add("depthwise", conv_bn(hidden, hidden, 3, stride, hidden, true, g, h, flops));
    body->add("project", conv_bn(hidden, out, 1, 1, 1, false, g, h, flops));
    body_ = register_module("body", body);
  }
  Tensor forward(const Tensor& x) override {
    Tensor y = body_->forward(x);
    return residual_ ? fn::add(x, y) : y;
  }
  std::string type_name() const override { return "InvertedResidual"; }

 private:
  bool residual_;
  nn::ModulePtr body_;
};

}  // namespace

MobileNetV2::MobileNetV2(int64_t classes, int64_t in_ch, int64_t image, double width, bool small, Generator& g) {
  EG_CHECK(width > 0, "MobileNetV2: width multiplier must be positive, got ", width);
  // expansion t, output channels c, repeats n, first stride s
  const int64_t cfg[7][4] = {{1, 16, 1, 1}, {6, 24, 2, 2},  {6, 32, 3, 2}, {6, 64, 4, 2},
                             {6, 96, 3, 1}, {6, 160, 3, 2}, {6, 320, 1, 1}};
  int64_t h = image;
  int64_t c = make_divisible(32 * width);
  add_unit("stem", conv_bn(in_ch, c, 3, small ? 1 : 2, 1, true, g, h, flops_));
  int idx = 0;
  for (int st = 0; st < 7; ++st) {
    const int64_t out = make_divisible(double(cfg[st][1]) * width);
    for (int64_t i = 0; i < cfg[st][2]; ++i) {
      int64_t stride = i == 0 ? cfg[st][3] : 1;
      if (small && st == 1 && i == 0) stride = 1;
      const std::string block = "block" + std::to_string(idx), tv = "features." + std::to_string(idx + 1);
      ++idx;
      add_unit(block, std::make_shared<InvertedResidual>(c, out, stride, cfg[st][0], g, h, flops_));
      // torchvision's InvertedResidual.conv: [ConvBNReLU expand,] ConvBNReLU depthwise, conv, BN
      const bool expand = cfg[st][0] != 1;
      const std::string first = tv + ".conv." + (expand ? "1" : "0");
      if (expand)
        tv_.modules.insert(tv_.modules.end(), {{block + ".body.expand.conv", tv + ".conv.0.0"},
                                               {block + ".body.expand.bn", tv + ".conv.0.1"}});
      tv_.modules.insert(tv_.modules.end(), {{block + ".body.depthwise.conv", first + ".0"},
                                             {block + ".body.depthwise.bn", first + ".1"},
                                             {block + ".body.project.conv", tv + ".conv." + (expand ? "2" : "1")},
                                             {block + ".body.project.bn", tv + ".conv." + (expand ? "3" : "2")}});
      c = out;
    }
  }
  const int64_t last = make_divisible(1280 * std::max(1.0, width));
  auto head = std::make_shared<nn::Sequential>();
  head->add("conv", conv_bn(c, last, 1, 1, 1, true, g, h, flops_));
  head->add("pool", std::make_shared<nn::GlobalAvgPool>());
  head->add("dropout", std::make_shared<nn::Dropout>(0.2, g));
  head->add("fc", std::make_shared<nn::Linear>(last, classes, true, g));
  flops_ += 2.0 * double(last * classes);
  add_unit("head", head);
  // See Note [torchvision names]: torchvision.models.mobilenet_v2(width_mult=width).
  tv_.model = "mobilenet_v2";
  const std::string last_features = "features." + std::to_string(idx + 1);
  tv_.modules.insert(tv_.modules.end(), {{"stem.conv", "features.0.0"},
                                         {"stem.bn", "features.0.1"},
                                         {"head.conv.conv", last_features + ".0"},
                                         {"head.conv.bn", last_features + ".1"},
                                         {"head.fc", "classifier.1"}});
  if (small)
    tv_.differs =
        "built for images of 64 pixels or fewer: stride 1 in the stem and in the first downsampling "
        "stage, where torchvision's has stride 2";
}

Tensor MobileNetV2::forward(const Tensor& x) {
  Tensor h = x;
  for (auto& [n, m] : units_) h = m->forward(h);
  return h;
}

}  // namespace eg::models
