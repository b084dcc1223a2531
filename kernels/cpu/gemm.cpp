// Matrix products, fast CPU path: gemm (2-D or batched 3-D) and linear forward/backward
// as oneDNN matmul primitives. Layout: contiguous row-major; a transposed operand is
// described to oneDNN by swapped strides (no copy). alpha is an output scale, beta a
// sum post-op (absent when beta == 0, so c's old contents are never read); linear's
// bias is the matmul bias. f32, and bf16 operands with f32 accumulation (Note [bf16
// kernels]): the output bf16 or f32, linear's bias, dw and db f32.
//
// Napkin math: 4096x512x2048 is 8.6 GFLOP against 16 MB of operands (~540 FLOP/byte),
// compute-bound: oneDNN's avx512 brgemm kernels reach ~300-400 GFLOP/s on the 2 cores
// here, about 1.5x Eigen's gemm (measured on 128x512x512 and 4096x512x2048). db, the
// column sum of dy, is a bandwidth-bound pass (4 bytes per element of dy).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include <omp.h>

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/onednn.h"

namespace eg::cpu {

namespace {

using dnnl::memory;

using DT = memory::data_type;
DT dt_of(const Tensor& t) { return t.dtype() == DType::bf16 ? DT::bf16 : DT::f32; }

// The element types of a product's a, b and c.
struct Types {
  DT a = DT::f32, b = DT::f32, c = DT::f32;
};

// op(t) as a [batch,] rows x cols matrix over t's row-major buffer (stored as
// cols x rows when transposed).
memory::desc md(int64_t batch, int64_t rows, int64_t cols, bool trans, DT dt) {
  if (batch == 0) return memory::desc({rows, cols}, dt, trans ? memory::dims{1, rows} : memory::dims{cols, 1});
  return memory::desc({batch, rows, cols}, dt,
                      trans ? memory::dims{rows * cols, 1, rows} : memory::dims{rows * cols, cols, 1});
}

struct Matmul {
  dnnl::matmul prim;
  memory::desc a, b, bias, c;
};

// c = alpha * op(a) op(b) (+ bias) + beta * c, with batch == 0 meaning 2-D operands.
const Matmul& matmul(int64_t batch, int64_t m, int64_t n, int64_t k, bool ta, bool tb, bool bias, double alpha,
                     double beta, Types t) {
  char key[192];
  std::snprintf(key, sizeof key, "mm:%lld:%lld:%lld:%lld:%d%d%d:%a:%a:%d%d%d", (long long)batch, (long long)m,
                (long long)n, (long long)k, int(ta), int(tb), int(bias), alpha, beta, int(t.a), int(t.b), int(t.c));
  return onednn::cached<Matmul>(key, [&] {
    Matmul mm;
    mm.a = md(batch, m, k, ta, t.a);
    mm.b = md(batch, k, n, tb, t.b);
    mm.c = md(batch, m, n, false, t.c);
    dnnl::primitive_attr attr;
    if (alpha != 1.0) attr.set_output_scales(0, {float(alpha)});
    if (beta != 0.0) {
      dnnl::post_ops po;
      po.append_sum(float(beta));
      attr.set_post_ops(po);
    }
    if (bias) {
      mm.bias = memory::desc({1, n}, memory::data_type::f32, memory::dims{n, 1});
      mm.prim = dnnl::matmul(
          dnnl::matmul::primitive_desc(dnnl::matmul::desc(mm.a, mm.b, mm.bias, mm.c), attr, onednn::engine()));
    } else {
      mm.prim =
          dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(mm.a, mm.b, mm.c), attr, onednn::engine()));
    }
    return mm;
  });
}

struct Operands {
  const void *a, *b, *bias;
  void* c;
  Types t;
};

// Builds (or finds) the primitive and runs it; oneDNN errors from either step are
// rethrown as eg::Error naming the op.
void run(const char* op, int64_t batch, int64_t m, int64_t n, int64_t k, bool ta, bool tb, double alpha, double beta,
         const Operands& x) {
  if (m == 0 || n == 0) return;
  if (k == 0) {  // empty product: c = alpha * bias + beta * c
    EG_CHECK(x.t.c == DT::f32, op, ": an empty bf16 product");
    float* c = static_cast<float*>(x.c);
    const float* bias = static_cast<const float*>(x.bias);
    for (int64_t i = 0; i < std::max<int64_t>(batch, 1) * m * n; ++i)
      c[i] = float(alpha) * (bias ? bias[i % n] : 0.f) + (beta == 0.0 ? 0.f : float(beta) * c[i]);
    return;
  }
  try {
    const Matmul& mm = matmul(batch, m, n, k, ta, tb, x.bias != nullptr, alpha, beta, x.t);
    auto& eng = onednn::engine();
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, memory(mm.a, eng, const_cast<void*>(x.a))},
                                         {DNNL_ARG_WEIGHTS, memory(mm.b, eng, const_cast<void*>(x.b))},
                                         {DNNL_ARG_DST, memory(mm.c, eng, x.c)}};
    if (x.bias) args.emplace(DNNL_ARG_BIAS, memory(mm.bias, eng, const_cast<void*>(x.bias)));
    mm.prim.execute(onednn::stream(), args);
    onednn::stream().wait();
  } catch (const dnnl::error& e) {
    EG_THROW("oneDNN failed in ", op, ": ", e.what(), " (status ", int(e.status), ")");
  }
}

// db[N] = sum over rows of dy[M, N]: each thread sums a block of rows into its own
// partial, then the partials are added in thread order (deterministic for a fixed
// thread count).
template <class T>
void column_sum(const T* dy, float* db, int64_t m, int64_t n) {
  const int nt = m * n > 65536 ? omp_get_max_threads() : 1;
  std::vector<float> part(size_t(nt) * size_t(n), 0.f);
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num(), used = omp_get_num_threads();
    float* acc = part.data() + size_t(t) * size_t(n);
    for (int64_t i = m * t / used; i < m * (t + 1) / used; ++i) {
      const T* row = dy + i * n;
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) acc[j] += ld(row, j);
    }
  }
  std::memcpy(db, part.data(), size_t(n) * sizeof(float));
  for (int t = 1; t < nt; ++t)
    for (int64_t j = 0; j < n; ++j) db[j] += part[size_t(t) * size_t(n) + size_t(j)];
}

}  // namespace

void gemm(const Tensor& a, const Tensor& b, Tensor& c, bool trans_a, bool trans_b, double alpha, double beta) {
  const int r = a.dim();
  const int64_t batch = r == 3 ? a.size(0) : 0;
  const int64_t m = c.size(r - 2), n = c.size(r - 1), k = trans_a ? a.size(r - 2) : a.size(r - 1);
  run("gemm", batch, m, n, k, trans_a, trans_b, alpha, beta,
      {a.raw(), b.raw(), nullptr, c.raw(), {dt_of(a), dt_of(b), dt_of(c)}});
}

void linear_fwd(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y) {
  const int64_t m = x.size(0), k = x.size(1), n = w.size(0);
  run("linear_fwd", 0, m, n, k, false, true, 1.0, 0.0,
      {x.raw(), w.raw(), bias.defined() ? bias.raw() : nullptr, y.raw(), {dt_of(x), dt_of(w), dt_of(y)}});
}

void linear_bwd(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor& dx, Tensor& dw, Tensor& db) {
  const int64_t m = x.size(0), k = x.size(1), n = w.size(0);
  // dx[M, K] = dy[M, N] w[N, K]; dw[N, K] = dy^T x.
  if (dx.defined())
    run("linear_bwd (dx)", 0, m, k, n, false, false, 1.0, 0.0,
        {dy.raw(), w.raw(), nullptr, dx.raw(), {dt_of(dy), dt_of(w), dt_of(dx)}});
  if (dw.defined())
    run("linear_bwd (dw)", 0, n, k, m, true, false, 1.0, 0.0,
        {dy.raw(), x.raw(), nullptr, dw.raw(), {dt_of(dy), dt_of(x), dt_of(dw)}});
  if (db.defined()) with_storage(dy, [&](auto t) { column_sum(dy.data<decltype(t)>(), db.data<float>(), m, n); });
}

}  // namespace eg::cpu
