// autograd/: the engine, grad mode, needs_input_grad, saved-tensor release, retain_graph.
#include <gtest/gtest.h>

#include <functional>
#include <map>

#include "autograd/autocast.h"
#include "autograd/functions.h"
#include "autograd/gradcheck.h"
#include "layers/layers.h"
#include "models/model.h"
#include "optim/optimizer.h"

using namespace eg;

namespace {
Tensor param(const Shape& s, uint64_t seed, DType dt = DType::f64) {
  Generator g(seed);
  return Tensor::randn(s, g, dt).set_requires_grad(true);
}
}  // namespace

TEST(Autograd, SimpleChainRule) {
  Tensor x = Tensor::from_vector<double>({1, 2, 3}, {3}).set_requires_grad(true);
  Tensor y = fn::sum(fn::mul(x, x));  // d/dx = 2x
  y.backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{2, 4, 6}));
  // Gradients accumulate across backward calls, as in PyTorch.
  fn::sum(fn::scale(x, 3.0)).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{5, 7, 9}));
}

TEST(Autograd, DeepGraphDoesNotOverflowTheStack) {
  Tensor x = Tensor::ones({4}, DType::f64).set_requires_grad(true);
  Tensor h = x;
  for (int i = 0; i < 100000; ++i) h = fn::scale(h, 1.0);
  fn::sum(h).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>(4, 1.0)));
}

TEST(Autograd, NoGradGuardRecordsNothing) {
  Tensor w = param({4, 3}, 1);
  Tensor x = param({2, 3}, 2);
  {
    autograd::NoGradGuard ng;
    Tensor y = fn::linear(x, w, Tensor());
    EXPECT_FALSE(y.requires_grad());
    EXPECT_EQ(autograd::graph_size(y), 0u);
  }
  Tensor y = fn::linear(x, w, Tensor());
  EXPECT_TRUE(y.requires_grad());
  EXPECT_GT(autograd::graph_size(y), 0u);
}

TEST(Autograd, FrozenWeightGetsNoGradientButInputDoes) {
  // Note [Frozen layers skip weight gradients]: the weight's edge is absent, so the
  // backward never allocates or computes dw.
  Tensor x = param({2, 3, 6, 6}, 3);
  Tensor w = param({4, 3, 3, 3}, 4);
  w.set_requires_grad(false);
  Tensor y = fn::conv2d(x, w, Tensor(), {});
  fn::sum(y).backward();
  EXPECT_TRUE(x.grad().defined());
  EXPECT_FALSE(w.grad().defined());
}

TEST(Autograd, SavedTensorsAreReleasedAfterBackward) {
  Tensor x = param({64}, 5);
  std::weak_ptr<Storage> saved;
  Tensor y;
  {
    Tensor h = fn::mul(x, x);  // h is saved by the next mul
    saved = h.impl().storage;
    y = fn::sum(fn::mul(h, h));
  }
  EXPECT_FALSE(saved.expired());  // the graph holds it until backward
  y.backward();
  EXPECT_TRUE(saved.expired());
  EXPECT_THROW(y.backward(), Error);  // graph freed: a second backward is an error
}

TEST(Autograd, RetainGraphAllowsASecondBackward) {
  Tensor x = Tensor::from_vector<double>({2}, {1}).set_requires_grad(true);
  Tensor y = fn::sum(fn::mul(x, x));
  y.backward(Tensor(), /*retain_graph=*/true);
  y.backward();
  EXPECT_DOUBLE_EQ(x.grad().item(), 8.0);
}

TEST(Autograd, BackwardOnNonScalarNeedsAGradient) {
  Tensor x = param({3}, 6);
  Tensor y = fn::scale(x, 2.0);
  EXPECT_THROW(y.backward(), Error);
  y.backward(Tensor::ones({3}, DType::f64));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>(3, 2.0)));
  Tensor c = Tensor::ones({1});
  EXPECT_THROW(c.backward(), Error);  // nothing requires grad
}

TEST(Autograd, BroadcastingGradientsSumOverBroadcastDims) {
  Tensor a = param({2, 3}, 7), b = param({3}, 8);
  auto r = autograd::gradcheck(
      [](const std::vector<Tensor>& in) {
    return fn::div(fn::mul(fn::add(in[0], in[1]), in[1]), fn::add(in[1], in[1]));
      },
      {a, b});
  EXPECT_TRUE(r.ok) << r.detail;
}

// A residual block's end fused into the batch norm: gradients reach x, gamma, beta and
// the residual (through the activation's mask, or straight through without one), in
// training and inference mode. The residual is scaled by 4 so that ReLU6's cap is taken.
TEST(Autograd, BatchNormWithResidualGradcheck) {
  for (ops::BnAct act : {ops::BnAct::relu, ops::BnAct::relu6, ops::BnAct::none})
    for (bool training : {true, false}) {
      Tensor x = param({3, 2, 3, 4}, 21), g = param({2}, 22), b = param({2}, 23), r = param({3, 2, 3, 4}, 24);
      auto f = [&](const std::vector<Tensor>& in) {
        Tensor rm = Tensor::zeros({2}, DType::f64), rv = Tensor::ones({2}, DType::f64);
        Tensor y = fn::batch_norm(in[0], in[1], in[2], rm, rv, training, 0.1, 1e-5, act, fn::scale(in[3], 4.0));
        return fn::sum(fn::mul(y, y));
      };
      auto res = autograd::gradcheck(f, {x, g, b, r}, 1e-6, 1e-6, 1e-3);
      EXPECT_TRUE(res.ok) << "act " << int(act) << " training " << training << ": " << res.detail;
    }
  Tensor x = param({3, 2, 3, 4}, 21), g = param({2}, 22), b = param({2}, 23);
  Tensor rm = Tensor::zeros({2}, DType::f64), rv = Tensor::ones({2}, DType::f64);
  EXPECT_THROW(fn::batch_norm(x, g, b, rm, rv, true, 0.1, 1e-5, ops::BnAct::relu, param({3, 2, 4, 3}, 25)), Error);
}

TEST(Autograd, CompositeGradcheckConvBnReluLinearCrossEntropy) {
  Tensor x = param({4, 2, 5, 5}, 9);
  Tensor w = param({3, 2, 3, 3}, 10), g = param({3}, 11), bta = param({3}, 12);
  Tensor lw = param({5, 27}, 13), lb = param({5}, 14);
  Tensor target = Tensor::from_vector<int64_t>({0, 4, 2, 1}, {4});
  auto f = [&](const std::vector<Tensor>& in) {
    Tensor rm = Tensor::zeros({3}, DType::f64), rv = Tensor::ones({3}, DType::f64);
    Tensor h = fn::conv2d(in[0], in[1], Tensor(), {2, 2, 1, 1, 1, 1, 1});
    h = fn::relu(fn::batch_norm(h, in[2], in[3], rm, rv, true, 0.1, 1e-5));
    Tensor logits = fn::linear(fn::reshape(h, {4, 27}), in[4], in[5]);
    return fn::cross_entropy(logits, target, 0.1);
  };
  auto r = autograd::gradcheck(f, {x, w, g, bta, lw, lb}, 1e-6, 1e-6, 1e-3);
  EXPECT_TRUE(r.ok) << r.detail;
}

// Note [Gradient destinations]: a backward whose convolutions add their input gradients
// into the residual terms already there and whose layers add their parameters' gradients
// into .grad in the optimizer's buckets computes the gradients of the backward that adds
// them separately, bit for bit (on the CPU the kernels compute, then add), in f32 and
// under bf16 autocast. ResNet-20: 9 adds fewer (its blocks) and no axpy; transformer-tiny
// (embeddings, linear layers, layer norms, autocast's casts): no add (21 before) and no
// axpy but those that replace a cast (a bf16 gradient added into an f32 sum in one pass).
TEST(Autograd, GradientsAddedWhereTheyLiveKeepTheirBits) {
  struct Run {
    std::vector<std::vector<uint8_t>> grads;
    std::map<std::string, int> ops;
    int count(const std::string& op) const { return ops.count(op) ? ops.at(op) : 0; }
  };
  // The parameters' gradients after two backward passes of `loss()` (the second adds into
  // .grad holding the first's), and the ops the second ran.
  auto run = [](models::Model& m, optim::Optimizer& opt, const std::function<Tensor()>& loss, bool destinations) {
    autograd::set_gradient_destinations(destinations);
    opt.zero_grad();
    loss().backward();
    const Tensor l = loss();
    Run r;
    {
      ops::OpRecorder rec;
      l.backward();
      for (const auto& o : rec.records()) ++r.ops[o.op];
    }
    autograd::set_gradient_destinations(true);
    for (const Tensor& p : m.parameters()) {
      const Tensor gr = p.grad().to_plain();
      const auto* b = static_cast<const uint8_t*>(gr.raw_any());
      r.grads.emplace_back(b, b + gr.nbytes());
    }
    return r;
  };
  for (DType precision : {DType::f32, DType::bf16}) {
    const std::string what = dtype_name(precision);
    {
      models::ModelConfig mc;
      mc.name = "resnet20";
      mc.image_size = 16;
      mc.small_input = true;
      mc.num_classes = 10;
      Generator g(3);
      auto m = models::build_model(mc, g);
      optim::SGD opt(m->parameters(), 0.05);
      const Tensor x = Tensor::randn({4, 3, 16, 16}, g);
      const Tensor y = Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 3}, {4});
      auto loss = [&] {
        autograd::Autocast ac(precision);
        return fn::cross_entropy(m->forward(x), y);
      };
      const Run off = run(*m, opt, loss, false), on = run(*m, opt, loss, true);
      ASSERT_EQ(off.grads.size(), on.grads.size());
      for (size_t i = 0; i < off.grads.size(); ++i)
        EXPECT_EQ(off.grads[i], on.grads[i]) << "resnet20 " << what << " parameter " << i;
      EXPECT_EQ(off.count("binary_fwd") - on.count("binary_fwd"), 9) << what;
      EXPECT_EQ(off.count("axpy"), int(m->parameters().size())) << what;
      EXPECT_EQ(on.count("axpy"), 0) << what;
      EXPECT_EQ(on.count("cast"), off.count("cast")) << what;
    }
    {
      models::ModelConfig mc;
      mc.name = "transformer-tiny";
      Generator g(3);
      auto m = models::build_model(mc, g);
      m->eval();  // no dropout: both backward passes see one forward's values
      optim::AdamW opt(m->parameters(), 1e-3);
      std::vector<int64_t> v(24);
      for (size_t i = 0; i < v.size(); ++i) v[i] = 4 + int64_t(i * 7 % size_t(mc.vocab - 4));
      const Tensor src = Tensor::from_vector(v, {4, 6}), tgt = src, y = src.reshape({24});
      auto loss = [&] {
        autograd::Autocast ac(precision);
        Tensor logits = m->forward_frozen(src, tgt, 0);
        return fn::cross_entropy(fn::reshape(logits, {24, logits.size(2)}), y);
      };
      const Run off = run(*m, opt, loss, false), on = run(*m, opt, loss, true);
      ASSERT_EQ(off.grads.size(), on.grads.size());
      for (size_t i = 0; i < off.grads.size(); ++i)
        EXPECT_EQ(off.grads[i], on.grads[i]) << "transformer-tiny " << what << " parameter " << i;
      EXPECT_GE(off.count("axpy"), int(m->parameters().size())) << what;  // a shared table's once a use
      EXPECT_EQ(off.count("binary_fwd"), 21) << what;
      EXPECT_EQ(on.count("binary_fwd"), 0) << what;
      EXPECT_EQ(on.count("axpy"), off.count("cast") - on.count("cast")) << what;
    }
  }
}

// The CPU's vectorised exp (kernels/cpu/softmax.cpp) keeps what libm's gave: a NaN logit
// that is not the target still makes the loss NaN (so the run stops before it saves), its
// gradient too, and a -inf logit weighs nothing (0 with AVX-512, a denormal with AVX2).
// Rows of 37: wider than a vector, with a tail.
TEST(Autograd, CrossEntropyAndSoftmaxKeepNaNAndMinusInfinity) {
  std::vector<float> v(2 * 37);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.1f * float(i % 11);
  v[20] = NAN;  // row 0, whose target is 3
  v[37 + 5] = -INFINITY;  // row 1
  Tensor logits = Tensor::from_vector(v, {2, 37}).set_requires_grad(true);
  Tensor loss = fn::cross_entropy(logits, Tensor::from_vector<int64_t>({3, 1}, {2}));
  EXPECT_TRUE(std::isnan(loss.item()));
  loss.backward();
  const std::vector<float> g = logits.grad().to_vector<float>();
  EXPECT_TRUE(std::isnan(g[0]) || std::isnan(g[20])) << "row 0's gradient";
  const std::vector<float> row1(v.begin() + 37, v.end());
  const std::vector<float> p = fn::softmax(Tensor::from_vector(row1, {1, 37})).to_vector<float>();
  EXPECT_LE(p[5], 1e-37f);
  double s = 0;
  for (float x : p) s += x;
  EXPECT_NEAR(s, 1.0, 1e-6);
  const std::vector<float> lp = fn::log_softmax(Tensor::from_vector(row1, {1, 37})).to_vector<float>();
  EXPECT_TRUE(std::isinf(lp[5]) && lp[5] < 0);
}
