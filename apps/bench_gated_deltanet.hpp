#pragma once
// kqlora-bench's Gated DeltaNet records: one linear-attention layer's token mixer
// (nn/gated_deltanet.hpp: the conv, the norms, the chunked delta rule, the gated norm)
// forward and backward over one row of T tokens, on a Qwen3.5-2B-like layer (16 key and 16
// value heads of 128), float32: its cost per token should not grow with T
// (docs/BENCHMARKS.md, "Gated DeltaNet").

#include <cstdint>
#include <string>
#include <vector>

#include "bench_record.hpp"

namespace kqlora::bench {

/// gated_deltanet_fwd_bwd_tT for each T of `tokens`; each record's ratio_to_dense is its
/// time per token over the first T's (printed "/ first T per token").
void gated_deltanet_records(const std::vector<int64_t>& tokens, int repeats,
                            const std::string& filter, std::vector<Record>& out);

}  // namespace kqlora::bench
