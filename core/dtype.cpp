#include "core/dtype.h"

#include "core/error.h"

namespace eg {

namespace detail {
// The message in the user's terms, then where it was raised, for a bug report; the
// failed expression stays in the source (it read as internals: "[check failed:
// rule.ok(at(m, c))]").
void throw_error(const char* file, int line, const std::string& msg) {
  std::string s = msg;
  const char* base = file;
  for (const char* p = file; *p; ++p)
    if (*p == '/') base = p + 1;
  s += concat(" (", base, ":", line, ")");
  throw Error(s);
}
}  // namespace detail

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::bf16: return 2;
    case DType::f16: return 2;
    case DType::s8: return 1;
    case DType::u8: return 1;
    case DType::s32: return 4;
    case DType::s64: return 8;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::s8: return "s8";
    case DType::u8: return "u8";
    case DType::s32: return "s32";
    case DType::s64: return "s64";
  }
  return "?";
}

DType parse_dtype(const std::string& n) {
  for (DType t : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::s8, DType::u8, DType::s32, DType::s64})
    if (n == dtype_name(t)) return t;
  EG_THROW("unknown dtype '", n, "' (expected f32, f64, bf16, f16, s8, u8, s32 or s64)");
}

// IEEE binary16 <-> binary32, round to nearest even, with subnormals, inf and NaN.
float f16_to_float(f16_t v) {
  uint32_t h = v.bits, sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: renormalise
      exp = 127 - 15 + 1;
      while (!(man & 0x400u)) {
        man <<= 1;
        --exp;
      }
      u = sign | (exp << 23) | ((man & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

f16_t float_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  int32_t exp = int32_t((u >> 23) & 0xff) - 127 + 15;
  uint32_t man = u & 0x7fffffu;
  if (((u >> 23) & 0xff) == 0xff) return f16_t{uint16_t(sign | 0x7c00u | (man ? 0x200u : 0))};
  if (exp >= 31) return f16_t{uint16_t(sign | 0x7c00u)};
  if (exp <= 0) {
    if (exp < -10) return f16_t{uint16_t(sign)};
    man |= 0x800000u;
    uint32_t shift = uint32_t(14 - exp);
    uint32_t half = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return f16_t{uint16_t(sign | half)};
  }
  uint32_t half = sign | (uint32_t(exp) << 10) | (man >> 13), rem = man & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;
  return f16_t{uint16_t(half)};
}

}  // namespace eg
