#include "kqlora/nn/model_registry.hpp"

#include <map>

#include "kqlora/core/error.hpp"
#include "kqlora/nn/llama.hpp"
#include "kqlora/nn/lora_stack.hpp"

namespace kqlora {

namespace {
using Exec = Kokkos::DefaultExecutionSpace;

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
         "activation_checkpointing"}};
    m["llama"] = {
        [](const ModelConfig& c) { return Llama<Exec>::make_table(c); },
        [](const Exec& exec, const ModelConfig& c, bool zeroed) {
          return std::unique_ptr<DefaultModel>(std::make_unique<Llama<Exec>>(exec, c, zeroed));
        },
        {"hf_model_dir", "lora_targets", "lora_rank", "lora_alpha", "lora_dropout", "lora_b_init",
         "block_size", "scaler_block_size", "dtype", "seed", "loss", "activation_checkpointing",
         "checkpoint_base"}};
    return m;
  }();
  return r;
}
}  // namespace

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
