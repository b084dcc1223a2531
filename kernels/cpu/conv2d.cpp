// 2-D convolution, fast CPU path: oneDNN 2.6 convolution_forward /
// convolution_backward_data / convolution_backward_weights (bias gradient fused).
// Layout: weights are plain OIHW (goihw for groups) and reordered into the primitive's
// layout each call; activations come and go in the layout Note [Activation layouts follow
// the convolutions] below chooses (nChw16c on AVX-512, NHWC for AMX's bf16 kernels, plain
// NCHW otherwise), and where a tensor's layout is not the primitive's, it is reordered in
// and out around the call through per-thread scratch buffers. f32, and bf16 with f32
// accumulation (Note [bf16 kernels] in kernels/ops.h; oneDNN's avx512_core_bf16 kernels
// where the CPU has them, AMX where it has that), f32 dw and db.
//
// Napkin math (ResNet-56, batch 128, 16 channels at 32x32, 3x3, pad 1): one pass is
// 2*N*K*P*Q*C*R*S = 604 MFLOP. Measured on one AVX-512 core (oneDNN 2.6): the blocked
// JIT kernels run 160-200 GFLOP/s (~3.5 ms a pass) while the plain NCHW path falls
// back to im2col+GEMM at 30-50 GFLOP/s (fwd+bwd 49 ms vs 10.4 ms). Reordering one 8 MB
// activation costs ~0.37 ms and fwd+bwd needs six, so blocked-plus-reorders (~12.6 ms)
// still wins ~4x. See Note [Conv layouts] below and bench/bench_conv_overhead.cpp.
#include <algorithm>
#include <cstdlib>
#include <memory>
#include <unordered_map>
#include <vector>

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/onednn.h"

namespace eg::cpu {

namespace {

using dnnl::memory;
using Tag = memory::format_tag;
constexpr auto kF32 = memory::data_type::f32;

// Note [Conv layouts]
// Tensors stay NCHW everywhere else in egeria (autograd, BN, activations), so a
// convolution that wants blocked layouts pays a reorder of each activation on the way
// in and out. That is still far cheaper than oneDNN's NCHW convolutions, which are
// GEMM-based and, for weight gradients with few channels, very slow (the 16-channel
// ResNet-56 layer: 22 ms on one core vs 3.5 ms blocked, and 0.5 s with 2 threads on a
// busy machine). Weights are tiny and reordered every call, so an optimizer step never
// has to know about blocked layouts. Measured cost of the reorders on fwd+bwd, one
// core: +39% over blocked-only execution at 16 channels x 32x32, +9% at 32 x 16x16, +6%
// at 64 x 8x8 (bench/bench_conv_overhead.cpp, onednn_blocked/).
// Those reorders were 20% of a ResNet-56 step, so activations with C % 16 == 0 now stay
// in nChw16c between convolutions (Note [Blocked activations], core/tensor.h): a conv
// writes its output (and dx) blocked whenever the tensor can be, and takes x and dy in
// whatever format they come. The plain-NCHW reorders remain for C % 16 != 0.

// Per-thread scratch for blocked copies of operands: a few 64-byte-aligned buffers that
// only grow. Kernels on one thread run one at a time and wait on the stream before
// returning, so every plan on the thread can share them.
void* scratch(size_t slot, size_t bytes) {
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  struct Buf {
    std::unique_ptr<void, Free> p;
    size_t n = 0;
  };
  thread_local std::vector<Buf> bufs;
  if (bufs.size() <= slot) bufs.resize(slot + 1);
  Buf& b = bufs[slot];
  if (b.n < bytes) {
    b.p.reset();
    b.n = (bytes + 63) / 64 * 64;
    b.p.reset(std::aligned_alloc(64, b.n));
    EG_CHECK(b.p, "conv2d: out of memory for a ", b.n, "-byte scratch buffer");
  }
  return b.p.get();
}

// One tensor argument of a primitive: its plain layout, the layout the primitive chose,
// and the reorder between them (user -> prim for inputs, prim -> user for outputs);
// no reorder when the two agree.
struct Operand {
  int arg;
  bool output;
  memory::desc user, prim;
  dnnl::reorder reorder;
};

Operand operand(int arg, bool output, const memory::desc& user, const memory::desc& prim) {
  Operand o{arg, output, user, prim, {}};
  if (!(user == prim)) {
    auto& e = onednn::engine();
    o.reorder = output ? dnnl::reorder(dnnl::reorder::primitive_desc(e, prim, e, user))
                       : dnnl::reorder(dnnl::reorder::primitive_desc(e, user, e, prim));
  }
  return o;
}

struct Plan {
  dnnl::primitive prim;
  std::vector<Operand> operands;
};

// Runs a plan on tensors given in the order of plan.operands (undefined: not passed).
void execute(const Plan& plan, const std::vector<const Tensor*>& tensors) {
  auto& s = onednn::stream();
  std::unordered_map<int, memory> args;
  std::vector<std::pair<memory, memory>> write_back;  // (prim, user)
  size_t slot = 0;
  for (size_t i = 0; i < plan.operands.size(); ++i) {
    const Operand& o = plan.operands[i];
    if (!tensors[i]->defined()) continue;
    memory user = onednn::wrap(*tensors[i], o.user);
    if (!o.reorder) {
      args.emplace(o.arg, user);
      continue;
    }
    memory blocked(o.prim, onednn::engine(), scratch(slot++, o.prim.get_size()));
    if (o.output) write_back.emplace_back(blocked, user);
    else o.reorder.execute(s, user, blocked);
    args.emplace(o.arg, blocked);
  }
  plan.prim.execute(s, args);
  for (size_t i = 0, w = 0; i < plan.operands.size(); ++i) {
    const Operand& o = plan.operands[i];
    if (o.output && o.reorder && tensors[i]->defined()) {
      o.reorder.execute(s, write_back[w].first, write_back[w].second);
      ++w;
    }
  }
  s.wait();
}

using DT = memory::data_type;
DT dt_of(const Tensor& t) { return t.dtype() == DType::bf16 ? DT::bf16 : kF32; }
const char* dt_key(DT d) { return d == DT::bf16 ? "|bf16" : ""; }

// The element types of a convolution's three tensors: its input (x, or dx), its weights
// (or dw) and its output (y, or dy).
struct Types {
  DT x = kF32, w = kF32, y = kF32;
  std::string key() const { return std::string(dt_key(x)) + dt_key(w) + dt_key(y); }
};

memory::desc plain(const Shape& s, Tag tag, DT d = kF32) { return {onednn::dims(s), d, tag}; }
// The user-side descriptor of an activation, in the format the tensor is in.
memory::desc user(const Tensor& t) { return plain(t.shape(), onednn::tag_of(t.format()), dt_of(t)); }
const char* fmt(const Tensor& t) { return t.format() == Format::nchw16c ? "|B" : t.is_blocked() ? "|N" : "|P"; }
memory::desc any(const memory::dims& d, DT t) { return {d, t, Tag::any}; }

// Note [Activation layouts follow the convolutions]
// Which layout a convolution's output (and its dx) is written in, cpu_layout() deciding
// (core/device.h). automatic: the layout the primitive picks for it (format_tag::any),
// asked once per shape with the plans: NHWC where oneDNN's kernels want it (its AMX bf16
// convolutions, brgconv:avx512_core_amx_bf16, take acdb), so that the kernels between
// convolutions (batch norm, activations, residual adds, gradient sums: kernels/registry.cpp)
// take it as it comes and no reorder wraps the call; otherwise nChw16c where the channels
// allow (Note [Blocked activations]; what the AVX-512 kernels without AMX pick for every
// shape we run, a padded nChw16c for MobileNetV2's 24 channels, which we keep plain) and
// plain NCHW elsewhere. blocked: the rule before, whatever the CPU. nhwc: NHWC everywhere,
// the primitives asked for NHWC kernels (no Winograd: it is blocked only); for tests on a
// CPU whose kernels pick blocked, and to compare the two where both run.
bool forced_nhwc() { return cpu_layout() == CpuLayout::nhwc; }
// An activation's descriptor for a primitive: any, or NHWC where forced.
memory::desc activation_desc(const memory::dims& d, DT t) { return {d, t, forced_nhwc() ? Tag::nhwc : Tag::any}; }
// Keys of plans made with forced NHWC descriptors.
const char* layout_key() { return forced_nhwc() ? "|Lnhwc" : ""; }

// out's layout, given what the primitive picked for it (picked(), asked only where it decides).
template <class Picked>
void choose_format(Tensor& out, Picked picked) {
  Format f = out.blockable() ? Format::nchw16c : Format::plain;
  if (cpu_layout() == CpuLayout::nhwc && out.nhwc_capable()) {
    f = Format::nhwc;
  } else if (cpu_layout() == CpuLayout::automatic && out.nhwc_capable()) {
    const memory::desc d = picked();
    if (d == memory::desc(d.dims(), d.data_type(), Tag::nhwc)) f = Format::nhwc;
  }
  out.set_format(f);
}

// Weights as oneDNN sees them: [K, C/g, R, S] oihw, or [g, K/g, C/g, R, S] goihw.
memory::dims weight_dims(const Shape& w, int64_t groups) {
  if (groups == 1) return onednn::dims(w);
  return {groups, w[0] / groups, w[1], w[2], w[3]};
}
memory::desc weight_plain(const Shape& w, int64_t groups, DT d) {
  return {weight_dims(w, groups), d, groups == 1 ? Tag::oihw : Tag::goihw};
}

struct Geometry {
  memory::dims strides, dilates, pad;  // oneDNN dilation is ours minus one
};
Geometry geometry(const ops::Conv2dParams& p) {
  return {{p.stride_h, p.stride_w}, {p.dil_h - 1, p.dil_w - 1}, {p.pad_h, p.pad_w}};
}

std::string key(const char* kind, const Shape& x, const Shape& w, const Shape& y, const ops::Conv2dParams& p,
                bool bias) {
  return std::string(kind) + "|" + onednn::key_of(x) + "|" + onednn::key_of(w) + "|" + onednn::key_of(y) + "|" +
         std::to_string(p.stride_h) + "," + std::to_string(p.stride_w) + "," + std::to_string(p.pad_h) + "," +
         std::to_string(p.pad_w) + "," + std::to_string(p.dil_h) + "," + std::to_string(p.dil_w) + "," +
         std::to_string(p.groups) + (bias ? "|b" : "");
}

// Note [Winograd convolutions]
// oneDNN 2.6 has Winograd F(4x4, 3x3) convolutions for f32 on AVX-512
// (jit_wino_4x3:avx512_core): 36 multiplications per 4x4 output tile and channel pair
// instead of 144, for transforms of the input, weights and output. Measured on this
// project's 2-core AVX-512 machines at batch 128, ms per step for all the 3x3 stride-1
// convolutions of a stage, direct -> Winograd (ONEDNN_VERBOSE; ResNet-56 on 32x32
// inputs, medians of 3 steps; ResNet-20 on 28x28 Fashion-MNIST, sums over 15 steps):
//
//   channels x size   forward          backward data    backward weights
//   16 x 32x32        50.8 -> 63.2     40.4 -> 67.1     44.6 -> 69.2
//   32 x 16x16        35.8 -> 28.5     37.1 -> 25.2     39.5 -> 47.2
//   64 x  8x8         36.8 -> 18.9     38.9 -> 17.7     37.9 -> 31.2
//   32 x 14x14        93.3 -> 92.4    100.1 -> 82.7     (direct)
//   64 x  7x7         89.3 -> 64.9     90.5 -> 60.7     92.4 -> 98.2
//
// The transforms only pay off with enough channels to amortise them, and the weight
// gradient, which transforms two activations, needs more, and whole 4x4 tiles. So
// Winograd is used for 3x3, stride 1, undilated, ungrouped convolutions whose input and
// output channels are both at least 32 (forward, backward data), or at least 64 with an
// output of whole 4x4 tiles (backward weights), when cpu_winograd() is on and oneDNN has
// it on this CPU; otherwise, and for everything else, the direct algorithm (the
// step times that chose these bounds are in docs/DESIGN.md). Its rounding differs from the direct
// algorithm's (tests/test_conv_winograd.cpp bounds it), not its determinism: the choice
// depends on shapes alone, so a run and its resumption compute the same.
enum class Pass { fwd, bwd_data, bwd_weights };

// y: the output's (dy's) shape. oneDNN has no bf16 Winograd.
bool winograd_wanted(const Shape& y, const Shape& w, const ops::Conv2dParams& p, Pass pass, DT x) {
  if (!cpu_winograd() || x != kF32 || p.groups != 1 || w[2] != 3 || w[3] != 3 || p.stride_h != 1 || p.stride_w != 1 ||
      p.dil_h != 1 || p.dil_w != 1)
    return false;
  const int64_t channels = std::min(w[0], w[1]);
  if (pass != Pass::bwd_weights) return channels >= 32;
  return channels >= 64 && y[2] % 4 == 0 && y[3] % 4 == 0;  // no partly empty 4x4 tiles
}

// The forward primitive descriptor: the plan for the forward pass and the hint for
// both backward passes (made with the backward pass's algorithm).
dnnl::convolution_forward::primitive_desc fwd_pd(const Shape& x, const Shape& w, const Shape& y,
                                                 const ops::Conv2dParams& p, bool bias, dnnl::algorithm alg, Types t) {
  const Geometry g = geometry(p);
  const memory::desc xm = activation_desc(onednn::dims(x), t.x), wm = any(weight_dims(w, p.groups), t.w),
                     ym = activation_desc(onednn::dims(y), t.y);
  using Fwd = dnnl::convolution_forward;
  auto d = bias ? Fwd::desc(dnnl::prop_kind::forward_training, alg, xm, wm, plain({w[0]}, Tag::x), ym, g.strides,
                            g.dilates, g.pad, g.pad)
                : Fwd::desc(dnnl::prop_kind::forward_training, alg, xm, wm, ym, g.strides, g.dilates, g.pad, g.pad);
  return Fwd::primitive_desc(d, onednn::engine());
}

// make(alg) with Winograd where it is wanted and oneDNN has it, else direct.
template <class Make>
auto with_algorithm(bool winograd, Make make) -> decltype(make(dnnl::algorithm::convolution_direct)) {
  if (winograd) {
    try {
      return make(dnnl::algorithm::convolution_winograd);
    } catch (const dnnl::error&) {
      // unimplemented on this CPU or for this shape: the direct algorithm below
    }
  }
  return make(dnnl::algorithm::convolution_direct);
}

const char* wino_key(bool winograd) { return winograd ? "|W" : ""; }

// The primitive descriptors of the three passes, with the algorithm Note [Winograd
// convolutions] chooses.
dnnl::convolution_forward::primitive_desc fwd_plan_pd(const Shape& x, const Shape& w, const Shape& y,
                                                      const ops::Conv2dParams& p, bool bias, Types t) {
  return with_algorithm(winograd_wanted(y, w, p, Pass::fwd, t.x),
                        [&](dnnl::algorithm a) { return fwd_pd(x, w, y, p, bias, a, t); });
}

// The backward passes' forward hint: the low-precision forward they differentiate.
Types hint(Types t) { return {t.y, t.y, t.y}; }

dnnl::convolution_backward_data::primitive_desc bwd_data_pd(const Shape& dx, const Shape& w, const Shape& dy,
                                                            const ops::Conv2dParams& p, Types t) {
  const Geometry g = geometry(p);
  using Bwd = dnnl::convolution_backward_data;
  return with_algorithm(winograd_wanted(dy, w, p, Pass::bwd_data, t.y), [&](dnnl::algorithm a) {
    Bwd::desc d(a, activation_desc(onednn::dims(dx), t.x), any(weight_dims(w, p.groups), t.w),
                activation_desc(onednn::dims(dy), t.y), g.strides, g.dilates, g.pad, g.pad);
    return Bwd::primitive_desc(d, onednn::engine(), fwd_pd(dx, w, dy, p, false, a, hint(t)));
  });
}

dnnl::convolution_backward_weights::primitive_desc bwd_weight_pd(const Shape& x, const Shape& dw, const Shape& dy,
                                                                 const ops::Conv2dParams& p, bool bias, Types t) {
  const Geometry g = geometry(p);
  using Bwd = dnnl::convolution_backward_weights;
  const memory::desc xm = activation_desc(onednn::dims(x), t.x), wm = any(weight_dims(dw, p.groups), t.w);
  const memory::desc ym = activation_desc(onednn::dims(dy), t.y), bm = plain({dw[0]}, Tag::x);
  return with_algorithm(winograd_wanted(dy, dw, p, Pass::bwd_weights, t.x), [&](dnnl::algorithm a) {
    auto d = bias ? Bwd::desc(a, xm, wm, bm, ym, g.strides, g.dilates, g.pad, g.pad)
                  : Bwd::desc(a, xm, wm, ym, g.strides, g.dilates, g.pad, g.pad);
    return Bwd::primitive_desc(d, onednn::engine(), fwd_pd(x, dw, dy, p, bias, a, hint(t)));
  });
}

void fwd(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y, const ops::Conv2dParams& p) {
  const bool has_bias = bias.defined();
  const Types t{dt_of(x), dt_of(w), dt_of(y)};
  const std::string shape_key = key("fwd", x.shape(), w.shape(), y.shape(), p, has_bias) + t.key() +
                                wino_key(winograd_wanted(y.shape(), w.shape(), p, Pass::fwd, t.x)) + layout_key();
  choose_format(y, [&] {
    return onednn::cached<memory::desc>(
        shape_key, [&] { return fwd_plan_pd(x.shape(), w.shape(), y.shape(), p, has_bias, t).dst_desc(); });
  });
  const std::string k = shape_key + fmt(x) + fmt(y);
  const Plan& plan = onednn::cached<Plan>(k, [&] {
    auto pd = fwd_plan_pd(x.shape(), w.shape(), y.shape(), p, has_bias, t);
    Plan pl{dnnl::convolution_forward(pd), {}};
    pl.operands.push_back(operand(DNNL_ARG_SRC, false, user(x), pd.src_desc()));
    pl.operands.push_back(operand(DNNL_ARG_WEIGHTS, false, weight_plain(w.shape(), p.groups, t.w), pd.weights_desc()));
    pl.operands.push_back(operand(DNNL_ARG_BIAS, false, plain({w.size(0)}, Tag::x), plain({w.size(0)}, Tag::x)));
    pl.operands.push_back(operand(DNNL_ARG_DST, true, user(y), pd.dst_desc()));
    return pl;
  });
  execute(plan, {&x, &w, &bias, &y});
}

void bwd_data(const Tensor& dy, const Tensor& w, Tensor& dx, const ops::Conv2dParams& p) {
  const Types t{dt_of(dx), dt_of(w), dt_of(dy)};
  const std::string shape_key = key("bwd_data", dx.shape(), w.shape(), dy.shape(), p, false) + t.key() +
                                wino_key(winograd_wanted(dy.shape(), w.shape(), p, Pass::bwd_data, t.y)) + layout_key();
  choose_format(dx, [&] {
    return onednn::cached<memory::desc>(
        shape_key, [&] { return bwd_data_pd(dx.shape(), w.shape(), dy.shape(), p, t).diff_src_desc(); });
  });
  const std::string k = shape_key + fmt(dy) + fmt(dx);
  const Plan& plan = onednn::cached<Plan>(k, [&] {
    auto pd = bwd_data_pd(dx.shape(), w.shape(), dy.shape(), p, t);
    Plan pl{dnnl::convolution_backward_data(pd), {}};
    pl.operands.push_back(operand(DNNL_ARG_DIFF_DST, false, user(dy), pd.diff_dst_desc()));
    pl.operands.push_back(operand(DNNL_ARG_WEIGHTS, false, weight_plain(w.shape(), p.groups, t.w), pd.weights_desc()));
    pl.operands.push_back(operand(DNNL_ARG_DIFF_SRC, true, user(dx), pd.diff_src_desc()));
    return pl;
  });
  execute(plan, {&dy, &w, &dx});
}

// Bias gradient alone (a frozen weight with a trainable bias): a per-channel sum.
void bias_grad(const Tensor& dy_any, Tensor& db) {
  const Tensor dy = dy_any.to_plain().to(DType::f32);
  const int64_t N = dy.size(0), K = dy.size(1), L = dy.size(2) * dy.size(3);
  const float* dyp = dy.data<float>();
  float* dbp = db.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < K; ++k) {
    double acc = 0;
    for (int64_t n = 0; n < N; ++n) {
      const float* row = dyp + (n * K + k) * L;
      float part = 0;
#pragma omp simd reduction(+ : part)
      for (int64_t i = 0; i < L; ++i) part += row[i];
      acc += part;
    }
    dbp[k] = float(acc);
  }
}

// Note [bf16 weight gradients by Winograd]
// oneDNN has no bf16 Winograd, and its bf16 direct backward-weights is its slowest bf16
// pass on small planes: at ResNet-56's 64 channels x 8x8 (batch 128, 2 threads) 1.82 ms a
// call in a step, where the f32 Winograd one takes 1.36 ms. Measured with oneDNN alone
// (random data, 2 threads, bf16 direct -> f32 Winograd, ms; batch 64 unless said):
//
//   channels x plane      64 x 8x8 (b128)  128 x 8x8   256 x 8x8   128 x 16x16   64 x 16x16
//                         2.04 -> 1.35     2.88 -> 2.05 10.9 -> 8.0 10.7 -> 8.7   3.12 -> 2.92
//   channels x plane      64 x 32x32       64 x 56x56 (b32)   128 x 28x28 (b32)
//                         12.7 -> 12.7     17.6 -> 20.4       16.2 -> 17.7
//
// So where the f32 rule of Note [Winograd convolutions] picks Winograd for the weight
// gradient and the output plane is at most 16x16, a bf16 x and dy are widened to f32 by
// the reorders into Winograd's layout (exact; ~0.1 ms each at 64 x 8x8 x 128) and the
// gradient is computed in f32 (the step's gain: docs/DESIGN.md). ResNet-50's 56x56 and
// 28x28 planes stay bf16 direct. The forward and backward-data passes stay bf16: there the
// bf16 direct kernels are as fast as f32 Winograd before any conversion. Shapes alone
// decide, as for f32, so a run and its resumption compute the same.
Types bwd_weight_compute_types(const Shape& dy, const Shape& dw, const ops::Conv2dParams& p, Types t) {
  if (t.x == DT::bf16 && t.y == DT::bf16 && dy[2] * dy[3] <= 16 * 16 &&
      winograd_wanted(dy, dw, p, Pass::bwd_weights, kF32))
    return {kF32, t.w, kF32};
  return t;
}

void bwd_weight(const Tensor& dy, const Tensor& x, Tensor& dw, Tensor& db, const ops::Conv2dParams& p) {
  const bool has_bias = db.defined();
  const Types t = bwd_weight_compute_types(dy.shape(), dw.shape(), p, {dt_of(x), dt_of(dw), dt_of(dy)});
  const std::string k = key("bwd_weight", x.shape(), dw.shape(), dy.shape(), p, has_bias) + fmt(x) + fmt(dy) +
                        dt_key(dt_of(x)) + dt_key(dt_of(dy)) + t.key() +
                        wino_key(winograd_wanted(dy.shape(), dw.shape(), p, Pass::bwd_weights, t.x)) + layout_key();
  const Plan& plan = onednn::cached<Plan>(k, [&] {
    auto pd = bwd_weight_pd(x.shape(), dw.shape(), dy.shape(), p, has_bias, t);
    const memory::desc bm = plain({dw.size(0)}, Tag::x);
    Plan pl{dnnl::convolution_backward_weights(pd), {}};
    pl.operands.push_back(operand(DNNL_ARG_SRC, false, user(x), pd.src_desc()));
    pl.operands.push_back(operand(DNNL_ARG_DIFF_DST, false, user(dy), pd.diff_dst_desc()));
    pl.operands.push_back(
        operand(DNNL_ARG_DIFF_WEIGHTS, true, weight_plain(dw.shape(), p.groups, t.w), pd.diff_weights_desc()));
    pl.operands.push_back(operand(DNNL_ARG_DIFF_BIAS, true, bm, bm));
    return pl;
  });
  execute(plan, {&x, &dy, &dw, &db});
}

}  // namespace

std::string conv2d_implementation(const std::string& pass, const Shape& x, const Shape& w, const ops::Conv2dParams& p,
                                  DType dtype) {
  const Shape y = ops::conv2d_out_shape(x, w, p);
  const DT d = dtype == DType::bf16 ? DT::bf16 : kF32;
  const Types t{d, d, d};
  if (pass == "fwd") return fwd_plan_pd(x, w, y, p, false, t).impl_info_str();
  if (pass == "bwd_data") return bwd_data_pd(x, w, y, p, t).impl_info_str();
  EG_CHECK(pass == "bwd_weight", "conv2d_implementation: pass must be fwd, bwd_data or bwd_weight, got '", pass, "'");
  return bwd_weight_pd(x, w, y, p, false, bwd_weight_compute_types(y, w, p, {d, kF32, d})).impl_info_str();
}

// EG_DNNL_TRY names its first parameter `what`, the same token as dnnl::error::what(),
// so the op name is passed as a variable of that name to keep the expansion valid.
void conv2d_fwd(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y, const ops::Conv2dParams& p) {
  const char* what = "conv2d_fwd";
  EG_DNNL_TRY(what, fwd(x, w, bias, y, p));
}

void conv2d_bwd_data(const Tensor& dy, const Tensor& w, Tensor& dx, const ops::Conv2dParams& p) {
  if (!dx.defined()) return;
  const char* what = "conv2d_bwd_data";
  EG_DNNL_TRY(what, bwd_data(dy, w, dx, p));
}

void conv2d_bwd_weight(const Tensor& dy, const Tensor& x, Tensor& dw, Tensor& db, const ops::Conv2dParams& p) {
  if (!dw.defined()) {
    if (db.defined()) bias_grad(dy, db);
    return;
  }
  const char* what = "conv2d_bwd_weight";
  EG_DNNL_TRY(what, bwd_weight(dy, x, dw, db, p));
}

}  // namespace eg::cpu
