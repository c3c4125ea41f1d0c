#pragma once
// The decoder's names and views shared by its files (src/nn/causal_lm.cpp and the
// sublayers' decoder_*.cpp): Hugging Face's tensor names of a layer, and a buffer's views.

#include <string>

#include "kqlora/core/blas.hpp"
#include "kqlora/nn/decoder_spec.hpp"

namespace kqlora::decoder {

inline std::string layer_prefix(int l) {
  return "model.layers." + std::to_string(l);
}

/// Expert j's weight w (0 gate, 1 up, 2 down) of layer prefix g: the hub's per-expert name.
inline std::string expert_weight_name(const DecoderSpec& s, const std::string& g, int64_t j,
                                      int w) {
  const ExpertsSpec& e = s.experts;
  return g + "." + e.experts_module + "." + std::to_string(j) + "." +
         (w == 0   ? e.gate_name
          : w == 1 ? e.up_name
                   : e.down_name) +
         ".weight";
}

/// The norm's weight name: a layer's module, or the final norm's own path.
inline std::string norm_name(const NormSpec& n, const std::string& layer) {
  return n.role == NormRole::final ? n.module + ".weight" : layer + "." + n.module + ".weight";
}

/// Whether layer l has norm n: the q and k norms are an attention layer's.
inline bool layer_has_norm(const DecoderSpec& s, int64_t l, const NormSpec& n) {
  const bool qk = n.role == NormRole::q || n.role == NormRole::k || n.role == NormRole::v;
  const LayerSpec& at = s.layer[static_cast<size_t>(l)];
  // (Gemma 4's MoE block's norms: on its sparse layers)
  if (n.role == NormRole::dense_out || n.role == NormRole::experts_in ||
      n.role == NormRole::experts_out)
    return at.sparse;
  // (a layer attending over another's keys and values has no k or v norm: Gemma 4)
  if ((n.role == NormRole::k || n.role == NormRole::v) && at.kv_source >= 0) return false;
  return !qk || at.mixer == Mixer::attention;
}

/// A [T, width] buffer viewed as [T * width / d, d] rows (per-head norms).
template <class M>
Matrix<M> per_head(const Matrix<M>& m, int64_t d) {
  return Matrix<M>(m.data(), m.extent(0) * m.extent(1) / d, d);
}

/// A matrix's values as one vector.
template <class M>
Kokkos::View<float*, M> flat(const Matrix<M>& m) {
  return Kokkos::View<float*, M>(m.data(), m.extent(0) * m.extent(1));
}

}  // namespace kqlora::decoder
