// autograd/autocast: bf16 mixed precision as torch.autocast (Note [Autocast]).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "autograd/autocast.h"
#include "autograd/functions.h"
#include "layers/layers.h"

using namespace eg;

namespace {

// x rounded to bf16 and back, differentiably: the forward's roundings under autocast,
// emulated in f32.
Tensor q(const Tensor& x) { return fn::cast(fn::cast(x, DType::bf16), DType::f32); }

// A residual block's shape: conv -> BN+ReLU -> conv -> BN + x -> ReLU, then the head.
// `emulate`: in f32 with each bf16 rounding autocast makes in the forward made by q().
struct Block {
  Generator g{7};
  nn::Conv2d c1{16, 16, 3, {1, 1, 1, 1, false}, g}, c2{16, 16, 3, {1, 1, 1, 1, false}, g};
  nn::BatchNorm2d b1{16}, b2{16};
  nn::Linear head{16, 10, true, g};
  std::vector<Tensor> params() {
    return {c1.weight, c2.weight, b1.weight, b1.bias, b2.weight, b2.bias, head.weight, head.bias};
  }
  Tensor loss(const Tensor& x, const Tensor& y, Tensor* trunk = nullptr) {
    Tensor h = b1.forward(c1.forward(x), ops::BnAct::relu);
    Tensor t = b2.forward(c2.forward(h), ops::BnAct::relu, x);
    if (trunk) *trunk = t;
    return fn::cross_entropy(head.forward(fn::global_avg_pool(t)), y);
  }
  Tensor emulated_loss(const Tensor& x, const Tensor& y) {
    auto conv = [](nn::Conv2d& c, const Tensor& in) { return q(fn::conv2d(q(in), q(c.weight), Tensor(), c.params)); };
    Tensor h = q(b1.forward(conv(c1, x), ops::BnAct::relu));
    Tensor t = q(b2.forward(conv(c2, h), ops::BnAct::relu, q(x)));
    return fn::cross_entropy(head.forward(fn::global_avg_pool(t)), y);
  }
};

// The backward's bf16 gradients (rounded at each activation, 2^-9 relative) through
// two batch norms and convolutions, as a share of a gradient's largest element.
constexpr double kBackwardRounding = 0.01;

double max_rel_diff(const Tensor& a, const Tensor& b) {
  const std::vector<float> u = a.to(DType::f32).to_vector<float>(), v = b.to(DType::f32).to_vector<float>();
  double worst = 0, scale = 0;
  for (size_t i = 0; i < u.size(); ++i) scale = std::max(scale, std::fabs(double(v[i])));
  for (size_t i = 0; i < u.size(); ++i) worst = std::max(worst, std::fabs(double(u[i]) - double(v[i])) / scale);
  return worst;
}

}  // namespace

// The block under Autocast(bf16): the trunk's activations are bf16, the loss and every
// parameter gradient f32 (master weights), the input's gradient in the input's dtype; and
// all of them those of the f32 computation with the forward's bf16 roundings, within the
// backward's own roundings. (Against plain f32 they differ by more: a convolution's weight
// gradient through batch norm moves by ~6% of its largest element when only x and w are
// rounded to bf16, the same in f32 arithmetic: the sensitivity is the gradient's, not the
// kernels'.)
TEST(Autocast, ConvolutionBlocksRunInBf16WithF32LossAndGradients) {
  Block m;
  Generator g(3);
  Tensor x = Tensor::randn({8, 16, 6, 6}, g).set_requires_grad(true);
  Tensor y = Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}, {8});
  Tensor loss32 = m.emulated_loss(x, y);
  loss32.backward();
  std::vector<Tensor> grads32;
  for (auto& p : m.params()) grads32.push_back(p.grad().clone()), p.set_grad(Tensor());
  Tensor gx32 = x.grad().clone();
  x.set_grad(Tensor());

  Tensor loss16, trunk;
  {
    autograd::Autocast ac(DType::bf16);
    EXPECT_EQ(autograd::autocast_dtype(), DType::bf16);
    loss16 = m.loss(x, y, &trunk);
  }
  EXPECT_EQ(autograd::autocast_dtype(), DType::f32) << "the scope ends with its block";
  EXPECT_EQ(trunk.dtype(), DType::bf16);
  EXPECT_EQ(loss16.dtype(), DType::f32);
  loss16.backward();
  EXPECT_NEAR(loss16.item(), loss32.item(), 1e-3 * std::fabs(loss32.item()));
  const std::vector<Tensor> ps = m.params();
  for (size_t i = 0; i < ps.size(); ++i) {
    ASSERT_TRUE(ps[i].grad().defined()) << i;
    EXPECT_EQ(ps[i].grad().dtype(), DType::f32) << "parameter " << i;
    EXPECT_LT(max_rel_diff(ps[i].grad(), grads32[i]), kBackwardRounding) << "parameter " << i;
  }
  EXPECT_EQ(x.grad().dtype(), DType::f32);
  EXPECT_LT(max_rel_diff(x.grad(), gx32), kBackwardRounding);
}

// fn::cast is differentiable: the gradient comes back in the input's dtype, unrounded
// when it widens.
TEST(Autocast, CastGivesTheGradientInTheInputsDtype) {
  Tensor x = Tensor::from_vector(std::vector<float>{1.f, -2.5f, 3.25f}, {3}).set_requires_grad(true);
  Tensor h = fn::cast(x, DType::bf16);
  EXPECT_EQ(h.dtype(), DType::bf16);
  fn::sum(fn::scale(h, 3.0)).backward();
  EXPECT_EQ(x.grad().dtype(), DType::f32);
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{3.f, 3.f, 3.f}));
  Tensor same = fn::cast(x, DType::f32);
  EXPECT_TRUE(same.is_same(x)) << "a cast to the tensor's own dtype is the tensor";
}

// The weight cache: one bf16 copy per weight per outermost scope; a weight that trains is
// cast again in the next scope, and after a change; a frozen one keeps its copy.
TEST(Autocast, WeightsAreCastOncePerScopeAndFrozenOnesOnce) {
  Generator g(1);
  Tensor trained = Tensor::randn({4, 4}, g).set_requires_grad(true);
  Tensor frozen = Tensor::randn({4, 4}, g);
  Tensor t1, f1;
  {
    autograd::Autocast ac(DType::bf16);
    t1 = autograd::autocast_weight(trained);
    f1 = autograd::autocast_weight(frozen);
    EXPECT_EQ(t1.dtype(), DType::bf16);
    EXPECT_TRUE(autograd::autocast_weight(trained).is_same(t1)) << "one copy within a scope";
    {
      autograd::Autocast inner(DType::bf16);
      EXPECT_TRUE(autograd::autocast_weight(trained).is_same(t1)) << "nested scopes share the outermost's cache";
    }
  }
  {
    autograd::Autocast ac(DType::bf16);
    EXPECT_FALSE(autograd::autocast_weight(trained).is_same(t1)) << "a trained weight is cast anew each scope";
    EXPECT_TRUE(autograd::autocast_weight(frozen).is_same(f1)) << "a frozen weight keeps its copy";
  }
  frozen.copy_(Tensor::zeros({4, 4}));
  {
    autograd::Autocast ac(DType::bf16);
    Tensor f2 = autograd::autocast_weight(frozen);
    EXPECT_FALSE(f2.is_same(f1)) << "a changed weight is cast again";
    EXPECT_EQ(f2.to(DType::f32).to_vector<float>(), std::vector<float>(16, 0.f));
  }
  std::weak_ptr<TensorImpl> gone;
  {
    Tensor dead = Tensor::randn({4, 4}, g);
    gone = dead.impl_ptr();
    autograd::Autocast ac(DType::bf16);
    (void)autograd::autocast_weight(dead);
  }
  EXPECT_TRUE(gone.expired()) << "the cache keeps no weight alive";
}

// Outside autocast a bf16 input still computes: convolutions in their weight's dtype, the
// f32-only functions after a cast (never a misread buffer).
TEST(Autocast, Bf16InputsOutsideAScopeArePromoted) {
  Generator g(5);
  nn::Conv2d conv(3, 4, 3, {1, 1, 1, 1, true}, g);
  Tensor x = Tensor::randn({2, 3, 5, 5}, g);
  Tensor xb = x.to(DType::bf16);
  Tensor y = conv.forward(xb), ref = conv.forward(xb.to(DType::f32));
  EXPECT_EQ(y.dtype(), DType::f32);
  EXPECT_EQ(y.to_vector<float>(), ref.to_vector<float>());
  // Pooling takes bf16 as it comes, as PyTorch pools a bf16 tensor; softmax promotes it.
  Tensor p = fn::global_avg_pool(fn::cast(y, DType::bf16));
  EXPECT_EQ(p.dtype(), DType::bf16);
  EXPECT_EQ(fn::softmax(p).dtype(), DType::f32);
}

// Linear layers and matmuls under autocast: bf16 products (f32 accumulation), f32
// gradients for the weight and bias, the input's gradient in its dtype.
TEST(Autocast, LinearLayersAndMatmulsRunInBf16) {
  Generator g(9);
  nn::Linear lin(16, 4, true, g);
  Tensor x = Tensor::randn({8, 16}, g).set_requires_grad(true);
  Tensor b = Tensor::randn({4, 3}, g).set_requires_grad(true);
  auto loss = [&](DType d, Tensor* y) {
    autograd::Autocast ac(d);
    *y = lin.forward(x);
    return fn::sum(fn::matmul(*y, b));
  };
  Tensor y32, y16;
  Tensor l32 = loss(DType::f32, &y32);
  l32.backward();
  const Tensor gw32 = lin.weight.grad().clone(), gx32 = x.grad().clone(), gb32 = b.grad().clone();
  for (Tensor* t : {&lin.weight, &lin.bias, &x, &b}) t->set_grad(Tensor());
  Tensor l16 = loss(DType::bf16, &y16);
  EXPECT_EQ(y16.dtype(), DType::bf16);
  EXPECT_EQ(l16.dtype(), DType::f32);
  l16.backward();
  for (const Tensor* t : {&lin.weight, &lin.bias, &x, &b}) EXPECT_EQ(t->grad().dtype(), DType::f32);
  EXPECT_LT(max_rel_diff(y16, y32), 2 * 0.0078125) << "x and w rounded to bf16, the product once";
  EXPECT_LT(max_rel_diff(lin.weight.grad(), gw32), 0.03);
  EXPECT_LT(max_rel_diff(x.grad(), gx32), 0.03);
  EXPECT_LT(max_rel_diff(b.grad(), gb32), 0.03);
}
