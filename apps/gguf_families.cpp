// kqlora's decoder families as llama.cpp runs them (docs/GGUF.md, "Families"). What
// llama.cpp computes follows from the architecture name and the keys written; each check
// below compares that with the spec the training used and refuses a difference, naming
// the config.json field behind it.
#include "gguf_families.hpp"

#include <cmath>
#include <cstdint>
#include <map>
#include <regex>
#include <sstream>

#include "kqlora/core/error.hpp"
#include "kqlora/core/json.hpp"

namespace kqlora::exporter {

namespace {

/// config.json's top-level value of `key` as JSON text ("absent" when it is not there).
std::string value_of(const json::Value& cfg, const std::string& key) {
  const json::Value* v = cfg.find(key);
  if (!v) return "absent";
  // On one line: the writer's indents dropped, a space after each separator.
  const std::string text = json::write(*v);
  std::string line;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (in_string) {
      line += ch;
      if (ch == '\\' && i + 1 < text.size()) line += text[++i];
      if (ch == '"') in_string = false;
    } else if (ch == '\n') {
      while (i + 1 < text.size() && text[i + 1] == ' ') ++i;
    } else {
      line += ch;
      in_string = ch == '"';
      if (ch == ',') line += ' ';
    }
  }
  return line;
}

bool close(double a, double b, double rtol) {
  return std::abs(a - b) <= rtol * std::abs(b);
}

/// config.json's rope object of the full-attention layers: rope_parameters (its
/// "full_attention" entry where it has one per layer type) or rope_scaling; null: none.
const json::Value* full_rope_object(const json::Value& cfg) {
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    const json::Value* v = cfg.find(key);
    if (!v || v->kind != json::Value::Kind::object) continue;
    const json::Value* full = v->find("full_attention");
    return full && full->kind == json::Value::Kind::object ? full : v;
  }
  return nullptr;
}

/// A number of a JSON object (`fallback` when absent or not a number).
double number_of(const json::Value* o, const char* key, double fallback) {
  const json::Value* v = o ? o->find(key) : nullptr;
  return v && v->kind == json::Value::Kind::number ? v->number : fallback;
}

/// The divisors of the base frequencies that llama.cpp's YaRN gives (ggml's rope_yarn):
/// each frequency blends its interpolated (/ factor) and extrapolated values by a linear
/// ramp between the correction dims of beta_fast = 32 and beta_slow = 1 rotations in the
/// original context, floored and ceiled, the betas llama.cpp's defaults.
std::vector<double> llama_cpp_yarn(const RopeSpec& r, double factor, double original) {
  const double dim = static_cast<double>(r.rotary_dim);
  const auto correction = [&](double rotations) {
    return dim * std::log(original / (rotations * 2 * M_PI)) / (2 * std::log(r.theta));
  };
  const double low = std::max(0.0, std::floor(correction(32)));
  const double high = std::min(dim - 1, std::ceil(correction(1)));
  std::vector<double> f(r.inv_freq.size());
  for (size_t i = 0; i < f.size(); ++i) {
    const double y = (static_cast<double>(i) - low) / std::max(0.001, high - low);
    const double mix = 1 - std::min(1.0, std::max(0.0, y));  // 1: extrapolated
    f[i] = 1 / ((1 - mix) / factor + mix);
  }
  return f;
}

/// The rope's per-frequency divisors against the unscaled base frequencies.
std::vector<double> rope_factors(const RopeSpec& r) {
  std::vector<double> f(r.inv_freq.size());
  for (size_t i = 0; i < f.size(); ++i) {
    const double base = std::pow(r.theta, -2.0 * static_cast<double>(i) / r.rotary_dim);
    f[i] = base / r.inv_freq[i];
  }
  return f;
}

/// Qwen3.5's hybrid decoders (qwen35, qwen35moe, qwen3next): what llama.cpp reads besides
/// the common keys, and what it cannot express (docs/GGUF.md, "Families"); `mrope`: the
/// Qwen3.5 architectures' interleaved mrope (qwen3next rotates as NEOX, one stream).
template <class Refuse>
void hybrid_layout(GgufDecoder& d, const json::Value& cfg, bool mrope, const Refuse& refuse) {
  const DecoderSpec& spec = d.spec;
  const LinearAttentionSpec& L = spec.linear;
  // llama.cpp sizes the key and the value heads of a Gated DeltaNet layer by one number,
  // ssm.state_size (its state is a square dk x dv per head).
  if (spec.any_mixer(Mixer::linear) && L.key_dim != L.value_dim)
    refuse("linear_value_head_dim",
           "llama.cpp's " + d.arch + " needs linear_value_head_dim = linear_key_head_dim (" +
               std::to_string(L.key_dim) + "): it sizes both heads by ssm.state_size");
  // The layer pattern: every n-th layer full attention (full_attention_interval, as
  // llama.cpp's converter writes it), else one bool a layer (attention.recurrent_layers).
  for (int64_t n = 1; n <= spec.layers + 1 && d.full_attention_interval == 0; ++n) {
    bool every = true;
    for (int64_t l = 0; l < spec.layers; ++l)
      every &= (spec.layer[static_cast<size_t>(l)].mixer == Mixer::attention) == ((l + 1) % n == 0);
    if (every) d.full_attention_interval = n;
  }
  if (!mrope) return;
  // mrope: llama.cpp's qwen35 and qwen35moe rotate by interleaved mrope whatever
  // mrope_interleaved says, rotary pair i by stream t, h or w when i % 3 is 0, 1 or 2 and
  // i < 3 x that stream's section (i taken modulo the sections' sum), else by the fourth
  // stream, which is position 0 for text: a pair left to it would not rotate, where
  // transformers rotates every pair by the token's position (on text its three streams are
  // equal).
  const json::Value* o = full_rope_object(cfg);
  const json::Value* sec = o ? o->find("mrope_section") : nullptr;
  d.rope_sections = {11, 11, 10, 0};  // (llama.cpp's converter's default)
  if (sec && sec->kind == json::Value::Kind::array) {
    d.rope_sections.assign(4, 0);
    for (size_t i = 0; i < sec->array.size() && i < 3; ++i)
      d.rope_sections[i] = static_cast<int32_t>(sec->array[i].number);
  }
  const std::vector<int32_t>& s = d.rope_sections;
  const int64_t sum = s[0] + s[1] + s[2] + s[3];
  for (int64_t i = 0; i < spec.ropes[0].rotary_dim / 2; ++i) {
    const int64_t sector = sum > 0 ? i % sum : i, stream = sector % 3;
    if (sum == 0 || sector >= 3 * static_cast<int64_t>(s[static_cast<size_t>(stream)]))
      refuse(cfg.find("rope_parameters") ? "rope_parameters" : "rope_scaling",
             "its mrope_section leaves rotary pair " + std::to_string(i) +
                 " to llama.cpp's fourth mrope stream (interleaved sections " +
                 std::to_string(s[0]) + ", " + std::to_string(s[1]) + ", " + std::to_string(s[2]) +
                 "), which does not rotate text");
  }
}

/// Gemma 4's text decoder as llama.cpp's gemma4 runs it (docs/GGUF.md, "Families"):
/// sliding layers by a bool array, the full layers' head size and rope as the main keys and
/// the sliding layers' as *_swa, key/value heads a layer, the full layers' rope as
/// rope_freqs divisors; refused what its graph computes otherwise.
template <class Refuse>
void gemma4_layout(GgufDecoder& d, const json::Value& cfg, const Refuse& refuse) {
  const DecoderSpec& spec = d.spec;
  // (what kqlora's gemma4 family sets, and llama.cpp's gemma4 hard-codes: scores scaled by
  // 1, no attention soft-cap, no clamp, no sinks, a rope a layer type)
  KQLORA_CHECK(spec.attn_scale == 1.0f && spec.attn_softcap == 0 && spec.clip_qkv == 0 &&
                   !spec.sinks && spec.layer_scalar && spec.ropes.size() == 2,
               "gguf: a gemma4 spec unlike Gemma 4's");
  for (const ProjectionSpec& p : spec.projections)
    if (p.bias) refuse("attention_bias", "llama.cpp's gemma4 has no attention biases");
  // Per-layer inputs: llama.cpp's gemma4 reads the table as per_layer_token_embd with
  // vocab_size rows (its token ids index both).
  if (spec.ple_width > 0 && spec.ple_vocab != spec.vocab)
    refuse("vocab_size_per_layer_input",
           "llama.cpp's gemma4 sizes the per-layer input table by vocab_size (" +
               std::to_string(spec.vocab) + ")");
  // (the MoE block, should kqlora's gemma4 family read it: llama.cpp's gemma4 has one, but
  // it is not checked here against transformers)
  const json::Value* moe = cfg.find("enable_moe_block");
  if (moe && moe->kind == json::Value::Kind::boolean && moe->boolean)
    refuse("enable_moe_block",
           "kqlora's GGUF export does not write Gemma 4's MoE block yet (llama.cpp's gemma4 "
           "reads it; unchecked here)");
  int64_t full = -1, sliding = -1;  // a layer of each type
  for (int64_t l = 0; l < spec.layers; ++l) {
    const LayerSpec& at = spec.layer[static_cast<size_t>(l)];
    d.window = std::max(d.window, at.window);
    (at.window > 0 ? sliding : full) = l;
    KQLORA_CHECK(at.rope == (at.window > 0 ? 1 : 0), "gguf: a gemma4 layer's rope not its type's");
  }
  for (const LayerSpec& at : spec.layer)
    KQLORA_CHECK(at.window == 0 || at.window == d.window, "gguf: gemma4 windows of several sizes");
  // (llama.cpp's gemma4 always keeps a sliding-window cache and asserts a sliding layer:
  // without one, a one-layer model too as its last layer is full, the process aborts)
  if (sliding < 0)
    refuse(cfg.find("layer_types") ? "layer_types" : "num_hidden_layers",
           "no layer is sliding_attention (transformers makes the last layer full); llama.cpp's "
           "gemma4 needs one: it asserts as much when it builds its cache, and aborts");
  KQLORA_CHECK(full >= 0, "gguf: a gemma4 model without a full-attention layer");
  // Key/value sharing: the last N layers (attention.shared_kv_layers) attend over an earlier
  // layer's keys and values, transformers' (and kqlora's) the last unshared layer of their
  // type, llama.cpp's the last unshared layer for a full layer and the one before it for a
  // sliding one (its cache's reuse): the same when the last unshared layer is full and the
  // one before it sliding (Gemma 4 E2B's and E4B's layout), refused otherwise.
  int64_t first = spec.layers;  // the first sharing layer
  while (first > 0 && spec.layer[static_cast<size_t>(first - 1)].kv_source >= 0) --first;
  for (int64_t l = 0; l < spec.layers; ++l) {
    const LayerSpec& at = spec.layer[static_cast<size_t>(l)];
    KQLORA_CHECK((at.kv_source >= 0) == (l >= first), "gguf: gemma4 sharing layers not the last");
    const int64_t reused = first - (at.window > 0 ? 2 : 1);  // llama.cpp's
    if (at.kv_source >= 0 && (at.kv_source != reused || first < 2))
      refuse("num_kv_shared_layers",
             "layer " + std::to_string(l) + " attends over layer " + std::to_string(at.kv_source) +
                 "'s keys and values (the last unshared layer of its type); llama.cpp's gemma4 "
                 "reuses layer " +
                 std::to_string(reused) + "'s, the " + (at.window > 0 ? "second-" : "") +
                 "last unshared layer, for a " + (at.window > 0 ? "sliding" : "full") +
                 " one (it needs the last unshared layer full, the one before it sliding)");
  }
  d.shared_kv_layers = spec.layers - first;
  // The head sizes: llama.cpp's gemma4 reads one a layer type (attention.key_length and
  // key_length_swa), as kqlora's family requires.
  for (int64_t l = 0; l < spec.layers; ++l)
    KQLORA_CHECK(
        spec.head_dim_of(l) ==
            spec.head_dim_of(spec.layer[static_cast<size_t>(l)].window > 0 ? sliding : full),
        "gguf: gemma4 head sizes differ within a layer type");
  // The sliding layers' rope: llama.cpp rotates them by rope.freq_base_swa over the whole
  // head (rope.dimension_count_swa), every frequency as is (no factors, no scaling).
  const std::string rope_field = cfg.find("rope_parameters") ? "rope_parameters" : "rope_scaling";
  const RopeSpec& swa = spec.ropes[1];
  KQLORA_CHECK(swa.rotary_dim == spec.head_dim_of(sliding) &&
                   spec.ropes[0].rotary_dim == spec.head_dim_of(full),
               "gguf: a gemma4 rope not over its layers' heads");
  const std::vector<double> swa_factors = rope_factors(swa);
  for (size_t i = 0; i < swa_factors.size(); ++i)
    if (!close(swa_factors[i], 1.0, 1e-5))
      refuse(rope_field,
             "its sliding_attention rope has frequency " + std::to_string(i) +
                 (swa.inv_freq[i] > 0 ? " divided by " + std::to_string(swa_factors[i])
                                      : std::string(" at 0 (proportional)")) +
                 "; llama.cpp's gemma4 rotates the sliding layers by their rope_theta over the "
                 "whole head, unscaled (frequency factors apply to the full layers only)");
  // The full layers' rope, default or proportional with its factor: rope_freqs, each base
  // frequency's divisor, 1e30 where the frequency is 0 (those pairs pass unrotated), as
  // llama.cpp's converter writes proportional rope; ggml's NEOX rope pairs (i, i + head/2),
  // as transformers'.
  const RopeSpec& r = spec.ropes[0];
  KQLORA_CHECK(r.attention_factor == 1.0f && r.inv_freq_long.empty(),
               "gguf: gemma4 with a rope attention factor or long factors");
  for (size_t i = 0; i < r.inv_freq.size(); ++i) {
    const double base = std::pow(r.theta, -2.0 * static_cast<double>(i) / r.rotary_dim);
    const double f = r.inv_freq[i] > 0 ? base / r.inv_freq[i] : 1e30;
    d.rope_freqs.push_back(close(f, 1.0, 1e-6) ? 1.0f : static_cast<float>(f));
  }
}

}  // namespace

GgufDecoder gguf_decoder(const DecoderSpec& spec, const std::string& config_text,
                         const std::string& file) {
  GgufDecoder d;
  d.spec = spec;
  const json::Value root = json::parse(config_text, file + ": hf_config");
  // (a multimodal Qwen3.5, Qwen3.5-MoE or Gemma 4 directory: its text decoder's fields are
  // text_config's, and the GGUF holds that decoder alone, as llama.cpp's converter writes it)
  const bool multimodal = spec.model_type == "qwen3_5" || spec.model_type == "qwen3_5_moe" ||
                          spec.model_type == "gemma4";
  const json::Value* text = multimodal ? root.find("text_config") : nullptr;
  const json::Value cfg = text ? *text : root;
  const std::string field_prefix = text ? "text_config." : "";
  const std::string where = file + ": --gguf: ";
  static const std::map<std::string, std::string> archs = {{"llama", "llama"},
                                                           {"mistral", "llama"},
                                                           {"qwen2", "qwen2"},
                                                           {"qwen3", "qwen3"},
                                                           {"gemma2", "gemma2"},
                                                           {"gemma3_text", "gemma3"},
                                                           {"phi3", "phi3"},
                                                           {"qwen3_moe", "qwen3moe"},
                                                           {"qwen2_moe", "qwen2moe"},
                                                           {"mixtral", "llama"},
                                                           {"olmoe", "olmoe"},
                                                           {"smollm3", "smollm3"},
                                                           {"olmo2", "olmo2"},
                                                           {"olmo3", "olmo2"},
                                                           {"granite", "granite"},
                                                           {"qwen3_5_text", "qwen35"},
                                                           {"qwen3_5", "qwen35"},
                                                           {"qwen3_5_moe_text", "qwen35moe"},
                                                           {"qwen3_5_moe", "qwen35moe"},
                                                           {"qwen3_next", "qwen3next"},
                                                           {"gemma4_text", "gemma4"},
                                                           {"gemma4", "gemma4"}};
  const auto a = archs.find(spec.model_type);
  const auto refuse = [&](const std::string& key, const std::string& why) {
    KQLORA_INPUT_CHECK(false, where << "config.json's " << field_prefix << key << " = "
                                    << value_of(cfg, key) << ": " << why
                                    << " (docs/GGUF.md, \"Families\")");
  };
  // (gpt-oss: llama.cpp's gpt-oss architecture has tensors and fields of its own -- the
  // sinks, the expert and router biases, the clamped SwiGLU's limit -- and stores the hub's
  // experts as MXFP4; the writer knows none of them, and guessing their layout would make
  // a file llama.cpp might load wrong)
  if (spec.model_type == "gpt_oss")
    refuse("model_type",
           "kqlora's GGUF writer has no gpt-oss architecture (its attention sinks, expert and "
           "router biases, clamped SwiGLU and MXFP4 experts are tensors and fields it does not "
           "write); export --merged and convert that directory with llama.cpp's "
           "convert_hf_to_gguf.py");
  KQLORA_INPUT_CHECK(a != archs.end(), where << "model_type '" << spec.model_type
                                             << "' has no llama.cpp architecture here");
  d.arch = a->second;
  const bool gemma = d.arch == "gemma2" || d.arch == "gemma3" || d.arch == "gemma4";
  const bool olmo2 = d.arch == "olmo2", granite = d.arch == "granite";
  // Qwen3.5's hybrid decoders: qwen35 (dense) and qwen35moe, with mrope and the value
  // heads tiled; qwen3next, with the fused in_proj_qkvz split and the value heads grouped
  const bool qwen35 = d.arch == "qwen35" || d.arch == "qwen35moe";
  const bool hybrid = qwen35 || d.arch == "qwen3next";
  // (Gated DeltaNet layers and the gated attention are Qwen3.5's and Qwen3-Next's)
  KQLORA_CHECK(hybrid || (!spec.any_mixer(Mixer::linear) && !spec.attn_output_gate),
               "gguf: Qwen3.5's mixers outside qwen35, qwen35moe and qwen3next");
  // (the multipliers and the logits divisor are Granite's)
  KQLORA_CHECK(granite || (spec.embed_multiplier == 0 && spec.residual_multiplier == 0 &&
                           spec.logits_divisor == 0),
               "gguf: Granite's multipliers outside granite");

  // Rope-less layers: llama.cpp's smollm3 leaves the rotary out of every fourth layer
  // (n_no_rope_layer_step 4, set in its code: no GGUF key changes it).
  for (int64_t l = 0; l < spec.layers; ++l) {
    const bool rotary = spec.layer[static_cast<size_t>(l)].rotary;
    KQLORA_CHECK(rotary || d.arch == "smollm3", "gguf: a layer without rope outside smollm3");
    if (d.arch == "smollm3" && rotary != ((l + 1) % 4 != 0))
      refuse(cfg.find("no_rope_layers") ? "no_rope_layers" : "no_rope_layer_interval",
             "layer " + std::to_string(l) + (rotary ? " rotates" : " does not rotate") +
                 " q and k; llama.cpp's smollm3 leaves the rotary out of every fourth layer "
                 "(layers 3, 7, 11, ...) and of no other, a step no GGUF key sets");
  }

  // Experts: llama.cpp's MoE architectures make every layer sparse (qwen3next's graph has a
  // dense branch, but its loader reads a router for every layer); qwen3moe, llama
  // (Mixtral), qwen35moe and qwen3next always renormalise the top k, qwen2moe and olmoe
  // never.
  if (spec.any_sparse_mlp()) {
    const json::Value* listed = cfg.find("mlp_only_layers");
    const auto lists = [&](int64_t l) {
      if (!listed || listed->kind != json::Value::Kind::array) return false;
      for (const json::Value& v : listed->array)
        if (v.kind == json::Value::Kind::number && v.number == static_cast<double>(l)) return true;
      return false;
    };
    for (int64_t l = 0; l < spec.layers; ++l)
      if (!spec.layer[static_cast<size_t>(l)].sparse)
        refuse(lists(l) ? "mlp_only_layers" : "decoder_sparse_step",
               "layer " + std::to_string(l) + " has a dense MLP; llama.cpp's " + d.arch +
                   " makes every layer a mixture of experts");
    const bool renorm =
        d.arch == "qwen3moe" || d.arch == "llama" || d.arch == "qwen35moe" || d.arch == "qwen3next";
    if (spec.experts.norm_topk != renorm)
      refuse("norm_topk_prob", "llama.cpp's " + d.arch + (renorm ? " always" : " never") +
                                   " renormalises the top-k routing weights");
  }
  // OLMoE: llama.cpp's olmoe normalises q and k over the whole projection with norms of
  // hidden_size each (so as many kv heads as heads), clamps nothing and has no biases.
  if (d.arch == "olmoe") {
    if (spec.clip_qkv > 0) refuse("clip_qkv", "llama.cpp's olmoe does not clamp q, k and v");
    for (const ProjectionSpec& p : spec.projections)
      if (p.bias) refuse("attention_bias", "llama.cpp's olmoe has no attention biases");
    if (spec.kv_heads != spec.heads)
      refuse("num_key_value_heads",
             "llama.cpp's olmoe sizes k_norm by hidden_size, so kv heads must equal heads");
    if (spec.tied)
      refuse("tie_word_embeddings", "llama.cpp's olmoe reads an output.weight of its own");
  }
  // The MLP's activation: llama.cpp's graph for the architecture has one.
  const Activation act = gemma ? Activation::gelu_tanh : Activation::silu;
  if (spec.mlp_activation != act)
    refuse(
        gemma ? "hidden_activation" : "hidden_act",
        "llama.cpp's " + d.arch + " applies " + (gemma ? "gelu_pytorch_tanh" : "silu") + " only");
  // Gemma 4: its own layout (per-type head sizes and ropes, rope_freqs, layer_scalar)
  if (d.arch == "gemma4") {
    gemma4_layout(d, cfg, refuse);
    return d;
  }
  // OLMo 2 / 3 and Qwen3.5's hybrids: llama.cpp's olmo2, qwen35, qwen35moe and qwen3next
  // have no biases; olmo2 sizes q, its norm and the o projection by hidden_size and reads
  // an output.weight of its own.
  if (olmo2 || hybrid)
    for (const ProjectionSpec& p : spec.projections)
      if (p.bias) refuse("attention_bias", "llama.cpp's " + d.arch + " has no attention biases");
  if (olmo2 && spec.tied)
    refuse("tie_word_embeddings", "llama.cpp's olmo2 reads an output.weight of its own");
  // o, gate, up and down biases: the graphs of llama and granite; q, k and v biases:
  // every one but olmo2's and the hybrids'.
  for (const ProjectionSpec& p : spec.projections) {
    if (!p.bias || d.arch == "llama" || granite) continue;
    const bool qkv = p.slots[0] == Slot::q || p.slots[0] == Slot::k || p.slots[0] == Slot::v;
    if (!qkv)
      refuse(p.slots[0] == Slot::o ? "attention_bias" : "mlp_bias",
             "llama.cpp's " + d.arch + " has no " + p.name + " bias");
  }
  // (granite: llama.cpp's converter drops head_dim, so llama.cpp takes hidden / heads)
  if ((d.arch == "qwen2" || d.arch == "qwen2moe" || d.arch == "phi3" || olmo2 || granite) &&
      spec.heads * spec.head_dim != spec.hidden)
    refuse("head_dim", "llama.cpp's " + d.arch + " needs heads x head_dim = hidden_size");
  if (d.arch == "gemma2" && !spec.tied)
    refuse("tie_word_embeddings", "llama.cpp's gemma2 always ties the output to the embedding");

  // Attention scale: 1 / sqrt(head_dim), Gemma's 27B (recognised by its layer count) 1 /
  // sqrt(hidden / heads); query_pre_attn_scalar is not read.
  const int64_t big = d.arch == "gemma2" ? 46 : 62;
  const double scaled_dim =
      gemma && spec.layers == big ? static_cast<double>(spec.hidden / spec.heads) : spec.head_dim;
  // (granite writes its attention_multiplier as attention.scale)
  if (!granite && !close(spec.attn_scale, 1.0 / std::sqrt(scaled_dim), 1e-6))
    refuse("query_pre_attn_scalar", "llama.cpp's " + d.arch + " scales scores by 1/sqrt(" +
                                        std::to_string(static_cast<int64_t>(scaled_dim)) +
                                        ") for this shape, whatever the field says");
  if (d.arch == "gemma2") {  // llama.cpp applies both soft-caps always
    if (!(spec.attn_softcap > 0))
      refuse("attn_logit_softcapping", "llama.cpp's gemma2 always soft-caps the scores");
    if (!(spec.final_softcap > 0))
      refuse("final_logit_softcapping", "llama.cpp's gemma2 always soft-caps the logits");
  }

  // Sliding windows: gemma2 on even layers, gemma3 and olmo2 on the layers a pattern
  // names, none in the others (llama.cpp ignores mistral's, qwen2's, phi3's and smollm3's
  // windows).
  for (const LayerSpec& l : spec.layer) d.window = std::max(d.window, l.window);
  // (Qwen's windows are switched on by use_sliding_window; the others' by sliding_window)
  const std::string window_field = cfg.find("layer_types")          ? "layer_types"
                                   : cfg.find("use_sliding_window") ? "use_sliding_window"
                                                                    : "sliding_window";
  for (int64_t l = 0; l < spec.layers; ++l) {
    const int64_t w = spec.layer[l].window;
    // (a window of at least max_position_embeddings never hides a key: full attention;
    // olmo2's are kept, its sliding layers' rope being unscaled)
    if (w == 0 || (!gemma && !olmo2 && w >= spec.max_positions)) continue;
    if (!gemma && !olmo2)
      refuse(window_field, "layer " + std::to_string(l) + " attends through a window of " +
                               std::to_string(w) + ", which llama.cpp's " + d.arch +
                               " does not apply (full attention there)");
    KQLORA_CHECK(w == d.window, "gguf: a family with windows of several sizes");
  }
  if (d.arch == "gemma2")
    for (int64_t l = 0; l < spec.layers; ++l)
      if ((spec.layer[l].window > 0) != (l % 2 == 0))
        refuse(window_field, "llama.cpp's gemma2 windows the even layers exactly (layer " +
                                 std::to_string(l) + " differs)");
  if (d.arch == "gemma3")
    for (int64_t l = 0; l < spec.layers; ++l)
      d.pattern_array |= (spec.layer[l].window > 0) != (l % 6 < 5);

  // Ropes: the full layers' one as freq_base with linear scaling or, on llama, per
  // frequency factors (rope_freqs: llama3); gemma3's sliding layers' as freq_base_swa.
  const std::string rope_field = cfg.find("rope_parameters") ? "rope_parameters" : "rope_scaling";
  for (const RopeSpec& r : spec.ropes) {
    if (r.type == "longrope" || !r.inv_freq_long.empty())
      refuse(rope_field,
             "long-context factors (longrope): llama.cpp picks the long or short "
             "ones by its context size, not by the sequence as transformers and "
             "kqlora do");
    // (the families give an attention factor with longrope and yarn only, partial rotary
    // in phi3 and the hybrids only)
    KQLORA_CHECK(r.attention_factor == 1.0f || r.type == "yarn",
                 "gguf: an attention factor without longrope or yarn");
    KQLORA_CHECK(r.rotary_dim == spec.head_dim || d.arch == "phi3" || hybrid,
                 "gguf: partial rotary dims outside phi3 and the hybrids");
  }
  const RopeSpec& full = spec.ropes[0];
  const std::vector<double> f = rope_factors(full);
  bool ones = true, uniform = true;
  for (double x : f) {
    ones &= close(x, 1.0, 1e-5);
    uniform &= close(x, f[0], 1e-5);
  }
  if (full.type == "yarn") {
    // YaRN: llama.cpp's smollm3 and olmo2 (olmo2's on the full-attention layers only, as
    // transformers' OLMo 3) from rope.scaling.factor and original_context_length, with its
    // own betas, cos and sin times (1 + 0.1 ln(factor)) times rope.scaling.attn_factor.
    if (d.arch != "smollm3" && !olmo2)
      refuse(rope_field, "rope_type \"yarn\": llama.cpp's " + d.arch + " has no YaRN");
    const json::Value* o = full_rope_object(cfg);
    d.yarn_factor = static_cast<float>(number_of(o, "factor", 0));
    d.yarn_original =
        static_cast<int64_t>(number_of(o, "original_max_position_embeddings",
                                       number_of(&cfg, "original_max_position_embeddings", 0)));
    KQLORA_CHECK(d.yarn_factor >= 1 && d.yarn_original > 0, "gguf: yarn without its factor");
    const std::vector<double> want =
        llama_cpp_yarn(full, d.yarn_factor, static_cast<double>(d.yarn_original));
    for (size_t i = 0; i < f.size(); ++i)
      if (!close(f[i], want[i], 1e-5))
        refuse(rope_field,
               "its YaRN frequencies are not llama.cpp's, which ramps between the "
               "floored and ceiled correction dims of beta_fast 32 and beta_slow 1 "
               "(frequency " +
                   std::to_string(i) + " divided by " + std::to_string(f[i]) + ", there by " +
                   std::to_string(want[i]) + ")");
    const double own = 1 + 0.1 * std::log(static_cast<double>(d.yarn_factor));
    if (!close(full.attention_factor, own, 1e-6))
      d.yarn_attn_factor = static_cast<float>(full.attention_factor / own);
  } else if (!ones && uniform) {
    d.rope_scale = static_cast<float>(f[0]);
  } else if (!ones && (d.arch == "llama" || granite)) {  // (rope_freqs.weight)
    for (double x : f) d.rope_freqs.push_back(static_cast<float>(x));
  } else if (!ones) {
    refuse(rope_field, "rope_type \"" + full.type + "\" scales frequencies unevenly; llama.cpp's " +
                           d.arch + " has linear rope scaling" +
                           (d.arch == "smollm3" || olmo2 ? " and YaRN" : "") + " only");
  }
  bool sliding_rope = false;  // (gemma3, olmo2: the sliding layers' rope, unscaled)
  for (const LayerSpec& l : spec.layer) sliding_rope |= l.rope == 1;
  if (sliding_rope) {
    const std::vector<double> g = rope_factors(spec.ropes[1]);
    for (double x : g)
      if (!close(x, 1.0, 1e-5) || spec.ropes[1].attention_factor != 1.0f)
        refuse("rope_parameters", "the sliding layers' rope is scaled; llama.cpp's " + d.arch +
                                      " scales the full layers' only");
    // (olmo2's graph rotates its sliding layers by the full layers' base)
    if (olmo2 && !close(spec.ropes[1].theta, full.theta, 1e-9))
      refuse("rope_parameters",
             "the sliding layers' rope_theta differs from the full layers'; llama.cpp's olmo2 "
             "rotates both by one base");
  }
  for (const LayerSpec& l : spec.layer)  // (gemma3's spec: the rope follows the window)
    KQLORA_CHECK(spec.ropes.size() == 1 || l.rope == (l.window > 0 ? 1 : 0),
                 "gguf: a layer's rope is not its attention type's");
  if (hybrid) hybrid_layout(d, cfg, qwen35, refuse);
  return d;
}

void GgufDecoder::add_metadata(gguf::Writer& w) const {
  const std::string a = arch + ".";
  const auto u32 = [&](const std::string& k, int64_t v) {
    KQLORA_INPUT_CHECK(v >= 0 && v <= static_cast<int64_t>(UINT32_MAX),
                       "--gguf: " << a << k << " = " << v << " does not fit GGUF's uint32");
    w.add_u32(a + k, static_cast<uint32_t>(v));
  };
  u32("vocab_size", spec.vocab);
  u32("context_length", spec.max_positions);
  u32("embedding_length", spec.hidden);
  u32("block_count", spec.layers);
  // (Gemma 4's double-wide MLPs of its key/value-sharing layers: a width a layer)
  std::vector<int32_t> widths;
  for (int64_t l = 0; l < spec.layers; ++l)
    widths.push_back(
        static_cast<int32_t>(spec.any_sparse_mlp() ? spec.intermediate : spec.mlp_width(l)));
  bool one_width = true;
  for (int32_t x : widths) one_width &= x == widths[0];
  if (one_width) {
    u32("feed_forward_length", spec.intermediate);
  } else {
    KQLORA_CHECK(arch == "gemma4", "gguf: MLP widths a layer outside gemma4");
    w.add_i32s(a + "feed_forward_length", widths);
  }
  if (spec.any_sparse_mlp()) {
    u32("expert_count", spec.experts.experts);
    u32("expert_used_count", spec.experts.top_k);
    u32("expert_feed_forward_length", spec.experts.intermediate);
    if (spec.experts.shared_intermediate > 0)
      u32("expert_shared_feed_forward_length", spec.experts.shared_intermediate);
  }
  u32("attention.head_count", spec.heads);
  // (Gemma 4: key/value heads a layer where they differ; key_length the full-attention
  // layers' head size, the sliding layers' under key_length_swa below)
  std::vector<int32_t> kv_heads;
  int64_t full_head = spec.head_dim, swa_head = spec.head_dim;
  for (int64_t l = 0; l < spec.layers; ++l) {
    kv_heads.push_back(static_cast<int32_t>(spec.kv_heads_of(l)));
    (spec.layer[static_cast<size_t>(l)].window > 0 ? swa_head : full_head) = spec.head_dim_of(l);
  }
  bool uniform = true;
  for (int32_t k : kv_heads) uniform &= k == kv_heads[0];
  if (uniform) {
    u32("attention.head_count_kv", kv_heads[0]);
  } else {
    KQLORA_CHECK(arch == "gemma4", "gguf: key/value heads a layer outside gemma4");
    w.add_i32s(a + "attention.head_count_kv", kv_heads);
  }
  if (arch != "gemma4") full_head = swa_head = spec.head_dim;
  u32("attention.key_length", full_head);
  u32("attention.value_length", full_head);
  w.add_f32(a + "attention.layer_norm_rms_epsilon", static_cast<float>(spec.norm_eps));
  u32("rope.dimension_count", spec.ropes[0].rotary_dim);
  w.add_f32(a + "rope.freq_base", static_cast<float>(spec.ropes[0].theta));
  if (rope_scale != 1.0f) {
    w.add(a + "rope.scaling.type", "linear");
    w.add_f32(a + "rope.scaling.factor", rope_scale);
  }
  if (arch == "gemma2") {
    w.add_f32(a + "attn_logit_softcapping", spec.attn_softcap);
    w.add_f32(a + "final_logit_softcapping", spec.final_softcap);
    u32("attention.sliding_window", window);
  }
  if (yarn_factor > 0) {
    w.add(a + "rope.scaling.type", "yarn");
    w.add_f32(a + "rope.scaling.factor", yarn_factor);
    u32("rope.scaling.original_context_length", yarn_original);
    if (yarn_attn_factor != 1.0f) w.add_f32(a + "rope.scaling.attn_factor", yarn_attn_factor);
  }
  if (arch == "granite") {  // (llama.cpp requires logit_scale)
    w.add_f32(a + "attention.scale", spec.attn_scale);
    if (spec.embed_multiplier > 0) w.add_f32(a + "embedding_scale", spec.embed_multiplier);
    if (spec.residual_multiplier > 0) w.add_f32(a + "residual_scale", spec.residual_multiplier);
    w.add_f32(a + "logit_scale", spec.logits_divisor > 0 ? spec.logits_divisor : 1.0f);
  }
  if (arch == "olmo2" && window > 0) {  // OLMo 3's windows, on the layers the array names
    u32("attention.sliding_window", window);
    std::vector<bool> sliding;
    for (const LayerSpec& l : spec.layer) sliding.push_back(l.window > 0);
    w.add_bools(a + "attention.sliding_window_pattern", sliding);
  }
  if (arch == "qwen35" || arch == "qwen35moe" || arch == "qwen3next") {
    // (the Gated DeltaNet layers' sizes, llama.cpp's ssm.* keys; mrope's sections)
    const LinearAttentionSpec& L = spec.linear;
    u32("ssm.conv_kernel", L.kernel);
    u32("ssm.state_size", L.key_dim);
    u32("ssm.group_count", L.key_heads);
    u32("ssm.time_step_rank", L.value_heads);
    u32("ssm.inner_size", L.value_width());
    if (arch != "qwen3next") w.add_i32s(a + "rope.dimension_sections", rope_sections);
    if (full_attention_interval > 0) {
      u32("full_attention_interval", full_attention_interval);
    } else {
      std::vector<bool> recurrent;
      for (const LayerSpec& l : spec.layer) recurrent.push_back(l.mixer == Mixer::linear);
      w.add_bools(a + "attention.recurrent_layers", recurrent);
    }
  }
  if (arch == "gemma4") {
    // (the sliding layers' head size and rope; llama.cpp's gemma4 soft-caps the logits by 30
    // without the key, so 0 says none; the per-layer inputs' width, 0: none; the
    // key/value-sharing layers)
    u32("attention.key_length_swa", swa_head);
    u32("attention.value_length_swa", swa_head);
    u32("rope.dimension_count_swa", spec.ropes[1].rotary_dim);
    w.add_f32(a + "rope.freq_base_swa", static_cast<float>(spec.ropes[1].theta));
    u32("attention.sliding_window", window);
    std::vector<bool> sliding;
    for (const LayerSpec& l : spec.layer) sliding.push_back(l.window > 0);
    w.add_bools(a + "attention.sliding_window_pattern", sliding);
    w.add_f32(a + "final_logit_softcapping", spec.final_softcap);
    u32("embedding_length_per_layer_input", spec.ple_width);
    u32("attention.shared_kv_layers", shared_kv_layers);
  }
  if (arch == "gemma3") {
    if (spec.final_softcap > 0) w.add_f32(a + "final_logit_softcapping", spec.final_softcap);
    u32("attention.sliding_window", window);
    if (spec.ropes.size() > 1)
      w.add_f32(a + "rope.freq_base_swa", static_cast<float>(spec.ropes[1].theta));
    if (pattern_array) {  // (llama.cpp's default: all but every sixth layer)
      std::vector<bool> sliding;
      for (const LayerSpec& l : spec.layer) sliding.push_back(l.window > 0);
      w.add_bools(a + "attention.sliding_window_pattern", sliding);
    }
  }
}

std::vector<GgufTensorPlan> GgufDecoder::tensors(const std::string& hf,
                                                 const std::string& file) const {
  // Qwen3-Next's in_proj_qkvz, per key head group [q_h | k_h | v_h | z_h]: llama.cpp's
  // converter writes attn_qkv = [q | k | v] (every group's q, then k, then v, the value
  // heads in their grouped order) and attn_gate = z, and so does this (its in_proj_ba, per
  // group [b_h | a_h], is ssm_ba as it is: llama.cpp's graph splits it by group).
  static const std::regex layer(R"(model\.layers\.(\d+)\.(.*)\.weight)");
  std::smatch m;
  if (arch == "qwen3next" && std::regex_match(hf, m, layer))
    for (const ProjectionSpec& p : spec.projections) {
      if (p.groups == 0 || p.module != m[2].str() || p.slots[0] != Slot::lin_qkv) continue;
      const std::vector<SlotPiece> pieces = spec.pieces(p);
      int64_t group_width = 0;
      for (const SlotPiece& x : pieces) group_width += x.width / p.groups;
      std::vector<GgufTensorPlan> plans;
      for (const Slot s : p.slots) {
        GgufTensorPlan plan{"blk." + m[1].str() +
                            (s == Slot::lin_qkv ? ".attn_qkv" : ".attn_gate") + ".weight"};
        int64_t off = 0;  // (the piece's columns within a group)
        for (const SlotPiece& x : pieces) {
          const int64_t per = x.width / p.groups;
          if (x.slot == s)  // (a slot's pieces come in the order of its columns)
            for (int64_t f = 0; f < x.width; ++f)
              plan.rows.push_back((f / per) * group_width + off + f % per);
          off += per;
        }
        plan.shape = {static_cast<int64_t>(plan.rows.size()), spec.in_features(p)};
        plans.push_back(std::move(plan));
      }
      return plans;
    }
  return {tensor(hf, file)};
}

GgufTensorPlan GgufDecoder::tensor(const std::string& hf, const std::string& file) const {
  if (hf == "model.embed_tokens.weight") return {"token_embd.weight"};
  if (hf == "model.norm.weight")
    return {"output_norm.weight", 0, spec.norm(NormRole::final)->kind == NormKind::one_plus};
  if (hf == "lm_head.weight") return {"output.weight"};
  const LinearAttentionSpec& L = spec.linear;
  // Qwen3.5's hybrids: qwen35 and qwen35moe (value heads tiled), qwen3next (grouped)
  const bool hybrid = arch == "qwen35" || arch == "qwen35moe" || arch == "qwen3next";
  // Gated DeltaNet's value heads in llama.cpp's order: from row `from`, `unit` rows a head
  // (qwen3next's graph repeats each key head over its own value heads: the order as it is).
  const auto tiled = [&](GgufTensorPlan p, int64_t from, int64_t unit) {
    // (one value head a key head: the same order)
    if (L.value_heads == L.key_heads || arch == "qwen3next") return p;
    p.v_unit = unit;
    p.v_from = from;
    p.v_groups = L.key_heads;
    p.v_per_group = L.value_heads / L.key_heads;
    return p;
  };
  static const std::regex decay(R"(model\.layers\.(\d+)\.(.*)\.(dt_bias|A_log))");
  std::smatch m;
  if (hybrid && std::regex_match(hf, m, decay) && m[2].str() == L.module) {
    GgufTensorPlan p{"blk." + m[1].str() + (m[3].str() == "A_log" ? ".ssm_a" : ".ssm_dt.bias")};
    p.neg_exp = m[3].str() == "A_log";  // (llama.cpp's ssm_a is -exp(A_log))
    return tiled(p, 0, 1);
  }
  // (Gemma 4's per-layer inputs: the table, the model's projection and its norm)
  if (arch == "gemma4") {
    static const std::map<std::string, std::string> ple = {
        {"model.embed_tokens_per_layer.weight", "per_layer_token_embd.weight"},
        {"model.per_layer_model_projection.weight", "per_layer_model_proj.weight"},
        {"model.per_layer_projection_norm.weight", "per_layer_proj_norm.weight"}};
    const auto at = ple.find(hf);
    if (at != ple.end()) return {at->second};
  }
  // (Gemma 4's [1] layer_scalar: llama.cpp's layer_output_scale, F32)
  static const std::regex scalar(R"(model\.layers\.(\d+)\.layer_scalar)");
  if (arch == "gemma4" && std::regex_match(hf, m, scalar))
    return {"blk." + m[1].str() + ".layer_output_scale.weight"};
  static const std::regex layer(R"(model\.layers\.(\d+)\.(.*)\.(weight|bias))");
  KQLORA_INPUT_CHECK(std::regex_match(hf, m, layer),
                     file << ": --gguf: tensor '" << hf << "' has no llama.cpp name");
  const std::string blk = "blk." + m[1].str() + ".", module = m[2].str(), kind = m[3].str();
  for (const NormSpec& n : spec.norms) {
    if (n.module != module || kind != "weight") continue;
    static const std::map<NormRole, std::string> names = {
        {NormRole::attn_in, "attn_norm"}, {NormRole::attn_out, "post_attention_norm"},
        {NormRole::mlp_in, "ffn_norm"},   {NormRole::mlp_out, "post_ffw_norm"},
        {NormRole::q, "attn_q_norm"},     {NormRole::k, "attn_k_norm"},
        {NormRole::ple_out, "post_norm"}};
    // (the hybrids call the norm before the MLP post_attention_norm, as transformers' name)
    const std::string name =
        hybrid && n.role == NormRole::mlp_in ? "post_attention_norm" : names.at(n.role);
    return {blk + name + ".weight", 0, n.kind == NormKind::one_plus};
  }
  // A Gated DeltaNet layer's conv (F32 [conv_dim, kernel], as llama.cpp's converter) and
  // gated norm (w * n: as it is).
  if (hybrid && kind == "weight" && module == L.module + ".conv1d") {
    GgufTensorPlan p{blk + "ssm_conv1d.weight"};
    p.keep_f32 = true;
    p.shape = {L.conv_width(), L.kernel};
    return tiled(p, 2 * L.key_width(), L.value_dim);
  }
  if (hybrid && kind == "weight" && module == L.module + ".norm") return {blk + "ssm_norm.weight"};
  // A sparse layer's: the router, each expert's slice of the stacked tensors, a shared
  // expert's projections and gate.
  const ExpertsSpec& x = spec.experts;
  if (spec.any_sparse_mlp() && kind == "weight") {
    // (the routers in F32, as llama.cpp's converter: a rounding could change the experts)
    if (module == x.router_module) return {blk + "ffn_gate_inp.weight", 0, false, -1, false, true};
    if (module == x.shared_gate_module && x.shared_intermediate > 0)
      return {blk + "ffn_gate_inp_shexp.weight", 0, false, -1, true, true};
    static const std::regex expert(R"((.*)\.(\d+)\.([^.]+))");
    std::smatch e;
    if (std::regex_match(module, e, expert) && e[1].str() == x.experts_module) {
      const std::string w = e[3].str();
      const std::string part = w == x.gate_name ? "gate" : w == x.up_name ? "up" : "down";
      KQLORA_INPUT_CHECK(w == x.gate_name || w == x.up_name || w == x.down_name,
                         file << ": --gguf: tensor '" << hf << "' has no llama.cpp name");
      return {blk + "ffn_" + part + "_exps.weight", 0, false, std::stoll(e[2].str())};
    }
  }
  for (const ProjectionSpec& p : spec.projections) {
    const int64_t l = std::stoll(m[1].str());
    if (spec.shared_expert(l) && DecoderSpec::reads_mlp(p) && module == spec.module_of(l, p)) {
      static const std::map<Slot, std::string> shexp = {{Slot::gate, "ffn_gate_shexp"},
                                                        {Slot::up, "ffn_up_shexp"},
                                                        {Slot::down, "ffn_down_shexp"}};
      return {blk + shexp.at(p.slots[0]) + "." + kind};
    }
    if (p.module != module) continue;
    // Gated DeltaNet's projections: [q | k | v] as attn_qkv, z as attn_gate, b and a as
    // ssm_beta and ssm_alpha (Qwen3-Next's fused [b_h | a_h] groups as ssm_ba), out_proj as
    // ssm_out, their value heads in llama.cpp's order.
    KQLORA_CHECK(p.groups == 0 || p.slots[0] == Slot::lin_b,
                 "gguf: " << hf << " is split by tensors(), not tensor()");
    if (p.groups > 0) return {blk + "ssm_ba." + kind};
    switch (p.slots[0]) {
      case Slot::lin_qkv:
        return tiled({blk + "attn_qkv." + kind}, 2 * L.key_width(), L.value_dim);
      case Slot::lin_z:
        return tiled({blk + "attn_gate." + kind}, 0, L.value_dim);
      case Slot::lin_b:
        return tiled({blk + "ssm_beta." + kind}, 0, 1);
      case Slot::lin_a:
        return tiled({blk + "ssm_alpha." + kind}, 0, 1);
      case Slot::lin_out: {
        GgufTensorPlan o = tiled({blk + "ssm_out." + kind}, 0, L.value_dim);
        o.v_columns = true;
        return o;
      }
      default:
        break;
    }
    static const std::map<Slot, std::string> names = {
        {Slot::q, "attn_q"},      {Slot::k, "attn_k"},          {Slot::v, "attn_v"},
        {Slot::o, "attn_output"}, {Slot::gate, "ffn_gate"},     {Slot::up, "ffn_up"},
        {Slot::down, "ffn_down"}, {Slot::ple_gate, "inp_gate"}, {Slot::ple_out, "proj"}};
    // Fused: [q | k | v] is attn_qkv, [gate | up] llama.cpp's ffn_up (gate first).
    const std::string name = p.slots.size() == 1     ? names.at(p.slots[0])
                             : p.slots[0] == Slot::q ? std::string("attn_qkv")
                                                     : std::string("ffn_up");
    int64_t permute = 0;  // (the architectures llama.cpp rotates in adjacent pairs)
    const bool pairs = arch == "llama" || arch == "smollm3" || arch == "granite";
    if (pairs && p.slots.size() == 1)
      permute = p.slots[0] == Slot::q ? spec.heads : p.slots[0] == Slot::k ? spec.kv_heads : 0;
    return {blk + name + "." + kind, permute, false};
  }
  KQLORA_INPUT_CHECK(false, file << ": --gguf: tensor '" << hf << "' has no llama.cpp name");
  return {};
}

}  // namespace kqlora::exporter
