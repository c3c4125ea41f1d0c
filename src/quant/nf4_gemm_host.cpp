// The fused NF4 GEMM on the host (AVX-512), compiled inside the library like the other
// NF4 SIMD bodies (nf4_host_simd.cpp): C = A op(W) + beta C.
//
// Blocking as in BLIS/GotoBLAS, with W as the "B" operand: for each block of kc (the
// summed index) and mc rows of A, A's block is packed once into mr-row micro-panels (L2);
// for each 48-column strip of op(W), its kc x 48 micro-panel is decoded from the NF4 bytes
// onto the stack (96 - 120 KiB at kc 512 - 640: L1 and L2) and multiplied with every
// micro-panel of A by an 8 x 48 register tile (24 accumulators; 8 broadcasts and 3 loads a
// step, and 8 rows and 48 columns divide the usual 256-token calls and 192-, 576- and
// 1536-wide weights exactly, where 14 x 32 padded 256 rows to 266). The strips are
// independent: they are the Kokkos work items. The block sizes were chosen by measurement
// (docs/BENCHMARKS.md, "The fused NF4 GEMM").
//
// Decoding a strip: the input gradient's op(W) = W rows are contiguous in W, one block
// table lookup per 16 values (as nf4_decode_block_simd). The forward's op(W) = W^T needs
// W's columns across the lanes: one 32-bit gather per 16 rows reads 8 codes of each row,
// and each lane multiplies its code's value by its own row's block scale.

#include "kqlora/quant/nf4_gemm.hpp"

#include <algorithm>

#include "kqlora/core/bfloat16.hpp"
#include "kqlora/core/error.hpp"
#include "kqlora/quant/nf4_codebook.hpp"
#include "nf4_gemm_side_host.hpp"
#include "nf4_host_simd_intrinsics.hpp"

namespace kqlora::impl {

#if KQLORA_HAVE_AVX512

namespace {

using Host = Kokkos::DefaultHostExecutionSpace;

constexpr int kMr = 8;           // rows of the register tile (A, broadcast)
constexpr int kNv = 3;           // vectors of 16 columns in the register tile (op(W))
constexpr int kNr = 16 * kNv;    // columns of the register tile
constexpr int64_t kKc = 512;     // the summed index per block (C is rewritten k / kc times)
constexpr int64_t kKcMax = 640;  // a summed index up to this is one block (576: not 512 + 64)
constexpr int64_t kMc = (int64_t(1) << 20) / (4 * kKc) / kMr * kMr;  // a 1 MiB packed A block
static_assert(2 * kMr * sizeof(float) == 64, "micro_kernel fetches A_p a line per two steps");
static_assert(kKcMax <= kSideMaxKc && kMc <= kSideMaxRows && kMr == 8, "side products' blocks");

/// What the register tile does with C's tile.
enum class Update { assign, scale_add, add };

/// An added term of rank `rank` (`e` non-null): acc[i] += sum_j e[i][j] ut[j] before the
/// update, e[i] the term's row i (rows past `rows`: any row), ut [rank][kNr].
struct AddedTerm {
  const float* const* e;
  const float* ut;
  int64_t rank;
};

/// C[rows, kNr] (op) = A_p[kc, kMr] B_p[kc, kNr]; A_p and B_p packed, zero-padded. The
/// next tile's C rows (`c_next`, null if none) are fetched during the first steps: C
/// is read again once per block of kc, from beyond L2 at a few hundred tokens, each row a
/// page of its own, and the fetches overlap the products. The next tile's A micro-panel
/// (`a_next`, null if none) is fetched into L1 a line every two steps: the hardware's
/// prefetchers leave it in L2. With kAdded, `added`'s term too.
template <bool kAdded>  // (a compile-time choice: a run-time one slowed the step 2-4%)
inline void micro_kernel(int64_t kc, const float* __restrict ap, const float* __restrict bp,
                         float* c, int64_t ldc, int rows, const __mmask16* m, Update u, float beta,
                         const float* c_next, const float* a_next, const AddedTerm* added) {
  __m512 acc[kMr][kNv];
  for (int i = 0; i < kMr; ++i)
    for (int v = 0; v < kNv; ++v) acc[i][v] = _mm512_setzero_ps();
  auto step = [&](int64_t k) {
    __m512 b[kNv];
    for (int v = 0; v < kNv; ++v) b[v] = _mm512_load_ps(bp + kNr * k + 16 * v);
    for (int i = 0; i < kMr; ++i) {
      const __m512 a = _mm512_set1_ps(ap[kMr * k + i]);
      for (int v = 0; v < kNv; ++v) acc[i][v] = _mm512_fmadd_ps(a, b[v], acc[i][v]);
    }
  };
  int64_t k = 0;
  if (c_next != nullptr) {
    // One line a step: a burst of all of them would fill the core's miss buffers.
    for (; k < kNv * kMr && k < kc; ++k) {
      _mm_prefetch(reinterpret_cast<const char*>(c_next + (k / kNv) * ldc + (k % kNv) * 16),
                   _MM_HINT_T0);
      step(k);
    }
  }
  if (a_next != nullptr) {  // (a 64-byte line of A_p holds two steps: kMr is 8)
    for (; k + 2 <= kc; k += 2) {
      _mm_prefetch(reinterpret_cast<const char*>(a_next + kMr * k), _MM_HINT_T0);
      step(k);
      step(k + 1);
    }
  }
  for (; k < kc; ++k) step(k);
  if constexpr (kAdded) {
    // The term summed on its own, then added: one rounding at C's magnitude, as a BLAS's
    // C + (E U) has. Added into acc term by term, the Mistral reference case's 5 AdamW
    // steps (tests/test_llama.cpp) ended 3.7x further from PEFT's adapters, past the
    // test's tolerance: AdamW magnifies gradients near its eps.
    for (int i = 0; i < kMr; ++i) {
      __m512 t[kNv];
      for (int v = 0; v < kNv; ++v) t[v] = _mm512_setzero_ps();
      for (int64_t j = 0; j < added->rank; ++j) {
        const __m512 a = _mm512_set1_ps(added->e[i][j]);
        for (int v = 0; v < kNv; ++v)
          t[v] = _mm512_fmadd_ps(a, _mm512_load_ps(added->ut + kNr * j + 16 * v), t[v]);
      }
      for (int v = 0; v < kNv; ++v) acc[i][v] = _mm512_add_ps(acc[i][v], t[v]);
    }
  }
  const __m512 vb = _mm512_set1_ps(beta);
  for (int i = 0; i < kMr; ++i) {
    if (i >= rows) break;
    float* ci = c + i * ldc;
    for (int v = 0; v < kNv; ++v) {
      if (u == Update::add) {
        acc[i][v] = _mm512_add_ps(acc[i][v], _mm512_maskz_loadu_ps(m[v], ci + 16 * v));
      } else if (u == Update::scale_add) {
        acc[i][v] = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m[v], ci + 16 * v), acc[i][v]);
      }
      _mm512_mask_storeu_ps(ci + 16 * v, m[v], acc[i][v]);
    }
  }
}

/// Transposes 8 rows x 8 columns (rows r[0..7], each 8 floats from its column k) into
/// out[8 * j + i] = r[i][j]: the classic unpack / shuffle / lane-permute sequence.
inline void transpose_8x8(const float* const r[kMr], int64_t k, float* out) {
  static_assert(kMr == 8, "the packing transposes 8 x 8 blocks");
  __m256 x[kMr], t[kMr];
  for (int i = 0; i < kMr; ++i) x[i] = _mm256_loadu_ps(r[i] + k);
  for (int i = 0; i < kMr; i += 2) {
    t[i] = _mm256_unpacklo_ps(x[i], x[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(x[i], x[i + 1]);
  }
  for (int i = 0; i < kMr; i += 4) {
    x[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    x[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    x[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    x[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int j = 0; j < 4; ++j) {
    _mm256_storeu_ps(out + kMr * j, _mm256_permute2f128_ps(x[j], x[j + 4], 0x20));
    _mm256_storeu_ps(out + kMr * (j + 4), _mm256_permute2f128_ps(x[j], x[j + 4], 0x31));
  }
}

/// Packs A[r0 .. r0+mc, k0 .. k0+kc] into micro-panels of kMr rows, [kc][kMr] each, the
/// rows past `rows` zero. Whole panels by 8 x 8 transposes (element by element, the
/// packing took 3% of a 256-token training step).
void pack_a(const float* A, int64_t lda, int64_t rows, int64_t r0, int64_t mc, int64_t k0,
            int64_t kc, float* out) {
  for (int64_t p = 0; p < mc; p += kMr) {
    float* panel = out + p * kc;
    int64_t k = 0;
    if (r0 + p + kMr <= rows) {
      const float* r[kMr];
      for (int i = 0; i < kMr; ++i) r[i] = A + (r0 + p + i) * lda + k0;
      for (; k + kMr <= kc; k += kMr) transpose_8x8(r, k, panel + k * kMr);
    }
    for (int i = 0; i < kMr; ++i) {
      const int64_t row = r0 + p + i;
      if (row < rows) {
        const float* src = A + row * lda + k0;
        for (int64_t kk = k; kk < kc; ++kk) panel[kk * kMr + i] = src[kk];
      } else {
        for (int64_t kk = k; kk < kc; ++kk) panel[kk * kMr + i] = 0.0f;
      }
    }
  }
}

/// The NF4 tensor's parts a decoder reads, and its codebook in the tensor's dtype.
struct Nf4Parts {
  const uint8_t* data;
  const int8_t* scalers;
  const float* factor;
  float mean;
  int64_t block_size, scaler_block_size, out, in;
  bool bf16;
  __m512 codebook;

  /// nf4_block_scale of the blocks holding column `col` of rows row0 .. row0 + 15 (lanes
  /// from `valid` on: 0). `in` is a multiple of block_size: row r's blocks start at
  /// r * in / block_size. The scaler block (a division) is stepped, not divided, per row.
  __m512 row_scales(int64_t row0, int64_t col, int valid) const {
    alignas(64) int32_t q[16];
    alignas(64) float f[16];
    const int64_t per_row = in / block_size;
    const int64_t step_q = per_row / scaler_block_size, step_r = per_row % scaler_block_size;
    const int64_t b0 = row0 * per_row + col / block_size;
    int64_t g = b0 / scaler_block_size, r = b0 % scaler_block_size;
    for (int j = 0; j < 16; ++j) {
      q[j] = j < valid ? scalers[b0 + j * per_row] : 0;
      f[j] = j < valid ? factor[g] : 1.0f;
      g += step_q;
      r += step_r;
      if (r >= scaler_block_size) {
        r -= scaler_block_size;
        ++g;
      }
    }
    // nf4_block_scale for 16 lanes: the same operations, rounded alike.
    __m512 v = _mm512_div_ps(_mm512_cvtepi32_ps(_mm512_load_si512(q)), _mm512_load_ps(f));
    if (bf16) v = nf4_round_bf16(v);
    v = _mm512_add_ps(v, _mm512_set1_ps(mean));
    if (bf16) v = nf4_round_bf16(v);
    return _mm512_maskz_mov_ps(static_cast<__mmask16>((1u << valid) - 1u), v);
  }
  /// nf4_decode of codes (low 4 bits of each lane) with per-lane scales.
  __m512 values(__m512i codes, __m512 scales) const {
    const __m512 v = _mm512_mul_ps(_mm512_permutexvar_ps(codes, codebook), scales);
    return bf16 ? nf4_round_bf16(v) : v;
  }
};

/// Input gradient strip: bp[kk][j] = W[k0 + kk][n0 + j] for kk < kc, j < kNr (0 past in).
void decode_rows(const Nf4Parts& w, int64_t k0, int64_t kc, int64_t n0, float* bp) {
  alignas(64) float scale[kNv][kKcMax];  // per 16 columns: the scale of each row's block
  // in is a multiple of 16: each group of 16 columns is all in or all out.
  const int groups = static_cast<int>(std::min<int64_t>(kNv, (w.in - n0) / 16));
  for (int h = 0; h < groups; ++h) {
    const bool shared = h > 0 && (n0 + 16 * h) / w.block_size == (n0 + 16 * (h - 1)) / w.block_size;
    for (int64_t kk = 0; kk < kc; kk += 16) {
      const int valid = static_cast<int>(std::min<int64_t>(16, kc - kk));
      if (shared) {
        _mm512_store_ps(scale[h] + kk, _mm512_load_ps(scale[h - 1] + kk));
      } else {
        _mm512_store_ps(scale[h] + kk, w.row_scales(k0 + kk, n0 + 16 * h, valid));
      }
    }
  }
  for (int64_t kk = 0; kk < kc; ++kk) {
    const uint8_t* row = w.data + ((k0 + kk) * w.in + n0) / 2;
    for (int h = 0; h < kNv; ++h) {
      const __m512 v = h < groups
                           ? w.values(nf4_lane_codes(row + 8 * h), _mm512_set1_ps(scale[h][kk]))
                           : _mm512_setzero_ps();
      _mm512_store_ps(bp + kNr * kk + 16 * h, v);
    }
  }
}

/// Forward strip: bp[kk][j] = W[n0 + j][k0 + kk] for kk < kc, j < kNr (0 past out). k0 and
/// kc are multiples of block_size, so each lane's scale changes at block boundaries only.
void decode_columns(const Nf4Parts& w, int64_t k0, int64_t kc, int64_t n0, float* bp) {
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int h = 0; h < kNv; ++h) {
    const int64_t r0 = n0 + 16 * h;
    const int valid = static_cast<int>(std::clamp<int64_t>(w.out - r0, 0, 16));
    const __mmask16 live = static_cast<__mmask16>((1u << valid) - 1u);
    // Byte offset of each lane's row, relative to row r0 (in / 2 bytes a row; 16 rows
    // stay within int32: nf4_gemm_host_supports).
    const __m512i row_bytes = _mm512_mullo_epi32(lane, _mm512_set1_epi32(int(w.in / 2)));
    const uint8_t* base = w.data + r0 * (w.in / 2);
    for (int64_t kb = 0; kb < kc; kb += w.block_size) {
      const __m512 s = valid > 0 ? w.row_scales(r0, k0 + kb, valid) : _mm512_setzero_ps();
      for (int64_t kk = kb; kk < kb + w.block_size; kk += 8) {
        // 8 codes of each row: bytes (k0 + kk) / 2 .. + 3, element 2e in byte e's high
        // nibble: element e sits at bit 8 (e / 2) + 4 (1 - e % 2) of the 32-bit word.
        const __m512i word = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, row_bytes,
                                                         base + (k0 + kk) / 2, 1);
        float* dst = bp + kNr * kk + 16 * h;
        _mm512_store_ps(dst + 0 * kNr, w.values(_mm512_srli_epi32(word, 4), s));
        _mm512_store_ps(dst + 1 * kNr, w.values(word, s));
        _mm512_store_ps(dst + 2 * kNr, w.values(_mm512_srli_epi32(word, 12), s));
        _mm512_store_ps(dst + 3 * kNr, w.values(_mm512_srli_epi32(word, 8), s));
        _mm512_store_ps(dst + 4 * kNr, w.values(_mm512_srli_epi32(word, 20), s));
        _mm512_store_ps(dst + 5 * kNr, w.values(_mm512_srli_epi32(word, 16), s));
        _mm512_store_ps(dst + 6 * kNr, w.values(_mm512_srli_epi32(word, 28), s));
        _mm512_store_ps(dst + 7 * kNr, w.values(_mm512_srli_epi32(word, 24), s));
      }
    }
  }
}

/// One block of kc and mc: every kNr-column strip of op(W) against the packed A block.
struct Nf4GemmStrips {
  Nf4Parts w;
  bool forward;
  const float* ap;
  int64_t k0, kc, r0, mc, rows, n;
  float* C;
  int64_t ldc;
  Update update;
  float beta;
  const Nf4GemmSideProducts* added;  // its term C += right U (the last block of k), or null

  void operator()(int64_t strip) const {
    alignas(64) float bp[kKcMax * kNr];
    const int64_t n0 = strip * kNr;
    if (forward) {
      decode_columns(w, k0, kc, n0, bp);
    } else {
      decode_rows(w, k0, kc, n0, bp);
    }
    const int cols = static_cast<int>(std::min<int64_t>(kNr, n - n0));
    alignas(64) float ut[kNf4GemmMaxAddedRank * kNr];
    if (added != nullptr) {  // u_alpha U's columns n0 .. n0 + kNr (zero past n)
      const Nf4GemmSideProducts& s = *added;
      for (int64_t j = 0; j < s.rank; ++j)
        for (int q = 0; q < kNr; ++q)
          ut[j * kNr + q] =
              q < cols ? s.u_alpha * s.u[j * s.u_stride_j + (n0 + q) * s.u_stride_n] : 0.0f;
    }
    __mmask16 m[kNv];
    for (int v = 0; v < kNv; ++v) {
      const int live = std::clamp(cols - 16 * v, 0, 16);
      m[v] = static_cast<__mmask16>(live == 16 ? 0xffffu : (1u << live) - 1u);
    }
    // Rows of C past `rows` are never touched; the prefetch stops a tile short of them.
    const bool fetch = update != Update::assign;
    for (int64_t p = 0; p < mc; p += kMr) {
      const int r = static_cast<int>(std::min<int64_t>(kMr, rows - (r0 + p)));
      if (r <= 0) break;
      float* c = C + (r0 + p) * ldc + n0;
      const bool next_full = fetch && p + kMr < mc && r0 + p + 2 * kMr <= rows;
      const bool next_panel = p + kMr < mc && r0 + p + kMr < rows;
      const float* e[kMr];
      AddedTerm term{e, ut, added != nullptr ? added->rank : 0};
      if (added != nullptr)
        for (int i = 0; i < kMr; ++i) e[i] = added->right + (r0 + p + (i < r ? i : 0)) * added->ldr;
      const float* c_next = next_full ? c + kMr * ldc : nullptr;
      const float* a_next = next_panel ? ap + (p + kMr) * kc : nullptr;
      if (added != nullptr) {
        micro_kernel<true>(kc, ap + p * kc, bp, c, ldc, r, m, update, beta, c_next, a_next, &term);
      } else {
        micro_kernel<false>(kc, ap + p * kc, bp, c, ldc, r, m, update, beta, c_next, a_next,
                            nullptr);
      }
    }
  }
};

}  // namespace

bool nf4_gemm_host_supports(const Nf4Layout& L) {
  const int64_t bs = L.block_size;
  return L.shape.size() == 2 && bs % 16 == 0 && kKc % bs == 0 && L.shape[1] % bs == 0 &&
         L.shape[0] > 0 && L.shape[1] > 0 && L.shape[1] / 2 * 16 <= INT32_MAX;
}

void nf4_gemm_host(const Host& exec, const Nf4Tensor<Kokkos::HostSpace>& W, Nf4GemmOp op,
                   int64_t rows, const float* A, int64_t lda, float beta, float* C, int64_t ldc,
                   Kokkos::View<float*, Kokkos::HostSpace>& scratch,
                   const std::function<void()>& between, const Nf4GemmSideProducts* side) {
  const Nf4Layout& L = W.layout;
  KQLORA_CHECK(nf4_gemm_host_supports(L), "nf4_gemm_host: layout " << L.shape_string());
  const bool forward = op == Nf4GemmOp::forward;
  const int64_t out = L.shape[0], in = L.shape[1];
  const int64_t k = forward ? in : out, n = forward ? out : in;
  if (rows == 0) return;
  KQLORA_CHECK(
      side == nullptr || side->u == nullptr ||
          (side->right != nullptr && side->rank <= kNf4GemmMaxAddedRank),
      "nf4_gemm_host: an added term needs the right product, rank <= " << kNf4GemmMaxAddedRank);
  const int64_t mc_max = std::min<int64_t>(kMc, (rows + kMr - 1) / kMr * kMr);
  const int64_t kc_block = k <= kKcMax ? k : kKc;
  if (static_cast<int64_t>(scratch.extent(0)) < mc_max * kc_block) {
    scratch = Kokkos::View<float*, Kokkos::HostSpace>();
    scratch = Kokkos::View<float*, Kokkos::HostSpace>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "kqlora::LinearNf4::panel"),
        mc_max * kc_block);
  }
  Nf4Parts w{W.quantized_data.data(),
             W.quantized_scalers.data(),
             W.quantization_factor.data(),
             W.scaler_mean,
             L.block_size,
             L.scaler_block_size,
             out,
             in,
             L.dtype == DType::bfloat16,
             _mm512_setzero_ps()};
  w.codebook =
      _mm512_loadu_ps(w.bf16 ? Nf4Codebook::make<bfloat16>().v : Nf4Codebook::make<float>().v);
  const int64_t strips = (n + kNr - 1) / kNr;
  for (int64_t k0 = 0; k0 < k; k0 += kc_block) {
    const int64_t kc = std::min(kc_block, k - k0);
    const Update u = k0 > 0 ? Update::add : (beta == 0.0f ? Update::assign : Update::scale_add);
    for (int64_t r0 = 0; r0 < rows; r0 += kMc) {
      const int64_t mc = std::min(kMc, rows - r0);
      const int64_t mc_padded = (mc + kMr - 1) / kMr * kMr;
      pack_a(A, lda, rows, r0, mc_padded, k0, kc, scratch.data());
      if (side != nullptr) nf4_gemm_side_block(*side, rows, r0, mc_padded, k0, kc, scratch.data());
      // (right is complete for these rows once the last block of k is packed)
      const bool add_term = side != nullptr && side->u != nullptr && k0 + kc == k;
      Kokkos::parallel_for(
          forward ? "kqlora::LinearNf4::fused_forward" : "kqlora::LinearNf4::fused_backward",
          Kokkos::RangePolicy<Host, Kokkos::IndexType<int64_t>>(exec, 0, strips),
          Nf4GemmStrips{w, forward, scratch.data(), k0, kc, r0, mc_padded, rows, n, C, ldc, u, beta,
                        add_term ? side : nullptr});
      exec.fence();
    }
    if (between) between();
  }
}

#else  // no AVX-512 in this build: the panel path of nn/linear_nf4.hpp does the products

bool nf4_gemm_host_supports(const Nf4Layout&) {
  return false;
}

void nf4_gemm_host(const Kokkos::DefaultHostExecutionSpace&, const Nf4Tensor<Kokkos::HostSpace>&,
                   Nf4GemmOp, int64_t, const float*, int64_t, float, float*, int64_t,
                   Kokkos::View<float*, Kokkos::HostSpace>&, const std::function<void()>&,
                   const Nf4GemmSideProducts*) {
  KQLORA_CHECK(false, "nf4_gemm_host: not in this build");
}

#endif

}  // namespace kqlora::impl
