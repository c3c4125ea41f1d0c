#include "kqlora/nn/llama_config.hpp"

#include <cmath>
#include <sstream>

#include "kqlora/core/error.hpp"
#include "kqlora/core/json.hpp"

namespace kqlora {

namespace {

std::string value_text(const json::Value& v) {
  switch (v.kind) {
    case json::Value::Kind::null:
      return "null";
    case json::Value::Kind::boolean:
      return v.boolean ? "true" : "false";
    case json::Value::Kind::number: {
      std::ostringstream os;
      os << v.number;
      return os.str();
    }
    case json::Value::Kind::string:
      return json::quote(v.string);
    default:
      return std::string("an ") + v.kind_name();
  }
}

struct Reader {
  const json::Value& obj;
  std::string source, prefix;  // prefix: "rope_parameters." inside a nested object

  const json::Value* get(const char* key) const {
    const json::Value* v = obj.find(key);
    return v && v->kind != json::Value::Kind::null ? v : nullptr;
  }
  [[noreturn]] void fail(const char* key, const std::string& what) const {
    KQLORA_INPUT_CHECK(false, source << ": field '" << prefix << key << "' " << what);
  }
  int64_t integer(const char* key, int64_t fallback, bool required, int64_t min = 1) const {
    const json::Value* v = get(key);
    if (!v) {
      if (required) fail(key, "is missing");
      return fallback;
    }
    if (v->kind != json::Value::Kind::number || !v->is_integer)
      fail(key, "must be an integer, got " + value_text(*v));
    if (v->integer < min)
      fail(key, "must be at least " + std::to_string(min) + ", got " + value_text(*v));
    return v->integer;
  }
  double number(const char* key, double fallback, bool required) const {
    const json::Value* v = get(key);
    if (!v) {
      if (required) fail(key, "is missing");
      return fallback;
    }
    if (v->kind != json::Value::Kind::number || !std::isfinite(v->number))
      fail(key, "must be a number, got " + value_text(*v));
    return v->number;
  }
  bool boolean(const char* key, bool fallback) const {
    const json::Value* v = get(key);
    if (!v) return fallback;
    if (v->kind != json::Value::Kind::boolean)
      fail(key, "must be true or false, got " + value_text(*v));
    return v->boolean;
  }
  std::string string(const char* key, const std::string& fallback, bool required) const {
    const json::Value* v = get(key);
    if (!v) {
      if (required) fail(key, "is missing");
      return fallback;
    }
    if (v->kind != json::Value::Kind::string) fail(key, "must be a string, got " + value_text(*v));
    return v->string;
  }
};

// The rope type and its parameters from rope_parameters (transformers 5) or rope_scaling
// (older files; its type under "rope_type" or "type").
void read_rope(const Reader& top, LlamaArch& a) {
  a.rope_theta = top.number("rope_theta", 10000.0, false);
  const json::Value* params = top.get("rope_parameters");
  const char* name = "rope_parameters";
  if (!params) {
    params = top.get("rope_scaling");
    name = "rope_scaling";
  }
  if (!params) return;
  if (params->kind != json::Value::Kind::object)
    top.fail(name, "must be an object, got " + value_text(*params));
  const Reader r{*params, top.source, std::string(name) + "."};
  if (r.get("rope_theta")) a.rope_theta = r.number("rope_theta", a.rope_theta, true);
  a.rope_type = r.get("rope_type") ? r.string("rope_type", "default", true)
                                   : r.string("type", "default", false);
  if (r.get("partial_rotary_factor") && r.number("partial_rotary_factor", 1, true) != 1.0)
    r.fail("partial_rotary_factor",
           "must be 1 (partial rotary embeddings are not supported), got " +
               value_text(*r.get("partial_rotary_factor")));
  if (a.rope_type == "default") return;
  if (a.rope_type != "llama3")
    r.fail(a.rope_type == r.string("type", "", false) ? "type" : "rope_type",
           "is " + json::quote(a.rope_type) + "; supported: \"default\", \"llama3\"");
  a.rope_factor = r.number("factor", 0, true);
  a.low_freq_factor = r.number("low_freq_factor", 0, true);
  a.high_freq_factor = r.number("high_freq_factor", 0, true);
  a.original_max_positions = r.integer("original_max_position_embeddings", 0, true);
  if (!(a.rope_factor > 0)) r.fail("factor", "must be > 0");
  if (!(a.low_freq_factor > 0)) r.fail("low_freq_factor", "must be > 0");
  if (!(a.high_freq_factor > a.low_freq_factor))
    r.fail("high_freq_factor", "must be greater than low_freq_factor");
}

}  // namespace

LlamaArch parse_llama_config(const std::string& text, const std::string& source) {
  const json::Value root = json::parse(text, source);
  KQLORA_INPUT_CHECK(root.kind == json::Value::Kind::object,
                     source << ": expected a JSON object (a Hugging Face config.json)");
  const Reader r{root, source, ""};
  LlamaArch a;
  a.model_type = r.string("model_type", "", true);
  if (a.model_type != "llama" && a.model_type != "mistral")
    r.fail("model_type", "is " + json::quote(a.model_type) + "; supported: \"llama\", \"mistral\"");
  a.vocab = r.integer("vocab_size", 0, true);
  a.hidden = r.integer("hidden_size", 0, true);
  a.intermediate = r.integer("intermediate_size", 0, true);
  a.layers = r.integer("num_hidden_layers", 0, true);
  a.heads = r.integer("num_attention_heads", 0, true);
  a.kv_heads = r.integer("num_key_value_heads", a.heads, false);
  if (!r.get("num_key_value_heads")) a.notes.push_back("num_key_value_heads: default (heads)");
  if (a.heads % a.kv_heads != 0)
    r.fail("num_key_value_heads", "must divide num_attention_heads " + std::to_string(a.heads) +
                                      ", got " + std::to_string(a.kv_heads));
  if (!r.get("head_dim") && a.hidden % a.heads != 0)
    r.fail("hidden_size", "must be a multiple of num_attention_heads when head_dim is absent");
  a.head_dim = r.integer("head_dim", a.hidden / a.heads, false);
  if (a.head_dim % 2 != 0)
    r.fail("head_dim", "must be even (rotary pairs), got " + std::to_string(a.head_dim));
  a.rms_norm_eps = r.number("rms_norm_eps", 1e-6, false);
  if (!(a.rms_norm_eps > 0)) r.fail("rms_norm_eps", "must be > 0");
  a.max_positions = r.integer("max_position_embeddings", 0, false, 0);
  read_rope(r, a);
  if (!(a.rope_theta > 0)) r.fail("rope_theta", "must be > 0");
  a.tied = r.boolean("tie_word_embeddings", false);
  const std::string act = r.string("hidden_act", "silu", false);
  if (act != "silu") r.fail("hidden_act", "is " + json::quote(act) + "; supported: \"silu\"");
  for (const char* k : {"attention_bias", "mlp_bias"})
    if (r.boolean(k, false)) r.fail(k, "is true; only models without biases are supported");
  if (r.number("attention_dropout", 0, false) != 0.0)
    r.fail("attention_dropout", "must be 0 (attention dropout is not supported), got " +
                                    value_text(*r.get("attention_dropout")));
  if (a.model_type == "mistral") a.sliding_window = r.integer("sliding_window", 0, false);
  return a;
}

std::vector<float> rope_inv_freq(const LlamaArch& a) {
  const int64_t half = a.head_dim / 2;
  const float base = static_cast<float>(a.rope_theta), dim = static_cast<float>(a.head_dim);
  std::vector<float> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    inv[i] = 1.0f / std::pow(base, static_cast<float>(2 * i) / dim);
  if (a.rope_type != "llama3") return inv;
  // transformers' _compute_llama3_parameters: long wavelengths divided by the factor,
  // short ones kept, the band between interpolated.
  const float factor = static_cast<float>(a.rope_factor);
  const float lo = static_cast<float>(a.low_freq_factor),
              hi = static_cast<float>(a.high_freq_factor);
  const float old_len = static_cast<float>(a.original_max_positions);
  const float low_wavelen = old_len / lo, high_wavelen = old_len / hi;
  const float two_pi = static_cast<float>(2 * M_PI);
  for (auto& f : inv) {
    const float wavelen = two_pi / f;
    const float scaled = wavelen > low_wavelen ? f / factor : f;
    const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
    if (medium) {
      const float smooth = (old_len / wavelen - lo) / (hi - lo);
      f = (1 - smooth) * scaled / factor + smooth * scaled;
    } else {
      f = scaled;
    }
  }
  return inv;
}

}  // namespace kqlora
