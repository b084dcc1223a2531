// Sixteen bf16 activations as sixteen floats in one AVX-512 register: one row of an
// nChw16c tile (Note [Blocked activations]), for the bf16 paths of the blocked kernels
// (Note [bf16 kernels]).
//
// Why by hand: the generic loops (ld/st in cpu.h over 16 lanes) vectorise, but gcc
// narrows each rounded row back to 16 bits through permutes and masked moves and keeps
// the float accumulators of a reduction on the stack, so the bf16 batch norm ran at
// about half the memory rate of the f32 one. store16 rounds exactly as float_to_bf16
// (to nearest even, NaN kept and made quiet), not with AVX512_BF16's vcvtneps2bf16,
// which flushes denormals: a kernel written with these gives its scalar loop's bits up
// to where fused multiply-adds fall.
//
// Defined where the compiler targets AVX-512 (EG_NATIVE on such a CPU); elsewhere the
// kernels keep their generic loops.
#pragma once
#if defined(__AVX512F__)
#include <immintrin.h>

#include "core/dtype.h"

#define EG_BF16X16 1

namespace eg::cpu::bf16x16 {

inline __m512 load16(const bf16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

inline void store16(bf16_t* p, __m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i hi = _mm512_srli_epi32(u, 16);
  const __mmask16 nan =
      _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  const __m512i bias = _mm512_add_epi32(_mm512_and_si512(hi, _mm512_set1_epi32(1)), _mm512_set1_epi32(0x7fff));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
  r = _mm512_mask_or_epi32(r, nan, hi, _mm512_set1_epi32(0x40));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
}

// max(v, 0) as std::max(v, 0.f) gives it: a NaN stays NaN, -0 stays -0 (maxps returns
// its second operand unless the first is greater).
inline __m512 relu(__m512 v) { return _mm512_max_ps(_mm512_setzero_ps(), v); }

}  // namespace eg::cpu::bf16x16
#endif
