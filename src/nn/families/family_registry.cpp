// The families by config.json's model_type, and the spec's derived sizes.
#include <algorithm>
#include <utility>

#include "families.hpp"
#include "kqlora/core/error.hpp"
#include "kqlora/core/json.hpp"
#include "kqlora/nn/decoder_spec.hpp"

namespace kqlora {

namespace {

using Builder = DecoderSpec (*)(impl::HfConfigReader&, const std::string&);

// One row per model_type (a family file may serve several).
const std::vector<std::pair<std::string, Builder>>& families() {
  static const std::vector<std::pair<std::string, Builder>> table = {
      {"llama", impl::llama_family},   {"mistral", impl::llama_family},
      {"qwen2", impl::qwen2_family},   {"qwen3", impl::qwen3_family},
      {"gemma2", impl::gemma2_family}, {"gemma3_text", impl::gemma3_family},
      {"phi3", impl::phi3_family},
  };
  return table;
}

std::string family_list() {
  std::string list;
  for (const auto& [name, build] : families()) list += (list.empty() ? "\"" : ", \"") + name + "\"";
  return list;
}

}  // namespace

std::vector<std::string> decoder_families() {
  std::vector<std::string> v;
  for (const auto& f : families()) v.push_back(f.first);
  return v;
}

DecoderSpec parse_decoder_config(const std::string& text, const std::string& source) {
  const json::Value root = json::parse(text, source);
  KQLORA_INPUT_CHECK(root.kind == json::Value::Kind::object,
                     source << ": expected a JSON object (a Hugging Face config.json)");
  impl::HfConfigReader r(root, source);
  const std::string type = r.string("model_type", "", true);
  if (type == "gemma3")
    r.fail("model_type",
           "is \"gemma3\" (the multimodal Gemma 3 with a vision tower); kqlora reads its text "
           "model only from a directory whose config.json is the text_config, model_type "
           "\"gemma3_text\", with the language model's weights (docs/MODELS.md)");
  const auto& table = families();
  const auto it = std::find_if(table.begin(), table.end(),
                               [&](const auto& f) { return f.first == type; });
  if (it == table.end())
    r.fail("model_type", "is " + json::quote(type) + "; supported: " + family_list());
  DecoderSpec s = it->second(r, type);
  r.finish();
  return s;
}

int64_t DecoderSpec::slot_width(Slot s) const {
  switch (s) {
    case Slot::q:
      return q_features();
    case Slot::k:
    case Slot::v:
      return kv_features();
    case Slot::o:
    case Slot::down:
      return hidden;
    default:
      return intermediate;
  }
}

int64_t DecoderSpec::in_features(const ProjectionSpec& p) const {
  switch (p.input) {
    case ProjectionInput::attn_out:
      return q_features();
    case ProjectionInput::mlp_act:
      return intermediate;
    default:
      return hidden;
  }
}

int64_t DecoderSpec::out_features(const ProjectionSpec& p) const {
  int64_t n = 0;
  for (Slot s : p.slots) n += slot_width(s);
  return n;
}

const NormSpec* DecoderSpec::norm(NormRole r) const {
  for (const auto& n : norms)
    if (n.role == r) return &n;
  return nullptr;
}

const ProjectionSpec& DecoderSpec::writer(Slot s) const {
  for (const auto& p : projections)
    if (std::find(p.slots.begin(), p.slots.end(), s) != p.slots.end()) return p;
  KQLORA_CHECK(false, "no projection writes a slot");
  return projections.front();
}

}  // namespace kqlora
