// Elementwise ops on CUDA: binary add/sub/mul/div with broadcasting (stride
// descriptors, one thread per output element; same shapes in vectors, Note [Vector
// loads] in common.cuh), scale, axpy, sum_to (one block per
// output element, block reduction over the broadcast dims) and broadcast_to. binary,
// scale and axpy take each operand in f32, bf16 or f16 (Note [16-bit CUDA kernels]);
// sum_to and broadcast_to are f32.
// Napkin math: binary moves 12 B/elem (broadcast operands hit in cache): 128x16x32x32
// = 25 MB -> ~10 us at 3 TB/s; launch latency dominates small tensors.
#include "kernels/cuda/common.cuh"

namespace eg::cudak {

// ---- kernels
namespace {
__device__ __forceinline__ float apply(int op, float x, float y) {
  return op == 0 ? x + y : op == 1 ? x - y : op == 2 ? x * y : x / y;
}
__global__ void binary_kernel(int op, const void* a, int ta, const void* b, int tb, void* c, int tc, Dims da, Dims db,
                              int64_t n) {
  EG_CUDA_LOOP(i, n) st(c, tc, i, apply(op, ld(a, ta, offset_of(i, da)), ld(b, tb, offset_of(i, db))));
}
// Operands of the output's shape (the residual adds, autograd's gradient sums): no
// index arithmetic, vectors of V (Note [Vector loads]).
template <int V>
__global__ void binary_same_kernel(int op, const void* a, int ta, const void* b, int tb, void* c, int tc, int64_t begin,
                                   int64_t end) {
  EG_CUDA_VEC_LOOP(i, V, begin, end) {
    float x[V], y[V];
    ldv<V>(a, ta, i, x);
    ldv<V>(b, tb, i, y);
    for (int k = 0; k < V; ++k) x[k] = apply(op, x[k], y[k]);
    stv<V>(c, tc, i, x);
  }
}
template <int V>
__global__ void scale_kernel(const void* x, int tx, void* y, int ty, float s, int64_t begin, int64_t end) {
  EG_CUDA_VEC_LOOP(i, V, begin, end) {
    float v[V];
    ldv<V>(x, tx, i, v);
    for (int k = 0; k < V; ++k) v[k] *= s;
    stv<V>(y, ty, i, v);
  }
}
template <int V>
__global__ void axpy_kernel(const void* x, int tx, void* y, int ty, float s, int64_t begin, int64_t end) {
  EG_CUDA_VEC_LOOP(i, V, begin, end) {
    float u[V], v[V];
    ldv<V>(x, tx, i, u);
    ldv<V>(y, ty, i, v);
    for (int k = 0; k < V; ++k) v[k] += s * u[k];
    stv<V>(y, ty, i, v);
  }
}
// y[j] = sum_r x[kept(j) + red(r)]
__global__ void sum_to_kernel(const float* x, float* y, Dims kept, Dims red, int64_t ny, int64_t r) {
  for (int64_t j = blockIdx.x; j < ny; j += gridDim.x) {
    const int64_t base = offset_of(j, kept);
    float s = 0.f;
    for (int64_t k = threadIdx.x; k < r; k += blockDim.x) s += x[base + offset_of(k, red)];
    s = block_sum(s);
    if (threadIdx.x == 0) y[j] = s;
  }
}
__global__ void broadcast_kernel(const float* x, float* y, Dims dx, int64_t n) {
  EG_CUDA_LOOP(i, n) y[i] = x[offset_of(i, dx)];
}
}  // namespace

// ---- launchers
// Any layout (Note [Channels-last activations on CUDA]): same shapes in a's (b converted
// to it), broadcasts NCHW.
void binary_fwd(ops::Binary op, const Tensor& a_in, const Tensor& b_in, Tensor& c) {
  const bool same = a_in.shape() == c.shape() && b_in.shape() == c.shape();
  const Format f = same ? a_in.format() : Format::plain;
  const Tensor a = a_in.to_format(f), b = b_in.to_format(f);
  c.set_format(f);
  const int ta = dt_code(a, "binary op"), tb = dt_code(b, "binary op"), tc = dt_code(c, "binary op");
  const int64_t n = c.numel();
  if (!n) return;
  if (same) {
    for_vectors(n, aligned16({a.raw_any(), b.raw_any(), c.raw_any()}), [&](auto v, int64_t begin, int64_t end) {
      constexpr int V = decltype(v)::value;
      binary_same_kernel<V><<<blocks_for((end - begin) / V), kThreads, 0, stream()>>>(
          int(op), a.raw_any(), ta, b.raw_any(), tb, c.raw_any(), tc, begin, end);
    });
  } else {
    binary_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(int(op), a.raw(), ta, b.raw(), tb, c.raw(), tc,
                                                            broadcast_dims(a.shape(), c.shape()),
                                                            broadcast_dims(b.shape(), c.shape()), n);
  }
  cuda::after_launch("binary_fwd");
}

// y in x's layout.
void scale(const Tensor& x, Tensor& y, double alpha) {
  const int tx = dt_code(x, "scale"), ty = dt_code(y, "scale");
  y.set_format(x.format());
  const int64_t n = x.numel();
  if (!n) return;
  for_vectors(n, aligned16({x.raw_any(), y.raw_any()}), [&](auto v, int64_t begin, int64_t end) {
    constexpr int V = decltype(v)::value;
    scale_kernel<V><<<blocks_for((end - begin) / V), kThreads, 0, stream()>>>(x.raw_any(), tx, y.raw_any(), ty,
                                                                              float(alpha), begin, end);
  });
  cuda::after_launch("scale");
}

// y keeps its layout; x is converted to it.
void axpy(const Tensor& x_in, Tensor& y, double alpha) {
  const Tensor x = x_in.to_format(y.format());
  const int tx = dt_code(x, "axpy"), ty = dt_code(y, "axpy");
  const int64_t n = x.numel();
  if (!n) return;
  for_vectors(n, aligned16({x.raw_any(), y.raw_any()}), [&](auto v, int64_t begin, int64_t end) {
    constexpr int V = decltype(v)::value;
    axpy_kernel<V><<<blocks_for((end - begin) / V), kThreads, 0, stream()>>>(x.raw_any(), tx, y.raw_any(), ty,
                                                                             float(alpha), begin, end);
  });
  cuda::after_launch("axpy");
}

void sum_to(const Tensor& x, Tensor& y) {
  require_f32(x, "sum_to");
  const Shape& xs = x.shape();
  const Shape ys = [&] {  // y left-padded to x's rank
    Shape s(xs.size() - y.shape().size(), 1);
    s.insert(s.end(), y.shape().begin(), y.shape().end());
    return s;
  }();
  // kept: y's dims (size 1 where reduced), strides into x; red: the reduced dims.
  Dims kept, red;
  kept.n = red.n = int(xs.size());
  int64_t acc = 1, r = 1;
  for (int i = int(xs.size()) - 1; i >= 0; --i) {
    const bool reduced = ys[size_t(i)] == 1 && xs[size_t(i)] != 1;
    kept.size[i] = reduced ? 1 : xs[size_t(i)];
    kept.stride[i] = reduced ? 0 : acc;
    red.size[i] = reduced ? xs[size_t(i)] : 1;
    red.stride[i] = reduced ? acc : 0;
    if (reduced) r *= xs[size_t(i)];
    acc *= xs[size_t(i)];
  }
  const int64_t ny = y.numel();
  if (!ny) return;
  const unsigned grid = unsigned(std::min<int64_t>(ny, 65535));
  sum_to_kernel<<<grid, kThreads, 0, stream()>>>(x.data<float>(), y.data<float>(), kept, red, ny, r);
  cuda::after_launch("sum_to");
}

void broadcast_to(const Tensor& x, Tensor& y) {
  require_f32(x, "broadcast_to");
  const int64_t n = y.numel();
  if (!n) return;
  broadcast_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(x.data<float>(), y.data<float>(),
                                                             broadcast_dims(x.shape(), y.shape()), n);
  cuda::after_launch("broadcast_to");
}

}  // namespace eg::cudak
