#include "tests/op_cases.h"

#include <cmath>
#include <sstream>

#include "core/rng.h"

namespace eg::testing {

std::vector<OpCase>& op_cases() {
  static std::vector<OpCase> v;
  return v;
}

bool OpCase::supports(ops::Backend b) const {
  if ((dtype == DType::f16 || cuda_only) && b != ops::Backend::cuda) return false;
  for (auto& u : uses)
    if (!u.has(b) || (is_half(dtype) && !u.has_bf16(b))) return false;
  return true;
}

void add_f16_twins(std::vector<OpCase>& v, size_t from) {
  const size_t end = v.size();
  for (size_t i = from; i < end; ++i) {
    if (v[i].dtype != DType::bf16) continue;
    OpCase c = v[i];
    const size_t at = c.name.find("/bf16_");
    EG_CHECK(at != std::string::npos, "op case ", c.name, ": a bf16 case is named <op>/bf16_<variant>");
    c.name.replace(at, 6, "/f16_");
    c.dtype = DType::f16;
    for (Tolerance* t : {&c.fwd_tol, &c.bwd_tol}) t->rtol += kF16Eps - kBf16Eps;
    if (c.accumulates) c.bwd_tol.atol += kF16Eps - kBf16Eps;  // as add_bf16_twin's
    v.push_back(std::move(c));
  }
}

Tensor randn(const Shape& s, DType dt, uint64_t seed, double scale) {
  Generator g(seed);
  Tensor t = Tensor::randn(s, g, DType::f64);
  double* p = t.data<double>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] *= scale;
  return t.to(dt);
}

Tensor uniform(const Shape& s, DType dt, uint64_t seed, double lo, double hi) {
  Generator g(seed);
  return Tensor::uniform(s, lo, hi, g, dt);
}

Tensor randint(const Shape& s, int64_t lo, int64_t hi, uint64_t seed, DType dt) {
  Generator g(seed);
  Tensor u = Tensor::uniform(s, 0.0, 1.0, g, DType::f64);
  Tensor t = Tensor::empty(s, DType::s64);
  for (int64_t i = 0; i < t.numel(); ++i)
    t.data<int64_t>()[i] = lo + std::min<int64_t>(hi - lo - 1, int64_t(u.data<double>()[i] * double(hi - lo)));
  return t.to(dt);
}

Tensor empty_on(const Tensor& like, const Shape& s, DType dt) { return Tensor::empty(s, dt, like.device()); }
Tensor empty_like(const Tensor& t) { return Tensor::empty(t.shape(), t.dtype(), t.device()); }
Tensor zeros_like(const Tensor& t) { return Tensor::zeros(t.shape(), t.dtype(), t.device()); }
Tensor gradient_start(const Tensor& like, const Shape& s, DType dt, bool accumulate, uint64_t seed) {
  return accumulate ? randn(s, dt, seed, 0.5).to(like.device()) : empty_on(like, s, dt);
}

void add_bf16_twin(std::vector<OpCase>& v) {
  OpCase c = v.back();
  const size_t slash = c.name.find('/');
  c.name = c.name.substr(0, slash + 1) + "bf16_" + c.name.substr(slash + 1);
  c.dtype = DType::bf16;
  c.gradcheck = false;
  c.fwd_tol = bf16_tolerance(c.fwd_tol);
  c.bwd_tol = bf16_tolerance(c.bwd_tol);
  // Starts (randn x 0.5) and results of order 1 can cancel to a small sum, and a kernel
  // that adds in its own pass (beta = 1) rounds start + result once where the reference
  // rounds the result first: they differ by up to half a bf16 step of the terms.
  if (c.accumulates) c.bwd_tol.atol += kBf16Eps;
  c.bytes /= 2;  // traffic counted in activations, now of 2 bytes
  v.push_back(std::move(c));
}

void add_nhwc_twin(std::vector<OpCase>& v, std::vector<int> which, bool douts, const std::string& suffix) {
  size_t base = v.size();
  while (base > 0 && v[base - 1].cuda_only) --base;
  EG_CHECK(base > 0, "op cases: an NHWC twin needs a case before it");
  OpCase c = v[base - 1];
  c.name += suffix;
  c.cuda_only = true;
  c.nhwc_inputs = which;
  c.nhwc_douts = douts;
  auto nhwc = [](Tensors t, const std::vector<int>& idx) {
    for (int i : idx)
      if (t[size_t(i)].nhwc_capable()) t[size_t(i)] = t[size_t(i)].to_format(Format::nhwc);
    return t;
  };
  auto fwd = c.forward;
  c.forward = [fwd, which, nhwc](ops::Backend b, const Tensors& in) {
    return fwd(b, b == ops::Backend::cuda ? nhwc(in, which) : in);
  };
  if (c.backward) {
    auto bwd = c.backward;
    c.backward = [bwd, which, douts, nhwc](ops::Backend b, const Tensors& in, const Tensors& out, const Tensors& dout) {
      if (b != ops::Backend::cuda) return bwd(b, in, out, dout);
      std::vector<int> all(dout.size());
      for (size_t i = 0; i < all.size(); ++i) all[i] = int(i);
      return bwd(b, nhwc(in, which), out, douts ? nhwc(dout, all) : dout);
    };
  }
  v.push_back(std::move(c));
}

void block_inputs(OpCase& c, std::vector<int> which, bool douts) {
  auto make = c.make_inputs;
  c.make_inputs = [make, which](DType dt) {
    Tensors in = make(dt);
    for (int i : which)
      if (in[size_t(i)].blockable()) in[size_t(i)] = in[size_t(i)].to_format(Format::nchw16c);
    return in;
  };
  if (!douts || !c.backward) return;
  auto bwd = c.backward;
  c.backward = [bwd](ops::Backend b, const Tensors& in, const Tensors& out, const Tensors& dout) {
    Tensors d = dout;
    for (Tensor& t : d)
      if (t.blockable()) t = t.to_format(Format::nchw16c);
    return bwd(b, in, out, d);
  };
}

Compare compare(const Tensor& got, const Tensor& ref, const Tolerance& tol) {
  Compare c;
  if (got.shape() != ref.shape()) {
    c.worst_ratio = INFINITY;
    c.detail = "shape " + shape_str(got.shape()) + " vs ref " + shape_str(ref.shape());
    return c;
  }
  Tensor g = got.to(Device::cpu()).to(DType::f64), r = ref.to(Device::cpu()).to(DType::f64);
  const double *gp = g.data<double>(), *rp = r.data<double>();
  int64_t worst = -1;
  for (int64_t i = 0; i < g.numel(); ++i) {
    double lim = tol.atol + tol.rtol * std::fabs(rp[i]);
    double diff = std::fabs(gp[i] - rp[i]);
    double ratio = diff == 0 ? 0 : diff / lim;  // lim 0 (exact ops): any difference fails
    if (std::isnan(gp[i]) || std::isnan(rp[i])) ratio = std::isnan(gp[i]) && std::isnan(rp[i]) ? 0 : INFINITY;
    if (ratio > c.worst_ratio || (worst < 0 && ratio >= c.worst_ratio)) {
      c.worst_ratio = ratio;
      worst = i;
    }
  }
  if (worst >= 0) {
    std::ostringstream os;
    os << "worst at flat index " << worst << ": got " << gp[worst] << ", ref " << rp[worst] << " (atol " << tol.atol
       << ", rtol " << tol.rtol << ")";
    c.detail = os.str();
  }
  return c;
}

}  // namespace eg::testing
