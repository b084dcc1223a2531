#include "quant/int8.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/cpu/onednn.h"

namespace eg::quant {

namespace {

using dnnl::memory;
using tag = memory::format_tag;
using dt = memory::data_type;

template <class Q>
inline Q quantize_one(float v, float scale, int lo, int hi) {
  float r = std::nearbyint(v * scale);
  if (std::isnan(r)) r = 0;  // (the range check rejects NaN; past calibration nothing looks)
  r = std::min(std::max(r, float(lo)), float(hi));
  return Q(int(r));
}

void require_cpu_f32_4d(const Tensor& x, const char* what) {
  EG_CHECK(x.device().is_cpu() && x.dtype() == DType::f32 && x.dim() == 4, what,
           ": expected an f32 CPU tensor [N, C, H, W], got ", dtype_name(x.dtype()), " ", shape_str(x.shape()), " on ",
           x.device().str());
}

// x NCHW f32 -> q NCHW (u8 or s8), for the plain-loop reference.
template <class Q>
void quantize(const Tensor& x, float scale, int lo, int hi, Q* q) {
  const float* xp = x.data<float>();
  const int64_t n = x.numel();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) q[i] = quantize_one<Q>(xp[i], scale, lo, hi);
}

// Row r of w [R, per] to s8 with its own symmetric scale 127 / max|w[r]|.
void quantize_rows(const Tensor& w, int64_t rows, Tensor& wq, std::vector<float>& scales, const char* who) {
  const int64_t per = w.numel() / rows;
  wq = Tensor::empty(w.shape(), DType::s8);
  scales.assign(size_t(rows), 1.f);
  const float* wp = w.data<float>();
  int8_t* qp = wq.data<int8_t>();
  for (int64_t o = 0; o < rows; ++o) {
    float amax = 0.f;
    for (int64_t i = 0; i < per; ++i) amax = std::max(amax, std::fabs(wp[o * per + i]));
    EG_CHECK(std::isfinite(amax), who, ": output ", o, " of the weight holds NaN or Inf");
    const float s = amax > 0.f ? 127.f / amax : 1.f;
    scales[size_t(o)] = s;
    for (int64_t i = 0; i < per; ++i) qp[o * per + i] = quantize_one<int8_t>(wp[o * per + i], s, -127, 127);
  }
}

// The f32 bias of n outputs (zeros when undefined), on the host.
std::vector<float> host_bias(const Tensor& bias, int64_t n, const char* who) {
  std::vector<float> b(static_cast<size_t>(n), 0.f);
  if (!bias.defined()) return b;
  EG_CHECK(bias.numel() == n && bias.dtype() == DType::f32, who, ": bias must be f32 [", n, "]");
  const Tensor h = bias.to(Device::cpu());
  std::copy(h.data<float>(), h.data<float>() + n, b.begin());
  return b;
}

}  // namespace

ActRange act_range(const Tensor& x) {
  EG_CHECK(x.device().is_cpu() && x.dtype() == DType::f32, "int8 reference: expected an f32 activation on the CPU");
  const float* p = x.data_any<float>();  // the range is the same in any layout (nChw16c has no padding)
  const int64_t n = x.numel();
  float lo = 0.f, hi = 0.f;
  int bad = 0;
#pragma omp parallel for reduction(min : lo) reduction(max : hi) reduction(| : bad) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    lo = std::min(lo, p[i]);
    hi = std::max(hi, p[i]);
    bad |= !std::isfinite(p[i]);
  }
  EG_CHECK(!bad, "int8 reference: the activation holds NaN or Inf");
  return {lo, hi, 1};
}

ActQuant act_quant_from(const ActRange& r) {
  ActQuant q;
  q.is_unsigned = r.lo >= 0.f;
  const float amax = std::max(-r.lo, r.hi);
  q.scale = amax > 0.f ? (q.is_unsigned ? 255.f : 127.f) / amax : 1.f;
  return q;
}

ActQuant choose_act_quant(const Tensor& x) { return act_quant_from(act_range(x)); }

ActQuant ActObserver::quant(const Tensor& x) {
  if (calibration_batches_ <= 0) return choose_act_quant(x);
  if (!calibrated()) {
    const ActRange r = act_range(x);
    if (r.lo == 0.f && r.hi == 0.f) return act_quant_from(range_);  // all zeros: no range to learn, not counted
    range_ =
        range_.batches == 0 ? r : ActRange{std::min(range_.lo, r.lo), std::max(range_.hi, r.hi), range_.batches + 1};
  }
  return act_quant_from(range_);
}

// Note [int8 convolution pipeline]
// One pass per stage, all oneDNN: a reorder quantises the f32 input (plain, nChw16c or
// NHWC, as the layer before left it) straight into the layout the int8 convolution
// wants, scaling and rounding on the way; the convolution accumulates in s32 and writes
// f32 itself, the bias and the per-output-channel dequantisation scale 1 / (s_x s_w[k])
// applied in its epilogue (the bias is added before the scale, so it is passed as
// bias[k] s_x s_w[k]), then the activation after the folded batch norm, if any (ReLU, or
// ReLU6 as a clip to [0, 6]). It writes NHWC, the only layout oneDNN 2.6's fast int8
// convolutions write (asked for nChw16c they fall to ref_int8, hundreds of times
// slower), and its output stays NHWC (Format::nhwc on the CPU): what comes next is the
// next convolution's quantising reorder, which then keeps the layout, the elementwise
// ops of a residual block's end, the batch norms on the batch's statistics
// (ReferenceBn::batch) or a max pool (ResNet-50's stem), which take it as it comes
// (kernels/registry.cpp); any other CPU op (the global average pool) gets a plain copy.
// Reordering every output to nChw16c and back (with ReLU6 in its own pass) had been half
// of MobileNetV2's int8 forward. Another dst layout is
// reordered to NCHW.
// The input and output scales change with every calibration batch, and every batch
// with dynamic scales (Note [Static activation scales]), so both are runtime arguments
// and the primitives are built once per shape.
struct ConvInt8::Prim {
  dnnl::convolution_forward conv;
  dnnl::reorder quant;  // x (f32, its layout) -> src (u8/s8, the convolution's layout), times s_x
  dnnl::reorder out;  // dst -> y (NCHW), when the convolution does not write NHWC
  bool has_out = false;
  memory weights;  // in the primitive's preferred layout
  memory::desc x_md, src_md, dst_md, y_md;
};

ConvInt8::ConvInt8(const Tensor& w, const Tensor& bias, const ops::Conv2dParams& p, ops::BnAct act)
    : p_(p), act_(act), wshape_(w.shape()) {
  EG_CHECK(w.dim() == 4 && w.dtype() == DType::f32 && w.device().is_cpu(),
           "ConvInt8: expected an f32 CPU weight [K, C/groups, R, S], got ", shape_str(w.shape()));
  const int64_t k = w.size(0);
  EG_CHECK(k % p.groups == 0, "ConvInt8: ", k, " output channels are not divisible by ", p.groups, " groups");
  quantize_rows(w, k, wq_, w_scale_, "ConvInt8");
  bias_ = host_bias(bias, k, "ConvInt8");
}

ConvInt8::~ConvInt8() = default;

Shape ConvInt8::out_shape(const Shape& x) const { return ops::conv2d_out_shape(x, wshape_, p_); }

Tensor ConvInt8::forward(const Tensor& x) const { return forward(x, choose_act_quant(x)); }
Tensor ConvInt8::forward_ref(const Tensor& x) const { return forward_ref(x, choose_act_quant(x)); }

Tensor ConvInt8::forward_ref(const Tensor& x_in, const ActQuant& q) const {
  const Tensor x = x_in.to_plain();
  require_cpu_f32_4d(x, "ConvInt8");
  const Shape ys = out_shape(x.shape());
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  const int64_t k = ys[1], oh = ys[2], ow = ys[3], r = wshape_[2], s = wshape_[3];
  const int64_t cg = c / p_.groups, kg = k / p_.groups;
  std::vector<int> xq(size_t(x.numel()));
  if (q.is_unsigned) {
    std::vector<uint8_t> t(xq.size());
    quantize<uint8_t>(x, q.scale, 0, 255, t.data());
    std::copy(t.begin(), t.end(), xq.begin());
  } else {
    std::vector<int8_t> t(xq.size());
    quantize<int8_t>(x, q.scale, -128, 127, t.data());
    std::copy(t.begin(), t.end(), xq.begin());
  }
  const int8_t* wq = wq_.data<int8_t>();
  Tensor y = Tensor::empty(ys);
  float* yp = y.data<float>();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t o = 0; o < k; ++o) {
      const int64_t g = o / kg;
      const float dq = 1.f / (q.scale * w_scale_[size_t(o)]);
      for (int64_t py = 0; py < oh; ++py)
        for (int64_t px = 0; px < ow; ++px) {
          int32_t acc = 0;
          for (int64_t ci = 0; ci < cg; ++ci)
            for (int64_t ky = 0; ky < r; ++ky)
              for (int64_t kx = 0; kx < s; ++kx) {
                const int64_t iy = py * p_.stride_h - p_.pad_h + ky * p_.dil_h;
                const int64_t ix = px * p_.stride_w - p_.pad_w + kx * p_.dil_w;
                if (iy < 0 || iy >= h || ix < 0 || ix >= w) continue;
                acc += xq[size_t(((i * c + g * cg + ci) * h + iy) * w + ix)] *
                       int32_t(wq[((o * cg + ci) * r + ky) * s + kx]);
              }
          const float v = float(acc) * dq + bias_[size_t(o)];
          yp[((i * k + o) * oh + py) * ow + px] = act_ == ops::BnAct::relu    ? std::max(v, 0.f)
                                                  : act_ == ops::BnAct::relu6 ? std::min(std::max(v, 0.f), 6.f)
                                                                              : v;
        }
    }
  return y;
}

Tensor ConvInt8::forward(const Tensor& x, const ActQuant& q) const {
  require_cpu_f32_4d(x, "ConvInt8");  // plain, nChw16c or NHWC: the quantising reorder reads any
  EG_CHECK(x.size(1) == wshape_[1] * p_.groups, "ConvInt8: input has ", x.size(1), " channels, the weight expects ",
           wshape_[1] * p_.groups);
  const Shape xs = x.shape(), ys = out_shape(xs);
  const int64_t k = ys[1];
  std::vector<int64_t> key(xs.begin(), xs.end());
  key.push_back(q.is_unsigned);
  key.push_back(int64_t(x.format()));
  auto& slot = prims_[key];
  if (!slot) {
    auto pr = std::make_unique<Prim>();
    EG_DNNL_TRY("creating the int8 convolution", {
      dnnl::engine& eng = onednn::engine();
      pr->x_md = memory::desc(onednn::dims(xs), dt::f32,
                              x.format() == Format::nchw16c ? tag::nChw16c
                              : x.format() == Format::nhwc  ? tag::nhwc
                                                            : tag::nchw);
      const int64_t g = p_.groups;
      memory::dims wd = g > 1 ? memory::dims{g, k / g, wshape_[1], wshape_[2], wshape_[3]} : onednn::dims(wshape_);
      const int64_t pr_h = (ys[2] - 1) * p_.stride_h + (wshape_[2] - 1) * p_.dil_h + 1 - xs[2] - p_.pad_h;
      const int64_t pr_w = (ys[3] - 1) * p_.stride_w + (wshape_[3] - 1) * p_.dil_w + 1 - xs[3] - p_.pad_w;
      dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
                                        memory::desc(onednn::dims(xs), q.is_unsigned ? dt::u8 : dt::s8, tag::any),
                                        memory::desc(wd, dt::s8, tag::any), memory::desc({k}, dt::f32, tag::x),
                                        memory::desc(onednn::dims(ys), dt::f32, tag::any), {p_.stride_h, p_.stride_w},
                                        {p_.dil_h - 1, p_.dil_w - 1}, {p_.pad_h, p_.pad_w}, {pr_h, pr_w});
      // The dequantisation scale can change from batch to batch, and oneDNN 2.6's int8
      // convolutions take no runtime output scales: a per-channel binary multiply
      // post-op (a runtime argument) applies it instead.
      dnnl::post_ops po;
      po.append_binary(dnnl::algorithm::binary_mul, memory::desc({1, k, 1, 1}, dt::f32, tag::nchw));
      if (act_ == ops::BnAct::relu) po.append_eltwise(1.f, dnnl::algorithm::eltwise_relu, 0.f, 0.f);
      if (act_ == ops::BnAct::relu6) po.append_eltwise(1.f, dnnl::algorithm::eltwise_clip, 0.f, 6.f);
      dnnl::primitive_attr attr;
      attr.set_post_ops(po);
      dnnl::convolution_forward::primitive_desc pd(d, attr, eng);
      pr->conv = dnnl::convolution_forward(pd);
      pr->src_md = pd.src_desc();
      pr->dst_md = pd.dst_desc();
      dnnl::primitive_attr qattr;
      qattr.set_output_scales(0, {DNNL_RUNTIME_F32_VAL});
      pr->quant = dnnl::reorder(dnnl::reorder::primitive_desc(eng, pr->x_md, eng, pr->src_md, qattr));
      pr->has_out = pr->dst_md != memory::desc(onednn::dims(ys), dt::f32, tag::nhwc);
      pr->y_md = memory::desc(onednn::dims(ys), dt::f32, pr->has_out ? tag::nchw : tag::nhwc);
      if (pr->has_out) pr->out = dnnl::reorder(dnnl::reorder::primitive_desc(eng, pr->dst_md, eng, pr->y_md));
      memory user({wd, dt::s8, g > 1 ? tag::goihw : tag::oihw}, eng, wq_.raw());
      pr->weights = memory(pd.weights_desc(), eng);
      dnnl::reorder(user, pr->weights).execute(onednn::stream(), user, pr->weights);
      onednn::stream().wait();
    });
    slot = std::move(pr);
  }
  Prim& pr = *slot;
  std::vector<float> scales(static_cast<size_t>(k)), bias(static_cast<size_t>(k));
  for (int64_t o = 0; o < k; ++o) {
    const float sx_sw = q.scale * w_scale_[size_t(o)];
    scales[size_t(o)] = 1.f / sx_sw;
    bias[size_t(o)] = bias_[size_t(o)] * sx_sw;
  }
  float in_scale = q.scale;
  Tensor xq = Tensor::empty({int64_t(pr.src_md.get_size())}, DType::u8);
  Tensor y = Tensor::empty(ys);
  if (!pr.has_out) y.set_format(Format::nhwc);
  Tensor dst = pr.has_out ? Tensor::empty({int64_t(pr.dst_md.get_size())}, DType::u8) : y;
  EG_DNNL_TRY("running the int8 convolution", {
    dnnl::engine& eng = onednn::engine();
    memory xm = onednn::wrap(x, pr.x_md), sm(pr.src_md, eng, xq.raw()), dm(pr.dst_md, eng, dst.raw_any());
    memory in_sc({{1}, dt::f32, tag::x}, eng, &in_scale),
        out_sc({{1, k, 1, 1}, dt::f32, tag::nchw}, eng, scales.data());
    memory bm({{k}, dt::f32, tag::x}, eng, bias.data());
    pr.quant.execute(onednn::stream(), {{DNNL_ARG_FROM, xm}, {DNNL_ARG_TO, sm}, {DNNL_ARG_ATTR_OUTPUT_SCALES, in_sc}});
    pr.conv.execute(onednn::stream(), {{DNNL_ARG_SRC, sm},
                                       {DNNL_ARG_WEIGHTS, pr.weights},
                                       {DNNL_ARG_BIAS, bm},
                                       {DNNL_ARG_DST, dm},
                                       {DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, out_sc}});
    if (pr.has_out) {
      memory ym = onednn::wrap(y, pr.y_md);
      pr.out.execute(onednn::stream(), dm, ym);
    }
    onednn::stream().wait();
  });
  return y;
}

struct LinearInt8::Prim {
  dnnl::matmul mm;
};

LinearInt8::LinearInt8(const Tensor& w_in, const Tensor& bias) {
  EG_CHECK(w_in.dim() == 2 && w_in.dtype() == DType::f32, "LinearInt8: expected an f32 weight [N, K], got ",
           dtype_name(w_in.dtype()), " ", shape_str(w_in.shape()));
  const Tensor w = w_in.to(Device::cpu());
  n_ = w.size(0);
  k_ = w.size(1);
  quantize_rows(w, n_, wq_, w_scale_, "LinearInt8");
  bias_ = host_bias(bias, n_, "LinearInt8");
}

LinearInt8::~LinearInt8() = default;

Shape LinearInt8::out_shape(const Tensor& x) const {
  EG_CHECK(x.device().is_cpu() && x.dtype() == DType::f32 && x.dim() >= 1 && x.size(-1) == k_,
           "LinearInt8: expected an f32 CPU input [..., ", k_, "], got ", dtype_name(x.dtype()), " ",
           shape_str(x.shape()), " on ", x.device().str());
  Shape s = x.shape();
  s.back() = n_;
  return s;
}

LinearInt8::RowQuant LinearInt8::row_quant(const Tensor& x_in) const {
  const Tensor x = x_in.to_plain();
  EG_CHECK(x.device().is_cpu() && x.dtype() == DType::f32, "int8 reference: expected an f32 activation on the CPU");
  const int64_t m = x.numel() / k_;
  const float* xp = x.data<float>();
  // One pass: each row's largest magnitude, and the whole input's minimum (its signedness).
  RowQuant q;
  q.scale.resize(size_t(m));
  float lo = 0.f;
  int bad = 0;
#pragma omp parallel for reduction(min : lo) reduction(| : bad) schedule(static)
  for (int64_t i = 0; i < m; ++i) {
    float amax = 0.f;
    for (int64_t c = 0; c < k_; ++c) {
      const float v = xp[i * k_ + c];
      amax = std::max(amax, std::fabs(v));
      lo = std::min(lo, v);
      bad |= !std::isfinite(v);
    }
    q.scale[size_t(i)] = amax;
  }
  EG_CHECK(!bad, "int8 reference: the activation holds NaN or Inf");
  q.is_unsigned = lo >= 0.f;
  for (float& s : q.scale) s = s > 0.f ? (q.is_unsigned ? 255.f : 127.f) / s : 1.f;
  return q;
}

Tensor LinearInt8::quantize_input(const Tensor& x_in, const RowQuant& q) const {
  const Tensor x = x_in.to_plain();
  const int64_t m = x.numel() / k_;
  const float* xp = x.data<float>();
  Tensor xq = Tensor::empty({m, k_}, q.is_unsigned ? DType::u8 : DType::s8);
  const bool one = q.scale.size() == 1;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < m; ++i) {
    const float s = q.scale[one ? 0 : size_t(i)];
    for (int64_t c = 0; c < k_; ++c) {
      if (q.is_unsigned) xq.data<uint8_t>()[i * k_ + c] = quantize_one<uint8_t>(xp[i * k_ + c], s, 0, 255);
      else xq.data<int8_t>()[i * k_ + c] = quantize_one<int8_t>(xp[i * k_ + c], s, -127, 127);
    }
  }
  return xq;
}

Tensor LinearInt8::forward(const Tensor& x) const { return run(x, row_quant(x)); }
Tensor LinearInt8::forward_ref(const Tensor& x) const { return run_ref(x, row_quant(x)); }
Tensor LinearInt8::forward(const Tensor& x, const ActQuant& q) const { return run(x, {{q.scale}, q.is_unsigned}); }
Tensor LinearInt8::forward_ref(const Tensor& x, const ActQuant& q) const {
  return run_ref(x, {{q.scale}, q.is_unsigned});
}

Tensor LinearInt8::run_ref(const Tensor& x, const RowQuant& q) const {
  const Shape ys = out_shape(x);
  const int64_t m = x.numel() / k_;
  Tensor xq = quantize_input(x, q);
  const int8_t* wq = wq_.data<int8_t>();
  Tensor y = Tensor::empty(ys);
  float* yp = y.data<float>();
  for (int64_t i = 0; i < m; ++i)
    for (int64_t o = 0; o < n_; ++o) {
      int32_t acc = 0;
      for (int64_t c = 0; c < k_; ++c) {
        const int32_t a =
            q.is_unsigned ? int32_t(xq.data<uint8_t>()[i * k_ + c]) : int32_t(xq.data<int8_t>()[i * k_ + c]);
        acc += a * int32_t(wq[o * k_ + c]);
      }
      const float s = q.scale[q.scale.size() == 1 ? 0 : size_t(i)];
      yp[i * n_ + o] = float(acc) * (1.f / (s * w_scale_[size_t(o)])) + bias_[size_t(o)];
    }
  return y;
}

Tensor LinearInt8::run(const Tensor& x, const RowQuant& q) const {
  const Shape ys = out_shape(x);
  const int64_t m = x.numel() / k_;
  auto& slot = prims_[{int64_t(q.is_unsigned)}];
  if (!slot) {
    auto pr = std::make_unique<Prim>();
    EG_DNNL_TRY("creating the int8 matmul", {
      // M is a runtime dimension: one primitive serves every batch and sequence length.
      memory::desc src({DNNL_RUNTIME_DIM_VAL, k_}, q.is_unsigned ? dt::u8 : dt::s8, tag::ab);
      memory::desc wei({k_, n_}, dt::s8, tag::ba);  // the [N, K] weight, read transposed
      memory::desc dst({DNNL_RUNTIME_DIM_VAL, n_}, dt::s32, tag::ab);
      dnnl::matmul::desc d(src, wei, dst);
      pr->mm = dnnl::matmul(dnnl::matmul::primitive_desc(d, onednn::engine()));
    });
    slot = std::move(pr);
  }
  Tensor xq = quantize_input(x, q);
  Tensor acc = Tensor::empty({m, n_}, DType::s32);
  EG_DNNL_TRY("running the int8 matmul", {
    dnnl::engine& eng = onednn::engine();
    memory src({{m, k_}, q.is_unsigned ? dt::u8 : dt::s8, tag::ab}, eng, xq.raw());
    memory wei({{k_, n_}, dt::s8, tag::ba}, eng, wq_.raw());
    memory dst({{m, n_}, dt::s32, tag::ab}, eng, acc.raw());
    slot->mm.execute(onednn::stream(), {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}});
    onednn::stream().wait();
  });
  // Dequantised as the reference computes it: 1 / (row scale x feature scale) per element.
  Tensor y = Tensor::empty(ys);
  const int32_t* ap = acc.data<int32_t>();
  float* yp = y.data<float>();
  const bool one = q.scale.size() == 1;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < m; ++i) {
    const float s = q.scale[one ? 0 : size_t(i)];
    for (int64_t o = 0; o < n_; ++o)
      yp[i * n_ + o] = float(ap[i * n_ + o]) * (1.f / (s * w_scale_[size_t(o)])) + bias_[size_t(o)];
  }
  return y;
}

}  // namespace eg::quant
