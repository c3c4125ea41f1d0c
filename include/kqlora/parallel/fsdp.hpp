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

#include "kqlora/nn/model.hpp"
#include "kqlora/parallel/communicator.hpp"
#include "kqlora/quant/nf4_shard.hpp"

namespace kqlora {

template <class ExecSpace>
class Fsdp {
 public:
  using Mem = typename ExecSpace::memory_space;
  using Vec = Kokkos::View<float*, Mem>;

  /// Shards the model's (whole, identical on every rank) NF4 tensors and frees them.
  Fsdp(const ExecSpace& exec, Communicator& comm, Model<ExecSpace>& model);
  ~Fsdp();

  /// This rank's chunk of the flat parameters: [shard_offset, shard_offset + shard_size),
  /// the end padded past num_params.
  int64_t shard_offset() const { return comm_.rank() * chunk_; }
  int64_t shard_size() const { return chunk_; }
  /// The chunk's master values and summed gradients (for the optimizer).
  Vec shard_params() const;
  Vec shard_grads() const { return shard_grads_; }

  /// Every rank's chunk into the model's full parameters.
  void gather_params();
  /// The model's gradients summed over ranks onto their owners' chunks.
  void reduce_scatter_grads();
  /// Global L2 norm of the gradients (after reduce_scatter_grads).
  double grad_norm();

  const std::vector<Nf4Shard<Mem>>& base_shards() const { return shards_; }
  /// NF4 tensor i whole (collective: every rank must call it).
  Nf4Tensor<Mem> whole_nf4(int i);
  /// Bytes of base weight this rank holds between uses (its shards).
  int64_t base_shard_bytes() const;

 private:
  ExecSpace exec_;
  Communicator& comm_;
  Model<ExecSpace>& model_;
  std::vector<Nf4Shard<Mem>> shards_;
  int64_t chunk_ = 0;
  Vec padded_params_, padded_grads_, shard_grads_;

  void gather_nf4(int i);
};

}  // namespace kqlora
