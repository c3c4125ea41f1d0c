#pragma once
// A Llama-architecture decoder (kind llama; Hugging Face's LlamaForCausalLM, and Mistral's
// GQA variant without a sliding window shorter than the sequences), QLoRA-fine-tuned as
// torchtune and PEFT over torchao's NF4 do: every base projection (q, k, v, o, gate, up,
// down) frozen in NF4, LoRA adapters on the projections `lora_targets` names, the
// embedding, the norms and the LM head frozen dense in the run's dtype. docs/MODELS.md.
//
// Forward per micro-batch of sequences [n, S]: x = embed[ids]; per layer
//   x += o_proj(attention(rope(q_proj(h)), rope(k_proj(h)), v_proj(h))),  h = rmsnorm(x)
//   x += down_proj(silu(gate_proj(h)) * up_proj(h)),                    h = rmsnorm(x)
// then the final rmsnorm and the LM head (the embedding when tied) fused with the
// next-token cross-entropy. The backward computes the adapters' gradients only; layer
// 0's input gradient is skipped.
//
// Table: group "embed" (model.embed_tokens.weight), a group per block
// "model.layers.<i>" (its adapters, its seven NF4 projections, its two norms), group
// "head" (model.norm.weight, and lm_head.weight unless tied). Names are Hugging Face's.

#include <Kokkos_Core.hpp>

#include <array>
#include <cstdint>
#include <vector>

#include "kqlora/nn/attention.hpp"
#include "kqlora/nn/llama_config.hpp"
#include "kqlora/nn/lm_head_cross_entropy.hpp"
#include "kqlora/nn/lora_projection.hpp"
#include "kqlora/nn/model.hpp"
#include "kqlora/nn/rotary.hpp"

namespace kqlora {

/// The projections of a block, in table order, with their module path under the layer.
constexpr int kLlamaProjections = 7;
extern const std::array<const char*, kLlamaProjections> kLlamaProjectionNames;  // q_proj ...
extern const std::array<const char*, kLlamaProjections>
    kLlamaProjectionModules;  // self_attn.q_proj ...

/// Which projections get adapters: "all-linear" or a comma list of projection names.
/// InputError naming `where` for unknown or repeated names.
std::array<bool, kLlamaProjections> parse_lora_targets(const std::string& text,
                                                       const std::string& where);

/// [out, in] of projection p (kLlamaProjectionNames order).
std::array<int64_t, 2> projection_shape(const LlamaArch& a, int p);

/// The model FLOPs of a training pass over `sequences` x `positions` tokens
/// (docs/BENCHMARKS.md, "Llama"): the products of the forward and the input gradients of
/// every projection and the LM head, the adapters' six rank-r products, the causal
/// attention's useful products forward and backward; no frozen weight's gradient, no
/// elementwise work, no recomputation.
double llama_train_flops(const LlamaArch& a, int64_t rank,
                         const std::array<bool, kLlamaProjections>& targets, int64_t sequences,
                         int64_t positions);

template <class ExecSpace>
class Llama : public Model<ExecSpace> {
 public:
  using typename Model<ExecSpace>::Mem;
  using typename Model<ExecSpace>::Vec;

  /// The table of `cfg` (its arch_text is config.json's text).
  static ParamTable make_table(const ModelConfig& cfg);

  Llama(const ExecSpace& exec, const ModelConfig& cfg, bool zeroed = true);

  InputSpec input() const override;
  double forward_backward(const Batch<Mem>& batch, double normaliser, bool accumulate) override;
  double loss(const Batch<Mem>& batch, double normaliser) override;
  double train_flops(int64_t sequences, int64_t positions) const override;

  /// The logits [tokens, vocab] of a batch (evaluation and tests; the loss never needs
  /// them whole).
  Matrix<Mem> logits(const Batch<Mem>& batch);

  const LlamaArch& arch() const { return arch_; }
  /// Bytes of one chunk of the fused LM head's logits (tests: several chunks).
  void set_logits_chunk_bytes(int64_t bytes) { ce_ws_.chunk_bytes = bytes; }

 private:
  struct Block {
    std::array<const ParamEntry*, kLlamaProjections> w{}, a{}, b{};  // a, b null: no adapter
    const ParamEntry *ln1 = nullptr, *ln2 = nullptr;
  };
  struct BlockCache {  // what the backward of a block reads
    Matrix<Mem> x, n1, q, k, v, att, mid, n2, gate, up, act;
    Kokkos::View<float*, Mem> inv1, inv2, lse;
    std::array<Matrix<Mem>, kLlamaProjections> h, xd;  // x_d A^T; dropped-out inputs
  };

  LlamaArch arch_;
  std::vector<float> inv_freq_;
  std::array<bool, kLlamaProjections> targets_{};
  std::vector<Block> blocks_;
  std::vector<BlockCache> cache_;
  const ParamEntry *embed_ = nullptr, *norm_ = nullptr, *head_ = nullptr;
  struct Buffers {  // the rest of a pass's activations and gradients
    Matrix<Mem> x_out, nf, g, gtmp, gn, gatt, gq, gk, gv, gact, ggate, gup, proj_out;
    Kokkos::View<float*, Mem> invf;
    LoraScratch<Mem> lora;
  };
  RopeTable<Mem> rope_;
  Buffers buf_;
  // What the views of cache_ and buf_ point into: capacity_ tokens' rows each.
  std::vector<BlockCache> store_;
  Buffers buffers_store_;
  BlockCache work_, work_store_;  // activation checkpointing: the one block's activations
  int64_t capacity_ = 0;
  LinearNf4Workspace<Mem> ws_;
  AttentionWorkspace<Mem> att_ws_;
  CrossEntropyWorkspace<Mem> ce_ws_;
  int64_t tokens_ = 0, seq_len_ = 0, row_len_ = 0, step_ = 0, first_sample_ = 0, global_bs_ = 1;
  bool dropout_on_ = false;

  /// Views of the first sequences * S rows of buffers that grow as needed.
  void ensure(int64_t sequences, int64_t S);
  /// f(storage, view, label, width) for every buffer of a block or of buf_.
  template <class F>
  void each_buffer(BlockCache& store, BlockCache& view, F&& f) const;
  template <class F>
  void each_buffer(Buffers& store, Buffers& view, F&& f) const;
  double forward(const Batch<Mem>& b, double normaliser, bool training, bool with_grads);
  void backward(bool accumulate);
  LoraAdapterViews<Mem> adapter(int layer, int p) const;
  DropoutKey dropout_key(int layer, int p, int64_t features) const;
  Kokkos::View<const float*, Mem> dense_vector(const ParamEntry* e) const;
  Matrix<Mem> dense_matrix(const ParamEntry* e) const;
  /// What block `layer` keeps for its backward: its own cache, or with activation
  /// checkpointing the shared one over its input.
  BlockCache& block_cache(int layer);
  /// Block `layer`'s forward from c.x into c; `next` (the block's output) empty: a
  /// recomputation, which stops short of it.
  void block_forward(int layer, BlockCache& c, const Matrix<Mem>& next);
  void project(int layer, int p, BlockCache& c, const Matrix<Mem>& x, const Matrix<Mem>& y);
  void project_back(int layer, int p, const BlockCache& c, const Matrix<Mem>& gy, bool accumulate,
                    float gx_beta, const Matrix<Mem>& gx);
};

}  // namespace kqlora
