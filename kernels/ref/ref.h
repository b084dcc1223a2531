// Declarations of the ref implementations; kernels/registry.cpp wires the ones that
// exist. An implementation of op X is eg::ref::X with the signature ops::X's type.
#pragma once
#include "kernels/ops.h"

namespace eg::ref {
#define EG_DECLARE_IMPL(name, Fn) ops::Fn name;
EG_OP_LIST(EG_DECLARE_IMPL)
#undef EG_DECLARE_IMPL
}  // namespace eg::ref
