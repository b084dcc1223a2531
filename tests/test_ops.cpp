// Runs the op table (tests/op_cases.h): parity of each backend against ref, and
// finite-difference gradcheck of the ref backward in f64. CUDA cases skip without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "autograd/functions.h"
#include "kernels/autotune.h"
#include "tests/op_cases.h"
#include "tests/test_util.h"

namespace eg::testing {
namespace {

struct Param {
  size_t index;
  ops::Backend backend;
};
void PrintTo(const Param& p, std::ostream* os) {
  *os << op_cases()[p.index].name << " on " << ops::backend_name(p.backend);
}

std::string case_id(const OpCase& c) {
  std::string s = c.name;
  for (char& ch : s)
    if (ch == '/') ch = '_';
  return s;
}

Tensors to_device(const Tensors& v, Device d) {
  Tensors r;
  for (auto& t : v) r.push_back(t.defined() ? t.to(d) : t);
  return r;
}

Tensors make_douts(const OpCase& c, const Tensors& out, uint64_t seed) {
  Tensors d(out.size());
  for (int k : c.diff_outputs) d[size_t(k)] = randn(out[size_t(k)].shape(), out[size_t(k)].dtype(), seed + uint64_t(k));
  return d;
}

class Parity : public ::testing::TestWithParam<Param> {};

TEST_P(Parity, MatchesRef) {
  const OpCase& c = op_cases()[GetParam().index];
  const ops::Backend b = GetParam().backend;
  Device dev = Device::cpu();
  if (b == ops::Backend::cuda) {
    if (!cuda_available()) GTEST_SKIP() << "no GPU present";
    dev = Device::cuda(0);
  }
  Tensors in = c.make_inputs(c.dtype);
  Tensors ref_out = c.forward(ops::Backend::ref, in);
  Tensors din = to_device(in, dev);
  Tensors got_out = c.forward(b, din);
  ASSERT_EQ(got_out.size(), ref_out.size());
  for (size_t k = 0; k < ref_out.size(); ++k) {
    if (!ref_out[k].defined()) continue;
    Compare cmp = compare(got_out[k], ref_out[k], c.fwd_tol);
    EXPECT_LE(cmp.worst_ratio, 1.0) << c.name << " forward output " << k << ": " << cmp.detail;
  }
  if (!c.backward) return;
  Tensors dout = make_douts(c, ref_out, 7777);
  Tensors ref_din = c.backward(ops::Backend::ref, in, ref_out, dout);
  Tensors got_din = c.backward(b, din, got_out, to_device(dout, dev));
  ASSERT_EQ(got_din.size(), ref_din.size());
  for (size_t j = 0; j < ref_din.size(); ++j) {
    if (!ref_din[j].defined()) continue;
    Compare cmp = compare(got_din[j], ref_din[j], c.bwd_tol);
    EXPECT_LE(cmp.worst_ratio, 1.0) << c.name << " gradient of input " << j << ": " << cmp.detail;
  }
}

double dot_outputs(const OpCase& c, const Tensors& out, const Tensors& dout) {
  double s = 0;
  for (int k : c.diff_outputs) {
    const Tensor& o = out[size_t(k)];
    const double* op = o.data<double>();
    const double* dp = dout[size_t(k)].data<double>();
    for (int64_t i = 0; i < o.numel(); ++i) s += op[i] * dp[i];
  }
  return s;
}

class Gradcheck : public ::testing::TestWithParam<size_t> {};

TEST_P(Gradcheck, RefBackwardMatchesFiniteDifferences) {
  const OpCase& c = op_cases()[GetParam()];
  Tensors in = c.make_inputs(DType::f64);
  Tensors out = c.forward(ops::Backend::ref, in);
  Tensors dout = make_douts(c, out, 4242);
  Tensors grads = c.backward(ops::Backend::ref, in, out, dout);
  ASSERT_EQ(grads.size(), in.size());
  int checked = 0;
  for (size_t j = 0; j < in.size(); ++j) {
    if (!grads[j].defined()) continue;
    ASSERT_EQ(in[j].dtype(), DType::f64) << "input " << j << " has a gradient but is not floating";
    Tensor numeric = Tensor::zeros(in[j].shape(), DType::f64);
    double* x = in[j].data<double>();
    const double h = 1e-6;
    for (int64_t e = 0; e < in[j].numel(); ++e) {
      const double saved = x[e];
      x[e] = saved + h;
      double lp = dot_outputs(c, c.forward(ops::Backend::ref, in), dout);
      x[e] = saved - h;
      double lm = dot_outputs(c, c.forward(ops::Backend::ref, in), dout);
      x[e] = saved;
      numeric.data<double>()[e] = (lp - lm) / (2 * h);
    }
    Compare cmp = compare(grads[j], numeric, c.grad_tol);
    EXPECT_LE(cmp.worst_ratio, 1.0) << c.name << " d/d input " << j << ": analytic vs numeric, " << cmp.detail;
    ++checked;
  }
  EXPECT_GT(checked, 0) << c.name << ": backward returned no gradient to check";
}

std::vector<Param> parity_params() {
  std::vector<Param> v;
  for (size_t i = 0; i < op_cases().size(); ++i)
    for (ops::Backend b : {ops::Backend::cpu, ops::Backend::cuda})
      if (op_cases()[i].supports(b)) v.push_back({i, b});
  return v;
}

std::vector<size_t> gradcheck_params() {
  std::vector<size_t> v;
  for (size_t i = 0; i < op_cases().size(); ++i)
    if (op_cases()[i].backward && op_cases()[i].gradcheck && op_cases()[i].dtype == DType::f32) v.push_back(i);
  return v;
}

INSTANTIATE_TEST_SUITE_P(Ops, Parity, ::testing::ValuesIn(parity_params()),
                         [](const ::testing::TestParamInfo<Param>& p) {
  return case_id(op_cases()[p.param.index]) + "_" + ops::backend_name(p.param.backend);
});
INSTANTIATE_TEST_SUITE_P(Ops, Gradcheck, ::testing::ValuesIn(gradcheck_params()),
                         [](const ::testing::TestParamInfo<size_t>& p) { return case_id(op_cases()[p.param]); });

// The ground truth itself: the first maximum on ties, a NaN never wins, a row of NaNs
// gives 0; the same through fn::argmax on the fast CPU path.
TEST(Argmax, FirstMaximumAndNaNsAsTorch) {
  const float nan = NAN;
  Tensor x = Tensor::from_vector<float>({1, 3, 3, 2, nan, 1, 5, nan, nan, nan, nan, nan, -1, -1, -2, -3}, {4, 4});
  const std::vector<int64_t> want = {1, 2, 0, 0};
  for (auto b : {ops::Backend::ref, ops::Backend::cpu}) {
    Tensor idx = Tensor::empty({4}, DType::s64);
    ops::run(ops::argmax_rows, b, x, idx);
    EXPECT_EQ(idx.to_vector<int64_t>(), want) << ops::backend_name(b);
  }
  EXPECT_EQ(fn::argmax(x.reshape({2, 2, 4})).shape(), (Shape{2, 2}));
  EXPECT_EQ(fn::argmax(x).to_vector<int64_t>(), want);
  EXPECT_THROW(fn::argmax(Tensor::empty({3, 0})), Error);
}

// ReLU's and ReLU6's gradients are a select, as torch's threshold_backward: outside the
// linear range dx is 0 even where dy is NaN or Inf (an fp16 overflow the loss scaler
// skips must not be turned into NaN weights by a mask), on every backend.
TEST(Act, ReluGradientsAreASelectAsTorch) {
  const float nan = NAN, inf = INFINITY;
  const Tensor x = Tensor::from_vector<float>({-1, 0, 3, 6, 7, 2}, {6});
  const Tensor dy = Tensor::from_vector<float>({nan, inf, 2, nan, -inf, nan}, {6});
  std::vector<ops::Backend> backends = {ops::Backend::ref, ops::Backend::cpu};
  if (cuda_available()) backends.push_back(ops::Backend::cuda);
  for (ops::Backend b : backends) {
    const Device dev = b == ops::Backend::cuda ? Device::cuda(0) : Device::cpu();
    for (ops::Act a : {ops::Act::relu, ops::Act::relu6}) {
      Tensor dx = Tensor::empty({6}, DType::f32, dev);
      ops::run(ops::act_bwd, b, a, dy.to(dev), x.to(dev), dx);
      const std::vector<float> got = dx.to(Device::cpu()).to_vector<float>();
      const std::string what = std::string(ops::backend_name(b)) + (a == ops::Act::relu ? " relu" : " relu6");
      EXPECT_EQ(got[0], 0.f) << what;
      EXPECT_EQ(got[1], 0.f) << what;
      EXPECT_EQ(got[2], 2.f) << what;
      if (a == ops::Act::relu) {
        EXPECT_TRUE(std::isnan(got[3])) << what;  // inside relu's range: dy as it is
        EXPECT_EQ(got[4], -inf) << what;
      } else {
        EXPECT_EQ(got[3], 0.f) << what;
        EXPECT_EQ(got[4], 0.f) << what;
      }
      EXPECT_TRUE(std::isnan(got[5])) << what;
    }
  }
}

TEST(Autotune, TheLowestMedianOfThreeTimingsWinsAndOneOffTimingsDoNot) {
  const size_t kMiB = size_t(1) << 20, limit = 256 * kMiB;
  using T = std::vector<AlgoTiming>;
  // Algorithm 1 is fastest once (a lucky timing), 2 in the median; 0 slowed by its first
  // launch once. Each trial lists by its own times, as cudnnFind* does.
  const std::vector<T> trials = {
      {{1, true, 0.5f, 0}, {2, true, 0.9f, 0}, {0, true, 3.0f, 0}},
      {{2, true, 0.8f, 0}, {0, true, 1.0f, 0}, {1, true, 1.5f, 0}},
      {{2, true, 0.9f, 0}, {0, true, 1.0f, 0}, {1, true, 1.4f, 0}},
  };
  EXPECT_EQ(fastest_by_median(trials, limit), 2);
  EXPECT_EQ(fastest_by_median({trials[0]}, limit), 1);  // one trial: its own fastest
  // Not fitting the workspace, failing in one trial, or missing from one: never chosen.
  std::vector<T> big = trials;
  big[1][0].memory = 300 * kMiB;
  EXPECT_EQ(fastest_by_median(big, limit), 0);
  std::vector<T> failed = trials;
  failed[2][0].ok = false;
  EXPECT_EQ(fastest_by_median(failed, limit), 0);
  std::vector<T> missing = trials;
  missing[1].erase(missing[1].begin());
  EXPECT_EQ(fastest_by_median(missing, limit), 0);
  // An algorithm listed twice in a trial (one entry per math mode) counts once there.
  std::vector<T> twice = trials;
  for (T& t : twice) t.push_back({2, true, 5.0f, 0});
  EXPECT_EQ(fastest_by_median(twice, limit), 2);
  // Equal medians: the first trial's order.
  const std::vector<T> tie = {{{3, true, 1.f, 0}, {4, true, 1.f, 0}}, {{4, true, 1.f, 0}, {3, true, 1.f, 0}}};
  EXPECT_EQ(fastest_by_median(tie, limit), 3);
  // None that qualifies, or nothing timed.
  std::vector<T> none = trials;
  for (T& t : none)
    for (AlgoTiming& a : t) a.ok = false;
  EXPECT_EQ(fastest_by_median(none, limit), -1);
  EXPECT_EQ(fastest_by_median({}, limit), -1);
}

TEST(OpTable, EveryOpHasParityAndGradcheckCases) {
  // Every op in kernels/ops.h is called by at least one case (parity on every
  // backend it has), and by a gradchecked case unless it has no derivative.
  const std::vector<std::string> no_derivative = {
      "sgd_step",         "adamw_step",  "sgd_step_multi", "adamw_step_multi", "amp_unscale",
      "amp_update_scale", "sum_squares", "clip_coef",      "scale_by",         "cast",
      "sp_gram",          "sp_loss",     "argmax_rows",    "token_mask",       "image_normalize"};
  std::string missing, unchecked;
#define EG_CHECK_CASE(name, Fn)                                                                        \
  {                                                                                                    \
    bool found = false, checked = false;                                                               \
    for (auto& c : op_cases())                                                                         \
      for (auto& u : c.uses)                                                                           \
        if (std::string(u.op) == #name) {                                                              \
          found = true;                                                                                \
          checked |= c.gradcheck && bool(c.backward);                                                  \
        }                                                                                              \
    if (!found) missing += #name " ";                                                                  \
    bool exempt = std::find(no_derivative.begin(), no_derivative.end(), #name) != no_derivative.end(); \
    if (found && !checked && !exempt) unchecked += #name " ";                                          \
  }
  EG_OP_LIST(EG_CHECK_CASE)
#undef EG_CHECK_CASE
  EXPECT_TRUE(missing.empty()) << "ops with no case in the op table: " << missing;
  EXPECT_TRUE(unchecked.empty()) << "ops never gradchecked: " << unchecked;
}

}  // namespace
}  // namespace eg::testing

namespace eg::testing {
// Note [Blocked activations]: gradient accumulation and scaling across formats, and an
// op without a blocked implementation handed a blocked input.
TEST(BlockedFormat, AxpyScaleAndPlainOnlyOpsConvert) {
  const Shape s{2, 16, 3, 4};
  Tensor x = randn(s, DType::f32, 1), y = randn(s, DType::f32, 2);
  std::vector<float> want(size_t(x.numel()));
  for (size_t i = 0; i < want.size(); ++i) want[i] = y.to_vector<float>()[i] + 2.f * x.to_vector<float>()[i];
  for (bool xb : {false, true})
    for (bool yb : {false, true}) {
      Tensor xs = xb ? x.to_format(Format::nchw16c) : x;
      Tensor ys = yb ? y.to_format(Format::nchw16c) : y.clone();
      ops::run(ops::axpy, ops::Backend::cpu, xs, ys, 2.0);
      EXPECT_EQ(ys.is_blocked(), yb) << "axpy keeps y's format";
      EXPECT_EQ(ys.to_vector<float>(), want) << "x blocked " << xb << ", y blocked " << yb;
    }
  Tensor b = x.to_format(Format::nchw16c);
  ops::run(ops::scale, ops::Backend::cpu, b, b, -1.0);
  EXPECT_TRUE(b.is_blocked());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(b.to_vector<float>()[i], -x.to_vector<float>()[i]);
  Tensor pooled = Tensor::empty({2, 16}), pooled_ref = Tensor::empty({2, 16});
  ops::call(ops::global_avgpool_fwd, x.to_format(Format::nchw16c), pooled);
  ops::call(ops::global_avgpool_fwd, x, pooled_ref);
  EXPECT_EQ(pooled.to_vector<float>(), pooled_ref.to_vector<float>());
  Tensor out = Tensor::empty({2, 16}).to_format(Format::plain);
  Tensor bad = Tensor::empty(s).to_format(Format::nchw16c);  // a blocked output for a plain-only op
  EXPECT_THROW(ops::call(ops::global_avgpool_bwd, out, bad), Error);
}
}  // namespace eg::testing

namespace eg::testing {
// Note [int8 convolution pipeline]: the int8 reference's CPU NHWC tensors convert both
// ways, stay NHWC through the elementwise ops and the batch norm forwards, and reach the
// CPU ops that do not take them (a global average pool) as plain copies, with the plain
// input's results; a convolution of 8 output channels takes NHWC and writes plain.
TEST(NhwcOnTheCpu, ElementwiseOpsKeepItAndTheOthersGetPlainCopies) {
  const Shape s{2, 32, 3, 5};
  const Tensor x = randn(s, DType::f32, 1), y = randn(s, DType::f32, 2);
  const Tensor xn = x.to_format(Format::nhwc), yn = y.to_format(Format::nhwc);
  EXPECT_EQ(xn.format(), Format::nhwc);
  EXPECT_EQ(xn.to_vector<float>(), x.to_vector<float>());
  EXPECT_EQ(xn.to_format(Format::nchw16c).to_vector<float>(), x.to_vector<float>());
  EXPECT_EQ(x.to_format(Format::nchw16c).to_format(Format::nhwc).to_vector<float>(), x.to_vector<float>());
  Tensor want_sum = Tensor::empty(s), want_act = Tensor::empty(s);
  ops::run(ops::binary_fwd, ops::Backend::cpu, ops::Binary::add, x, y, want_sum);
  ops::run(ops::act_fwd, ops::Backend::cpu, ops::Act::relu6, x, want_act);
  for (const Format fy : {Format::nhwc, Format::plain, Format::nchw16c}) {
    Tensor sum = Tensor::empty(s);
    ops::run(ops::binary_fwd, ops::Backend::cpu, ops::Binary::add, xn, y.to_format(fy), sum);
    EXPECT_EQ(sum.format(), Format::nhwc) << int(fy);
    EXPECT_EQ(sum.to_vector<float>(), want_sum.to_vector<float>()) << int(fy);
  }
  Tensor act = Tensor::empty(s);
  ops::run(ops::act_fwd, ops::Backend::cpu, ops::Act::relu6, xn, act);
  EXPECT_EQ(act.format(), Format::nhwc);
  EXPECT_EQ(act.to_vector<float>(), want_act.to_vector<float>());
  Tensor acc = yn.clone();
  ops::run(ops::axpy, ops::Backend::cpu, x, acc, 2.0);
  EXPECT_EQ(acc.format(), Format::nhwc) << "axpy keeps y's format";
  for (int64_t i = 0; i < x.numel(); ++i)
    EXPECT_EQ(acc.to_vector<float>()[size_t(i)],
              y.to_vector<float>()[size_t(i)] + 2.f * x.to_vector<float>()[size_t(i)]);
  const Tensor w = randn({8, 32, 3, 3}, DType::f32, 3), gamma = randn({32}, DType::f32, 4),
               beta = randn({32}, DType::f32, 5), rm = randn({32}, DType::f32, 6), rv = Tensor::full({32}, 1.5);
  ops::Conv2dParams p;
  p.pad_h = p.pad_w = 1;
  Tensor c1 = Tensor::empty({2, 8, 3, 5}), c2 = Tensor::empty({2, 8, 3, 5});
  ops::run(ops::conv2d_fwd, ops::Backend::cpu, x, w, Tensor(), c1, p);
  ops::run(ops::conv2d_fwd, ops::Backend::cpu, xn, w, Tensor(), c2, p);
  EXPECT_EQ(c2.format(), Format::plain) << "a convolution takes NHWC as it comes; 8 channels are written plain";
  EXPECT_EQ(c2.to_vector<float>(), c1.to_vector<float>());
  // Batch norm forwards keep NHWC: inference bit for bit as on plain (the same scale and
  // shift per element), training with the statistics summed in another order.
  Tensor b1 = Tensor::empty(s), b2 = Tensor::empty(s);
  ops::run(ops::batchnorm_fwd_infer, ops::Backend::cpu, xn, gamma, beta, rm, rv, b2, 1e-5, ops::BnAct::relu, yn);
  ops::run(ops::batchnorm_fwd_infer, ops::Backend::cpu, x, gamma, beta, rm, rv, b1, 1e-5, ops::BnAct::relu, y);
  EXPECT_EQ(b2.format(), Format::nhwc);
  EXPECT_EQ(b2.to_vector<float>(), b1.to_vector<float>());
  Tensor g1 = Tensor::empty({2, 32}), g2 = Tensor::empty({2, 32});
  ops::call(ops::global_avgpool_fwd, x, g1);
  ops::call(ops::global_avgpool_fwd, xn, g2);
  EXPECT_EQ(g2.to_vector<float>(), g1.to_vector<float>());
}

// Note [Activation layouts follow the convolutions]: with NHWC chosen (forced here; what the
// automatic choice gives where oneDNN's convolutions pick it, on AMX), a convolution's output
// and dx are NHWC, its weight gradient reads NHWC x and dy as they come, and the batch norm
// backward takes and gives NHWC; each as the blocked path computes it (the same sums in
// another order: different oneDNN kernels, f32 and bf16), with the fused ReLU and the
// residual's gradient.
TEST(NhwcOnTheCpu, ForcedConvolutionsWriteItAndTheBatchNormBackwardTakesIt) {
  for (const DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    const double tol = dt == DType::bf16 ? 2e-2 : 1e-4;
    const Shape xs{4, 16, 6, 6}, ys{4, 32, 6, 6};
    const Tensor x = randn(xs, dt, 11), w = randn({32, 16, 3, 3}, dt, 12, 0.2), dy = randn(ys, dt, 13);
    ops::Conv2dParams p;
    p.pad_h = p.pad_w = 1;
    auto passes = [&](CpuLayout l) {
      const CpuLayoutSetting setting(l);
      Tensor y = Tensor::empty(ys, dt), dx = Tensor::empty(xs, dt), dw = Tensor::empty(w.shape(), DType::f32);
      ops::call(ops::conv2d_fwd, x, w, Tensor(), y, p);
      ops::call(ops::conv2d_bwd_data, dy.to_format(y.format()), w, dx, p, false);
      Tensor db;
      ops::call(ops::conv2d_bwd_weight, dy.to_format(y.format()), x.to_format(dx.format()), dw, db, p, false);
      return std::vector<Tensor>{y, dx, dw};
    };
    const auto blocked = passes(CpuLayout::blocked), nhwc = passes(CpuLayout::nhwc);
    EXPECT_EQ(blocked[0].format(), Format::nchw16c);
    EXPECT_EQ(nhwc[0].format(), Format::nhwc) << "y";
    EXPECT_EQ(nhwc[1].format(), Format::nhwc) << "dx";
    const char* names[] = {"y", "dx", "dw"};
    for (size_t k = 0; k < 3; ++k) {
      const auto a = nhwc[k].to(DType::f32).to_vector<float>(), b = blocked[k].to(DType::f32).to_vector<float>();
      double scale = 0;
      for (float v : b) scale = std::max(scale, double(std::fabs(v)));
      for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], tol * scale) << names[k] << " [" << i << "]";
    }

    const Tensor gamma = randn({32}, DType::f32, 14), mean = randn({32}, DType::f32, 15),
                 invstd = Tensor::full({32}, 0.8), yv = nhwc[0];
    Tensor ry = Tensor::empty(ys, dt);  // the fused ReLU's output
    ops::call(ops::act_fwd, ops::Act::relu, yv, ry);
    auto bwd = [&](Format f) {
      Tensor dxb = Tensor::empty(ys, dt), dg = Tensor::empty({32}), dbeta = Tensor::empty({32}),
             dres = Tensor::empty(ys, dt);
      ops::run(ops::batchnorm_bwd, ops::Backend::cpu, dy.to_format(f), yv.to_format(f), gamma, mean, invstd, dxb, dg,
               dbeta, true, ops::BnAct::relu, ry.to_format(f), dres, false);
      return std::vector<Tensor>{dxb, dg, dbeta, dres};
    };
    const auto plain = bwd(Format::plain), channels_last = bwd(Format::nhwc);
    EXPECT_EQ(channels_last[0].format(), Format::nhwc);
    EXPECT_EQ(channels_last[3].format(), Format::nhwc);
    const char* bn_names[] = {"dx", "dgamma", "dbeta", "dresidual"};
    for (size_t k = 0; k < 4; ++k) {
      const auto a = channels_last[k].to(DType::f32).to_vector<float>(), b = plain[k].to(DType::f32).to_vector<float>();
      double scale = 0;
      for (float v : b) scale = std::max(scale, double(std::fabs(v)));
      for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], tol * scale) << bn_names[k] << " [" << i << "]";
    }
  }
}

// The batch norm forward on each batch's statistics (the int8 reference's ReferenceBn::batch)
// takes NHWC as it comes and writes NHWC: the plain loops' statistics and output to float
// rounding, for channels that are a multiple of 16 and that are not (MobileNetV2's 24),
// with the fused activation and residual, and with the running statistics updated alike.
TEST(NhwcOnTheCpu, TheTrainingBatchNormForwardMatchesThePlainOne) {
  for (const Shape& s : {Shape{4, 32, 5, 7}, Shape{3, 24, 6, 6}, Shape{2, 8, 1, 1}}) {
    const int64_t C = s[1];
    const Tensor x = randn(s, DType::f32, 7, 2.0), r = randn(s, DType::f32, 8);
    const Tensor gamma = randn({C}, DType::f32, 9), beta = randn({C}, DType::f32, 10);
    for (const ops::BnAct act : {ops::BnAct::none, ops::BnAct::relu6}) {
      for (const bool residual : {false, true}) {
        auto run = [&](const Tensor& xin, const Tensor& rin) {
          Tensor y = Tensor::empty(s), mean = Tensor::empty({C}), invstd = Tensor::empty({C});
          Tensor rm = Tensor::zeros({C}), rv = Tensor::full({C}, 1.0);
          ops::run(ops::batchnorm_fwd_train, ops::Backend::cpu, xin, gamma, beta, y, mean, invstd, rm, rv, 0.1, 1e-5,
                   act, residual ? rin : Tensor());
          return std::vector<Tensor>{y, mean, invstd, rm, rv};
        };
        const auto want = run(x, r), got = run(x.to_format(Format::nhwc), r.to_format(Format::nhwc));
        EXPECT_EQ(got[0].format(), Format::nhwc);
        const char* names[] = {"y", "mean", "invstd", "running mean", "running var"};
        for (size_t k = 0; k < want.size(); ++k) {
          const auto a = got[k].to_vector<float>(), b = want[k].to_vector<float>();
          for (size_t i = 0; i < a.size(); ++i)
            EXPECT_NEAR(a[i], b[i], 2e-5 * (1 + std::abs(b[i])))
                << names[k] << " [" << i << "], shape " << shape_str(s) << ", residual " << residual;
        }
      }
    }
  }
}
}  // namespace eg::testing

namespace eg::testing {
// Note [Pooling in the convolutions' layout]: max and average pooling take NHWC and nChw16c
// inputs as they come and write their outputs (and max pooling its indices) in the same
// layout; backward, max pooling's dx comes in the forward's layout (its indices') whatever
// dy's, average pooling's in dy's. Max pooling gives the
// plain kernel's outputs, indices and gradients exactly, f32 and bf16; average pooling
// (oneDNN's kernels of each layout) to float rounding.
TEST(NhwcOnTheCpu, PoolingTakesItAndTheBlockedLayoutAsTheyCome) {
  struct Case {
    const char* name;
    Shape x;
    ops::Pool2dParams p;
  };
  auto params = [](ops::PoolKind k, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw,
                   bool incl = false) { return ops::Pool2dParams{k, kh, kw, sh, sw, ph, pw, incl}; };
  const std::vector<Case> cases = {
      {"max 3x3 s2 pad1 (a ResNet stem's)", {2, 32, 9, 9}, params(ops::PoolKind::max, 3, 3, 2, 2, 1, 1)},
      {"max 2x2 s2", {3, 16, 6, 8}, params(ops::PoolKind::max, 2, 2, 2, 2, 0, 0)},
      {"max 2x3 s1x3 pad1", {2, 16, 5, 9}, params(ops::PoolKind::max, 2, 3, 1, 3, 1, 1)},
      {"avg 3x3 s2 pad1, padding counted", {2, 32, 7, 7}, params(ops::PoolKind::avg, 3, 3, 2, 2, 1, 1, true)},
      {"avg 3x3 s2 pad1, padding not counted", {2, 16, 7, 6}, params(ops::PoolKind::avg, 3, 3, 2, 2, 1, 1)},
  };
  for (const DType dt : {DType::f32, DType::bf16})
    for (const Case& c : cases)
      for (const Format f : {Format::nhwc, Format::nchw16c}) {
        SCOPED_TRACE(std::string(c.name) + ", " + dtype_name(dt) + (f == Format::nhwc ? ", NHWC" : ", nChw16c"));
        const bool max = c.p.kind == ops::PoolKind::max;
        const Shape ys = ops::pool2d_out_shape(c.x, c.p);
        // bf16 rounds some neighbours equal: both kernels give a tie to the window's first
        // maximum in row-major order, so indices and gradients still agree exactly.
        const Tensor x = randn(c.x, dt, 21);
        const Tensor dy = randn(ys, dt, 22);
        auto pass = [&](const Tensor& xin, const Tensor& dyin, bool want_indices = true) {
          Tensor y = Tensor::empty(ys, dt), idx, dx = Tensor::empty(c.x, dt);
          if (max && want_indices) idx = Tensor::empty(ys, DType::s32);
          ops::run(ops::pool2d_fwd, ops::Backend::cpu, xin, y, idx, c.p);
          if (max && !want_indices) return std::vector<Tensor>{y};
          ops::run(ops::pool2d_bwd, ops::Backend::cpu, dyin, idx, dx, c.p);
          return std::vector<Tensor>{y, dx, idx};
        };
        const auto plain = pass(x, dy);
        for (const Format fdy : {f, Format::plain}) {
          const auto got = pass(x.to_format(f), dy.to_format(fdy));
          EXPECT_EQ(got[0].format(), f) << "y";
          // Max pooling's indices keep the forward's layout; average pooling follows dy's.
          EXPECT_EQ(got[1].format(), max ? f : fdy) << "dx, dy " << (fdy == f ? "in the same layout" : "plain");
          const char* names[] = {"y", "dx"};
          for (size_t k = 0; k < 2; ++k) {
            const auto a = got[k].to(DType::f32).to_vector<float>(), b = plain[k].to(DType::f32).to_vector<float>();
            if (max) {
              ASSERT_EQ(a, b) << names[k];
              continue;
            }
            const double tol = dt == DType::bf16 ? 1e-2 : 1e-6;
            for (size_t i = 0; i < a.size(); ++i)
              ASSERT_NEAR(a[i], b[i], tol * (1 + std::abs(b[i]))) << names[k] << " [" << i << "]";
          }
          if (max) {
            EXPECT_EQ(got[2].format(), f) << "indices";
            EXPECT_EQ(got[2].to_vector<int32_t>(), plain[2].to_vector<int32_t>()) << "indices";
          }
        }
        if (max) {  // no indices asked for (inference)
          const auto y = pass(x.to_format(f), dy, false);
          EXPECT_EQ(y[0].to(DType::f32).to_vector<float>(), plain[0].to(DType::f32).to_vector<float>());
        }
      }
}

// Note [bf16 kernels]: bf16 activations stay nChw16c between the ops that take bf16 (a
// convolution's output, batch norm and ReLU through it), on the fast path; an op that
// does not take bf16 refuses it on the CPU rather than reading its bytes as f32.
TEST(Bf16Kernels, BlockedBetweenOpsThatTakeThemAndRefusedByOthers) {
  Tensor x = randn({2, 16, 5, 5}, DType::bf16, 1), w = randn({32, 16, 3, 3}, DType::bf16, 2, 0.1);
  ops::Conv2dParams p;
  p.pad_h = p.pad_w = 1;
  Tensor y = Tensor::empty({2, 32, 5, 5}, DType::bf16);
  ops::call(ops::conv2d_fwd, x, w, Tensor(), y, p);
  EXPECT_TRUE(y.is_blocked()) << "a bf16 convolution output of 32 channels is held nChw16c";
  Tensor r = Tensor::empty(y.shape(), DType::bf16);
  ops::call(ops::act_fwd, ops::Act::relu, y, r);
  EXPECT_TRUE(r.is_blocked());
  EXPECT_EQ(r.dtype(), DType::bf16);
  const std::vector<float> yv = y.to(DType::f32).to_vector<float>(), rv = r.to(DType::f32).to_vector<float>();
  for (size_t i = 0; i < yv.size(); ++i) ASSERT_EQ(rv[i], yv[i] > 0 ? yv[i] : 0.f) << i;
  Tensor sum = Tensor::empty({1, 32, 1, 1}, DType::bf16);
  try {
    ops::call(ops::sum_to, r, sum);
    FAIL() << "sum_to read a bf16 tensor";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sum_to has no bf16 implementation"), std::string::npos) << e.what();
  }
}
}  // namespace eg::testing
