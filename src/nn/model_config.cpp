#include "kqlora/nn/model_config.hpp"

#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "kqlora/core/error.hpp"
#include "kqlora/nn/model_registry.hpp"

namespace kqlora {

Activation parse_activation(const std::string& s) {
  if (s == "relu") return Activation::relu;
  if (s == "gelu") return Activation::gelu;
  if (s == "silu") return Activation::silu;
  KQLORA_INPUT_CHECK(s == "none", "activation: expected none|relu|gelu|silu, got '" << s << "'");
  return Activation::none;
}

const char* activation_name(Activation a) {
  switch (a) {
    case Activation::relu:
      return "relu";
    case Activation::gelu:
      return "gelu";
    case Activation::silu:
      return "silu";
    case Activation::gelu_tanh:
      return "gelu_tanh";
    default:
      return "none";
  }
}

const char* loss_name(LossKind k) {
  return k == LossKind::mse ? "mse" : k == LossKind::cross_entropy ? "cross_entropy" : "sum";
}

namespace {
std::string exact(double x) {  // %.17g: the double back exactly
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", x);
  return buf;
}
}  // namespace

std::string ModelConfig::to_text() const {
  std::ostringstream os;
  os << "model = " << kind << "\ndim = " << dim << "\nnum_linears = " << num_layers
     << "\nlora_rank = " << rank << "\nlora_alpha = " << exact(alpha)
     << "\nlora_dropout = " << exact(dropout)
     << "\nlora_b_init = " << (lora_b_zeros ? "zeros" : "kaiming")
     << "\nbias = " << (bias ? "true" : "false") << "\nactivation = " << activation_name(activation)
     << "\nblock_size = " << block_size << "\nscaler_block_size = " << scaler_block_size
     << "\ndtype = " << dtype_name(dtype) << "\nseed = " << seed << "\nloss = " << loss_name(loss)
     << "\nlora_targets = " << lora_targets << "\nrouter_aux_loss = " << router_aux_loss
     << "\nhf_model_dir = " << (hf_model_dir.empty() ? "none" : hf_model_dir) << "\n";
  return os.str();
}

ModelConfig ModelConfig::from_text(const std::string& text, const std::string& source) {
  ModelConfig c;
  std::istringstream in(text);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    line = line.substr(0, line.find('#'));
    const auto eq = line.find('=');
    if (eq == std::string::npos) continue;
    auto trim = [](std::string s) {
      const auto a = s.find_first_not_of(" \t\r"), b = s.find_last_not_of(" \t\r");
      return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
    };
    const std::string key = trim(line.substr(0, eq)), v = trim(line.substr(eq + 1));
    const std::string where = source + ":" + std::to_string(n) + ": " + key;
    auto integer = [&] {
      char* end = nullptr;
      const long long x = std::strtoll(v.c_str(), &end, 10);
      KQLORA_INPUT_CHECK(!v.empty() && *end == '\0',
                         where << ": expected an integer, got '" << v << "'");
      return static_cast<int64_t>(x);
    };
    auto real = [&] {
      char* end = nullptr;
      const double x = std::strtod(v.c_str(), &end);
      KQLORA_INPUT_CHECK(!v.empty() && *end == '\0',
                         where << ": expected a number, got '" << v << "'");
      return x;
    };
    if (key == "model") {
      c.kind = canonical_model_kind(v);  // (checkpoints before causal_lm say llama)
    } else if (key == "dim") {
      c.dim = integer();
    } else if (key == "num_linears") {
      c.num_layers = integer();
    } else if (key == "lora_rank") {
      c.rank = integer();
    } else if (key == "lora_alpha") {
      c.alpha = real();
    } else if (key == "lora_dropout") {
      c.dropout = real();
    } else if (key == "lora_b_init") {
      KQLORA_INPUT_CHECK(v == "zeros" || v == "kaiming",
                         where << ": expected zeros|kaiming, got '" << v << "'");
      c.lora_b_zeros = v == "zeros";
    } else if (key == "bias") {
      KQLORA_INPUT_CHECK(v == "true" || v == "false",
                         where << ": expected true|false, got '" << v << "'");
      c.bias = v == "true";
    } else if (key == "activation") {
      c.activation = parse_activation(v);
    } else if (key == "block_size") {
      c.block_size = integer();
    } else if (key == "scaler_block_size") {
      c.scaler_block_size = integer();
    } else if (key == "dtype") {
      c.dtype = parse_dtype(v, where);
    } else if (key == "seed") {
      c.seed = static_cast<uint64_t>(integer());
    } else if (key == "loss") {
      c.loss = parse_loss(v);
    } else if (key == "lora_targets") {
      c.lora_targets = v;
    } else if (key == "router_aux_loss") {
      KQLORA_INPUT_CHECK(v == "auto" || v == "on" || v == "off",
                         where << ": expected auto|on|off, got '" << v << "'");
      c.router_aux_loss = v;
    } else if (key == "hf_model_dir") {
      c.hf_model_dir = v == "none" ? "" : v;
    }
  }
  return c;
}

}  // namespace kqlora
