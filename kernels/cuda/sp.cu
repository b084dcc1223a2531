// SP-loss pieces on the GPU (Egeria §4.2.1): the row-normalised Gram matrix of a
// training activation is computed where the activation lives, so only B x B floats
// ever leave the device. Three kernels: a split-K tiled Gram over the upper triangle
// (mirrored), a per-row L2 normalisation, and a block-reduced squared distance.
// Split-K partial sums meet in atomicAdd, so the last bits of G may differ from run
// to run (plasticity is a smoothed trend; decisions do not hinge on them).
#include <algorithm>

#include "kernels/cuda/common.cuh"

namespace eg::cudak {

namespace {

constexpr int kTile = 16;

__global__ void gram_kernel(const float* __restrict__ x, float* __restrict__ g, int b, int64_t f, int64_t chunk) {
  const int ti = blockIdx.y, tj = blockIdx.x;
  if (tj < ti) return;  // symmetric: the upper tiles are computed and mirrored
  __shared__ float a[kTile][kTile + 1], c[kTile][kTile + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t k0 = int64_t(blockIdx.z) * chunk, k1 = min(f, k0 + chunk);
  const int ra = ti * kTile + ty, rc = tj * kTile + ty;
  float acc = 0.f;
  for (int64_t k = k0; k < k1; k += kTile) {
    const int64_t kk = k + tx;
    a[ty][tx] = (ra < b && kk < k1) ? x[int64_t(ra) * f + kk] : 0.f;
    c[ty][tx] = (rc < b && kk < k1) ? x[int64_t(rc) * f + kk] : 0.f;
    __syncthreads();
#pragma unroll
    for (int q = 0; q < kTile; ++q) acc += a[ty][q] * c[tx][q];
    __syncthreads();
  }
  const int row = ti * kTile + ty, col = tj * kTile + tx;
  if (row < b && col < b) {
    atomicAdd(&g[int64_t(row) * b + col], acc);
    if (ti != tj) atomicAdd(&g[int64_t(col) * b + row], acc);
  }
}

__global__ void row_normalize_kernel(float* g, int b) {
  float* row = g + int64_t(blockIdx.x) * b;
  float s = 0.f;
  for (int j = threadIdx.x; j < b; j += blockDim.x) s += row[j] * row[j];
  s = block_sum(s);
  const float inv = 1.f / fmaxf(sqrtf(s), 1e-12f);
  for (int j = threadIdx.x; j < b; j += blockDim.x) row[j] *= inv;
}

__global__ void sq_dist_kernel(const float* a, const float* c, float* out, int64_t n, float scale) {
  float s = 0.f;
  EG_CUDA_LOOP(i, n) {
    const float d = a[i] - c[i];
    s += d * d;
  }
  s = block_sum(s);
  if (threadIdx.x == 0) atomicAdd(out, s * scale);
}

}  // namespace

void sp_gram(const Tensor& x, Tensor& g) {
  require_f32(x, "sp_gram");
  const int64_t b = x.size(0), f = x.numel() / b;
  EG_CHECK(b <= (int64_t(1) << 20), "sp_gram: batch ", b, " is too large");
  cudaStream_t s = stream();
  EG_CUDA_CHECK(cudaMemsetAsync(g.raw(), 0, size_t(b * b) * sizeof(float), s));
  if (b == 0 || f == 0) return;
  const int tiles = int((b + kTile - 1) / kTile);
  // Enough (tile, split) blocks to fill the GPU: ~4 per SM over the upper tiles.
  int dev = 0, sms = 0;
  EG_CUDA_CHECK(cudaGetDevice(&dev));
  EG_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const int64_t upper = int64_t(tiles) * (tiles + 1) / 2;
  int64_t splits = std::max<int64_t>(1, std::min<int64_t>((4 * int64_t(sms) + upper - 1) / upper, (f + 255) / 256));
  const int64_t chunk = ((f + splits - 1) / splits + kTile - 1) / kTile * kTile;
  splits = (f + chunk - 1) / chunk;
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(tiles), static_cast<unsigned>(splits));
  const dim3 block(kTile, kTile);
  gram_kernel<<<grid, block, 0, s>>>(x.data<float>(), g.data<float>(), int(b), f, chunk);
  cuda::after_launch("sp_gram (gram)");
  row_normalize_kernel<<<unsigned(b), kThreads, 0, s>>>(g.data<float>(), int(b));
  cuda::after_launch("sp_gram (normalise)");
}

void sp_loss(const Tensor& ga, const Tensor& gb, Tensor& out) {
  require_f32(ga, "sp_loss");
  const int64_t n = ga.numel(), b = ga.size(0);
  EG_CUDA_CHECK(cudaMemsetAsync(out.raw(), 0, sizeof(float), stream()));
  if (!n) return;
  sq_dist_kernel<<<std::min(blocks_for(n), 1024u), kThreads, 0, stream()>>>(ga.data<float>(), gb.data<float>(),
                                                                            out.data<float>(), n, 1.f / float(b * b));
  cuda::after_launch("sp_loss");
}

}  // namespace eg::cudak
