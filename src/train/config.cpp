#include "kqlora/train/config.hpp"

#include <sys/stat.h>
#include <Kokkos_Macros.hpp>

#include "kqlora/build_config.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "kqlora/core/error.hpp"
#include "kqlora/core/input_file.hpp"
#include "kqlora/core/output_guard.hpp"
#include "kqlora/nn/model_registry.hpp"
#include "kqlora/train/component_configs.hpp"
#include "kqlora/train/memory_check.hpp"

namespace kqlora {

namespace {

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r");
  if (a == std::string::npos) return "";
  const size_t b = s.find_last_not_of(" \t\r");
  return s.substr(a, b - a + 1);
}

int64_t to_int(const std::string& v, const std::string& where) {
  return parse_integer(v, where);
}

double to_float(const std::string& v, const std::string& where) {
  char* end = nullptr;
  errno = 0;
  const double x = std::strtod(v.c_str(), &end);
  KQLORA_INPUT_CHECK(!v.empty() && *end == '\0' && errno == 0 && std::isfinite(x),
                     where << ": expected a finite number, got '" << v << "'");
  return x;
}

bool to_bool(const std::string& v, const std::string& where) {
  if (v == "true" || v == "yes" || v == "on" || v == "1") return true;
  if (v == "false" || v == "no" || v == "off" || v == "0") return false;
  KQLORA_INPUT_CHECK(false, where << ": expected true or false, got '" << v << "'");
}

std::string to_choice(const std::string& v, const std::vector<std::string>& choices,
                      const std::string& where) {
  if (std::find(choices.begin(), choices.end(), v) != choices.end()) return v;
  std::ostringstream os;
  for (size_t i = 0; i < choices.size(); ++i) os << (i ? "|" : "") << choices[i];
  KQLORA_INPUT_CHECK(false, where << ": expected " << os.str() << ", got '" << v << "'");
}

/// The shortest decimal that reads back as x.
std::string fmt(double x) {
  for (int p = 6; p <= 17; ++p) {
    std::ostringstream os;
    os.precision(p);
    os << x;
    if (std::strtod(os.str().c_str(), nullptr) == x) return os.str();
  }
  return std::to_string(x);
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

using Setter = std::function<void(Config&, const std::string&, const std::string&)>;
using Getter = std::function<std::string(const Config&)>;

/// A deck key: everything the parser, --help, the echo and the restart check need.
struct Key {
  std::string name;
  std::string help;  // --help's default text; empty: the default's value (and the choices)
  std::vector<std::string> choices;
  bool model = false;  // a key of the model's configuration
  bool fixed = false;  // must be the same on a restart (the checkpoint cannot carry it over)
  Setter set;
  Getter get;
  /// Non-null where the key does not apply to this configuration: why (the echo then
  /// shows it commented out, so the text parses back to the same configuration).
  std::function<std::string(const Config&)> unused;
};

enum Flags { kPlain = 0, kModel = 1, kFixed = 2 };

Key key(const char* name, int flags, Setter set, Getter get, std::string help = "",
        std::vector<std::string> choices = {}) {
  Key k;
  k.name = name;
  k.help = std::move(help);
  k.choices = std::move(choices);
  k.model = flags & kModel;
  k.fixed = flags & kFixed;
  k.set = std::move(set);
  k.get = std::move(get);
  return k;
}

#define KQ_INT(field, flags, ...)                                                            \
  key(                                                                                       \
      #field, flags,                                                                         \
      [](Config& c, const std::string& v, const std::string& w) { c.field = to_int(v, w); }, \
      [](const Config& c) { return std::to_string(c.field); }, ##__VA_ARGS__)
#define KQ_FLOAT(field, flags, ...)                                                            \
  key(                                                                                         \
      #field, flags,                                                                           \
      [](Config& c, const std::string& v, const std::string& w) { c.field = to_float(v, w); }, \
      [](const Config& c) { return fmt(c.field); }, ##__VA_ARGS__)
#define KQ_CHOICE(field, flags, ...)                              \
  key(                                                            \
      #field, flags,                                              \
      [](Config& c, const std::string& v, const std::string& w) { \
        c.field = to_choice(v, {__VA_ARGS__}, w);                 \
      },                                                          \
      [](const Config& c) { return c.field; }, "", {__VA_ARGS__})
#define KQ_PATH(field, flags)                                                                  \
  key(                                                                                         \
      #field, flags, [](Config& c, const std::string& v, const std::string&) { c.field = v; }, \
      [](const Config& c) { return c.field.empty() ? std::string("none") : c.field; })

/// The model keys a registered model kind reads (all of them: an empty list, or a kind
/// this process does not know).
bool model_reads(const Config& c, const std::string& name) {
  for (const auto& k : model_kinds())
    if (k == c.model) {
      const auto& keys = model_kind(k).deck_keys;
      return keys.empty() || std::find(keys.begin(), keys.end(), name) != keys.end();
    }
  return true;
}

std::vector<Key> make_keys() {
  std::vector<Key> k = {
      key(
          "model", kModel | kFixed,
          [](Config& c, const std::string& v, const std::string& w) {
            // llama is an alias of causal_lm: normalised here, so the echo, checkpoints
            // and restart checks see causal_lm.
            c.model = to_choice(canonical_model_kind(v), model_kinds(), w);
          },
          [](const Config& c) { return c.model; },
          "lora_stack (a registered model kind; llama = causal_lm)"),
      KQ_INT(dim, kModel | kFixed),
      KQ_INT(num_linears, kModel | kFixed),
      KQ_INT(lora_rank, kModel | kFixed, "dim/2"),
      KQ_FLOAT(lora_alpha, kModel | kFixed),
      KQ_FLOAT(lora_dropout, kModel | kFixed),
      KQ_CHOICE(lora_b_init, kModel, "zeros", "kaiming"),
      KQ_PATH(hf_model_dir, kModel),
      key(
          "lora_targets", kModel | kFixed,
          [](Config& c, const std::string& v, const std::string& w) {
            // (the names are the family's: checked against config.json with the model)
            KQLORA_INPUT_CHECK(!v.empty() && v.front() != ',' && v.back() != ',' &&
                                   v.find(",,") == std::string::npos,
                               w << ": expected all-linear or a comma list of projection "
                                    "names, got '"
                                 << v << "'");
            c.lora_targets = v;
          },
          [](const Config& c) { return c.lora_targets; },
          "all-linear|projection names, e.g. q_proj,v_proj (all-linear)"),
      key(
          "activation_checkpointing", kModel,
          [](Config& c, const std::string& v, const std::string& w) {
            c.activation_checkpointing = to_bool(v, w);
          },
          [](const Config& c) {
            return std::string(c.activation_checkpointing ? "true" : "false");
          },
          "false"),
      KQ_CHOICE(activation_dtype, kModel, "auto", "float32", "bfloat16"),
      KQ_CHOICE(router_aux_loss, kModel | kFixed, "auto", "on", "off"),
      key(
          "bias", kModel | kFixed,
          [](Config& c, const std::string& v, const std::string& w) { c.bias = to_bool(v, w); },
          [](const Config& c) { return std::string(c.bias ? "true" : "false"); }, "false"),
      KQ_CHOICE(activation, kModel | kFixed, "none", "relu", "gelu", "silu"),
      KQ_INT(block_size, kModel | kFixed),
      KQ_INT(scaler_block_size, kModel | kFixed),
      key(
          "dtype", kModel | kFixed,
          [](Config& c, const std::string& v, const std::string& w) {
            c.dtype = parse_dtype(v, w);
          },
          [](const Config& c) { return std::string(dtype_name(c.dtype)); }, "",
          {"float32", "bfloat16"}),
      KQ_CHOICE(device, kPlain, "auto", "host", "cuda"),
      KQ_INT(seed, kModel),
      KQ_INT(global_bs, kPlain),
      KQ_INT(micro_bs, kPlain, "global_bs"),
      KQ_INT(num_steps, kPlain),
      KQ_CHOICE(loss, kModel, "sum", "mse", "cross_entropy"),
      KQ_CHOICE(objective, kFixed, "sft", "dpo", "simpo", "orpo"),
      KQ_CHOICE(loss_type, kFixed, "sigmoid", "hinge", "ipo", "robust"),
      KQ_FLOAT(beta, kFixed),
      KQ_FLOAT(label_smoothing, kFixed),
      KQ_FLOAT(simpo_gamma, kFixed),
      key(
          "precompute_ref_log_probs", kPlain,
          [](Config& c, const std::string& v, const std::string& w) {
            c.precompute_ref_log_probs = to_bool(v, w);
          },
          [](const Config& c) {
            return std::string(c.precompute_ref_log_probs ? "true" : "false");
          },
          "false"),
      KQ_CHOICE(optimizer, kFixed, "sgd", "adam", "adamw"),
      KQ_FLOAT(lr, kPlain),
      KQ_FLOAT(momentum, kPlain),
      key(
          "betas", kPlain,
          [](Config& c, const std::string& v, const std::string& w) {
            std::string t = v;
            std::replace(t.begin(), t.end(), ',', ' ');
            std::istringstream ss(t);
            std::string a, b, extra;
            ss >> a >> b >> extra;
            KQLORA_INPUT_CHECK(!a.empty() && !b.empty() && extra.empty(),
                               w << ": expected two numbers (beta1, beta2), got '" << v << "'");
            c.betas = {to_float(a, w), to_float(b, w)};
          },
          [](const Config& c) { return fmt(c.betas[0]) + ", " + fmt(c.betas[1]); }, "0.9,0.999"),
      KQ_FLOAT(eps, kPlain),
      KQ_FLOAT(weight_decay, kPlain, "0 (adamw 0.01)"),
      KQ_CHOICE(lr_schedule, kPlain, "constant", "cosine"),
      KQ_INT(warmup_steps, kPlain),
      KQ_FLOAT(grad_clip, kPlain, "0 (off)"),
      KQ_CHOICE(nonfinite, kPlain, "stop", "skip"),
      KQ_PATH(init_file, kPlain),
      KQ_PATH(data_file, kPlain),
      KQ_PATH(eval_file, kPlain),
      KQ_INT(eval_every, kPlain),
      key(
          "shuffle", kPlain,
          [](Config& c, const std::string& v, const std::string& w) { c.shuffle = to_bool(v, w); },
          [](const Config& c) { return std::string(c.shuffle ? "true" : "false"); }, "false"),
      KQ_CHOICE(parallel, kPlain, "ddp", "fsdp"),
      KQ_CHOICE(comm, kPlain, "auto", "mpi", "nccl"),
      KQ_CHOICE(ddp_shared_memory, kPlain, "auto", "on", "off"),
      KQ_CHOICE(ddp_overlap, kPlain, "auto", "on", "off"),
      KQ_CHOICE(single_process, kPlain, "auto", "off"),
      KQ_CHOICE(tokenizer_check, kPlain, "on", "off"),
      KQ_FLOAT(bucket_mb, kPlain),
      KQ_FLOAT(comm_timeout_s, kPlain),
      key(
          "save_dir", kPlain,
          [](Config& c, const std::string& v, const std::string&) { c.save_dir = v; },
          [](const Config& c) { return c.save_dir; }),
      KQ_INT(checkpoint_every, kPlain, "0 (at the end only)"),
      KQ_CHOICE(checkpoint_layout, kPlain, "per_rank", "shared"),
      KQ_CHOICE(checkpoint_base, kModel, "auto", "true"),
      KQ_INT(keep_last, kPlain, "0 (all)"),
      key(
          "restart", kPlain,
          [](Config& c, const std::string& v, const std::string&) { c.restart = v; },
          [](const Config& c) { return c.restart; }, "none|latest|PATH (none)"),
      KQ_INT(log_every, kPlain),
      KQ_PATH(metrics_file, kPlain),
      KQ_CHOICE(memory_check, kPlain, "on", "off"),
  };
  for (auto& x : k) {
    if (x.name == "momentum")
      x.unused = [](const Config& c) { return c.optimizer != "sgd" ? "sgd only" : ""; };
    if (x.name == "betas" || x.name == "eps")
      x.unused = [](const Config& c) { return c.optimizer == "sgd" ? "adam and adamw only" : ""; };
    if (x.model && x.name != "model") {
      const std::string name = x.name;
      x.unused = [name](const Config& c) {
        return model_reads(c, name) ? std::string() : "not used by model " + c.model;
      };
    }
    if (x.name == "checkpoint_layout") x.help = "per_rank|shared (per_rank; fsdp: shared)";
    // (the preference objectives' keys, where their objective reads them)
    if (x.name == "beta")
      x.unused = [](const Config& c) {
        return c.objective == "sft" ? "preference objectives" : "";
      };
    if (x.name == "loss_type")
      x.unused = [](const Config& c) { return c.objective != "dpo" ? "objective = dpo only" : ""; };
    if (x.name == "precompute_ref_log_probs")
      x.unused = [](const Config& c) { return c.objective != "dpo" ? "objective = dpo only" : ""; };
    if (x.name == "simpo_gamma")
      x.unused = [](const Config& c) {
        return c.objective != "simpo" ? "objective = simpo only" : "";
      };
    if (x.name == "label_smoothing")
      x.unused = [](const Config& c) {
        return c.objective == "simpo" || (c.objective == "dpo" && c.loss_type == "robust")
                   ? ""
                   : "objective = simpo, or dpo with loss_type = robust";
      };
  }
  return k;
}

const std::vector<Key>& keys() {
  static const std::vector<Key> k = make_keys();
  return k;
}

const Key* find_key(const std::string& name) {
  for (const auto& k : keys())
    if (k.name == name) return &k;
  return nullptr;
}

std::string did_you_mean(const std::string& name) {
  const Key* best = nullptr;
  size_t best_d = 4;  // suggest only close names
  for (const auto& k : keys()) {
    const size_t d = edit_distance(name, k.name);
    if (d < best_d) {
      best_d = d;
      best = &k;
    }
  }
  return best ? " (did you mean '" + best->name + "'?)" : "";
}

// `dir_ok`: a directory is a valid value (init_file: a PEFT adapter directory).
void check_readable(const std::string& path, const std::string& where, bool dir_ok) {
  if (path.empty()) return;
  struct stat st {};
  KQLORA_INPUT_CHECK(::stat(path.c_str(), &st) == 0,
                     where << ": cannot read '" << path << "': " << std::strerror(errno));
  if (S_ISDIR(st.st_mode)) {
    KQLORA_INPUT_CHECK(dir_ok, where << ": '" << path << "' is a directory, not a file");
    return;
  }
  std::ifstream f(path, std::ios::binary);
  KQLORA_INPUT_CHECK(f.good(), where << ": cannot read '" << path << "': " << std::strerror(errno));
}

}  // namespace

const std::vector<std::string>& deck_keys() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const auto& k : keys()) n.push_back(k.name);
    return n;
  }();
  return names;
}

std::string Config::to_deck_text() const {
  // Keys that do not apply to this configuration are shown commented out, so the text
  // parses back to the same configuration.
  std::ostringstream os;
  for (const auto& k : keys()) {
    const std::string why = k.unused ? k.unused(*this) : "";
    os << (why.empty() ? "" : "# ") << k.name << " = " << k.get(*this)
       << (why.empty() ? "" : "  (" + why + ")") << "\n";
  }
  return os.str();
}

std::string deck_value(const Config& c, const std::string& name) {
  const Key* k = find_key(name);
  KQLORA_CHECK(k, "no deck key '" << name << "'");
  return k->get(c);
}

std::vector<std::string> restart_fixed_keys(const Config& c) {
  std::vector<std::string> v;
  for (const auto& k : keys())
    if (k.fixed && (!k.unused || k.unused(c).empty())) v.push_back(k.name);
  return v;
}

std::string deck_help(int width) {
  const Config defaults;
  std::ostringstream os;
  std::string line = " ";
  for (size_t i = 0; i < keys().size(); ++i) {
    const Key& k = keys()[i];
    std::string choices;
    for (size_t j = 0; j < k.choices.size(); ++j) choices += (j ? "|" : "") + k.choices[j];
    std::string d = k.help;
    if (d.empty()) {
      std::string v = k.get(defaults);
      d = choices.empty() ? v : choices + " (" + v + ")";
    }
    const std::string item = " " + k.name + " " + d + (i + 1 < keys().size() ? "," : ".");
    if (static_cast<int>(line.size() + item.size()) > width) {
      os << line << "\n";
      line = " ";
    }
    line += item;
  }
  os << line << "\n";
  return os.str();
}

std::string read_deck_file(const std::string& path) {
  check_input_file(path, "a deck file");  // a directory would run on the defaults
  std::ifstream f(path, std::ios::binary);
  KQLORA_INPUT_CHECK(f.good(), path << ": cannot open the deck: " << std::strerror(errno));
  std::stringstream ss;
  ss << f.rdbuf();
  KQLORA_INPUT_CHECK(!f.bad(), path << ": cannot read the deck: " << std::strerror(errno));
  return ss.str();
}

namespace {

/// No run writes over its inputs (docs/RELIABILITY.md, "Writers"): the save_dir may not be
/// or lie in an input; the metrics file may not be or lie in one either (a restart's
/// checkpoint included); and neither the inputs nor the metrics file may lie where
/// checkpoints go -- a step directory or `latest` of the save_dir, which keep_last deletes
/// -- compared with links resolved. A save_dir may hold anything else (it only adds step
/// directories and `latest`), and the init_file may be one of its checkpoints (read first).
template <class At>
void refuse_outputs_over_inputs(const Config& c, const std::string& deck, const At& at) {
  const std::vector<WriterInput> in{{c.data_file, "the data_file"},
                                    {c.eval_file, "the eval_file"},
                                    {c.init_file, "the init_file"},
                                    {c.hf_model_dir, "the hf_model_dir"},
                                    {deck, "the deck"}};
  if (!c.save_dir.empty())
    refuse_output_over_inputs(at("save_dir") + ": save_dir", c.save_dir, in,
                              /*may_contain=*/true);
  if (!c.metrics_file.empty()) {
    std::vector<WriterInput> all = in;
    if (c.restart != "none" && c.restart != "latest")
      all.push_back({c.restart, "the restart checkpoint"});
    refuse_output_over_inputs(at("metrics_file") + ": metrics_file", c.metrics_file, all);
    check_file_output(at("metrics_file") + ": metrics_file", c.metrics_file);
  }
  if (c.save_dir.empty()) return;
  namespace fs = std::filesystem;
  const fs::path dir = fs::weakly_canonical(fs::absolute(c.save_dir));
  std::vector<WriterInput> kept = in;
  kept.push_back({c.metrics_file, "the metrics_file"});
  for (const auto& [p, what] : kept) {
    if (p.empty() || what == "the init_file") continue;
    const fs::path rel = fs::weakly_canonical(fs::absolute(p)).lexically_relative(dir);
    if (rel.empty() || *rel.begin() == ".." || *rel.begin() == ".") continue;
    const std::string first = rel.begin()->string();
    KQLORA_INPUT_CHECK(first.rfind("step-", 0) != 0 && first != "latest",
                       at("save_dir") << ": save_dir " << c.save_dir << ": " << what << " " << p
                                      << " lies where checkpoints are written (" << first
                                      << "): keep_last would delete it");
  }
}

}  // namespace

Config parse_deck(const std::string& path, const std::vector<std::string>& overrides,
                  int world_size, bool check_files) {
  return parse_deck_text(read_deck_file(path), path, overrides, world_size, check_files);
}

Config parse_deck_text(const std::string& text, const std::string& source,
                       const std::vector<std::string>& overrides, int world_size,
                       bool check_files) {
  Config c;
  std::map<std::string, std::string> where;  // key -> "deck.in:12" of its (last) setting
  auto apply = [&](const std::string& line, const std::string& loc, bool is_override) {
    std::string body = line;
    if (!is_override) body = body.substr(0, body.find('#'));
    body = trim(body);
    if (body.empty()) return;
    const size_t eq = body.find('=');
    KQLORA_INPUT_CHECK(eq != std::string::npos,
                       loc << ": expected 'key = value', got '" << body << "'");
    const std::string name = trim(body.substr(0, eq)), value = trim(body.substr(eq + 1));
    KQLORA_INPUT_CHECK(!name.empty(), loc << ": missing key before '='");
    const Key* k = find_key(name);
    KQLORA_INPUT_CHECK(k, loc << ": unknown key '" << name << "'" << did_you_mean(name));
    KQLORA_INPUT_CHECK(!value.empty(), loc << ": " << name << ": missing value");
    if (!is_override) {
      const auto it = where.find(name);
      KQLORA_INPUT_CHECK(it == where.end(), loc << ": duplicate key '" << name << "' (first set at "
                                                << it->second << ")");
    }
    k->set(c, value, loc + ": " + name);
    where[name] = loc;
  };
  KQLORA_INPUT_CHECK(text.find('\0') == std::string::npos,
                     source << ": contains a NUL byte (not a text file?)");
  std::istringstream in(text);
  int lineno = 0;
  for (std::string line; std::getline(in, line);) {
    const std::string loc = source + ":" + std::to_string(++lineno);
    if (!line.empty() && line.back() == '\r') line.pop_back();  // CRLF line endings
    // A lone CR ends no line here: CR-only line endings would make the whole deck one
    // line, and the first '#' would comment out the rest.
    KQLORA_INPUT_CHECK(line.find('\r') == std::string::npos,
                       loc << ": a carriage return inside a line (CR-only line endings?); "
                              "decks need LF or CRLF line endings");
    apply(line, loc, false);
  }
  for (size_t i = 0; i < overrides.size(); ++i) {
    const std::string& o = overrides[i];
    // The checkpoint stores the configuration as deck text: a value must read back as itself.
    const std::string loc = "argument '" + o + "'";
    KQLORA_INPUT_CHECK(o.find('=') != std::string::npos, loc << ": expected key=value");
    KQLORA_INPUT_CHECK(o.find_first_of(std::string("\n\r\0", 3)) == std::string::npos,
                       "argument: a line break or NUL byte in '"
                           << o.substr(0, o.find_first_of(std::string("\n\r\0", 3)))
                           << "...': a value must be one line");
    KQLORA_INPUT_CHECK(o.find('#') == std::string::npos,
                       loc << ": a value cannot contain '#' (in a deck it starts a comment, so "
                              "the configuration stored in checkpoints would not read back)");
    apply(o, loc, true);
  }

  // Defaults that follow other keys.
  const auto set = [&](const char* k) { return where.count(k) > 0; };
  const auto at = [&](const char* k) { return set(k) ? where[k] : source + " (default)"; };
  const bool tokens = model_kind(c.model).tokens;
  if (!set("lora_rank")) c.lora_rank = tokens ? 8 : std::max<int64_t>(1, c.dim / 2);
  if (!set("lora_b_init") && tokens) c.lora_b_init = "zeros";
  if (!set("loss") && tokens) c.loss = "cross_entropy";
  // A model key the chosen model does not read is a mistake, not a no-op.
  for (const auto& k : keys())
    if (k.model && k.name != "model" && set(k.name.c_str()) && !model_reads(c, k.name))
      KQLORA_INPUT_CHECK(false,
                         where[k.name] << ": " << k.name << " does not apply to model " << c.model);
  KQLORA_INPUT_CHECK(
      tokens == (c.loss == "cross_entropy"),
      at("loss") << ": loss " << c.loss
                 << (tokens ? " does not apply to model " + c.model + " (its loss is cross_entropy)"
                            : std::string(": cross_entropy is the loss of "
                                          "token models (model = causal_lm)")));
  KQLORA_INPUT_CHECK(!tokens || !c.hf_model_dir.empty(),
                     at("model") << ": model = " << c.model
                                 << " needs hf_model_dir (a Hugging Face model "
                                    "directory: config.json and model.safetensors)");
  if (!set("micro_bs")) c.micro_bs = c.global_bs;
  if (!set("weight_decay")) c.weight_decay = c.optimizer == "adamw" ? 0.01 : 0.0;
  if (!set("checkpoint_layout")) c.checkpoint_layout = c.parallel == "fsdp" ? "shared" : "per_rank";

  for (std::string* p :
       {&c.init_file, &c.data_file, &c.eval_file, &c.metrics_file, &c.hf_model_dir})
    if (*p == "none") p->clear();

  // Ranges.
  const auto positive = [&](int64_t v, const char* k) {
    KQLORA_INPUT_CHECK(v >= 1, at(k) << ": " << k << " must be at least 1, got " << v);
  };
  const auto non_negative = [&](double v, const char* k) {
    KQLORA_INPUT_CHECK(v >= 0, at(k) << ": " << k << " must be >= 0, got " << v);
  };
  positive(c.dim, "dim");
  positive(c.num_linears, "num_linears");
  positive(c.lora_rank, "lora_rank");
  positive(c.scaler_block_size, "scaler_block_size");
  positive(c.global_bs, "global_bs");
  positive(c.micro_bs, "micro_bs");
  positive(c.log_every, "log_every");
  non_negative(static_cast<double>(c.num_steps), "num_steps");
  non_negative(static_cast<double>(c.seed), "seed");
  non_negative(c.lr, "lr");
  non_negative(c.momentum, "momentum");
  non_negative(c.weight_decay, "weight_decay");
  non_negative(static_cast<double>(c.warmup_steps), "warmup_steps");
  non_negative(c.grad_clip, "grad_clip");
  non_negative(static_cast<double>(c.eval_every), "eval_every");
  non_negative(static_cast<double>(c.checkpoint_every), "checkpoint_every");
  non_negative(static_cast<double>(c.keep_last), "keep_last");
  KQLORA_INPUT_CHECK(c.eps > 0, at("eps") << ": eps must be > 0, got " << c.eps);
  KQLORA_INPUT_CHECK(c.bucket_mb > 0, at("bucket_mb") << ": bucket_mb must be > 0");
  KQLORA_INPUT_CHECK(c.comm_timeout_s > 0, at("comm_timeout_s") << ": comm_timeout_s must be > 0");
  KQLORA_INPUT_CHECK(c.lora_dropout >= 0 && c.lora_dropout < 1,
                     at("lora_dropout")
                         << ": lora_dropout must be in [0, 1), got " << c.lora_dropout);
  for (int i = 0; i < 2; ++i)
    KQLORA_INPUT_CHECK(c.betas[i] >= 0 && c.betas[i] < 1,
                       at("betas") << ": betas must be in [0, 1), got " << c.betas[i]);
  KQLORA_INPUT_CHECK(c.block_size >= 2 && c.block_size % 2 == 0,
                     at("block_size")
                         << ": block_size must be a positive even number, got " << c.block_size);

  // Consistency.
  KQLORA_INPUT_CHECK(tokens || c.lora_rank <= c.dim,
                     at("lora_rank") << ": lora_rank " << c.lora_rank << " > dim " << c.dim);
  // Every NF4 tensor of the chosen model is made of whole blocks (the model's table says
  // which tensors, and their shapes).
  // (A causal_lm's table needs its config.json: read unless the files are not checked.)
  KQLORA_INPUT_CHECK(!tokens || !c.data_file.empty(), at("data_file")
                                                          << ": model = " << c.model
                                                          << " needs a data_file of token ids "
                                                             "(input_ids, labels; docs/MODELS.md)");
  // (The memory check first: its footprint needs no table, and a huge deck's table alone
  // would not fit. Here each rank counts as a node of its own; the trainer checks again
  // with the ranks sharing this node.)
  if (check_files || !tokens)
    check_memory(c, world_size, 1, 0, source, build_placement(1, false, false));
  const ParamTable table = check_files || !tokens ? model_table(model_config(c)) : ParamTable();
  for (const ParamEntry* e : table.of_kind(ParamKind::nf4))
    KQLORA_INPUT_CHECK(e->numel() % c.block_size == 0,
                       at("block_size") << ": block_size " << c.block_size
                                        << " does not divide the size of " << e->name << " "
                                        << e->nf4_layout().shape_string() << " = " << e->numel());
  KQLORA_INPUT_CHECK(world_size <= c.global_bs,
                     at("global_bs") << ": global_bs " << c.global_bs << " is smaller than the "
                                     << world_size << " ranks (each rank needs a sample)");
  KQLORA_INPUT_CHECK(
      !(set("momentum") && c.optimizer != "sgd"),
      where["momentum"] << ": momentum applies to optimizer = sgd, not " << c.optimizer);
  KQLORA_INPUT_CHECK(!(set("betas") && c.optimizer == "sgd"),
                     where["betas"] << ": betas apply to adam and adamw, not sgd");
  KQLORA_INPUT_CHECK(!(set("eps") && c.optimizer == "sgd"),
                     where["eps"] << ": eps applies to adam and adamw, not sgd");
  KQLORA_INPUT_CHECK(c.eval_every == 0 || !c.eval_file.empty(),
                     at("eval_every") << ": eval_every " << c.eval_every << " needs an eval_file");
  KQLORA_INPUT_CHECK(!c.shuffle || !c.data_file.empty(),
                     at("shuffle") << ": shuffle = true needs a data_file (synthetic rows are "
                                      "drawn fresh for every step)");
  KQLORA_INPUT_CHECK(c.activation_dtype != "bfloat16" || c.dtype == DType::bfloat16,
                     at("activation_dtype")
                         << ": activation_dtype = bfloat16 keeps a bfloat16 run's activations in "
                            "16 bits; this run's dtype is "
                         << dtype_name(c.dtype) << " (its activations are float32 values)");
  KQLORA_INPUT_CHECK(c.eval_file.empty() || c.eval_every > 0,
                     at("eval_file") << ": eval_file is set but eval_every is 0");
  if (c.objective != "sft") {
    KQLORA_INPUT_CHECK(c.model == "causal_lm",
                       at("objective")
                           << ": objective = " << c.objective
                           << " scores sequences of a causal_lm, not model = " << c.model);
    KQLORA_INPUT_CHECK(c.beta > 0, at("beta") << ": beta must be > 0, got " << c.beta);
    KQLORA_INPUT_CHECK(!c.data_file.empty(),
                       at("objective")
                           << ": objective = " << c.objective
                           << " needs a data_file of preference pairs "
                              "(tools/tokenize_sft.py; docs/MODELS.md, \"Data files\")");
  }
  KQLORA_INPUT_CHECK(c.label_smoothing >= 0 && c.label_smoothing < 0.5,
                     at("label_smoothing")
                         << ": label_smoothing must be in [0, 0.5), got " << c.label_smoothing);
#if !defined(KOKKOS_ENABLE_CUDA)
  KQLORA_INPUT_CHECK(c.device != "cuda", at("device")
                                             << ": device = cuda, but this kqlora was built "
                                                "without CUDA (its Kokkos runs on "
                                             << Kokkos::DefaultExecutionSpace::name() << ")");
#else
  KQLORA_INPUT_CHECK(c.device != "host",
                     at("device") << ": device = host: this CUDA build runs on the GPU only "
                                     "(build kqlora without CUDA to run on the host)");
#endif
#if !KQLORA_HAVE_NCCL || !defined(KOKKOS_ENABLE_CUDA)
  KQLORA_INPUT_CHECK(c.comm != "nccl", at("comm") << ": comm = nccl, but this kqlora was built "
                                                     "without NCCL on a CUDA Kokkos");
#endif
  for (const char* k : {"init_file", "data_file", "eval_file"}) {
    const std::string& p = std::string(k) == "init_file"   ? c.init_file
                           : std::string(k) == "data_file" ? c.data_file
                                                           : c.eval_file;
    if (check_files) check_readable(p, at(k) + ": " + k, std::string(k) == "init_file");
  }
  if (check_files) refuse_outputs_over_inputs(c, source, at);
  return c;
}

}  // namespace kqlora
