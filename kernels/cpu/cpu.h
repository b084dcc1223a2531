// Declarations of the cpu implementations; kernels/registry.cpp wires the ones that
// exist. An implementation of op X is eg::cpu::X with the signature ops::X's type.
#pragma once
#include "kernels/ops.h"

namespace eg::cpu {
#define EG_DECLARE_IMPL(name, Fn) ops::Fn name;
EG_OP_LIST(EG_DECLARE_IMPL)
#undef EG_DECLARE_IMPL

// For format-aware kernels (Note [Blocked activations]): `t` in format f, either t itself
// or a converted copy held in `keep`.
inline const Tensor& in_format(const Tensor& t, Format f, Tensor& keep) {
  if (!t.defined() || t.format() == f) return t;
  keep = t.to_format(f);
  return keep;
}

// The oneDNN implementation a convolution pass ("fwd", "bwd_data", "bwd_weight") runs
// with, such as "jit_wino_4x3:avx512_core" (Note [Winograd convolutions]).
std::string conv2d_implementation(const std::string& pass, const Shape& x, const Shape& w, const ops::Conv2dParams& p);
}  // namespace eg::cpu
