#pragma once
// kqlora-bench's Llama records: a whole forward and backward of a QLoRA Llama of a named
// shape (random weights, all seven projections adapted, rank 8), one thread, and the parts
// the targets are about (docs/BENCHMARKS.md, "Llama").

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "bench_record.hpp"

namespace kqlora::bench {

struct LlamaShape {
  std::string name;
  int64_t vocab = 0, hidden = 0, intermediate = 0, layers = 0, heads = 0, kv_heads = 0;
  bool tied = true;
};

/// "135m" (SmolLM2-135M: hidden 576, intermediate 1536, 30 layers, 9 heads, 3 kv heads,
/// vocab 49152, tied) or "tiny" (a smoke-test shape); InputError otherwise. With `layers` >
/// 0, that many decoder layers instead, named "<name>_l<layers>" (e.g. a step of 2 layers
/// minus one of 1: one layer's cost; what is left, the embedding, norm and LM head's).
LlamaShape llama_shape(const std::string& name, int64_t layers = 0);

/// For each batch count B, sequences of `seq` tokens: llama_fwd_bwd_<shape>_b<B>_t<seq>
/// (model FLOPs), and llama_attention_fwd_bwd_..., llama_attention_gemm_fwd_bwd_... (where
/// the host's fused attention is built), llama_lm_head_cross_entropy_...,
/// llama_lm_head_products_..., llama_cross_entropy_... (every layer's attention forward
/// and backward, fused and through gemm; the fused LM head and cross-entropy; its two products
/// alone; its softmax, loss and gradient alone). Prints each part's share of the step. A bfloat16
/// run
/// (`bf16`: NF4 and compute in bfloat16) names its records with "_bf16" at the end; with
/// `prompt` > 0 the first `prompt` tokens of each sequence are a prompt (label -100, not
/// scored) and the names end in "_p<prompt>". The fwd_bwd record also holds one more step's
/// gemm_calls, kernel_launches, deep_copies and fences (bench_record.hpp).
void llama_records(const LlamaShape& shape, const std::vector<int64_t>& batches, int64_t seq,
                   int repeats, const std::string& filter, std::vector<Record>& out,
                   std::ostream& report, bool bf16 = false, int64_t prompt = 0);

}  // namespace kqlora::bench
