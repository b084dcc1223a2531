// Scaled dot-product attention, reference: forward and backward, plain loops.
// Layout: q [B, H, T, D], k/v [B, H, S, D], out [B, H, T, D], lse [B, H, T],
// key_padding_mask u8 [B, S] (1 = padding; may be undefined). f32 and f64; scores and
// sums in double.
//
// Note [Attention masking and lse]
// Key s is visible to query t when it is not padding and, if causal, s <= t. Causal
// attention requires S == T (the autograd layer checks it; the kernels check again).
// lse[t] = log sum over visible s of exp(scale * q_t . k_s). A fully masked row has
// out = 0, zero gradients, and lse = +inf (flash-attention's convention: then
// exp(score - lse) = 0 for every key, masked or not, with no special case).
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/ref/ref.h"

namespace eg::ref {

namespace {

struct Dims {
  int64_t b, h, t, s, d;
  double scale;
};

Dims dims_of(const Tensor& q, const Tensor& k, const ops::AttentionParams& p) {
  Dims d{q.size(0), q.size(1), q.size(2), k.size(2), q.size(3), p.scale};
  if (d.scale == 0.0) d.scale = 1.0 / std::sqrt(double(d.d));
  EG_CHECK(!p.causal || d.t == d.s, "attention: causal masking needs T == S, got T=", d.t, " S=", d.s);
  return d;
}

bool visible(const uint8_t* pad, bool causal, int64_t t, int64_t s) { return !(pad && pad[s]) && !(causal && s > t); }

// Scores of query row t against every key of one (batch, head): scale * q_t . k_s.
template <class T>
void scores(const T* q, const T* k, const Dims& d, int64_t t, std::vector<double>& sc) {
  for (int64_t s = 0; s < d.s; ++s) {
    double acc = 0;
    for (int64_t e = 0; e < d.d; ++e) acc += double(q[t * d.d + e]) * double(k[s * d.d + e]);
    sc[size_t(s)] = d.scale * acc;
  }
}

template <class T>
void fwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, Tensor& out, Tensor& lse,
         const ops::AttentionParams& p) {
  const Dims d = dims_of(q, k, p);
  std::vector<double> sc(static_cast<size_t>(d.s)), o(static_cast<size_t>(d.d));
  for (int64_t bh = 0; bh < d.b * d.h; ++bh) {
    const T* qp = q.data<T>() + bh * d.t * d.d;
    const T* kp = k.data<T>() + bh * d.s * d.d;
    const T* vp = v.data<T>() + bh * d.s * d.d;
    const uint8_t* pad = mask.defined() ? mask.data<uint8_t>() + (bh / d.h) * d.s : nullptr;
    T* op = out.data<T>() + bh * d.t * d.d;
    for (int64_t t = 0; t < d.t; ++t) {
      scores(qp, kp, d, t, sc);
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t s = 0; s < d.s; ++s)
        if (visible(pad, p.causal, t, s)) mx = std::max(mx, sc[size_t(s)]);
      std::fill(o.begin(), o.end(), 0.0);
      double sum = 0;
      if (std::isfinite(mx)) {
        for (int64_t s = 0; s < d.s; ++s) {
          if (!visible(pad, p.causal, t, s)) continue;
          const double w = std::exp(sc[size_t(s)] - mx);
          sum += w;
          for (int64_t e = 0; e < d.d; ++e) o[size_t(e)] += w * double(vp[s * d.d + e]);
        }
      }
      for (int64_t e = 0; e < d.d; ++e) op[t * d.d + e] = sum > 0 ? T(o[size_t(e)] / sum) : T(0);
      if (lse.defined())
        lse.data<T>()[bh * d.t + t] = sum > 0 ? T(mx + std::log(sum)) : std::numeric_limits<T>::infinity();
    }
  }
}

// With P = softmax(scores) (recomputed from lse), dP = dO V^T, dS = P * (dP - rowsum(P * dP)):
// dQ = scale dS K, dK = scale dS^T Q, dV = P^T dO.
template <class T>
void bwd(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, const Tensor& lse,
         Tensor& dq, Tensor& dk, Tensor& dv, const ops::AttentionParams& p) {
  const Dims d = dims_of(q, k, p);
  std::vector<double> sc(static_cast<size_t>(d.s)), pr(sc), dp(sc);
  std::vector<double> dqa(static_cast<size_t>(d.t * d.d)), dka(static_cast<size_t>(d.s * d.d)), dva(dka);
  for (int64_t bh = 0; bh < d.b * d.h; ++bh) {
    const T* qp = q.data<T>() + bh * d.t * d.d;
    const T* kp = k.data<T>() + bh * d.s * d.d;
    const T* vp = v.data<T>() + bh * d.s * d.d;
    const T* dop = dout.data<T>() + bh * d.t * d.d;
    const T* lp = lse.data<T>() + bh * d.t;
    const uint8_t* pad = mask.defined() ? mask.data<uint8_t>() + (bh / d.h) * d.s : nullptr;
    std::fill(dqa.begin(), dqa.end(), 0.0);
    std::fill(dka.begin(), dka.end(), 0.0);
    std::fill(dva.begin(), dva.end(), 0.0);
    for (int64_t t = 0; t < d.t; ++t) {
      if (!std::isfinite(double(lp[t]))) continue;  // fully masked row: no gradient
      scores(qp, kp, d, t, sc);
      double rowsum = 0;
      for (int64_t s = 0; s < d.s; ++s) {
        pr[size_t(s)] = visible(pad, p.causal, t, s) ? std::exp(sc[size_t(s)] - double(lp[t])) : 0.0;
        double acc = 0;
        for (int64_t e = 0; e < d.d; ++e) acc += double(dop[t * d.d + e]) * double(vp[s * d.d + e]);
        dp[size_t(s)] = acc;
        rowsum += pr[size_t(s)] * acc;
      }
      for (int64_t s = 0; s < d.s; ++s) {
        const double ds = pr[size_t(s)] * (dp[size_t(s)] - rowsum) * d.scale;
        for (int64_t e = 0; e < d.d; ++e) {
          dqa[size_t(t * d.d + e)] += ds * double(kp[s * d.d + e]);
          dka[size_t(s * d.d + e)] += ds * double(qp[t * d.d + e]);
          dva[size_t(s * d.d + e)] += pr[size_t(s)] * double(dop[t * d.d + e]);
        }
      }
    }
    auto store = [](Tensor& g, int64_t off, const std::vector<double>& a) {
      if (!g.defined()) return;
      T* gp = g.data<T>() + off;
      for (size_t i = 0; i < a.size(); ++i) gp[i] = T(a[i]);
    };
    store(dq, bh * d.t * d.d, dqa);
    store(dk, bh * d.s * d.d, dka);
    store(dv, bh * d.s * d.d, dva);
  }
}

}  // namespace

void attention_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_padding_mask, Tensor& out,
                   Tensor& lse, const ops::AttentionParams& p) {
  if (q.dtype() == DType::f64) fwd<double>(q, k, v, key_padding_mask, out, lse, p);
  else fwd<float>(q, k, v, key_padding_mask, out, lse, p);
}

void attention_bwd(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& key_padding_mask, const Tensor& /*out*/, const Tensor& lse, Tensor& dq, Tensor& dk,
                   Tensor& dv, const ops::AttentionParams& p) {
  if (q.dtype() == DType::f64) bwd<double>(dout, q, k, v, key_padding_mask, lse, dq, dk, dv, p);
  else bwd<float>(dout, q, k, v, key_padding_mask, lse, dq, dk, dv, p);
}

}  // namespace eg::ref
