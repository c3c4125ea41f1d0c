#pragma once
// A decoder-only transformer described as plain data: what sets one model family apart from
// another (Llama, Mistral, Qwen2, Qwen3, Gemma 2/3, Phi-3, ...; docs/MODELS.md), read by one
// decoder (nn/causal_lm.hpp) whose forward and backward are written once. A family file
// (src/nn/families/) builds the spec from config.json; nothing else knows families.
//
// Per layer l, with x the block's input:
//   h = norm_attn_in(x) (when present, else x: OLMo 2's post-norm blocks)
//   slots q, k, v = the projections reading h
//   q, k = norm_q(q), norm_k(k) per head or over the whole projection (when present);
//   q, k, v clamped to [-clip_qkv, clip_qkv] (when set); rope(q), rope(k) (the layer's
//   rope, unless the layer has none: SmolLM3's no_rope_layers)
//   a = attention(q, k, v; attn_scale, attn_softcap, the layer's window)
//   o = o projection of a; o = norm_attn_out(o) (when present: Gemma's sandwich)
//   o = o * residual_multiplier (when set: Granite)
//   m = x + o;  h2 = norm_mlp_in(m) (when present, else m); slots gate, up = the
//   projections reading h2
//   d = down projection of act(gate) * up; d = norm_mlp_out(d) (when present);
//   d = d * residual_multiplier (when set); x' = m + d
//   (a sparse layer: d = the experts' weighted sum, plus a shared expert's output times
//   sigmoid(h2 g^T) when the family has one)
// then norm_final and the LM head (logits / logits_divisor when set, final_softcap) with
// the cross-entropy. Each product by a multiplier rounds once in a bfloat16 run, the
// multiplier itself unrounded (a Python float times a tensor).

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kqlora/nn/elementwise.hpp"
#include "kqlora/nn/rms_norm.hpp"

namespace kqlora {

/// What a projection reads: the attention norm's output, the attention's (o's input), the
/// MLP norm's, act(gate) * up, a Gated DeltaNet mixer's output (out_proj's input), the
/// block's output after its MLP (Gemma 4's per_layer_input_gate), or act(that gate) times
/// the layer's per-layer input (per_layer_projection).
enum class ProjectionInput {
  attn_norm,
  attn_out,
  mlp_norm,
  mlp_act,
  linear_out,
  block_out,
  ple_act
};

/// Where a projection's output columns go, in order (a fused qkv_proj writes [q | k | v]).
/// lin_*: a Gated DeltaNet layer's in_proj_qkv, in_proj_z, in_proj_b, in_proj_a and
/// out_proj (docs/MODELS.md, "Gated DeltaNet"). ple_*: Gemma 4's per_layer_input_gate and
/// per_layer_projection.
enum class Slot {
  q,
  k,
  v,
  o,
  gate,
  up,
  down,
  lin_qkv,
  lin_z,
  lin_b,
  lin_a,
  lin_out,
  ple_gate,
  ple_out
};
constexpr int kSlots = 14;

/// A layer's token mixer: softmax attention, or a Gated DeltaNet (linear attention).
enum class Mixer { attention, linear };

/// The mixer a slot belongs to (the MLP's slots: neither; `none`).
inline bool attention_slot(Slot s) {
  return s == Slot::q || s == Slot::k || s == Slot::v || s == Slot::o;
}
inline bool linear_slot(Slot s) {
  return s == Slot::lin_qkv || s == Slot::lin_z || s == Slot::lin_b || s == Slot::lin_a ||
         s == Slot::lin_out;
}

/// Where a norm sits (docs/MODELS.md): a block's attention input, attention output
/// (sandwich), MLP input, MLP output (sandwich), the per-head q and k norms, the final norm,
/// the per-head v norm (Gemma 4's, without a weight: NormKind::unit), Gemma 4's
/// post_per_layer_input_norm (a layer's) and per_layer_projection_norm (the model's, over
/// the per-layer input width).
/// Gemma 4's MoE block: post_feedforward_layernorm_1 (the dense MLP's output),
/// pre_feedforward_layernorm_2 (the experts' input), post_feedforward_layernorm_2 (theirs).
enum class NormRole {
  attn_in,
  attn_out,
  mlp_in,
  mlp_out,
  q,
  k,
  final,
  v,
  ple_out,
  ple_proj,
  dense_out,
  experts_in,
  experts_out
};
constexpr int kNormRoles = 13;

struct ProjectionSpec {
  std::string name;    // the LoRA target name (PEFT's): "q_proj", "qkv_proj", ...
  std::string module;  // its path under a layer: "self_attn.q_proj"
  ProjectionInput input = ProjectionInput::attn_norm;
  std::vector<Slot> slots;  // one, or several for a fused projection
  bool bias = false;        // a frozen bias "<module>.bias"
  // > 0: a fused projection whose columns come in `groups` equal groups, each holding its
  // share of every piece (DecoderSpec::pieces) in turn: Qwen3-Next's in_proj_qkvz is, per
  // key head h, [q_h | k_h | v_h | z_h] (the value heads of key head h), in_proj_ba
  // [b_h | a_h]. 0: the slots one after another.
  int64_t groups = 0;
};

/// Columns [col0, col0 + width) of a slot's buffer: a share of a grouped projection's
/// output (Gated DeltaNet's lin_qkv is three: q, k and v).
struct SlotPiece {
  Slot slot;
  int64_t col0, width;
};

struct NormSpec {
  std::string module;  // under a layer ("input_layernorm") or, the final norm, "model.norm"
  NormRole role = NormRole::attn_in;
  NormKind kind = NormKind::scale;
  bool whole = false;  // q and k norms: over the whole projection (OLMoE), not per head
};

/// One rotary table: inverse frequencies of the rotated dims (rotary_dim / 2 of them) and
/// a factor on cos and sin. Longrope: a second set used for sequences of more than
/// `long_above` positions.
struct RopeSpec {
  std::vector<float> inv_freq, inv_freq_long;
  double theta = 10000.0;        // the base the frequencies come from, before any scaling
  std::string type = "default";  // config.json's rope_type (longrope for su and yarn)
  int64_t long_above = 0;        // 0: one set
  float attention_factor = 1.0f;
  int64_t rotary_dim = 0;  // <= head_dim; the rest of each head passes through

  const std::vector<float>& for_positions(int64_t S) const {
    return long_above > 0 && S > long_above ? inv_freq_long : inv_freq;
  }
};

/// How a sparse MLP's router picks and weighs its experts (docs/MODELS.md, "Experts").
enum class RouterKind {
  softmax_topk,  // softmax over all experts in float32, then the top k (Qwen-MoE, Mixtral, OLMoE)
  topk_softmax   // the top k logits, then a softmax over those k (gpt-oss)
};

/// The most experts a token may have (a router's top k; the combine sorts them in place):
/// far above any released model's 8.
constexpr int64_t kMaxTopK = 32;

/// A sparse MLP: E experts, each a gated MLP of its own intermediate size, k of them per
/// token chosen by a router (a frozen [E, hidden] linear), their outputs summed with the
/// routing weights. No token is dropped; ties in the top k go to the lower expert index.
struct ExpertsSpec {
  int64_t experts = 0;  // E; 0: the model has no sparse MLP
  int64_t top_k = 0;
  int64_t intermediate = 0;  // each expert's (moe_intermediate_size)
  bool norm_topk = false;    // the k weights renormalised to sum to 1
  RouterKind router = RouterKind::softmax_topk;
  std::string router_module = "mlp.gate";      // its weight: <layer>.<module>.weight [E, hidden]
  std::string experts_module = "mlp.experts";  // expert j's: <layer>.<module>.<j>.<name>.weight
  std::string gate_name = "gate_proj", up_name = "up_proj", down_name = "down_proj";
  // transformers 5's names of the same (its save_pretrained's fused layout, read too):
  // <layer>.<fused_module>.gate_up_proj [E, 2I, hidden], .down_proj [E, hidden, I], and the
  // router <layer>.<fused_router>.weight
  std::string fused_module = "mlp.experts", fused_router = "mlp.gate";
  double aux_loss_coef = 0;  // router_aux_loss_coef
  bool aux_loss = false;     // output_router_logits: the load-balancing loss is added
  // A shared expert beside the routed ones (Qwen2-MoE): the dense MLP's projections, of
  // width shared_intermediate, under shared_module (<layer>.mlp.shared_expert.gate_proj,
  // ...), its output times sigmoid(x g^T), g the [1, hidden] <shared_gate_module>.weight
  // (frozen, dense), added to the experts'.
  int64_t shared_intermediate = 0;  // 0: none
  std::string shared_module = "mlp.shared_expert", shared_gate_module = "mlp.shared_expert_gate";
  // gpt-oss: a router bias (<router_module>.bias [E], in the logits), expert biases (gate
  // and up's from <fused_module>.gate_up_proj_bias [E, 2I], down's from .down_proj_bias
  // [E, hidden]), and the clamped SwiGLU: g = min(gate, limit), u = clamp(up, -limit, limit),
  // act = g sigmoid(alpha g) (u + 1) (limit 0: the family's plain activation).
  bool router_bias = false, expert_bias = false;
  float swiglu_alpha = 0, swiglu_limit = 0;
  // How the experts are stored besides the hub's per-expert tensors: `rows`, transformers
  // 5's [E, 2I, hidden] gate_up_proj (gate rows, then up rows) and [E, hidden, I] down_proj;
  // `interleaved`, gpt-oss's [E, hidden, 2I] gate_up_proj (gate in even, up in odd columns)
  // and [E, I, hidden] down_proj, or their MXFP4 _blocks and _scales (docs/MODELS.md).
  enum class Layout { rows, interleaved } layout = Layout::rows;
  // Gemma 4's MoE block: the dense MLP and the experts side by side on every sparse layer,
  // each reading the residual through its own norm (the experts' NormRole::experts_in),
  // their outputs normalised apart (dense_out, experts_out) and summed; the router reads
  // unitnorm(x) * <router_scale> * hidden^-1/2 (<layer>.<router_scale> [hidden]), and each
  // chosen expert's weight, after the renormalisation, is times <per_expert_scale> [E].
  bool beside = false;
  std::string router_scale, per_expert_scale;
};

struct LayerSpec {
  int64_t window = 0;   // 0: full attention; else key k visible to query q iff q - k < window
  int rope = 0;         // index into DecoderSpec::ropes
  bool sparse = false;  // its MLP is the experts (DecoderSpec::experts), not the dense one
  bool rotary = true;   // false: q and k are not rotated (SmolLM3's no_rope_layers)
  Mixer mixer = Mixer::attention;
  // Gemma 4's full-attention layers: a head size and key/value head count of their own (0:
  // the spec's), and v = k_proj's raw output (attention_k_eq_v: no v_proj; v then takes the
  // v norm as any layer's v does)
  int64_t head_dim = 0, kv_heads = 0;
  bool k_eq_v = false;
  // Gemma 4's key/value sharing: >= 0, the layer whose keys and values (after their norms
  // and rotary) this one attends over, having no k_proj, v_proj or k/v norms of its own;
  // its gradients flow back into that layer's. -1: its own.
  int64_t kv_source = -1;
  int64_t mlp_width = 0;  // 0: intermediate (Gemma 4's double-wide MLP of sharing layers)
};

/// The Gated DeltaNet layers' sizes and frozen tensors (docs/MODELS.md, "Gated DeltaNet"):
/// under <layer>.<module>: conv1d.weight [conv_dim, 1, kernel], dt_bias and A_log
/// [value_heads], norm.weight [value_dim / value_heads].
struct LinearAttentionSpec {
  int64_t key_heads = 0, value_heads = 0, key_dim = 0, value_dim = 0;  // per head: dk, dv
  int64_t kernel = 4;
  std::string module = "linear_attn";
  int64_t key_width() const { return key_heads * key_dim; }
  int64_t value_width() const { return value_heads * value_dim; }
  int64_t conv_width() const { return 2 * key_width() + value_width(); }
};

struct DecoderSpec {
  std::string model_type;  // config.json's
  int64_t vocab = 0, hidden = 0, intermediate = 0, layers = 0, heads = 0, kv_heads = 0;
  int64_t head_dim = 0, max_positions = 0;
  double norm_eps = 1e-6;
  std::vector<ProjectionSpec> projections;  // table order; every slot once
  std::vector<NormSpec> norms;              // per-layer norms and the final one
  Activation mlp_activation = Activation::silu;
  float embed_scale = 0;          // 0: none; else x = embed * R(scale) (Gemma: sqrt(hidden))
  float embed_multiplier = 0;     // 0: none; else x = embed * m, m unrounded (Granite)
  float residual_multiplier = 0;  // 0: none; else both sublayers' outputs times it (Granite)
  float logits_divisor = 0;       // 0: none; else logits / d before the loss (Granite)
  float attn_scale = 0;           // scores = attn_scale * q k^T
  float attn_softcap = 0;         // 0: none; else s = c tanh(s / c)
  float final_softcap = 0;        // the same on the logits
  float clip_qkv = 0;             // 0: none; else q, k (after their norms) and v clamped to [-c, c]
  bool sinks = false;             // per-head sink logits self_attn.sinks [heads] (gpt-oss)
  // Qwen3.5's gated attention: q_proj writes [q_h | gate_h] per head (2 head_dim each) and
  // the attention output is multiplied by sigmoid(gate) before o_proj.
  bool attn_output_gate = false;
  // Gemma 4: each layer's output (its residual stream) times its frozen [1] tensor
  // <layer>.layer_scalar
  bool layer_scalar = false;
  // Gemma 4's per-layer inputs (nn/per_layer_input.hpp): P = hidden_size_per_layer_input
  // (0: none) and the rows of model.embed_tokens_per_layer [ple_vocab, layers * P]
  int64_t ple_width = 0, ple_vocab = 0;
  // Its table's values are bfloat16 (config.json's dtype): held so, at 2 bytes a value
  // (ParamEntry::compact; in a bfloat16 run it is held so anyway)
  bool ple_table_bf16 = false;
  LinearAttentionSpec linear;  // the Gated DeltaNet layers' (LayerSpec::mixer linear)
  bool tied = false;
  std::vector<RopeSpec> ropes;
  std::vector<LayerSpec> layer;    // one per layer
  ExpertsSpec experts;             // the sparse layers' MLP
  std::vector<std::string> notes;  // for the log (defaults taken)
  // A multimodal directory (Qwen3.5's qwen3_5): where its files keep the "model.*"
  // tensors, and the prefixes of what is not read, each with why.
  std::string file_prefix;
  std::vector<std::pair<std::string, std::string>> skipped;
  // Where the model a user loads from that directory the usual way
  // (AutoModelForCausalLM) keeps the text decoder's "model.*" modules: empty, or (Gemma 4,
  // whose Gemma4ForConditionalGeneration that is) "model.language_model."; the exports name
  // the adapters and weights so, and copy the skipped tensors through (docs/MODELS.md).
  std::string loaded_prefix;

  int64_t q_features() const { return heads * head_dim; }
  int64_t kv_features() const { return kv_heads * head_dim; }
  /// Layer l's head size and key/value heads (LayerSpec's, else the spec's) and widths.
  int64_t head_dim_of(int64_t l) const {
    const LayerSpec& at = layer[static_cast<size_t>(l)];
    return at.head_dim > 0 ? at.head_dim : head_dim;
  }
  int64_t kv_heads_of(int64_t l) const {
    const LayerSpec& at = layer[static_cast<size_t>(l)];
    return at.kv_heads > 0 ? at.kv_heads : kv_heads;
  }
  int64_t q_features(int64_t l) const { return heads * head_dim_of(l); }
  int64_t kv_features(int64_t l) const { return kv_heads_of(l) * head_dim_of(l); }
  /// The widest q, k/v and head of any layer (the attention's buffers are sized by them).
  int64_t widest_q() const;
  int64_t widest_kv() const;
  int64_t widest_head() const;
  int64_t slot_width(Slot s) const;
  int64_t in_features(const ProjectionSpec& p) const;
  int64_t out_features(const ProjectionSpec& p) const;
  /// The norm in a role, or null.
  const NormSpec* norm(NormRole r) const;
  /// The width a norm normalises over (and its weight's length): hidden, or a q/k norm's
  /// head_dim, or its whole projection's width.
  int64_t norm_width(const NormSpec& n) const;
  /// The same in layer l (its head size).
  int64_t norm_width(const NormSpec& n, int64_t l) const;
  /// A grouped projection's pieces in the order each group holds them (p.groups > 0).
  std::vector<SlotPiece> pieces(const ProjectionSpec& p) const;
  /// The index of the projection writing slot s.
  int writer(Slot s) const;
  /// Whether layer l has projection p: a sparse layer has the dense MLP's projections only
  /// as its shared expert (docs/MODELS.md, "Experts"); an attention layer the attention's,
  /// a Gated DeltaNet layer its own.
  bool has_projection(int64_t l, const ProjectionSpec& p) const {
    const LayerSpec& at = layer[static_cast<size_t>(l)];
    if (attention_slot(p.slots[0]))
      return at.mixer == Mixer::attention && !(at.k_eq_v && p.slots[0] == Slot::v) &&
             !(at.kv_source >= 0 && (p.slots[0] == Slot::k || p.slots[0] == Slot::v));
    if (linear_slot(p.slots[0])) return at.mixer == Mixer::linear;
    return !at.sparse || !reads_mlp(p) || shared_expert(l) || experts.beside;
  }
  /// Whether any layer has the mixer.
  bool any_mixer(Mixer m) const {
    for (const LayerSpec& at : layer)
      if (at.mixer == m) return true;
    return false;
  }
  /// Whether p is one of the dense MLP's projections.
  static bool reads_mlp(const ProjectionSpec& p) {
    return p.input == ProjectionInput::mlp_norm || p.input == ProjectionInput::mlp_act;
  }
  /// Whether layer l runs a dense MLP beside its experts: a shared expert, or Gemma 4's.
  bool dense_beside_experts(int64_t l) const {
    return shared_expert(l) || (layer[static_cast<size_t>(l)].sparse && experts.beside);
  }
  /// Whether layer l has a shared expert (its dense MLP projections are that).
  bool shared_expert(int64_t l) const {
    return layer[static_cast<size_t>(l)].sparse && experts.shared_intermediate > 0;
  }
  /// Layer l's dense MLP width: intermediate (or its own), or a shared expert's.
  int64_t mlp_width(int64_t l) const {
    const LayerSpec& at = layer[static_cast<size_t>(l)];
    return shared_expert(l)   ? experts.shared_intermediate
           : at.mlp_width > 0 ? at.mlp_width
                              : intermediate;
  }
  /// Whether another layer attends over layer l's keys and values (kv_source).
  bool kv_producer(int64_t l) const {
    for (const LayerSpec& at : layer)
      if (at.kv_source == l) return true;
    return false;
  }
  /// Where producer l's keys and values start in the shared buffer (DecoderBuffers
  /// kSharedKV: each producer's k then v, T x kv_features floats each).
  int64_t kv_shared_offset(int64_t l) const {
    int64_t off = 0;
    for (int64_t p = 0; p < l; ++p)
      if (kv_producer(p)) off += 2 * kv_features(p);
    return off;
  }
  /// Projection p's module path under layer l (a shared expert's under shared_module).
  std::string module_of(int64_t l, const ProjectionSpec& p) const;
  /// Slot and projection sizes in layer l (a shared expert's MLP width).
  int64_t slot_width(Slot s, int64_t l) const;
  int64_t in_features(const ProjectionSpec& p, int64_t l) const;
  int64_t out_features(const ProjectionSpec& p, int64_t l) const;
  /// The widest dense MLP of any layer that has one (0: none).
  int64_t widest_mlp() const;
  /// Whether any layer has the experts.
  bool any_sparse_mlp() const;
};

/// Parses config.json's text into a spec through the family its model_type names;
/// InputError naming `source`, the field and its value for anything missing, malformed,
/// unsupported or unknown (docs/MODELS.md lists what each family reads and accepts).
DecoderSpec parse_decoder_config(const std::string& text, const std::string& source);

/// The model_types kqlora reads.
std::vector<std::string> decoder_families();

}  // namespace kqlora
