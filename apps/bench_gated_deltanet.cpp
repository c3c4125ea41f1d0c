#include "bench_gated_deltanet.hpp"

#include <random>

#include "kqlora/nn/gated_deltanet.hpp"

namespace kqlora::bench {

void gated_deltanet_records(const std::vector<int64_t>& tokens, int repeats,
                            const std::string& filter, std::vector<Record>& out) {
  using Exec = Kokkos::DefaultExecutionSpace;
  using M = Exec::memory_space;
  GatedDeltaNetShape s;
  s.rule = {16, 16, 128, 128};
  s.kernel = 4;
  double first_per_token = 0;
  for (int64_t T : tokens) {
    Record r;
    r.name = "gated_deltanet_fwd_bwd_t" + std::to_string(T);
    if (!wanted(r.name, filter)) continue;
    Exec exec;
    const int64_t Hv = s.rule.value_heads;
    // Inputs of a trained layer's scale: projections' outputs N(0, 1), a decay of about
    // exp(-0.2) a token, the conv and norm weights as initialised.
    std::mt19937 gen(7);
    std::normal_distribution<float> normal;
    const auto random = [&](int64_t rows, int64_t cols, float scale, float shift) {
      Matrix<M> m("kqlora::bench::x", rows, cols);
      auto h = Kokkos::create_mirror_view(m);
      for (size_t i = 0; i < h.size(); ++i) h.data()[i] = shift + scale * normal(gen);
      Kokkos::deep_copy(m, h);  // device-wide: set-up
      return m;
    };
    const Matrix<M> mixed = random(T, s.conv_dim(), 1, 0), z = random(T, s.value_dim(), 1, 0),
                    b = random(T, Hv, 1, 0), a = random(T, Hv, 1, -2),
                    dy = random(T, s.value_dim(), 1, 0);
    Matrix<M> conv_w = random(1, s.conv_dim() * s.kernel, 0.3f, 0), a_log = random(1, Hv, 0.5f, -2),
              dt_bias = random(1, Hv, 0.5f, 0), norm = random(1, s.rule.dv, 0.1f, 1);
    GatedDeltaNetWeights<M> w{Kokkos::View<const float*, M>(conv_w.data(), conv_w.size()),
                              Kokkos::View<const float*, M>(a_log.data(), Hv),
                              Kokkos::View<const float*, M>(dt_bias.data(), Hv),
                              Kokkos::View<const float*, M>(norm.data(), s.rule.dv)};
    const auto docs = delta_rule_documents(exec, 1, T, nullptr);
    GatedDeltaNetBuffers<M> buf;
    Matrix<M> y("y", T, s.value_dim()), dm("dm", T, s.conv_dim()), dz("dz", T, s.value_dim()),
        db("db", T, Hv), da("da", T, Hv);
    const DocStarts<M> none;
    r.median_s = median_seconds(repeats, [&] {
      gated_deltanet_forward(exec, s, docs, T, none, mixed, z, b, a, w, false, buf, y);
      gated_deltanet_backward(exec, s, docs, T, none, mixed, z, a, w, false, buf, dy, dm, dz, db,
                              da);
    });
    r.elements = static_cast<double>(T);
    // (about 8 (64 (2 dk + dv) + 3 dk dv) flops a token and value head: the rule's forward,
    // its recomputation and gradients, as decoder_train_flops counts them)
    const double dk = static_cast<double>(s.rule.dk), dv = static_cast<double>(s.rule.dv);
    r.flops = static_cast<double>(T * Hv) * 8 * (64 * (2 * dk + dv) + 3 * dk * dv);
    const double per_token = r.median_s / static_cast<double>(T);
    if (first_per_token == 0) first_per_token = per_token;
    r.ratio_to_dense = per_token / first_per_token;
    out.push_back(r);
  }
}

}  // namespace kqlora::bench
