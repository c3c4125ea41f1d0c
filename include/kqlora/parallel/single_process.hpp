#pragma once
// The data-parallel strategy of a one-rank DDP run: nothing to communicate.

#include "kqlora/parallel/data_parallel.hpp"

namespace kqlora {

template <class ExecSpace>
class SingleProcess : public DataParallel<ExecSpace> {
 public:
  using typename DataParallel<ExecSpace>::Vec;
  using typename DataParallel<ExecSpace>::Mem;

  explicit SingleProcess(Model<ExecSpace>& model) : model_(model) {}
  std::string name() const override { return "single process"; }
  bool communicates() const override { return false; }
  Vec chunk_params() const override { return model_.params; }
  Vec chunk_grads() const override { return model_.grads; }
  double grad_norm(const ExecSpace& exec) override { return kqlora::grad_norm(exec, model_.grads); }
  void after_update(bool updated) override {
    if (updated) model_.params_changed();
  }
  Nf4Tensor<Mem> whole_nf4(int i) override { return model_.nf4[i]; }

 private:
  Model<ExecSpace>& model_;
};

}  // namespace kqlora
