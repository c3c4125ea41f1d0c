#include "kqlora/train/batch_loader.hpp"

#include <algorithm>

#include "kqlora/core/kokkos_compat.hpp"
#include "kqlora/core/random.hpp"
#include "kqlora/train/preference_step.hpp"
#include "kqlora/train/synthetic.hpp"

namespace kqlora {

std::pair<int64_t, int64_t> slice_of(int64_t global_bs, int rank, int size) {
  const int64_t base = global_bs / size, extra = global_bs % size;
  return {rank * base + std::min<int64_t>(rank, extra), base + (rank < extra ? 1 : 0)};
}

namespace {
/// Row-major host rows -> an [n, width] device matrix, copied on `exec` (the instance the
/// step runs on: no device-wide sync).
template <class ExecSpace, class T, class View>
void upload(const ExecSpace& exec, const std::vector<T>& rows, const View& m) {
  auto h = Kokkos::create_mirror_view(m);
  const int64_t n = m.extent(0), width = m.extent(1);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t f = 0; f < width; ++f) h(t, f) = rows[t * width + f];
  Kokkos::deep_copy(exec, m, h);
  fence(exec, "kqlora::BatchLoader::upload");  // (h is freed on return)
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
    const int64_t rows = mb_ * spec.rows_per_sample;
    buf_.tokens = TokenMatrix<Mem>("kqlora::train::tokens", rows, spec.seq_len);
    buf_.labels = TokenMatrix<Mem>("kqlora::train::labels", rows, spec.seq_len);
    ids_.resize(static_cast<size_t>(rows * spec.seq_len));
    labels_.resize(ids_.size());
    // (Whether a file is packed is known once it is read: the buffer comes with the first.)
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
double BatchLoader<ExecSpace>::run_preference(Model<ExecSpace>& model, DataParallel<ExecSpace>* dp,
                                              const DataSource& src, int64_t step,
                                              const PreferenceConfig& objective,
                                              const typename Model<ExecSpace>::Vec& reference,
                                              PreferenceSums& sums, RunReport* report,
                                              const std::vector<double>* precomputed) {
  tokens_ = flops_ = aux_ = 0;
  if (step >= 0)
    return preference_pass(model, dp, src, step, global_bs_, static_cast<double>(global_bs_),
                           src.chosen_tokens(step), objective, reference, sums, report,
                           precomputed);
  // (evaluation: every pair of the file in global batches, the last one short; the loss a
  // mean over all of them)
  double loss = 0.0;
  const double pairs = static_cast<double>(src.rows()), chosen = src.file_chosen_tokens(src.rows());
  for (int64_t b = 0; b * global_bs_ < src.rows(); ++b)
    loss += preference_pass(model, nullptr, src, b, src.rows() - b * global_bs_, pairs, chosen,
                            objective, reference, sums, nullptr, precomputed);
  return loss;
}

template <class ExecSpace>
std::vector<double> BatchLoader<ExecSpace>::reference_logps(
    Model<ExecSpace>& model, const DataSource& src, const typename Model<ExecSpace>::Vec& reference,
    int rank, int nranks) {
  const int64_t P = src.rows(), ps = spec_.rows_per_sample;
  std::vector<double> out(static_cast<size_t>(P * ps), 0.0);
  const int64_t rounds = (P + mb_ * nranks - 1) / (mb_ * nranks);
  model.use_weights(reference);
  for (int64_t k = 0; k < rounds; ++k) {
    const int64_t p0 = (k * nranks + rank) * mb_, n = std::clamp<int64_t>(P - p0, 0, mb_);
    const Batch<Mem> b = load(src, 0, 0, n, std::min(p0, P));
    const std::vector<double> v = model.sequence_logps(b, false);
    std::copy(v.begin(), v.end(), out.begin() + std::min(p0, P) * ps);
  }
  model.use_masters();
  return out;
}

template <class ExecSpace>
double BatchLoader<ExecSpace>::preference_pass(Model<ExecSpace>& model, DataParallel<ExecSpace>* dp,
                                               const DataSource& src, int64_t step, int64_t valid,
                                               double pairs, double chosen_tokens,
                                               const PreferenceConfig& objective,
                                               const typename Model<ExecSpace>::Vec& reference,
                                               PreferenceSums& sums, RunReport* report,
                                               const std::vector<double>* precomputed) {
  double loss = 0.0;
  const int64_t mine = std::clamp<int64_t>(valid - first_, 0, count_);
  const bool orpo = objective.objective == "orpo";
  score_chosen_prompts_ = orpo;
  for (int64_t k = 0; k < micro_batches_; ++k) {
    const int64_t m0 = k * mb_, n = std::clamp<int64_t>(mine - m0, 0, mb_);
    if (report) report->enter(Phase::data);
    const Batch<Mem> b = load(src, step, m0, n);
    if (report) report->enter(Phase::forward_backward);
    if (dp) {
      tokens_ += real_tokens_;
      flops_ += model.train_flops(2 * n, b.tokens.extent(1));
    }
    const bool last = k + 1 == micro_batches_;
    std::vector<double> ref;  // (precomputed: each row's, by its file row)
    if (precomputed)
      for (int64_t i = 0; i < n; ++i) {
        const int64_t s = src.sample_of(step, first_ + m0 + i);
        ref.push_back((*precomputed)[static_cast<size_t>(2 * s)]);
        ref.push_back((*precomputed)[static_cast<size_t>(2 * s + 1)]);
      }
    loss += preference_micro_batch(
        model, b, orpo ? &prompt_end_ : nullptr, objective, reference, pairs, chosen_tokens,
        dp != nullptr, k > 0, sums,
        [&] {
          if (last) dp->before_last_backward();  // the last one reduces
        },
        precomputed ? &ref : nullptr);
  }
  score_chosen_prompts_ = false;
  return loss;
}

template <class ExecSpace>
Batch<typename ExecSpace::memory_space> BatchLoader<ExecSpace>::load(const DataSource& src,
                                                                     int64_t step, int64_t m0,
                                                                     int64_t n,
                                                                     int64_t file_sample) {
  Batch<Mem> b;
  b.step = step;
  b.first_sample = first_ + m0;
  b.global_bs = global_bs_;
  if (spec_.tokens) {
    const int64_t T = spec_.seq_len, ps = spec_.rows_per_sample;
    // (a pair's two rows are two sequences: the dropout keys count rows)
    b.first_sample = (first_ + m0) * ps;
    b.global_bs = global_bs_ * ps;
    const bool packed = src.packed();
    if (packed && !buf_.positions.data()) {
      buf_.positions = TokenMatrix<Mem>("kqlora::train::positions", mb_, T);
      positions_.resize(ids_.size());
    }
    if (file_sample >= 0)
      src.file_tokens(file_sample, n, ids_.data(), labels_.data());
    else
      src.tokens(step, first_ + m0, n, ids_.data(), labels_.data(),
                 packed ? positions_.data() : nullptr);
    n *= ps;                    // (rows from here on)
    if (score_chosen_prompts_)  // (ORPO: the chosen rows' prompt tokens scored too)
      prompt_end_ = score_chosen_prompts(ids_.data(), labels_.data(), n, T);
    // Trimmed to the longest row's last scored label: the positions after it score
    // nothing and, attention being causal, change nothing before them. A row's real
    // tokens are those up to its own last scored label (padding, packed or not, is after).
    int64_t width = 1;
    real_tokens_ = 0;
    for (int64_t i = 0; i < n; ++i) {
      int64_t row = 1;
      for (int64_t t = T - 1; t >= 1; --t)
        if (labels_[i * T + t] != kIgnoreLabel) {
          row = t + 1;
          break;
        }
      width = std::max(width, row);
      real_tokens_ += static_cast<double>(row);
    }
    if (width < T) {
      for (int64_t i = 1; i < n; ++i) {  // (rows in place, to stride `width`)
        std::copy_n(ids_.begin() + i * T, width, ids_.begin() + i * width);
        std::copy_n(labels_.begin() + i * T, width, labels_.begin() + i * width);
        if (packed) std::copy_n(positions_.begin() + i * T, width, positions_.begin() + i * width);
      }
      b.row_len = T;
    }
    b.tokens = TokenMatrix<Mem>(buf_.tokens.data(), n, width);
    b.labels = TokenMatrix<Mem>(buf_.labels.data(), n, width);
    upload(exec_, ids_, b.tokens);
    upload(exec_, labels_, b.labels);
    if (packed) {
      b.positions = TokenMatrix<Mem>(buf_.positions.data(), n, width);
      upload(exec_, positions_, b.positions);
    }
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
    upload(exec_, rows_, b.inputs);
    if (b.targets.data()) {
      src.targets(step, b.first_sample, n, trows_.data());
      upload(exec_, trows_, b.targets);
    }
  }
  return b;
}

template <class ExecSpace>
double BatchLoader<ExecSpace>::run(Model<ExecSpace>& model, DataParallel<ExecSpace>* dp,
                                   const DataSource& src, int64_t step, RunReport* report) {
  const double normaliser = src.normaliser(step, model.config().loss == LossKind::mse);
  tokens_ = flops_ = aux_ = 0;
  return pass(model, dp, src, step, normaliser, global_bs_, report);
}

template <class ExecSpace>
double BatchLoader<ExecSpace>::evaluate(Model<ExecSpace>& model, const DataSource& src) {
  const double normaliser = src.file_normaliser(model.config().loss == LossKind::mse);
  if (normaliser == 0) return 0.0;  // (no scored label in the file; the check is the deck's)
  double loss = 0.0;
  for (int64_t b = 0; b * global_bs_ < src.rows(); ++b)
    loss += pass(model, nullptr, src, b, normaliser, src.rows() - b * global_bs_, nullptr);
  return loss;
}

template <class ExecSpace>
double BatchLoader<ExecSpace>::pass(Model<ExecSpace>& model, DataParallel<ExecSpace>* dp,
                                    const DataSource& src, int64_t step, double normaliser,
                                    int64_t valid, RunReport* report) {
  double loss = 0.0;
  // (Lockstep: a rank runs every micro-batch, empty ones too, whatever `valid` leaves it.)
  const int64_t mine = std::clamp<int64_t>(valid - first_, 0, count_);
  for (int64_t k = 0; k < micro_batches_; ++k) {
    const int64_t m0 = k * mb_, n = std::clamp<int64_t>(mine - m0, 0, mb_);
    if (report) report->enter(Phase::data);
    const Batch<Mem> b = load(src, step, m0, n);
    if (report) report->enter(Phase::forward_backward);
    if (dp) {
      if (spec_.tokens) {
        tokens_ += real_tokens_;
        flops_ += model.train_flops(n, b.tokens.extent(1));
      }
      if (k + 1 == micro_batches_) dp->before_last_backward();  // the last one reduces
      loss += model.forward_backward(b, normaliser, k > 0);     // the first writes the grads
      aux_ += model.aux_loss();
    } else {
      loss += model.loss(b, normaliser);
    }
  }
  return loss;
}

template class BatchLoader<Kokkos::DefaultExecutionSpace>;

}  // namespace kqlora
