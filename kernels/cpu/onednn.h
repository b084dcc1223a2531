// oneDNN 2.6 plumbing for the CPU fast paths (internal: included only by
// kernels/cpu/*.cpp, never by a public header). One engine and stream per process;
// primitives are cached per thread by a key describing shapes and parameters, since
// creating one costs far more than running it on ResNet-sized tensors.
#pragma once
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include <oneapi/dnnl/dnnl.hpp>

#include "core/tensor.h"

namespace eg::onednn {

dnnl::engine& engine();
dnnl::stream& stream();  // in-order CPU stream; kernels wait on it before returning

inline dnnl::memory::dims dims(const Shape& s) { return dnnl::memory::dims(s.begin(), s.end()); }

inline dnnl::memory::data_type data_type(DType t) {
  switch (t) {
    case DType::f32: return dnnl::memory::data_type::f32;
    case DType::bf16: return dnnl::memory::data_type::bf16;
    case DType::f16: return dnnl::memory::data_type::f16;
    case DType::s8: return dnnl::memory::data_type::s8;
    case DType::u8: return dnnl::memory::data_type::u8;
    case DType::s32: return dnnl::memory::data_type::s32;
    default: EG_THROW("oneDNN has no data type for ", dtype_name(t));
  }
}

// oneDNN's tag for a CPU activation layout (Note [Blocked activations], and NHWC).
inline dnnl::memory::format_tag tag_of(Format f) {
  using Tag = dnnl::memory::format_tag;
  return f == Format::nchw16c ? Tag::nChw16c : f == Format::nhwc ? Tag::nhwc : Tag::nchw;
}

// A memory object over the tensor's own buffer (no copy). The caller's descriptor
// says the layout, nChw16c included (Note [Blocked activations]).
inline dnnl::memory wrap(const Tensor& t, dnnl::memory::format_tag tag) {
  return dnnl::memory({dims(t.shape()), data_type(t.dtype()), tag}, engine(), t.raw_any());
}
inline dnnl::memory wrap(const Tensor& t, const dnnl::memory::desc& md) {
  return dnnl::memory(md, engine(), t.raw_any());
}

// Per-thread cache of objects (primitives, descriptors) keyed by a string.
template <class T>
T& cached(const std::string& key, const std::function<T()>& make) {
  thread_local std::unordered_map<std::string, std::unique_ptr<T>> cache;
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, std::make_unique<T>(make())).first;
  return *it->second;
}

// Key fragment for a shape: "128x16x32x32".
std::string key_of(const Shape& s);

}  // namespace eg::onednn

// Runs a oneDNN call and rethrows its dnnl::error as eg::Error naming what failed.
#define EG_DNNL_TRY(what_, ...)                                                              \
  do {                                                                                       \
    try {                                                                                    \
      __VA_ARGS__;                                                                           \
    } catch (const dnnl::error& e) {                                                         \
      EG_THROW("oneDNN failed in ", what_, ": ", e.what(), " (status ", int(e.status), ")"); \
    }                                                                                        \
  } while (0)
