#include "kqlora/optim/optimizer.hpp"

#include "kqlora/core/error.hpp"

namespace kqlora {

template <class ExecSpace>
Optimizer<ExecSpace>::Optimizer(const ExecSpace& exec, const OptimizerConfig& cfg, int64_t n)
    : exec_(exec), cfg_(cfg) {
  if (cfg.kind == OptimizerConfig::Kind::sgd) {
    if (cfg.momentum != 0) m_ = Vec("kqlora::Optimizer::momentum_buffer", n);
  } else {
    m_ = Vec("kqlora::Optimizer::exp_avg", n);
    v_ = Vec("kqlora::Optimizer::exp_avg_sq", n);
  }
}

template <class ExecSpace>
Optimizer<ExecSpace>::Optimizer(const ExecSpace& exec, const OptimizerConfig& cfg,
                                const std::vector<Vec>& state)
    : exec_(exec), cfg_(cfg) {
  KQLORA_CHECK(state.size() == state_names(cfg).size(),
               "Optimizer: " << state.size() << " state buffers for " << state_names(cfg).size()
                             << " states");
  if (!state.empty()) m_ = state[0];
  if (state.size() > 1) v_ = state[1];
}

template <class ExecSpace>
std::vector<std::string> Optimizer<ExecSpace>::state_names(const OptimizerConfig& cfg) {
  if (cfg.kind == OptimizerConfig::Kind::sgd) {
    if (cfg.momentum == 0) return {};
    return {"momentum_buffer"};
  }
  return {"exp_avg", "exp_avg_sq"};
}

template <class ExecSpace>
std::vector<std::pair<std::string, typename Optimizer<ExecSpace>::Vec>>
Optimizer<ExecSpace>::state() const {
  const auto names = state_names(cfg_);
  std::vector<std::pair<std::string, Vec>> s;
  for (size_t k = 0; k < names.size(); ++k) s.emplace_back(names[k], k == 0 ? m_ : v_);
  return s;
}

template <class ExecSpace>
void Optimizer<ExecSpace>::step(const Vec& p, const Vec& g, double lr_d) {
  ++steps_;
  using Policy = Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<int64_t>>;
  const Policy all(exec_, 0, p.extent(0));
  const float lr = static_cast<float>(lr_d), wd = static_cast<float>(cfg_.weight_decay);
  auto m = m_;
  auto v = v_;
  if (cfg_.kind == OptimizerConfig::Kind::sgd) {
    // torch.optim.SGD (dampening 0, no Nesterov): the buffer starts as the first gradient.
    const float mu = static_cast<float>(cfg_.momentum);
    const bool first = steps_ == 1, use_m = cfg_.momentum != 0;
    Kokkos::parallel_for(
        "kqlora::Optimizer::sgd", all, KOKKOS_LAMBDA(int64_t i) {
          float d = g(i);
          if (wd != 0.0f) d += wd * p(i);
          if (use_m) {
            m(i) = first ? d : mu * m(i) + d;
            d = m(i);
          }
          p(i) -= lr * d;
        });
    return;
  }
  // torch.optim.Adam / AdamW (single-tensor formulas, no amsgrad).
  const bool decoupled = cfg_.kind == OptimizerConfig::Kind::adamw;
  const double b1 = cfg_.beta1, b2 = cfg_.beta2;
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(steps_));
  const double bc2 = 1.0 - std::pow(b2, static_cast<double>(steps_));
  const float step_size = static_cast<float>(lr_d / bc1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float one_minus_b1 = static_cast<float>(1.0 - b1), b2f = static_cast<float>(b2),
              one_minus_b2 = static_cast<float>(1.0 - b2), eps = static_cast<float>(cfg_.eps);
  Kokkos::parallel_for(
      "kqlora::Optimizer::adam", all, KOKKOS_LAMBDA(int64_t i) {
        float grad = g(i);
        if (decoupled) {
          p(i) *= 1.0f - lr * wd;
        } else if (wd != 0.0f) {
          grad += wd * p(i);
        }
        m(i) += one_minus_b1 * (grad - m(i));  // lerp, as PyTorch
        v(i) = b2f * v(i) + one_minus_b2 * grad * grad;
        const float denom = sqrtf(v(i)) / bc2_sqrt + eps;
        p(i) -= step_size * (m(i) / denom);
      });
}

double scheduled_lr(const std::string& schedule, double lr, int64_t step, int64_t warmup,
                    int64_t num_steps) {
  if (step < warmup)
    return lr * static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, warmup));
  if (schedule == "constant") return lr;
  const double progress = static_cast<double>(step - warmup) /
                          static_cast<double>(std::max<int64_t>(1, num_steps - warmup));
  return lr * std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * progress)));
}

template class Optimizer<Kokkos::DefaultExecutionSpace>;

}  // namespace kqlora
