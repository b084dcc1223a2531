// Declarations of the cpu implementations; kernels/registry.cpp wires the ones that
// exist. An implementation of op X is eg::cpu::X with the signature ops::X's type, less
// its accumulate flags where it has them (ops::Overwriting, Note [Computed, then added]).
#pragma once
#include <initializer_list>

#include "kernels/ops.h"

namespace eg::cpu {
#define EG_DECLARE_IMPL(name, Fn) ops::Overwriting<ops::tag::name> name;  // Note [Computed, then added]
EG_OP_LIST(EG_DECLARE_IMPL)
#undef EG_DECLARE_IMPL

// Activations held as f32 or bf16 (Note [bf16 kernels]): kernels templated on the
// storage type load to float, compute in float and store rounded to nearest even.
inline float ld(const float* p, int64_t i) { return p[i]; }
inline float ld(const bf16_t* p, int64_t i) { return bf16_to_float(p[i]); }
inline void st(float* p, int64_t i, float v) { p[i] = v; }
inline void st(bf16_t* p, int64_t i, float v) { p[i] = float_to_bf16(v); }

// Whether the defined tensors among `ts` share one dtype (mixed f32 / bf16 operands take
// the ref path: no hot path mixes them).
inline bool same_dtype(std::initializer_list<const Tensor*> ts) {
  const Tensor* first = nullptr;
  for (const Tensor* t : ts) {
    if (!t->defined()) continue;
    if (!first) first = t;
    if (t->dtype() != first->dtype()) return false;
  }
  return true;
}

// Runs f(T{}) with T the storage type of `t`: float for f32, bf16_t for bf16.
template <class F>
decltype(auto) with_storage(const Tensor& t, F&& f) {
  if (t.dtype() == DType::bf16) return f(bf16_t{});
  return f(float{});
}

// For format-aware kernels (Note [Blocked activations]): `t` in format f, either t itself
// or a converted copy held in `keep`.
inline const Tensor& in_format(const Tensor& t, Format f, Tensor& keep) {
  if (!t.defined() || t.format() == f) return t;
  keep = t.to_format(f);
  return keep;
}

// The oneDNN implementation a convolution pass ("fwd", "bwd_data", "bwd_weight") runs
// with, such as "jit_wino_4x3:avx512_core" (Note [Winograd convolutions]), for f32 or
// bf16 activations and weights.
std::string conv2d_implementation(const std::string& pass, const Shape& x, const Shape& w, const ops::Conv2dParams& p,
                                  DType dtype = DType::f32);
}  // namespace eg::cpu
