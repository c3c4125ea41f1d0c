#pragma once
// The QLoRA model: num_layers LoRA linears of dim x dim over frozen NF4 base weights, with
// torchtune's LoRALinear semantics (scale alpha/rank, dropout on the adapter path only,
// optional bias) and the activation between layers, not after the last.
//
// Trainable parameters live in one flat float32 buffer (the master weights), gradients in
// another, with named views into both (llm.c's ParameterTensors): the optimizer and the
// gradient reduction see one array. With dtype bfloat16 the forward and backward read a
// bfloat16-rounded copy of the masters and round activations and gradients to bfloat16 at
// every operation boundary, as PyTorch's bfloat16 tensors do; gemms run in float32.

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kqlora/nn/elementwise.hpp"
#include "kqlora/nn/linear_nf4.hpp"
#include "kqlora/quant/nf4_tensor.hpp"

namespace kqlora {

struct ModelConfig {
  int64_t dim = 128, num_layers = 1, rank = 64;
  float alpha = 16, dropout = 0;
  bool bias = false;
  Activation activation = Activation::none;
  DType dtype = DType::float32;
  int64_t block_size = 64, scaler_block_size = 256;
  uint64_t seed = 42;
  bool lora_b_zeros = false;

  float scale() const { return alpha / static_cast<float>(rank); }
  bool bf16() const { return dtype == DType::bfloat16; }
};

/// A trainable tensor in the flat buffers.
struct ParamInfo {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0, numel = 0;
};

template <class ExecSpace>
class LoraModel {
 public:
  using Mem = typename ExecSpace::memory_space;
  using Vec = Kokkos::View<float*, Mem>;

  /// `zeroed` false: the master weights and gradients are allocated but not written (the
  /// caller writes every parameter, and zeroes the gradients or runs the first backward
  /// with accumulate false). Pages never written cost nothing: a trainer that fills the
  /// weights from a file, or moves them into node-shared memory, touches each byte once.
  LoraModel(const ExecSpace& exec, const ModelConfig& cfg, bool zeroed = true);

  const ModelConfig& config() const { return cfg_; }
  const std::vector<ParamInfo>& params_info() const { return info_; }
  const ParamInfo& param(const std::string& name) const;
  int64_t num_params() const { return static_cast<int64_t>(params.extent(0)); }

  /// Base weight names: layers.<i>.weight.
  static std::string base_name(int layer);

  /// Frozen NF4 base weights, one per layer.
  std::vector<Nf4Tensor<Mem>> base;
  /// Master weights and their gradients (float32), flat.
  Vec params, grads;

  /// Moves the master weights and the gradients into caller-owned buffers of
  /// num_params() floats (e.g. memory shared by the ranks of a node) that the caller has
  /// filled with their current values; the model reads and writes only them from then on.
  void use_buffers(const Vec& new_params, const Vec& new_grads);

  /// Call after the master weights change (optimizer step, loading): refreshes the
  /// bfloat16 compute copy. A no-op for float32.
  void params_changed();

  /// Forward over a micro-batch x [T, dim] (T <= max_tokens); keeps what backward needs.
  /// `step` and `first_sample` (the global index of x's first row) key the dropout masks.
  /// Returns the output [T, dim] (a view into the model's buffers).
  Matrix<Mem> forward(const Matrix<Mem>& x, int64_t step, int64_t first_sample, int64_t global_bs);
  /// Backward from dL/dy [T, dim] of the last forward; adds the gradients into `grads`,
  /// or (`accumulate` false: a step's first micro-batch) writes them, so that no pass
  /// zeroes them first. gy is used as scratch (its contents are gone afterwards).
  void backward(const Matrix<Mem>& gy, bool accumulate = true);

  /// Hooks for data parallelism: layer_done(l) runs (after a fence) as soon as layer l's
  /// parameter gradients are complete, before its input gradient is computed;
  /// progress() runs between the panels of the long products. Empty functions: none.
  void set_backward_hooks(std::function<void(int)> layer_done, std::function<void()> progress);

  /// Hooks for sharded base weights (FSDP): acquire(l) makes base[l] the whole weight just
  /// before the forward or backward product that reads it, release(l) right after.
  void set_base_hooks(std::function<void(int)> acquire, std::function<void(int)> release);

  /// Bytes of the NF4 base weights.
  int64_t base_bytes() const;

 private:
  struct LayerCache {
    Matrix<Mem> x, xd, h, z;  // input, dropped-out input, x_d A^T, pre-activation output
  };

  ExecSpace exec_;
  ModelConfig cfg_;
  std::vector<ParamInfo> info_;
  Vec compute_;  // what forward/backward read: params, or their bfloat16 rounding
  std::vector<LayerCache> cache_;
  std::vector<Vec> buffers_;    // owned activation and scratch buffers (ensure_tokens)
  Matrix<Mem> tmp_, g_a_, gh_;  // scratch [T, dim] x2 and [T, rank]
  LinearNf4Workspace<Mem> ws_;
  std::function<void(int)> layer_done_, acquire_base_, release_base_;
  int64_t tokens_ = 0, step_ = 0, first_sample_ = 0, global_bs_ = 1;

  void ensure_tokens(int64_t T);
  Matrix<Mem> a_of(const Vec& v, int layer) const;  // A [rank, dim] in v (row-major)
  Matrix<Mem> b_of(const Vec& v, int layer) const;  // B [dim, rank] in v
  Kokkos::View<float*, Mem> bias(const Vec& v, int layer) const;
  nn::DropoutKey dropout_key(int layer) const;
};

}  // namespace kqlora
