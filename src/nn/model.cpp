#include "kqlora/nn/model.hpp"

#include "kqlora/core/bfloat16.hpp"
#include "kqlora/core/error.hpp"
#include "kqlora/core/kokkos_compat.hpp"

namespace kqlora {

template <class ExecSpace>
Model<ExecSpace>::Model(const ExecSpace& exec, const ModelConfig& cfg, ParamTable table,
                        bool zeroed)
    : exec_(exec), cfg_(cfg), table_(std::move(table)) {
  const int64_t n = table_.num_trainable;
  auto alloc = [&](const char* label) {
    return zeroed ? Vec(std::string(label), n)
                  : Vec(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), n);
  };
  params = alloc("kqlora::Model::params");
  grads = alloc("kqlora::Model::grads");
  if (cfg.bf16()) rounded_ = alloc("kqlora::Model::params_bf16");
  compute_ = cfg.bf16() ? rounded_ : params;
  nf4.resize(static_cast<size_t>(table_.count(ParamKind::nf4)));
  dense.resize(static_cast<size_t>(table_.count(ParamKind::dense)));
  dense_bf16.resize(dense.size());
}

template <class ExecSpace>
Kokkos::View<float*, Kokkos::HostSpace> Model<ExecSpace>::dense_host(const ParamEntry& e) const {
  if (!e.compact)
    // device-wide: checkpoints, exports (host copies outside the step)
    return Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), dense.at(e.offset));
  const auto& src = dense_bf16.at(e.offset);
  // device-wide: checkpoints, exports (host copies outside the step)
  const auto bits = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), src);
  Kokkos::View<float*, Kokkos::HostSpace> v(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "kqlora::Model::dense_host"), bits.extent(0));
  for (size_t i = 0; i < v.extent(0); ++i) v(i) = static_cast<float>(bits(i));
  return v;
}

template <class ExecSpace>
void Model<ExecSpace>::set_dense(const ParamEntry& e, const Vec& values) {
  if (!e.compact) {
    dense.at(e.offset) = values;
    return;
  }
  Kokkos::View<bfloat16*, Mem> b(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "kqlora::Model::dense_bf16"),
      values.extent(0));
  Kokkos::parallel_for(
      "kqlora::Model::narrow_dense",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<int64_t>>(exec_, 0, values.extent(0)),
      KOKKOS_LAMBDA(int64_t i) { b(i) = bfloat16(values(i)); });
  fence(exec_, "kqlora::Model::set_dense");  // (the caller may free `values`)
  dense_bf16.at(e.offset) = b;
  dense.at(e.offset) = Vec();
}

template <class ExecSpace>
void Model<ExecSpace>::use_buffers(const Vec& new_params, const Vec& new_grads) {
  KQLORA_CHECK(new_params.extent(0) == params.extent(0) && new_grads.extent(0) == grads.extent(0),
               "Model::use_buffers: buffers of the wrong size");
  const bool same = compute_.data() == params.data();
  params = new_params;
  grads = new_grads;
  if (same) compute_ = params;  // float32: the products read the masters
}

template <class ExecSpace>
void Model<ExecSpace>::params_changed() {
  if (!cfg_.bf16()) return;
  auto src = params;
  auto dst = rounded_;
  Kokkos::parallel_for(
      "kqlora::Model::round_params",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<int64_t>>(exec_, 0, src.extent(0)),
      KOKKOS_LAMBDA(int64_t i) { dst(i) = round_to_bf16(src(i)); });
}

template <class ExecSpace>
std::vector<double> Model<ExecSpace>::sequence_logps(const Batch<Mem>&, bool, std::vector<int64_t>*,
                                                     const std::vector<int64_t>*,
                                                     std::vector<double>*) {
  KQLORA_INPUT_CHECK(false, "model kind '" << cfg_.kind << "' has no sequence log-probabilities: "
                                           << "preference objectives need model = causal_lm");
  return {};
}

template <class ExecSpace>
void Model<ExecSpace>::backward_weighted(const std::vector<double>&, bool,
                                         const std::vector<double>*) {
  KQLORA_INPUT_CHECK(false, "model kind '" << cfg_.kind << "' has no weighted backward: "
                                           << "preference objectives need model = causal_lm");
}

template <class ExecSpace>
void Model<ExecSpace>::use_weights(const Vec& values) {
  KQLORA_CHECK(values.extent(0) == params.extent(0),
               "Model::use_weights: " << values.extent(0) << " values for " << params.extent(0)
                                      << " parameters");
  if (!cfg_.bf16()) {
    compute_ = values;
    return;
  }
  if (rounded_other_.extent(0) != values.extent(0))
    rounded_other_ = Vec(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("kqlora::Model::other_bf16")),
        values.extent(0));
  auto dst = rounded_other_;
  Kokkos::parallel_for(
      "kqlora::Model::round_other",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<int64_t>>(exec_, 0, values.extent(0)),
      KOKKOS_LAMBDA(int64_t i) { dst(i) = round_to_bf16(values(i)); });
  compute_ = rounded_other_;
}

template <class ExecSpace>
void Model<ExecSpace>::use_masters() {
  compute_ = cfg_.bf16() ? rounded_ : params;
}

template <class ExecSpace>
void Model<ExecSpace>::set_backward_hooks(std::function<void(int)> group_done,
                                          std::function<void()> progress) {
  group_done_ = std::move(group_done);
  progress_ = std::move(progress);
}

template <class ExecSpace>
void Model<ExecSpace>::set_base_hooks(std::function<void(int)> acquire,
                                      std::function<void(int)> release) {
  acquire_ = std::move(acquire);
  release_ = std::move(release);
}

template <class ExecSpace>
void Model<ExecSpace>::group_done(int g) const {
  if (!group_done_) return;
  fence(exec_, "kqlora::Model::group_grads");  // in memory before anyone sends them
  group_done_(g);
}

template <class ExecSpace>
int64_t Model<ExecSpace>::nf4_bytes() const {
  int64_t n = 0;
  for (const auto& t : nf4) n += t.storage_bytes();
  return n;
}

template <class ExecSpace>
Matrix<typename ExecSpace::memory_space> Model<ExecSpace>::matrix(const Vec& v,
                                                                  const ParamEntry& e) const {
  return Matrix<Mem>(v.data() + e.offset, e.shape.at(0), e.shape.size() > 1 ? e.shape[1] : 1);
}

template <class ExecSpace>
typename Model<ExecSpace>::Vec Model<ExecSpace>::vector(const Vec& v, const ParamEntry& e) const {
  return Vec(v.data() + e.offset, e.numel());
}

template class Model<Kokkos::DefaultExecutionSpace>;

}  // namespace kqlora
