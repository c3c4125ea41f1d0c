#include "kqlora/train/batch_loader.hpp"

#include <algorithm>

#include "kqlora/core/random.hpp"
#include "kqlora/train/synthetic.hpp"

namespace kqlora {

std::pair<int64_t, int64_t> slice_of(int64_t global_bs, int rank, int size) {
  const int64_t base = global_bs / size, extra = global_bs % size;
  return {rank * base + std::min<int64_t>(rank, extra), base + (rank < extra ? 1 : 0)};
}

namespace {
/// Row-major host rows -> an [n, width] device matrix.
template <class T, class View>
void upload(const std::vector<T>& rows, const View& m) {
  auto h = Kokkos::create_mirror_view(m);
  const int64_t n = m.extent(0), width = m.extent(1);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t f = 0; f < width; ++f) h(t, f) = rows[t * width + f];
  Kokkos::deep_copy(m, h);
}
}  // namespace

template <class ExecSpace>
BatchLoader<ExecSpace>::BatchLoader(const ExecSpace& exec, const Config& cfg, const InputSpec& spec,
                                    int rank, int nranks, bool lockstep)
    : exec_(exec), spec_(spec), seed_(static_cast<uint64_t>(cfg.seed)), global_bs_(cfg.global_bs) {
  std::tie(first_, count_) = slice_of(cfg.global_bs, rank, nranks);
  // (The split of a slice is the same as with its own count: micro_bs, or all of it.)
  const int64_t largest = slice_of(cfg.global_bs, 0, nranks).second;
  mb_ = std::min(cfg.micro_bs, largest);
  micro_batches_ = ((lockstep ? largest : count_) + mb_ - 1) / mb_;
  if (spec.tokens) {
    buf_.tokens = TokenMatrix<Mem>("kqlora::train::tokens", mb_, spec.seq_len);
    buf_.labels = TokenMatrix<Mem>("kqlora::train::labels", mb_, spec.seq_len);
    ids_.resize(static_cast<size_t>(mb_ * spec.seq_len));
    labels_.resize(ids_.size());
  } else {
    buf_.inputs = Matrix<Mem>("kqlora::train::x", mb_, spec.features);
    rows_.resize(static_cast<size_t>(mb_ * spec.features));
    if (spec.target_features > 0) {
      buf_.targets = Matrix<Mem>("kqlora::train::target", mb_, spec.target_features);
      trows_.resize(static_cast<size_t>(mb_ * spec.target_features));
    }
  }
}

template <class ExecSpace>
Batch<typename ExecSpace::memory_space> BatchLoader<ExecSpace>::load(const DataSource& src,
                                                                     int64_t step, int64_t m0,
                                                                     int64_t n) {
  Batch<Mem> b;
  b.step = step;
  b.first_sample = first_ + m0;
  b.global_bs = global_bs_;
  if (spec_.tokens) {
    const auto rows = Kokkos::make_pair(int64_t(0), n);
    b.tokens = Kokkos::subview(buf_.tokens, rows, Kokkos::ALL);
    b.labels = Kokkos::subview(buf_.labels, rows, Kokkos::ALL);
    src.tokens(step, b.first_sample, n, ids_.data(), labels_.data());
    upload(ids_, b.tokens);
    upload(labels_, b.labels);
    return b;
  }
  b.inputs = Matrix<Mem>(buf_.inputs.data(), n, spec_.features);
  if (buf_.targets.data()) b.targets = Matrix<Mem>(buf_.targets.data(), n, spec_.target_features);
  if (src.synthetic()) {  // generated in place, on the device
    const int64_t g0 = src.global_sample(step, b.first_sample);
    fill_normal_rows(exec_, b.inputs, seed_, static_cast<uint64_t>(RandomStream::inputs), g0);
    if (b.targets.data())
      fill_normal_rows(exec_, b.targets, seed_, static_cast<uint64_t>(RandomStream::targets), g0);
  } else {
    src.inputs(step, b.first_sample, n, rows_.data());
    upload(rows_, b.inputs);
    if (b.targets.data()) {
      src.targets(step, b.first_sample, n, trows_.data());
      upload(trows_, b.targets);
    }
  }
  return b;
}

template <class ExecSpace>
double BatchLoader<ExecSpace>::run(Model<ExecSpace>& model, DataParallel<ExecSpace>* dp,
                                   const DataSource& src, int64_t step, RunReport* report) {
  double loss = 0.0;
  const double normaliser = src.normaliser(step, model.config().loss == LossKind::mse);
  for (int64_t k = 0; k < micro_batches_; ++k) {
    const int64_t m0 = k * mb_, n = std::clamp<int64_t>(count_ - m0, 0, mb_);
    if (report) report->enter(Phase::data);
    const Batch<Mem> b = load(src, step, m0, n);
    if (report) report->enter(Phase::forward_backward);
    if (dp) {
      if (k + 1 == micro_batches_) dp->before_last_backward();  // the last one reduces
      loss += model.forward_backward(b, normaliser, k > 0);     // the first writes the grads
    } else {
      loss += model.loss(b, normaliser);
    }
  }
  return loss;
}

template class BatchLoader<Kokkos::DefaultExecutionSpace>;

}  // namespace kqlora
