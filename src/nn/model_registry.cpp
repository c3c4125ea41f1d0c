#include "kqlora/nn/model_registry.hpp"

#include <algorithm>
#include <map>

#include "kqlora/core/checked_size.hpp"
#include "kqlora/core/error.hpp"
#include "kqlora/nn/llama.hpp"
#include "kqlora/nn/llama_config.hpp"
#include "kqlora/nn/lora_stack.hpp"

namespace kqlora {

namespace {
using Exec = Kokkos::DefaultExecutionSpace;

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
  f.trainable_elements = mul(L, add(mul(2, mul(d, r)), c.bias ? d : 0));
  return f;
}

// Per layer: its input, output and the gradient flowing back (rows x dim floats each) and
// the rank-wide intermediate; plus one layer's dequantized weight (the panel workspace).
int64_t lora_stack_activations(const ModelConfig& c, int64_t rows, int64_t) {
  const int64_t per_layer = mul(rows, add(mul(3, c.dim), c.rank));
  return mul(4, add(mul(c.num_layers, per_layer), mul(c.dim, c.dim)));
}

// Per token and block (float32): the block's saved tensors (norms, q/k/v/o, the attention
// output, the MLP's gate, up and product) and their gradients, and each head's row of
// attention probabilities; with activation checkpointing only each block's input is kept,
// plus one block's tensors; and the LM head's logits for every token (their gradient takes
// their place). SmolLM2-135M, 4 x 256 tokens: 2.1 GiB estimated against 1.2 GiB measured
// (docs/BENCHMARKS.md), 0.5 GiB against 0.36 with activation checkpointing.
int64_t llama_activations(const ModelConfig& c, int64_t rows, int64_t seq_len) {
  const LlamaArch a = parse_llama_config(c.arch_text, c.arch_source);
  const int64_t tokens = mul(rows, std::max<int64_t>(seq_len, 1));
  const int64_t block =
      add(add(mul(8, a.hidden), mul(2, a.q_features())),
          add(mul(4, a.kv_features()),
              add(mul(4, a.intermediate), mul(a.heads, std::max<int64_t>(seq_len, 1)))));
  const int64_t kept =
      c.activation_checkpointing ? add(mul(a.layers, a.hidden), block) : mul(a.layers, block);
  return mul(4, add(mul(tokens, kept), mul(tokens, a.vocab)));
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
        lora_stack_activations};
    m["llama"] = {
        [](const ModelConfig& c) { return Llama<Exec>::make_table(c); },
        [](const Exec& exec, const ModelConfig& c, bool zeroed) {
          return std::unique_ptr<DefaultModel>(std::make_unique<Llama<Exec>>(exec, c, zeroed));
        },
        {"hf_model_dir", "lora_targets", "lora_rank", "lora_alpha", "lora_dropout", "lora_b_init",
         "block_size", "scaler_block_size", "dtype", "seed", "loss", "activation_checkpointing",
         "checkpoint_base"},
        [](const ModelConfig& c) { return footprint_of(Llama<Exec>::make_table(c)); },
        llama_activations};
    return m;
  }();
  return r;
}
}  // namespace

ModelFootprint footprint_of(const ParamTable& t) {
  ModelFootprint f;
  for (const auto& e : t.entries) {
    f.tensors += 1;
    const int64_t n = e.numel();
    if (e.kind == ParamKind::nf4)
      f.nf4_elements = checked_add(f.nf4_elements, n, "the model's size");
    if (e.kind == ParamKind::dense)
      f.dense_elements = checked_add(f.dense_elements, n, "the model's size");
    if (e.kind == ParamKind::trainable)
      f.trainable_elements = checked_add(f.trainable_elements, n, "the model's size");
  }
  return f;
}

void register_model(const std::string& kind, ModelKind k) {
  registry()[kind] = std::move(k);
}

const ModelKind& model_kind(const std::string& kind) {
  const auto it = registry().find(kind);
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
