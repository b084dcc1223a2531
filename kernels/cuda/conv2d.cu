// Convolution on CUDA through cuDNN 9 (legacy API), NCHW: f32, or bf16 or f16 (x, w, y,
// dy and dx of one 16-bit dtype, products accumulated in f32 on tensor cores: cuDNN's
// PSEUDO_*_CONFIG). Beside 16-bit data the bias and its gradient are f32 and the weight
// gradient f32 or the data's dtype: cuDNN writes it in the data's dtype and an f32 one is
// cast from that, as autocast's cast node does with PyTorch's bf16 weight gradient. A
// biased 16-bit forward runs on f32 copies (Note [One rounding with a bias]). y and dx
// take the data's dtype (the ref also writes f32 ones from 16-bit data; autocast never
// asks for them, and CUDA refuses them by name).
// (Batch norm: batchnorm.cu.)
// A plan per (shapes, params, math mode, dtype) holds the descriptors and, per pass, the
// algorithm from cudnnGet*Algorithm_v7 (or timed by cudnnFind*, EG_CUDNN_BENCHMARK=1:
// Note [Median of three timings] in kernels/autotune.h): the fastest whose workspace fits
// 256 MiB. Workspaces come from the caching allocator.
#include <array>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "kernels/autotune.h"
#include "kernels/cuda/batchnorm16.cuh"
#include "kernels/cuda/cudnn_desc.cuh"

namespace eg::cudak {

namespace {

constexpr size_t kMaxWorkspace = size_t(256) << 20;

struct ConvDescs {
  TensorDesc x, y;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  ConvDescs(const Shape& xs, const Shape& ws, const Shape& ys, const ops::Conv2dParams& p, DType t, bool nhwc)
      : x(xs, t, nhwc), y(ys, t, nhwc) {
    EG_CUDNN_CHECK(cudnnCreateFilterDescriptor(&w));
    EG_CUDNN_CHECK(cudnnSetFilter4dDescriptor(w, cudnn_type(t), nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW,
                                              int(ws[0]), int(ws[1]), int(ws[2]), int(ws[3])));
    EG_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&conv));
    EG_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(conv, int(p.pad_h), int(p.pad_w), int(p.stride_h), int(p.stride_w),
                                                   int(p.dil_h), int(p.dil_w), CUDNN_CROSS_CORRELATION,
                                                   CUDNN_DATA_FLOAT));  // f32 accumulation for f16 too
    EG_CUDNN_CHECK(cudnnSetConvolutionGroupCount(conv, int(p.groups)));
    // CUDNN_DEFAULT_MATH lets cuDNN use TF32 tensor cores on Ampere and newer; FMA_MATH
    // keeps IEEE f32 (see eg::set_allow_tf32). 16-bit data always may use tensor cores.
    EG_CUDNN_CHECK(cudnnSetConvolutionMathType(conv, t != DType::f32 ? CUDNN_TENSOR_OP_MATH
                                                     : allow_tf32()  ? CUDNN_DEFAULT_MATH
                                                                     : CUDNN_FMA_MATH));
  }
  ~ConvDescs() {
    cudnnDestroyConvolutionDescriptor(conv);
    cudnnDestroyFilterDescriptor(w);
  }
};

// EG_CUDNN_BENCHMARK=1: time the candidate algorithms per shape (cudnnFind*, as
// torch.backends.cudnn.benchmark) instead of trusting cuDNN's heuristics. Faster steps;
// the choice depends on timings, so runs are no longer bit-reproducible on the GPU.
bool cudnn_benchmark() {
  static const bool on = [] {
    const char* e = std::getenv("EG_CUDNN_BENCHMARK");
    return e && std::string(e) == "1";
  }();
  return on;
}

}  // namespace

// On unless EG_CUDA_CHANNELS_LAST=0 (NCHW throughout: the layout to compare against).
bool channels_last() {
  static const bool on = [] {
    const char* e = std::getenv("EG_CUDA_CHANNELS_LAST");
    return !(e && std::string(e) == "0");
  }();
  return on;
}

namespace {

// A convolution's plan, built once per (device, shapes, params, math mode, search mode):
// its cuDNN descriptors and, per pass, the algorithm and its workspace size. Building
// descriptors and asking cuDNN for algorithms costs tens of microseconds, which at
// ResNet-56's ~170 convolution calls per step is the difference between keeping up
// with the GPU and not.
struct ConvPlan {
  ConvDescs d;
  bool has_fwd = false, has_bwd_data = false, has_bwd_filter = false;
  cudnnConvolutionFwdAlgo_t fwd{};
  cudnnConvolutionBwdDataAlgo_t bwd_data{};
  cudnnConvolutionBwdFilterAlgo_t bwd_filter{};
  size_t fwd_ws = 0, bwd_data_ws = 0, bwd_filter_ws = 0;
  // Held while a pass's algorithm is chosen: the plan is shared by threads on their own
  // streams (the reference's: Note [Side streams] in core/side_stream.h).
  std::mutex choosing;
  ConvPlan(const Shape& xs, const Shape& ws, const Shape& ys, const ops::Conv2dParams& p, DType t, bool nhwc)
      : d(xs, ws, ys, p, t, nhwc) {}
};

using ConvKey = std::array<int64_t, 20>;

// The first (fastest by cuDNN's heuristics) algorithm whose workspace fits.
template <class Perf>
decltype(Perf::algo) first_fitting(const Perf* perf, int found, const char* pass) {
  for (int i = 0; i < found; ++i)
    if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].memory <= kMaxWorkspace) return perf[i].algo;
  EG_THROW("cuDNN found no ", pass, " convolution algorithm within a ", kMaxWorkspace >> 20, " MiB workspace");
}

// The algorithm with the lowest median of three timings by `find` (a cudnnFind* call
// filling perf[16] and found) whose workspace fits: Note [Median of three timings].
// cudnnFind* times an algorithm in each math mode it has (tensor cores or not); the plan
// runs in its descriptor's, so the timings in that mode decide (all of them, should
// cuDNN report none in it).
template <class Perf, class Find>
decltype(Perf::algo) fastest_timed(Find find, cudnnConvolutionDescriptor_t conv, const char* pass) {
  constexpr int kTrials = 3;
  cudnnMathType_t math{};
  EG_CUDNN_CHECK(cudnnGetConvolutionMathType(conv, &math));
  std::vector<std::vector<AlgoTiming>> in_mode(kTrials), any_mode(kTrials);
  for (int t = 0; t < kTrials; ++t) {
    Perf perf[16];
    int found = 0;
    find(perf, &found);
    for (int i = 0; i < found; ++i) {
      const AlgoTiming a{int(perf[i].algo), perf[i].status == CUDNN_STATUS_SUCCESS, perf[i].time, perf[i].memory};
      any_mode[size_t(t)].push_back(a);
      if (perf[i].mathType == math) in_mode[size_t(t)].push_back(a);
    }
  }
  int algo = fastest_by_median(in_mode, kMaxWorkspace);
  if (algo < 0) algo = fastest_by_median(any_mode, kMaxWorkspace);
  EG_CHECK(algo >= 0, "cuDNN timed no ", pass, " convolution algorithm that ran in all ", kTrials, " trials within a ",
           kMaxWorkspace >> 20, " MiB workspace");
  return static_cast<decltype(Perf::algo)>(algo);
}

// The plan for x [N,C,H,W] and w [K,C/g,R,S] of dtype t, NCHW or NHWC (x, y and w:
// cuDNN's NHWC filter is [K,R,S,C/g]); y's shape follows from them and p.
ConvPlan& conv_plan(const Shape& xs, const Shape& ws, const Shape& ys, const ops::Conv2dParams& p, DType t, bool nhwc) {
  static std::mutex mu;
  static std::map<ConvKey, std::unique_ptr<ConvPlan>> plans;
  int dev = 0;
  EG_CUDA_CHECK(cudaGetDevice(&dev));
  const ConvKey key{
      dev,   allow_tf32(), cudnn_benchmark(), xs[0],   xs[1],   xs[2],   xs[3],   ws[0],    ws[1],      ws[2],
      ws[3], p.stride_h,   p.stride_w,        p.pad_h, p.pad_w, p.dil_h, p.dil_w, p.groups, int64_t(t), nhwc};
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = plans[key];
  if (!slot) slot = std::make_unique<ConvPlan>(xs, ws, ys, p, t, nhwc);
  return *slot;
}

// Note [Channels-last activations on CUDA] (core/tensor.h): 16-bit convolutions without a
// grouping or a bias (every model's but MobileNetV2's depthwise ones) run NHWC: x and dy
// as they come, or converted; the weight converted per call ([K,C,R,S] -> [K,R,S,C]: a
// weight is far smaller than an activation); y and dx written NHWC; the weight gradient
// converted back to the parameter's [K,C,R,S]. The rest stay NCHW.
// EG_CUDA_GROUPED_NHWC=1 runs the grouped ones NHWC too, as PyTorch's channels_last
// does (cuDNN takes grouped NHWC convolutions, and a depthwise weight [K,1,R,S] is already
// [K,R,S,1]): it would spare MobileNetV2 a reorder on each side of every depthwise
// convolution, but no GPU has run it yet, so it stays off until tools/gpu-experiments'
// mnv2 step has measured and checked it.
bool grouped_nhwc() {
  static const bool on = [] {
    const char* e = std::getenv("EG_CUDA_GROUPED_NHWC");
    return e && std::string(e) == "1";
  }();
  return on;
}

bool use_nhwc(DType t, const ops::Conv2dParams& p, bool biased) {
  return t != DType::f32 && (p.groups == 1 || grouped_nhwc()) && !biased && channels_last();
}

Tensor workspace(size_t bytes, Device d) { return Tensor::empty({int64_t(std::max<size_t>(bytes, 1))}, DType::u8, d); }

// The dtype every data operand of a convolution shares (x, w, y; dy, dx), f32 or 16-bit.
DType conv_dtype(std::initializer_list<const Tensor*> data, const char* pass) {
  const DType t = (*data.begin())->dtype();
  EG_CHECK(t == DType::f32 || t == DType::bf16 || t == DType::f16, "conv2d", pass,
           " on CUDA supports f32, bf16 and f16 tensors, got ", dtype_name(t));
  for (const Tensor* d : data)
    EG_CHECK(d->dtype() == t, "conv2d", pass, " on CUDA: its data tensors share one dtype, got ", dtype_name(t),
             " and ", dtype_name(d->dtype()));
  return t;
}

}  // namespace

// ---- convolution
void conv2d_fwd(const Tensor& x_in, const Tensor& w_in, const Tensor& bias, Tensor& y, const ops::Conv2dParams& p) {
  const DType t = conv_dtype({&x_in, &w_in, &y}, "");
  const bool nhwc = use_nhwc(t, p, bias.defined());
  const Format f = nhwc ? Format::nhwc : Format::plain;
  const Tensor x = x_in.to_format(f), w = w_in.to_format(f);
  y.set_format(f);
  EG_CHECK(!bias.defined() || bias.dtype() == t || bias.dtype() == DType::f32, "conv2d on CUDA: the bias is f32 or ",
           dtype_name(t), ", got ", dtype_name(bias.dtype()));
  // Note [One rounding with a bias]
  // cuDNN's and cuBLAS's 16-bit configurations round their f32 accumulator into the
  // 16-bit output; adding an f32 bias after that rounds twice, and where the bias cancels
  // most of the product (outputs near zero) the first rounding, 2^-9 of the product, is
  // most of the result (seen on an H100: 0.0011 for 0.0007). ref and oneDNN round once,
  // after the bias. So a biased 16-bit convolution (or linear layer, gemm.cu) computes
  // in f32 and rounds once: exact for the products (a bf16 or f16 value, and the product
  // of two, is an f32 value), at f32 speed; the models' convolutions have no bias (batch
  // norm follows), their linear layers pay one f32 output and a cast.
  if (t != DType::f32 && bias.defined() && bias.dtype() == DType::f32) {
    Tensor x32 = Tensor::empty(x.shape(), DType::f32, x.device()),
           w32 = Tensor::empty(w.shape(), DType::f32, w.device());
    Tensor y32 = Tensor::empty(y.shape(), DType::f32, y.device());
    cast(x, x32);
    cast(w, w32);
    conv2d_fwd(x32, w32, bias, y32, p);
    return cast(y32, y);
  }
  cudnnHandle_t h = cuda::cudnn_handle();
  ConvPlan& c = conv_plan(x.shape(), w.shape(), y.shape(), p, t, nhwc);
  {  // the first call with these shapes chooses; other threads use the choice
    std::lock_guard<std::mutex> chosen(c.choosing);
    if (!c.has_fwd) {
      using Perf = cudnnConvolutionFwdAlgoPerf_t;
      if (cudnn_benchmark()) {
        auto find = [&](Perf* perf, int* found) {
          EG_CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithm(h, c.d.x.d, c.d.w, c.d.conv, c.d.y.d, 16, found, perf));
        };
        c.fwd = fastest_timed<Perf>(find, c.d.conv, "forward");
      } else {
        Perf perf[16];
        int found = 0;
        EG_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, c.d.x.d, c.d.w, c.d.conv, c.d.y.d, 16, &found, perf));
        c.fwd = first_fitting(perf, found, "forward");
      }
      EG_CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(h, c.d.x.d, c.d.w, c.d.conv, c.d.y.d, c.fwd, &c.fwd_ws));
      c.has_fwd = true;
    }
  }
  Tensor buf = workspace(c.fwd_ws, x.device());
  const float one = 1.f, zero = 0.f;
  EG_CUDNN_CHECK(cudnnConvolutionForward(h, &one, c.d.x.d, x.raw_any(), c.d.w, w.raw_any(), c.d.conv, c.fwd, buf.raw(),
                                         c.fwd_ws, &zero, c.d.y.d, y.raw_any()));
  if (bias.defined()) {
    TensorDesc bd({1, bias.numel(), 1, 1}, t);
    EG_CUDNN_CHECK(cudnnAddTensor(h, &one, bd.d, bias.raw(), &one, c.d.y.d, y.raw()));
  }
}

void conv2d_bwd_data(const Tensor& dy_in, const Tensor& w_in, Tensor& dx, const ops::Conv2dParams& p, bool accumulate) {
  if (!dx.defined()) return;
  const DType t = conv_dtype({&dy_in, &w_in, &dx}, " backward");
  const bool nhwc = use_nhwc(t, p, false);
  const Format f = nhwc ? Format::nhwc : Format::plain;
  if (accumulate && (dx.format() != f || !blend_aligned(dx))) {  // not as cuDNN writes: computed, then added
    Tensor r = Tensor::empty(dx.shape(), t, dx.device());
    conv2d_bwd_data(dy_in, w_in, r, p, false);
    return axpy(r, dx, 1.0);
  }
  const Tensor dy = dy_in.to_format(f), w = w_in.to_format(f);
  dx.set_format(f);
  cudnnHandle_t h = cuda::cudnn_handle();
  ConvPlan& c = conv_plan(dx.shape(), w.shape(), dy.shape(), p, t, nhwc);
  {  // the first call with these shapes chooses; other threads use the choice
    std::lock_guard<std::mutex> chosen(c.choosing);
    if (!c.has_bwd_data) {
      using Perf = cudnnConvolutionBwdDataAlgoPerf_t;
      if (cudnn_benchmark()) {
        auto find = [&](Perf* perf, int* found) {
          EG_CUDNN_CHECK(
              cudnnFindConvolutionBackwardDataAlgorithm(h, c.d.w, c.d.y.d, c.d.conv, c.d.x.d, 16, found, perf));
        };
        c.bwd_data = fastest_timed<Perf>(find, c.d.conv, "backward-data");
      } else {
        Perf perf[16];
        int found = 0;
        EG_CUDNN_CHECK(
            cudnnGetConvolutionBackwardDataAlgorithm_v7(h, c.d.w, c.d.y.d, c.d.conv, c.d.x.d, 16, &found, perf));
        c.bwd_data = first_fitting(perf, found, "backward-data");
      }
      EG_CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(h, c.d.w, c.d.y.d, c.d.conv, c.d.x.d, c.bwd_data,
                                                                  &c.bwd_data_ws));
      c.has_bwd_data = true;
    }
  }
  Tensor buf = workspace(c.bwd_data_ws, dy.device());
  // beta = 1 blends the result into dx (MXNet's kAddTo): the residual block's two
  // gradients summed without a pass of their own.
  const float one = 1.f, beta = accumulate ? 1.f : 0.f;
  EG_CUDNN_CHECK(cudnnConvolutionBackwardData(h, &one, c.d.w, w.raw_any(), c.d.y.d, dy.raw_any(), c.d.conv, c.bwd_data,
                                              buf.raw(), c.bwd_data_ws, &beta, c.d.x.d, dx.raw_any()));
}

void conv2d_bwd_weight(const Tensor& dy_in, const Tensor& x_in, Tensor& dw, Tensor& db, const ops::Conv2dParams& p,
                       bool accumulate) {
  const DType t = conv_dtype({&dy_in, &x_in}, " backward");
  // The forward's layout: NHWC unless it had a bias (the bias gradient is wanted then).
  const bool nhwc = use_nhwc(t, p, db.defined());
  // Where cuDNN would blend into dw (its own dtype and layout) or db (f32), at cuDNN's
  // alignment only; else computed, then added.
  const bool blends_w = dw.defined() && dw.dtype() == t && !nhwc, blends_b = db.defined() && t == DType::f32;
  if (accumulate && ((blends_w && !blend_aligned(dw)) || (blends_b && !blend_aligned(db)))) {
    Tensor rw = ops::result_for(dw, true), rb = ops::result_for(db, true);
    conv2d_bwd_weight(dy_in, x_in, rw, rb, p, false);
    if (dw.defined()) axpy(rw, dw, 1.0);
    if (db.defined()) axpy(rb, db, 1.0);
    return;
  }
  const Format f = nhwc ? Format::nhwc : Format::plain;
  const Tensor dy = dy_in.to_format(f), x = x_in.to_format(f);
  for (const Tensor* g : {&dw, &db})
    EG_CHECK(!g->defined() || g->dtype() == t || g->dtype() == DType::f32, "conv2d backward on CUDA: a parameter ",
             "gradient is f32 or ", dtype_name(t), ", got ", dtype_name(g->dtype()));
  cudnnHandle_t h = cuda::cudnn_handle();
  const float one = 1.f, zero = 0.f, beta = accumulate ? 1.f : 0.f;
  if (dw.defined()) {
    ConvPlan& c = conv_plan(x.shape(), dw.shape(), dy.shape(), p, t, nhwc);
    {  // the first call with these shapes chooses; other threads use the choice
      std::lock_guard<std::mutex> chosen(c.choosing);
      if (!c.has_bwd_filter) {
        using Perf = cudnnConvolutionBwdFilterAlgoPerf_t;
        if (cudnn_benchmark()) {
          auto find = [&](Perf* perf, int* found) {
            EG_CUDNN_CHECK(
                cudnnFindConvolutionBackwardFilterAlgorithm(h, c.d.x.d, c.d.y.d, c.d.conv, c.d.w, 16, found, perf));
          };
          c.bwd_filter = fastest_timed<Perf>(find, c.d.conv, "backward-filter");
        } else {
          Perf perf[16];
          int found = 0;
          EG_CUDNN_CHECK(
              cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, c.d.x.d, c.d.y.d, c.d.conv, c.d.w, 16, &found, perf));
          c.bwd_filter = first_fitting(perf, found, "backward-filter");
        }
        EG_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(h, c.d.x.d, c.d.y.d, c.d.conv, c.d.w,
                                                                      c.bwd_filter, &c.bwd_filter_ws));
        c.has_bwd_filter = true;
      }
    }
    Tensor buf = workspace(c.bwd_filter_ws, dy.device());
    // cuDNN writes the data's dtype (and NHWC's [K,R,S,C]): an f32 gradient of 16-bit
    // data is cast from it (or added, accumulating: one pass either way), an NHWC one
    // reordered back.
    const bool direct = blends_w;
    Tensor g = direct ? dw : Tensor::empty(dw.shape(), t, dw.device());
    g.set_format(f);
    EG_CUDNN_CHECK(cudnnConvolutionBackwardFilter(h, &one, c.d.x.d, x.raw_any(), c.d.y.d, dy.raw_any(), c.d.conv,
                                                  c.bwd_filter, buf.raw(), c.bwd_filter_ws, direct ? &beta : &zero,
                                                  c.d.w, g.raw_any()));
    if (!direct) {
      const Tensor gp = g.to_plain();
      if (accumulate) axpy(gp, dw, 1.0);
      else if (dw.dtype() == t) dw.copy_(gp);
      else cast(gp, dw);
    }
  }
  if (db.defined() && t == DType::f32) {
    TensorDesc yd(dy.shape()), bd({1, db.numel(), 1, 1});
    EG_CUDNN_CHECK(cudnnConvolutionBackwardBias(h, &one, yd.d, dy.raw(), &beta, bd.d, db.raw()));
  } else if (db.defined() && db.dtype() == DType::f32 && !accumulate) {
    channel_sum(dy, db);
  } else if (db.defined()) {  // a 16-bit bias gradient (or an added one): summed in f32, rounded once
    Tensor db32 = Tensor::empty(db.shape(), DType::f32, db.device());
    channel_sum(dy, db32);
    if (accumulate) axpy(db32, db, 1.0);
    else cast(db32, db);
  }
}

}  // namespace eg::cudak
