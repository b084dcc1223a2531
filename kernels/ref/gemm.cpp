// Matrix products, reference: gemm (2-D or batched 3-D, transpose flags, alpha/beta)
// and linear forward/backward built on the same loop. Layout: contiguous row-major;
// a transposed operand is read through swapped strides. f32 and f64; products are
// accumulated in double, so the f32 reference is as exact as f32 output allows.
#include <algorithm>
#include <vector>

#include "kernels/ref/ref.h"

namespace eg::ref {

namespace {

// One matrix of a (possibly batched) operand: element (r, c) of op(t) lives at
// p[r * rs + c * cs].
template <class T>
struct View {
  const T* p;
  int64_t rs, cs;
  T at(int64_t r, int64_t c) const { return p[r * rs + c * cs]; }
};

template <class T>
View<T> view(const T* p, int64_t rows, int64_t cols, bool trans) {
  // Stored as [rows, cols] row-major, or as [cols, rows] when transposed.
  return trans ? View<T>{p, 1, rows} : View<T>{p, cols, 1};
}

// c[M, N] = alpha * A[M, K] B[K, N] + beta * c; beta == 0 never reads c (it may
// hold NaN). B is first copied to a contiguous [K, N] so that the i-k-j loop runs
// along rows of B and c (keeps the reference usable at benchmark sizes).
template <class T>
void matmul(View<T> a, View<T> b, T* c, int64_t m, int64_t n, int64_t k, double alpha, double beta) {
  std::vector<double> bk(static_cast<size_t>(k * n)), acc(static_cast<size_t>(n));
  for (int64_t kk = 0; kk < k; ++kk)
    for (int64_t j = 0; j < n; ++j) bk[size_t(kk * n + j)] = double(b.at(kk, j));
  for (int64_t i = 0; i < m; ++i) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t kk = 0; kk < k; ++kk) {
      const double aik = double(a.at(i, kk));
      const double* bkk = bk.data() + kk * n;
      for (int64_t j = 0; j < n; ++j) acc[size_t(j)] += aik * bkk[j];
    }
    T* ci = c + i * n;
    for (int64_t j = 0; j < n; ++j) ci[j] = T(alpha * acc[size_t(j)] + (beta == 0.0 ? 0.0 : beta * double(ci[j])));
  }
}

template <class T>
void gemm_t(const Tensor& a, const Tensor& b, Tensor& c, bool ta, bool tb, double alpha, double beta) {
  const int r = a.dim();
  const int64_t batch = r == 3 ? a.size(0) : 1;
  const int64_t m = c.size(r - 2), n = c.size(r - 1), k = ta ? a.size(r - 2) : a.size(r - 1);
  for (int64_t bi = 0; bi < batch; ++bi) {
    View<T> av = view(a.data<T>() + bi * m * k, m, k, ta);
    View<T> bv = view(b.data<T>() + bi * k * n, k, n, tb);
    matmul(av, bv, c.data<T>() + bi * m * n, m, n, k, alpha, beta);
  }
}

template <class T>
void linear_fwd_t(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y) {
  const int64_t m = x.size(0), k = x.size(1), n = w.size(0);
  T* yp = y.data<T>();
  matmul(view(x.data<T>(), m, k, false), view(w.data<T>(), k, n, true), yp, m, n, k, 1.0, 0.0);
  if (!bias.defined()) return;
  const T* bp = bias.data<T>();
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) yp[i * n + j] += bp[j];
}

template <class T>
void linear_bwd_t(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor& dx, Tensor& dw, Tensor& db) {
  const int64_t m = x.size(0), k = x.size(1), n = w.size(0);
  const T* dyp = dy.data<T>();
  // dx[M, K] = dy[M, N] w[N, K]
  if (dx.defined()) matmul(view(dyp, m, n, false), view(w.data<T>(), n, k, false), dx.data<T>(), m, k, n, 1.0, 0.0);
  // dw[N, K] = dy^T[N, M] x[M, K]
  if (dw.defined()) matmul(view(dyp, n, m, true), view(x.data<T>(), m, k, false), dw.data<T>(), n, k, m, 1.0, 0.0);
  if (db.defined()) {
    T* dbp = db.data<T>();
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t i = 0; i < m; ++i) s += double(dyp[i * n + j]);
      dbp[j] = T(s);
    }
  }
}

}  // namespace

void gemm(const Tensor& a, const Tensor& b, Tensor& c, bool trans_a, bool trans_b, double alpha, double beta) {
  if (any_bf16({&a, &b, &c})) {  // Note [bf16 kernels]
    Tensor c64 = widened(c);  // beta reads it
    gemm_t<double>(widened(a), widened(b), c64, trans_a, trans_b, alpha, beta);
    return narrowed_into(c64, c);
  }
  if (a.dtype() == DType::f64) gemm_t<double>(a, b, c, trans_a, trans_b, alpha, beta);
  else gemm_t<float>(a, b, c, trans_a, trans_b, alpha, beta);
}

void linear_fwd(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y) {
  if (any_bf16({&x, &w, &y})) {
    Tensor y64 = wide_like(y);
    linear_fwd_t<double>(widened(x), widened(w), widened(bias), y64);
    return narrowed_into(y64, y);
  }
  if (x.dtype() == DType::f64) linear_fwd_t<double>(x, w, bias, y);
  else linear_fwd_t<float>(x, w, bias, y);
}

void linear_bwd(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor& dx, Tensor& dw, Tensor& db) {
  if (any_bf16({&dy, &x, &w, &dx})) {
    Tensor dx64 = wide_like(dx), dw64 = wide_like(dw), db64 = wide_like(db);
    linear_bwd_t<double>(widened(dy), widened(x), widened(w), dx64, dw64, db64);
    for (auto [wide, out] : {std::pair{&dx64, &dx}, {&dw64, &dw}, {&db64, &db}}) narrowed_into(*wide, *out);
    return;
  }
  if (x.dtype() == DType::f64) linear_bwd_t<double>(dy, x, w, dx, dw, db);
  else linear_bwd_t<float>(dy, x, w, dx, dw, db);
}

}  // namespace eg::ref
