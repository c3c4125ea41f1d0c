#pragma once
// A sparse layer's expert products over all its grouped rows at once (nn/sparse_mlp.hpp's
// path on a device; the host's loops over the experts reach its fused NF4 kernel instead):
// each projection's base product, bias, adapter products and adapter gradients one
// launch for every expert (nn/grouped_expert_products.hpp), with lora_projection.hpp's
// semantics and bfloat16 roundings, so the two paths agree to float32 sum order.
//
// KQLORA_EXPERT_PRODUCTS=grouped|per_expert chooses (default: grouped on a device,
// per_expert on the host; the tests run both on the host).

#include <Kokkos_Core.hpp>

#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

#include "kqlora/core/error.hpp"
#include "kqlora/nn/elementwise.hpp"
#include "kqlora/nn/grouped_expert_products.hpp"
#include "kqlora/nn/lora_projection.hpp"

namespace kqlora {

/// Whether a sparse layer in memory space M runs its experts' products grouped.
template <class M>
bool grouped_expert_products() {
  static const bool grouped = [] {
    const char* v = std::getenv("KQLORA_EXPERT_PRODUCTS");
    const std::string s = v ? v : "";
    KQLORA_INPUT_CHECK(s.empty() || s == "grouped" || s == "per_expert",
                       "KQLORA_EXPERT_PRODUCTS=" << s << ": expected grouped or per_expert");
    return s.empty() ? !std::is_same<M, Kokkos::HostSpace>::value : s == "grouped";
  }();
  return grouped;
}

/// One projection of every expert: its NF4 weights, the adapter's A and B slices and their
/// gradients (none: no adapter), and the bias rows [E, out] (empty: none).
template <class M>
struct GroupedProjection {
  ExpertMatrices<M> w;
  bool lora = false;
  ExpertMatrices<M> a, b, ga, gb;
  float scale = 1.0f;
  Matrix<M> bias;
};

namespace impl {

/// y(n) += bias(expert of row n), rounded once in bfloat16 (add_bias's semantics).
template <class ExecSpace, class M>
void grouped_add_bias(const ExecSpace& exec, const std::vector<int64_t>& offsets,
                      const Matrix<M>& bias, bool bf16, const Matrix<M>& y) {
  Kokkos::View<int64_t*, M> offs("kqlora::grouped::bias_offsets", offsets.size());
  Kokkos::deep_copy(exec, offs,
                    Kokkos::View<const int64_t*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(
                        offsets.data(), offsets.size()));
  const int64_t E = static_cast<int64_t>(offsets.size()) - 1;
  Kokkos::parallel_for(
      "kqlora::grouped_add_bias", over(exec, y.extent(0), y.extent(1)),
      KOKKOS_LAMBDA(int64_t n, int64_t f) {
        int64_t lo = 0, hi = E;  // the expert e with offs(e) <= n < offs(e + 1)
        while (hi - lo > 1) {
          const int64_t mid = (lo + hi) / 2;
          if (offs(mid) <= n)
            lo = mid;
          else
            hi = mid;
        }
        const float v = y(n, f) + bias(lo, f);
        y(n, f) = bf16 ? round_to_bf16(v) : v;
      });
  fence(exec, "kqlora::grouped_add_bias");  // (offs is freed on return)
}

}  // namespace impl

/// y = x W_e^T + b_e (+ scale (x A_e^T) B_e^T, h = x A_e^T kept) for every expert's rows:
/// lora_projection_forward over the groups.
template <class ExecSpace, class M>
void grouped_projection_forward(const ExecSpace& exec, const GroupedProjection<M>& p,
                                const std::vector<int64_t>& offsets, const Matrix<M>& x, bool bf16,
                                const Matrix<M>& h, const Matrix<M>& y) {
  grouped_product(exec, p.w, false, offsets, 1.0f, x, 0.0f, y);
  if (p.bias.data())
    impl::grouped_add_bias(exec, offsets, p.bias, bf16, y);
  else if (bf16 && !p.lora)
    round_bf16(exec, y);
  if (!p.lora) return;
  grouped_product(exec, p.a, false, offsets, 1.0f, x, 0.0f, h);
  if (bf16) {
    round_bf16(exec, h);
    grouped_product(exec, p.b, false, offsets, p.scale, h, 0.0f, y,
                    GroupedEpilogue::bf16_add_scaled);
  } else {
    grouped_product(exec, p.b, false, offsets, p.scale, h, 1.0f, y);
  }
}

/// The adapters' gradients (added into ga, gb) and gx = gy W_e + gx_beta gx plus the
/// adapter's share, for every expert's rows: lora_projection_backward over the groups. `gh`
/// [rows, rank]: scratch.
template <class ExecSpace, class M>
void grouped_projection_backward(const ExecSpace& exec, const GroupedProjection<M>& p,
                                 const std::vector<int64_t>& offsets, const Matrix<M>& gy,
                                 const Matrix<M>& x, const Matrix<M>& h, bool bf16,
                                 const Matrix<M>& gh, float gx_beta, const Matrix<M>& gx) {
  if (p.lora) {
    grouped_row_sums(exec, offsets, p.scale, gy, h, 1.0f, p.gb);       // dB += s gy^T h
    grouped_product(exec, p.b, true, offsets, p.scale, gy, 0.0f, gh);  // gh = s gy B
    if (bf16) round_bf16(exec, gh);
    grouped_row_sums(exec, offsets, 1.0f, gh, x, 1.0f, p.ga);  // dA += gh^T x
  }
  grouped_product(exec, p.w, true, offsets, 1.0f, gy, gx_beta, gx);
  if (p.lora) {
    if (bf16) {
      grouped_product(exec, p.a, true, offsets, 1.0f, gh, 0.0f, gx,
                      GroupedEpilogue::bf16_add_rounded);  // gx = R(gx + R(gh A))
      return;
    }
    grouped_product(exec, p.a, true, offsets, 1.0f, gh, 1.0f, gx);
  }
  if (bf16) round_bf16(exec, gx);
}

}  // namespace kqlora
