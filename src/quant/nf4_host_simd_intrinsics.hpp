#pragma once
// Host SIMD paths of the NF4 kernels (x86-64 with AVX-512 F+BW; dequantization also with
// AVX2), private to the library (nf4_host_simd.cpp; nf4_kernels.hpp's Nf4HostSimd routes
// the default host space to them). They produce the portable paths' bits: the per-block table holds
// nf4_decode's values, and a 16-entry table lookup is one vpermps (AVX-512) or two 8-entry
// vpermps and a blend on the code's top bit (AVX2). Large outputs are written with streaming
// stores, which skip the read-for-ownership of every output cache line (half the memory traffic of
// a plain store loop).

#include <cstdint>

#if defined(__AVX512F__) && defined(__AVX512BW__) && !defined(__CUDA_ARCH__)
#define KQLORA_HAVE_AVX512 1
#include <immintrin.h>
#else
#define KQLORA_HAVE_AVX512 0
#endif
#if defined(__AVX2__) && !defined(__CUDA_ARCH__)
#define KQLORA_HAVE_AVX2 1
#include <immintrin.h>

#include <cstring>
#else
#define KQLORA_HAVE_AVX2 0
#endif

namespace kqlora::impl {

#if KQLORA_HAVE_AVX512

/// 16 code indices for 8 packed bytes, one per float lane: lane 2j holds byte j >> 4 and
/// lane 2j+1 byte j; vpermps only reads the low 4 bits of each lane.
inline __m512i nf4_lane_codes(const uint8_t* bytes) {
  const __m512i q = _mm512_cvtepu8_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes)));
  return _mm512_or_si512(_mm512_srli_epi64(q, 4), _mm512_slli_epi64(q, 32));
}

/// Decodes `nbytes` packed bytes (a multiple of 8) through `table` into 2*nbytes floats.
template <bool Stream>
inline void nf4_decode_f32_avx512(const uint8_t* bytes, int64_t nbytes, __m512 table, float* out) {
  for (int64_t j = 0; j < nbytes; j += 8) {
    const __m512 v = _mm512_permutexvar_ps(nf4_lane_codes(bytes + j), table);
    if (Stream) {
      _mm512_stream_ps(out + 2 * j, v);
    } else {
      _mm512_storeu_ps(out + 2 * j, v);
    }
  }
}

/// As above, into bfloat16: the table's values are already bfloat16 values, so the top
/// half of each float lane is the exact result.
template <bool Stream>
inline void nf4_decode_bf16_avx512(const uint8_t* bytes, int64_t nbytes, __m512 table,
                                   uint16_t* out) {
  for (int64_t j = 0; j < nbytes; j += 8) {
    const __m512 v = _mm512_permutexvar_ps(nf4_lane_codes(bytes + j), table);
    const __m256i h = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(v), 16));
    if (Stream) {
      _mm256_stream_si256(reinterpret_cast<__m256i*>(out + 2 * j), h);
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2 * j), h);
    }
  }
}

/// Rounds float lanes to bfloat16 values (nearest even), as kqlora::round_to_bf16 does for
/// finite values.
inline __m512 nf4_round_bf16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb);
  return _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32(int(0xffff0000u))));
}

/// 16 inputs as float lanes: float32 loads as is, bfloat16 widens exactly.
template <bool Bf16>
inline __m512 nf4_load16(const void* p) {
  if (Bf16) {
    const __m256i h = _mm256_loadu_si256(static_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  return _mm512_loadu_ps(p);
}

/// Encodes `n` elements (a multiple of 16) of one block with absmax `a` (> 0) into n/2
/// bytes: nf4_nearest_code for 16 lanes at once. `cb` holds the codebook in the dtype.
/// The interval [c_lo, c_lo+1] around each scaled value is found by a 4-step branchless
/// binary search (vpermps lookups), then the two rounded distances decide, ties low.
template <bool Bf16>
inline void nf4_encode_block_avx512(const void* in, int64_t n, float a, __m512 cb, uint8_t* out) {
  const __m512 va = _mm512_set1_ps(a);
  const __m512 sign = _mm512_set1_ps(-0.0f);
  const __m512i one = _mm512_set1_epi32(1), fourteen = _mm512_set1_epi32(14);
  const size_t esize = Bf16 ? 2 : 4;
  for (int64_t i = 0; i < n; i += 16) {
    __m512 v = _mm512_div_ps(nf4_load16<Bf16>(static_cast<const char*>(in) + i * esize), va);
    if (Bf16) v = nf4_round_bf16(v);
    __m512i idx = _mm512_setzero_si512();
    for (int step = 8; step > 0; step >>= 1) {
      const __m512i cand = _mm512_add_epi32(idx, _mm512_set1_epi32(step));
      const __mmask16 ge = _mm512_cmp_ps_mask(v, _mm512_permutexvar_ps(cand, cb), _CMP_GE_OQ);
      idx = _mm512_mask_mov_epi32(idx, ge, cand);
    }
    const __m512i lo = _mm512_min_epi32(idx, fourteen);
    const __m512i hi = _mm512_add_epi32(lo, one);
    __m512 d_lo = _mm512_andnot_ps(sign, _mm512_sub_ps(v, _mm512_permutexvar_ps(lo, cb)));
    __m512 d_hi = _mm512_andnot_ps(sign, _mm512_sub_ps(v, _mm512_permutexvar_ps(hi, cb)));
    if (Bf16) {
      d_lo = nf4_round_bf16(d_lo);
      d_hi = nf4_round_bf16(d_hi);
    }
    const __mmask16 up = _mm512_cmp_ps_mask(d_hi, d_lo, _CMP_LT_OQ);
    const __m512i code = _mm512_mask_mov_epi32(lo, up, hi);
    // Pairs of lanes -> one byte: even code in the high nibble.
    const __m512i packed = _mm512_or_si512(_mm512_slli_epi64(code, 4), _mm512_srli_epi64(code, 32));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out + i / 2), _mm512_cvtepi64_epi8(packed));
  }
}

#endif  // KQLORA_HAVE_AVX512

#if KQLORA_HAVE_AVX2

/// A block's 16 decoded values as two 8-entry tables (codes 0-7 and 8-15).
struct Nf4TableAvx2 {
  __m256 lo, hi;
};

/// 8 code indices for 4 packed bytes, one per float lane (lane 2j: byte j >> 4, lane
/// 2j+1: byte j); bits above the low 4 are left over from the other nibbles.
inline __m256i nf4_lane_codes_avx2(const uint8_t* bytes) {
  int32_t w;
  std::memcpy(&w, bytes, 4);
  return _mm256_srlv_epi32(_mm256_set1_epi32(w), _mm256_setr_epi32(4, 0, 12, 8, 20, 16, 28, 24));
}

/// The 8 values of 4 packed bytes: both 8-entry lookups (vpermps reads the low 3 bits),
/// the code's bit 3 (shifted into the sign) choosing between them.
inline __m256 nf4_decode8_avx2(const uint8_t* bytes, const Nf4TableAvx2& t) {
  const __m256i idx = nf4_lane_codes_avx2(bytes);
  const __m256 top = _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28));
  return _mm256_blendv_ps(_mm256_permutevar8x32_ps(t.lo, idx), _mm256_permutevar8x32_ps(t.hi, idx),
                          top);
}

/// Decodes `nbytes` packed bytes (a multiple of 8) through `t` into 2*nbytes floats.
template <bool Stream>
inline void nf4_decode_f32_avx2(const uint8_t* bytes, int64_t nbytes, const Nf4TableAvx2& t,
                                float* out) {
  for (int64_t j = 0; j < nbytes; j += 4) {
    const __m256 v = nf4_decode8_avx2(bytes + j, t);
    if (Stream) {
      _mm256_stream_ps(out + 2 * j, v);
    } else {
      _mm256_storeu_ps(out + 2 * j, v);
    }
  }
}

/// As above, into bfloat16 (the table holds bfloat16 values: the top half of each lane).
template <bool Stream>
inline void nf4_decode_bf16_avx2(const uint8_t* bytes, int64_t nbytes, const Nf4TableAvx2& t,
                                 uint16_t* out) {
  for (int64_t j = 0; j < nbytes; j += 8) {
    const __m256i a = _mm256_srli_epi32(_mm256_castps_si256(nf4_decode8_avx2(bytes + j, t)), 16);
    const __m256i b =
        _mm256_srli_epi32(_mm256_castps_si256(nf4_decode8_avx2(bytes + j + 4, t)), 16);
    // packus interleaves the 128-bit halves: a0-3 b0-3 a4-7 b4-7 -> a0-7 b0-7.
    const __m256i h = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xd8);
    if (Stream) {
      _mm256_stream_si256(reinterpret_cast<__m256i*>(out + 2 * j), h);
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2 * j), h);
    }
  }
}

/// Rounds float lanes to bfloat16 values (nearest even), as kqlora::round_to_bf16 does for
/// finite values.
inline __m256 nf4_round_bf16_avx2(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i r = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb);
  return _mm256_castsi256_ps(_mm256_and_si256(r, _mm256_set1_epi32(int(0xffff0000u))));
}

#endif  // KQLORA_HAVE_AVX2

#if KQLORA_HAVE_AVX512 || KQLORA_HAVE_AVX2
#define KQLORA_HAVE_HOST_SIMD_DECODE 1

/// The codebook as the widest ISA's decoder holds it.
#if KQLORA_HAVE_AVX512
using Nf4SimdCodebook = __m512;
inline Nf4SimdCodebook nf4_simd_codebook(const float* v) {
  return _mm512_loadu_ps(v);
}
#else
using Nf4SimdCodebook = Nf4TableAvx2;
inline Nf4SimdCodebook nf4_simd_codebook(const float* v) {
  return {_mm256_loadu_ps(v), _mm256_loadu_ps(v + 8)};
}
#endif

/// Decodes one block of 2*half values (half a multiple of 8) with scale s: the 16-entry
/// table is nf4_decode of every code (rounded to bfloat16 when RoundBf16), then looked up.
template <bool RoundBf16, bool Bf16Out, bool Stream>
inline void nf4_decode_block_simd(const Nf4SimdCodebook& cb, float s, const uint8_t* bytes,
                                  int64_t half, void* out) {
#if KQLORA_HAVE_AVX512
  __m512 table = _mm512_mul_ps(cb, _mm512_set1_ps(s));
  if (RoundBf16) table = nf4_round_bf16(table);
  if (Bf16Out) {
    nf4_decode_bf16_avx512<Stream>(bytes, half, table, static_cast<uint16_t*>(out));
  } else {
    nf4_decode_f32_avx512<Stream>(bytes, half, table, static_cast<float*>(out));
  }
#else
  const __m256 vs = _mm256_set1_ps(s);
  Nf4TableAvx2 table{_mm256_mul_ps(cb.lo, vs), _mm256_mul_ps(cb.hi, vs)};
  if (RoundBf16) table = {nf4_round_bf16_avx2(table.lo), nf4_round_bf16_avx2(table.hi)};
  if (Bf16Out) {
    nf4_decode_bf16_avx2<Stream>(bytes, half, table, static_cast<uint16_t*>(out));
  } else {
    nf4_decode_f32_avx2<Stream>(bytes, half, table, static_cast<float*>(out));
  }
#endif
}

inline void stream_fence() {
  _mm_sfence();
}
#else
#define KQLORA_HAVE_HOST_SIMD_DECODE 0
#endif

}  // namespace kqlora::impl
