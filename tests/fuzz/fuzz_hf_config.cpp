// libFuzzer: a Hugging Face config.json as the decoder families read it (docs/MODELS.md),
// and the table of the model it describes (sizes overflow-checked, InputError otherwise).
#include <cstdint>
#include <string>

#include "kqlora/core/error.hpp"
#include "kqlora/nn/decoder_spec.hpp"
#include "kqlora/nn/model_config.hpp"
#include "kqlora/nn/model_registry.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const kqlora::DecoderSpec a = kqlora::parse_decoder_config(text, "config.json");
    if (a.layers > 64 || a.hidden > 4096 || a.vocab > (1 << 17)) return 0;  // (time)
    kqlora::ModelConfig m;
    m.kind = "causal_lm";
    m.rank = 4;
    m.arch_text = text;
    (void)kqlora::model_footprint(m);
  } catch (const kqlora::InputError&) {
  }
  return 0;
}
