// The one place that wires implementations to ops. Every op has all three: ref
// (ground truth), cpu (fast path) and, in CUDA builds, cuda.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <type_traits>

#include "kernels/cpu/cpu.h"
#include "kernels/ref/ref.h"
#ifdef EG_WITH_CUDA
#include "kernels/cuda/cuda.h"
#endif

namespace eg::ops {

#ifdef EG_WITH_CUDA
#define EG_CUDA_IMPL(name) &cudak::name
#else
#define EG_CUDA_IMPL(name) nullptr
#endif

// The ops whose cpu implementation takes nChw16c tensors (Note [Blocked activations]):
// the convolutions that produce them and the ops that sit between convolutions.
constexpr bool same(const char* a, const char* b) { return *a == *b && (*a == 0 || same(a + 1, b + 1)); }
constexpr bool cpu_any_format(const char* n) {
  for (const char* op :
       {"conv2d_fwd", "conv2d_bwd_data", "conv2d_bwd_weight", "batchnorm_fwd_train", "batchnorm_fwd_infer",
        "batchnorm_bwd", "act_fwd", "act_bwd", "binary_fwd", "scale", "axpy", "pool2d_fwd", "pool2d_bwd"})
    if (same(n, op)) return true;
  return false;
}

// Of those, the ones whose cpu implementations also take NHWC tensors: those of the int8
// reference (Note [int8 convolution pipeline] in quant/int8.cpp; its batch norms on the
// batch's statistics sit between its convolutions) and of the training convolutions where
// the CPU's pick NHWC (Note [Activation layouts follow the convolutions] in
// kernels/cpu/conv2d.cpp), and max and average pooling (Note [Pooling in the convolutions'
// layout] in kernels/cpu/pool.cpp). Global average pooling takes a plain copy.
constexpr bool cpu_nhwc(const char* n) {
  for (const char* op :
       {"conv2d_fwd", "conv2d_bwd_data", "conv2d_bwd_weight", "act_fwd", "act_bwd", "binary_fwd", "scale", "axpy",
        "batchnorm_fwd_train", "batchnorm_fwd_infer", "batchnorm_bwd", "pool2d_fwd", "pool2d_bwd"})
    if (same(n, op)) return true;
  return false;
}

// The ops whose cuda implementation takes NHWC tensors (Note [Channels-last activations
// on CUDA] in core/tensor.h): the same set and pooling (a stem's max pool, a head's
// global average sit between NHWC convolutions).
constexpr bool cuda_any_format(const char* n) {
  for (const char* op : {"pool2d_fwd", "pool2d_bwd", "global_avgpool_fwd", "global_avgpool_bwd"})
    if (same(n, op)) return true;
  return cpu_any_format(n);
}

// The ops whose implementations also take bf16 tensors (Note [bf16 kernels]): ref, cpu and
// cuda (Note [16-bit CUDA kernels] in kernels/cuda/common.cuh).
constexpr bool takes_bf16(const char* n) {
  for (const char* op : {"conv2d_fwd",
                         "conv2d_bwd_data",
                         "conv2d_bwd_weight",
                         "batchnorm_fwd_train",
                         "batchnorm_fwd_infer",
                         "batchnorm_bwd",
                         "act_fwd",
                         "act_bwd",
                         "binary_fwd",
                         "scale",
                         "axpy",
                         "cast",
                         "gemm",
                         "linear_fwd",
                         "swap12",
                         "linear_bwd",
                         "dropout_fwd",
                         "dropout_bwd",
                         "pool2d_fwd",
                         "pool2d_bwd",
                         "global_avgpool_fwd",
                         "global_avgpool_bwd"})
    if (same(n, op)) return true;
  return false;
}

// Note [Computed, then added] in kernels/ops.h: an op with accumulate flags, for a
// backend whose implementation only overwrites (F; A its axpy). Each flag's outputs are
// computed into new tensors (ops::result_for), then added.
template <class Tag>
struct ComputedThenAdded;
template <auto A>
void add_into(const Tensor& result, Tensor& out) {
  if (out.defined() && !result.is_same(out)) A(result, out, 1.0);
}
template <>
struct ComputedThenAdded<tag::conv2d_bwd_data> {
  template <auto F, auto A>
  static void call(const Tensor& dy, const Tensor& w, Tensor& dx, const Conv2dParams& p, bool accumulate) {
    Tensor r = result_for(dx, accumulate);
    F(dy, w, r, p);
    add_into<A>(r, dx);
  }
};
template <>
struct ComputedThenAdded<tag::conv2d_bwd_weight> {
  template <auto F, auto A>
  static void call(const Tensor& dy, const Tensor& x, Tensor& dw, Tensor& db, const Conv2dParams& p, bool accumulate) {
    Tensor rw = result_for(dw, accumulate), rb = result_for(db, accumulate);
    F(dy, x, rw, rb, p);
    add_into<A>(rw, dw);
    add_into<A>(rb, db);
  }
};
template <>
struct ComputedThenAdded<tag::batchnorm_bwd> {
  template <auto F, auto A>
  static void call(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& invstd,
                   Tensor& dx, Tensor& dgamma, Tensor& dbeta, bool training, BnAct act, const Tensor& act_y,
                   Tensor& dresidual, bool accumulate) {
    Tensor rg = result_for(dgamma, accumulate), rb = result_for(dbeta, accumulate);
    F(dy, x, gamma, mean, invstd, dx, rg, rb, training, act, act_y, dresidual);
    add_into<A>(rg, dgamma);
    add_into<A>(rb, dbeta);
  }
};
template <>
struct ComputedThenAdded<tag::linear_bwd> {
  template <auto F, auto A>
  static void call(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor& dx, Tensor& dw, Tensor& db,
                   bool accumulate_dx, bool accumulate) {
    Tensor rx = result_for(dx, accumulate_dx), rw = result_for(dw, accumulate), rb = result_for(db, accumulate);
    F(dy, x, w, rx, rw, rb);
    add_into<A>(rx, dx);
    add_into<A>(rw, dw);
    add_into<A>(rb, db);
  }
};
template <>
struct ComputedThenAdded<tag::layernorm_bwd> {
  template <auto F, auto A>
  static void call(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd,
                   Tensor& dx, Tensor& dgamma, Tensor& dbeta, bool accumulate) {
    Tensor rg = result_for(dgamma, accumulate), rb = result_for(dbeta, accumulate);
    F(dy, x, gamma, mean, rstd, dx, rg, rb);
    add_into<A>(rg, dgamma);
    add_into<A>(rb, dbeta);
  }
};
template <>
struct ComputedThenAdded<tag::embedding_bwd> {
  template <auto F, auto A>
  static void call(const Tensor& dy, const Tensor& ids, Tensor& dtable, bool accumulate) {
    Tensor r = result_for(dtable, accumulate);  // a repeated id's terms summed as without
    F(dy, ids, r);
    add_into<A>(r, dtable);
  }
};

// A ref or cpu implementation F (Overwriting<Tag>) as an implementation of the op.
template <class Tag, Overwriting<Tag>* F, Axpy* A>
constexpr typename Tag::fn* host_impl() {
  if constexpr (std::is_same_v<Overwriting<Tag>, typename Tag::fn>) {
    return F;
  } else {
    return &ComputedThenAdded<Tag>::template call<F, A>;
  }
}

#define EG_DEFINE_OP(name, Fn)                                                                                       \
  const Op<Fn> name{#name,                                                                                           \
                    {host_impl<tag::name, &ref::name, &ref::axpy>(), host_impl<tag::name, &cpu::name, &cpu::axpy>(), \
                     EG_CUDA_IMPL(name)},                                                                            \
                    cpu_any_format(#name),                                                                           \
                    cuda_any_format(#name),                                                                          \
                    takes_bf16(#name),                                                                               \
                    cpu_nhwc(#name)};
EG_OP_LIST(EG_DEFINE_OP)
#undef EG_DEFINE_OP

const char* backend_name(Backend b) {
  switch (b) {
    case Backend::ref: return "ref";
    case Backend::cpu: return "cpu";
    case Backend::cuda: return "cuda";
  }
  return "?";
}

namespace {
thread_local int g_forced = -1;
thread_local OpRecorder* g_recorder = nullptr;
thread_local OpProfiler* g_profiler = nullptr;
}  // namespace

OpRecorder::OpRecorder() : prev_(g_recorder) { g_recorder = this; }
OpRecorder::~OpRecorder() { g_recorder = prev_; }

OpProfiler::OpProfiler() : prev_(g_profiler), prev_conversions_(layout_conversion_counter()) {
  g_profiler = this;
  set_layout_conversion_counter(&conversions_);
}
OpProfiler::~OpProfiler() {
  g_profiler = prev_;
  set_layout_conversion_counter(prev_conversions_);
}
void OpProfiler::add(const char* op, Backend b, double seconds) {
  // A step runs a few dozen distinct ops: a linear search beats a map here.
  for (OpTime& t : times_)
    if (t.backend == b && t.op == op) {
      ++t.calls, t.seconds += seconds;
      return;
    }
  times_.push_back({op, b, 1, seconds});
}
std::vector<OpTime> OpProfiler::times() const {
  std::vector<OpTime> v = times_;
  std::stable_sort(v.begin(), v.end(), [](const OpTime& a, const OpTime& b) { return a.seconds > b.seconds; });
  return v;
}

std::string OpRecord::str() const {
  std::string s = op + " on " + backend_name(backend) + "(";
  for (size_t i = 0; i < args.size(); ++i) s += (i ? ", " : "") + args[i];
  return s + ")";
}
std::string record_str(const SgdParams& p) {
  using detail::number_str;
  return "{lr " + number_str(p.lr) + ", momentum " + number_str(p.momentum) + ", dampening " + number_str(p.dampening) +
         ", weight_decay " + number_str(p.weight_decay) + ", nesterov " + number_str(p.nesterov) + ", first_step " +
         number_str(p.first_step) + "}";
}
std::string record_str(const AdamWParams& p) {
  using detail::number_str;
  return "{lr " + number_str(p.lr) + ", betas " + number_str(p.beta1) + " " + number_str(p.beta2) + ", eps " +
         number_str(p.eps) + ", weight_decay " + number_str(p.weight_decay) + ", step " + number_str(double(p.step)) +
         "}";
}
void set_forced_cpu_backend(int b) { g_forced = b; }
int forced_cpu_backend() { return g_forced; }

namespace detail {
OpRecorder* current_recorder() { return g_recorder; }
OpProfiler* current_profiler() { return g_profiler; }
std::string number_str(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

Tensor& plain_arg(Tensor& t) {
  EG_CHECK(!t.is_blocked(), "internal: ", t.str(), " was passed as an output to an op that only writes plain tensors");
  return t;
}
}  // namespace detail

Backend pick_backend(bool has_cpu, const Tensor& key, bool bf16) {
  if (key.is_cuda()) return Backend::cuda;
  if (g_forced >= 0) return Backend(g_forced);
  return has_cpu && (key.dtype() == DType::f32 || (bf16 && key.dtype() == DType::bf16)) ? Backend::cpu : Backend::ref;
}

}  // namespace eg::ops
