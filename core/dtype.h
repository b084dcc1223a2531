// Element types, their sizes and names, and the 16-bit float conversions.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>

namespace eg {

enum class DType : uint8_t { f32, f64, bf16, f16, s8, u8, s32, s64 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);
DType parse_dtype(const std::string& name);
inline bool is_floating(DType t) { return t == DType::f32 || t == DType::f64 || t == DType::bf16 || t == DType::f16; }
// bf16 or f16: mixed precision's activation dtypes (Note [Autocast] in autograd/autocast.h).
inline bool is_half(DType t) { return t == DType::bf16 || t == DType::f16; }

// Storage types for the 16-bit floats (bit patterns; arithmetic goes through float).
struct bf16_t {
  uint16_t bits;
};
struct f16_t {
  uint16_t bits;
};

inline float bf16_to_float(bf16_t v) {
  uint32_t u = uint32_t(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline bf16_t float_to_bf16(float f) {  // round to nearest even; NaN stays NaN
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16_t{uint16_t((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16_t{uint16_t(u >> 16)};
}
float f16_to_float(f16_t v);
f16_t float_to_f16(float f);

template <class T>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::f32;
};
template <>
struct dtype_of<double> {
  static constexpr DType value = DType::f64;
};
template <>
struct dtype_of<bf16_t> {
  static constexpr DType value = DType::bf16;
};
template <>
struct dtype_of<f16_t> {
  static constexpr DType value = DType::f16;
};
template <>
struct dtype_of<int8_t> {
  static constexpr DType value = DType::s8;
};
template <>
struct dtype_of<uint8_t> {
  static constexpr DType value = DType::u8;
};
template <>
struct dtype_of<int32_t> {
  static constexpr DType value = DType::s32;
};
template <>
struct dtype_of<int64_t> {
  static constexpr DType value = DType::s64;
};
template <class T>
inline constexpr DType dtype_v = dtype_of<T>::value;

}  // namespace eg
