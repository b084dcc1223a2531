// Tensor: a handle to a shared TensorImpl (shape, dtype, device, a window into a
// Storage, and autograd metadata). Copies of a Tensor are the same tensor; views
// (reshape, slice along dim 0) are new TensorImpls over the same Storage.
// Layout: contiguous row-major; NCHW for images, [B, T, C] for sequences. One exception,
// internal to the CPU fast path: Note [Blocked activations] below.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"

namespace eg {

namespace autograd {
struct Node;
}

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);
int64_t shape_numel(const Shape& s);

struct Storage {
  Storage(size_t nbytes, Device device);  // from the device's allocator
  Storage(size_t nbytes, Device device, Allocator& allocator);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data = nullptr;
  size_t nbytes = 0;
  Device device;
  Allocator* allocator = nullptr;
};

class Tensor;

// Note [Blocked activations]
// oneDNN's fast CPU convolutions work in a channel-blocked layout, nChw16c: a 4-D f32
// (or bf16, Note [bf16 kernels]) tensor [N, C, H, W] with C % 16 == 0 stored as
// [N, C/16, H, W, 16]. Reordering every
// activation to and from NCHW around each convolution cost 20% of a ResNet-56 step, so
// CPU convolutions write their outputs in that layout when C % 16 == 0, and the CPU
// kernels that sit between convolutions (batch norm, activations, same-shape
// elementwise ops, gradient accumulation) read and write it as it comes. The logical
// shape stays [N, C, H, W]: only the byte order differs, and only CPU kernels that
// declare it (kernels/registry.cpp) ever see it. ops::run hands every other
// implementation a plain copy, and everything a user can reach (to_vector, item,
// copy_, clone, to, reshape) converts, so the layout never shows outside the kernels.
// data<T>() and raw() refuse a blocked tensor; format-aware kernels read data_any<T>().
//
// Note [Channels-last activations on CUDA]
// cuDNN's tensor-core convolutions of 16-bit data are NHWC kernels: given NCHW tensors
// they transpose every input and output around each call (6 of a 38 ms ResNet-50 bf16
// step on an H200), and PyTorch's AMP step runs 1.85x faster channels_last than NCHW. So
// on CUDA the 16-bit convolutions write NHWC (Format::nhwc: a 4-D [N, C, H, W] tensor
// stored [N, H, W, C]; kernels/cuda/conv2d.cu says when), and the CUDA kernels between
// convolutions (batch norm, activations, same-shape elementwise ops, gradient
// accumulation) take it as it comes, as the CPU's take nChw16c: the same rules, with
// cuda_any_format in kernels/registry.cpp. EG_CUDA_CHANNELS_LAST=0 turns it off.
enum class Format : uint8_t { plain, nchw16c, nhwc };
constexpr int64_t kBlock = 16;  // channels per block of nchw16c

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  size_t offset = 0;  // bytes
  Shape shape;
  DType dtype = DType::f32;
  Format format = Format::plain;
  // autograd
  bool requires_grad = false;
  std::shared_ptr<TensorImpl> grad;
  std::shared_ptr<autograd::Node> grad_fn;
  uint32_t output_nr = 0;
  uint64_t version = 0;  // bumped by in-place writes through the public API
};

class Generator;

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // ---- factories
  static Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  // A host tensor in page-locked memory (pinned_allocator()), for copies from a GPU that
  // the host does not wait for (HostCopy, core/deferred_read.h).
  static Tensor empty_pinned(const Shape& shape, DType dtype = DType::f32);
  static Tensor ones(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor full(const Shape& shape, double value, DType dtype = DType::f32, Device device = Device::cpu());
  template <class T>
  static Tensor from_vector(const std::vector<T>& v, const Shape& shape, Device device = Device::cpu());
  // Counter-based random numbers: identical for a given (seed, offset) on CPU and GPU.
  static Tensor randn(const Shape& shape, Generator& gen, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor uniform(const Shape& shape, double lo, double hi, Generator& gen, DType dtype = DType::f32,
                        Device device = Device::cpu());
  static Tensor arange(int64_t n, DType dtype = DType::s64, Device device = Device::cpu());

  // ---- properties
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl().shape; }
  int dim() const { return int(impl().shape.size()); }
  int64_t size(int d) const;  // negative d counts from the end
  int64_t numel() const { return shape_numel(impl().shape); }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype()); }
  DType dtype() const { return impl().dtype; }
  Device device() const { return impl().storage->device; }
  bool is_cuda() const { return device().is_cuda(); }
  std::string str() const;  // "f32[128, 3, 32, 32] on cpu"

  void* raw() const {
    EG_CHECK(impl().format == Format::plain, "internal: a tensor in a kernels' layout, ", str(),
             " reached code that reads it as plain; convert it with to_plain()");
    return raw_any();
  }
  template <class T>
  T* data() const {
    EG_CHECK(dtype() == dtype_v<T>, "tensor holds ", dtype_name(dtype()), " but was read as ", dtype_name(dtype_v<T>));
    return static_cast<T*>(raw());
  }
  // The buffer in whatever format it is in (format-aware kernels only).
  void* raw_any() const { return static_cast<char*>(impl().storage->data) + impl().offset; }
  template <class T>
  T* data_any() const {
    EG_CHECK(dtype() == dtype_v<T>, "tensor holds ", dtype_name(dtype()), " but was read as ", dtype_name(dtype_v<T>));
    return static_cast<T*>(raw_any());
  }

  // ---- memory format (Note [Blocked activations])
  Format format() const { return impl().format; }
  bool is_blocked() const { return impl_ && impl_->format != Format::plain; }
  // Whether this tensor could be held as nchw16c: 4-D f32 or bf16 on the CPU, C % 16 == 0
  // (or s32: max pooling's indices, in its output's layout).
  bool blockable() const;
  // Whether it could be held as nhwc: 4-D, floating or s32, on a GPU; or 4-D f32, bf16 or
  // s32 (pooling's indices) on the CPU, where the int8 reference's convolutions write it
  // (Note [int8 convolution pipeline] in quant/int8.cpp), and the training convolutions
  // where the CPU's pick it (Note [Activation layouts follow the convolutions] in
  // kernels/cpu/conv2d.cpp); the CPU kernels that take it as it comes are listed in
  // kernels/registry.cpp.
  bool nhwc_capable() const;
  // Declares how a kernel laid out the output it is about to write (the tensor's data
  // is not touched: only for outputs that will be overwritten whole).
  void set_format(Format f) const;
  Tensor to_plain() const;  // this tensor when plain, else a plain copy
  Tensor to_format(Format f) const;  // this tensor when already in f, else a copy

  // ---- views and copies
  // Views carry no autograd history (use fn::reshape to differentiate through one).
  Tensor reshape(Shape shape) const;  // view; one dim may be -1
  Tensor flatten(int start_dim = 1) const;
  Tensor slice(int64_t begin, int64_t end) const;  // view of rows [begin, end) of dim 0
  Tensor to(Device device) const;  // copy (or this tensor when already there)
  Tensor to(DType dtype) const;  // converting copy (or this tensor)
  Tensor clone() const;
  Tensor detach() const;  // shares storage, no autograd history
  void copy_(const Tensor& src);  // same numel and dtype; any devices
  void zero_();
  template <class T>
  std::vector<T> to_vector() const;  // copies to host
  double item() const;  // single-element tensor as double
  bool same_storage(const Tensor& o) const { return impl().storage == o.impl().storage; }
  bool is_same(const Tensor& o) const { return impl_ == o.impl_; }

  // ---- autograd
  bool requires_grad() const { return impl_ && impl_->requires_grad; }
  Tensor& set_requires_grad(bool r);
  Tensor grad() const { return impl_ && impl_->grad ? Tensor(impl_->grad) : Tensor(); }
  void set_grad(const Tensor& g) const { impl().grad = g.impl_; }
  const std::shared_ptr<autograd::Node>& grad_fn() const { return impl().grad_fn; }
  // Runs backpropagation from this tensor (autograd/engine.cpp).
  void backward(const Tensor& grad = Tensor(), bool retain_graph = false) const;

  TensorImpl& impl() const {
    EG_CHECK(impl_, "use of an undefined tensor");
    return *impl_;
  }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }

 private:
  std::shared_ptr<TensorImpl> impl_;
};

// Copies raw bytes between host and device memory (cudaMemcpy on CUDA builds).
void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, size_t n);

// Layout conversions (Tensor::to_format between plain, nChw16c and NHWC) made by this
// thread while a counter is set: how many, their bytes and wall time (an op profile's
// share of reorders, Note [Op profiles] in kernels/ops.h). Null, the default: nothing
// counted, one thread-local read per conversion.
struct LayoutConversions {
  int64_t count = 0, bytes = 0;
  double seconds = 0;
};
LayoutConversions* layout_conversion_counter();
void set_layout_conversion_counter(LayoutConversions* c);

}  // namespace eg
