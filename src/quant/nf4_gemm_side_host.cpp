// The fused NF4 GEMM's side products on a packed block of A (AVX-512): a LoRA adapter's
// thin products (rank 8 or so) computed where the fused kernel has A's block in cache. On
// their own, through the host GEMM engine, they ran at a third of the FMA peak (oneDNN 2.6:
// 65 GFLOP/s for [1024, 576] x [576, 8] with A in cache) and read A from memory once more
// each (docs/BENCHMARKS.md, "Speed (issue 25, continued), 2026-12-05, sixth session").
//
// Both read the packed block, as the strips will next (A's own rows, read again, pushed it
// out of L2). right = alpha A V: 48 rows (six micro-panels, two to a vector) by 8 columns
// of V in 24 accumulators, 8 broadcasts and 3 vectors of A a step. left = alpha H^T A: 4 of
// A's columns (two to a vector, with a panel's 8 rows across the lanes) by 8 columns of H in
// 16 accumulators, a panel a step, the rows folded at the end.

#include "nf4_gemm_side_host.hpp"

#include <algorithm>

#include "kqlora/core/error.hpp"
#include "nf4_host_simd_intrinsics.hpp"

namespace kqlora::impl {

#if KQLORA_HAVE_AVX512

namespace {

constexpr int kJ = 8;          // columns of V (rows of left) per pass
constexpr int kPanel = 8;      // rows of a packed micro-panel
constexpr int kTile = 6;       // micro-panels per right tile (48 rows)
constexpr int kLeftPairs = 2;  // vectors (pairs of summed indices) per left tile

/// R[i][j] (+)= alpha sum_kk P(i, kk) vt[kk][j] for the block's first `valid` rows and
/// j < jn; P the packed panels ([panels][kc][8]), vt [kc][8] (zero past jn).
void right_block(const float* packed, int64_t kc, int64_t panels, int64_t valid, const float* vt,
                 int jn, float alpha, bool add, float* R, int64_t ldr) {
  for (int64_t p0 = 0; p0 < panels && p0 * kPanel < valid; p0 += kTile) {
    // A tile past the last panel reads the last one again; those rows are not stored.
    const float* pp[kTile];
    for (int q = 0; q < kTile; ++q) pp[q] = packed + std::min(p0 + q, panels - 1) * kc * kPanel;
    __m512 acc[kTile / 2][kJ];
    for (auto& a : acc)
      for (auto& x : a) x = _mm512_setzero_ps();
    for (int64_t kk = 0; kk < kc; ++kk) {
      __m512 x[kTile / 2];
      for (int v = 0; v < kTile / 2; ++v)
        x[v] = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(pp[2 * v] + kk * kPanel)),
                                  _mm256_loadu_ps(pp[2 * v + 1] + kk * kPanel), 1);
      for (int j = 0; j < kJ; ++j) {
        const __m512 w = _mm512_set1_ps(vt[kk * kJ + j]);
        for (int v = 0; v < kTile / 2; ++v) acc[v][j] = _mm512_fmadd_ps(x[v], w, acc[v][j]);
      }
    }
    alignas(64) float t[kTile / 2][kJ][16];
    for (int v = 0; v < kTile / 2; ++v)
      for (int j = 0; j < kJ; ++j) _mm512_store_ps(t[v][j], acc[v][j]);
    // Lane l of vector v is row 16 v + l of the tile (two panels of 8 rows).
    const int64_t rows = std::min<int64_t>(kTile * kPanel, valid - p0 * kPanel);
    for (int64_t i = 0; i < rows; ++i) {
      float* r = R + (p0 * kPanel + i) * ldr;
      for (int j = 0; j < jn; ++j) {
        const float y = alpha * t[i / 16][j][i % 16];
        r[j] = add ? r[j] + y : y;
      }
    }
  }
}

/// The sum of a vector of 8.
inline float sum8(__m256 v) {
  __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  a = _mm_add_ps(a, _mm_movehl_ps(a, a));
  return _mm_cvtss_f32(_mm_add_ss(a, _mm_movehdup_ps(a)));
}

/// L[j][kk] (+)= alpha sum_i H[i][j0 + j] P(i, kk) for j < jn, kk < kc, from the packed
/// panels ([panels][kc][8]; rows from `valid` on zero in P and not read in H): their lines
/// are in cache from the right product, where a pass over A's own rows pushed the packed
/// block out of L2 before the strips read it. A vector holds two of P's summed indices for
/// a panel's 8 rows; the 8 rows' sums are folded once per tile of kLeftPairs pairs.
void left_block(const float* packed, int64_t kc, int64_t panels, int64_t valid, const float* H,
                int64_t ldh, int64_t j0, int jn, float alpha, bool add, float* L, int64_t ldl) {
  // hv[p][j]: H's column j0 + j over panel p's 8 rows, twice (the two indices of a vector);
  // zero past jn and past the valid rows.
  alignas(64) float hv[kSideMaxRows / kPanel * kJ * 16];
  for (int64_t p = 0; p < panels; ++p)
    for (int j = 0; j < kJ; ++j)
      for (int l = 0; l < 16; ++l) {
        const int64_t i = p * kPanel + l % 8;
        hv[(p * kJ + j) * 16 + l] = j < jn && i < valid ? H[i * ldh + j0 + j] : 0.0f;
      }
  auto store = [&](int j, int64_t kk, float sum) {
    float* l = L + j * ldl + kk;
    *l = add ? *l + alpha * sum : alpha * sum;
  };
  int64_t kk0 = 0;
  for (; kk0 + 2 * kLeftPairs <= kc; kk0 += 2 * kLeftPairs) {
    __m512 acc[kJ][kLeftPairs];
    for (auto& a : acc)
      for (auto& x : a) x = _mm512_setzero_ps();
    for (int64_t p = 0; p < panels; ++p) {
      const float* pp = packed + p * kc * kPanel + kk0 * kPanel;
      __m512 z[kLeftPairs];
      for (int v = 0; v < kLeftPairs; ++v) z[v] = _mm512_loadu_ps(pp + 16 * v);
      for (int j = 0; j < kJ; ++j) {
        const __m512 h = _mm512_load_ps(hv + (p * kJ + j) * 16);
        for (int v = 0; v < kLeftPairs; ++v) acc[j][v] = _mm512_fmadd_ps(z[v], h, acc[j][v]);
      }
    }
    for (int j = 0; j < jn; ++j) {
      for (int v = 0; v < kLeftPairs; ++v) {
        store(j, kk0 + 2 * v, sum8(_mm512_castps512_ps256(acc[j][v])));
        store(j, kk0 + 2 * v + 1, sum8(_mm512_extractf32x8_ps(acc[j][v], 1)));
      }
    }
  }
  for (int64_t kk = kk0; kk < kc; ++kk) {  // (a summed index not a multiple of 4: the tail)
    for (int j = 0; j < jn; ++j) {
      float sum = 0.0f;
      for (int64_t p = 0; p < panels; ++p)
        for (int i = 0; i < kPanel; ++i)
          sum += hv[(p * kJ + j) * 16 + i] * packed[(p * kc + kk) * kPanel + i];
      store(j, kk, sum);
    }
  }
}

}  // namespace

void nf4_gemm_side_block(const Nf4GemmSideProducts& s, int64_t rows, int64_t r0, int64_t mc_padded,
                         int64_t k0, int64_t kc, const float* packed) {
  const int64_t valid = std::min(mc_padded, rows - r0);
  KQLORA_CHECK(valid <= kSideMaxRows && kc <= kSideMaxKc && mc_padded % kPanel == 0,
               "nf4_gemm_side_block: block " << mc_padded << " x " << kc);
  const int64_t panels = (valid + kPanel - 1) / kPanel;
  for (int64_t j0 = 0; j0 < s.rank; j0 += kJ) {
    const int jn = static_cast<int>(std::min<int64_t>(kJ, s.rank - j0));
    if (s.right != nullptr) {
      alignas(64) float vt[kSideMaxKc * kJ];
      for (int64_t kk = 0; kk < kc; ++kk)
        for (int j = 0; j < kJ; ++j)
          vt[kk * kJ + j] = j < jn ? s.v[(k0 + kk) * s.v_stride_k + (j0 + j) * s.v_stride_j] : 0.0f;
      right_block(packed, kc, panels, valid, vt, jn, s.right_alpha, k0 > 0,
                  s.right + r0 * s.ldr + j0, s.ldr);
    }
    if (s.left != nullptr)
      left_block(packed, kc, panels, valid, s.h + r0 * s.ldh, s.ldh, j0, jn, s.left_alpha,
                 r0 > 0 || s.left_accumulate, s.left + j0 * s.ldl + k0, s.ldl);
  }
}

#else  // the fused kernel, and so its side products, need AVX-512

void nf4_gemm_side_block(const Nf4GemmSideProducts&, int64_t, int64_t, int64_t, int64_t, int64_t,
                         const float*) {
  KQLORA_CHECK(false, "nf4_gemm_side_block: not in this build");
}

#endif

}  // namespace kqlora::impl
