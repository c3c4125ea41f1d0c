#pragma once
// Every activation buffer of a decoder's forward and backward, listed once: the model
// allocates from this table, and the memory estimate sums it (nn/model_registry.cpp). A
// buffer holds `width` floats per token; a block buffer exists once per layer (or once in
// all with activation checkpointing, where each layer keeps only its input x), a shared one
// once. Width 0: the spec or the configuration does not need it.

#include <cstdint>
#include <string>
#include <vector>

#include "kqlora/nn/decoder_spec.hpp"
#include "kqlora/nn/model_config.hpp"

namespace kqlora {

struct ActivationBuffer {
  std::string name;
  int64_t width = 0;  // floats per token
};

struct DecoderBuffers {
  /// Block buffers, in table order. inv*: 1/rms per row; lse: per head.
  enum BlockBuffer : int {
    kX,     // the block's input
    kN1,    // attention-norm output
    kQ,     // queries after their norm and the rotary
    kK,     // keys, the same
    kV,     // values
    kQRaw,  // queries before their per-head norm (q/k norms only)
    kKRaw,  // keys before theirs
    kInvQ,  // 1/rms of each (token, head) of the q norm
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
    kSharedBuffers
  };

  std::vector<ActivationBuffer> block;   // kBlockBuffers, then h and xd of each projection
  std::vector<ActivationBuffer> shared;  // kSharedBuffers
  /// The adapter buffers of projection p: its x_d A^T and its dropped-out input.
  static int h(int p) { return kBlockBuffers + 2 * p; }
  static int xd(int p) { return kBlockBuffers + 2 * p + 1; }
};

/// The table of a spec and configuration; `targets[p]`: projection p has an adapter.
DecoderBuffers decoder_buffers(const DecoderSpec& s, const ModelConfig& cfg,
                               const std::vector<bool>& targets);

}  // namespace kqlora
