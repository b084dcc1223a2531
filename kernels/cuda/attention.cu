// Scaled dot-product attention on CUDA, f32: one block per query row (b, h, t).
// Forward: scores over the S keys in shared memory, causal and key-padding masks,
// softmax (lse saved), out = P V. Backward recomputes P from lse; dq directly,
// dk and dv by atomic accumulation over query rows. A straightforward kernel
// (O(S) shared memory per row, S <= ~12K) rather than a flash-attention tiling:
// correct first; Transformer-tiny/base sequence lengths are short here.
#include "kernels/cuda/common.cuh"

namespace eg::cudak {

namespace {
struct AttnGeom {
  int64_t b, h, t, s, d;
  float scale;
  bool causal;
};

__device__ __forceinline__ bool masked(const AttnGeom& g, const uint8_t* mask, int64_t bi, int64_t ti, int64_t si) {
  return (g.causal && si > ti) || (mask && mask[bi * g.s + si]);
}

__global__ void attn_fwd_kernel(const float* q, const float* k, const float* v, const uint8_t* mask, float* out,
                                float* lse, AttnGeom g) {
  extern __shared__ float p[];  // [S]
  const int64_t row = blockIdx.x, bh = row / g.t, ti = row % g.t, bi = bh / g.h;
  const float* qr = q + row * g.d;
  const float* kb = k + bh * g.s * g.d;
  const float* vb = v + bh * g.s * g.d;
  float m = -INFINITY;
  for (int64_t si = threadIdx.x; si < g.s; si += blockDim.x) {
    float sc = -INFINITY;
    if (!masked(g, mask, bi, ti, si)) {
      sc = 0.f;
      for (int64_t j = 0; j < g.d; ++j) sc += qr[j] * kb[si * g.d + j];
      sc *= g.scale;
    }
    p[si] = sc;
    m = fmaxf(m, sc);
  }
  m = block_max(m);
  float sum = 0.f;
  for (int64_t si = threadIdx.x; si < g.s; si += blockDim.x) {
    const float e = m == -INFINITY ? 0.f : expf(p[si] - m);
    p[si] = e;
    sum += e;
  }
  sum = block_sum(sum);
  const float inv = sum > 0.f ? 1.f / sum : 0.f;  // a fully masked row yields zeros
  if (threadIdx.x == 0) lse[row] = sum > 0.f ? m + logf(sum) : INFINITY;  // as ref: Note [Attention masking and lse]
  __syncthreads();
  for (int64_t j = threadIdx.x; j < g.d; j += blockDim.x) {
    float acc = 0.f;
    for (int64_t si = 0; si < g.s; ++si) acc += p[si] * vb[si * g.d + j];
    out[row * g.d + j] = acc * inv;
  }
}

__global__ void attn_bwd_kernel(const float* dout, const float* q, const float* k, const float* v, const uint8_t* mask,
                                const float* out, const float* lse, float* dq, float* dk, float* dv, AttnGeom g) {
  extern __shared__ float sh[];  // p[S], ds[S]
  float* p = sh;
  float* ds = sh + g.s;
  const int64_t row = blockIdx.x, bh = row / g.t, ti = row % g.t, bi = bh / g.h;
  const float *qr = q + row * g.d, *gr = dout + row * g.d, *orow = out + row * g.d;
  const float* kb = k + bh * g.s * g.d;
  const float* vb = v + bh * g.s * g.d;
  const float l = lse[row];
  // delta = sum_j dout_j out_j
  float delta = 0.f;
  for (int64_t j = threadIdx.x; j < g.d; j += blockDim.x) delta += gr[j] * orow[j];
  delta = block_sum(delta);
  for (int64_t si = threadIdx.x; si < g.s; si += blockDim.x) {
    float pi = 0.f, dp = 0.f;
    if (!masked(g, mask, bi, ti, si) && l != INFINITY) {
      float sc = 0.f;
      for (int64_t j = 0; j < g.d; ++j) sc += qr[j] * kb[si * g.d + j], dp += gr[j] * vb[si * g.d + j];
      pi = expf(sc * g.scale - l);
    }
    p[si] = pi;
    ds[si] = pi * (dp - delta) * g.scale;
  }
  __syncthreads();
  for (int64_t j = threadIdx.x; j < g.d; j += blockDim.x) {
    float acc = 0.f;
    for (int64_t si = 0; si < g.s; ++si) acc += ds[si] * kb[si * g.d + j];
    dq[row * g.d + j] = acc;
  }
  for (int64_t e = threadIdx.x; e < g.s * g.d; e += blockDim.x) {
    const int64_t si = e / g.d, j = e % g.d;
    if (ds[si] != 0.f) atomicAdd(&dk[bh * g.s * g.d + e], ds[si] * qr[j]);
    if (p[si] != 0.f) atomicAdd(&dv[bh * g.s * g.d + e], p[si] * gr[j]);
  }
}

AttnGeom geom(const Tensor& q, const Tensor& k, const ops::AttentionParams& p) {
  const float scale = p.scale > 0 ? float(p.scale) : float(1.0 / std::sqrt(double(q.size(3))));
  return {q.size(0), q.size(1), q.size(2), k.size(2), q.size(3), scale, p.causal};
}
}  // namespace

void attention_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, Tensor& out, Tensor& lse,
                   const ops::AttentionParams& p) {
  require_f32(q, "attention");
  AttnGeom g = geom(q, k, p);
  const int64_t rows = g.b * g.h * g.t;
  if (!rows) return;
  const size_t smem = size_t(g.s) * sizeof(float);
  EG_CHECK(smem <= 48 * 1024, "attention on CUDA supports up to 12288 keys, got ", g.s);
  attn_fwd_kernel<<<unsigned(rows), 128, smem, stream()>>>(q.data<float>(), k.data<float>(), v.data<float>(),
                                                           mask.defined() ? mask.data<uint8_t>() : nullptr,
                                                           out.data<float>(), lse.data<float>(), g);
  cuda::after_launch("attention_fwd");
}

void attention_bwd(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                   const Tensor& out, const Tensor& lse, Tensor& dq, Tensor& dk, Tensor& dv,
                   const ops::AttentionParams& p) {
  require_f32(q, "attention backward");
  AttnGeom g = geom(q, k, p);
  EG_CUDA_CHECK(cudaMemsetAsync(dk.raw(), 0, dk.nbytes(), stream()));
  EG_CUDA_CHECK(cudaMemsetAsync(dv.raw(), 0, dv.nbytes(), stream()));
  const int64_t rows = g.b * g.h * g.t;
  if (!rows) return;
  const size_t smem = 2 * size_t(g.s) * sizeof(float);
  EG_CHECK(smem <= 48 * 1024, "attention backward on CUDA supports up to 6144 keys, got ", g.s);
  attn_bwd_kernel<<<unsigned(rows), 128, smem, stream()>>>(
      dout.data<float>(), q.data<float>(), k.data<float>(), v.data<float>(),
      mask.defined() ? mask.data<uint8_t>() : nullptr, out.data<float>(), lse.data<float>(), dq.data<float>(),
      dk.data<float>(), dv.data<float>(), g);
  cuda::after_launch("attention_bwd");
}

}  // namespace eg::cudak
