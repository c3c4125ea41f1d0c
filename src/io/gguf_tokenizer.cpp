// tokenizer.ggml.* from a Hugging Face directory, following llama.cpp's converter
// (docs/GGUF.md, "The tokenizer"). Token types: NORMAL 1, UNKNOWN 2, CONTROL 3,
// USER_DEFINED 4, UNUSED 5, BYTE 6.
#include "kqlora/io/gguf_tokenizer.hpp"

#include <charconv>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "kqlora/core/error.hpp"
#include "kqlora/core/json.hpp"
#include "kqlora/io/sentencepiece_model.hpp"

namespace kqlora {

namespace {

enum TokenType : int32_t { kNormal = 1, kControl = 3, kUserDefined = 4, kUnused = 5 };

bool read_text(const std::string& path, std::string& text) {
  std::ifstream f(path, std::ios::binary);
  if (!f.good()) return false;
  std::stringstream ss;
  ss << f.rdbuf();
  text = ss.str();
  return true;
}

/// The JSON file `path`, or a null value when it is not there.
json::Value read_json(const std::string& path) {
  std::string text;
  if (!read_text(path, text)) return json::Value();
  return json::parse(text, path);
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

/// The converter's does_token_look_special: control tokens by their spelling.
bool looks_special(const std::string& t) {
  if (t == "<pad>" || t == "<mask>" || t == "<2mass>" || t == "[@BOS@]") return true;
  if (t.rfind("<|", 0) == 0 && ends_with(t, "|>") && t.size() >= 4) return true;
  if (t.rfind("<\xEF\xBD\x9C", 0) == 0 && ends_with(t, "\xEF\xBD\x9C>") && t.size() >= 8)
    return true;  // <｜...｜> (full-width bars)
  return t.rfind("<unused", 0) == 0 && ends_with(t, ">");
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
  return s;
}

const std::string kSpmSpace = "\xE2\x96\x81";  // U+2581

// tokenizer.json pre_tokenizer Split regexes (as tokenizer.json spells them) and the name
// llama.cpp splits by the same rules (its llama-vocab.cpp keeps these as "original regex
// from tokenizer.json").
const std::map<std::string, std::string>& split_names() {
  static const std::map<std::string, std::string> t = {
      {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
       "llama-bpe"},
      {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
       "qwen2"},
      {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
       "qwen35"},
      {R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
       "gpt-4o"},
  };
  return t;
}

std::string str_field(const json::Value& v, const std::string& key) {
  const json::Value* f = v.find(key);
  return f && f->kind == json::Value::Kind::string ? f->string : std::string();
}

bool bool_field(const json::Value& v, const std::string& key, bool fallback) {
  const json::Value* f = v.find(key);
  return f && f->kind == json::Value::Kind::boolean ? f->boolean : fallback;
}

/// One pre-tokenizer step as the table's key spells it.
std::string step_text(const json::Value& s) {
  const std::string type = str_field(s, "type");
  if (type == "ByteLevel")  // (a prefix space: llama.cpp's BPE never adds one)
    return std::string(bool_field(s, "use_regex", true) ? "ByteLevel(gpt-2 regex" : "ByteLevel(") +
           (bool_field(s, "add_prefix_space", false) ? ", add_prefix_space)" : ")");
  if (type == "Digits")
    return bool_field(s, "individual_digits", false) ? "Digits(individual)" : "Digits";
  if (type == "Split") {
    const json::Value* pattern = s.find("pattern");
    const std::string regex = pattern ? str_field(*pattern, "Regex") : "";
    return "Split(" + regex + ", " + str_field(s, "behavior") +
           (bool_field(s, "invert", false) ? ", inverted)" : ")");
  }
  return type.empty() ? json::write(s) : type;
}

/// llama.cpp's pre-tokenizer name for tokenizer.json's pre_tokenizer; InputError naming
/// it when llama.cpp has none that splits text the same way.
std::string pre_name(const json::Value& tok, const std::string& path) {
  const json::Value* pre = tok.find("pre_tokenizer");
  std::vector<std::string> steps;
  if (pre && pre->kind == json::Value::Kind::object) {
    if (str_field(*pre, "type") == "Sequence" && pre->find("pretokenizers")) {
      for (const json::Value& s : pre->find("pretokenizers")->array) steps.push_back(step_text(s));
    } else {
      steps.push_back(step_text(*pre));
    }
  }
  std::string seen;
  for (const auto& s : steps) seen += (seen.empty() ? "" : " + ") + s;
  // Normalizers: none, or NFC (Qwen's; llama.cpp leaves text as given, already NFC as a rule).
  const json::Value* norm = tok.find("normalizer");
  const std::string norm_type = norm ? str_field(*norm, "type") : "";
  KQLORA_INPUT_CHECK(!norm || norm->kind == json::Value::Kind::null || norm_type == "NFC",
                     path << ": normalizer " << (norm_type.empty() ? json::write(*norm) : norm_type)
                          << " is not applied by llama.cpp's BPE tokenizer (none or NFC here; "
                             "docs/GGUF.md)");
  if (steps.size() == 1 && steps[0] == "ByteLevel(gpt-2 regex)") return "gpt-2";
  if (steps.size() == 2 && steps[0] == "Digits(individual)" && steps[1] == "ByteLevel(gpt-2 regex)")
    return "smollm";
  if (steps.size() == 2 && steps[1] == "ByteLevel()")
    for (const auto& [regex, name] : split_names())
      if (steps[0] == "Split(" + regex + ", Isolated)") return name;
  KQLORA_INPUT_CHECK(false, path << ": pre_tokenizer " << (seen.empty() ? "null" : seen)
                                 << " has no llama.cpp pre-tokenizer here (known: ByteLevel = "
                                    "gpt-2, Digits + ByteLevel = smollm, the Llama 3, Qwen2, "
                                    "Qwen3.5 and GPT-4o splits; docs/GGUF.md); llama.cpp would "
                                    "split text its 'default' way");
  return "";
}

struct Vocab {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<float> scores;  // SentencePiece only
};

/// Holes up to `vocab` as the converter fills them.
Vocab empty_vocab(int64_t vocab, bool scores) {
  Vocab v;
  for (int64_t i = 0; i < vocab; ++i) {
    v.tokens.push_back("[PAD" + std::to_string(i) + "]");
    v.types.push_back(kUnused);
    if (scores) v.scores.push_back(-10000.0f);
  }
  return v;
}

int64_t checked_id(const json::Value& id, int64_t vocab, const std::string& path,
                   const std::string& what) {
  KQLORA_INPUT_CHECK(
      id.kind == json::Value::Kind::number && id.is_integer && id.integer >= 0,
      path << ": " << what << " has id " << json::write(id) << ", expected an integer >= 0");
  KQLORA_INPUT_CHECK(id.integer < vocab, path << ": " << what << " has id " << id.integer
                                              << ", past the model's " << vocab
                                              << " embedding rows (config.json's vocab_size)");
  return id.integer;
}

/// Token i as an added token (tokenizer.json's added_tokens, tokenizer_config.json's
/// added_tokens_decoder `a`): CONTROL when special or special-looking, else USER_DEFINED
/// with U+2581 as a space; score -1000 where the vocab has scores.
void set_added(Vocab& v, int64_t i, const json::Value& a) {
  const std::string content = str_field(a, "content");
  const bool control = bool_field(a, "special", false) || looks_special(content);
  v.tokens[i] = control ? content : replace_all(content, kSpmSpace, " ");
  v.types[i] = control ? kControl : kUserDefined;
  if (!v.scores.empty()) v.scores[i] = -1000.0f;
}

/// tokenizer.json's added tokens over `v`.
void add_added_tokens(const json::Value& tok, int64_t vocab, const std::string& path, Vocab& v) {
  const json::Value* added = tok.find("added_tokens");
  if (!added) return;
  for (const json::Value& a : added->array) {
    const std::string content = str_field(a, "content");
    const json::Value* id = a.find("id");
    KQLORA_INPUT_CHECK(id, path << ": added token '" << content << "' has no id");
    set_added(v, checked_id(*id, vocab, path, "added token '" + content + "'"), a);
  }
}

/// The byte-level BPE of tokenizer.json: its vocab, added tokens and merges.
Vocab bpe_vocab(const json::Value& tok, int64_t vocab, const std::string& path,
                std::vector<std::string>& merges) {
  const json::Value* model = tok.find("model");
  KQLORA_INPUT_CHECK(model && model->kind == json::Value::Kind::object,
                     path << ": no \"model\" object");
  const std::string type = str_field(*model, "type");
  KQLORA_INPUT_CHECK(type == "BPE", path << ": model.type \"" << type
                                         << "\" is not written to GGUF here (byte-level BPE, "
                                            "or a SentencePiece tokenizer.model; docs/GGUF.md)");
  KQLORA_INPUT_CHECK(!bool_field(*model, "byte_fallback", false),
                     path << ": a BPE with byte_fallback (Llama 2 style) needs its "
                             "tokenizer.model beside it (docs/GGUF.md)");
  Vocab v = empty_vocab(vocab, false);
  const json::Value* entries = model->find("vocab");
  KQLORA_INPUT_CHECK(entries && entries->kind == json::Value::Kind::object,
                     path << ": model.vocab is not an object");
  for (const auto& [text, id] : entries->object) {
    const int64_t i = checked_id(id, vocab, path, "token '" + text + "'");
    v.tokens[i] = text;
    v.types[i] = kNormal;
  }
  add_added_tokens(tok, vocab, path, v);
  const json::Value* m = model->find("merges");
  KQLORA_INPUT_CHECK(m && m->kind == json::Value::Kind::array && !m->array.empty(),
                     path << ": model.merges is missing or empty (llama.cpp needs them)");
  for (const json::Value& e : m->array) {
    if (e.kind == json::Value::Kind::string) {  // "a b"
      merges.push_back(e.string);
      continue;
    }
    // ["a", "b"] (tokenizers >= 0.20): a space inside a part spelled as byte-level U+0120,
    // so the one separating space stays unambiguous.
    KQLORA_INPUT_CHECK(e.kind == json::Value::Kind::array && e.array.size() == 2 &&
                           e.array[0].kind == json::Value::Kind::string &&
                           e.array[1].kind == json::Value::Kind::string,
                       path << ": merge " << merges.size() << " is " << json::write(e)
                            << ", expected \"a b\" or [\"a\", \"b\"]");
    merges.push_back(replace_all(e.array[0].string, " ", "\xC4\xA0") + " " +
                     replace_all(e.array[1].string, " ", "\xC4\xA0"));
  }
  return v;
}

/// tokenizer.model's pieces, then tokenizer_config.json's added_tokens_decoder over them
/// (tokenizer.json's added tokens go over both, by the caller).
Vocab spm_vocab(const std::string& path, const json::Value& config, int64_t vocab,
                const std::string& config_path, bool& add_space_prefix) {
  const SentencePieceModel sp = read_sentencepiece_model(path);
  const std::vector<SentencePiece>& pieces = sp.pieces;
  KQLORA_INPUT_CHECK(static_cast<int64_t>(pieces.size()) <= vocab,
                     path << ": " << pieces.size() << " pieces, past the model's " << vocab
                          << " embedding rows (config.json's vocab_size)");
  // llama.cpp's SentencePiece tokenizer merges pieces by score (BPE) on the text as it is,
  // a space spelled U+2581: no other normalization.
  KQLORA_INPUT_CHECK(sp.model_type == 2, path << ": trainer_spec.model_type " << sp.model_type
                                              << " (1 unigram) is not a BPE SentencePiece model; "
                                                 "llama.cpp's \"llama\" tokenizer is BPE");
  KQLORA_INPUT_CHECK(sp.normalizer == "identity" && !sp.remove_extra_whitespaces,
                     path << ": normalizer_spec name \"" << sp.normalizer
                          << "\", remove_extra_whitespaces "
                          << (sp.remove_extra_whitespaces ? "true" : "false")
                          << ": llama.cpp normalizes no text (Llama 2's and Gemma's models: "
                             "identity, false)");
  add_space_prefix = sp.add_dummy_prefix;
  Vocab v = empty_vocab(vocab, true);
  for (size_t i = 0; i < pieces.size(); ++i) {
    v.tokens[i] = pieces[i].piece;
    v.scores[i] = pieces[i].score;
    // (user-defined pieces stay USER_DEFINED, matched whole as SentencePiece does; llama.cpp's
    // converter writes them NORMAL, which splits them unless tokenizer_config.json lists them)
    v.types[i] = static_cast<int32_t>(pieces[i].type);
  }
  const json::Value* decoder = config.find("added_tokens_decoder");
  if (decoder && decoder->kind == json::Value::Kind::object)
    for (const auto& [key, a] : decoder->object) {
      int64_t i = -1;
      const auto [end, err] = std::from_chars(key.data(), key.data() + key.size(), i);
      KQLORA_INPUT_CHECK(
          err == std::errc() && end == key.data() + key.size() && i >= 0,
          config_path << ": added_tokens_decoder key '" << key << "' is not a token id");
      KQLORA_INPUT_CHECK(i < vocab, config_path << ": added token '" << str_field(a, "content")
                                                << "' has id " << i << ", past the model's "
                                                << vocab << " embedding rows");
      set_added(v, i, a);
    }
  return v;
}

/// The id of special token `typ` ("bos", ...): tokenizer_config.json's <typ>_token text
/// among tokenizer.json's added tokens, else config.json's <typ>_token_id; -1: none.
int64_t special_id(const std::string& typ, const json::Value& tok_config, const json::Value& tok,
                   const json::Value& config, int64_t vocab) {
  const json::Value* t = tok_config.find(typ + "_token");
  std::string text = t && t->kind == json::Value::Kind::string   ? t->string
                     : t && t->kind == json::Value::Kind::object ? str_field(*t, "content")
                                                                 : "";
  if (!text.empty())
    if (const json::Value* added = tok.find("added_tokens"))
      for (const json::Value& a : added->array)
        if (str_field(a, "content") == text) {
          const json::Value* id = a.find("id");
          if (id && id->is_integer && id->integer >= 0 && id->integer < vocab) return id->integer;
        }
  const json::Value* id = config.find(typ + "_token_id");
  if (id && id->kind == json::Value::Kind::number && id->is_integer && id->integer >= 0 &&
      id->integer < vocab)
    return id->integer;
  return -1;
}

/// Whether the tokenizer adds BOS / EOS around a text: tokenizer.json's TemplateProcessing
/// (its single template's first / last special token), else tokenizer_config.json's
/// add_bos_token / add_eos_token, else `fallback` (llama.cpp's default for the model).
bool adds(const std::string& typ, int64_t id, const json::Value& tok_config, const json::Value& tok,
          bool fallback) {
  const json::Value* post = tok.find("post_processor");
  std::vector<const json::Value*> procs;
  if (post && post->kind == json::Value::Kind::object) {
    if (str_field(*post, "type") == "Sequence" && post->find("processors")) {
      for (const json::Value& p : post->find("processors")->array) procs.push_back(&p);
    } else {
      procs.push_back(post);
    }
  }
  for (const json::Value* p : procs) {
    if (str_field(*p, "type") != "TemplateProcessing") continue;
    const json::Value* single = p->find("single");
    if (!single || single->array.empty()) continue;
    const json::Value& piece = typ == "bos" ? single->array.front() : single->array.back();
    const json::Value* special = piece.find("SpecialToken");
    if (!special) return false;
    // The token's ids from the template's special_tokens table.
    const std::string name = str_field(*special, "id");
    const json::Value* table = p->find("special_tokens");
    const json::Value* entry = table ? table->find(name) : nullptr;
    const json::Value* ids = entry ? entry->find("ids") : nullptr;
    return ids && ids->array.size() == 1 && ids->array[0].integer == id;
  }
  return bool_field(tok_config, "add_" + typ + "_token", fallback);
}

}  // namespace

GgufTokenizerReport add_gguf_tokenizer(gguf::Writer& w, const std::string& hf_dir, int64_t vocab,
                                       const std::string& source) {
  const std::string& dir = hf_dir;
  const std::string tok_path = dir + "/tokenizer.json", spm_path = dir + "/tokenizer.model";
  const std::string cfg_path = dir + "/tokenizer_config.json";
  std::error_code ec;
  const bool has_spm = !dir.empty() && std::filesystem::is_regular_file(spm_path, ec);
  const bool has_tok = !dir.empty() && std::filesystem::is_regular_file(tok_path, ec);
  if (!has_spm && !has_tok) {
    w.add("tokenizer.ggml.model", "none");
    return {"none: hf_model_dir '" + dir + "' has no tokenizer.json or tokenizer.model (" + source +
            "); llama.cpp runs token ids only"};
  }
  const json::Value tok = has_tok ? read_json(tok_path) : json::Value();
  const json::Value tok_config = read_json(cfg_path);
  const json::Value config = read_json(dir + "/config.json");

  Vocab v;
  std::vector<std::string> merges;
  std::string model, pre, from;
  bool space_prefix = false;
  if (has_spm) {  // as llama.cpp's converter: a SentencePiece model first
    model = "llama";
    pre = "default";
    v = spm_vocab(spm_path, tok_config, vocab, cfg_path, space_prefix);
    add_added_tokens(tok, vocab, tok_path, v);  // (Phi-3's <|end|>, ... past the pieces)
    from = "tokenizer.model";
  } else {
    model = "gpt2";
    pre = pre_name(tok, tok_path);
    v = bpe_vocab(tok, vocab, tok_path, merges);
    from = "tokenizer.json";
  }
  std::map<std::string, int> seen;  // llama.cpp needs every token's text unique
  for (size_t i = 0; i < v.tokens.size(); ++i)
    KQLORA_INPUT_CHECK(seen.emplace(v.tokens[i], static_cast<int>(i)).second,
                       dir << "/" << from << ": token '" << v.tokens[i] << "' has ids "
                           << seen[v.tokens[i]] << " and " << i
                           << " (llama.cpp needs every token's text unique)");
  w.add("tokenizer.ggml.model", model);
  w.add("tokenizer.ggml.pre", pre);
  w.add_strings("tokenizer.ggml.tokens", v.tokens);
  w.add_i32s("tokenizer.ggml.token_type", v.types);
  if (!v.scores.empty()) w.add_f32s("tokenizer.ggml.scores", v.scores);
  if (!merges.empty()) w.add_strings("tokenizer.ggml.merges", merges);
  // SentencePiece's dummy prefix (a space before the text: Llama 2 yes, Gemma no).
  if (model == "llama") w.add_bool("tokenizer.ggml.add_space_prefix", space_prefix);
  std::string ids;
  int64_t bos = -1, eos = -1;
  for (const char* typ : {"bos", "eos", "unk", "pad"}) {
    const int64_t id = special_id(typ, tok_config, tok, config, vocab);
    if (id < 0) continue;
    static const std::map<std::string, std::string> key = {{"bos", "bos_token_id"},
                                                           {"eos", "eos_token_id"},
                                                           {"unk", "unknown_token_id"},
                                                           {"pad", "padding_token_id"}};
    w.add_u32("tokenizer.ggml." + key.at(typ), static_cast<uint32_t>(id));
    ids += std::string(ids.empty() ? "" : ", ") + typ + " " + std::to_string(id);
    if (typ == std::string("bos")) bos = id;
    if (typ == std::string("eos")) eos = id;
  }
  const bool add_bos = adds("bos", bos, tok_config, tok, model == "llama");
  const bool add_eos = adds("eos", eos, tok_config, tok, false);
  w.add_bool("tokenizer.ggml.add_bos_token", add_bos);
  w.add_bool("tokenizer.ggml.add_eos_token", add_eos);
  // The chat template: tokenizer_config.json's, else chat_template.jinja, else
  // chat_template.json's (named templates: the "default" one).
  // A template of another shape is refused: dropping it would export a model that chats
  // differently, silently.
  using K = json::Value::Kind;
  auto template_of = [](const json::Value* t, const std::string& where) {
    if (!t || t->kind == K::null) return std::string();
    if (t->kind == K::string) return t->string;
    const char* shape = "each named template must be {\"name\": string, \"template\": string}";
    KQLORA_INPUT_CHECK(t->kind == K::array, where << ": chat_template is not a string or a list "
                                                     "of named templates; "
                                                  << shape);
    std::string chosen;
    for (const json::Value& named : t->array) {
      const json::Value* n = named.find("name");
      const json::Value* body = named.find("template");
      KQLORA_INPUT_CHECK(
          named.kind == K::object && n && n->kind == K::string && body && body->kind == K::string,
          where << ": chat_template: " << shape);
      if (n->string == "default") chosen = body->string;
    }
    return chosen;
  };
  std::string chat = template_of(tok_config.find("chat_template"), cfg_path);
  if (chat.empty() && !read_text(dir + "/chat_template.jinja", chat)) {
    const json::Value j = read_json(dir + "/chat_template.json");
    chat = template_of(j.find("chat_template"), dir + "/chat_template.json");
  }
  if (!chat.empty()) w.add("tokenizer.chat_template", chat);
  std::ostringstream s;
  s << model << " (" << from << (model == "gpt2" ? ", pre-tokenizer " + pre : std::string())
    << "), " << v.tokens.size() << " tokens" << (merges.empty() ? "" : ", ")
    << (merges.empty() ? std::string() : std::to_string(merges.size()) + " merges") << "; "
    << (ids.empty() ? "no special ids" : ids) << "; add_bos " << (add_bos ? "true" : "false")
    << ", add_eos " << (add_eos ? "true" : "false")
    << (chat.empty() ? "; no chat template" : "; chat template") << " (from " << dir << ")";
  return {s.str()};
}

}  // namespace kqlora
