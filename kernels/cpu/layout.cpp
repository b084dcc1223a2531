// Layout ops, fast CPU path: swap12 ([A, B, C, D] -> [A, C, B, D]) as row copies
// parallel over (a, c). Bandwidth-bound: 2 x bytes moved.
#include <cstring>

#include "kernels/cpu/cpu.h"

namespace eg::cpu {

void swap12(const Tensor& x, Tensor& y) {
  const int64_t A = x.size(0), B = x.size(1), C = x.size(2), D = x.size(3);
  const size_t row = size_t(D) * dtype_size(x.dtype());
  const char* xp = static_cast<const char*>(x.raw());
  char* yp = static_cast<char*>(y.raw());
#pragma omp parallel for collapse(2) schedule(static) if (A * B * C * D > 65536)
  for (int64_t a = 0; a < A; ++a)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t b = 0; b < B; ++b)
        std::memcpy(yp + size_t((a * C + c) * B + b) * row, xp + size_t((a * B + b) * C + c) * row, row);
}

}  // namespace eg::cpu
