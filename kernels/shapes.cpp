// Output shapes of convolution and pooling (floor mode, the formula every framework
// uses): out = (in + 2 pad - dil (k - 1) - 1) / stride + 1, checked so that a window
// that does not fit is an error rather than C++'s truncation toward zero.
#include "kernels/ops.h"

namespace eg::ops {

namespace {

// Output length along one spatial dim, or 0 when not even one window fits.
int64_t out_len(int64_t in, int64_t k, int64_t stride, int64_t pad, int64_t dil) {
  const int64_t span = in + 2 * pad - dil * (k - 1) - 1;
  return span < 0 ? 0 : span / stride + 1;
}

}  // namespace

Shape conv2d_out_shape(const Shape& x, const Shape& w, const Conv2dParams& p) {
  EG_CHECK(x.size() == 4 && w.size() == 4, "conv2d: input and weight must be 4-D, got ", shape_str(x), " and ",
           shape_str(w));
  EG_CHECK(p.stride_h >= 1 && p.stride_w >= 1 && p.dil_h >= 1 && p.dil_w >= 1 && p.pad_h >= 0 && p.pad_w >= 0 &&
               p.groups >= 1,
           "conv2d: stride and dilation must be >= 1, padding >= 0 and groups >= 1 (stride ", p.stride_h, "x",
           p.stride_w, ", dilation ", p.dil_h, "x", p.dil_w, ", padding ", p.pad_h, "x", p.pad_w, ", groups ", p.groups,
           ")");
  const int64_t oh = out_len(x[2], w[2], p.stride_h, p.pad_h, p.dil_h);
  const int64_t ow = out_len(x[3], w[3], p.stride_w, p.pad_w, p.dil_w);
  EG_CHECK(oh > 0 && ow > 0, "conv2d: input ", shape_str(x), " is too small for kernel ", w[2], "x", w[3],
           " with padding ", p.pad_h, "x", p.pad_w, " and dilation ", p.dil_h, "x", p.dil_w);
  return {x[0], w[0], oh, ow};
}

Shape pool2d_out_shape(const Shape& x, const Pool2dParams& p) {
  EG_CHECK(x.size() == 4, "pool2d: input must be 4-D, got ", shape_str(x));
  EG_CHECK(p.kernel_h >= 1 && p.kernel_w >= 1 && p.stride_h >= 1 && p.stride_w >= 1 && p.pad_h >= 0 && p.pad_w >= 0,
           "pool2d: kernel and stride must be >= 1 and padding >= 0 (kernel ", p.kernel_h, "x", p.kernel_w, ", stride ",
           p.stride_h, "x", p.stride_w, ", padding ", p.pad_h, "x", p.pad_w, ")");
  return {x[0], x[1], out_len(x[2], p.kernel_h, p.stride_h, p.pad_h, 1),
          out_len(x[3], p.kernel_w, p.stride_w, p.pad_w, 1)};
}

}  // namespace eg::ops
