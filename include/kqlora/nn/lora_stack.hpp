#pragma once
// The seed scenario's model (kind lora_stack): num_layers LoRA linears of dim x dim over
// frozen NF4 base weights, with torchtune's LoRALinear semantics (scale alpha/rank,
// dropout on the adapter path only, optional bias), the activation between layers, not
// after the last, and the loss (sum or mse) on the last layer's output.
//
// Table: group "layers.<i>" per layer holds layers.<i>.lora_a.weight [rank, dim],
// layers.<i>.lora_b.weight [dim, rank], layers.<i>.bias [dim] (with bias) and the NF4
// layers.<i>.weight [dim, dim]. With dtype bfloat16 the forward and backward read a
// bfloat16-rounded copy of the masters and round activations and gradients to bfloat16 at
// every operation boundary, as PyTorch's bfloat16 tensors do; gemms run in float32.

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <vector>

#include "kqlora/nn/elementwise.hpp"
#include "kqlora/nn/linear_nf4.hpp"
#include "kqlora/nn/model.hpp"

namespace kqlora {

template <class ExecSpace>
class LoraStack : public Model<ExecSpace> {
 public:
  using typename Model<ExecSpace>::Mem;
  using typename Model<ExecSpace>::Vec;

  static ParamTable make_table(const ModelConfig& cfg);

  /// `zeroed` false: the master weights and gradients are allocated but not written (the
  /// caller writes every parameter; a step's first backward writes the gradients). Pages
  /// never written cost nothing: a trainer that fills the weights from a file, or moves
  /// them into node-shared memory, touches each byte once.
  LoraStack(const ExecSpace& exec, const ModelConfig& cfg, bool zeroed = true);

  InputSpec input() const override;
  double forward_backward(const Batch<Mem>& batch, double normaliser, bool accumulate) override;
  double loss(const Batch<Mem>& batch, double normaliser) override;

  /// Forward over a micro-batch x [T, dim]; keeps what backward needs. `training` false:
  /// no dropout. Returns the output [T, dim] (a view into the model's buffers).
  Matrix<Mem> forward(const Matrix<Mem>& x, int64_t step, int64_t first_sample, int64_t global_bs,
                      bool training = true);
  /// Backward from dL/dy [T, dim] of the last forward; adds the gradients into `grads`,
  /// or (`accumulate` false) writes them. gy is used as scratch.
  void backward(const Matrix<Mem>& gy, bool accumulate = true);

 private:
  struct Layer {
    const ParamEntry *a = nullptr, *b = nullptr, *bias = nullptr, *weight = nullptr;
  };
  struct LayerCache {
    Matrix<Mem> x, xd, h, z;  // input, dropped-out input, x_d A^T, pre-activation output
  };

  std::vector<Layer> layers_;
  std::vector<LayerCache> cache_;
  std::vector<Vec> buffers_;         // owned activation and scratch buffers (ensure_tokens)
  Matrix<Mem> tmp_, g_a_, gh_, gy_;  // scratch [T, dim] x3 and [T, rank]
  LinearNf4Workspace<Mem> ws_;
  int64_t tokens_ = 0, step_ = 0, first_sample_ = 0, global_bs_ = 1;
  bool dropout_on_ = false;

  void ensure_tokens(int64_t T);
  Nf4Tensor<Mem>& base(int l) { return this->nf4[layers_[l].weight->offset]; }
  DropoutKey dropout_key(int layer) const;
};

}  // namespace kqlora
