// Convolution and batch norm on CUDA through cuDNN 9 (legacy API), f32, NCHW. The
// convolution's forward also takes f16 tensors (x, w, bias and y all f16, products
// accumulated in f32 on tensor cores: cuDNN's PSEUDO_HALF_CONFIG), for the fp16
// reference model (quant/reference.h); its backward is f32 only.
// conv: a plan per (shapes, params, math mode) holds the descriptors and, per pass, the
// algorithm from cudnnGet*Algorithm_v7 (or timed by cudnnFind*, EG_CUDNN_BENCHMARK=1):
// the fastest whose workspace fits 256 MiB. Workspaces come from the caching allocator. BN: cuDNN's spatial batch norm (saveInvVariance is exactly our
// invstd = 1/sqrt(var + eps); running variance is the unbiased one, as ops.h); the
// inference-mode backward (frozen statistics) is our kernel.
#include <array>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "kernels/cuda/common.cuh"

namespace eg::cudak {

namespace {

constexpr size_t kMaxWorkspace = size_t(256) << 20;

cudnnDataType_t cudnn_type(DType t) {
  EG_CHECK(t == DType::f32 || t == DType::f16, "internal: cuDNN descriptor for ", dtype_name(t));
  return t == DType::f16 ? CUDNN_DATA_HALF : CUDNN_DATA_FLOAT;
}

struct TensorDesc {
  cudnnTensorDescriptor_t d = nullptr;
  explicit TensorDesc(const Shape& s, DType t = DType::f32) {
    EG_CUDNN_CHECK(cudnnCreateTensorDescriptor(&d));
    EG_CUDNN_CHECK(
        cudnnSetTensor4dDescriptor(d, CUDNN_TENSOR_NCHW, cudnn_type(t), int(s[0]), int(s[1]), int(s[2]), int(s[3])));
  }
  ~TensorDesc() { cudnnDestroyTensorDescriptor(d); }
};

struct ConvDescs {
  TensorDesc x, y;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  ConvDescs(const Shape& xs, const Shape& ws, const Shape& ys, const ops::Conv2dParams& p, DType t)
      : x(xs, t), y(ys, t) {
    EG_CUDNN_CHECK(cudnnCreateFilterDescriptor(&w));
    EG_CUDNN_CHECK(cudnnSetFilter4dDescriptor(w, cudnn_type(t), CUDNN_TENSOR_NCHW, int(ws[0]), int(ws[1]), int(ws[2]),
                                              int(ws[3])));
    EG_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&conv));
    EG_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(conv, int(p.pad_h), int(p.pad_w), int(p.stride_h), int(p.stride_w),
                                                   int(p.dil_h), int(p.dil_w), CUDNN_CROSS_CORRELATION,
                                                   CUDNN_DATA_FLOAT));  // f32 accumulation for f16 too
    EG_CUDNN_CHECK(cudnnSetConvolutionGroupCount(conv, int(p.groups)));
    // CUDNN_DEFAULT_MATH lets cuDNN use TF32 tensor cores on Ampere and newer; FMA_MATH
    // keeps IEEE f32 (see eg::set_allow_tf32). f16 data always may use tensor cores.
    EG_CUDNN_CHECK(cudnnSetConvolutionMathType(conv, t == DType::f16 ? CUDNN_TENSOR_OP_MATH
                                                     : allow_tf32()  ? CUDNN_DEFAULT_MATH
                                                                     : CUDNN_FMA_MATH));
  }
  ~ConvDescs() {
    cudnnDestroyConvolutionDescriptor(conv);
    cudnnDestroyFilterDescriptor(w);
  }
};

// EG_CUDNN_BENCHMARK=1: time the candidate algorithms once per shape (cudnnFind*, as
// torch.backends.cudnn.benchmark) instead of trusting cuDNN's heuristics. Faster steps;
// the choice depends on timings, so runs are no longer bit-reproducible on the GPU.
bool cudnn_benchmark() {
  static const bool on = [] {
    const char* e = std::getenv("EG_CUDNN_BENCHMARK");
    return e && std::string(e) == "1";
  }();
  return on;
}

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
  ConvPlan(const Shape& xs, const Shape& ws, const Shape& ys, const ops::Conv2dParams& p, DType t)
      : d(xs, ws, ys, p, t) {}
};

using ConvKey = std::array<int64_t, 19>;

// First (fastest by cuDNN's heuristics, or by timing) algorithm whose workspace fits.
template <class Perf>
std::pair<decltype(Perf::algo), size_t> first_fitting(const Perf* perf, int found, const char* pass) {
  for (int i = 0; i < found; ++i)
    if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].memory <= kMaxWorkspace)
      return {perf[i].algo, perf[i].memory};
  EG_THROW("cuDNN found no ", pass, " convolution algorithm within a ", kMaxWorkspace >> 20, " MiB workspace");
}

// The plan for x [N,C,H,W] and w [K,C/g,R,S] of dtype t; y's shape follows from them and p.
ConvPlan& conv_plan(const Shape& xs, const Shape& ws, const Shape& ys, const ops::Conv2dParams& p,
                    DType t = DType::f32) {
  static std::mutex mu;
  static std::map<ConvKey, std::unique_ptr<ConvPlan>> plans;
  int dev = 0;
  EG_CUDA_CHECK(cudaGetDevice(&dev));
  const ConvKey key{
      dev,   allow_tf32(), cudnn_benchmark(), xs[0],   xs[1],   xs[2],   xs[3],   ws[0],    ws[1],     ws[2],
      ws[3], p.stride_h,   p.stride_w,        p.pad_h, p.pad_w, p.dil_h, p.dil_w, p.groups, int64_t(t)};
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = plans[key];
  if (!slot) slot = std::make_unique<ConvPlan>(xs, ws, ys, p, t);
  return *slot;
}

Tensor workspace(size_t bytes, Device d) { return Tensor::empty({int64_t(std::max<size_t>(bytes, 1))}, DType::u8, d); }

__global__ void bn_infer_bwd_dx_kernel(const float* dy, const float* gamma, const float* invstd, float* dx, int64_t c,
                                       int64_t hw, int64_t n) {
  EG_CUDA_LOOP(i, n) {
    const int64_t ch = (i / hw) % c;
    dx[i] = dy[i] * gamma[ch] * invstd[ch];
  }
}
// Per channel: dgamma = sum dy (x - mean) invstd, dbeta = sum dy.
__global__ void bn_param_grad_kernel(const float* dy, const float* x, const float* mean, const float* invstd, float* dg,
                                     float* db, int64_t n, int64_t c, int64_t hw) {
  for (int64_t ch = blockIdx.x; ch < c; ch += gridDim.x) {
    float sg = 0.f, sb = 0.f;
    for (int64_t k = threadIdx.x; k < n * hw; k += blockDim.x) {
      const int64_t i = (k / hw) * c * hw + ch * hw + k % hw;
      sg += dy[i] * (x[i] - mean[ch]) * invstd[ch];
      sb += dy[i];
    }
    sg = block_sum(sg);
    sb = block_sum(sb);
    if (threadIdx.x == 0) {
      if (dg) dg[ch] = sg;
      if (db) db[ch] = sb;
    }
  }
}

}  // namespace

// ---- convolution
void conv2d_fwd(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y, const ops::Conv2dParams& p) {
  const DType t = x.dtype();
  EG_CHECK(t == DType::f32 || t == DType::f16, "conv2d on CUDA supports f32 and f16 tensors, got ", dtype_name(t));
  EG_CHECK(w.dtype() == t && y.dtype() == t && (!bias.defined() || bias.dtype() == t),
           "conv2d on CUDA: input, weight, bias and output must share one dtype, got ", dtype_name(t), ", ",
           dtype_name(w.dtype()), ", ", bias.defined() ? dtype_name(bias.dtype()) : "none", ", ",
           dtype_name(y.dtype()));
  cudnnHandle_t h = cuda::cudnn_handle();
  ConvPlan& c = conv_plan(x.shape(), w.shape(), y.shape(), p, t);
  if (!c.has_fwd) {
    cudnnConvolutionFwdAlgoPerf_t perf[16];
    int found = 0;
    if (cudnn_benchmark())
      EG_CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithm(h, c.d.x.d, c.d.w, c.d.conv, c.d.y.d, 16, &found, perf));
    else EG_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, c.d.x.d, c.d.w, c.d.conv, c.d.y.d, 16, &found, perf));
    c.fwd = first_fitting(perf, found, "forward").first;
    EG_CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(h, c.d.x.d, c.d.w, c.d.conv, c.d.y.d, c.fwd, &c.fwd_ws));
    c.has_fwd = true;
  }
  Tensor buf = workspace(c.fwd_ws, x.device());
  const float one = 1.f, zero = 0.f;
  EG_CUDNN_CHECK(cudnnConvolutionForward(h, &one, c.d.x.d, x.raw(), c.d.w, w.raw(), c.d.conv, c.fwd, buf.raw(),
                                         c.fwd_ws, &zero, c.d.y.d, y.raw()));
  if (bias.defined()) {
    TensorDesc bd({1, bias.numel(), 1, 1}, t);
    EG_CUDNN_CHECK(cudnnAddTensor(h, &one, bd.d, bias.raw(), &one, c.d.y.d, y.raw()));
  }
}

void conv2d_bwd_data(const Tensor& dy, const Tensor& w, Tensor& dx, const ops::Conv2dParams& p) {
  require_f32(dy, "conv2d backward");
  cudnnHandle_t h = cuda::cudnn_handle();
  ConvPlan& c = conv_plan(dx.shape(), w.shape(), dy.shape(), p);
  if (!c.has_bwd_data) {
    cudnnConvolutionBwdDataAlgoPerf_t perf[16];
    int found = 0;
    if (cudnn_benchmark())
      EG_CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithm(h, c.d.w, c.d.y.d, c.d.conv, c.d.x.d, 16, &found, perf));
    else
      EG_CUDNN_CHECK(
          cudnnGetConvolutionBackwardDataAlgorithm_v7(h, c.d.w, c.d.y.d, c.d.conv, c.d.x.d, 16, &found, perf));
    c.bwd_data = first_fitting(perf, found, "backward-data").first;
    EG_CUDNN_CHECK(
        cudnnGetConvolutionBackwardDataWorkspaceSize(h, c.d.w, c.d.y.d, c.d.conv, c.d.x.d, c.bwd_data, &c.bwd_data_ws));
    c.has_bwd_data = true;
  }
  Tensor buf = workspace(c.bwd_data_ws, dy.device());
  const float one = 1.f, zero = 0.f;
  EG_CUDNN_CHECK(cudnnConvolutionBackwardData(h, &one, c.d.w, w.raw(), c.d.y.d, dy.raw(), c.d.conv, c.bwd_data,
                                              buf.raw(), c.bwd_data_ws, &zero, c.d.x.d, dx.raw()));
}

void conv2d_bwd_weight(const Tensor& dy, const Tensor& x, Tensor& dw, Tensor& db, const ops::Conv2dParams& p) {
  require_f32(dy, "conv2d backward");
  cudnnHandle_t h = cuda::cudnn_handle();
  const float one = 1.f, zero = 0.f;
  if (dw.defined()) {
    ConvPlan& c = conv_plan(x.shape(), dw.shape(), dy.shape(), p);
    if (!c.has_bwd_filter) {
      cudnnConvolutionBwdFilterAlgoPerf_t perf[16];
      int found = 0;
      if (cudnn_benchmark())
        EG_CUDNN_CHECK(
            cudnnFindConvolutionBackwardFilterAlgorithm(h, c.d.x.d, c.d.y.d, c.d.conv, c.d.w, 16, &found, perf));
      else
        EG_CUDNN_CHECK(
            cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, c.d.x.d, c.d.y.d, c.d.conv, c.d.w, 16, &found, perf));
      c.bwd_filter = first_fitting(perf, found, "backward-filter").first;
      EG_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(h, c.d.x.d, c.d.y.d, c.d.conv, c.d.w, c.bwd_filter,
                                                                    &c.bwd_filter_ws));
      c.has_bwd_filter = true;
    }
    Tensor buf = workspace(c.bwd_filter_ws, dy.device());
    EG_CUDNN_CHECK(cudnnConvolutionBackwardFilter(h, &one, c.d.x.d, x.raw(), c.d.y.d, dy.raw(), c.d.conv, c.bwd_filter,
                                                  buf.raw(), c.bwd_filter_ws, &zero, c.d.w, dw.raw()));
  }
  if (db.defined()) {
    TensorDesc yd(dy.shape()), bd({1, db.numel(), 1, 1});
    EG_CUDNN_CHECK(cudnnConvolutionBackwardBias(h, &one, yd.d, dy.raw(), &zero, bd.d, db.raw()));
  }
}

// ---- batch norm
void batchnorm_fwd_train(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& y, Tensor& save_mean,
                         Tensor& save_invstd, Tensor& running_mean, Tensor& running_var, double momentum, double eps,
                         bool relu, const Tensor& residual) {
  require_f32(x, "batch_norm");
  cudnnHandle_t h = cuda::cudnn_handle();
  TensorDesc xd(x.shape()), pd({1, x.size(1), 1, 1});
  const float one = 1.f, zero = 0.f;
  const bool run = running_mean.defined() && running_var.defined();
  EG_CUDNN_CHECK(cudnnBatchNormalizationForwardTraining(
      h, CUDNN_BATCHNORM_SPATIAL, &one, &zero, xd.d, x.raw(), xd.d, y.raw(), pd.d, gamma.raw(), beta.raw(), momentum,
      run ? running_mean.raw() : nullptr, run ? running_var.raw() : nullptr, std::max(eps, CUDNN_BN_MIN_EPSILON),
      save_mean.raw(), save_invstd.raw()));
  // Residual and ReLU as their own elementwise passes, in place (cuDNN's fused
  // BN-add-activation wants NHWC half).
  if (residual.defined()) binary_fwd(ops::Binary::add, y, residual, y);
  if (relu) act_fwd(ops::Act::relu, y, y);
}

void batchnorm_fwd_infer(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                         const Tensor& running_var, Tensor& y, double eps, bool relu, const Tensor& residual) {
  require_f32(x, "batch_norm");
  cudnnHandle_t h = cuda::cudnn_handle();
  TensorDesc xd(x.shape()), pd({1, x.size(1), 1, 1});
  const float one = 1.f, zero = 0.f;
  EG_CUDNN_CHECK(cudnnBatchNormalizationForwardInference(h, CUDNN_BATCHNORM_SPATIAL, &one, &zero, xd.d, x.raw(), xd.d,
                                                         y.raw(), pd.d, gamma.raw(), beta.raw(), running_mean.raw(),
                                                         running_var.raw(), std::max(eps, CUDNN_BN_MIN_EPSILON)));
  if (residual.defined()) binary_fwd(ops::Binary::add, y, residual, y);
  if (relu) act_fwd(ops::Act::relu, y, y);
}

void batchnorm_bwd(const Tensor& dy_in, const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& invstd,
                   Tensor& dx, Tensor& dgamma, Tensor& dbeta, bool training, const Tensor& relu_y, Tensor& dresidual) {
  require_f32(x, "batch_norm backward");
  // The fused ReLU's mask as its own pass (cuDNN's fused BN-activation backward wants NHWC
  // half), written into the residual's gradient when that is wanted.
  Tensor dy = dy_in;
  if (relu_y.defined()) {
    dy = dresidual.defined() ? dresidual : Tensor::empty(dy_in.shape(), DType::f32, dy_in.device());
    act_bwd(ops::Act::relu, dy_in, relu_y, dy);
  } else if (dresidual.defined()) {
    dresidual.copy_(dy_in);
  }
  const int64_t n = x.size(0), c = x.size(1), hw = x.size(2) * x.size(3);
  if (!training) {  // statistics are constants
    if (dx.defined() && x.numel())
      bn_infer_bwd_dx_kernel<<<blocks_for(x.numel()), kThreads, 0, stream()>>>(
          dy.data<float>(), gamma.data<float>(), invstd.data<float>(), dx.data<float>(), c, hw, x.numel());
    if (dgamma.defined() || dbeta.defined())
      bn_param_grad_kernel<<<unsigned(std::min<int64_t>(c, 65535)), kThreads, 0, stream()>>>(
          dy.data<float>(), x.data<float>(), mean.data<float>(), invstd.data<float>(),
          dgamma.defined() ? dgamma.data<float>() : nullptr, dbeta.defined() ? dbeta.data<float>() : nullptr, n, c, hw);
    cuda::after_launch("batchnorm_bwd(inference)");
    return;
  }
  cudnnHandle_t h = cuda::cudnn_handle();
  TensorDesc xd(x.shape()), pd({1, c, 1, 1});
  // cuDNN writes all three gradients; skipped ones go to scratch.
  Tensor gx = dx.defined() ? dx : Tensor::empty(x.shape(), DType::f32, x.device());
  Tensor gg = dgamma.defined() ? dgamma : Tensor::empty({c}, DType::f32, x.device());
  Tensor gb = dbeta.defined() ? dbeta : Tensor::empty({c}, DType::f32, x.device());
  const float one = 1.f, zero = 0.f;
  EG_CUDNN_CHECK(cudnnBatchNormalizationBackward(h, CUDNN_BATCHNORM_SPATIAL, &one, &zero, &one, &zero, xd.d, x.raw(),
                                                 xd.d, dy.raw(), xd.d, gx.raw(), pd.d, gamma.raw(), gg.raw(), gb.raw(),
                                                 CUDNN_BN_MIN_EPSILON, mean.raw(), invstd.raw()));
}

}  // namespace eg::cudak
