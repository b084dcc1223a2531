#include "core/tensor.h"

#include <chrono>
#include <cstring>
#include <sstream>

#include "core/rng.h"
#ifdef EG_WITH_CUDA
#include "core/cuda_context.h"
#endif

namespace eg {

Generator& default_generator() {
  static Generator g(0);
  return g;
}
void manual_seed(uint64_t seed) { default_generator().set_state(seed, 0); }

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Storage::Storage(size_t n, Device dev) : Storage(n, dev, dev.is_cpu() ? cpu_allocator() : cuda_allocator(dev.index)) {}

Storage::Storage(size_t n, Device dev, Allocator& a) : nbytes(n), device(dev), allocator(&a) { data = a.allocate(n); }

Storage::~Storage() { allocator->deallocate(data, nbytes); }

int64_t Tensor::size(int d) const {
  int n = dim();
  if (d < 0) d += n;
  EG_CHECK(d >= 0 && d < n, "dimension ", d, " out of range for a tensor of shape ", shape_str(shape()));
  return shape()[size_t(d)];
}

std::string Tensor::str() const {
  if (!defined()) return "undefined tensor";
  return detail::concat(dtype_name(dtype()), shape_str(shape()),
                        format() == Format::nchw16c ? " nChw16c"
                        : format() == Format::nhwc  ? " NHWC"
                                                    : "",
                        " on ", device().str());
}

// s32: max pooling's argmax indices, held in its output's layout (Note [Pooling in the
// convolutions' layout] in kernels/cpu/pool.cpp).
bool Tensor::blockable() const {
  return defined() && dim() == 4 && (dtype() == DType::f32 || dtype() == DType::bf16 || dtype() == DType::s32) &&
         device().is_cpu() && shape()[1] % kBlock == 0;
}

bool Tensor::nhwc_capable() const {
  if (!defined() || dim() != 4) return false;
  return device().is_cuda() ? is_floating(dtype()) || dtype() == DType::s32
                            : dtype() == DType::f32 || dtype() == DType::bf16 || dtype() == DType::s32;
}

void Tensor::set_format(Format f) const {
  EG_CHECK(f == Format::plain || (f == Format::nchw16c && blockable()) || (f == Format::nhwc && nhwc_capable()),
           "internal: ", str(), " cannot be held as ", f == Format::nhwc ? "NHWC" : "nChw16c");
  impl().format = f;
}

namespace {
// nchw16c <-> nchw: [N, C/16, L, 16] <-> [N, C, L], parallel over (n, channel block).
template <class T>
void reorder_blocked(const T* src, T* dst, int64_t N, int64_t C, int64_t L, bool to_blocked) {
  const int64_t CB = C / kBlock;
#pragma omp parallel for collapse(2) schedule(static) if (N * C * L > 65536)
  for (int64_t n = 0; n < N; ++n)
    for (int64_t cb = 0; cb < CB; ++cb) {
      const int64_t b = (n * CB + cb) * L * kBlock;  // same offset in both layouts
      for (int64_t l = 0; l < L; ++l)
        for (int64_t j = 0; j < kBlock; ++j) {
          if (to_blocked) dst[b + l * kBlock + j] = src[b + j * L + l];
          else dst[b + j * L + l] = src[b + l * kBlock + j];
        }
    }
}
// [N, C, L] <-> [N, L, C] (NCHW <-> NHWC) on the CPU, parallel over images.
template <class T>
void reorder_nhwc_cpu(const T* src, T* dst, int64_t N, int64_t C, int64_t L, bool to_nhwc) {
#pragma omp parallel for schedule(static) if (N * C * L > 65536)
  for (int64_t n = 0; n < N; ++n) {
    const T* s = src + n * C * L;
    T* d = dst + n * C * L;
    if (to_nhwc) {
      for (int64_t l = 0; l < L; ++l)
        for (int64_t c = 0; c < C; ++c) d[l * C + c] = s[c * L + l];
    } else {
      for (int64_t c = 0; c < C; ++c)
        for (int64_t l = 0; l < L; ++l) d[c * L + l] = s[l * C + c];
    }
  }
}
}  // namespace

namespace {
thread_local LayoutConversions* g_conversions = nullptr;
thread_local bool g_converting = false;  // inside a counted conversion (NHWC <-> nChw16c goes through plain)
struct Converting {
  Converting() { g_converting = true; }
  ~Converting() { g_converting = false; }
};

// Runs f(E{}) with E an unsigned integer of t's element size: a layout change moves
// elements and never converts them, so f32 and s32 (pooling's indices) share one path.
template <class F>
void with_element_bits(const Tensor& t, F&& f) {
  if (dtype_size(t.dtype()) == 2) f(uint16_t{});
  else f(uint32_t{});
}
}  // namespace

LayoutConversions* layout_conversion_counter() { return g_conversions; }
void set_layout_conversion_counter(LayoutConversions* c) { g_conversions = c; }

Tensor Tensor::to_format(Format f) const {
  if (!defined() || format() == f) return *this;
  if (g_conversions && !g_converting) {
    const auto t0 = std::chrono::steady_clock::now();
    Tensor t;
    {
      const Converting inside;
      t = to_format(f);
    }
    ++g_conversions->count;
    g_conversions->bytes += int64_t(nbytes());
    g_conversions->seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return t;
  }
  if (format() == Format::nhwc || f == Format::nhwc) {  // Note [Channels-last activations on CUDA]
    if (format() != Format::plain && f != Format::plain) return to_plain().to_format(f);
    EG_CHECK(nhwc_capable(), "internal: ", str(), " cannot be converted to NHWC");
    if (shape()[1] == 1 || shape()[2] * shape()[3] == 1) {  // the same bytes either way (a 1x1 weight): a view
      auto impl = std::make_shared<TensorImpl>();
      impl->storage = impl_->storage;
      impl->offset = impl_->offset;
      impl->shape = shape();
      impl->dtype = dtype();
      impl->format = f;
      return Tensor(std::move(impl));
    }
    Tensor t = empty(shape(), dtype(), device());
    t.impl().format = f;
    if (device().is_cpu()) {
      const int64_t N = shape()[0], C = shape()[1], L = shape()[2] * shape()[3];
      with_element_bits(*this, [&](auto e) {
        using E = decltype(e);
        reorder_nhwc_cpu(static_cast<const E*>(raw_any()), static_cast<E*>(t.raw_any()), N, C, L, f == Format::nhwc);
      });
      return t;
    }
#ifdef EG_WITH_CUDA
    cuda::set_device(device().index);
    cuda::reorder_nhwc(raw_any(), t.raw_any(), shape()[0], shape()[1], shape()[2] * shape()[3], dtype_size(dtype()),
                       f == Format::nhwc);
#endif
    return t;
  }
  EG_CHECK(blockable(), "internal: ", str(), " cannot be converted to nChw16c");
  Tensor t = empty(shape(), dtype(), device());
  t.impl().format = f;
  const int64_t N = shape()[0], C = shape()[1], L = shape()[2] * shape()[3];
  with_element_bits(*this, [&](auto e) {
    using E = decltype(e);
    reorder_blocked(static_cast<const E*>(raw_any()), static_cast<E*>(t.raw_any()), N, C, L, f == Format::nchw16c);
  });
  return t;
}

Tensor Tensor::to_plain() const { return to_format(Format::plain); }

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape) EG_CHECK(d >= 0, "negative dimension in shape ", shape_str(shape));
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(size_t(shape_numel(shape)) * dtype_size(dtype), device);
  impl->shape = shape;
  impl->dtype = dtype;
  return Tensor(impl);
}

Tensor Tensor::empty_pinned(const Shape& shape, DType dtype) {
  for (int64_t d : shape) EG_CHECK(d >= 0, "negative dimension in shape ", shape_str(shape));
  auto impl = std::make_shared<TensorImpl>();
  impl->storage =
      std::make_shared<Storage>(size_t(shape_numel(shape)) * dtype_size(dtype), Device::cpu(), pinned_allocator());
  impl->shape = shape;
  impl->dtype = dtype;
  return Tensor(impl);
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.zero_();
  return t;
}

Tensor Tensor::ones(const Shape& shape, DType dtype, Device device) { return full(shape, 1.0, dtype, device); }

namespace {
template <class F>
void fill_host(void* p, DType t, int64_t n, F value_at) {
  switch (t) {
    case DType::f32:
      for (int64_t i = 0; i < n; ++i) static_cast<float*>(p)[i] = float(value_at(i));
      break;
    case DType::f64:
      for (int64_t i = 0; i < n; ++i) static_cast<double*>(p)[i] = value_at(i);
      break;
    case DType::bf16:
      for (int64_t i = 0; i < n; ++i) static_cast<bf16_t*>(p)[i] = float_to_bf16(float(value_at(i)));
      break;
    case DType::f16:
      for (int64_t i = 0; i < n; ++i) static_cast<f16_t*>(p)[i] = float_to_f16(float(value_at(i)));
      break;
    case DType::s8:
      for (int64_t i = 0; i < n; ++i) static_cast<int8_t*>(p)[i] = int8_t(value_at(i));
      break;
    case DType::u8:
      for (int64_t i = 0; i < n; ++i) static_cast<uint8_t*>(p)[i] = uint8_t(value_at(i));
      break;
    case DType::s32:
      for (int64_t i = 0; i < n; ++i) static_cast<int32_t*>(p)[i] = int32_t(value_at(i));
      break;
    case DType::s64:
      for (int64_t i = 0; i < n; ++i) static_cast<int64_t*>(p)[i] = int64_t(value_at(i));
      break;
  }
}
double read_host(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(p)[i];
    case DType::f64: return static_cast<const double*>(p)[i];
    case DType::bf16: return bf16_to_float(static_cast<const bf16_t*>(p)[i]);
    case DType::f16: return f16_to_float(static_cast<const f16_t*>(p)[i]);
    case DType::s8: return static_cast<const int8_t*>(p)[i];
    case DType::u8: return static_cast<const uint8_t*>(p)[i];
    case DType::s32: return static_cast<const int32_t*>(p)[i];
    case DType::s64: return double(static_cast<const int64_t*>(p)[i]);
  }
  return 0;
}
// Builds on the host, then moves to `device`.
template <class F>
Tensor make_host_then_move(const Shape& shape, DType dtype, Device device, F value_at) {
  Tensor t = Tensor::empty(shape, dtype, Device::cpu());
  fill_host(t.raw(), dtype, t.numel(), value_at);
  return t.to(device);
}
}  // namespace

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  return make_host_then_move(shape, dtype, device, [value](int64_t) { return value; });
}

Tensor Tensor::arange(int64_t n, DType dtype, Device device) {
  return make_host_then_move({n}, dtype, device, [](int64_t i) { return double(i); });
}

Tensor Tensor::randn(const Shape& shape, Generator& gen, DType dtype, Device device) {
  uint64_t seed = gen.seed(), off = gen.reserve(uint64_t(shape_numel(shape)));
  return make_host_then_move(shape, dtype, device, [=](int64_t i) { return philox_normal(seed, off, uint64_t(i)); });
}

Tensor Tensor::uniform(const Shape& shape, double lo, double hi, Generator& gen, DType dtype, Device device) {
  uint64_t seed = gen.seed(), off = gen.reserve(uint64_t(shape_numel(shape)));
  return make_host_then_move(
      shape, dtype, device, [=](int64_t i) { return lo + (hi - lo) * double(philox_uniform(seed, off, uint64_t(i))); });
}

template <class T>
Tensor Tensor::from_vector(const std::vector<T>& v, const Shape& shape, Device device) {
  EG_CHECK(int64_t(v.size()) == shape_numel(shape), "from_vector: ", v.size(), " values do not fill shape ",
           shape_str(shape));
  Tensor t = empty(shape, dtype_v<T>, Device::cpu());
  if (!v.empty()) std::memcpy(t.raw(), v.data(), v.size() * sizeof(T));
  return t.to(device);
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  if (is_blocked()) return to_plain().to_vector<T>();
  EG_CHECK(dtype() == dtype_v<T>, "to_vector: tensor holds ", dtype_name(dtype()), ", asked for ",
           dtype_name(dtype_v<T>));
  std::vector<T> v(static_cast<size_t>(numel()));
  if (!device().is_cpu() || host_is_training_device()) count_host_sync();  // Note [Host syncs]
  if (!v.empty()) copy_bytes(v.data(), Device::cpu(), raw(), device(), nbytes());
  return v;
}

#define EG_INSTANTIATE(T)                                                              \
  template Tensor Tensor::from_vector<T>(const std::vector<T>&, const Shape&, Device); \
  template std::vector<T> Tensor::to_vector<T>() const;
EG_INSTANTIATE(float)
EG_INSTANTIATE(double)
EG_INSTANTIATE(bf16_t)
EG_INSTANTIATE(f16_t)
EG_INSTANTIATE(int8_t)
EG_INSTANTIATE(uint8_t)
EG_INSTANTIATE(int32_t)
EG_INSTANTIATE(int64_t)
#undef EG_INSTANTIATE

double Tensor::item() const {
  EG_CHECK(numel() == 1, "item() needs a tensor with one element, got shape ", shape_str(shape()));
  Tensor h = to(Device::cpu()).to_plain();
  return read_host(h.raw(), dtype(), 0);
}

Tensor Tensor::reshape(Shape s) const {
  int64_t known = 1;
  int infer = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      EG_CHECK(infer < 0, "reshape: only one dimension may be -1, got ", shape_str(s));
      infer = int(i);
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) {
    EG_CHECK(known > 0 && numel() % known == 0, "reshape: cannot view ", shape_str(shape()), " as ", shape_str(s));
    s[size_t(infer)] = numel() / known;
  }
  EG_CHECK(shape_numel(s) == numel(), "reshape: cannot view ", shape_str(shape()), " (", numel(), " elements) as ",
           shape_str(s));
  // A blocked tensor is reshaped as a plain copy (Note [Blocked activations]): only
  // kernels ever write blocked tensors, so no caller relies on the view aliasing it.
  if (is_blocked() && s != shape()) return to_plain().reshape(s);
  Tensor v = detach();  // a plain view: autograd goes through fn::reshape
  v.impl().shape = s;
  return v;
}

Tensor Tensor::flatten(int start_dim) const {
  EG_CHECK(start_dim >= 0 && start_dim <= dim(), "flatten: bad start_dim ", start_dim);
  Shape s(shape().begin(), shape().begin() + start_dim);
  int64_t rest = 1;
  for (int i = start_dim; i < dim(); ++i) rest *= shape()[size_t(i)];
  s.push_back(rest);
  return reshape(s);
}

Tensor Tensor::slice(int64_t b, int64_t e) const {
  EG_CHECK(dim() >= 1, "slice: tensor has no dimension 0");
  EG_CHECK(0 <= b && b <= e && e <= shape()[0], "slice [", b, ", ", e, ") out of range for ", shape_str(shape()));
  Tensor v = detach();
  v.impl().shape[0] = e - b;
  v.impl().offset += size_t(b) * (nbytes() / size_t(std::max<int64_t>(shape()[0], 1)));
  return v;
}

Tensor Tensor::detach() const {
  auto v = std::make_shared<TensorImpl>();
  v->storage = impl().storage;
  v->offset = impl().offset;
  v->shape = shape();
  v->dtype = dtype();
  v->format = format();
  return Tensor(v);
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape(), dtype(), device());
  t.impl().format = format();
  t.copy_(*this);
  return t;
}

Tensor Tensor::to(Device d) const {
  if (d == device()) {
    if (d.is_cpu() && host_is_training_device()) count_host_sync();  // a GPU run's copy (Note [Host syncs])
    return *this;
  }
  if (is_blocked()) return to_plain().to(d);
  Tensor t = empty(shape(), dtype(), d);
  t.copy_(*this);
  return t;
}

Tensor Tensor::to(DType t) const {
  if (t == dtype()) return *this;
  Tensor src = to(Device::cpu()).to_plain();
  Tensor dst = empty(shape(), t, Device::cpu());
  const void* p = src.raw();
  DType st = dtype();
  fill_host(dst.raw(), t, numel(), [&](int64_t i) { return read_host(p, st, i); });
  return dst.to(device());
}

void Tensor::copy_(const Tensor& src) {
  EG_CHECK(src.numel() == numel(), "copy_: source has ", src.numel(), " elements, destination ", numel());
  EG_CHECK(src.dtype() == dtype(), "copy_: source is ", dtype_name(src.dtype()), ", destination is ",
           dtype_name(dtype()));
  if (src.format() != format()) {  // Note [Blocked activations]
    copy_((src.device() == device() ? src : src.to(device())).to_format(format()));
    return;
  }
  if (src.device() != device() && (src.device().is_cpu() || device().is_cpu())) count_host_sync();
  if (nbytes()) copy_bytes(raw_any(), device(), src.raw_any(), src.device(), nbytes());
  ++impl().version;
}

Tensor& Tensor::set_requires_grad(bool r) {
  EG_CHECK(!r || is_floating(dtype()), "only floating-point tensors can require gradients, this one is ",
           dtype_name(dtype()));
  impl().requires_grad = r;
  return *this;
}

}  // namespace eg
