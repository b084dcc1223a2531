// layers/: validation at the boundary, state dicts, freezing, attention.
#include <gtest/gtest.h>

#include <cmath>

#include "autograd/functions.h"
#include "autograd/gradcheck.h"
#include "layers/attention.h"
#include "layers/layers.h"
#include "optim/optimizer.h"
#include "tests/test_util.h"

using namespace eg;

namespace {
using eg::testing::error_of;
}  // namespace

TEST(Layers, Conv2dNamesAShapeMismatch) {
  nn::Conv2d conv(3, 8, 3);
  std::string msg = error_of([&] { conv(Tensor::zeros({2, 4, 8, 8})); });
  EXPECT_NE(msg.find("expected input [N, 3, H, W], got [2, 4, 8, 8]"), std::string::npos) << msg;
  EXPECT_THROW(nn::Conv2d(3, 8, 3, {1, 0, 1, 2}), Error);  // 3 channels do not split in 2 groups
  nn::Linear lin(5, 2);
  msg = error_of([&] { lin(Tensor::zeros({3, 4})); });
  EXPECT_NE(msg.find("last dimension is 4 but the layer expects 5"), std::string::npos) << msg;
}

TEST(Layers, StateDictRoundTripAndMismatchErrors) {
  manual_seed(1);
  nn::Sequential a({std::make_shared<nn::Conv2d>(1, 2, 3), std::make_shared<nn::BatchNorm2d>(2)});
  manual_seed(2);
  nn::Sequential b({std::make_shared<nn::Conv2d>(1, 2, 3), std::make_shared<nn::BatchNorm2d>(2)});
  auto sd = a.state_dict();
  EXPECT_EQ(sd.size(), 6u);  // conv weight+bias, bn weight+bias+running_mean+running_var
  EXPECT_TRUE(sd.count("0.weight") && sd.count("1.running_var"));
  b.load_state_dict(sd);
  EXPECT_EQ(b.state_dict()["0.weight"].to_vector<float>(), sd["0.weight"].to_vector<float>());
  auto bad = sd;
  bad["0.weight"] = Tensor::zeros({2, 1, 5, 5});
  std::string msg = error_of([&] { b.load_state_dict(bad); });
  EXPECT_NE(msg.find("'0.weight' has shape [2, 1, 5, 5] but this model expects [2, 1, 3, 3]"), std::string::npos)
      << msg;
  bad = sd;
  bad.erase("1.bias");
  EXPECT_THROW(b.load_state_dict(bad), Error);
  bad = sd;
  bad["2.weight"] = Tensor::zeros({1});
  EXPECT_THROW(b.load_state_dict(bad), Error);
}

TEST(Layers, FrozenParametersStayBitwiseUnchangedAndResumeMomentum) {
  manual_seed(3);
  auto conv = std::make_shared<nn::Conv2d>(2, 4, 3);
  auto bn = std::make_shared<nn::BatchNorm2d>(4);
  auto head = std::make_shared<nn::Linear>(4 * 4 * 4, 3);
  nn::Sequential model({conv, bn, nn::ReLU(), std::make_shared<nn::Flatten>(), head});
  optim::SGD opt(model.parameters(), 0.1, {0.9, 0.0, 5e-4, false});
  Generator g(4);
  Tensor x = Tensor::randn({8, 2, 6, 6}, g);
  Tensor y = Tensor::from_vector<int64_t>({0, 1, 2, 0, 1, 2, 0, 1}, {8});
  auto step = [&] {
    opt.zero_grad();
    fn::cross_entropy(model(x), y).backward();
    opt.step();
  };
  step();  // momentum buffers exist now
  conv->freeze();
  bn->freeze();
  auto w0 = conv->weight.to_vector<float>();
  auto rm0 = bn->running_mean.to_vector<float>();
  auto h0 = head->weight.to_vector<float>();
  for (int i = 0; i < 5; ++i) step();
  EXPECT_EQ(conv->weight.to_vector<float>(), w0);  // no weight decay or momentum leak
  EXPECT_EQ(bn->running_mean.to_vector<float>(), rm0);  // Note [Frozen BatchNorm semantics]
  EXPECT_NE(head->weight.to_vector<float>(), h0);
  conv->unfreeze();
  bn->unfreeze();
  step();
  EXPECT_NE(conv->weight.to_vector<float>(), w0);
}

// --freeze-bn batch: a frozen BatchNorm keeps batch statistics and updates its running
// ones (PyTorch's requires_grad_(False)); its gamma and beta still get no gradient.
TEST(Layers, FrozenBatchNormCanKeepBatchStatistics) {
  Generator g(5);
  Tensor x = Tensor::randn({16, 3, 4, 4}, g);
  x = fn::add(fn::mul(x, Tensor::full({1}, 3.0f)), Tensor::full({1}, 2.0f));  // mean 2, sd 3: far from running (0, 1)
  for (bool batch : {false, true}) {
    nn::BatchNorm2d bn(3);
    bn.frozen_batch_stats = batch;
    bn.freeze();
    const auto rm0 = bn.running_mean.to_vector<float>();
    Tensor y = bn(x);
    EXPECT_EQ(bn.running_mean.to_vector<float>() != rm0, batch);
    const auto v = y.to_vector<float>();
    double mean = 0;
    for (float f : v) mean += f;
    mean /= double(v.size());
    if (batch) {
      EXPECT_NEAR(mean, 0.0, 1e-4) << "normalised with the batch's statistics";
    } else {
      EXPECT_NEAR(mean, 2.0, 0.5) << "normalised with the running statistics (0, 1)";
    }
    EXPECT_FALSE(bn.weight.requires_grad());
  }
}

// Note [Settling a frozen BatchNorm]: while settling, a BatchNorm frozen on running
// statistics normalises with each batch's statistics (as an unfrozen one in training mode,
// bit for bit) and its running statistics become the plain average of the settled batches'
// (mean, unbiased variance), whatever they held before; once settling ends it normalises
// with them and leaves them alone.
TEST(Layers, ASettlingFrozenBatchNormAveragesItsBatchesStatistics) {
  Generator g(7);
  std::vector<Tensor> xs;
  for (int i = 0; i < 3; ++i) {  // per-batch means and spreads far apart, and from the running (0, 1)
    Tensor x = Tensor::randn({8, 2, 3, 3}, g);
    xs.push_back(fn::add(fn::mul(x, Tensor::full({1}, float(1 + i))), Tensor::full({1}, float(5 * i - 4))));
  }
  nn::BatchNorm2d bn(2), plain(2);
  for (int64_t c = 0; c < 2; ++c) bn.running_mean.data<float>()[c] = 7.0f, bn.running_var.data<float>()[c] = 9.0f;
  bn.freeze();
  bn.settling = 0;
  autograd::NoGradGuard ng;
  std::vector<double> want_mean(2, 0), want_var(2, 0);
  for (const Tensor& x : xs) {
    EXPECT_EQ(bn(x).to_vector<float>(), plain(x).to_vector<float>()) << "the batch's statistics";
    const auto v = x.to_vector<float>();
    for (int64_t c = 0; c < 2; ++c) {
      double s = 0, ss = 0;
      int64_t n = 0;
      for (int64_t b = 0; b < 8; ++b)
        for (int64_t k = 0; k < 9; ++k, ++n) s += v[size_t((b * 2 + c) * 9 + k)];
      const double m = s / double(n);
      for (int64_t b = 0; b < 8; ++b)
        for (int64_t k = 0; k < 9; ++k) ss += std::pow(v[size_t((b * 2 + c) * 9 + k)] - m, 2);
      want_mean[size_t(c)] += m / 3;
      want_var[size_t(c)] += ss / double(n - 1) / 3;
    }
  }
  EXPECT_EQ(bn.settling, 3);
  for (int64_t c = 0; c < 2; ++c) {
    EXPECT_NEAR(bn.running_mean.to_vector<float>()[size_t(c)], want_mean[size_t(c)], 1e-4);
    EXPECT_NEAR(bn.running_var.to_vector<float>()[size_t(c)], want_var[size_t(c)], 1e-4);
  }
  bn.settling = -1;
  const auto rm = bn.running_mean.to_vector<float>();
  EXPECT_NE(bn(xs[0]).to_vector<float>(), plain(xs[0]).to_vector<float>()) << "settled: running statistics";
  EXPECT_EQ(bn.running_mean.to_vector<float>(), rm);
}

// An inference copy with eval_batch_stats (the reference of --freeze-reference-bn batch)
// normalises each batch with its own statistics, as training mode does, bit for bit,
// and leaves its running statistics as they were.
TEST(Layers, AnEvalBatchNormCanNormaliseWithTheBatchsStatistics) {
  Generator g(6);
  Tensor x = Tensor::randn({16, 3, 4, 4}, g);
  x = fn::add(fn::mul(x, Tensor::full({1}, 3.0f)), Tensor::full({1}, 2.0f));  // far from the running (0, 1)
  nn::BatchNorm2d training(3), copy(3);
  copy.eval();
  copy.eval_batch_stats = true;
  copy.fused_act = training.fused_act = ops::BnAct::relu;
  autograd::NoGradGuard ng;
  const auto want = training(x).to_vector<float>();
  EXPECT_EQ(copy(x).to_vector<float>(), want);
  EXPECT_EQ(copy.running_mean.to_vector<float>(), std::vector<float>(3, 0.f));
  EXPECT_EQ(copy.running_var.to_vector<float>(), std::vector<float>(3, 1.f));
  copy.eval_batch_stats = false;
  EXPECT_NE(copy(x).to_vector<float>(), want) << "without it, eval mode's running statistics (so the test can tell)";
}

// A batch norm with its activation fused (ResNet's ReLU, MobileNetV2's ReLU6) computes
// act(bn(x)) and its gradients: the values of a batch norm and the activation module
// after it, bit for bit, in f32 and in bf16 (whose 32 channels run the blocked loops on the
// CPU), with one pass each way instead of two. gamma = 4 puts ~13% of the outputs past
// ReLU6's 6.
TEST(Layers, BatchNormWithAFusedActivationIsBatchNormThenTheActivation) {
  for (const ops::BnAct act : {ops::BnAct::relu, ops::BnAct::relu6}) {
    for (const DType dt : {DType::f32, DType::bf16}) {
      for (const int64_t c : {3, 32}) {
        SCOPED_TRACE(::testing::Message() << "act " << int(act) << ", " << dtype_name(dt) << ", " << c << " channels");
        Generator g(4);
        const Tensor x0 = Tensor::randn({4, c, 5, 5}, g).to(dt);
        auto run = [&](bool fused) {
          nn::BatchNorm2d bn(c);
          bn.weight.copy_(Tensor::full({c}, 4.0));
          bn.fused_act = fused ? act : ops::BnAct::none;
          Tensor x = x0.clone().set_requires_grad(true);
          auto after = act == ops::BnAct::relu ? nn::ReLU() : nn::ReLU6();
          Tensor y = fused ? bn(x) : after->forward(bn(x));
          fn::sum(fn::mul(y, y)).backward();
          return std::vector<Tensor>{y.detach(), x.grad(), bn.weight.grad(), bn.bias.grad(), bn.running_var};
        };
        const auto a = run(true), b = run(false);
        for (size_t i = 0; i < a.size(); ++i) {
          ASSERT_EQ(a[i].numel(), b[i].numel());
          const std::vector<float> u = a[i].to(DType::f32).to_vector<float>(),
                                   v = b[i].to(DType::f32).to_vector<float>();
          for (size_t k = 0; k < u.size(); ++k) EXPECT_EQ(u[k], v[k]) << i << " " << k;
        }
        int64_t zero = 0, six = 0;
        for (float y : a[0].to(DType::f32).to_vector<float>()) zero += y == 0.f, six += y == 6.f;
        EXPECT_GT(zero, 0);
        if (act == ops::BnAct::relu6) {
          EXPECT_GT(six, 0) << "the cap is taken";
        }
      }
    }
  }
  EXPECT_EQ(nn::BatchNorm2d(3).type_name(), "BatchNorm2d");
  nn::BatchNorm2d fused(3);
  fused.fused_act = ops::BnAct::relu;
  EXPECT_EQ(fused.type_name(), "BatchNorm2d+ReLU");
  fused.fused_act = ops::BnAct::relu6;
  EXPECT_EQ(fused.type_name(), "BatchNorm2d+ReLU6");
}

TEST(Layers, MultiHeadAttentionGradcheck) {
  Generator g(5);
  nn::MultiHeadAttention mha(8, 2, 0.0, g);
  for (auto& [n, p] : mha.named_parameters()) {
    Tensor d = p.to(DType::f64);
    p.impl().storage = d.impl().storage;
    p.impl().dtype = DType::f64;
  }
  Tensor q = Tensor::randn({2, 3, 8}, g, DType::f64).set_requires_grad(true);
  Tensor mask = Tensor::from_vector<uint8_t>({0, 0, 1, 0, 0, 0}, {2, 3});
  auto r =
      autograd::gradcheck([&](const std::vector<Tensor>& in) { return mha.forward(in[0], in[0], in[0], mask, false); },
                          {q}, 1e-6, 1e-6, 1e-3);
  EXPECT_TRUE(r.ok) << r.detail;
  Tensor out = mha.forward(q, q, q, Tensor(), true);
  EXPECT_EQ(out.shape(), (Shape{2, 3, 8}));
}

TEST(Layers, ADropoutWhoseGeneratorIsGoneSaysSoInsteadOfReadingFreedMemory) {
  auto g = std::make_unique<Generator>(7);
  Generator copy = *g;  // a copy lives on its own
  nn::Dropout d(0.5, *g), from_copy(0.5, copy);
  const Tensor x = Tensor::ones({4, 64});
  const auto values = [](const Tensor& t) { return t.to_vector<float>(); };
  const std::vector<float> y = values(d(x));  // draws from g, which is there
  EXPECT_EQ(y, values(from_copy(x)));  // the copy draws what g would
  EXPECT_NE(y, values(x));  // some dropped, the rest scaled
  g.reset();
  const std::string msg = error_of([&] { d(x); });
  EXPECT_NE(msg.find("the Generator it was built with"), std::string::npos) << msg;
  EXPECT_NE(msg.find("has been destroyed"), std::string::npos) << msg;
  EXPECT_NO_THROW(from_copy(x));  // its own generator is still there
  d.eval();  // draws nothing: no generator needed
  EXPECT_EQ(values(d(x)), values(x));
  nn::Dropout none(0.0, copy);
  EXPECT_EQ(values(none(x)), values(x));
}

// PyTorch's `layer.weight = nn.Parameter(...)` habit: here a reassigned field would be
// used by forward while the optimizer, state dicts and device moves keep the registered
// tensor, so a training forward refuses it; writing into the parameter is the way.
TEST(Layers, AReassignedParameterFieldIsAnErrorInTraining) {
  nn::Linear lin(4, 3);
  const Tensor x = Tensor::ones({2, 4});
  lin.weight.copy_(Tensor::zeros({3, 4}));  // in place: the registered tensor itself
  EXPECT_NO_THROW(lin(x));
  lin.weight = Tensor::zeros({3, 4});
  std::string msg = error_of([&] { lin(x); });
  EXPECT_NE(msg.find("Linear: its weight was replaced by another tensor"), std::string::npos) << msg;
  lin.eval();  // an inference copy may carry its own tensors (the references' folded weights)
  EXPECT_NO_THROW(lin(x));
  nn::Conv2d conv(2, 2, 3, {1, 1, 1, 1, true});
  conv.bias = Tensor::zeros({2});
  msg = error_of([&] { conv(Tensor::ones({1, 2, 4, 4})); });
  EXPECT_NE(msg.find("Conv2d: its bias was replaced"), std::string::npos) << msg;
  nn::BatchNorm2d bn(2);
  bn.weight = Tensor::ones({2});
  EXPECT_NE(error_of([&] {
              bn(Tensor::ones({2, 2, 3, 3}));
            }).find("BatchNorm2d: its weight was replaced"),
            std::string::npos);
  nn::LayerNorm ln(4);
  ln.bias = Tensor::zeros({4});
  EXPECT_NE(error_of([&] { ln(x); }).find("LayerNorm: its bias was replaced"), std::string::npos);
  nn::Sequential seq({std::make_shared<nn::Linear>(4, 3)});
  EXPECT_EQ(seq[0]->type_name(), "Linear");
  EXPECT_NE(error_of([&] { seq[1]; }).find("Sequential: no module 1 (it has 1)"), std::string::npos);
}

TEST(Layers, WindowLargerThanInputIsAnError) {
  nn::Conv2d conv(1, 1, 3, {2, 0, 1, 1, false});
  EXPECT_THROW(conv(Tensor::zeros({1, 1, 2, 2})), Error);
  auto pool = nn::MaxPool2d(3, 2);
  EXPECT_THROW((*pool)(Tensor::zeros({1, 1, 2, 2})), Error);
  EXPECT_EQ(conv(Tensor::zeros({1, 1, 5, 5})).shape(), (Shape{1, 1, 2, 2}));
}
