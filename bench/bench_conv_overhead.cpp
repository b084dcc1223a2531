// What egeria's conv dispatch costs over raw oneDNN, on ResNet-56's three 3x3 layers
// (batch 128, C = K = 16 at 32x32, 32 at 16x16, 64 at 8x8, stride 1, pad 1, no bias).
// One iteration = forward + backward-data + backward-weight; counters report GFLOP/s
// (3 passes of 2*N*K*P*Q*C*R*S each):
//   egeria/...       ops::call on NCHW tensors, outputs allocated with Tensor::empty
//                    every call (what autograd does);
//   onednn/...       the same oneDNN primitives (format_tag::any, plus the NCHW <->
//                    blocked reorders egeria's kernels run) created once, executed on
//                    buffers allocated once: the pure-library cost of the same work;
//   onednn_blocked/  the three convolution primitives alone on blocked buffers: what
//                    a framework that kept activations blocked end to end would pay.
// egeria/ over onednn/ is the dispatch overhead (target >= 90%); onednn_blocked/ over
// onednn/ is the price of keeping tensors NCHW (see Note [Conv layouts] in
// kernels/cpu/conv2d.cpp). Each benchmark also reports a `min` aggregate with
// --benchmark_repetitions, the useful statistic on a shared, noisy machine.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>
#include <vector>

#include "bench/machine_context.h"
#include "core/rng.h"
#include "kernels/ops.h"

using namespace eg;
using dnnl::memory;

namespace {

struct Layer {
  const char* name;
  int64_t c, hw;
};
constexpr int64_t kBatch = 128;
const Layer kLayers[] = {{"c16_32x32", 16, 32}, {"c32_16x16", 32, 16}, {"c64_8x8", 64, 8}};

double flops_per_iter(const Layer& l) { return 3 * 2.0 * double(kBatch * l.c * l.hw * l.hw) * double(l.c * 9); }

void set_counters(benchmark::State& st, const Layer& l) {
  st.counters["FLOP/s"] = benchmark::Counter(flops_per_iter(l), benchmark::Counter::kIsIterationInvariantRate);
}

ops::Conv2dParams conv_params() {
  ops::Conv2dParams p;
  p.pad_h = p.pad_w = 1;
  return p;
}

void bm_egeria(benchmark::State& st, const Layer& l) {
  Generator g(7);
  const Tensor x = Tensor::randn({kBatch, l.c, l.hw, l.hw}, g), w = Tensor::randn({l.c, l.c, 3, 3}, g);
  const Tensor dy = Tensor::randn({kBatch, l.c, l.hw, l.hw}, g), none;
  const ops::Conv2dParams p = conv_params();
  for (auto _ : st) {
    Tensor y = Tensor::empty(ops::conv2d_out_shape(x.shape(), w.shape(), p));
    ops::call(ops::conv2d_fwd, x, w, none, y, p);
    Tensor dx = Tensor::empty(x.shape());
    ops::call(ops::conv2d_bwd_data, dy, w, dx, p, false);
    Tensor dw = Tensor::empty(w.shape()), db;
    ops::call(ops::conv2d_bwd_weight, dy, x, dw, db, p, false);
    benchmark::DoNotOptimize(y.raw());
  }
  set_counters(st, l);
}

// The raw-oneDNN side: the three primitives, their blocked buffers, and the reorders
// between NCHW user buffers and whatever layout each primitive chose.
struct Raw {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream s{eng};
  std::vector<memory> keep;  // every buffer, allocated once
  struct Step {
    dnnl::primitive prim;
    std::unordered_map<int, memory> args;
  };
  std::vector<Step> with_reorders, blocked_only;

  // A user (NCHW) buffer and, when the primitive wants another layout, a blocked one.
  memory user(const memory::dims& d, memory::format_tag tag) {
    keep.emplace_back(memory::desc(d, memory::data_type::f32, tag), eng);
    std::fill_n(static_cast<float*>(keep.back().get_data_handle()), keep.back().get_desc().get_size() / 4, 0.5f);
    return keep.back();
  }
  memory inner(const memory& u, const memory::desc& want) {
    if (u.get_desc() == want) return u;
    keep.emplace_back(want, eng);
    return keep.back();
  }
  void reorder(const memory& from, const memory& to) {
    if (from.get_desc() == to.get_desc()) return;
    with_reorders.push_back({dnnl::reorder(from, to), {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}}});
  }
  void compute(const dnnl::primitive& prim, const std::unordered_map<int, memory>& args) {
    with_reorders.push_back({prim, args});
    blocked_only.push_back({prim, args});
  }

  explicit Raw(const Layer& l) {
    using tag = memory::format_tag;
    const memory::dims xd{kBatch, l.c, l.hw, l.hw}, wd{l.c, l.c, 3, 3}, st{1, 1}, dil{0, 0}, pad{1, 1};
    const memory::desc xa(xd, memory::data_type::f32, tag::any), wa(wd, memory::data_type::f32, tag::any);
    const auto alg = dnnl::algorithm::convolution_direct;
    dnnl::convolution_forward::primitive_desc fpd(
        {dnnl::prop_kind::forward_training, alg, xa, wa, xa, st, dil, pad, pad}, eng);
    dnnl::convolution_backward_data::primitive_desc dpd({alg, xa, wa, xa, st, dil, pad, pad}, eng, fpd);
    dnnl::convolution_backward_weights::primitive_desc wpd({alg, xa, wa, xa, st, dil, pad, pad}, eng, fpd);
    memory x = user(xd, tag::nchw), w = user(wd, tag::oihw), y = user(xd, tag::nchw);
    memory dy = user(xd, tag::nchw), dx = user(xd, tag::nchw), dw = user(wd, tag::oihw);
    // forward
    memory xb = inner(x, fpd.src_desc()), wb = inner(w, fpd.weights_desc()), yb = inner(y, fpd.dst_desc());
    reorder(x, xb), reorder(w, wb);
    compute(dnnl::convolution_forward(fpd), {{DNNL_ARG_SRC, xb}, {DNNL_ARG_WEIGHTS, wb}, {DNNL_ARG_DST, yb}});
    reorder(yb, y);
    // backward data
    memory dyb = inner(dy, dpd.diff_dst_desc()), wb2 = inner(w, dpd.weights_desc());
    memory dxb = inner(dx, dpd.diff_src_desc());
    reorder(dy, dyb), reorder(w, wb2);
    compute(dnnl::convolution_backward_data(dpd),
            {{DNNL_ARG_DIFF_DST, dyb}, {DNNL_ARG_WEIGHTS, wb2}, {DNNL_ARG_DIFF_SRC, dxb}});
    reorder(dxb, dx);
    // backward weights
    memory xb3 = inner(x, wpd.src_desc()), dyb3 = inner(dy, wpd.diff_dst_desc());
    memory dwb = inner(dw, wpd.diff_weights_desc());
    reorder(x, xb3), reorder(dy, dyb3);
    compute(dnnl::convolution_backward_weights(wpd),
            {{DNNL_ARG_SRC, xb3}, {DNNL_ARG_DIFF_DST, dyb3}, {DNNL_ARG_DIFF_WEIGHTS, dwb}});
    reorder(dwb, dw);
    run(with_reorders);  // fills the blocked inputs, so blocked_only reads real numbers
  }

  void run(const std::vector<Step>& steps) {
    for (const Step& s_ : steps) s_.prim.execute(s, s_.args);
    s.wait();
  }
};

void bm_onednn(benchmark::State& st, const Layer& l, bool blocked_only) {
  Raw raw(l);
  const auto& steps = blocked_only ? raw.blocked_only : raw.with_reorders;
  for (auto _ : st) raw.run(steps);
  set_counters(st, l);
}

double min_of(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }

}  // namespace

int main(int argc, char** argv) {
  for (const Layer& l : kLayers) {
    std::vector<benchmark::internal::Benchmark*> bms = {
        benchmark::RegisterBenchmark((std::string("conv_overhead/egeria/") + l.name).c_str(),
                                     [&l](benchmark::State& st) { bm_egeria(st, l); }),
        benchmark::RegisterBenchmark((std::string("conv_overhead/onednn/") + l.name).c_str(),
                                     [&l](benchmark::State& st) { bm_onednn(st, l, false); }),
        benchmark::RegisterBenchmark((std::string("conv_overhead/onednn_blocked/") + l.name).c_str(),
                                     [&l](benchmark::State& st) { bm_onednn(st, l, true); })};
    for (auto* bm : bms) bm->Unit(benchmark::kMillisecond)->UseRealTime()->ComputeStatistics("min", min_of);
  }
  eg::add_machine_context();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
