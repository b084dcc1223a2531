// The 16-bit batch norm on CUDA (Note [16-bit batch norm]): bf16 or f16 activations in
// NCHW or NHWC, parameters, statistics and their gradients f32 (Note [bf16 kernels] in
// kernels/ops.h); and the per-channel sum of a 16-bit convolution's bias gradient, which
// shares its slicing of the batch. batchnorm.cu chooses the precision and the layout.
#include <algorithm>

#include "kernels/cuda/batchnorm16.cuh"

namespace eg::cudak {

// Note [16-bit batch norm]
// Forward: (1) per (channel, slice of the batch) block, sums of x - K and (x - K)^2 in
// f32, K the channel's first element (a shift that keeps the sum of squares from
// cancelling), each thread's (count, mean, M2) merged by Chan's rule into a partial per
// block; (2) a warp per channel merges its partials in f64 into the batch mean, invstd,
// the running statistics and the coefficients of (3) y = (x - mean) a + beta
// [+ residual], then the fused activation, a = gamma invstd, rounded once to y's dtype.
// Backward: (1) per block, partial sums of dy' and dy' xhat (dy' = dy where the
// activation's output passes it; xhat = (x - mean) invstd); (2) a warp per channel:
// dbeta and dgamma, and the coefficients of (3)
// dx = gamma invstd (dy' - [dbeta + xhat dgamma] / M), computed as dy' A + (x - mean) B
// + C, the bracket only with batch statistics, and dresidual = dy'. Computing the
// coefficients once per channel leaves (3) four vector loads of them per 8 NHWC values
// (it loaded five parameters per element), and a thread per channel in (2) took up to
// 0.1 ms a call on the NHWC passes' hundreds of partials (an H100's profile). The slices give the GPU
// about four blocks per SM whatever the channel count (ResNet-50's stem has 64 channels
// of 1.6M values each at batch 128). Every pass reads and writes vectors of 8 where a
// channel's plane is whole vectors (Note [Vector loads] in common.cuh); the 32-bit index
// arithmetic is done once per vector.
namespace {

constexpr int kBnThreads = 256;

struct Slices {
  int64_t s, n, c, hw;
};
Slices slices_for(const Tensor& x) {
  const int64_t n = x.size(0), c = x.size(1), hw = x.size(2) * x.size(3);
  const int64_t want = std::max<int64_t>(1, (4 * 132 + c - 1) / c);
  return {std::min(n, want), n, c, hw};
}

// Chan's rule: (count, mean, M2) of two disjoint sets merged.
struct Moments {
  float n, mean, m2;
};
__device__ __forceinline__ Moments merge(Moments a, Moments b) {
  const float n = a.n + b.n;
  if (n == 0.f) return a;
  const float d = b.mean - a.mean, f = b.n / n;
  return {n, a.mean + d * f, a.m2 + b.m2 + d * d * a.n * f};
}
__device__ __forceinline__ Moments warp_merge(Moments m) {
  for (int o = 16; o > 0; o >>= 1) {
    Moments other{__shfl_xor_sync(0xffffffffu, m.n, o), __shfl_xor_sync(0xffffffffu, m.mean, o),
                  __shfl_xor_sync(0xffffffffu, m.m2, o)};
    m = merge(m, other);
  }
  return m;
}

// Samples [n0, n1) of block (channel, slice); vector k of the slice (hw vectors of V per
// sample) starts at ((n0 + k / hw) C + ch) hw V + (k % hw) V.
template <int V>
__device__ __forceinline__ int64_t slice_index(uint32_t k, uint32_t hw, int64_t n0, int64_t c, int64_t ch) {
  const uint32_t p = k / hw;
  return (((n0 + p) * c + ch) * int64_t(hw) + (k - p * hw)) * V;
}
__device__ __forceinline__ void slice_range(const Slices& sl, int64_t& n0, int64_t& n1) {
  n0 = sl.n * blockIdx.y / sl.s;
  n1 = sl.n * (blockIdx.y + 1) / sl.s;
}

template <int V>
__global__ void bn16_stats_kernel(const void* x, int tx, Slices sl, float3* part) {
  const int64_t ch = blockIdx.x;
  int64_t n0, n1;
  slice_range(sl, n0, n1);
  const float shift = ld(x, tx, ch * sl.hw);
  const uint32_t count = uint32_t((n1 - n0) * sl.hw / V), hw = uint32_t(sl.hw / V);
  float s1 = 0.f, s2 = 0.f, cnt = 0.f;
  for (uint32_t k = threadIdx.x; k < count; k += blockDim.x) {
    float v[V];
    ldv<V>(x, tx, slice_index<V>(k, hw, n0, sl.c, ch), v);
    for (int e = 0; e < V; ++e) {
      const float d = v[e] - shift;
      s1 += d;
      s2 += d * d;
    }
    cnt += float(V);
  }
  const float mean = cnt > 0.f ? s1 / cnt : 0.f;
  Moments m{cnt, mean, cnt > 0.f ? fmaxf(s2 - s1 * mean, 0.f) : 0.f};
  m = warp_merge(m);
  __shared__ Moments sh[kBnThreads / 32];
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    Moments t = sh[0];
    for (int w = 1; w < int(blockDim.x >> 5); ++w) t = merge(t, sh[w]);
    part[ch * sl.s + blockIdx.y] = make_float3(t.n, t.mean + shift, t.m2);
  }
}

// The final passes: a warp per channel (kFinalWarps channels a block), each lane merging
// every 32nd partial in f64, then the warp's lanes merged (Note [16-bit batch norm]).
constexpr int kFinalWarps = 8;
unsigned final_blocks(int64_t c) { return unsigned((c + kFinalWarps - 1) / kFinalWarps); }
__device__ __forceinline__ int64_t final_channel() { return int64_t(blockIdx.x) * kFinalWarps + threadIdx.x / 32; }
__device__ __forceinline__ void merge_f64(double& n, double& mu, double& m2, double nb, double mub, double m2b) {
  const double tn = n + nb;
  if (tn == 0) return;
  const double d = mub - mu, f = nb / tn;
  mu += d * f;
  m2 += m2b + d * d * n * f;
  n = tn;
}

// The apply pass's coefficients per channel (Note [16-bit batch norm]): rows mean,
// gamma invstd and beta of a [3, C] tensor, so y = (x - mean) a + beta.
__device__ __forceinline__ void apply_coefs(float* coef, int64_t c, int64_t ch, float mean, float invstd,
                                            const float* gamma, const float* beta) {
  coef[ch] = mean;
  coef[c + ch] = invstd * gamma[ch];
  coef[2 * c + ch] = beta[ch];
}

__global__ void bn16_stats_final_kernel(const float3* part, int64_t s, int64_t c, const float* gamma, const float* beta,
                                        float* mean, float* invstd, float* run_mean, float* run_var, float momentum,
                                        float eps, float* coef) {
  const int64_t ch = final_channel();
  if (ch >= c) return;  // the whole warp
  const int lane = int(threadIdx.x & 31);
  double n = 0, mu = 0, m2 = 0;
  for (int64_t j = lane; j < s; j += 32) {
    const float3 p = part[ch * s + j];
    merge_f64(n, mu, m2, p.x, p.y, p.z);
  }
  for (int o = 16; o > 0; o >>= 1) {
    const double nb = __shfl_xor_sync(0xffffffffu, n, o), mub = __shfl_xor_sync(0xffffffffu, mu, o),
                 m2b = __shfl_xor_sync(0xffffffffu, m2, o);
    merge_f64(n, mu, m2, nb, mub, m2b);
  }
  if (lane) return;
  const double var = m2 / n;
  const float is = float(1.0 / std::sqrt(var + double(eps)));
  mean[ch] = float(mu);
  invstd[ch] = is;
  apply_coefs(coef, c, ch, float(mu), is, gamma, beta);
  if (run_mean) {
    run_mean[ch] = float((1.0 - momentum) * run_mean[ch] + momentum * mu);
    run_var[ch] = float((1.0 - momentum) * run_var[ch] + momentum * (n > 1 ? m2 / (n - 1) : var));
  }
}
// Inference: the coefficients from the running statistics, invstd = 1/sqrt(var + eps).
__global__ void bn16_infer_coefs_kernel(const float* run_mean, const float* run_var, const float* gamma,
                                        const float* beta, float eps, int64_t c, float* coef) {
  EG_CUDA_LOOP(ch, c) apply_coefs(coef, c, ch, run_mean[ch], 1.f / sqrtf(run_var[ch] + eps), gamma, beta);
}

// The channel of element i of an NCHW or NHWC tensor (32-bit division where the tensor
// allows).
__device__ __forceinline__ int64_t channel_of(int64_t i, int64_t hw, int64_t c, bool small, bool nhwc) {
  if (nhwc) return small ? int64_t(uint32_t(i) % uint32_t(c)) : i % c;
  return small ? int64_t((uint32_t(i) / uint32_t(hw)) % uint32_t(c)) : (i / hw) % c;
}

// A vector of V holds one channel's values (NCHW: V divides hw) or V channels' values
// (NHWC: V divides C; element e is channel ch + e), so NCHW loads a vector's
// coefficients once and NHWC in vectors of V too (Note [Vector loads]).
template <int V, bool nhwc>
__device__ __forceinline__ void channel_coefs(const float* row, int64_t ch, float (&o)[V]) {
  if constexpr (nhwc) {
    ldv<V>(row, kF32, ch, o);
  } else {
    const float v = row[ch];
    for (int e = 0; e < V; ++e) o[e] = v;
  }
}
template <int V, bool nhwc>
__global__ void bn16_apply_kernel(const void* x, int tx, void* y, int ty, const void* res, int tr, const float* coef,
                                  ops::BnAct act, int64_t c, int64_t hw, int64_t n, bool small) {
  EG_CUDA_VEC_LOOP(i, V, 0, n) {
    const int64_t ch = channel_of(i, hw, c, small, nhwc);
    float v[V], r[V], mu[V], a[V], b[V];
    ldv<V>(x, tx, i, v);
    if (res) ldv<V>(res, tr, i, r);
    channel_coefs<V, nhwc>(coef, ch, mu);
    channel_coefs<V, nhwc>(coef + c, ch, a);
    channel_coefs<V, nhwc>(coef + 2 * c, ch, b);
    for (int e = 0; e < V; ++e) {
      v[e] = (v[e] - mu[e]) * a[e] + b[e];
      if (res) v[e] += r[e];
      if (act == ops::BnAct::relu) v[e] = fmaxf(v[e], 0.f);
      else if (act == ops::BnAct::relu6) v[e] = v[e] < 0.f ? 0.f : (v[e] > 6.f ? 6.f : v[e]);  // act.cu's select
    }
    stv<V>(y, ty, i, v);
  }
}

// The fused activation's output y (of dtype code t; nullptr without one), whose mask the
// gradient takes: y > 0, and y < 6 for ReLU6 (six).
struct ActMask {
  const void* y;
  int t;
  bool six;
};

// dy' = dy where the fused activation passes it (without one, dy), V elements from i.
template <int V>
__device__ __forceinline__ void masked_dy(const void* dy, int tdy, ActMask m, int64_t i, float (&g)[V]) {
  ldv<V>(dy, tdy, i, g);
  if (!m.y) return;
  float r[V];
  ldv<V>(m.y, m.t, i, r);
  for (int e = 0; e < V; ++e)
    if (!(r[e] > 0.f) || (m.six && !(r[e] < 6.f))) g[e] = 0.f;
}

// Per block: sum of dy' and of dy' xhat over its slice of the channel.
template <int V>
__global__ void bn16_bwd_sums_kernel(const void* dy, int tdy, const void* x, int tx, ActMask am, const float* mean,
                                     const float* invstd, Slices sl, float2* part) {
  const int64_t ch = blockIdx.x;
  int64_t n0, n1;
  slice_range(sl, n0, n1);
  const uint32_t count = uint32_t((n1 - n0) * sl.hw / V), hw = uint32_t(sl.hw / V);
  const float mu = mean[ch], is = invstd[ch];
  float sd = 0.f, sdx = 0.f;
  for (uint32_t k = threadIdx.x; k < count; k += blockDim.x) {
    const int64_t i = slice_index<V>(k, hw, n0, sl.c, ch);
    float g[V], xv[V];
    masked_dy<V>(dy, tdy, am, i, g);
    ldv<V>(x, tx, i, xv);
    for (int e = 0; e < V; ++e) {
      sd += g[e];
      sdx += g[e] * (xv[e] - mu) * is;
    }
  }
  sd = block_sum(sd);
  sdx = block_sum(sdx);
  if (threadIdx.x == 0) part[ch * sl.s + blockIdx.y] = make_float2(sd, sdx);
}

// Per channel: dbeta = sum dy' and dgamma = sum dy' xhat where wanted, and the input
// gradient's coefficients, rows of a [4, C] tensor: mean, A = gamma invstd, B = -A invstd
// dgamma / M and C = -A dbeta / M (B = C = 0 with frozen statistics), so that
// dx = dy' A + (x - mean) B + C.
__global__ void bn16_bwd_final_kernel(const float2* part, int64_t s, int64_t c, const float* gamma, const float* mean,
                                      const float* invstd, bool training, float inv_m, float* dbeta, float* dgamma,
                                      bool accumulate, float* coef) {
  const int64_t ch = final_channel();
  if (ch >= c) return;  // the whole warp
  const int lane = int(threadIdx.x & 31);
  double a = 0, b = 0;
  for (int64_t j = lane; j < s; j += 32) a += part[ch * s + j].x, b += part[ch * s + j].y;
  for (int o = 16; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o), b += __shfl_xor_sync(0xffffffffu, b, o);
  if (lane) return;
  if (dbeta) dbeta[ch] = accumulate ? dbeta[ch] + float(a) : float(a);  // + as axpy adds
  if (dgamma) dgamma[ch] = accumulate ? dgamma[ch] + float(b) : float(b);
  const float is = invstd[ch], A = gamma[ch] * is;
  coef[ch] = mean[ch];
  coef[c + ch] = A;
  coef[2 * c + ch] = training ? -A * is * float(b) * inv_m : 0.f;
  coef[3 * c + ch] = training ? -A * float(a) * inv_m : 0.f;
}

template <int V, bool nhwc>
__global__ void bn16_bwd_dx_kernel(const void* dy, int tdy, const void* x, int tx, ActMask am, const float* coef,
                                   bool training, void* dx, int tdx, void* dres, int tdr, int64_t c, int64_t hw,
                                   int64_t n, bool small) {
  EG_CUDA_VEC_LOOP(i, V, 0, n) {
    float g[V];
    masked_dy<V>(dy, tdy, am, i, g);
    if (dres) stv<V>(dres, tdr, i, g);
    if (!dx) continue;
    const int64_t ch = channel_of(i, hw, c, small, nhwc);
    float A[V];
    channel_coefs<V, nhwc>(coef + c, ch, A);
    if (training) {
      float xv[V], mu[V], B[V], C[V];
      ldv<V>(x, tx, i, xv);
      channel_coefs<V, nhwc>(coef, ch, mu);
      channel_coefs<V, nhwc>(coef + 2 * c, ch, B);
      channel_coefs<V, nhwc>(coef + 3 * c, ch, C);
      for (int e = 0; e < V; ++e) g[e] = g[e] * A[e] + ((xv[e] - mu[e]) * B[e] + C[e]);
    } else {
      for (int e = 0; e < V; ++e) g[e] *= A[e];
    }
    stv<V>(dx, tdx, i, g);
  }
}

// NHWC (Note [Channels-last activations on CUDA]): rows of C channels, N H W of them. A
// block takes w channel vectors (of V) side by side and `lanes` rows at a time (w lanes
// <= 256 threads, consecutive threads on consecutive channels: coalesced), over its
// slice of the rows; then a thread per channel of the block (w V <= 256) merges its
// lanes. The partials per (channel, slice) are the NCHW kernels', so the same final
// passes merge them.
struct RowSlices {
  int64_t rows, c, s;  // rows; channels; slices of the rows (gridDim.y)
  int w, lanes;
};
// per_sm: the blocks a 132-SM GPU holds at once per SM, so that the grid is whole waves.
RowSlices row_slices(const Tensor& x, int v, int per_sm) {
  RowSlices r;
  r.c = x.size(1);
  r.rows = x.numel() / std::max<int64_t>(r.c, 1);
  r.w = int(std::min<int64_t>(32, r.c / v));
  r.lanes = kBnThreads / r.w;
  const int64_t gx = (r.c / v + r.w - 1) / r.w;
  r.s = std::clamp<int64_t>((per_sm * 132 + gx - 1) / gx, 1, std::max<int64_t>(1, r.rows / r.lanes));
  return r;
}
__device__ __forceinline__ void row_range(const RowSlices& r, int64_t& r0, int64_t& r1) {
  r0 = r.rows * blockIdx.y / r.s;
  r1 = r.rows * (blockIdx.y + 1) / r.s;
}

// The NHWC statistics' lanes issue the loads of kRowsInFlight rows (ldv_raw) before they
// sum any, in the rows' order as one row at a time would: with one 16-byte load a thread
// in flight the pass was bound by latency, not bandwidth. Its registers (80) let an SM
// hold 3 of its blocks (__launch_bounds__ holds ptxas to that; to 64 it spills), and its
// grid is whole waves of them. The backward's sums load three tensors a row, so they have
// three times the bytes in flight already; unrolled they took 166 registers, one block
// an SM, and no more loads in flight.
constexpr int kRowsInFlight = 4;
constexpr int kStatsBlocksPerSm = 3;

template <int V>
__global__ void __launch_bounds__(kBnThreads, kStatsBlocksPerSm)
    bn16_stats_nhwc_kernel(const void* x, int tx, RowSlices rs, float3* part) {
  __shared__ float3 sh[kBnThreads][V];
  const int col = int(threadIdx.x) % rs.w, lane = int(threadIdx.x) / rs.w;
  const int64_t g = int64_t(blockIdx.x) * rs.w + col;  // this thread's channel vector
  const bool live = lane < rs.lanes && g < rs.c / V;
  int64_t r0, r1;
  row_range(rs, r0, r1);
  float shift[V], s1[V] = {}, s2[V] = {}, cnt = 0.f;
  if (live) ldv<V>(x, tx, g * V, shift);
  if (live)
    for (int64_t r = r0 + lane; r < r1; r += kRowsInFlight * rs.lanes) {
      RawVec<V> raw[kRowsInFlight];
      for (int u = 0; u < kRowsInFlight; ++u)
        if (r + u * rs.lanes < r1) raw[u] = ldv_raw<V>(x, tx, (r + u * rs.lanes) * rs.c + g * V);
      for (int u = 0; u < kRowsInFlight && r + u * rs.lanes < r1; ++u) {
        float v[V];
        ldv_cvt<V>(raw[u], tx, v);
        for (int e = 0; e < V; ++e) {
          const float d = v[e] - shift[e];
          s1[e] += d;
          s2[e] += d * d;
        }
        cnt += 1.f;
      }
    }
  for (int e = 0; e < V; ++e) {
    const float mean = cnt > 0.f ? s1[e] / cnt : 0.f;
    sh[threadIdx.x][e] = make_float3(cnt, mean, cnt > 0.f ? fmaxf(s2[e] - s1[e] * mean, 0.f) : 0.f);
  }
  __syncthreads();
  const int out_col = int(threadIdx.x) / V, out_e = int(threadIdx.x) % V;  // a thread per channel of the block
  const int64_t out_g = int64_t(blockIdx.x) * rs.w + out_col;
  if (out_col >= rs.w || out_g >= rs.c / V) return;
  float3 o = sh[out_col][out_e];
  Moments m{o.x, o.y, o.z};
  for (int l = 1; l < rs.lanes; ++l) {
    o = sh[l * rs.w + out_col][out_e];
    m = merge(m, Moments{o.x, o.y, o.z});
  }
  const float first = ld(x, tx, out_g * V + out_e);  // the shift its lanes used
  part[(out_g * V + out_e) * rs.s + blockIdx.y] = make_float3(m.n, m.mean + first, m.m2);
}

template <int V>
__global__ void bn16_bwd_sums_nhwc_kernel(const void* dy, int tdy, const void* x, int tx, ActMask am, const float* mean,
                                          const float* invstd, RowSlices rs, float2* part) {
  __shared__ float2 sh[kBnThreads][V];
  const int col = int(threadIdx.x) % rs.w, lane = int(threadIdx.x) / rs.w;
  const int64_t g = int64_t(blockIdx.x) * rs.w + col;
  const bool live = lane < rs.lanes && g < rs.c / V;
  int64_t r0, r1;
  row_range(rs, r0, r1);
  float mu[V], is[V], sd[V] = {}, sdx[V] = {};
  if (live)
    for (int e = 0; e < V; ++e) mu[e] = mean[g * V + e], is[e] = invstd[g * V + e];
  if (live)
    for (int64_t r = r0 + lane; r < r1; r += rs.lanes) {
      const int64_t i = r * rs.c + g * V;
      float gv[V], xv[V];
      masked_dy<V>(dy, tdy, am, i, gv);
      ldv<V>(x, tx, i, xv);
      for (int e = 0; e < V; ++e) {
        sd[e] += gv[e];
        sdx[e] += gv[e] * (xv[e] - mu[e]) * is[e];
      }
    }
  for (int e = 0; e < V; ++e) sh[threadIdx.x][e] = make_float2(sd[e], sdx[e]);
  __syncthreads();
  const int out_col = int(threadIdx.x) / V, out_e = int(threadIdx.x) % V;  // a thread per channel of the block
  const int64_t out_g = int64_t(blockIdx.x) * rs.w + out_col;
  if (out_col >= rs.w || out_g >= rs.c / V) return;
  float a = 0.f, b = 0.f;
  for (int l = 0; l < rs.lanes; ++l) a += sh[l * rs.w + out_col][out_e].x, b += sh[l * rs.w + out_col][out_e].y;
  part[(out_g * V + out_e) * rs.s + blockIdx.y] = make_float2(a, b);
}

__global__ void channel_sum_kernel(const void* dy, int t, Slices sl, float* part) {
  const int64_t ch = blockIdx.x;
  int64_t n0, n1;
  slice_range(sl, n0, n1);
  const uint32_t count = uint32_t((n1 - n0) * sl.hw), hw = uint32_t(sl.hw);
  float s = 0.f;
  for (uint32_t k = threadIdx.x; k < count; k += blockDim.x) s += ld(dy, t, slice_index<1>(k, hw, n0, sl.c, ch));
  s = block_sum(s);
  if (threadIdx.x == 0) part[ch * sl.s + blockIdx.y] = s;
}
__global__ void sum_rows_kernel(const float* part, int64_t s, int64_t c, float* out) {
  EG_CUDA_LOOP(ch, c) {
    double a = 0;
    for (int64_t j = 0; j < s; ++j) a += part[ch * s + j];
    out[ch] = float(a);
  }
}

const void* raw_or_null(const Tensor& t) { return t.defined() ? t.raw_any() : nullptr; }
int code_or_f32(const Tensor& t, const char* op) { return t.defined() ? dt_code(t, op) : kF32; }
ActMask act_mask(ops::BnAct act, const Tensor& act_y, const char* op) {
  return {act == ops::BnAct::none ? nullptr : act_y.raw_any(), code_or_f32(act_y, op), act == ops::BnAct::relu6};
}

void check_params(std::initializer_list<const Tensor*> ps, const char* op) {
  for (const Tensor* p : ps)
    if (p->defined())
      EG_CHECK(p->dtype() == DType::f32, op, " on CUDA: with 16-bit activations the parameters, statistics and ",
               "their gradients are f32, got ", dtype_name(p->dtype()));
}

// The 32-bit element counts of a slice (Note [16-bit batch norm]).
void check_slice_size(const Tensor& x, const char* op) {
  EG_CHECK(x.size(0) * x.size(2) * x.size(3) < (int64_t(1) << 31), op, " on CUDA: ", x.size(0) * x.size(2) * x.size(3),
           " values per channel; 16-bit activations take fewer than 2^31");
}

bool is_nhwc(const Tensor& x) { return x.format() == Format::nhwc; }

// f(std::integral_constant<int, V>): V = 8 where a channel's values come in whole vectors
// (its NCHW plane, or an NHWC row's channels) and every operand is aligned (Note [Vector
// loads]), else 1.
template <class F>
void with_vectors(const Tensor& x, std::initializer_list<const void*> ps, F&& f) {
  const int64_t run = is_nhwc(x) ? x.size(1) : x.size(2) * x.size(3);
  if (run % 8 == 0 && aligned16(ps)) f(std::integral_constant<int, 8>{});
  else f(std::integral_constant<int, 1>{});
}
bool small_index(const Tensor& x) { return x.numel() < (int64_t(1) << 32); }

// y = act((x - mean) a + beta [+ residual]), coef [3, C] from a final pass.
void bn16_apply(const Tensor& x, const Tensor& coef, ops::BnAct act, const Tensor& residual, Tensor& y) {
  const char* op = "batch_norm";
  with_vectors(x, {x.raw_any(), y.raw_any(), raw_or_null(residual), coef.raw()}, [&](auto v) {
    constexpr int V = decltype(v)::value;
    const auto kernel = is_nhwc(x) ? bn16_apply_kernel<V, true> : bn16_apply_kernel<V, false>;
    kernel<<<blocks_for(x.numel() / V), kThreads, 0, stream()>>>(
        x.raw_any(), dt_code(x, op), y.raw_any(), dt_code(y, op), raw_or_null(residual), code_or_f32(residual, op),
        coef.data<float>(), act, x.size(1), x.size(2) * x.size(3), x.numel(), small_index(x));
  });
  cuda::after_launch("batchnorm (16-bit) apply");
}

// A 16-bit pass's partial sums per (channel, slice of the batch), `floats` of them each,
// in x's layout: launch(V, grid, geometry, part) runs the NHWC kernel for a RowSlices
// geometry, the NCHW one for Slices; the final passes merge the `s` slices alike.
struct Partials {
  Tensor part;
  int64_t s = 0;
};
template <class Launch>
Partials channel_partials(const Tensor& x, std::initializer_list<const void*> ps, int64_t floats, int nhwc_per_sm,
                          Launch&& launch) {
  const int64_t c = x.size(1);
  Partials p;
  with_vectors(x, ps, [&](auto v) {
    constexpr int V = decltype(v)::value;
    auto run = [&](const auto& geometry, int64_t s, dim3 grid) {
      p.s = s;
      p.part = Tensor::empty({c * s * floats}, DType::f32, x.device());
      launch(v, grid, geometry, p.part.data<float>());
    };
    if (is_nhwc(x)) {
      const RowSlices rs = row_slices(x, V, nhwc_per_sm);
      run(rs, rs.s, dim3(unsigned((c / V + rs.w - 1) / rs.w), unsigned(rs.s)));
    } else {
      const Slices sl = slices_for(x);
      run(sl, sl.s, dim3(unsigned(c), unsigned(sl.s)));
    }
  });
  return p;
}
template <class G>
constexpr bool is_rows = std::is_same_v<std::decay_t<G>, RowSlices>;
}  // namespace

void channel_sum(const Tensor& dy, Tensor& db) {
  require_f32(db, "a bias gradient");
  if (!dy.numel()) {  // an empty batch: no gradient
    if (db.numel()) EG_CUDA_CHECK(cudaMemsetAsync(db.raw(), 0, db.nbytes(), stream()));
    return;
  }
  check_slice_size(dy, "a bias gradient");
  const Slices sl = slices_for(dy);
  Tensor part = Tensor::empty({sl.c * sl.s}, DType::f32, dy.device());
  channel_sum_kernel<<<dim3(unsigned(sl.c), unsigned(sl.s)), kBnThreads, 0, stream()>>>(
      dy.raw(), dt_code(dy, "a bias gradient"), sl, part.data<float>());
  sum_rows_kernel<<<blocks_for(sl.c), kThreads, 0, stream()>>>(part.data<float>(), sl.s, sl.c, db.data<float>());
  cuda::after_launch("channel_sum");
}

void bn16_fwd_train(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& y, Tensor& save_mean,
                    Tensor& save_invstd, Tensor& running_mean, Tensor& running_var, double momentum, double eps,
                    ops::BnAct act, const Tensor& residual) {
  const bool run = running_mean.defined() && running_var.defined();
  check_params({&gamma, &beta, &save_mean, &save_invstd, &running_mean, &running_var}, "batch_norm");
  check_slice_size(x, "batch_norm");
  if (!x.numel()) return;
  const int64_t c = x.size(1);
  const Partials p =
      channel_partials(x, {x.raw_any()}, 3, kStatsBlocksPerSm, [&](auto v, dim3 grid, const auto& g, float* part) {
        constexpr int V = decltype(v)::value;
        auto* p3 = reinterpret_cast<float3*>(part);
        if constexpr (is_rows<decltype(g)>)
          bn16_stats_nhwc_kernel<V><<<grid, kBnThreads, 0, stream()>>>(x.raw_any(), dt_code(x, "batch_norm"), g, p3);
        else bn16_stats_kernel<V><<<grid, kBnThreads, 0, stream()>>>(x.raw_any(), dt_code(x, "batch_norm"), g, p3);
      });
  Tensor coef = Tensor::empty({3, c}, DType::f32, x.device());
  bn16_stats_final_kernel<<<final_blocks(c), 32 * kFinalWarps, 0, stream()>>>(
      reinterpret_cast<float3*>(p.part.data<float>()), p.s, c, gamma.data<float>(), beta.data<float>(),
      save_mean.data<float>(), save_invstd.data<float>(), run ? running_mean.data<float>() : nullptr,
      run ? running_var.data<float>() : nullptr, float(momentum), float(eps), coef.data<float>());
  cuda::after_launch("batchnorm (16-bit) statistics");
  return bn16_apply(x, coef, act, residual, y);
}

void bn16_fwd_infer(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                    const Tensor& running_var, Tensor& y, double eps, ops::BnAct act, const Tensor& residual) {
  check_params({&gamma, &beta, &running_mean, &running_var}, "batch_norm");
  if (!x.numel()) return;
  const int64_t c = x.size(1);
  Tensor coef = Tensor::empty({3, c}, DType::f32, x.device());
  bn16_infer_coefs_kernel<<<blocks_for(c), kThreads, 0, stream()>>>(
      running_mean.data<float>(), running_var.data<float>(), gamma.data<float>(), beta.data<float>(), float(eps), c,
      coef.data<float>());
  cuda::after_launch("batchnorm (16-bit) coefficients");
  return bn16_apply(x, coef, act, residual, y);
}

void bn16_bwd(const Tensor& dy_in, const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& invstd,
              Tensor& dx, Tensor& dgamma, Tensor& dbeta, bool training, ops::BnAct act, const Tensor& act_y,
              Tensor& dresidual, bool accumulate) {
  const int64_t n = x.size(0), c = x.size(1), hw = x.size(2) * x.size(3);
  const char* op = "batch_norm backward";
  check_params({&gamma, &mean, &invstd, &dgamma, &dbeta}, op);
  check_slice_size(x, op);
  if (!x.numel()) return;
  Tensor coef = Tensor::empty({4, c}, DType::f32, x.device());
  const ActMask am = act_mask(act, act_y, op);
  const Partials p = channel_partials(x, {dy_in.raw_any(), x.raw_any(), am.y}, 2, 4,
                                      [&](auto v, dim3 grid, const auto& g, float* part) {
    constexpr int V = decltype(v)::value;
    auto* p2 = reinterpret_cast<float2*>(part);
    const void *pdy = dy_in.raw_any(), *px = x.raw_any();
    const int tdy = dt_code(dy_in, op), tx = dt_code(x, op);
    if constexpr (is_rows<decltype(g)>)
      bn16_bwd_sums_nhwc_kernel<V>
          <<<grid, kBnThreads, 0, stream()>>>(pdy, tdy, px, tx, am, mean.data<float>(), invstd.data<float>(), g, p2);
    else
      bn16_bwd_sums_kernel<V>
          <<<grid, kBnThreads, 0, stream()>>>(pdy, tdy, px, tx, am, mean.data<float>(), invstd.data<float>(), g, p2);
  });
  bn16_bwd_final_kernel<<<final_blocks(c), 32 * kFinalWarps, 0, stream()>>>(
      reinterpret_cast<float2*>(p.part.data<float>()), p.s, c, gamma.data<float>(), mean.data<float>(),
      invstd.data<float>(), training, float(1.0 / double(n * hw)), dbeta.defined() ? dbeta.data<float>() : nullptr,
      dgamma.defined() ? dgamma.data<float>() : nullptr, accumulate, coef.data<float>());
  if (dx.defined() || dresidual.defined())
    with_vectors(x, {dy_in.raw_any(), x.raw_any(), am.y, raw_or_null(dx), raw_or_null(dresidual), coef.raw()},
                 [&](auto v) {
      constexpr int V = decltype(v)::value;
      const auto kernel = is_nhwc(x) ? bn16_bwd_dx_kernel<V, true> : bn16_bwd_dx_kernel<V, false>;
      kernel<<<blocks_for(x.numel() / V), kThreads, 0, stream()>>>(
          dy_in.raw_any(), dt_code(dy_in, op), x.raw_any(), dt_code(x, op), am, coef.data<float>(), training,
          dx.defined() ? dx.raw_any() : nullptr, code_or_f32(dx, op),
          dresidual.defined() ? dresidual.raw_any() : nullptr, code_or_f32(dresidual, op), c, hw, x.numel(),
          small_index(x));
    });
  cuda::after_launch("batchnorm_bwd (16-bit)");
}

}  // namespace eg::cudak
