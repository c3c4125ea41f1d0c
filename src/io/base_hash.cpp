#include "kqlora/io/base_hash.hpp"

#include <algorithm>
#include <vector>

#include "kqlora/core/content_hash.hpp"
#include "kqlora/core/error.hpp"

namespace kqlora {

std::string base_hash(const ParamTable& table,
                      const std::function<Nf4Tensor<Kokkos::HostSpace>(const ParamEntry&)>& nf4,
                      const std::function<FloatSpan(const ParamEntry&)>& dense) {
  ContentHash h;
  for (const ParamEntry* e : table.of_kind(ParamKind::nf4)) {
    const auto t = nf4(*e);
    h.add(e->name);
    h.add(t.layout.shape_string() + " " + dtype_name(t.layout.dtype) + " " +
          std::to_string(t.layout.block_size) + "/" + std::to_string(t.layout.scaler_block_size));
    h.add(t.quantized_data.data(), t.quantized_data.extent(0));
    h.add(t.quantized_scalers.data(), t.quantized_scalers.extent(0));
    h.add(t.quantization_factor.data(), sizeof(float) * t.quantization_factor.extent(0));
    h.add(&t.scaler_mean, sizeof(float));
  }
  for (const ParamEntry* e : table.of_kind(ParamKind::dense)) {
    const FloatSpan v = dense(*e);
    h.add(e->name);
    if (!v.bf16) {
      h.add(v.data, sizeof(float) * static_cast<size_t>(v.size));
      continue;
    }
    // (widened a slab at a time, an even count: whole words but in the last)
    const int64_t slab = std::min<int64_t>(v.size, int64_t(1) << 20);
    std::vector<float> w(static_cast<size_t>(slab));
    const size_t total = sizeof(float) * static_cast<size_t>(v.size);
    for (int64_t first = 0; first < v.size; first += slab) {
      const int64_t c = std::min(slab, v.size - first);
      for (int64_t i = 0; i < c; ++i)
        w[static_cast<size_t>(i)] = static_cast<float>(v.bf16[first + i]);
      if (first + c < v.size)
        h.add_words(w.data(), sizeof(float) * static_cast<size_t>(c));
      else
        h.add_last(w.data(), sizeof(float) * static_cast<size_t>(c), total);
    }
  }
  return h.hex();
}

std::string base_hash(const CheckpointContents& c, const std::string& where) {
  return base_hash(
      c.table,
      [&](const ParamEntry& e) {
        for (const auto& [name, t] : c.nf4)
          if (name == e.name) return t;
        KQLORA_INPUT_CHECK(false, where << ": NF4 tensor '" << e.name << "' is missing");
      },
      [&](const ParamEntry& e) {
        for (const auto& t : c.params)
          if (t.name == e.name)
            return FloatSpan{t.data.data(), static_cast<int64_t>(t.data.size())};
        KQLORA_INPUT_CHECK(false, where << ": tensor '" << e.name << "' is missing");
      });
}

}  // namespace kqlora
