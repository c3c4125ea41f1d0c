#pragma once
// This rank's part of a step: its contiguous slice of the global batch (sizes differ by at
// most one, the first global_bs % N ranks take one more; docs/TRAINING.md, "A step"), in
// micro-batches of at most micro_bs samples loaded into device buffers in the form the
// model reads, and run through the model.

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <utility>
#include <vector>

#include "kqlora/nn/model.hpp"
#include "kqlora/parallel/data_parallel.hpp"
#include "kqlora/train/config.hpp"
#include "kqlora/train/data.hpp"
#include "kqlora/train/preference_loss.hpp"
#include "kqlora/train/run_report.hpp"

namespace kqlora {

/// Rank `rank`'s slice of a global batch: (first sample, count).
std::pair<int64_t, int64_t> slice_of(int64_t global_bs, int rank, int size);

template <class ExecSpace>
class BatchLoader {
 public:
  using Mem = typename ExecSpace::memory_space;

  /// `lockstep`: every rank runs as many micro-batches as the largest slice needs (a
  /// smaller slice's last ones empty), as FSDP's collective gathers in every micro-batch
  /// require.
  BatchLoader(const ExecSpace& exec, const Config& cfg, const InputSpec& spec, int rank, int nranks,
              bool lockstep);

  /// The loss of this rank's slice of `step` of `src` (its share of the global batch's
  /// loss); with `dp`, a training pass: the gradients too, dp->before_last_backward()
  /// before the last micro-batch. Phases are charged to `report` where given.
  double run(Model<ExecSpace>& model, DataParallel<ExecSpace>* dp, const DataSource& src,
             int64_t step, RunReport* report);
  /// A preference objective's pass (train/preference_loss.hpp) over this rank's pairs of
  /// `step` (training, with `dp`: the gradients too) or, `step` < 0, over every pair of the
  /// file (evaluation): each micro-batch's reference log-probabilities (the forward over
  /// `reference`'s adapters; empty: none needed), then the policy's, then the backward
  /// weighted by the pairs' loss derivatives. Returns this rank's share of the loss, its
  /// pairs' metric sums in `sums`.
  /// `precomputed`: reference_logps's values for every row of `src` (no reference forward).
  double run_preference(Model<ExecSpace>& model, DataParallel<ExecSpace>* dp, const DataSource& src,
                        int64_t step, const PreferenceConfig& objective,
                        const typename Model<ExecSpace>::Vec& reference, PreferenceSums& sums,
                        RunReport* report, const std::vector<double>* precomputed = nullptr);
  /// The reference's log-probabilities of every row of the preference file `src` (this
  /// rank's pairs: micro-batches rank, rank + nranks, ...; 0 elsewhere: the caller sums over
  /// the ranks). Every rank runs as many forwards (FSDP's gathers are collective).
  std::vector<double> reference_logps(Model<ExecSpace>& model, const DataSource& src,
                                      const typename Model<ExecSpace>::Vec& reference, int rank,
                                      int nranks);
  /// The loss over every row of the file `src` (no dropout, no gradients): the rows in
  /// global batches, each split across ranks as a step's, the last one short; this rank's
  /// share of it (the ranks' shares add up to the loss).
  double evaluate(Model<ExecSpace>& model, const DataSource& src);
  /// The last run()'s real tokens on this rank (each row's up to its last scored label:
  /// not the padding, packed rows' or a micro-batch's trimmed to its longest row) and its
  /// model FLOPs (Model::train_flops over the micro-batches as run).
  double tokens() const { return tokens_; }
  double flops() const { return flops_; }
  /// The last run()'s auxiliary loss on this rank (Model::aux_loss over its micro-batches:
  /// already part of run()'s loss).
  double aux() const { return aux_; }

 private:
  ExecSpace exec_;
  InputSpec spec_;
  uint64_t seed_;
  double tokens_ = 0, flops_ = 0, aux_ = 0, real_tokens_ = 0;  // (real_tokens_: last load()'s)
  int64_t global_bs_, first_ = 0, count_ = 0, mb_ = 1, micro_batches_ = 1;
  Batch<Mem> buf_;
  // ORPO: load() scores the chosen rows' prompts too, and notes where each row's prompt
  // ends (the first label the file scores; 0 for the rejected rows)
  bool score_chosen_prompts_ = false;
  std::vector<int64_t> prompt_end_;
  std::vector<float> rows_, trows_;
  std::vector<int32_t> ids_, labels_, positions_;

  /// Micro-batches of this rank's slice of global batch `step`, only its samples below
  /// `valid` (the global batch's first `valid` exist), the loss divided by `normaliser`.
  double pass(Model<ExecSpace>& model, DataParallel<ExecSpace>* dp, const DataSource& src,
              int64_t step, double normaliser, int64_t valid, RunReport* report);
  /// One preference pass over this rank's pairs of global batch `step` below `valid`.
  double preference_pass(Model<ExecSpace>& model, DataParallel<ExecSpace>* dp,
                         const DataSource& src, int64_t step, int64_t valid, double pairs,
                         double chosen_tokens, const PreferenceConfig& objective,
                         const typename Model<ExecSpace>::Vec& reference, PreferenceSums& sums,
                         RunReport* report, const std::vector<double>* precomputed);
  /// Samples [first + m0, first + m0 + n) of `step` into the buffers' first n rows; with
  /// file_sample >= 0, the file's samples from there instead.
  Batch<Mem> load(const DataSource& src, int64_t step, int64_t m0, int64_t n,
                  int64_t file_sample = -1);
};

}  // namespace kqlora
