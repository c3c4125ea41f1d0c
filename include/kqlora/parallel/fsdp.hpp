#pragma once
// FSDP: the NF4 base weights, quantized globally, live as shards of whole scaler blocks
// (nf4_shard: any N, padded to equal sizes); each parameter group's NF4 weights are
// all-gathered just before a product reads them, forward and backward, and freed right
// after. Frozen dense tensors (groups without NF4: an embedding, a head) stay replicated. The flat
// LoRA parameter vector is split into N equal (padded) chunks: each rank owns one chunk and its
// optimizer state; gradients are reduce-scattered onto the owners, and the updated chunks
// all-gathered so that every rank computes with the whole (small) adapter set.

#include <Kokkos_Core.hpp>

#include <vector>

#include "kqlora/parallel/data_parallel.hpp"

namespace kqlora {

template <class ExecSpace>
class Fsdp : public DataParallel<ExecSpace> {
 public:
  using typename DataParallel<ExecSpace>::Mem;
  using typename DataParallel<ExecSpace>::Vec;

  /// Shards the model's (whole, identical on every rank) NF4 tensors and frees them.
  Fsdp(const ExecSpace& exec, Communicator& comm, Model<ExecSpace>& model);
  ~Fsdp() override;

  /// This rank's chunk of the flat parameters: [shard_offset, shard_offset + shard_size),
  /// the end padded past num_params.
  int64_t shard_offset() const { return comm_.rank() * chunk_; }
  int64_t shard_size() const { return chunk_; }
  /// The chunk's master values and summed gradients (for the optimizer).
  Vec shard_params() const;
  Vec shard_grads() const { return shard_grads_; }

  // The data-parallel interface.
  std::string name() const override { return "fsdp"; }
  int64_t chunk_offset() const override { return shard_offset(); }
  Vec chunk_params() const override { return shard_params(); }
  Vec chunk_grads() const override { return shard_grads_; }
  void reduce_gradients() override { reduce_scatter_grads(); }
  double grad_norm(const ExecSpace&) override { return global_grad_norm(); }
  /// The updated chunks to every rank (nothing to do for a skipped step).
  void after_update(bool updated) override {
    if (updated) gather_params();
  }
  const std::vector<Nf4Shard<Mem>>* nf4_shards() const override { return &shards_; }
  Nf4Tensor<Mem> whole_nf4(int i) override;
  void describe(std::ostream& log) const override;

  /// Every rank's chunk into the model's full parameters.
  void gather_params();
  /// The model's gradients summed over ranks onto their owners' chunks.
  void reduce_scatter_grads();
  /// Global L2 norm of the gradients (after reduce_scatter_grads).
  double global_grad_norm();

  const std::vector<Nf4Shard<Mem>>& base_shards() const { return shards_; }
  /// Bytes of base weight this rank holds between uses (its shards).
  int64_t base_shard_bytes() const;

 private:
  ExecSpace exec_;
  Communicator& comm_;
  Model<ExecSpace>& model_;
  std::vector<Nf4Shard<Mem>> shards_;
  int64_t chunk_ = 0;
  Vec padded_params_, padded_grads_, shard_grads_;
  /// Collectives on the model's own memory: host memory, or device memory with a
  /// communicator that takes device buffers in non-blocking calls (NCCL); otherwise the
  /// data goes through host copies.
  bool direct_ = false;
  /// One NF4 weight's gathered shards, reused from weight to weight (grown to the largest).
  template <class M>
  struct Gathered {
    Kokkos::View<uint8_t*, M> data;
    Kokkos::View<int8_t*, M> scalers;
    Kokkos::View<float*, M> factors;
  };
  Gathered<Mem> gathered_;
  Gathered<Kokkos::HostSpace> host_gathered_;

  void gather_nf4(int i);
  template <class GExec, class M>
  Nf4Tensor<M> gather_shards(const GExec& gexec, const Nf4Shard<Mem>& mine, Gathered<M>& buf);
};

}  // namespace kqlora
