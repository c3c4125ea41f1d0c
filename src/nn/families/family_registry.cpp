// The families by config.json's model_type, and the spec's derived sizes.
#include <algorithm>
#include <array>
#include <utility>

#include "families.hpp"
#include "family_common.hpp"
#include "kqlora/core/error.hpp"
#include "kqlora/core/json.hpp"
#include "kqlora/nn/decoder_spec.hpp"

namespace kqlora {

namespace {

using Builder = DecoderSpec (*)(impl::HfConfigReader&, const std::string&);

// One row per model_type (a family file may serve several).
const std::vector<std::pair<std::string, Builder>>& families() {
  static const std::vector<std::pair<std::string, Builder>> table = {
      {"llama", impl::llama_family},
      {"mistral", impl::llama_family},
      {"qwen2", impl::qwen2_family},
      {"qwen3", impl::qwen3_family},
      {"gemma2", impl::gemma2_family},
      {"gemma3_text", impl::gemma3_family},
      {"phi3", impl::phi3_family},
      {"qwen3_moe", impl::qwen3_moe_family},
      {"mixtral", impl::mixtral_family},
      {"olmoe", impl::olmoe_family},
      {"qwen2_moe", impl::qwen2_moe_family},
      {"gpt_oss", impl::gpt_oss_family},
      {"smollm3", impl::smollm3_family},
      {"olmo2", impl::olmo2_family},
      {"olmo3", impl::olmo3_family},
      {"granite", impl::granite_family},
      {"qwen3_5_text", impl::qwen3_5_family},
      {"qwen3_5", impl::qwen3_5_multimodal_family},
      {"qwen3_5_moe_text", impl::qwen3_5_moe_family},
      {"qwen3_5_moe", impl::qwen3_5_multimodal_family},
      {"qwen3_next", impl::qwen3_next_family},
      {"gemma4_text", impl::gemma4_family},
      {"gemma4", impl::gemma4_multimodal_family},
  };
  return table;
}

std::string family_list() {
  std::string list;
  for (const auto& [name, build] : families()) list += (list.empty() ? "\"" : ", \"") + name + "\"";
  return list;
}

// What the decoder relies on (a family file's mistake, caught before it computes): every
// slot written once; o and down unfused; a fused projection's slots read one input; q and
// k norms together; a layer entry per layer, each rope index in range.
void validate(const DecoderSpec& s) {
  std::array<int, kSlots> writers{};
  for (const auto& p : s.projections) {
    KQLORA_CHECK(!p.slots.empty(), s.model_type << ": projection " << p.name << " has no slot");
    for (Slot slot : p.slots) ++writers[static_cast<int>(slot)];
    for (Slot slot : {Slot::o, Slot::down})
      KQLORA_CHECK(
          p.slots.size() == 1 || std::find(p.slots.begin(), p.slots.end(), slot) == p.slots.end(),
          s.model_type << ": " << p.name << " fuses o or down");
    const auto input_of = [](Slot x) {
      return x == Slot::q || x == Slot::k || x == Slot::v || (linear_slot(x) && x != Slot::lin_out)
                 ? ProjectionInput::attn_norm
             : x == Slot::o        ? ProjectionInput::attn_out
             : x == Slot::lin_out  ? ProjectionInput::linear_out
             : x == Slot::down     ? ProjectionInput::mlp_act
             : x == Slot::ple_gate ? ProjectionInput::block_out
             : x == Slot::ple_out  ? ProjectionInput::ple_act
                                   : ProjectionInput::mlp_norm;
    };
    for (Slot slot : p.slots)  // (a fused projection stays within one mixer)
      KQLORA_CHECK(attention_slot(slot) == attention_slot(p.slots[0]) &&
                       linear_slot(slot) == linear_slot(p.slots[0]),
                   s.model_type << ": " << p.name << " fuses slots of two mixers");
    for (Slot slot : p.slots)
      KQLORA_CHECK(input_of(slot) == p.input,
                   s.model_type << ": " << p.name << " writes a slot of another input");
  }
  // (each slot of a mixer some layer has written once; a mixer no layer has, none of its)
  for (int i = 0; i < kSlots; ++i) {
    const Slot slot = static_cast<Slot>(i);
    const bool used = attention_slot(slot) ? s.any_mixer(Mixer::attention)
                      : linear_slot(slot)  ? s.any_mixer(Mixer::linear)
                      : slot == Slot::ple_gate || slot == Slot::ple_out ? s.ple_width > 0
                                                                        : true;
    KQLORA_CHECK(writers[i] == (used ? 1 : 0), s.model_type << ": a slot is not written once");
  }
  KQLORA_CHECK(!s.any_mixer(Mixer::linear) ||
                   (s.linear.key_heads >= 1 && s.linear.value_heads % s.linear.key_heads == 0 &&
                    s.linear.key_dim >= 1 && s.linear.value_dim >= 1 && s.linear.kernel >= 1),
               s.model_type << ": Gated DeltaNet layers without valid sizes");
  KQLORA_CHECK((s.norm(NormRole::q) == nullptr) == (s.norm(NormRole::k) == nullptr),
               s.model_type << ": q and k norms come together");
  // (the clamp's backward recomputes the normalised q and k: it needs their norms)
  KQLORA_CHECK(s.clip_qkv == 0 || s.norm(NormRole::q) != nullptr,
               s.model_type << ": clip_qkv without q/k norms");
  KQLORA_CHECK(s.norm(NormRole::final) != nullptr, s.model_type << ": no final norm");
  // (a block without an input norm has its output norm: OLMo 2's post-norms)
  KQLORA_CHECK(s.norm(NormRole::attn_in) != nullptr || s.norm(NormRole::attn_out) != nullptr,
               s.model_type << ": an attention sublayer with neither norm");
  KQLORA_CHECK(s.norm(NormRole::mlp_in) != nullptr || s.norm(NormRole::mlp_out) != nullptr,
               s.model_type << ": an MLP sublayer with neither norm");
  KQLORA_CHECK(s.logits_divisor == 0 || s.final_softcap == 0,
               s.model_type << ": a logits divisor and a soft-cap together");
  KQLORA_CHECK(static_cast<int64_t>(s.layer.size()) == s.layers,
               s.model_type << ": one LayerSpec per layer");
  for (const auto& l : s.layer)
    KQLORA_CHECK(l.rope >= 0 && l.rope < static_cast<int>(s.ropes.size()),
                 s.model_type << ": a layer's rope is out of range");
  const ExpertsSpec& e = s.experts;
  KQLORA_CHECK(!s.any_sparse_mlp() ||
                   (e.experts >= 1 && e.top_k >= 1 && e.top_k <= e.experts && e.intermediate >= 1),
               s.model_type << ": a sparse layer without a valid experts spec");
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
  if (type == "granitemoehybrid")
    r.fail("model_type",
           "is \"granitemoehybrid\" (Granite 4's hybrid of Mamba-2 and attention layers); "
           "kqlora has no Mamba-2 layer: its Granite is the 3.x dense \"granite\"");
  const auto& table = families();
  const auto it =
      std::find_if(table.begin(), table.end(), [&](const auto& f) { return f.first == type; });
  if (it == table.end())
    r.fail("model_type", "is " + json::quote(type) + "; supported: " + family_list());
  DecoderSpec s = it->second(r, type);
  impl::bound_expert_sizes(r, s);
  r.finish();
  validate(s);
  return s;
}

int64_t DecoderSpec::slot_width(Slot s) const {
  switch (s) {
    case Slot::q:  // (a gated attention's q_proj writes [q_h | gate_h] per head)
      return attn_output_gate ? 2 * q_features() : q_features();
    case Slot::k:
    case Slot::v:
      return kv_features();
    case Slot::o:
    case Slot::down:
    case Slot::lin_out:
      return hidden;
    case Slot::lin_qkv:
      return linear.conv_width();
    case Slot::lin_z:
      return linear.value_width();
    case Slot::lin_b:
    case Slot::lin_a:
      return linear.value_heads;
    case Slot::ple_gate:
      return ple_width;
    case Slot::ple_out:
      return hidden;
    default:
      return intermediate;
  }
}

std::vector<SlotPiece> DecoderSpec::pieces(const ProjectionSpec& p) const {
  std::vector<SlotPiece> out;
  for (Slot s : p.slots) {
    if (s == Slot::lin_qkv) {  // [q | k | v] in the buffer, q_h, k_h, v_h in a group
      const int64_t kw = linear.key_width();
      out.push_back({s, 0, kw});
      out.push_back({s, kw, kw});
      out.push_back({s, 2 * kw, linear.value_width()});
    } else {
      out.push_back({s, 0, slot_width(s)});
    }
  }
  return out;
}

int64_t DecoderSpec::slot_width(Slot s, int64_t l) const {
  switch (s) {
    case Slot::gate:
    case Slot::up:
      return mlp_width(l);
    case Slot::q:
      return attn_output_gate ? 2 * q_features(l) : q_features(l);
    case Slot::k:
    case Slot::v:
      return kv_features(l);
    default:
      return slot_width(s);
  }
}

int64_t DecoderSpec::in_features(const ProjectionSpec& p, int64_t l) const {
  if (p.input == ProjectionInput::attn_out) return q_features(l);
  return p.input == ProjectionInput::mlp_act ? mlp_width(l) : in_features(p);
}

int64_t DecoderSpec::widest_q() const {
  int64_t w = q_features();
  for (int64_t l = 0; l < layers; ++l) w = std::max(w, q_features(l));
  return w;
}

int64_t DecoderSpec::widest_kv() const {
  int64_t w = kv_features();
  for (int64_t l = 0; l < layers; ++l) w = std::max(w, kv_features(l));
  return w;
}

int64_t DecoderSpec::widest_head() const {
  int64_t w = head_dim;
  for (int64_t l = 0; l < layers; ++l) w = std::max(w, head_dim_of(l));
  return w;
}

int64_t DecoderSpec::out_features(const ProjectionSpec& p, int64_t l) const {
  int64_t n = 0;
  for (Slot s : p.slots) n += slot_width(s, l);
  return n;
}

std::string DecoderSpec::module_of(int64_t l, const ProjectionSpec& p) const {
  if (!shared_expert(l) || !reads_mlp(p)) return p.module;
  return experts.shared_module + p.module.substr(p.module.rfind('.'));
}

int64_t DecoderSpec::widest_mlp() const {
  int64_t w = 0;
  for (int64_t l = 0; l < layers; ++l)
    if (!layer[static_cast<size_t>(l)].sparse || dense_beside_experts(l))
      w = std::max(w, mlp_width(l));
  return w;
}

int64_t DecoderSpec::in_features(const ProjectionSpec& p) const {
  switch (p.input) {
    case ProjectionInput::attn_out:
      return q_features();
    case ProjectionInput::mlp_act:
      return intermediate;
    case ProjectionInput::linear_out:
      return linear.value_width();
    case ProjectionInput::ple_act:
      return ple_width;
    default:
      return hidden;
  }
}

int64_t DecoderSpec::out_features(const ProjectionSpec& p) const {
  int64_t n = 0;
  for (Slot s : p.slots) n += slot_width(s);
  return n;
}

bool DecoderSpec::any_sparse_mlp() const {
  return std::any_of(layer.begin(), layer.end(), [](const LayerSpec& l) { return l.sparse; });
}

const NormSpec* DecoderSpec::norm(NormRole r) const {
  for (const auto& n : norms)
    if (n.role == r) return &n;
  return nullptr;
}

int64_t DecoderSpec::norm_width(const NormSpec& n) const {
  if (n.role == NormRole::ple_proj) return ple_width;
  if (n.role != NormRole::q && n.role != NormRole::k && n.role != NormRole::v) return hidden;
  if (!n.whole) return head_dim;
  return n.role == NormRole::q ? q_features() : kv_features();
}

int64_t DecoderSpec::norm_width(const NormSpec& n, int64_t l) const {
  if (n.role == NormRole::ple_proj) return ple_width;
  if (n.role != NormRole::q && n.role != NormRole::k && n.role != NormRole::v) return hidden;
  if (!n.whole) return head_dim_of(l);
  return n.role == NormRole::q ? q_features(l) : kv_features(l);
}

int DecoderSpec::writer(Slot s) const {
  for (size_t p = 0; p < projections.size(); ++p)
    if (std::find(projections[p].slots.begin(), projections[p].slots.end(), s) !=
        projections[p].slots.end())
      return static_cast<int>(p);
  KQLORA_CHECK(false, "no projection writes a slot");
  return 0;
}

}  // namespace kqlora
