// Softmax / log-softmax over the last dim, cross-entropy (label smoothing, ignore
// index), layer norm and the argmax of rows on CUDA, f32. One block per row with block reductions; the
// layer-norm parameter gradients are column sums (Note [Column sums] in common.cuh).
// Napkin math: softmax reads the row 3x (L1/L2-resident for rows <= ~8K floats).
#include "kernels/cuda/common.cuh"

namespace eg::cudak {

// ---- kernels
namespace {
__global__ void softmax_kernel(const float* x, float* y, int64_t rows, int64_t d, bool log) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* in = x + r * d;
    float* out = y + r * d;
    float m = -INFINITY;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) m = fmaxf(m, in[i]);
    m = block_max(m);
    float s = 0.f;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) s += expf(in[i] - m);
    s = block_sum(s);
    const float ls = m + logf(s);
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) out[i] = log ? in[i] - ls : expf(in[i] - ls);
  }
}
__global__ void softmax_bwd_kernel(const float* dy, const float* y, float* dx, int64_t rows, int64_t d, bool log) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float *g = dy + r * d, *o = y + r * d;
    float s = 0.f;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) s += log ? g[i] : g[i] * o[i];
    s = block_sum(s);
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x)
      dx[r * d + i] = log ? g[i] - expf(o[i]) * s : o[i] * (g[i] - s);
  }
}
// Per row: lse and the row's smoothed loss term; rows ignored contribute 0.
__global__ void ce_fwd_kernel(const float* logits, const int64_t* target, float* lse, float* row_loss, int64_t n,
                              int64_t c, float ls, int64_t ignore) {
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const float* in = logits + r * c;
    float m = -INFINITY;
    for (int64_t i = threadIdx.x; i < c; i += blockDim.x) m = fmaxf(m, in[i]);
    m = block_max(m);
    float s = 0.f, sum = 0.f;
    for (int64_t i = threadIdx.x; i < c; i += blockDim.x) s += expf(in[i] - m), sum += in[i];
    s = block_sum(s);
    sum = block_sum(sum);
    if (threadIdx.x == 0) {
      const float l = m + logf(s);
      lse[r] = l;
      const int64_t t = target[r];
      // A target outside the classes (checked on the host only for CPU targets) makes the
      // loss NaN, which stops a run, instead of reading another row's logit.
      row_loss[r] = t == ignore ? 0.f : t < 0 || t >= c ? NAN : (1.f - ls) * (l - in[t]) + ls * (l - sum / float(c));
    }
  }
}
__global__ void ce_reduce_kernel(const float* row_loss, const int64_t* target, float* loss, int64_t n, int64_t ignore) {
  float s = 0.f, cnt = 0.f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    s += row_loss[i];
    cnt += target[i] != ignore ? 1.f : 0.f;
  }
  s = block_sum(s);
  cnt = block_sum(cnt);
  if (threadIdx.x == 0) loss[0] = cnt > 0.f ? s / cnt : 0.f;
}
__global__ void ce_bwd_kernel(const float* dloss, const float* logits, const int64_t* target, const float* lse,
                              float* dl, int64_t n, int64_t c, float ls, int64_t ignore) {
  float cnt = 0.f;  // the rows counted, by the whole block (thread 0 alone took n loads per block)
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) cnt += target[i] != ignore ? 1.f : 0.f;
  cnt = block_sum(cnt);
  const float scale = cnt > 0.f ? dloss[0] / cnt : 0.f;
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const int64_t t = target[r];
    for (int64_t k = threadIdx.x; k < c; k += blockDim.x) {
      const float q = (1.f - ls) * (k == t ? 1.f : 0.f) + ls / float(c);
      dl[r * c + k] = t == ignore ? 0.f : scale * (expf(logits[r * c + k] - lse[r]) - q);
    }
  }
}
__global__ void layernorm_kernel(const float* x, const float* g, const float* b, float* y, float* mean, float* rstd,
                                 int64_t m, int64_t d, float eps) {
  for (int64_t r = blockIdx.x; r < m; r += gridDim.x) {
    const float* in = x + r * d;
    float s = 0.f;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) s += in[i];
    const float mu = block_sum(s) / float(d);
    float v = 0.f;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) v += (in[i] - mu) * (in[i] - mu);
    const float rs = rsqrtf(block_sum(v) / float(d) + eps);
    if (threadIdx.x == 0) mean[r] = mu, rstd[r] = rs;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) y[r * d + i] = (in[i] - mu) * rs * g[i] + b[i];
  }
}
__global__ void layernorm_dx_kernel(const float* dy, const float* x, const float* g, const float* mean,
                                    const float* rstd, float* dx, int64_t m, int64_t d) {
  for (int64_t r = blockIdx.x; r < m; r += gridDim.x) {
    const float mu = mean[r], rs = rstd[r];
    float s1 = 0.f, s2 = 0.f;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
      const float dxh = dy[r * d + i] * g[i];
      s1 += dxh;
      s2 += dxh * (x[r * d + i] - mu) * rs;
    }
    s1 = block_sum(s1) / float(d);
    s2 = block_sum(s2) / float(d);
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x)
      dx[r * d + i] = rs * (dy[r * d + i] * g[i] - s1 - (x[r * d + i] - mu) * rs * s2);
  }
}
// The parameter gradients' terms (Note [Column sums] in common.cuh): dy xhat for gamma,
// dy for beta.
struct LayerNormParamTerms {
  const float *dy, *x, *mean, *rstd;
  int64_t d;
  __device__ void operator()(int64_t r, int64_t i, float (&acc)[2]) const {
    const float g = dy[r * d + i];
    acc[0] += g * (x[r * d + i] - mean[r]) * rstd[r];
    acc[1] += g;
  }
};
// (value, index) pairs: the larger value wins, the smaller index on ties; NaN never wins.
__device__ __forceinline__ void better_of(float& v, int64_t& i, float v2, int64_t i2) {
  if (!isnan(v2) && (isnan(v) || v2 > v || (v2 == v && i2 < i))) v = v2, i = i2;
}
// One block per row: each thread scans a strided slice, then warps and the block reduce.
// Napkin math: one read of the row, 4 bytes/element; bandwidth-bound.
__global__ void argmax_rows_kernel(const float* x, int64_t* idx, int64_t rows, int64_t d) {
  __shared__ float shv[32];
  __shared__ int64_t shi[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* in = x + r * d;
    float v = NAN;
    int64_t i = d;
    for (int64_t k = threadIdx.x; k < d; k += blockDim.x) better_of(v, i, in[k], k);
    for (int o = 16; o > 0; o >>= 1) {
      const float v2 = __shfl_xor_sync(0xffffffffu, v, o);
      const int64_t i2 = __shfl_xor_sync(0xffffffffu, i, o);
      better_of(v, i, v2, i2);
    }
    __syncthreads();
    if ((threadIdx.x & 31) == 0) shv[threadIdx.x >> 5] = v, shi[threadIdx.x >> 5] = i;
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < int(blockDim.x >> 5); ++w) better_of(v, i, shv[w], shi[w]);
      idx[r] = i < d ? i : 0;  // a row of NaNs
    }
  }
}
unsigned rows_grid(int64_t rows) { return unsigned(std::max<int64_t>(1, std::min<int64_t>(rows, 65535))); }
}  // namespace

// ---- launchers
void argmax_rows(const Tensor& x, Tensor& idx) {
  require_f32(x, "argmax_rows");
  const int64_t d = x.size(-1), rows = d ? x.numel() / d : 0;
  if (!rows) return;
  argmax_rows_kernel<<<rows_grid(rows), kThreads, 0, stream()>>>(x.data<float>(), idx.data<int64_t>(), rows, d);
  cuda::after_launch("argmax_rows");
}

void softmax_fwd(const Tensor& x, Tensor& y, bool log) {
  require_f32(x, "softmax");
  const int64_t d = x.size(-1), rows = x.numel() / std::max<int64_t>(d, 1);
  if (!x.numel()) return;
  softmax_kernel<<<rows_grid(rows), kThreads, 0, stream()>>>(x.data<float>(), y.data<float>(), rows, d, log);
  cuda::after_launch("softmax_fwd");
}

void softmax_bwd(const Tensor& dy, const Tensor& y, Tensor& dx, bool log) {
  require_f32(y, "softmax backward");
  const int64_t d = y.size(-1), rows = y.numel() / std::max<int64_t>(d, 1);
  if (!y.numel()) return;
  softmax_bwd_kernel<<<rows_grid(rows), kThreads, 0, stream()>>>(dy.data<float>(), y.data<float>(), dx.data<float>(),
                                                                 rows, d, log);
  cuda::after_launch("softmax_bwd");
}

void cross_entropy_fwd(const Tensor& logits, const Tensor& target, Tensor& loss, Tensor& lse,
                       const ops::CrossEntropyParams& p) {
  require_f32(logits, "cross_entropy");
  const int64_t n = logits.size(0), c = logits.size(1);
  // The per-row losses live in a scratch buffer from the caching allocator (freed
  // stream-ordered, so reuse by the next op on this stream is safe).
  Tensor rows = Tensor::empty({std::max<int64_t>(n, 1)}, DType::f32, logits.device());
  ce_fwd_kernel<<<rows_grid(n), kThreads, 0, stream()>>>(logits.data<float>(), target.data<int64_t>(),
                                                         lse.data<float>(), rows.data<float>(), n, c,
                                                         float(p.label_smoothing), p.ignore_index);
  cuda::after_launch("cross_entropy_fwd");
  ce_reduce_kernel<<<1, 1024, 0, stream()>>>(rows.data<float>(), target.data<int64_t>(), loss.data<float>(), n,
                                             p.ignore_index);
  cuda::after_launch("cross_entropy_reduce");
}

void cross_entropy_bwd(const Tensor& dloss, const Tensor& logits, const Tensor& target, const Tensor& lse, Tensor& dl,
                       const ops::CrossEntropyParams& p) {
  require_f32(logits, "cross_entropy backward");
  const int64_t n = logits.size(0), c = logits.size(1);
  if (!n) return;
  ce_bwd_kernel<<<rows_grid(n), kThreads, 0, stream()>>>(dloss.data<float>(), logits.data<float>(),
                                                         target.data<int64_t>(), lse.data<float>(), dl.data<float>(), n,
                                                         c, float(p.label_smoothing), p.ignore_index);
  cuda::after_launch("cross_entropy_bwd");
}

void layernorm_fwd(const Tensor& x, const Tensor& g, const Tensor& b, Tensor& y, Tensor& mean, Tensor& rstd,
                   double eps) {
  require_f32(x, "layer_norm");
  const int64_t d = x.size(-1), m = x.numel() / std::max<int64_t>(d, 1);
  if (!m) return;
  layernorm_kernel<<<rows_grid(m), kThreads, 0, stream()>>>(x.data<float>(), g.data<float>(), b.data<float>(),
                                                            y.data<float>(), mean.data<float>(), rstd.data<float>(), m,
                                                            d, float(eps));
  cuda::after_launch("layernorm_fwd");
}

void layernorm_bwd(const Tensor& dy, const Tensor& x, const Tensor& g, const Tensor& mean, const Tensor& rstd,
                   Tensor& dx, Tensor& dg, Tensor& db, bool accumulate) {
  require_f32(x, "layer_norm backward");
  const int64_t d = x.size(-1), m = x.numel() / std::max<int64_t>(d, 1);
  if (!m) return;
  if (dx.defined()) {
    layernorm_dx_kernel<<<rows_grid(m), kThreads, 0, stream()>>>(dy.data<float>(), x.data<float>(), g.data<float>(),
                                                                 mean.data<float>(), rstd.data<float>(),
                                                                 dx.data<float>(), m, d);
    cuda::after_launch("layernorm_bwd_dx");
  }
  if (dg.defined() || db.defined()) {
    column_sums<2>(
        m, d, LayerNormParamTerms{dy.data<float>(), x.data<float>(), mean.data<float>(), rstd.data<float>(), d},
        ColumnOuts<2>{{dg.defined() ? dg.data<float>() : nullptr, db.defined() ? db.data<float>() : nullptr},
                      accumulate},
        x.device());
    cuda::after_launch("layernorm_bwd_params");
  }
}

}  // namespace eg::cudak
