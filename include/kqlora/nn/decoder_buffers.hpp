#pragma once
// Every activation buffer of a decoder's forward and backward, listed once: the model
// allocates from this table, and the memory estimate sums it (nn/model_registry.cpp). A
// buffer holds `width` floats per token; a block buffer exists once per layer (or once in
// all with activation checkpointing, where each layer keeps only its input x), a shared one
// once. Width 0: the spec or the configuration does not need it.
//
// Kept in bfloat16 (keeps_bf16_activations): a bfloat16 run rounds every activation a block
// buffer holds to bfloat16 except the per-row statistics (1/rms, log-sum-exp), so what a
// layer keeps for its backward is stored in 16 bits, exactly, and widened into one block's
// float32 buffers when the backward (or its recomputation) reaches the layer: half the bytes
// of what each layer keeps, for one float32 block more, and the same numbers.

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "kqlora/nn/decoder_spec.hpp"
#include "kqlora/nn/model_config.hpp"

namespace kqlora {

struct ActivationBuffer {
  std::string name;
  int64_t width = 0;  // floats per token
  /// A bfloat16 run's values here are bfloat16 values (so kept in 16 bits exactly when the
  /// activations are kept in bfloat16); false for anything not rounded so, e.g. per-row
  /// statistics.
  bool bf16_values = false;
};

struct DecoderBuffers {
  /// Block buffers, in table order. inv*: 1/rms per row; lse: per head.
  enum BlockBuffer : int {
    kX,     // the block's input
    kN1,    // attention-norm output
    kQ,     // queries after their norm and the rotary
    kK,     // keys, the same
    kV,     // values
    kQRaw,  // queries before their norm (q/k norms only)
    kKRaw,  // keys before theirs
    kVRaw,  // values before their clamp (clip_qkv only)
    kInvQ,  // 1/rms of each (token, head, or the whole projection) of the q norm
    kInvK,  // and of the k norm
    kAtt,   // attention output
    kLse,   // its log-sum-exp per (token, head)
    kORaw,  // o projection's output before the sandwich norm
    kInvO,  // its 1/rms
    kMid,   // x + attention branch
    kN2,    // MLP-norm output
    kGate,  // gate slot
    kUp,    // up slot
    kAct,   // act(gate) * up
    kDRaw,  // down projection's output before the sandwich norm
    kInvD,  // its 1/rms
    kInv1,  // attention norm's 1/rms
    kInv2,  // MLP norm's 1/rms
    // A sparse layer's (nn/sparse_mlp.hpp; width 0 without one). k = top_k; the grouped
    // rows are [T * k, width], held as k * width floats per token.
    kLogits,  // router logits [T, E]
    kWeight,  // routing weights [T, k]
    kChosen,  // the chosen experts [T, k] (int32 in a float's place)
    kWhere,   // each slot's grouped row [T, k] (int32)
    kOrder,   // each grouped row's slot [T * k] (int32)
    kXg,      // the input's grouped rows
    kGateG,   // the experts' gate, up and act(gate) * up rows
    kUpG,
    kActG,
    kYg,       // their down outputs
    kHGateUp,  // the expert adapters' x A^T (gate_up's, down's), [T * k, rank]
    kHDown,
    kShared,      // a shared expert's output before its gate [T, H]
    kSharedGate,  // sigmoid of its gate's logit [T]
    // A gated attention's (Qwen3.5): q_proj's [q_h | gate_h] output, the gates, and the
    // attention output times sigmoid(gate) (o_proj's input).
    kQFull,
    kAttnGate,
    kAttGated,
    // A Gated DeltaNet layer's (nn/gated_deltanet.hpp): its four input projections'
    // outputs, the conv's output, the normalised q and k, v, beta, g, the rule's output,
    // the L2 norms' and the gated norm's 1/rms, and the gated norm's output (out_proj's
    // input).
    kLinMixed,
    kLinZ,
    kLinB,
    kLinA,
    kLinConv,
    kLinQ,
    kLinK,
    kLinV,
    kLinBeta,
    kLinG,
    kLinCore,
    kLinInvQ,
    kLinInvK,
    kLinInvNorm,
    kLinOut,
    kInvV,  // the v norm's 1/rms per (token, kv head) (Gemma 4: v before it in kVRaw)
    // Gemma 4's per-layer input (nn/per_layer_input.hpp): the block's output before it,
    // per_layer_input_gate's output, act(that) * the layer's input, per_layer_projection's
    // output before its norm, and that norm's 1/rms.
    kPleIn,
    kPleGate,
    kPleAct,
    kPleRaw,
    kInvPle,
    // Gemma 4's MoE block: the router's input and its norm's 1/rms, the experts' input
    // (pre_feedforward_layernorm_2's output) and 1/rms, the experts' output before its
    // norm, and the two output norms' 1/rms (the dense MLP's output is kShared's).
    kRouterIn,
    kInvRouter,
    kN3,
    kInv3,
    kExpertsRaw,
    kInvE1,
    kInvE2,
    kBlockBuffers
  };

  /// Shared buffers (one pass's gradients and scratch), in table order.
  enum SharedBuffer : int {
    kXOut,  // the last block's output
    kNf,    // final-norm output
    kInvF,  // its 1/rms
    kG,     // gradient of the residual stream
    kGTmp,  // a norm's input gradient
    kGN,    // gradient of a norm's output
    kGAtt,  // of the attention output
    kGQ,    // of q, k, v
    kGK,
    kGV,
    kGAct,   // of act
    kGGate,  // of gate, up
    kGUp,
    kProjOut,  // o / down output on its way into the residual
    kFused,    // a fused projection's output before its split
    kGFused,   // its gathered gradient
    kGH,       // LoRA scratch: gy B
    kTmp,      // LoRA scratch: bfloat16 and dropout products
    kGYg,      // a sparse layer's: the grouped rows' gradients (down output, input,
    kGXg,      //   act, gate, up), the weights' and the router logits'
    kGActG,
    kGGateG,
    kGUpG,
    kGW,
    kGLogits,
    kGShared,  // the shared expert's output gradient
    kGQFull,   // a gated attention's: the gradient of q_proj's [q | gate] output
    kGGateA,   //   and of the gates
    // A Gated DeltaNet layer's backward: the gradients of out_proj's input, of the rule's
    // output, of q and k per value head and per key head, of v, beta and g, of the conv's
    // output, and of the four input projections' outputs.
    kGLinOut,
    kGLinCore,
    kGLinQv,
    kGLinKv,
    kGLinQ,
    kGLinK,
    kGLinV,
    kGLinBeta,
    kGLinG,
    kGLinConv,
    kGLinMixed,
    kGLinZ,
    kGLinB,
    kGLinA,
    // Gemma 4's shared keys and values (each producer layer's k then v, [T, kv] blocks one
    // after another) and the gradients the layers attending over them send back.
    kSharedKV,
    kGSharedKV,
    // Gemma 4's per-layer inputs [T, layers * P] (made once a pass), the projection's part
    // before the combine, its norm's 1/rms per (token, layer), and a layer's gradient of
    // act(gate) * input (then, in place, of the gate).
    kPle,
    kPleProj,
    kInvPleProj,
    kGPleAct,
    // Gemma 4's MoE block: the experts' normalised output (forward) or its norm's input
    // gradient (backward), and the gradients of the experts' and the router's inputs.
    kMoeTmp,
    kGN3,
    kGRouterIn,
    kSharedBuffers
  };

  std::vector<ActivationBuffer> block;   // kBlockBuffers, then h and xd of each projection
  std::vector<ActivationBuffer> shared;  // kSharedBuffers
  /// The adapter buffers of projection p: its x_d A^T and its dropped-out input.
  static int h(int p) { return kBlockBuffers + 2 * p; }
  static int xd(int p) { return kBlockBuffers + 2 * p + 1; }
};

/// Whether a model on a GPU (`device`) or a host keeps its block buffers of bfloat16 values
/// in 16 bits: activation_dtype bfloat16, or automatic in a bfloat16 run on a GPU (a host
/// spends the widening passes' time for the memory only when asked).
inline bool keeps_bf16_activations(const ModelConfig& cfg, bool device) {
  return cfg.bf16() && (cfg.activation_dtype == ActivationDtype::bfloat16 ||
                        (cfg.activation_dtype == ActivationDtype::automatic && device));
}
/// The same for a model whose buffers live in memory space M (the model and its estimate).
template <class M>
bool keeps_bf16_activations(const ModelConfig& cfg) {
  return keeps_bf16_activations(cfg, !std::is_same<M, Kokkos::HostSpace>::value);
}

/// The table of a spec and configuration; `targets[p]`: projection p has an adapter.
DecoderBuffers decoder_buffers(const DecoderSpec& s, const ModelConfig& cfg,
                               const std::vector<bool>& targets);

}  // namespace kqlora
