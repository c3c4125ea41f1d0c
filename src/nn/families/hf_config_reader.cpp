#include "hf_config_reader.hpp"

#include <cmath>
#include <sstream>

#include "kqlora/core/error.hpp"

namespace kqlora::impl {

std::string value_text(const json::Value& v) {
  switch (v.kind) {
    case json::Value::Kind::null:
      return "null";
    case json::Value::Kind::boolean:
      return v.boolean ? "true" : "false";
    case json::Value::Kind::number: {
      if (v.is_integer) return std::to_string(v.integer);  // (exactly: 2^34, not 1.71799e+10)
      std::ostringstream os;
      os << v.number;
      return os.str();
    }
    case json::Value::Kind::string:
      return json::quote(v.string);
    default:
      return v.kind_name();  // ("an object", "an array")
  }
}

HfConfigReader::HfConfigReader(const json::Value& obj, std::string source, std::string prefix)
    : obj_(obj), source_(std::move(source)), prefix_(std::move(prefix)) {}

const json::Value* HfConfigReader::get(const char* key) {
  seen_.insert(key);
  const json::Value* v = obj_.find(key);
  return v && v->kind != json::Value::Kind::null ? v : nullptr;
}

bool HfConfigReader::present(const char* key) {
  seen_.insert(key);
  return obj_.find(key) != nullptr;
}

void HfConfigReader::fail(const char* key, const std::string& what) const {
  KQLORA_INPUT_CHECK(false, source_ << ": field '" << prefix_ << key << "' " << what);
}

int64_t HfConfigReader::integer(const char* key, int64_t fallback, bool required, int64_t min) {
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

double HfConfigReader::number(const char* key, double fallback, bool required) {
  const json::Value* v = get(key);
  if (!v) {
    if (required) fail(key, "is missing");
    return fallback;
  }
  if (v->kind != json::Value::Kind::number || !std::isfinite(v->number))
    fail(key, "must be a number, got " + value_text(*v));
  return v->number;
}

bool HfConfigReader::boolean(const char* key, bool fallback) {
  const json::Value* v = get(key);
  if (!v) return fallback;
  if (v->kind != json::Value::Kind::boolean)
    fail(key, "must be true or false, got " + value_text(*v));
  return v->boolean;
}

std::string HfConfigReader::string(const char* key, const std::string& fallback, bool required) {
  const json::Value* v = get(key);
  if (!v) {
    if (required) fail(key, "is missing");
    return fallback;
  }
  if (v->kind != json::Value::Kind::string) fail(key, "must be a string, got " + value_text(*v));
  return v->string;
}

std::vector<double> HfConfigReader::numbers(const char* key) {
  const json::Value* v = get(key);
  std::vector<double> out;
  if (!v) return out;
  if (v->kind != json::Value::Kind::array) fail(key, "must be an array, got " + value_text(*v));
  for (const auto& e : v->array) {
    if (e.kind != json::Value::Kind::number || !std::isfinite(e.number))
      fail(key, "must be an array of numbers, got an element " + value_text(e));
    out.push_back(e.number);
  }
  return out;
}

std::vector<std::string> HfConfigReader::strings(const char* key) {
  const json::Value* v = get(key);
  std::vector<std::string> out;
  if (!v) return out;
  if (v->kind != json::Value::Kind::array) fail(key, "must be an array, got " + value_text(*v));
  for (const auto& e : v->array) {
    if (e.kind != json::Value::Kind::string)
      fail(key, "must be an array of strings, got an element " + value_text(e));
    out.push_back(e.string);
  }
  return out;
}

HfConfigReader HfConfigReader::object(const char* key) {
  const json::Value* v = get(key);
  if (!v || v->kind != json::Value::Kind::object)
    fail(key, "must be an object, got " + (v ? value_text(*v) : std::string("null")));
  return HfConfigReader(*v, source_, prefix_ + key + ".");
}

void HfConfigReader::accept(std::initializer_list<const char*> keys) {
  for (const char* k : keys) seen_.insert(k);
}

void HfConfigReader::require_neutral(const char* key, double neutral, const std::string& why) {
  const json::Value* v = get(key);
  if (!v) return;
  const bool ok = (v->kind == json::Value::Kind::number && v->number == neutral) ||
                  (v->kind == json::Value::Kind::boolean && (v->boolean ? 1.0 : 0.0) == neutral);
  if (!ok) fail(key, "is " + value_text(*v) + "; " + why);
}

void HfConfigReader::finish() const {
  for (const auto& [key, value] : obj_.object)
    // (null: unset; a leading underscore: transformers' private bookkeeping, e.g.
    // _attn_implementation_autoset, never read back into the model)
    if (!seen_.count(key) && value.kind != json::Value::Kind::null && key.rfind('_', 0) != 0)
      fail(key.c_str(), "is " + value_text(value) +
                            ": kqlora does not implement it (docs/MODELS.md lists the fields "
                            "each family reads and accepts)");
}

void accept_common_fields(HfConfigReader& r) {
  // Names, token ids, dtypes, generation and bookkeeping fields of PretrainedConfig (older
  // transformers wrote its generation defaults into config.json too).
  r.accept({"architectures",
            "_name_or_path",
            "transformers_version",
            "dtype",
            "torch_dtype",
            "use_cache",
            "bos_token_id",
            "eos_token_id",
            "pad_token_id",
            "sep_token_id",
            "unk_token_id",
            "mask_token_id",
            "cls_token_id",
            "forced_bos_token_id",
            "forced_eos_token_id",
            "suppress_tokens",
            "begin_suppress_tokens",
            "bad_words_ids",
            "max_length",
            "min_length",
            "do_sample",
            "early_stopping",
            "num_beams",
            "num_beam_groups",
            "diversity_penalty",
            "temperature",
            "top_k",
            "top_p",
            "typical_p",
            "repetition_penalty",
            "length_penalty",
            "no_repeat_ngram_size",
            "encoder_no_repeat_ngram_size",
            "num_return_sequences",
            "output_scores",
            "return_dict_in_generate",
            "remove_invalid_values",
            "exponential_decay_length_penalty",
            "gradient_checkpointing",
            "decoder_start_token_id",
            "initializer_range",
            "output_attentions",
            "output_hidden_states",
            "return_dict",
            "id2label",
            "label2id",
            "problem_type",
            "tokenizer_class",
            "prefix",
            "task_specific_params",
            "finetuning_task",
            "chunk_size_feed_forward",
            "is_encoder_decoder",
            "is_decoder",
            "add_cross_attention",
            "tie_encoder_decoder",
            "cross_attention_hidden_size",
            "use_bfloat16",
            "max_position_embeddings",
            "auto_map",
            "num_labels",
            "pruned_heads",
            "torchscript",
            "tf_legacy_loss",
            "use_return_dict",
            "model_type"});
}

}  // namespace kqlora::impl
