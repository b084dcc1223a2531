// Note [Winograd convolutions] (kernels/cpu/conv2d.cpp): which CPU convolutions run
// Winograd, and how close they stay to the reference, pass by pass.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "core/device.h"
#include "kernels/cpu/cpu.h"
#include "tests/op_cases.h"

using namespace eg;
using eg::testing::empty_like;
using eg::testing::empty_on;
using eg::testing::randn;

namespace {

ops::Conv2dParams params(int64_t stride, int64_t pad) {
  ops::Conv2dParams p;
  p.stride_h = p.stride_w = stride;
  p.pad_h = p.pad_w = pad;
  return p;
}

// Restores the process-wide setting whatever a test does.
struct WinogradSetting {
  bool was = cpu_winograd();
  explicit WinogradSetting(bool on) { set_cpu_winograd(on); }
  ~WinogradSetting() { set_cpu_winograd(was); }
};

bool winograd(const std::string& pass, const Shape& x, const Shape& w, const ops::Conv2dParams& p) {
  return cpu::conv2d_implementation(pass, x, w, p).find("wino") != std::string::npos;
}

// oneDNN's Winograd kernels need AVX-512 (its avx512_core: F, BW, VL, DQ). Asked of the
// CPU itself, not of oneDNN, so that a Winograd path that stopped being taken on a CPU
// that has them fails the tests below instead of looking like a CPU without them.
bool cpu_has_avx512_core() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

// Where Winograd is wanted it is used on an AVX-512 CPU, and the direct algorithm is used
// (no error) on any other; where it is not wanted, never.
TEST(ConvWinograd, UsedWhereItPaysOffAndNowhereElse) {
  const bool has = cpu_has_avx512_core();
  WinogradSetting on(true);
  const auto p = params(1, 1);
  for (const char* pass : {"fwd", "bwd_data", "bwd_weight"}) {
    EXPECT_EQ(winograd(pass, {8, 64, 8, 8}, {64, 64, 3, 3}, p), has) << pass << ": 64 channels";
    EXPECT_FALSE(winograd(pass, {8, 16, 32, 32}, {16, 16, 3, 3}, p)) << pass << ": 16 channels";
    EXPECT_FALSE(winograd(pass, {8, 64, 16, 16}, {64, 64, 3, 3}, params(2, 1))) << pass << ": stride 2";
    EXPECT_FALSE(winograd(pass, {8, 64, 8, 8}, {64, 64, 1, 1}, params(1, 0))) << pass << ": 1x1";
  }
  EXPECT_EQ(winograd("fwd", {8, 32, 16, 16}, {32, 32, 3, 3}, p), has);
  EXPECT_EQ(winograd("bwd_data", {8, 32, 16, 16}, {32, 32, 3, 3}, p), has);
  EXPECT_FALSE(winograd("bwd_weight", {8, 32, 16, 16}, {32, 32, 3, 3}, p)) << "slower than direct at 32 channels";
  EXPECT_EQ(winograd("fwd", {8, 64, 7, 7}, {64, 64, 3, 3}, p), has);
  EXPECT_FALSE(winograd("bwd_weight", {8, 64, 7, 7}, {64, 64, 3, 3}, p)) << "7x7: partly empty tiles";
  EXPECT_FALSE(winograd("fwd", {8, 16, 16, 16}, {64, 16, 3, 3}, p)) << "16 input channels";

  WinogradSetting off(false);
  for (const char* pass : {"fwd", "bwd_data", "bwd_weight"})
    EXPECT_FALSE(winograd(pass, {8, 64, 8, 8}, {64, 64, 3, 3}, p)) << pass << " with set_cpu_winograd(false)";
}

bool bf16_winograd(const std::string& pass, const Shape& x, const Shape& w, const ops::Conv2dParams& p) {
  return cpu::conv2d_implementation(pass, x, w, p, DType::bf16).find("wino") != std::string::npos;
}

// Note [bf16 weight gradients by Winograd]: a bf16 convolution's weight gradient runs the
// f32 Winograd kernel where an f32 one's would on planes up to 16x16; its other passes
// stay bf16.
TEST(ConvWinograd, Bf16WeightGradientsOfSmallPlanesTakeTheF32RuleAndNothingElseDoes) {
  const bool has = cpu_has_avx512_core();
  WinogradSetting on(true);
  const auto p = params(1, 1);
  EXPECT_EQ(bf16_winograd("bwd_weight", {8, 64, 8, 8}, {64, 64, 3, 3}, p), has);
  EXPECT_FALSE(bf16_winograd("bwd_weight", {8, 32, 16, 16}, {32, 32, 3, 3}, p));
  EXPECT_FALSE(bf16_winograd("bwd_weight", {8, 64, 7, 7}, {64, 64, 3, 3}, p)) << "7x7: partly empty tiles";
  EXPECT_FALSE(bf16_winograd("bwd_weight", {8, 64, 16, 16}, {64, 64, 3, 3}, params(2, 1))) << "stride 2";
  EXPECT_EQ(bf16_winograd("bwd_weight", {8, 128, 16, 16}, {128, 128, 3, 3}, p), has);
  EXPECT_FALSE(bf16_winograd("bwd_weight", {8, 64, 56, 56}, {64, 64, 3, 3}, p)) << "56x56: bf16 direct is faster";
  EXPECT_TRUE(winograd("bwd_weight", {8, 64, 56, 56}, {64, 64, 3, 3}, p) == has) << "f32 takes Winograd there";
  for (const char* pass : {"fwd", "bwd_data"}) EXPECT_FALSE(bf16_winograd(pass, {8, 64, 8, 8}, {64, 64, 3, 3}, p));
  WinogradSetting off(false);
  EXPECT_FALSE(bf16_winograd("bwd_weight", {8, 64, 8, 8}, {64, 64, 3, 3}, p));
}

// Largest |a - b| over the largest |b|.
double rel_err(const Tensor& a, const Tensor& b) {
  const auto va = a.to_plain().to_vector<float>(), vb = b.to_plain().to_vector<float>();
  double d = 0, m = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    d = std::max(d, std::abs(double(va[i]) - double(vb[i])));
    m = std::max(m, std::abs(double(vb[i])));
  }
  return d / m;
}

struct Passes {
  Tensor y, dx, dw;
};

Passes run(ops::Backend b, const Tensor& x, const Tensor& w, const Tensor& dy, const ops::Conv2dParams& p) {
  Passes r;
  r.y = empty_on(x, ops::conv2d_out_shape(x.shape(), w.shape(), p), x.dtype());
  ops::run(ops::conv2d_fwd, b, x, w, Tensor(), r.y, p);
  r.dx = empty_like(x);
  ops::run(ops::conv2d_bwd_data, b, dy, w, r.dx, p, false);
  r.dw = empty_like(w);
  Tensor db;
  ops::run(ops::conv2d_bwd_weight, b, dy, x, r.dw, db, p, false);
  return r;
}

// Each pass, Winograd and direct, against the reference (which sums in double). The
// bounds hold Winograd to within 10x of what the direct algorithm errs, and to 2e-5
// of the output's scale. Measured (64 and 32 channels): Winograd 1.4e-6 to 1.8e-6 in
// the forward and dx, direct 6e-7 to 9e-7; dw 9e-7 to 1e-6 either way. On a CPU
// without AVX-512 the setting must fall back to exactly the direct results.
TEST(ConvWinograd, EveryPassStaysCloseToTheReference) {
  const bool has = cpu_has_avx512_core();
  struct Case {
    Shape x, w;
  };
  for (const Case& c : {Case{{8, 64, 8, 8}, {64, 64, 3, 3}}, Case{{8, 32, 16, 16}, {32, 32, 3, 3}}}) {
    const auto p = params(1, 1);
    const Tensor x = randn(c.x, DType::f32, 1), w = randn(c.w, DType::f32, 2, 1.0 / std::sqrt(9.0 * double(c.w[1])));
    const Tensor dy = randn(ops::conv2d_out_shape(c.x, c.w, p), DType::f32, 3);
    const Passes ref = run(ops::Backend::ref, x, w, dy, p);
    Passes direct, wino;
    {
      WinogradSetting off(false);
      direct = run(ops::Backend::cpu, x, w, dy, p);
    }
    {
      WinogradSetting on(true);
      wino = run(ops::Backend::cpu, x, w, dy, p);
    }
    const std::string name = std::to_string(c.w[0]) + " channels: ";
    const double floor = 2e-7;  // what float rounding alone allows
    EXPECT_LE(rel_err(wino.y, ref.y), std::max(10 * rel_err(direct.y, ref.y), floor)) << name << "forward";
    EXPECT_LE(rel_err(wino.dx, ref.dx), std::max(10 * rel_err(direct.dx, ref.dx), floor)) << name << "dx";
    EXPECT_LE(rel_err(wino.dw, ref.dw), std::max(10 * rel_err(direct.dw, ref.dw), floor)) << name << "dw";
    EXPECT_LE(rel_err(wino.y, ref.y), 2e-5) << name;
    EXPECT_LE(rel_err(wino.dx, ref.dx), 2e-5) << name;
    EXPECT_LE(rel_err(wino.dw, ref.dw), 2e-5) << name;
    if (has) {
      EXPECT_GT(rel_err(wino.y, direct.y), 0.0) << name << "Winograd ran: its rounding is not direct's";
    } else {
      EXPECT_EQ(wino.y.to_plain().to_vector<float>(), direct.y.to_plain().to_vector<float>()) << name;
      EXPECT_EQ(wino.dx.to_plain().to_vector<float>(), direct.dx.to_plain().to_vector<float>()) << name;
    }
    std::printf("%s fwd %.2e (direct %.2e)  dx %.2e (%.2e)  dw %.2e (%.2e)\n", name.c_str(), rel_err(wino.y, ref.y),
                rel_err(direct.y, ref.y), rel_err(wino.dx, ref.dx), rel_err(direct.dx, ref.dx),
                rel_err(wino.dw, ref.dw), rel_err(direct.dw, ref.dw));
  }
}

}  // namespace
