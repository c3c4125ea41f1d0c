#pragma once
// kqlora-bench's tensor-read records: a base tensor read from safetensors into float32
// the way set-up reads it (io/safetensors.hpp's read_f32_into, which looks for NaN and Inf
// in the same pass), beside the plain read it replaced, as interleaved pairs: what the
// check costs the set-up (docs/RELIABILITY.md, "Runs that learn nothing").

#include <cstdint>
#include <string>
#include <vector>

#include "bench_record.hpp"

namespace kqlora::bench {

/// tensor_read_NxN_f32|bf16 (through read_f32_into) and ..._plain (the same read without
/// the check) for an N x N tensor in a file under $TMPDIR (removed after); the median of
/// the per-pair ratios (checked / plain) as the first record's ratio_to_dense (printed "/
/// plain read"). The file is in the page cache: the check's CPU cost with no disk to hide
/// it.
void tensor_read_records(int64_t n, int pairs, const std::string& filter, std::vector<Record>& out);

}  // namespace kqlora::bench
