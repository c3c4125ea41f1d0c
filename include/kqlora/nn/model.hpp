#pragma once
// The model interface: what the trainer, data parallelism, checkpoints and exports know of
// a model. A model publishes its parameter table, holds its tensors (the trainable float32
// masters and their gradients in two flat buffers, the frozen NF4 and dense tensors by
// index), and computes the loss of a batch -- with its gradients -- inside its forward and
// backward, divided by a normaliser the trainer passes in (the global count the loss is
// divided by, so micro-batches and ranks add up to the global batch's gradient).

#include <Kokkos_Core.hpp>

#include <functional>
#include <string>
#include <vector>

#include "kqlora/core/bfloat16.hpp"
#include "kqlora/nn/batch.hpp"
#include "kqlora/nn/model_config.hpp"
#include "kqlora/nn/param_table.hpp"
#include "kqlora/quant/nf4_tensor.hpp"

namespace kqlora {

template <class ExecSpace>
class Model {
 public:
  using Mem = typename ExecSpace::memory_space;
  using Vec = Kokkos::View<float*, Mem>;

  virtual ~Model() = default;
  Model(const Model&) = delete;  // (implementations point into their own table)
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return cfg_; }
  /// The execution-space instance its kernels run on (copies of its buffers go on it too).
  const ExecSpace& exec() const { return exec_; }
  const ParamTable& table() const { return table_; }
  int64_t num_params() const { return table_.num_trainable; }
  /// What a batch of this model holds.
  virtual InputSpec input() const = 0;

  /// Master weights and their gradients (float32), flat, laid out as the table says.
  Vec params, grads;
  /// Frozen NF4 tensors (ParamEntry::offset indexes them).
  std::vector<Nf4Tensor<Mem>> nf4;
  /// Frozen dense tensors, as float32 values of their dtype.
  std::vector<Vec> dense;
  /// The compact ones (ParamEntry::compact) in bfloat16, indexed as `dense` (where their
  /// `dense` view is empty).
  std::vector<Kokkos::View<bfloat16*, Mem>> dense_bf16;
  /// A frozen dense tensor's values as float32 on the host (a compact one widened: a copy).
  Kokkos::View<float*, Kokkos::HostSpace> dense_host(const ParamEntry& e) const;
  /// Sets a frozen dense tensor from float32 values of its dtype (a compact one narrowed,
  /// exactly: they are bfloat16 values).
  void set_dense(const ParamEntry& e, const Vec& values);

  /// Moves the master weights and gradients into caller-owned buffers of num_params()
  /// floats (e.g. memory the ranks of a node share) that the caller has filled.
  virtual void use_buffers(const Vec& new_params, const Vec& new_grads);
  /// Call after the master weights change (optimizer step, loading): with dtype bfloat16,
  /// refreshes their rounded copy (compute_).
  virtual void params_changed();

  /// This batch's share of the loss (summed, divided by `normaliser`), with the gradients
  /// added into `grads` -- or written, `accumulate` false: a step's first micro-batch.
  virtual double forward_backward(const Batch<Mem>& batch, double normaliser, bool accumulate) = 0;
  /// The loss alone (evaluation: no dropout, no gradients).
  virtual double loss(const Batch<Mem>& batch, double normaliser) = 0;

  /// Preference objectives (train/preference_loss.hpp) score whole sequences: each row's
  /// summed log-probability of its scored tokens (and their count, into `scored`), from a
  /// forward that keeps what backward_weighted needs when `with_grads` (with dropout: a
  /// training forward). backward_weighted(w) then adds (or writes, `accumulate` false) the
  /// gradient of sum_r w[r] * logp[r] into `grads`. With `prefix_end`, row r's labels at
  /// positions below prefix_end[r] are summed apart, into `prefix_logps` (not counted in
  /// `scored`), and weighted by `prefix_weights` (ORPO's cross-entropy over the prompt).
  /// Models without them: InputError.
  virtual std::vector<double> sequence_logps(const Batch<Mem>& batch, bool with_grads,
                                             std::vector<int64_t>* scored = nullptr,
                                             const std::vector<int64_t>* prefix_end = nullptr,
                                             std::vector<double>* prefix_logps = nullptr);
  virtual void backward_weighted(const std::vector<double>& row_weights, bool accumulate,
                                 const std::vector<double>* prefix_weights = nullptr);
  /// The forward reads `values` (num_params() floats in the table's layout: a frozen
  /// reference's adapters) in place of the masters until use_masters(); rounded to
  /// bfloat16 in a bfloat16 run, as the masters are.
  void use_weights(const Vec& values);
  void use_masters();
  /// The share of the last forward's loss that is an auxiliary loss (a router's
  /// load-balancing loss), for the log; 0 where there is none.
  virtual double aux_loss() const { return 0; }
  /// Model FLOPs of forward_backward on a token batch of that shape (progress lines:
  /// model-FLOPs utilisation); 0 where the model does not count them.
  virtual double train_flops(int64_t sequences, int64_t positions) const {
    (void)sequences;
    (void)positions;
    return 0;
  }

  /// Data-parallel hooks: group_done(g) runs (after a fence) as soon as group g's
  /// gradients are complete; progress() runs between the panels of long products.
  void set_backward_hooks(std::function<void(int)> group_done, std::function<void()> progress);
  /// Sharded NF4 (FSDP): acquire(g) makes every nf4 tensor of group g whole just before a
  /// product reads it, release(g) right after.
  void set_base_hooks(std::function<void(int)> acquire, std::function<void(int)> release);

  /// Bytes of the NF4 tensors held now.
  int64_t nf4_bytes() const;
  /// What the log should say about the model (e.g. defaults its configuration took).
  virtual std::vector<std::string> notes() const { return {}; }

 protected:
  Model(const ExecSpace& exec, const ModelConfig& cfg, ParamTable table, bool zeroed);

  ExecSpace exec_;
  ModelConfig cfg_;
  ParamTable table_;
  /// The trainable weights the forward and backward read: the masters themselves, or with
  /// dtype bfloat16 their bfloat16 rounding (as PyTorch's bfloat16 modules hold them).
  Vec compute_;
  Vec rounded_, rounded_other_;  // (bfloat16 runs) the masters' rounding, use_weights's
  std::function<void(int)> group_done_, acquire_, release_;
  std::function<void()> progress_;

  void group_done(int g) const;
  void acquire(int g) const {
    if (acquire_) acquire_(g);
  }
  void release(int g) const {
    if (release_) release_(g);
  }
  /// A [rows, cols] row-major view of a trainable entry in `v` (params, grads or a copy).
  Matrix<Mem> matrix(const Vec& v, const ParamEntry& e) const;
  Vec vector(const Vec& v, const ParamEntry& e) const;
};

}  // namespace kqlora
