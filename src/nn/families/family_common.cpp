#include "family_common.hpp"

#include <algorithm>
#include <cmath>
#include <optional>
#include <sstream>

#include "kqlora/core/error.hpp"
#include "kqlora/core/memory_budget.hpp"

namespace kqlora::impl {

namespace {

/// A number as a message shows it (1e-300, not 0.000000).
std::string shortest(double v) {
  std::ostringstream o;
  o << v;
  return o.str();
}

/// Sizes read from a file are bounded before anything is allocated from them (rope tables,
/// per-layer specs, the table): set-up holds a whole tensor in float32 at a time, so each
/// single weight they imply -- the embedding, q_proj, an MLP projection -- must fit in this
/// node's memory in float32, and so must the layers' descriptions; the key is named when
/// one does not. No fixed limit: a vocabulary of 262144 or a head_dim of 512 pass where
/// they fit, and what the whole model needs is the memory check's (FSDP shards it).
/// Refuses `shape` (float32 values) when it exceeds this node's memory, naming the largest
/// of `sizes` the file gives (a default is not the cause).
void refuse_beyond_node(HfConfigReader& r, std::vector<std::pair<const char*, int64_t>> sizes,
                        const std::vector<int64_t>& shape, const char* what) {
  const MemoryBudget node = node_memory();
  if (node.bytes <= 0) return;
  double n = 1;  // (in double: the product of hostile sizes overflows int64)
  for (int64_t d : shape) n *= static_cast<double>(d);
  if (n <= static_cast<double>(node.bytes / 4)) return;
  std::pair<const char*, int64_t> named = sizes.front();
  for (const auto& kv : sizes)
    if (r.has(kv.first) && (!r.has(named.first) || kv.second > named.second)) named = kv;
  std::ostringstream count;
  count.precision(4);
  count << n;
  r.fail(named.first, "is " + std::to_string(named.second) + ": " + what + " would hold " +
                          count.str() + " float32 values, more than this node's memory (" +
                          node.source + ")");
}

void bound_sizes(HfConfigReader& r, const DecoderSpec& s) {
  const auto fits = [&](std::vector<std::pair<const char*, int64_t>> sizes,
                        const std::vector<int64_t>& shape,
                        const char* what) { refuse_beyond_node(r, std::move(sizes), shape, what); };
  fits({{"vocab_size", s.vocab}, {"hidden_size", s.hidden}}, {s.vocab, s.hidden}, "the embedding");
  fits({{"head_dim", s.head_dim}, {"num_attention_heads", s.heads}, {"hidden_size", s.hidden}},
       {s.heads, s.head_dim, s.hidden}, "q_proj");
  // (the rope tables are head_dim / 2 values each, computed before the memory check: a head
  // wider than 4 x the model's width, which no model has, is refused before them)
  if (s.head_dim > 4 * s.hidden)
    r.fail("head_dim", "is " + std::to_string(s.head_dim) + ", more than 4 x hidden_size " +
                           std::to_string(s.hidden));
  fits({{"intermediate_size", s.intermediate}, {"hidden_size", s.hidden}},
       {s.intermediate, s.hidden}, "an MLP projection");
  fits({{"num_hidden_layers", s.layers}}, {s.layers, 256},  // (1 KiB a layer: spec, table rows)
       "the layers' descriptions");
}

}  // namespace

void bound_linear_sizes(HfConfigReader& r, const LinearAttentionSpec& L, int64_t hidden) {
  refuse_beyond_node(r,
                     {{"linear_num_key_heads", L.key_heads},
                      {"linear_num_value_heads", L.value_heads},
                      {"linear_key_head_dim", L.key_dim},
                      {"linear_value_head_dim", L.value_dim}},
                     {L.conv_width(), hidden}, "in_proj_qkv");
  refuse_beyond_node(r,
                     {{"linear_num_value_heads", L.value_heads},
                      {"linear_key_head_dim", L.key_dim},
                      {"linear_value_head_dim", L.value_dim}},
                     {L.value_heads, L.key_dim, L.value_dim, 8}, "the delta rule's states");
  refuse_beyond_node(r, {{"linear_conv_kernel_dim", L.kernel}}, {L.conv_width(), L.kernel},
                     "conv1d");
}

void read_dims(HfConfigReader& r, const FamilyDefaults& d, DecoderSpec& s) {
  auto dim = [&](const char* key, int64_t fallback) {
    if (!r.has(key) && fallback > 0)
      s.notes.push_back(std::string(key) + ": default " + std::to_string(fallback));
    return r.integer(key, fallback, fallback <= 0);
  };
  s.vocab = dim("vocab_size", d.vocab);
  s.hidden = dim("hidden_size", d.hidden);
  s.intermediate = dim("intermediate_size", d.intermediate);
  s.layers = dim("num_hidden_layers", d.layers);
  s.heads = dim("num_attention_heads", d.heads);
  s.kv_heads = r.integer("num_key_value_heads", d.kv_heads > 0 ? d.kv_heads : s.heads, false);
  if (!r.has("num_key_value_heads"))
    s.notes.push_back("num_key_value_heads: default " + std::to_string(s.kv_heads));
  if (s.heads % s.kv_heads != 0)
    r.fail("num_key_value_heads", "must divide num_attention_heads " + std::to_string(s.heads) +
                                      ", got " + std::to_string(s.kv_heads));
  if (!r.has("head_dim") && d.head_dim == 0 && s.hidden % s.heads != 0)
    r.fail("hidden_size", "must be a multiple of num_attention_heads when head_dim is absent");
  s.head_dim = r.integer("head_dim", d.head_dim > 0 ? d.head_dim : s.hidden / s.heads, false);
  if (s.head_dim % 2 != 0)
    r.fail("head_dim", "must be even (rotary pairs), got " + std::to_string(s.head_dim));
  bound_sizes(r, s);
  s.norm_eps = r.number("rms_norm_eps", d.norm_eps, false);
  if (!(s.norm_eps > 0)) r.fail("rms_norm_eps", "must be > 0, got " + std::to_string(s.norm_eps));
  s.max_positions = r.integer("max_position_embeddings", d.max_positions, false, 0);
  s.tied = r.boolean("tie_word_embeddings", d.tied);
  s.layer.assign(static_cast<size_t>(s.layers), LayerSpec{});
}

std::vector<ProjectionSpec> llama_projections(bool qkv_bias, bool o_bias, bool mlp_bias) {
  using PI = ProjectionInput;
  return {{"q_proj", "self_attn.q_proj", PI::attn_norm, {Slot::q}, qkv_bias},
          {"k_proj", "self_attn.k_proj", PI::attn_norm, {Slot::k}, qkv_bias},
          {"v_proj", "self_attn.v_proj", PI::attn_norm, {Slot::v}, qkv_bias},
          {"o_proj", "self_attn.o_proj", PI::attn_out, {Slot::o}, o_bias},
          {"gate_proj", "mlp.gate_proj", PI::mlp_norm, {Slot::gate}, mlp_bias},
          {"up_proj", "mlp.up_proj", PI::mlp_norm, {Slot::up}, mlp_bias},
          {"down_proj", "mlp.down_proj", PI::mlp_act, {Slot::down}, mlp_bias}};
}

std::vector<NormSpec> pre_norms(NormKind kind) {
  return {{"input_layernorm", NormRole::attn_in, kind},
          {"post_attention_layernorm", NormRole::mlp_in, kind},
          {"model.norm", NormRole::final, kind}};
}

bool rope_object(HfConfigReader& r, const char** name) {
  for (const char* key : {"rope_parameters", "rope_scaling"})
    if (r.has(key)) {
      *name = key;
      return true;
    }
  return false;
}

namespace {

/// YaRN (gpt-oss) as transformers' _compute_yarn_parameters, in its float32 steps: each
/// frequency blends its interpolated (/ factor) and extrapolated values by a linear ramp
/// over the dimensions between the correction range of beta_fast and beta_slow rotations
/// in the original context; cos and sin times the attention factor (0.1 ln(factor) + 1 by
/// default, or the mscale ratio).
RopeSpec yarn(RopeSpec rope, HfConfigReader& p, int64_t original_max) {
  const double factor = p.number("factor", 0, true);
  if (!(factor >= 1)) p.fail("factor", "must be >= 1 for yarn, got " + shortest(factor));
  if (original_max <= 0) p.fail("original_max_position_embeddings", "is missing (yarn needs it)");
  const auto mscale_of = [&](double m) {
    return factor <= 1 ? 1.0 : 0.1 * m * std::log(factor) + 1;
  };
  const double mscale = p.number("mscale", 0, false), all = p.number("mscale_all_dim", 0, false);
  double attention = p.number("attention_factor", 0, false);
  if (!p.has("attention_factor"))
    attention = mscale != 0 && all != 0 ? mscale_of(mscale) / mscale_of(all) : mscale_of(1);
  // (transformers: `get("beta_fast") or 32`: absent, null or 0 take the default)
  double fast = p.number("beta_fast", 0, false), slow = p.number("beta_slow", 0, false);
  if (fast == 0) fast = 32;
  if (slow == 0) slow = 1;
  const bool truncate = p.boolean("truncate", true);
  const double dim = static_cast<double>(rope.rotary_dim), base = rope.theta;
  const auto correction = [&](double rotations) {
    return dim * std::log(static_cast<double>(original_max) / (rotations * 2 * M_PI)) /
           (2 * std::log(base));
  };
  double low = correction(fast), high = correction(slow);
  if (truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, dim - 1);
  if (low == high) high += 0.001;  // (transformers' guard against a zero-width ramp)
  const float f = static_cast<float>(factor), lo = static_cast<float>(low),
              width = static_cast<float>(high - low);
  for (size_t i = 0; i < rope.inv_freq.size(); ++i) {
    const float pos =
        std::pow(static_cast<float>(base), static_cast<float>(2 * i) / static_cast<float>(dim));
    const float extrapolated = 1.0f / pos, interpolated = 1.0f / (f * pos);
    const float ramp = std::min(1.0f, std::max(0.0f, (static_cast<float>(i) - lo) / width));
    const float keep = 1.0f - ramp;
    rope.inv_freq[i] = interpolated * (1.0f - keep) + extrapolated * keep;
  }
  rope.attention_factor = static_cast<float>(attention);
  return rope;
}

RopeSpec rope_tables(HfConfigReader& top, HfConfigReader* p, double theta, int64_t head_dim,
                     std::optional<double> partial_factor, int64_t max_positions,
                     int64_t original_max, const std::vector<std::string>& allowed) {
  std::string type = "default";
  double partial = partial_factor.value_or(1.0);
  if (p) {
    theta = p->number("rope_theta", theta, false);
    // (re-saved older files carry both spellings)
    const std::string a = p->string("rope_type", "", false), b = p->string("type", "", false);
    if (!a.empty() && !b.empty() && a != b)
      p->fail("type", "is " + json::quote(b) + " but rope_type is " + json::quote(a));
    type = !a.empty() ? a : !b.empty() ? b : "default";
    if (partial_factor) {
      partial = p->number("partial_rotary_factor", partial, false);
    } else if (p->has("partial_rotary_factor") &&
               p->number("partial_rotary_factor", 1, true) != 1) {
      p->fail("partial_rotary_factor",
              "must be 1 for this family (partial rotary embeddings are Phi-3's), got " +
                  value_text(*p->get("partial_rotary_factor")));
    }
    // (a top-level value wins: transformers copies it into the rope object)
    const int64_t inner = p->integer("original_max_position_embeddings", 0, false, 0);
    if (original_max <= 0) original_max = inner;
  }
  auto fail = [&](const char* key, const std::string& what) {
    if (p) p->fail(key, what);
    top.fail(key, what);
  };
  if (!(theta > 0)) fail("rope_theta", "must be > 0, got " + shortest(theta));
  if (!(partial > 0 && partial <= 1))
    fail("partial_rotary_factor", "must be in (0, 1], got " + std::to_string(partial));
  if (type != "default" && std::find(allowed.begin(), allowed.end(), type) == allowed.end()) {
    std::string list;
    for (const auto& a : allowed) list += ", \"" + a + "\"";
    fail(p && p->has("rope_type") ? "rope_type" : "type",
         "is " + json::quote(type) + "; supported here: \"default\"" + list);
  }
  // (Phi-3's older spellings of longrope; gpt-oss's "yarn" is YaRN)
  const bool phi3_spelling =
      std::find(allowed.begin(), allowed.end(), std::string("longrope")) != allowed.end();
  if (type == "su" || (type == "yarn" && phi3_spelling)) type = "longrope";
  RopeSpec rope;
  rope.theta = theta;
  rope.type = type;
  // transformers: dim = int(head_dim * partial_rotary_factor).
  rope.rotary_dim = static_cast<int64_t>(static_cast<double>(head_dim) * partial);
  if (rope.rotary_dim % 2 != 0 || rope.rotary_dim < 2)
    fail("partial_rotary_factor", "gives an odd or empty rotary dimension " +
                                      std::to_string(rope.rotary_dim) + " of head_dim " +
                                      std::to_string(head_dim));
  const int64_t half = rope.rotary_dim / 2;
  const float base = static_cast<float>(theta), dim = static_cast<float>(rope.rotary_dim);
  auto frequencies = [&](const std::vector<double>& ext) {
    std::vector<float> inv(static_cast<size_t>(half));
    for (int64_t i = 0; i < half; ++i) {
      const float b = std::pow(base, static_cast<float>(2 * i) / dim);
      inv[i] = ext.empty() ? 1.0f / b : 1.0f / (static_cast<float>(ext[i]) * b);
    }
    return inv;
  };
  rope.inv_freq = frequencies({});
  // (transformers computes them in float32 too: a theta whose powers overflow or vanish
  // there gives Inf or 0 and then NaN losses)
  for (float f : rope.inv_freq)
    if (!(std::isfinite(f) && f > 0))
      fail("rope_theta", "is " + shortest(theta) +
                             ": its inverse frequencies over a "
                             "rotary dimension of " +
                             std::to_string(rope.rotary_dim) +
                             " are not finite and positive in float32");
  if (type == "default") return rope;
  if (type == "linear") {
    const double factor = p->number("factor", 0, true);
    if (!(factor > 0)) p->fail("factor", "must be > 0, got " + std::to_string(factor));
    for (auto& f : rope.inv_freq) f /= static_cast<float>(factor);
    return rope;
  }
  if (type == "llama3") {
    // transformers' _compute_llama3_parameters: long wavelengths divided by the factor,
    // short ones kept, the band between interpolated.
    const float factor = static_cast<float>(p->number("factor", 0, true));
    const float lo = static_cast<float>(p->number("low_freq_factor", 0, true));
    const float hi = static_cast<float>(p->number("high_freq_factor", 0, true));
    if (!p->has("original_max_position_embeddings"))
      p->fail("original_max_position_embeddings", "is missing");
    if (!(factor > 0)) p->fail("factor", "must be > 0, got " + std::to_string(factor));
    if (!(lo > 0)) p->fail("low_freq_factor", "must be > 0, got " + std::to_string(lo));
    if (!(hi > lo)) p->fail("high_freq_factor", "must be greater than low_freq_factor");
    const float old_len = static_cast<float>(original_max);
    const float low_wavelen = old_len / lo, high_wavelen = old_len / hi;
    const float two_pi = static_cast<float>(2 * M_PI);
    for (auto& f : rope.inv_freq) {
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
    return rope;
  }
  if (type == "yarn") return yarn(rope, *p, original_max);
  // longrope (Phi-3.5, Phi-4-mini): per-frequency factors, the long ones past the original
  // context; cos and sin times an attention factor.
  const auto short_f = p->numbers("short_factor"), long_f = p->numbers("long_factor");
  for (const auto* f : {&short_f, &long_f})
    if (static_cast<int64_t>(f->size()) != half)
      p->fail(f == &short_f ? "short_factor" : "long_factor",
              "must have rotary_dim / 2 = " + std::to_string(half) + " entries, got " +
                  std::to_string(f->size()));
  if (original_max <= 0)
    p->fail("original_max_position_embeddings", "is missing (longrope needs it)");
  rope.inv_freq = frequencies(short_f);
  rope.inv_freq_long = frequencies(long_f);
  rope.long_above = original_max;
  const double factor = p->number(
      "factor", static_cast<double>(max_positions) / static_cast<double>(original_max), false);
  double attention = p->number("attention_factor", 0, false);
  if (!p->has("attention_factor"))
    attention = factor <= 1.0
                    ? 1.0
                    : std::sqrt(1 + std::log(factor) / std::log(static_cast<double>(original_max)));
  rope.attention_factor = static_cast<float>(attention);
  return rope;
}

}  // namespace

RopeSpec read_rope(HfConfigReader& top, HfConfigReader* p, double theta, int64_t head_dim,
                   std::optional<double> partial_factor, int64_t max_positions,
                   int64_t original_max, const std::vector<std::string>& allowed) {
  RopeSpec rope =
      rope_tables(top, p, theta, head_dim, partial_factor, max_positions, original_max, allowed);
  // The scaled tables too: a factor of 1e300 is infinity in float32, its frequencies 0.
  const auto finite_positive = [](const std::vector<float>& v) {
    return std::all_of(v.begin(), v.end(), [](float f) { return std::isfinite(f) && f > 0; });
  };
  if (!finite_positive(rope.inv_freq) || !finite_positive(rope.inv_freq_long) ||
      !(std::isfinite(rope.attention_factor) && rope.attention_factor > 0))
    (p ? *p : top)
        .fail(p ? "factor" : "rope_theta",
              "gives " + rope.type +
                  " rope frequencies (or an attention factor) that are not finite and positive "
                  "in float32");
  return rope;
}

RopeSpec read_config_rope(HfConfigReader& r, double theta, int64_t head_dim,
                          std::optional<double> partial, int64_t max_positions,
                          int64_t original_max, const std::vector<std::string>& allowed) {
  const char* name = nullptr;
  if (!rope_object(r, &name))
    return read_rope(r, nullptr, theta, head_dim, partial, max_positions, original_max, {});
  HfConfigReader p = r.object(name);
  RopeSpec rope = read_rope(r, &p, theta, head_dim, partial, max_positions, original_max, allowed);
  p.finish();
  return rope;
}

void read_layer_types(HfConfigReader& r, int64_t window, const std::vector<bool>& sliding,
                      DecoderSpec& s, const char* window_off) {
  const auto types = r.strings("layer_types");
  if (!types.empty() && static_cast<int64_t>(types.size()) != s.layers)
    r.fail("layer_types", "has " + std::to_string(types.size()) + " entries for " +
                              std::to_string(s.layers) + " layers");
  for (int64_t l = 0; l < s.layers; ++l) {
    bool slides = sliding[static_cast<size_t>(l)];
    if (!types.empty()) {
      const std::string& t = types[static_cast<size_t>(l)];
      if (t != "full_attention" && t != "sliding_attention")
        r.fail("layer_types", "entry " + std::to_string(l) + " is " + json::quote(t) +
                                  "; supported: \"full_attention\", \"sliding_attention\"");
      slides = t == "sliding_attention";
    }
    if (slides && window <= 0 && window_off)
      r.fail("layer_types", "entry " + std::to_string(l) + " is \"sliding_attention\", but " +
                                window_off +
                                " (transformers then gives the layer no window): make them agree");
    if (slides && window <= 0)
      r.fail("sliding_window", "is missing or not positive, but layer " + std::to_string(l) +
                                   " is a sliding-window layer");
    s.layer[static_cast<size_t>(l)].window = slides ? window : 0;
  }
}

void refuse_dropout(HfConfigReader& r, const char* key) {
  r.require_neutral(key, 0.0, "kqlora trains without it (dropout must be 0)");
}

Activation read_activation(HfConfigReader& r, const char* key, const std::string& fallback,
                           bool gelu) {
  const std::string act = r.string(key, fallback, false);
  if (act == "silu") return Activation::silu;
  if (gelu && act == "gelu_pytorch_tanh") return Activation::gelu_tanh;
  r.fail(key, "is " + json::quote(act) + "; supported: \"silu\"" +
                  (gelu ? std::string(", \"gelu_pytorch_tanh\"") : std::string()));
}

void read_router(HfConfigReader& r, int64_t experts_default, int64_t top_k_default,
                 double coef_default, ExpertsSpec& e) {
  // (transformers maps each spelling to the other: a config class saves its own)
  const char* experts_key = r.has("num_local_experts") ? "num_local_experts" : "num_experts";
  e.experts = r.integer(experts_key, experts_default, false, 1);
  if (r.has("num_local_experts") && r.has("num_experts") &&
      r.integer("num_experts", 0, true, 1) != e.experts)
    r.fail("num_experts", "differs from num_local_experts " + std::to_string(e.experts) +
                              " (one is the other's alias)");
  e.top_k = r.integer("num_experts_per_tok", top_k_default, false, 1);
  if (e.top_k > kMaxTopK)
    r.fail("num_experts_per_tok", "is " + std::to_string(e.top_k) + "; kqlora routes at most " +
                                      std::to_string(kMaxTopK) + " experts per token");
  if (e.top_k > e.experts)
    r.fail("num_experts_per_tok", "is " + std::to_string(e.top_k) + ", more than " + experts_key +
                                      " " + std::to_string(e.experts));
  e.aux_loss = r.boolean("output_router_logits", false);
  e.aux_loss_coef = r.number("router_aux_loss_coef", coef_default, false);
  if (!(e.aux_loss_coef >= 0))
    r.fail("router_aux_loss_coef",
           "must be >= 0, got " + value_text(*r.get("router_aux_loss_coef")));
}

void read_sparse_layers(HfConfigReader& r, DecoderSpec& s) {
  const int64_t step = r.integer("decoder_sparse_step", 1, false);
  std::vector<bool> dense_only(static_cast<size_t>(s.layers), false);
  const std::vector<double> dense_layers = r.numbers("mlp_only_layers");
  std::ostringstream listed;  // (for messages: the list as written, compactly)
  for (size_t i = 0; i < dense_layers.size(); ++i) listed << (i ? ", " : "[") << dense_layers[i];
  listed << "]";
  for (double l : dense_layers) {
    if (!(l >= 0 && l < static_cast<double>(s.layers) && l == std::floor(l)))
      r.fail("mlp_only_layers",
             "is " + listed.str() + ": not layer indices below " + std::to_string(s.layers));
    dense_only[static_cast<size_t>(l)] = true;
  }
  // transformers: a layer is sparse when num_experts > 0 and (l + 1) % step == 0, unless
  // mlp_only_layers names it.
  for (int64_t l = 0; l < s.layers; ++l)
    s.layer[static_cast<size_t>(l)].sparse =
        (l + 1) % step == 0 && !dense_only[static_cast<size_t>(l)];
}

void bound_expert_sizes(HfConfigReader& r, const DecoderSpec& s) {
  if (!s.any_sparse_mlp()) return;
  const ExpertsSpec& e = s.experts;
  refuse_beyond_node(r,
                     {{"moe_intermediate_size", e.intermediate},
                      {"intermediate_size", e.intermediate},
                      {"hidden_size", s.hidden}},
                     {e.intermediate, s.hidden}, "an expert's projection");
  refuse_beyond_node(r, {{"num_experts", e.experts}, {"num_local_experts", e.experts}},
                     {e.experts, s.hidden}, "the router");
  // (a table row of about 1 KiB per expert matrix)
  refuse_beyond_node(r,
                     {{"num_experts", e.experts},
                      {"num_local_experts", e.experts},
                      {"num_hidden_layers", s.layers}},
                     {e.experts, s.layers, 3, 256}, "the experts' descriptions");
  refuse_beyond_node(r, {{"shared_expert_intermediate_size", e.shared_intermediate}},
                     {e.shared_intermediate, s.hidden}, "the shared expert's projection");
}

}  // namespace kqlora::impl
