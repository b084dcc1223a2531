// Layout ops, reference: swap12 ([A, B, C, D] -> [A, C, B, D]). Any dtype (bytes).
#include <cstring>

#include "kernels/ref/ref.h"

namespace eg::ref {

void swap12(const Tensor& x, Tensor& y) {
  const int64_t A = x.size(0), B = x.size(1), C = x.size(2), D = x.size(3);
  const size_t row = size_t(D) * dtype_size(x.dtype());
  const char* xp = static_cast<const char*>(x.raw());
  char* yp = static_cast<char*>(y.raw());
  for (int64_t a = 0; a < A; ++a)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t c = 0; c < C; ++c)
        std::memcpy(yp + size_t((a * C + c) * B + b) * row, xp + size_t((a * B + b) * C + c) * row, row);
}

}  // namespace eg::ref
