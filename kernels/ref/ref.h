// Declarations of the ref implementations; kernels/registry.cpp wires the ones that
// exist. An implementation of op X is eg::ref::X with the signature ops::X's type, less
// its accumulate flags where it has them (ops::Overwriting, Note [Computed, then added]).
#pragma once
#include <initializer_list>

#include "kernels/ops.h"

namespace eg::ref {
#define EG_DECLARE_IMPL(name, Fn) ops::Overwriting<ops::tag::name> name;  // Note [Computed, then added]
EG_OP_LIST(EG_DECLARE_IMPL)
#undef EG_DECLARE_IMPL

// Note [bf16 kernels] in kernels/ops.h: a bf16 (or f16: the CUDA kernels' twin, Note
// [16-bit CUDA kernels]) case runs an op's f64 path. `widened` is
// a tensor as f64 (bf16 and f32 values are exact there; undefined stays undefined);
// `narrowed_into` rounds an f64 result once into `out`'s dtype.
Tensor widened(const Tensor& t);
void narrowed_into(const Tensor& wide, Tensor& out);
// An f64 temporary shaped like `out` (undefined where `out` is).
Tensor wide_like(const Tensor& out);
inline bool any_bf16(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    if (t->defined() && is_half(t->dtype())) return true;
  return false;
}
// The multi-tensor optimizer ops' checks (every backend's): the learning rate one f64
// element, one gradient (and state tensor, step count) per parameter.
void check_multi_step(const char* op, const Tensor& lr, size_t params, std::initializer_list<size_t> lists);
// A dropout draw's first counter, base + offset, and its seed from the host state
// {seed, base} (ops::DropoutFwd's rng).
uint64_t dropout_counter(const Tensor& rng, uint64_t offset, uint64_t* seed);
// Each an f64 [1] count (adamw_step_multi's steps).
void check_step_counts(const char* op, const std::vector<Tensor>& steps);
// Adds one to a host count and returns the new count.
int64_t advance_step_count(Tensor& step);
// Whether a multi-tensor step's host flag (f32 [1], or undefined: no) says to skip it.
bool skipped(const Tensor& skip_if);
// amp_unscale's scale, read on the host (one f64 element, checked).
double loss_scale_of(const Tensor& scale);
}  // namespace eg::ref
