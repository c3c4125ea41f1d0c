#include "bench_gemm_engines.hpp"

#include <Kokkos_Core.hpp>

#include <chrono>
#include <functional>
#include <iomanip>
#include <ostream>
#include <random>

#include "kqlora/core/blas.hpp"
#include "kqlora/core/gemm_engine.hpp"

namespace kqlora::bench {

namespace {

using M = Kokkos::View<float**, Kokkos::LayoutRight, Kokkos::HostSpace>;

struct Product {
  std::string name;
  bool ta, tb;
  int64_t m, n, k;
};

// The step's products (row-major C [m, n] = op(A) op(B)): NT is a linear's forward, NN its
// input gradient, TN a weight gradient.
std::vector<Product> step_products(const LlamaShape& s, int64_t T) {
  const int64_t H = s.hidden, F = s.intermediate, D = H / s.heads, kv = s.kv_heads * D;
  const int64_t chunk = std::min<int64_t>(T, 256), r = 8;
  return {{"q_fwd", false, true, T, H, H},
          {"k_fwd", false, true, T, kv, H},
          {"gate_fwd", false, true, T, F, H},
          {"down_fwd", false, true, T, H, F},
          {"q_bwd", false, false, T, H, H},
          {"k_bwd", false, false, T, H, kv},
          {"gate_bwd", false, false, T, H, F},
          {"down_bwd", false, false, T, F, H},
          {"head_fwd", false, true, chunk, s.vocab, H},
          {"head_bwd", false, false, chunk, H, s.vocab},
          {"attn_qk", false, true, 64, 256, D},
          {"attn_pv", false, false, 64, D, 256},
          {"attn_dk", true, false, 256, D, 64},
          {"lora_a_fwd", false, true, T, r, H},
          {"lora_b_fwd", false, true, T, H, r},
          {"lora_b_grad", true, false, r, H, T}};
}

double seconds_of(const std::function<void()>& f, int reps) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
}

}  // namespace

void gemm_engine_records(const LlamaShape& shape, int64_t tokens, int pairs,
                         const std::string& filter, std::vector<Record>& out,
                         std::ostream& report) {
  if (!onednn_available()) return;
  const GemmEngine was = host_gemm_engine();
  const Kokkos::DefaultHostExecutionSpace exec;
  std::mt19937 gen(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (const Product& p : step_products(shape, tokens)) {
    const std::string base =
        "gemm_engine_" + p.name + "_" + shape.name + "_t" + std::to_string(tokens);
    if (!wanted(base, filter)) continue;
    M A("A", p.ta ? p.k : p.m, p.ta ? p.m : p.k), B("B", p.tb ? p.n : p.k, p.tb ? p.k : p.n),
        C("C", p.m, p.n);
    for (M x : {A, B})
      for (size_t i = 0; i < x.extent(0); ++i)
        for (size_t j = 0; j < x.extent(1); ++j) x(i, j) = u(gen);
    const double flops = 2.0 * p.m * p.n * p.k;
    const int reps = std::max(3, static_cast<int>(2e9 / flops));  // ~10 ms a timing
    auto product = [&] { gemm(exec, p.ta ? "T" : "N", p.tb ? "T" : "N", 1.0f, A, B, 0.0f, C); };
    std::vector<double> tb, td, ratio;
    for (int i = 0; i < pairs + 1; ++i) {  // (the first pair warms up: JIT, first touch)
      set_host_gemm_engine(GemmEngine::blas);
      const double b = seconds_of(product, reps);
      set_host_gemm_engine(GemmEngine::onednn);
      const double d = seconds_of(product, reps);
      if (i == 0) continue;
      tb.push_back(b), td.push_back(d), ratio.push_back(b / d);
    }
    const double bytes = 4.0 * (p.m * p.k + p.k * p.n + p.m * p.n);
    out.push_back(Record{base + "_blas", median(tb), bytes, flops, 0});
    out.push_back(Record{base + "_onednn", median(td), bytes, flops, 0});
    report << base << " (" << p.m << " x " << p.n << " x " << p.k << ", " << (p.ta ? "T" : "N")
           << (p.tb ? "T" : "N") << "): oneDNN " << std::fixed << std::setprecision(2)
           << median(ratio) << "x the BLAS's speed (median of " << pairs << " interleaved pairs)\n"
           << std::defaultfloat;
  }
  set_host_gemm_engine(was);
}

}  // namespace kqlora::bench
