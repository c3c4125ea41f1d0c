// The host's fused float32 attention (nn/attention_host.hpp), AVX-512 builds. Every
// product is C = alpha A B (+ C) through one 6 x 64 register tile (24 accumulators): A read
// by broadcast with any two strides (Q, dO, P, dS across; P^T, dS^T down), B in rows (K^T
// and V^T packed per sequence and kv head, V, K, dO and Q in place), C row-major.

#include "kqlora/nn/attention_host.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>

#include "kqlora/core/error.hpp"
#include "kqlora/nn/row_loops.hpp"

#if defined(__AVX512F__) && !defined(__CUDA_ARCH__)
#include <immintrin.h>
#define KQLORA_FUSED_ATTENTION 1
#else
#define KQLORA_FUSED_ATTENTION 0
#endif

namespace kqlora::impl {

namespace {

using Host = Kokkos::DefaultHostExecutionSpace;

/// Row stride of the packed and block buffers: whole vectors of 16 floats, and one more
/// so that the rows' lines spread over the L1 cache's sets (at S = 256 a stride of 1 KiB
/// put the 64 rows of K^T a tile reads into 16 of them).
int64_t padded(int64_t n) {
  return (n + 15) / 16 * 16 + 16;
}

}  // namespace

int64_t host_fused_attention_item_floats(int64_t S, int64_t head_dim, bool softcap) {
  // K^T and V^T [D, L], the probabilities and their gradient [64, L] (the soft-cap's tanh
  // too).
  const int64_t L = padded(S), rows = std::min(S, kAttentionRowBlock);
  return 2 * head_dim * L + (softcap ? 3 : 2) * rows * L;
}

int64_t host_fused_attention_concurrency() {
  return Kokkos::Experimental::UniqueToken<Host>().size();
}

#if KQLORA_FUSED_ATTENTION

bool host_fused_attention_built() {
  return true;
}

namespace {

// GCC's unroll pragma, which nvcc's front end does not know (a CUDA build's host code: no
// pragma, no warning).
#if defined(__NVCC__)
#define KQLORA_UNROLL(n)
#else
#define KQLORA_PRAGMA(x) _Pragma(#x)
#define KQLORA_UNROLL(n) KQLORA_PRAGMA(GCC unroll n)
#endif

constexpr int kMr = 6;  // rows of the register tile
constexpr int kNv = 4;  // its 16-float vectors of columns: 6 x 64, 24 accumulators

/// C = alpha A B (+ C): A(m, k) = a[m am + k ak], B(k, n) = b[k ldb + n], C(m, n) = c[m ldc + n].
struct Product {
  const float* a;
  int64_t am, ak;
  const float* b;
  int64_t ldb;
  float* c;
  int64_t ldc;
  float alpha;
  bool add;
};

/// What a tile of rows [m0, m1) computes: columns [n_begin, n_end), summed index [kb, ke).
struct TileRange {
  int64_t n_begin, n_end, kb, ke;
};

/// The MR x (NV vectors) tile at (m0, n0) over k in [kb, ke); `last`: the last vector's lanes.
template <int MR, int NV>
void tile(const Product& p, int64_t m0, int64_t n0, int64_t kb, int64_t ke, __mmask16 last) {
  // (the unroll pragmas keep acc in registers: without them GCC 12 stored every
  // accumulator to the stack at each step, at half the FMA rate)
  __m512 acc[MR][NV];
  KQLORA_UNROLL(8)
  for (int i = 0; i < MR; ++i) {
    KQLORA_UNROLL(4)
    for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_setzero_ps();
  }
  const float* a = p.a + m0 * p.am;
  for (int64_t k = kb; k < ke; ++k) {
    const float* bk = p.b + k * p.ldb + n0;
    __m512 b[NV];
    KQLORA_UNROLL(4)
    for (int v = 0; v < NV; ++v) {
      b[v] = v + 1 < NV ? _mm512_loadu_ps(bk + 16 * v) : _mm512_maskz_loadu_ps(last, bk + 16 * v);
    }
    const float* ak = a + k * p.ak;
    KQLORA_UNROLL(8)
    for (int i = 0; i < MR; ++i) {
      const __m512 x = _mm512_set1_ps(ak[i * p.am]);
      KQLORA_UNROLL(4)
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_fmadd_ps(x, b[v], acc[i][v]);
    }
  }
  const __m512 alpha = _mm512_set1_ps(p.alpha);
  KQLORA_UNROLL(8)
  for (int i = 0; i < MR; ++i) {
    float* c = p.c + (m0 + i) * p.ldc + n0;
    KQLORA_UNROLL(4)
    for (int v = 0; v < NV; ++v) {
      const __mmask16 lanes = v + 1 < NV ? __mmask16(0xffff) : last;
      __m512 r = _mm512_mul_ps(acc[i][v], alpha);
      if (p.add) r = _mm512_add_ps(r, _mm512_maskz_loadu_ps(lanes, c + 16 * v));
      _mm512_mask_storeu_ps(c + 16 * v, lanes, r);
    }
  }
}

using TileFn = void (*)(const Product&, int64_t, int64_t, int64_t, int64_t, __mmask16);
constexpr TileFn kTiles[kMr][kNv] = {{tile<1, 1>, tile<1, 2>, tile<1, 3>, tile<1, 4>},
                                     {tile<2, 1>, tile<2, 2>, tile<2, 3>, tile<2, 4>},
                                     {tile<3, 1>, tile<3, 2>, tile<3, 3>, tile<3, 4>},
                                     {tile<4, 1>, tile<4, 2>, tile<4, 3>, tile<4, 4>},
                                     {tile<5, 1>, tile<5, 2>, tile<5, 3>, tile<5, 4>},
                                     {tile<6, 1>, tile<6, 2>, tile<6, 3>, tile<6, 4>}};

/// The product over rows [0, M) and columns [0, N), each row tile limited by range(m0, m1).
template <class Range>
void product(const Product& p, int64_t M, int64_t N, Range range) {
  for (int64_t m0 = 0; m0 < M; m0 += kMr) {
    const int64_t mr = std::min<int64_t>(kMr, M - m0);
    const TileRange t = range(m0, m0 + mr);
    const int64_t n_end = std::min(N, t.n_end);
    for (int64_t n0 = t.n_begin; n0 < n_end; n0 += 16 * kNv) {
      const int64_t width = std::min<int64_t>(16 * kNv, n_end - n0), nv = (width + 15) / 16;
      const __mmask16 last = static_cast<__mmask16>((1u << (width - 16 * (nv - 1))) - 1u);
      kTiles[mr - 1][nv - 1](p, m0, n0, t.kb, t.ke, last);
    }
  }
}

/// exp(x) of 16 lanes, fast_exp's method (core/fast_exp.hpp) as vector instructions, so that
/// the softmax's exponentials and their sum are one pass (row_loops.hpp's row_exp, then a
/// row_sum, took the attention of the 135M step 10% longer: 299 - 335 ms against 270 -
/// 292 at 4 x 256, three alternating rounds). Its
/// arguments are scores minus their row's maximum or log-sum-exp, at most 0, so the clamp
/// is the lower one; NaN stays NaN (max_ps returns its second operand where either is NaN).
inline __m512 exp16(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.3365479f), shifter = _mm512_set1_ps(12582912.0f);
  const __mmask16 underflow = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
  const __m512 xc = _mm512_max_ps(lo, x);
  const __m512 n =
      _mm512_sub_ps(_mm512_fmadd_ps(xc, _mm512_set1_ps(1.44269504f), shifter), shifter);
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-0.693145752f), xc);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(-1.42860677e-06f), r);
  __m512 q = _mm512_set1_ps(1.98412698e-4f);
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(1.38888889e-3f));
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(8.33333333e-3f));
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(4.16666667e-2f));
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(1.66666667e-1f));
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(0.5f));
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(1.0f));
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(1.0f));
  // 2^n in two factors, as fast_exp (n reaches -126).
  const __m512i k = _mm512_cvtps_epi32(n), k1 = _mm512_srai_epi32(k, 1);
  const __m512i bias = _mm512_set1_epi32(127);
  const __m512 s1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(k1, bias), 23));
  const __m512 s2 =
      _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_sub_epi32(k, k1), bias), 23));
  return _mm512_maskz_mov_ps(static_cast<__mmask16>(~underflow),
                             _mm512_mul_ps(_mm512_mul_ps(q, s1), s2));
}

/// The lanes of a vector at j that lie before hi.
inline __mmask16 lanes_to(int64_t j, int64_t hi) {
  const int64_t n = std::min<int64_t>(16, hi - j);
  return static_cast<__mmask16>((1u << n) - 1u);
}

/// Over [lo, hi): x = exp(x - shift); returns their sum.
inline float exp_row(float* x, int64_t lo, int64_t hi, float shift) {
  const __m512 sv = _mm512_set1_ps(shift);
  __m512 total = _mm512_setzero_ps();
  for (int64_t j = lo; j < hi; j += 16) {
    const __mmask16 m = lanes_to(j, hi);
    const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + j), sv));
    _mm512_mask_storeu_ps(x + j, m, e);
    total = _mm512_add_ps(total, _mm512_maskz_mov_ps(m, e));
  }
  return _mm512_reduce_add_ps(total);
}

/// One sequence's and kv head's operands: the item's scratch and where its blocks are.
struct Item {
  const AttentionShape& a;
  int64_t s, g;
  float* scratch;
  int64_t L() const { return padded(a.S); }
  float* kt() const { return scratch; }
  float* vt() const { return scratch + a.head_dim * L(); }
  float* p() const { return scratch + 2 * a.head_dim * L(); }
  int64_t block_floats() const { return std::min(a.S, kAttentionRowBlock) * L(); }
  float* dp() const { return p() + block_floats(); }
  float* tanh_of() const { return dp() + block_floats(); }
  /// Row t of the sequence, head h's columns, of x.
  template <class X>
  auto at(X x, int64_t t, int64_t h) const {
    return x.data + (s * a.S + t) * x.ld + h * a.head_dim;
  }
};

/// out[d, j] = x(j, d) over the sequence's rows: kv head g's columns transposed.
void pack_transposed(const Item& it, HostHeads x, float* out) {
  const int64_t S = it.a.S, D = it.a.head_dim, L = it.L();
  for (int64_t j = 0; j < S; ++j) {
    const float* row = it.at(x, j, it.g);
    for (int64_t d = 0; d < D; ++d) out[d * L + j] = row[d];
  }
}

/// A 64-row block of query head h: rows [i0, i0 + rows), keys [j0, j0 + cols).
struct Block {
  int64_t h, i0, rows, j0, cols;
};

/// Scores of a block into it.p(): scale Q K^T (soft-capped where asked; the tanh kept when
/// `keep_tanh`), the row tile's keys from its first row's first visible key to its last
/// row's position.
void scores(const Item& it, const Block& b, HostHeads q, bool keep_tanh) {
  const AttentionShape& a = it.a;
  const int64_t L = it.L();
  product(Product{it.at(q, b.i0, b.h), q.ld, 1, it.kt() + b.j0, L, it.p(), L, a.scale(), false},
          b.rows, b.cols, [&](int64_t m0, int64_t m1) {
            return TileRange{a.first_key(it.s, b.i0 + m0) - b.j0, b.i0 + m1 - b.j0, 0, a.head_dim};
          });
  if (a.softcap <= 0) return;
  const float c = a.softcap;
  for (int64_t r = 0; r < b.rows; ++r) {
    const int64_t i = b.i0 + r, lo = a.first_key(it.s, i) - b.j0, hi = i - b.j0 + 1;
    float* x = it.p() + r * L;
    float* t = it.tanh_of() + r * L;
    for (int64_t j = lo; j < hi; ++j) {
      const float th = tanhf(x[j] / c);
      if (keep_tanh) t[j] = th;
      x[j] = th * c;
    }
  }
}

/// Rows' visible keys [lo, hi) of a block: the probabilities there, zeros elsewhere.
template <class F>
void for_each_row(const Item& it, const Block& b, F f) {
  for (int64_t r = 0; r < b.rows; ++r) {
    const int64_t i = b.i0 + r;
    f(r, i, it.a.first_key(it.s, i) - b.j0, i - b.j0 + 1);
  }
}

/// The summed keys of row tile [m0, m1) of P V or dS K.
TileRange keys_of_rows(const Item& it, const Block& b, int64_t m0, int64_t m1) {
  return TileRange{0, it.a.head_dim, it.a.first_key(it.s, b.i0 + m0) - b.j0,
                   std::min(b.cols, b.i0 + m1 - b.j0)};
}

/// The summed queries of key tile [m0, m1) of P^T dO or dS^T Q: from the first that sees
/// its first key to the last within the window of its last key.
TileRange queries_of_keys(const Item& it, const Block& b, int64_t m0, int64_t m1) {
  const int64_t kb = std::max<int64_t>(0, b.j0 + m0 - b.i0);
  const int64_t ke =
      it.a.window > 0 ? std::min(b.rows, b.j0 + m1 - 1 + it.a.window - b.i0) : b.rows;
  return TileRange{0, it.a.head_dim, kb, std::max(kb, ke)};
}

/// f(block) for the row blocks of query heads [h0, h1) (of the item's kv head).
template <class F>
void for_each_block(const Item& it, int64_t h0, int64_t h1, F f) {
  const AttentionShape& a = it.a;
  for (int64_t h = h0; h < h1; ++h)
    for (int64_t i0 = 0; i0 < a.S; i0 += kAttentionRowBlock) {
      const int64_t rows = std::min(kAttentionRowBlock, a.S - i0), j0 = a.first_key(it.s, i0);
      f(Block{h, i0, rows, j0, i0 + rows - j0});
    }
}

/// f(s, j, scratch) for every sequence s and j < per_sequence, the items spread over the
/// host's threads, each with its own scratch.
template <class F>
void for_each_item(const AttentionShape& a, int64_t per_sequence, float* scratch, F f) {
  const int64_t item_floats = host_fused_attention_item_floats(a.S, a.head_dim, a.softcap > 0);
  Kokkos::Experimental::UniqueToken<Host> token;
  Kokkos::parallel_for(
      "kqlora::attention::fused_host",
      Kokkos::RangePolicy<Host, Kokkos::IndexType<int64_t>>(0, a.sequences * per_sequence),
      [=](int64_t n) {
        const int id = token.acquire();
        f(n / per_sequence, n % per_sequence, scratch + id * item_floats);
        token.release(id);
      });
  Host().fence();
}

}  // namespace

void host_fused_attention_forward(const AttentionShape& a, HostHeads q, HostHeads k, HostHeads v,
                                  HostHeadsOut o, float* lse, const int32_t* docs, float* scratch) {
  AttentionShape shape = a;
  shape.host_doc_start = docs;
  // A query head an item (its kv head's K^T packed by each of its group): the forward
  // writes nothing two heads share, and more items keep more threads busy.
  for_each_item(shape, shape.heads, scratch, [=](int64_t s, int64_t h, float* mine) {
    const Item it{shape, s, h / (shape.heads / shape.kv_heads), mine};
    const int64_t L = it.L(), S = shape.S;
    pack_transposed(it, k, it.kt());
    for_each_block(it, h, h + 1, [&](const Block& b) {
      scores(it, b, q, false);
      float* l = lse + (s * shape.heads + b.h) * S;
      for_each_row(it, b, [&](int64_t r, int64_t i, int64_t lo, int64_t hi) {
        float* x = it.p() + r * L;
        const float m = row_max_one_thread(x, lo, hi), z = exp_row(x, lo, hi, m);
        float top = m, total = z;  // (a sink: one more term, no value)
        if (shape.sinks) {
          const float sink = shape.sinks[b.h];
          top = std::max(sink, m);
          total = z * expf(m - top) + expf(sink - top);
        }
        l[i] = top + logf(total);
        const float inv = expf(m - top) / total;
        for (int64_t j = lo; j < hi; ++j) x[j] *= inv;
        std::fill(x, x + lo, 0.0f);
        std::fill(x + hi, x + b.cols, 0.0f);
      });
      product(
          Product{it.p(), L, 1, it.at(v, b.j0, it.g), v.ld, it.at(o, b.i0, b.h), o.ld, 1.0f, false},
          b.rows, shape.head_dim,
          [&](int64_t m0, int64_t m1) { return keys_of_rows(it, b, m0, m1); });
    });
  });
}

void host_fused_attention_backward(const AttentionShape& a, HostHeads q, HostHeads k, HostHeads v,
                                   HostHeads o, const float* lse, HostHeads go, HostHeadsOut gq,
                                   HostHeadsOut gk, HostHeadsOut gv, const int32_t* docs,
                                   float* scratch) {
  AttentionShape shape = a;
  shape.host_doc_start = docs;
  // A kv head an item: its group's query heads add into its dK and dV in a fixed order.
  for_each_item(shape, shape.kv_heads, scratch, [=](int64_t s, int64_t g, float* mine) {
    const Item it{shape, s, g, mine};
    const int64_t L = it.L(), S = shape.S, D = shape.head_dim, group = shape.heads / shape.kv_heads;
    const bool capped = shape.softcap > 0;
    pack_transposed(it, k, it.kt());
    pack_transposed(it, v, it.vt());
    for_each_block(it, g * group, (g + 1) * group, [&](const Block& b) {
      scores(it, b, q, true);
      const float* l = lse + (s * shape.heads + b.h) * S;
      for_each_row(it, b, [&](int64_t r, int64_t i, int64_t lo, int64_t hi) {
        float* x = it.p() + r * L;
        exp_row(x, lo, hi, l[i]);
        std::fill(x, x + lo, 0.0f);
        std::fill(x + hi, x + b.cols, 0.0f);
      });
      // dV += P^T dO
      product(
          Product{it.p(), 1, L, it.at(go, b.i0, b.h), go.ld, it.at(gv, b.j0, g), gv.ld, 1.0f, true},
          b.cols, D, [&](int64_t m0, int64_t m1) { return queries_of_keys(it, b, m0, m1); });
      // dP = dO V^T, then dS = P (dP - rowsum(dO o O)) (times 1 - tanh^2 capped)
      product(Product{it.at(go, b.i0, b.h), go.ld, 1, it.vt() + b.j0, L, it.dp(), L, 1.0f, false},
              b.rows, b.cols, [&](int64_t m0, int64_t m1) {
                return TileRange{shape.first_key(s, b.i0 + m0) - b.j0, b.i0 + m1 - b.j0, 0, D};
              });
      for_each_row(it, b, [&](int64_t r, int64_t i, int64_t lo, int64_t hi) {
        const float* gr = it.at(go, i, b.h);
        const float* orow = it.at(o, i, b.h);
        const float d = row_sum_one_thread(0, D, [&](int64_t c) { return gr[c] * orow[c]; });
        const float* p = it.p() + r * L;
        const float* t = it.tanh_of() + r * L;
        float* ds = it.dp() + r * L;
        if (!capped) {
          for (int64_t j = lo; j < hi; ++j) ds[j] = p[j] * (ds[j] - d);
        } else {
          for (int64_t j = lo; j < hi; ++j) {
            const float x = p[j] * (ds[j] - d);
            ds[j] = p[j] != 0.0f ? x * (1.0f - t[j] * t[j]) : x;
          }
        }
        std::fill(ds, ds + lo, 0.0f);
        std::fill(ds + hi, ds + b.cols, 0.0f);
      });
      // dQ = scale dS K, dK += scale dS^T Q
      product(Product{it.dp(), L, 1, it.at(k, b.j0, g), k.ld, it.at(gq, b.i0, b.h), gq.ld,
                      shape.scale(), false},
              b.rows, D, [&](int64_t m0, int64_t m1) { return keys_of_rows(it, b, m0, m1); });
      product(Product{it.dp(), 1, L, it.at(q, b.i0, b.h), q.ld, it.at(gk, b.j0, g), gk.ld,
                      shape.scale(), true},
              b.cols, D, [&](int64_t m0, int64_t m1) { return queries_of_keys(it, b, m0, m1); });
    });
  });
}

#else  // no AVX-512 in this build: the gemm path runs (nn/attention.hpp)

bool host_fused_attention_built() {
  return false;
}

void host_fused_attention_forward(const AttentionShape&, HostHeads, HostHeads, HostHeads,
                                  HostHeadsOut, float*, const int32_t*, float*) {
  KQLORA_CHECK(false, "host_fused_attention_forward: not built (no AVX-512)");
}

void host_fused_attention_backward(const AttentionShape&, HostHeads, HostHeads, HostHeads,
                                   HostHeads, const float*, HostHeads, HostHeadsOut, HostHeadsOut,
                                   HostHeadsOut, const int32_t*, float*) {
  KQLORA_CHECK(false, "host_fused_attention_backward: not built (no AVX-512)");
}

#endif

}  // namespace kqlora::impl
