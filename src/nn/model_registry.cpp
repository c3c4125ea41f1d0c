#include "kqlora/nn/model_registry.hpp"

#include <algorithm>
#include <map>
#include <type_traits>

#include "kqlora/core/checked_size.hpp"
#include "kqlora/core/error.hpp"
#include "kqlora/core/gemm_engine.hpp"
#include "kqlora/nn/causal_lm.hpp"
#include "kqlora/nn/decoder_buffers.hpp"
#include "kqlora/nn/lora_stack.hpp"

namespace kqlora {

namespace {
using Exec = Kokkos::DefaultExecutionSpace;
using Mem = Exec::memory_space;

int64_t mul(int64_t a, int64_t b) {
  return checked_mul(a, b, "the model's size");
}
int64_t add(int64_t a, int64_t b) {
  return checked_add(a, b, "the model's size");
}

ModelFootprint lora_stack_footprint(const ModelConfig& c) {
  const int64_t L = c.num_layers, d = c.dim, r = c.rank;
  ModelFootprint f;
  f.tensors = mul(L, c.bias ? 4 : 3);
  f.nf4_elements = mul(L, mul(d, d));
  f.largest_nf4_elements = mul(d, d);
  f.trainable_elements = mul(L, add(mul(2, mul(d, r)), c.bias ? d : 0));
  return f;
}

// Per layer: its input, output and the gradient flowing back (rows x dim floats each) and
// the rank-wide intermediate; plus one layer's dequantized weight (the panel workspace).
// bfloat16 products on bfloat16 hardware (core/gemm_engine.hpp): the products' 16-bit operand
// copies (16 and 4 MiB at most) with oneDNN's own packing of one of them.
int64_t bf16_operand_copies(const ModelConfig& c) {
  return std::is_same<Mem, Kokkos::HostSpace>::value && c.dtype == DType::bfloat16 &&
                 host_bf16_products()
             ? int64_t(32) << 20
             : 0;
}

int64_t lora_stack_activations(const ModelConfig& c, int64_t rows, int64_t) {
  const int64_t per_layer = mul(rows, add(mul(3, c.dim), c.rank));
  return add(mul(4, add(mul(c.num_layers, per_layer), mul(c.dim, c.dim))), bf16_operand_copies(c));
}

// From the decoder's buffer table (nn/decoder_buffers.hpp): what every layer keeps (each
// block's buffers, with activation checkpointing its input only; bfloat16 values in 2 bytes
// when kept so), one block's float32 buffers (those a layer does not keep, and those it keeps
// in 16 bits), the shared ones, and the workspaces: the attention's score blocks, the LM
// head's chunk of logits, its per-token state and losses, the NF4 products' dequantized
// panel, and the Gated DeltaNet layers' chunk states.
int64_t causal_lm_activations(const ModelConfig& c, int64_t rows, int64_t seq_len) {
  const DecoderSpec s = decoder_spec_of(c);
  const DecoderBuffers b =
      decoder_buffers(s, c, parse_lora_targets(c.lora_targets, s, "lora_targets"));
  const int64_t S = std::max<int64_t>(seq_len, 1), tokens = mul(rows, S);
  const bool bf16_kept = keeps_bf16_activations<Mem>(c);
  int64_t layer_bytes = 0, one_block = 0, shared = 0;  // per token
  for (size_t i = 0; i < b.block.size(); ++i) {
    const ActivationBuffer& x = b.block[i];
    const bool kept = !c.activation_checkpointing || i == DecoderBuffers::kX;
    const bool in_16_bits = bf16_kept && x.bf16_values;
    if (kept) layer_bytes = add(layer_bytes, mul(in_16_bits ? 2 : 4, x.width));
    if (!kept || in_16_bits) one_block = add(one_block, x.width);
  }
  for (const auto& x : b.shared) shared = add(shared, x.width);
  const int64_t logits = CrossEntropyWorkspace<Mem>().floats(tokens, s.vocab, c.bf16());
  const int64_t workspaces = add(
      add(AttentionWorkspace<Mem>::floats(
              S, s.attn_softcap > 0, attention_batches_heads<Mem>() ? s.heads : 1, s.widest_head()),
          logits),
      mul(2, tokens));                     // (the per-token losses are doubles)
  const int64_t panel = int64_t(8) << 20;  // linear_nf4's dequantized panel (its default)
  // bfloat16 products on bfloat16 hardware: the head's 16-bit copy (nn/lm_head_cross_entropy.hpp)
  // too.
  const int64_t bf16_unit =
      bf16_operand_copies(c) > 0 ? add(mul(2, mul(s.vocab, s.hidden)), bf16_operand_copies(c)) : 0;
  // The Gated DeltaNet layers' chunk states (each layer's, or one set with activation
  // checkpointing): Hv dk dv floats a chunk of 64 tokens of a row (a packed row's
  // documents start chunks of their own: a few more).
  int64_t states = 0;
  if (s.any_mixer(Mixer::linear)) {
    int64_t linear_layers = 0;
    for (const LayerSpec& l : s.layer) linear_layers += l.mixer == Mixer::linear ? 1 : 0;
    const LinearAttentionSpec& L = s.linear;
    states = mul(mul(mul(rows, (S + 63) / 64), mul(L.value_heads, mul(L.key_dim, L.value_dim))),
                 mul(4, c.activation_checkpointing ? 1 : linear_layers));
  }
  return add(add(add(add(mul(tokens, mul(s.layers, layer_bytes)),
                         mul(4, add(mul(tokens, add(one_block, shared)), workspaces))),
                     panel),
                 bf16_unit),
             states);
}

std::map<std::string, ModelKind>& registry() {
  // Built-in kinds registered on first use (no static-initialisation order to rely on).
  static std::map<std::string, ModelKind> r = [] {
    std::map<std::string, ModelKind> m;
    m["lora_stack"] = {
        [](const ModelConfig& c) { return LoraStack<Exec>::make_table(c); },
        [](const Exec& exec, const ModelConfig& c, bool zeroed) {
          return std::unique_ptr<DefaultModel>(std::make_unique<LoraStack<Exec>>(exec, c, zeroed));
        },
        {"dim", "num_linears", "lora_rank", "lora_alpha", "lora_dropout", "lora_b_init", "bias",
         "activation", "block_size", "scaler_block_size", "dtype", "seed", "loss",
         "activation_checkpointing"},
        lora_stack_footprint,
        lora_stack_activations,
        false,
        "dim, num_linears, lora_rank, micro_bs"};
    m["causal_lm"] = {
        [](const ModelConfig& c) { return CausalLm<Exec>::make_table(c); },
        [](const Exec& exec, const ModelConfig& c, bool zeroed) {
          return std::unique_ptr<DefaultModel>(std::make_unique<CausalLm<Exec>>(exec, c, zeroed));
        },
        {"hf_model_dir", "lora_targets", "lora_rank", "lora_alpha", "lora_dropout", "lora_b_init",
         "block_size", "scaler_block_size", "dtype", "seed", "loss", "activation_checkpointing",
         "activation_dtype", "checkpoint_base", "router_aux_loss"},
        [](const ModelConfig& c) { return footprint_of(CausalLm<Exec>::make_table(c)); },
        causal_lm_activations,
        true,
        "hf_model_dir, micro_bs, the data's rows"};
    return m;
  }();
  return r;
}
}  // namespace

ModelFootprint footprint_of(const ParamTable& t) {
  ModelFootprint f;
  std::vector<int64_t> group_nf4(static_cast<size_t>(t.num_groups()), 0);
  for (const auto& e : t.entries) {
    f.tensors += 1;
    const int64_t n = e.numel();
    if (e.kind == ParamKind::nf4) {
      f.nf4_elements = checked_add(f.nf4_elements, n, "the model's size");
      f.largest_nf4_elements = std::max(f.largest_nf4_elements, n);
      int64_t& g = group_nf4[static_cast<size_t>(e.group)];
      g = checked_add(g, n, "the model's size");
      f.largest_group_nf4_elements = std::max(f.largest_group_nf4_elements, g);
    }
    if (e.kind == ParamKind::dense)
      f.dense_elements = checked_add(f.dense_elements, n, "the model's size");
    if (e.kind == ParamKind::dense && e.compact)
      f.compact_dense_elements = checked_add(f.compact_dense_elements, n, "the model's size");
    if (e.kind == ParamKind::trainable)
      f.trainable_elements = checked_add(f.trainable_elements, n, "the model's size");
  }
  return f;
}

std::string canonical_model_kind(const std::string& kind) {
  return kind == "llama" ? "causal_lm" : kind;
}

void register_model(const std::string& kind, ModelKind k) {
  registry()[kind] = std::move(k);
}

const ModelKind& model_kind(const std::string& kind) {
  const auto it = registry().find(canonical_model_kind(kind));
  if (it == registry().end()) {
    std::string known;
    for (const auto& name : model_kinds()) known += (known.empty() ? "" : "|") + name;
    KQLORA_INPUT_CHECK(false, "model: expected " << known << ", got '" << kind << "'");
  }
  return it->second;
}

std::vector<std::string> model_kinds() {
  std::vector<std::string> v;
  for (const auto& kv : registry()) v.push_back(kv.first);
  return v;
}

}  // namespace kqlora
