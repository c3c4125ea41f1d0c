#pragma once
// What a training run reports (rank 0): the header and the effective configuration, a
// progress line every log_every steps, the metrics file (JSON lines), evaluation lines,
// and at the end the timing table (min / avg / max over ranks of each phase) and the peak
// memory (docs/TRAINING.md, "Output").

#include <Kokkos_Core.hpp>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

#include "kqlora/parallel/communicator.hpp"
#include "kqlora/train/config.hpp"

namespace kqlora {

enum class Phase { data, forward_backward, communication, optimizer, checkpoint, evaluation };

class RunReport {
 public:
  /// Prints the header (ranks, Kokkos backend) and the effective configuration; opens the
  /// metrics file (appended to on a restart). Collective only in finish(). `exec` is the
  /// instance the run computes on.
  RunReport(const Config& cfg, Communicator& comm, const Kokkos::DefaultExecutionSpace& exec,
            std::ostream& log);

  /// Ends the current phase (after a fence of the run's instance, so its device work is
  /// charged to it; not of every stream: a stalled collective is comm_timeout_s's).
  void enter(Phase p);
  /// Step `step` (0-based) done, called for every step: the progress line and the metrics
  /// record every log_every steps and at the last.
  /// `tokens` and `flops`: the step's over all ranks (token models; 0 otherwise): the
  /// line shows tokens/s and, with a peak set, the model-FLOPs utilisation.
  /// `aux`: the share of `loss` that is a router's load-balancing loss (shown apart when
  /// not 0).
  void step(int64_t step, double loss, double lr, double grad_norm, bool finite, double tokens = 0,
            double flops = 0, double aux = 0);
  /// The FMA peak (FLOP/s) of every core of the run, which MFU is measured against (0:
  /// not known, no MFU).
  void set_peak_flops(double peak) { peak_ = peak; }
  /// The memory check's estimate per rank (finish() sets each rank's peak beside it).
  void set_memory_estimate(int64_t bytes) { estimate_ = bytes; }
  /// `metrics`: more of the step's numbers by name (a preference objective's rewards and
  /// log-probabilities, TRL's names): in the metrics file with the step's, or eval's with
  /// "eval_" before each name; the log line shows the rewards' accuracy and margin.
  void eval(int64_t step, double loss,
            const std::vector<std::pair<std::string, double>>& metrics = {});
  void set_step_metrics(std::vector<std::pair<std::string, double>> metrics) {
    step_metrics_ = std::move(metrics);
  }
  /// Collective: the timing table over every rank, `parallel_stats` (lines), the peak
  /// memory.
  void finish(const std::string& parallel_stats);

  std::ostream& log() const { return log_; }
  bool root() const { return root_; }

 private:
  using Clock = std::chrono::steady_clock;
  static constexpr int kPhases = 6;
  const Config& cfg_;
  Communicator& comm_;
  Kokkos::DefaultExecutionSpace exec_;
  std::ostream& log_;
  bool root_;
  std::ofstream metrics_;
  double total_[kPhases] = {0};
  Phase current_ = Phase::data;
  Clock::time_point since_, start_, loop_;
  int64_t rss_start_ = 0;
  int64_t estimate_ = 0;
  bool loop_started_ = false;
  int64_t first_step_ = -1;
  // Minor page faults when the run's first step ended and when its last step did, and the
  // steps between.
  int64_t faults_after_first_ = 0, faults_at_last_ = 0, steps_after_first_ = 0;
  double peak_ = 0, tokens_ = 0, flops_ = 0;                  // (sums over the run's steps)
  std::vector<std::pair<std::string, double>> step_metrics_;  // (the next step()'s)
};

}  // namespace kqlora
