#pragma once
// Host SIMD paths of the NF4 kernels (x86-64 with AVX-512 F+BW). They run inside the same
// Kokkos kernels as the portable paths, picked by Nf4HostSimd (nf4_kernels.hpp), and
// produce the same bits: the per-block table holds nf4_decode's values, and a 16-entry
// table lookup is one vpermps. Large outputs are written with streaming stores, which skip
// the read-for-ownership of every output cache line (half the memory traffic of a plain
// store loop).

#include <cstdint>

#if defined(__AVX512F__) && defined(__AVX512BW__) && !defined(__CUDA_ARCH__)
#define KQLORA_HAVE_AVX512 1
#include <immintrin.h>
#else
#define KQLORA_HAVE_AVX512 0
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

inline void stream_fence() { _mm_sfence(); }

#endif  // KQLORA_HAVE_AVX512

}  // namespace kqlora::impl
