#pragma once
// The host's float32 attention (nn/attention.hpp's semantics) as one fused kernel per
// sequence and kv head, compiled inside the library with AVX-512 (src/nn/attention_host.cpp).
// Where the gemm path makes 2 calls a head and 64-row block forward and 5 backward
// (about 30 000 small products a 4 x 256-token step of the 135M shape, each a library
// call that packs its operands), this one runs every product of a block through one
// register-tiled micro-kernel on operands in place: K and V transposed once per sequence
// and kv head, the rows of Q, dO, K and V read directly, the probabilities and their
// gradient read across or down. Tiles past a row tile's last visible key are not
// computed, and each key tile of dK and dV sums only over the queries that can see it.
//
// The work items run on the default host execution space's threads: a sequence and query
// head each forward, a sequence and kv head each backward (the products of a query head
// group add into that kv head's gradient in a fixed order), so results do not depend on
// the number of threads; no more threads than items work.

#include <cstdint>

#include "kqlora/nn/attention_shape.hpp"

namespace kqlora::impl {

/// Whether this build has the fused host kernel (AVX-512); without it the gemm path runs.
bool host_fused_attention_built();

/// Floats of scratch the fused kernel needs per concurrent work item.
int64_t host_fused_attention_item_floats(int64_t S, int64_t head_dim, bool softcap);

/// Work items the fused kernel runs at once (its scratch holds this many items' floats).
int64_t host_fused_attention_concurrency();

/// Row-major [tokens, heads * D] operands with row stride `ld`.
struct HostHeads {
  const float* data = nullptr;
  int64_t ld = 0;
};
struct HostHeadsOut {
  float* data = nullptr;
  int64_t ld = 0;
};

/// o = attention(q, k, v); lse [sequences * heads * S]; docs [sequences * S] or null.
/// `scratch`: host_fused_attention_concurrency() x host_fused_attention_item_floats().
void host_fused_attention_forward(const AttentionShape& a, HostHeads q, HostHeads k, HostHeads v,
                                  HostHeadsOut o, float* lse, const int32_t* docs, float* scratch);

/// gq written, gk and gv added to (the caller zeroes them), from the forward's o and lse.
void host_fused_attention_backward(const AttentionShape& a, HostHeads q, HostHeads k, HostHeads v,
                                   HostHeads o, const float* lse, HostHeads go, HostHeadsOut gq,
                                   HostHeadsOut gk, HostHeadsOut gv, const int32_t* docs,
                                   float* scratch);

}  // namespace kqlora::impl
