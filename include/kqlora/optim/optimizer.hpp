#pragma once
// SGD (with momentum), Adam and AdamW with PyTorch's update formulas and defaults, over
// flat float32 buffers of parameters and gradients.

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace kqlora {

struct OptimizerConfig {
  enum class Kind { sgd, adam, adamw } kind = Kind::adam;
  double lr = 1e-2, momentum = 0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
};

template <class ExecSpace>
class Optimizer {
 public:
  using Mem = typename ExecSpace::memory_space;
  using Vec = Kokkos::View<float*, Mem>;

  Optimizer(const ExecSpace& exec, const OptimizerConfig& cfg, int64_t n);
  /// The state in caller-owned buffers (e.g. shared by the ranks of a node), one per name
  /// of state_names(cfg), each of the length of the parameters it updates.
  Optimizer(const ExecSpace& exec, const OptimizerConfig& cfg, const std::vector<Vec>& state);

  /// The state tensors an optimizer of this configuration keeps, by PyTorch's names.
  static std::vector<std::string> state_names(const OptimizerConfig& cfg);

  /// One update of `params` from `grads` with learning rate `lr` (the schedule's value).
  void step(const Vec& params, const Vec& grads, double lr);

  const OptimizerConfig& config() const { return cfg_; }
  /// Updates done so far (PyTorch's per-parameter `step`).
  int64_t steps() const { return steps_; }
  void set_steps(int64_t s) { steps_ = s; }
  /// The state tensors by PyTorch's names: exp_avg and exp_avg_sq (Adam/AdamW),
  /// momentum_buffer (SGD with momentum); empty for plain SGD.
  std::vector<std::pair<std::string, Vec>> state() const;

 private:
  ExecSpace exec_;
  OptimizerConfig cfg_;
  int64_t steps_ = 0;
  Vec m_, v_;
};

/// The learning rate of step `step` (0-based): constant, or linear warmup then cosine
/// decay to 0 over num_steps (torchtune's get_cosine_schedule_with_warmup); `constant`
/// with warmup ramps up linearly and then stays.
double scheduled_lr(const std::string& schedule, double lr, int64_t step, int64_t warmup,
                    int64_t num_steps);

/// Sum of the squares of a block of 64 floats in double precision, over 8 lanes that the
/// compiler keeps in vector registers (one double accumulator is a chain of dependent adds,
/// several times slower than reading the memory). Host code.
inline double sum_of_squares_64(const float* v) {
  double lanes[8] = {};
  for (int j = 0; j < 64; j += 8)
    for (int l = 0; l < 8; ++l) lanes[l] += static_cast<double>(v[j + l]) * v[j + l];
  return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
         ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

/// Global L2 norm of the gradients (double accumulation); NaN or Inf when any gradient is.
template <class ExecSpace>
double grad_norm(const ExecSpace& exec,
                 const Kokkos::View<float*, typename ExecSpace::memory_space>& g) {
  double ss = 0.0;
  if constexpr (std::is_same<typename ExecSpace::memory_space, Kokkos::HostSpace>::value) {
    // On CPUs, blocks of 64 (sum_of_squares_64).
    constexpr int64_t B = 64;
    const int64_t n = g.extent(0);
    const float* p = g.data();
    Kokkos::parallel_reduce(
        "kqlora::optim::grad_norm",
        Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<int64_t>>(exec, 0, (n + B - 1) / B),
        [=](int64_t b, double& acc) {
          const int64_t i0 = b * B, m = n - i0 < B ? n - i0 : B;
          float v[B] = {};
          for (int64_t j = 0; j < m; ++j) v[j] = p[i0 + j];
          acc += sum_of_squares_64(v);
        },
        ss);
  } else {
    Kokkos::parallel_reduce(
        "kqlora::optim::grad_norm",
        Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<int64_t>>(exec, 0, g.extent(0)),
        KOKKOS_LAMBDA(int64_t i, double& acc) { acc += static_cast<double>(g(i)) * g(i); }, ss);
  }
  return std::sqrt(ss);
}

/// Scales g by `factor`.
template <class ExecSpace>
void scale_grads(const ExecSpace& exec,
                 const Kokkos::View<float*, typename ExecSpace::memory_space>& g, float factor) {
  Kokkos::parallel_for(
      "kqlora::optim::scale_grads",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<int64_t>>(exec, 0, g.extent(0)),
      KOKKOS_LAMBDA(int64_t i) { g(i) *= factor; });
}

}  // namespace kqlora
