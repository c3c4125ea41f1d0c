#pragma once
// kqlora-bench's GEMM engine records: the products of a Llama shape's training step
// (its projections, LM head chunks, attention blocks and LoRA products at B x T tokens)
// through each host GEMM engine, as interleaved pairs (docs/BLAS.md, "The GEMM engine").

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "bench_llama.hpp"
#include "bench_record.hpp"

namespace kqlora::bench {

/// gemm_engine_<product>_<shape>_t<tokens>_blas and ..._onednn for each product; the
/// median of the per-pair time ratios (BLAS / oneDNN) printed to `report`. Needs a oneDNN
/// build (nothing is recorded otherwise).
void gemm_engine_records(const LlamaShape& shape, int64_t tokens, int pairs,
                         const std::string& filter, std::vector<Record>& out, std::ostream& report);

}  // namespace kqlora::bench
