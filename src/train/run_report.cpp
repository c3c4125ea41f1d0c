#include "kqlora/train/run_report.hpp"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <ostream>
#include <sstream>
#include <vector>

#include "kqlora/core/dtype.hpp"
#include "kqlora/core/error.hpp"
#include "kqlora/core/human_units.hpp"
#include "kqlora/core/kernel_times.hpp"
#include "kqlora/core/kokkos_compat.hpp"
#include "kqlora/core/memory.hpp"

namespace kqlora {

namespace {

/// `, "<prefix>name": value` for each (JSON has no NaN: null).
void write_metrics(std::ostream& os, const std::vector<std::pair<std::string, double>>& metrics,
                   const char* prefix) {
  for (const auto& [name, value] : metrics) {
    os << ", \"" << prefix << name << "\": ";
    if (std::isfinite(value))
      os << value;
    else
      os << "null";
  }
}

/// "  accuracy A  margin M" for the log line, from a preference objective's metrics.
std::string reward_summary(const std::vector<std::pair<std::string, double>>& metrics) {
  std::ostringstream s;
  for (const auto& [name, value] : metrics) {
    if (name == "rewards/accuracies") s << "  accuracy " << std::setprecision(3) << value;
    if (name == "rewards/margins") s << "  margin " << std::setprecision(4) << value;
  }
  return s.str();
}

}  // namespace

namespace {
const char* phase_names[] = {"data",      "forward+backward", "communication",
                             "optimizer", "checkpoint I/O",   "evaluation"};

double seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}
}  // namespace

RunReport::RunReport(const Config& cfg, Communicator& comm,
                     const Kokkos::DefaultExecutionSpace& exec, std::ostream& log)
    : cfg_(cfg), comm_(comm), exec_(exec), log_(log), root_(comm.rank() == 0) {
  const std::string backend = Kokkos::DefaultExecutionSpace::name();
  track_kokkos_allocations();
  rss_start_ = rss_bytes();
  start_ = since_ = Clock::now();
  if (root_) {
    log_ << "kqlora-train: " << comm.size() << " rank(s), Kokkos " << backend << ", dtype "
         << dtype_name(cfg.dtype) << "\n-- effective configuration --\n"
         << cfg.to_deck_text() << "--\n";
    if (!cfg.metrics_file.empty()) {
      // A restart continues the metrics of the run it resumes.
      metrics_.open(cfg.metrics_file, cfg.restart != "none" ? std::ios::app : std::ios::trunc);
      KQLORA_INPUT_CHECK(metrics_.good(), cfg.metrics_file << ": cannot write the metrics file");
    }
  }
}

void RunReport::enter(Phase p) {
  fence(exec_, "kqlora::train::phase");
  const auto now = Clock::now();
  if (!loop_started_) {  // the set-up ends with the first phase of the first step
    loop_started_ = true;
    loop_ = now;
    kernel_times_start();  // (KQLORA_KERNEL_TIMES=1: the loop's kernels, not the set-up's)
  } else {
    total_[static_cast<int>(current_)] += seconds(now - since_);
  }
  current_ = p;
  since_ = now;
}

void RunReport::step(int64_t step, double loss, double lr, double norm, bool finite, double tokens,
                     double flops, double aux) {
  if (first_step_ < 0) {
    first_step_ = step;
    faults_after_first_ = minor_page_faults();
  } else {
    ++steps_after_first_;
    faults_at_last_ = minor_page_faults();
  }
  tokens_ += tokens;
  flops_ += flops;
  const bool due = (step + 1) % cfg_.log_every == 0 || step + 1 == cfg_.num_steps;
  if (!due) return;
  const double elapsed = seconds(Clock::now() - loop_);
  const int64_t done = step + 1 - first_step_;  // steps of this run (a restart starts later)
  if (root_) {
    const double sps = static_cast<double>(done * cfg_.global_bs) / elapsed;
    const double eta = elapsed / done * (cfg_.num_steps - step - 1);
    log_ << "step " << std::setw(6) << step + 1 << "/" << cfg_.num_steps << "  loss "
         << std::setprecision(6) << std::scientific << loss << std::defaultfloat;
    if (aux != 0)  // (the router's load-balancing share of the loss)
      log_ << " (aux " << std::setprecision(4) << std::scientific << aux << std::defaultfloat
           << ")";
    log_ << "  lr " << std::setprecision(3) << lr << "  |g| " << std::setprecision(4) << norm
         << "  samples/s " << std::fixed << std::setprecision(1) << sps << std::defaultfloat;
    if (tokens_ > 0)
      log_ << "  tokens/s " << std::fixed << std::setprecision(0) << tokens_ / elapsed;
    if (flops_ > 0 && peak_ > 0)
      log_ << "  MFU " << std::setprecision(1) << 100 * flops_ / elapsed / peak_ << "%";
    log_ << std::defaultfloat << reward_summary(step_metrics_) << "  elapsed "
         << human_time(elapsed) << "  ETA " << human_time(eta)
         << (finite ? "" : "  (non-finite: step skipped)") << "\n";
    log_.flush();
  }
  if (metrics_.is_open()) {
    metrics_ << std::setprecision(17) << "{\"step\": " << step + 1 << ", \"loss\": ";
    if (finite)
      metrics_ << loss;
    else
      metrics_ << "null";
    metrics_ << ", \"lr\": " << lr << ", \"grad_norm\": ";
    if (std::isfinite(norm))
      metrics_ << norm;
    else
      metrics_ << "null";
    metrics_ << ", \"skipped\": " << (finite ? "false" : "true") << ", \"elapsed_s\": " << elapsed;
    if (aux != 0) metrics_ << ", \"aux_loss\": " << aux;
    if (tokens_ > 0) metrics_ << ", \"tokens\": " << tokens_;
    if (flops_ > 0) metrics_ << ", \"model_flops\": " << flops_;
    if (flops_ > 0 && peak_ > 0) metrics_ << ", \"mfu\": " << flops_ / elapsed / peak_;
    write_metrics(metrics_, step_metrics_, "");
    metrics_ << "}\n";
    metrics_.flush();
  }
}

void RunReport::eval(int64_t step, double loss,
                     const std::vector<std::pair<std::string, double>>& metrics) {
  if (root_)
    log_ << "eval   " << std::setw(6) << step + 1 << "  loss " << std::scientific
         << std::setprecision(6) << loss << std::defaultfloat << reward_summary(metrics) << "\n";
  if (metrics_.is_open()) {
    metrics_ << std::setprecision(17) << "{\"step\": " << step + 1 << ", \"eval_loss\": " << loss;
    write_metrics(metrics_, metrics, "eval_");
    metrics_ << "}\n";
  }
}

void RunReport::finish(const std::string& parallel_stats) {
  enter(Phase::data);
  // Every rank's phase times and total on every rank, then min / sum / max.
  const int n = comm_.size();
  // Each rank's phase times, total, its peak memory (tracked and RSS above start-up) and
  // its minor page faults a step after the first (fresh pages: memory allocated again).
  constexpr int kFields = kPhases + 4;
  double mine[kFields];
  for (int p = 0; p < kPhases; ++p) mine[p] = total_[p];
  mine[kPhases] = seconds(Clock::now() - start_);
  mine[kPhases + 1] = static_cast<double>(tracked_peak_bytes());
  mine[kPhases + 2] = static_cast<double>(peak_rss_bytes() - rss_start_);
  mine[kPhases + 3] = steps_after_first_ > 0
                          ? static_cast<double>(faults_at_last_ - faults_after_first_) /
                                static_cast<double>(steps_after_first_)
                          : -1.0;
  std::vector<double> all(static_cast<size_t>(kFields * n));
  comm_.wait(comm_.allgather(mine, all.data(), sizeof(mine)));
  double mn[kPhases + 1], sum[kPhases + 1], mx[kPhases + 1];
  for (int p = 0; p <= kPhases; ++p) {
    mn[p] = mx[p] = all[p];
    sum[p] = 0;
    for (int r = 0; r < n; ++r) {
      const double v = all[r * kFields + p];
      mn[p] = std::min(mn[p], v);
      mx[p] = std::max(mx[p], v);
      sum[p] += v;
    }
  }
  if (!root_) return;
  log_ << "\n"
       << std::left << std::setw(18) << "phase" << std::right << std::setw(11) << "min"
       << std::setw(11) << "avg" << std::setw(11) << "max" << std::setw(9) << "% total\n";
  const double avg_total = sum[kPhases] / n;
  auto row = [&](const char* name, double a, double b, double c) {
    log_ << std::left << std::setw(18) << name << std::right << std::fixed << std::setprecision(3)
         << std::setw(10) << a << "s" << std::setw(10) << b << "s" << std::setw(10) << c << "s"
         << std::setw(8) << std::setprecision(1) << 100.0 * b / avg_total << "%\n"
         << std::defaultfloat;
  };
  double phases_avg = 0;
  for (int p = 0; p < kPhases; ++p) {
    row(phase_names[p], mn[p], sum[p] / n, mx[p]);
    phases_avg += sum[p] / n;
  }
  row("setup", avg_total - phases_avg, avg_total - phases_avg, avg_total - phases_avg);
  row("total", mn[kPhases], avg_total, mx[kPhases]);
  log_ << "(setup: initialisation, quantization and file reading, on average)\n" << parallel_stats;
  kernel_times_report(log_, phases_avg);  // (rank 0's kernels against the ranks' loop)
  // Rank 0's line first (its form is what scripts read), then the others'; each rank's peak
  // (the larger of the two) against the estimate the memory check used.
  double largest = 0;
  for (int r = 0; r < n; ++r) {
    const double tracked = all[r * kFields + kPhases + 1], rss = all[r * kFields + kPhases + 2];
    largest = std::max({largest, tracked, rss});
    log_ << "peak memory (rank " << r << "): tracked allocations " << human_bytes(tracked)
         << ", RSS above start-up " << human_bytes(rss) << "\n";
  }
  double faults = -1;
  for (int r = 0; r < n; ++r) faults = std::max(faults, all[r * kFields + kPhases + 3]);
  if (faults >= 0)  // (evaluations and checkpoints between steps count too)
    log_ << "minor page faults a step after the first (the most of any rank): " << std::fixed
         << std::setprecision(1) << faults << "\n"
         << std::defaultfloat;
  if (estimate_ > 0)
    log_ << "memory estimate per rank " << human_bytes(static_cast<double>(estimate_))
         << ": the largest rank's peak is " << std::fixed << std::setprecision(0)
         << 100.0 * largest / static_cast<double>(estimate_) << "% of it\n"
         << std::defaultfloat;
  if (metrics_.is_open()) {
    metrics_ << "{\"memory_estimate_bytes\": " << estimate_ << ", \"peak_tracked_bytes\": [";
    for (int r = 0; r < n; ++r)
      metrics_ << (r ? ", " : "") << static_cast<int64_t>(all[r * kFields + kPhases + 1]);
    metrics_ << "], \"peak_rss_above_start_bytes\": [";
    for (int r = 0; r < n; ++r)
      metrics_ << (r ? ", " : "") << static_cast<int64_t>(all[r * kFields + kPhases + 2]);
    metrics_ << "], \"minor_page_faults_per_step\": [";
    for (int r = 0; r < n; ++r)
      metrics_ << (r ? ", " : "") << std::setprecision(6) << all[r * kFields + kPhases + 3];
    metrics_ << "]}\n";
    metrics_.flush();
  }
}

}  // namespace kqlora
