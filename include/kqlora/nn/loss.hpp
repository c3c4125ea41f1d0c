#pragma once
// Losses over a model output y [tokens, features]: the value (summed in double) and the
// gradient dL/dy. `count` is the number of elements the loss averages over (mse: the whole
// global batch, so gradients of micro-batches and ranks add up to the global gradient).

#include <Kokkos_Core.hpp>

#include <string>

#include "kqlora/nn/elementwise.hpp"

namespace kqlora {

enum class LossKind { sum, mse, cross_entropy };  // cross_entropy: token models
LossKind parse_loss(const std::string& s);

/// Returns this micro-batch's share of the loss and writes dL/dy into g.
template <class ExecSpace, class M>
double loss_forward_backward(const ExecSpace& exec, LossKind kind, const Matrix<M>& y,
                             const Matrix<M>& target, double count, const Matrix<M>& g) {
  double loss = 0.0;
  const float inv = static_cast<float>(1.0 / count);
  if (kind == LossKind::sum) {
    Kokkos::parallel_reduce(
        "kqlora::loss_sum", over(exec, y.extent(0), y.extent(1)),
        KOKKOS_LAMBDA(int64_t t, int64_t f, double& acc) {
          acc += y(t, f);
          g(t, f) = 1.0f;
        },
        loss);
  } else {
    Kokkos::parallel_reduce(
        "kqlora::loss_mse", over(exec, y.extent(0), y.extent(1)),
        KOKKOS_LAMBDA(int64_t t, int64_t f, double& acc) {
          const float d = y(t, f) - target(t, f);
          acc += static_cast<double>(d) * d;
          g(t, f) = 2.0f * d * inv;
        },
        loss);
    loss /= count;
  }
  return loss;
}

/// The loss alone (evaluation).
template <class ExecSpace, class M>
double loss_value(const ExecSpace& exec, LossKind kind, const Matrix<M>& y, const Matrix<M>& target,
                  double count) {
  double loss = 0.0;
  Kokkos::parallel_reduce(
      "kqlora::loss_value", over(exec, y.extent(0), y.extent(1)),
      KOKKOS_LAMBDA(int64_t t, int64_t f, double& acc) {
        if (kind == LossKind::sum) {
          acc += y(t, f);
        } else {
          const double d = static_cast<double>(y(t, f)) - target(t, f);
          acc += d * d;
        }
      },
      loss);
  return kind == LossKind::sum ? loss : loss / count;
}

}  // namespace kqlora
