// Output shapes of convolution and pooling (the formulas every framework uses).
#include "kernels/ops.h"

namespace eg::ops {

Shape conv2d_out_shape(const Shape& x, const Shape& w, const Conv2dParams& p) {
  EG_CHECK(x.size() == 4 && w.size() == 4, "conv2d: input and weight must be 4-D");
  auto out = [](int64_t in, int64_t k, int64_t s, int64_t pad, int64_t d) { return (in + 2 * pad - d * (k - 1) - 1) / s + 1; };
  int64_t oh = out(x[2], w[2], p.stride_h, p.pad_h, p.dil_h), ow = out(x[3], w[3], p.stride_w, p.pad_w, p.dil_w);
  EG_CHECK(oh > 0 && ow > 0, "conv2d: input ", shape_str(x), " is too small for kernel ", w[2], "x", w[3],
           " with padding ", p.pad_h, "x", p.pad_w, " and dilation ", p.dil_h, "x", p.dil_w);
  return {x[0], w[0], oh, ow};
}

Shape pool2d_out_shape(const Shape& x, const Pool2dParams& p) {
  EG_CHECK(x.size() == 4, "pool2d: input must be 4-D");
  return {x[0], x[1], (x[2] + 2 * p.pad_h - p.kernel_h) / p.stride_h + 1, (x[3] + 2 * p.pad_w - p.kernel_w) / p.stride_w + 1};
}

}  // namespace eg::ops
