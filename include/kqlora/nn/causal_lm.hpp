#pragma once
// A decoder-only LM read from a Hugging Face directory (kind causal_lm, alias llama), of any
// family a DecoderSpec describes (nn/decoder_spec.hpp: Llama, Mistral, Qwen2, Qwen3,
// Gemma 2/3, Phi-3, Qwen3-MoE, Mixtral, OLMoE), QLoRA-fine-tuned as torchtune and PEFT over
// torchao's NF4 do: every base projection frozen in NF4 (fused ones kept fused), LoRA adapters on
// the projections `lora_targets` names, the embedding, the norms, the biases and the LM head frozen
// dense in the run's dtype. docs/MODELS.md.
//
// Forward per micro-batch of sequences [n, S]: x = embed[ids] (times the embedding scale),
// the blocks as decoder_spec.hpp describes them, the final norm and the LM head (the
// embedding when tied) fused with the next-token cross-entropy. The backward computes the
// adapters' gradients only; layer 0's input gradient is skipped.
//
// Table: group "embed" (model.embed_tokens.weight), a group per block "model.layers.<i>"
// (its adapters, its NF4 projections, their biases, its norms), group "head" (model.norm.
// weight, and lm_head.weight unless tied). Names are Hugging Face's.

#include <Kokkos_Core.hpp>

#include <cmath>

#include <cstdint>
#include <utility>
#include <vector>

#include "kqlora/nn/attention.hpp"
#include "kqlora/nn/bfloat16_copy.hpp"
#include "kqlora/nn/decoder_buffers.hpp"
#include "kqlora/nn/decoder_spec.hpp"
#include "kqlora/nn/gated_deltanet.hpp"
#include "kqlora/nn/lm_head_cross_entropy.hpp"
#include "kqlora/nn/lora_projection.hpp"
#include "kqlora/nn/lora_targets.hpp"
#include "kqlora/nn/model.hpp"
#include "kqlora/nn/rms_norm.hpp"
#include "kqlora/nn/rotary.hpp"
#include "kqlora/nn/sparse_mlp.hpp"

namespace kqlora {

/// The spec of a causal_lm configuration (its arch_text is config.json's text).
DecoderSpec decoder_spec_of(const ModelConfig& cfg);

/// The model FLOPs of a training pass over `sequences` x `positions` tokens
/// (docs/BENCHMARKS.md, "Llama"): the products of the forward and the input gradients of
/// every projection and the LM head, the adapters' six rank-r products, the attention's
/// scores actually computed (each query's min(position + 1, window) keys) forward and
/// backward; no frozen weight's gradient, no elementwise work, no recomputation.
double decoder_train_flops(const DecoderSpec& s, int64_t rank, const std::vector<bool>& targets,
                           int64_t sequences, int64_t positions);

template <class ExecSpace>
class CausalLm : public Model<ExecSpace> {
 public:
  using typename Model<ExecSpace>::Mem;
  using typename Model<ExecSpace>::Vec;

  /// The table of `cfg`.
  static ParamTable make_table(const ModelConfig& cfg);

  CausalLm(const ExecSpace& exec, const ModelConfig& cfg, bool zeroed = true);

  InputSpec input() const override;
  double forward_backward(const Batch<Mem>& batch, double normaliser, bool accumulate) override;
  double loss(const Batch<Mem>& batch, double normaliser) override;
  std::vector<double> sequence_logps(const Batch<Mem>& batch, bool with_grads,
                                     std::vector<int64_t>* scored = nullptr,
                                     const std::vector<int64_t>* prefix_end = nullptr,
                                     std::vector<double>* prefix_logps = nullptr) override;
  void backward_weighted(const std::vector<double>& row_weights, bool accumulate,
                         const std::vector<double>* prefix_weights = nullptr) override;
  double train_flops(int64_t sequences, int64_t positions) const override;

  /// The load-balancing loss the last forward added (0: none).
  double aux_loss() const override { return aux_value_; }

  /// The logits [tokens, vocab] of a batch (evaluation and tests; the loss never needs
  /// them whole).
  Matrix<Mem> logits(const Batch<Mem>& batch);

  const DecoderSpec& spec() const { return spec_; }
  /// config.json's defaults taken ("vocab_size: default 32000", ...).
  std::vector<std::string> notes() const override;

 private:
  using Buffers = std::vector<Matrix<Mem>>;  // indexed by BlockBuffer / SharedBuffer
  struct Projection {
    const ParamEntry *w = nullptr, *a = nullptr, *b = nullptr, *bias = nullptr;
  };
  struct Expert {
    const ParamEntry *gate = nullptr, *up = nullptr, *down = nullptr;
  };
  struct Block {
    std::vector<Projection> proj;             // by projection (w null: the layer has none)
    std::vector<const ParamEntry*> norm;      // by NormRole; null: none
    const ParamEntry* router = nullptr;       // a sparse layer's
    const ParamEntry* router_bias = nullptr;  // (gpt-oss)
    const ParamEntry* shared_gate = nullptr;  // its shared expert's gate [1, hidden]
    // gpt-oss: its experts' biases ([E, I], [E, I], [E, hidden]) and the attention's sinks
    const ParamEntry *gate_bias = nullptr, *up_bias = nullptr, *down_bias = nullptr;
    const ParamEntry* sinks = nullptr;
    const ParamEntry* layer_scalar = nullptr;  // Gemma 4's [1] factor on the block's output
    // Gemma 4's MoE block: the router's input scale [hidden] and per-expert scale [E]
    const ParamEntry *router_scale = nullptr, *per_expert_scale = nullptr;
    // A Gated DeltaNet layer's frozen conv weight, dt_bias, A_log and gated norm weight.
    const ParamEntry *lin_conv = nullptr, *lin_dt_bias = nullptr, *lin_a_log = nullptr,
                     *lin_norm = nullptr;
    int group = 0;  // its parameter group (FSDP's unit)
    std::vector<Expert> experts;
    // Its experts' adapters (A, B; null: none), expert-major (causal_lm.cpp).
    std::pair<const ParamEntry*, const ParamEntry*> gate_up_lora{}, down_lora{};
  };

  DecoderSpec spec_;
  DecoderBuffers table_of_buffers_;
  std::vector<bool> targets_;
  std::vector<Block> blocks_;
  // Gated DeltaNet layers: the batch's documents, and each layer's chunk states (one set
  // with activation checkpointing).
  DeltaRuleDocuments<Mem> lin_docs_;
  int64_t lin_docs_rows_ = -1, lin_docs_len_ = -1;  // (the batch shape lin_docs_ is of)
  bool lin_docs_packed_ = false;
  std::vector<Kokkos::View<float*, Mem>> lin_states_;
  const ParamEntry *embed_ = nullptr, *norm_ = nullptr, *head_ = nullptr;
  // sequence_logps's per-row sums, and the shape backward_weighted's weights are of
  Kokkos::View<double*, Mem> seq_loss_, seq_prefix_loss_;
  Kokkos::View<int64_t*, Mem> seq_count_, seq_prefix_end_;
  int64_t weighted_rows_ = 0, weighted_len_ = 1;
  bool weighted_ready_ = false;  // the last forward kept the head's gradient for it
  Kokkos::View<float*, Mem> row_w_;
  typename Kokkos::View<float*, Mem>::HostMirror row_w_host_;
  // Gemma 4's per-layer inputs: the table, the model's projection (NF4) and its norm
  const ParamEntry *ple_embed_ = nullptr, *ple_proj_ = nullptr, *ple_norm_ = nullptr;
  std::vector<RopeTable<Mem>> rope_;
  std::vector<const std::vector<float>*> rope_freqs_;  // the set each table was built from
  std::vector<Buffers> cache_, store_;  // [layer]: views of the first tokens_ rows; storage
  Buffers work_, work_store_;  // activation checkpointing or bfloat16 kept: one block's buffers
  // Activations kept in bfloat16 (decoder_buffers.hpp): the one block's buffers a layer
  // keeps in 16 bits, contiguous in widened_ (slab_width_ floats a token), and each layer's
  // 16 bits of them.
  bool bf16_kept_ = false;
  int64_t slab_width_ = 0;
  Kokkos::View<float*, Mem> widened_;
  std::vector<Bf16Bits<Mem>> bf16_store_;
  Buffers buf_, buf_store_;  // shared
  LoraScratch<Mem> lora_;
  int64_t capacity_ = 0;
  LinearNf4Workspace<Mem> ws_;
  AttentionWorkspace<Mem> att_ws_;
  CrossEntropyWorkspace<Mem> ce_ws_;
  int64_t tokens_ = 0, seq_len_ = 0, row_len_ = 0, step_ = 0, first_sample_ = 0, global_bs_ = 1;
  // Packed rows (a batch with position_ids): each token's position, and the position its
  // document starts at in its row (the attention's mask); empty otherwise.
  TokenPositions<Mem> positions_;
  DocStarts<Mem> docs_;
  Kokkos::View<int32_t*, Mem> doc_store_;
  std::vector<int32_t> host_docs_;  // docs_ on the host
  int64_t rope_len_ = 0;            // the rows' length longrope's choice of factors takes
  bool dropout_on_ = false;
  std::vector<std::vector<int64_t>> offsets_;  // [layer]: a sparse layer's grouping (forward)
  // The router's load-balancing loss (router_aux_loss; nn/sparse_mlp.hpp): on, its state
  // over one forward, and its value (coefficient and micro-batch weight applied).
  bool aux_on_ = false;
  RouterAuxLoss<Mem> aux_;
  double aux_value_ = 0;
  /// aux_.real from a batch's labels: a row's positions up to its last scored label.
  void mark_real_tokens(const TokenMatrix<Mem>& labels);
  /// After the last layer: the loss's value and its gradient per expert (aux_.grad).
  double finish_aux_loss(int64_t rows, int64_t global_bs);

  /// positions_ and docs_ from a batch's position_ids (empty: none), and rope_len_ as
  /// transformers' longrope takes it: max(position_ids) + 1, else the data file's rows.
  void set_documents(const TokenMatrix<Mem>& positions);
  /// Views of the first sequences * S rows of buffers that grow as needed; rope tables.
  void ensure(int64_t sequences, int64_t S);
  double forward(const Batch<Mem>& b, double normaliser, bool training, bool with_grads);
  void backward(bool accumulate);
  LoraAdapterViews<Mem> adapter(int layer, int p) const;
  DropoutKey dropout_key(int layer, int p, int64_t features) const;
  Kokkos::View<const float*, Mem> dense_vector(const ParamEntry* e) const;
  Matrix<Mem> dense_matrix(const ParamEntry* e) const;
  /// What the LM head's products multiply: bfloat16 values in a bfloat16 run over a
  /// bfloat16 head, float32 otherwise.
  GemmInputs head_inputs() const;
  /// The logits' divisor and soft-cap (nn/lm_head_cross_entropy.hpp).
  FinalLogits final_logits() const { return {spec_.logits_divisor, spec_.final_softcap}; }
  /// The buffers block `layer` runs on: its own cache, or with activation checkpointing
  /// or activations kept in bfloat16 the one block's buffers over the layer's float32 ones
  /// (then what it keeps in 16 bits is there only after restore_bf16(layer)).
  Buffers& block_cache(int layer);
  /// Whether each layer keeps block buffer i through the forward.
  bool kept_per_layer(size_t i) const;
  /// Activations kept in bfloat16: the one block's into `layer`'s 16 bits, and back.
  void keep_bf16(int layer);
  void restore_bf16(int layer);
  /// Block `layer`'s forward from c[kX] into c; `next` (the block's output) empty: a
  /// recomputation, which stops short of it. The order, norms and residuals; the
  /// sublayers below, each in a file of its own.
  void block_forward(int layer, Buffers& c, const Matrix<Mem>& next);
  /// The attention (src/nn/decoder_attention.cpp): from sublayer_input(attn_in) to its o
  /// projection's output (slot_output(o)); backward from g_o, the gradient of that output, to the
  /// adapters' gradients and the gradient of that input into gx (empty: none, layer 0).
  void attention_forward(int layer, Buffers& c);
  void attention_backward(int layer, Buffers& c, const Matrix<Mem>& g_o, bool accumulate,
                          const Matrix<Mem>& gx);
  /// clip_qkv's backward on the gradients of q, k and v (before their norms').
  void clip_qkv_backward(int layer, Buffers& c);
  /// A Gated DeltaNet layer (src/nn/decoder_linear_attention.cpp): from the same input to its
  /// out_proj's output (slot_output(lin_out)); backward as the attention's.
  void linear_attention_forward(int layer, Buffers& c);
  void linear_attention_backward(int layer, Buffers& c, const Matrix<Mem>& g_o, bool accumulate,
                                 const Matrix<Mem>& gx);
  /// A Gated DeltaNet layer's frozen tensors and kept values, views of block cache c.
  GatedDeltaNetWeights<Mem> linear_weights(int layer) const;
  GatedDeltaNetBuffers<Mem> linear_buffers(int layer, Buffers& c);
  GatedDeltaNetShape linear_shape() const;
  /// The dense MLP (src/nn/decoder_dense_mlp.cpp): from sublayer_input(mlp_in) to its down
  /// projection's output (slot_output(down)); backward as the attention's.
  void dense_mlp_forward(int layer, Buffers& c);
  void dense_mlp_backward(int layer, Buffers& c, const Matrix<Mem>& g_down, bool accumulate,
                          const Matrix<Mem>& gx, float gx_beta = 0.0f);
  /// The experts (src/nn/decoder_sparse_mlp.cpp): from the same input to slot_output(down), adding
  /// to the aux loss's sums when `sum_aux`; backward as the attention's, and into the
  /// routers through the aux loss.
  void experts_forward(int layer, Buffers& c, bool sum_aux);
  void experts_backward(int layer, Buffers& c, const Matrix<Mem>& g_out, bool accumulate,
                        const Matrix<Mem>& gx);
  /// Where slot s of block cache c is written (before any norm of its own).
  Matrix<Mem> slot_output(Buffers& c, Slot s);
  /// The gradient buffer of slot s (q, k, v, gate, up).
  Matrix<Mem> slot_gradient(Slot s);
  /// What the attention (attn_in) or the MLP (mlp_in) reads: its input norm's output, or
  /// without that norm the residual stream itself (OLMo 2's post-norm blocks).
  Matrix<Mem> sublayer_input(const Buffers& c, NormRole r) const {
    const bool attn = r == NormRole::attn_in;
    if (spec_.norm(r)) return c[attn ? DecoderBuffers::kN1 : DecoderBuffers::kN2];
    return c[attn ? DecoderBuffers::kX : DecoderBuffers::kMid];
  }
  /// The buffer projection p reads.
  Matrix<Mem> projection_input(const Buffers& c, int p) const;
  /// Projection p of `layer` on block cache c, into its slots (or `out` when given).
  void project(int layer, int p, Buffers& c, const Matrix<Mem>& out = Matrix<Mem>());
  /// The dense MLP's buffers of c (and the shared gradients') as views of `layer`'s MLP
  /// width: a shared expert's may be narrower than the widest.
  void mlp_views(int layer, Buffers& c);
  /// The attention's buffers of c (and the shared gradients') as views of `layer`'s q and
  /// k/v widths: Gemma 4's full-attention layers' differ from the others'.
  void attention_views(int layer, Buffers& c);
  /// Gemma 4's MoE block (docs/MODELS.md): the experts beside the dense MLP, each with its
  /// norms, the router on its own input; forward and backward.
  void moe_block_forward(int layer, Buffers& c, bool sum_aux);
  void moe_block_backward(int layer, Buffers& c, const Matrix<Mem>& g_out, bool accumulate,
                          const Matrix<Mem>& gx);
  /// The router input's factor hidden^-1/2 (a Python float in transformers).
  float router_root() const {
    return static_cast<float>(1.0 / std::sqrt(static_cast<double>(spec_.hidden)));
  }
  /// Gemma 4's shared keys (or values) of a producer layer, or their gradients' sum, as a
  /// [T, kv] view of DecoderBuffers::kSharedKV (kGSharedKV).
  Matrix<Mem> shared_kv(int producer, bool value, bool gradient);
  /// Gemma 4's per-layer inputs of the batch into kPle (nn/per_layer_input.hpp), from the
  /// tokens and the scaled embeddings x0.
  void per_layer_inputs(const TokenMatrix<Mem>& tokens, const Matrix<Mem>& x0);
  /// Every projection reading `in`.
  void project_all(int layer, ProjectionInput in, Buffers& c);
  void project_back(int layer, int p, const Buffers& c, const Matrix<Mem>& gy, bool accumulate,
                    float gx_beta, const Matrix<Mem>& gx);
  /// The projections reading `in`, backward: their slots' gradients into gx (summed).
  void project_back_all(int layer, ProjectionInput in, const Buffers& c, bool accumulate,
                        const Matrix<Mem>& gx, float gx_beta = 0.0f);
  void norm_forward(const ParamEntry* w, NormRole role, const Matrix<Mem>& x, const Matrix<Mem>& y,
                    const Matrix<Mem>& inv);
  void norm_backward(const ParamEntry* w, NormRole role, const Matrix<Mem>& x,
                     const Matrix<Mem>& inv, const Matrix<Mem>& gy, const Matrix<Mem>& gx,
                     NormGradOut out = NormGradOut::write);
  AttentionShape attention_shape(int layer) const;
  /// A sparse layer's kept values, views of block cache c (offsets left to the caller).
  SparseMlpCache<Mem> sparse_cache(Buffers& c) const;
  /// The sparse backward's scratch, views of the shared buffers.
  SparseMlpScratch<Mem> sparse_scratch() const;
  RouterWeights<Mem> router_weights(int layer) const;
  std::vector<ExpertWeights<Mem>> expert_weights(int layer) const;
};

}  // namespace kqlora
