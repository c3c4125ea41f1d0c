#pragma once
// The shape and mask of a causal attention call (nn/attention.hpp, nn/attention_host.hpp).

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace kqlora {

struct AttentionShape {
  int64_t sequences = 0, S = 0, heads = 0, kv_heads = 0, head_dim = 0;
  float attn_scale = 0;  // 0: 1 / sqrt(head_dim)
  float softcap = 0;     // 0: none
  int64_t window = 0;    // 0: full causal attention
  // Packed rows: each token's document start, [sequences * S] in host memory (the
  // attention's DocStarts, read where the blocks are planned); null: a document a row.
  const int32_t* host_doc_start = nullptr;
  // Per-head sink logits [heads] in the operands' memory (gpt-oss; null: none): each enters
  // its head's softmax denominator only, as a key no value belongs to.
  const float* sinks = nullptr;
  float scale() const {
    return attn_scale > 0 ? attn_scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
  }
  /// The first key any query of rows [i0, ...) of sequence s may see: a row's document
  /// starts no earlier than the one of the row before it.
  int64_t first_key(int64_t s, int64_t i0) const {
    const int64_t by_window = window > 0 ? std::max<int64_t>(0, i0 - window + 1) : 0;
    return host_doc_start ? std::max<int64_t>(by_window, host_doc_start[s * S + i0]) : by_window;
  }
};

/// Query rows per block: a block's scores reach only up to its last row's position, so the
/// masked upper triangle is mostly not computed (at S = 256: 10 of 16 blocks of 64 x 64).
/// Measured on the 135M shape at 4 x 256 tokens, every layer's forward and backward, one
/// thread (AMD EPYC Zen 3): 1.17 - 1.30 s with blocks of 64, 1.24 - 1.29 s with 128,
/// 1.55 - 1.62 s unblocked.
constexpr int64_t kAttentionRowBlock = 64;

}  // namespace kqlora
