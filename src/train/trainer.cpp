#include "kqlora/train/trainer.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <ostream>
#include <sstream>
#include <tuple>

#include "kqlora/build_config.hpp"
#include "kqlora/core/kokkos_compat.hpp"
#include "kqlora/core/memory.hpp"
#include "kqlora/core/signals.hpp"
#include "kqlora/parallel/ddp.hpp"
#include "kqlora/parallel/fsdp.hpp"
#if KQLORA_HAVE_NCCL
#include "kqlora/parallel/nccl_communicator.hpp"
#endif
#include "kqlora/nn/model_registry.hpp"
#include "kqlora/optim/optimizer.hpp"
#include "kqlora/train/component_configs.hpp"
#include "kqlora/train/data.hpp"
#include "kqlora/train/init.hpp"
#include "kqlora/train/synthetic.hpp"
#if KQLORA_HAVE_HDF5
#include "kqlora/io/checkpoint.hpp"
#include "kqlora/io/checkpoint_reader.hpp"
#include "kqlora/io/hdf5_file.hpp"
#include "kqlora/train/checkpointing.hpp"
#endif

namespace kqlora {

namespace {

using Exec = Kokkos::DefaultExecutionSpace;
using Mem = Exec::memory_space;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

enum Phase { kData, kForwardBackward, kComm, kOptimizer, kCheckpoint, kEval, kPhases };
const char* phase_names[kPhases] = {"data",      "forward+backward", "communication",
                                    "optimizer", "checkpoint I/O",   "evaluation"};

/// Wall time per phase; each phase ends with a fence so device work is charged to it.
struct PhaseTimer {
  double total[kPhases] = {0};
  Phase current = kData;
  Clock::time_point since = Clock::now();
  void enter(Phase p) {
    fence_all("kqlora::train::phase");
    total[current] += seconds_since(since);
    current = p;
    since = Clock::now();
  }
};

/// A rank's contiguous slice of the global batch: sizes differ by at most one, the first
/// global_bs % N ranks take one more (docs/TRAINING.md, "A step").
std::pair<int64_t, int64_t> slice_of(int64_t global_bs, int rank, int size) {
  const int64_t base = global_bs / size, extra = global_bs % size;
  return {rank * base + std::min<int64_t>(rank, extra), base + (rank < extra ? 1 : 0)};
}

/// Row-major host rows -> an [n, width] device matrix.
template <class T, class View>
void upload(const std::vector<T>& rows, const View& m) {
  auto h = Kokkos::create_mirror_view(m);
  const int64_t n = m.extent(0), width = m.extent(1);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t f = 0; f < width; ++f) h(t, f) = rows[t * width + f];
  Kokkos::deep_copy(m, h);
}

std::string human_bytes(double b) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(1);
  if (b >= 1 << 30)
    os << b / (1 << 30) << " GiB";
  else if (b >= 1 << 20)
    os << b / (1 << 20) << " MiB";
  else
    os << b / 1024 << " KiB";
  return os.str();
}

std::string human_time(double s) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(s < 10 ? 2 : 1) << s << "s";
  return os.str();
}

template <class Shards>
int64_t model_base_bytes(const Shards& shards) {
  int64_t b = 0;
  for (const auto& s : shards) {
    const auto& L = s.global;
    b += L.num_bytes() + L.num_blocks() + 4 * L.num_scaler_blocks() + 4;
  }
  return b;
}

}  // namespace

std::unique_ptr<Communicator> make_communicator(const Config& cfg) {
  std::unique_ptr<Communicator> comm;
#if KQLORA_HAVE_NCCL && defined(KOKKOS_ENABLE_CUDA)
  // auto: NCCL where the model lives in device memory, MPI otherwise.
  const bool device_memory = !std::is_same<Mem, Kokkos::HostSpace>::value;
  if (cfg.comm == "nccl" || (cfg.comm == "auto" && device_memory)) {
    Kokkos::Cuda cuda;
    comm = make_nccl_communicator(cuda.cuda_device(), cuda.cuda_stream());
  }
#endif
  KQLORA_INPUT_CHECK(comm || cfg.comm != "nccl",
                     "comm = nccl: this kqlora was built without NCCL on a CUDA Kokkos");
#if KQLORA_HAVE_MPI
  if (!comm) comm = make_mpi_communicator(true);
#else
  if (!comm) comm = make_self_communicator();
#endif
  comm->set_timeout(cfg.comm_timeout_s);
  return comm;
}

TrainSummary train(const Config& cfg, std::ostream& log) {
  auto comm = make_communicator(cfg);
  return train(cfg, *comm, log);
}

TrainSummary train(const Config& cfg, Communicator& comm, std::ostream& log, bool collect_final) {
  const int rank = comm.rank(), nranks = comm.size();
  const bool root = rank == 0;
  KQLORA_INPUT_CHECK(nranks <= cfg.global_bs, "global_bs " << cfg.global_bs
                                                           << " is smaller than the " << nranks
                                                           << " ranks (each rank needs a sample)");
#if !KQLORA_HAVE_HDF5
  KQLORA_INPUT_CHECK(cfg.checkpoint_every == 0 && cfg.restart == "none",
                     "this kqlora was built without HDF5: it has no checkpoints ("
                         << (cfg.restart != "none" ? "restart" : "checkpoint_every")
                         << " asks for one)");
#endif
  memory::track_kokkos_allocations();
  const int64_t rss_start = memory::rss_bytes();
  const auto t_start = Clock::now();
  Exec exec;
  const ModelConfig mcfg = model_config(cfg);
  if (root) {
    log << "kqlora-train: " << nranks << " rank(s), Kokkos " << Exec::name() << ", dtype "
        << dtype_name(cfg.dtype) << "\n-- effective configuration --\n"
        << cfg.to_deck_text() << "--\n";
  }

  // The weights are written once, by the initialisation or the restart (and, with
  // node-shared DDP, only into the shared memory): no zeros to write first.
  const std::unique_ptr<Model<Exec>> model_ptr = make_model(exec, mcfg, false);
  Model<Exec>& model = *model_ptr;
  std::ostringstream init_log;
  // A restart takes the whole state from a checkpoint (any layout, world size and parallel
  // mode), after checking that it is the same model: no initialisation to throw away.
  if (cfg.restart == "none") initialize_model(exec, model, cfg.init_file, init_log);
#if KQLORA_HAVE_HDF5
  std::unique_ptr<CheckpointReader> resumed;
#endif
  int64_t start_step = 0;
  // A restart's set-up, split for the log: opening and checking the files with the base
  // weights, the data-parallel set-up, reading each rank's part of the parameters and
  // optimizer state into where they live (and of that, reading and checksums).
  double restart_open_s = 0, parallel_setup_s = 0, restart_state_s = 0;
  double chunk_read_s = 0, chunk_verify_s = 0, chunk_gb = 0, first_touch_s = 0;
  if (cfg.restart != "none") {
#if KQLORA_HAVE_HDF5  // (without HDF5 a restart was refused above)
    const auto t = Clock::now();
    resumed = std::make_unique<CheckpointReader>(load_restart(cfg, init_log));
    start_step = resumed->contents().step;
    restore_frozen(model, *resumed);
    restart_open_s = seconds_since(t);
#endif
  }
  if (root) log << init_log.str();
  // DDP: rank 0's weights on every rank, then gradients summed in buckets during backward.
  std::unique_ptr<Ddp<Exec>> ddp;
  // FSDP: base weights and parameter chunks sharded (at any world size, 1 included).
  std::unique_ptr<Fsdp<Exec>> fsdp;
  const auto t_parallel = Clock::now();
  if (cfg.parallel == "fsdp") {
    fsdp = std::make_unique<Fsdp<Exec>>(exec, comm, model);
    if (root) {
      const double mine = static_cast<double>(fsdp->base_shard_bytes());
      const double whole = static_cast<double>(model_base_bytes(fsdp->base_shards()));
      log << "FSDP: base weights on rank 0 " << human_bytes(mine) << " (" << mine << " B, "
          << std::fixed << std::setprecision(3) << mine / (whole / nranks) << std::defaultfloat
          << " x total/N; total " << human_bytes(whole) << "), parameter chunk "
          << fsdp->shard_size() << " of " << model.num_params() << "\n";
    }
  } else if (nranks > 1) {
    // How a bucket is summed once its gradients are complete: blocking right away (the
    // default with MPI on host memory, where the reduction's arithmetic runs on the cores
    // that compute anyway: measured faster), or non-blocking, driven between panels and
    // finished after the backward (KQLORA_DDP_OVERLAP=1; the default with device memory,
    // where the work leaves the compute stream).
    const char* env = std::getenv("KQLORA_DDP_OVERLAP");
    const bool overlap =
        env ? std::string(env) == "1" : !std::is_same<Mem, Kokkos::HostSpace>::value;
    ddp = std::make_unique<Ddp<Exec>>(comm, model, cfg.bucket_mb, overlap);
    // A restart reads the same files on every rank: the state is rank 0's already.
    if (cfg.restart == "none") ddp->broadcast_parameters();
    // Ranks on one node share gradients, weights and optimizer state instead of sending
    // them (KQLORA_DDP_SHARED_MEMORY=0: buckets always). A restart fills the shared
    // weights and state below, each rank its chunk.
    const char* shm = std::getenv("KQLORA_DDP_SHARED_MEMORY");
    if (!(shm && std::string(shm) == "0"))
      ddp->share_node_memory(optimizer_config(cfg), cfg.restart == "none");
  }
  // The optimizer sees this rank's parameters: all of them, its FSDP chunk, or its chunk
  // of the node-shared DDP weights.
  using Vec = Model<Exec>::Vec;
  const int64_t opt_first = fsdp ? fsdp->shard_offset() : ddp ? ddp->chunk_offset() : 0;
  const int64_t opt_size = fsdp ? fsdp->shard_size() : ddp ? ddp->chunk_size() : model.num_params();
  const auto opt_range = Kokkos::make_pair(opt_first, opt_first + opt_size);
  const Vec opt_params =
      fsdp ? fsdp->shard_params() : Vec(Kokkos::subview(model.params, opt_range));
  const Vec opt_grads = fsdp ? fsdp->shard_grads() : Vec(Kokkos::subview(model.grads, opt_range));
  Optimizer<Exec> opt = ddp && ddp->shares_memory()
                            ? Optimizer<Exec>(exec, optimizer_config(cfg), ddp->optimizer_buffers())
                            : Optimizer<Exec>(exec, optimizer_config(cfg), opt_params.extent(0));
  parallel_setup_s = seconds_since(t_parallel);
  if (cfg.restart != "none") {
#if KQLORA_HAVE_HDF5
    // This rank's parameters (all of them, its FSDP chunk, or its chunk of the node-shared
    // weights) and their optimizer state, read straight into place; then every rank's
    // parameters made whole.
    const auto t = Clock::now();
    const h5::ReadStats before = h5::read_stats();
    first_touch_s = restore_params(model, *resumed, opt_first, opt_params) +
                    restore_optimizer(opt, model, *resumed, opt_first);
    if (fsdp)
      fsdp->gather_params();
    else if (ddp && ddp->shares_memory())
      ddp->updated();  // every rank's chunk is in place
    if (!fsdp) model.params_changed();
    restart_state_s = seconds_since(t);
    chunk_read_s = h5::read_stats().read_s - before.read_s;
    chunk_verify_s = h5::read_stats().verify_s - before.verify_s;
    chunk_gb = 1e-9 * static_cast<double>(h5::read_stats().bytes - before.bytes);
    if (root)
      log << "restart: step " << start_step << " (" << resumed->contents().world_size
          << " rank(s), " << resumed->contents().parallel << ") -> " << nranks << " rank(s), "
          << cfg.parallel << "; set-up on rank 0: files and base weights "
          << human_time(restart_open_s) << ", " << cfg.parallel << " set-up "
          << human_time(parallel_setup_s) << ", parameters and optimizer state "
          << human_time(restart_state_s) << " (first touch " << human_time(first_touch_s)
          << ", reading " << human_time(chunk_read_s) << ", checksums "
          << human_time(chunk_verify_s) << " for " << std::fixed << std::setprecision(3) << chunk_gb
          << std::defaultfloat << " GB)\n";
    resumed.reset();  // (closes the files)
#endif
  }
  const InputSpec spec = model.input();
  DataSource data(cfg.data_file, spec, cfg.global_bs, static_cast<uint64_t>(cfg.seed), "data_file");
  std::unique_ptr<DataSource> eval;
  if (!cfg.eval_file.empty())
    eval = std::make_unique<DataSource>(cfg.eval_file, spec, cfg.global_bs,
                                        static_cast<uint64_t>(cfg.seed), "eval_file");
  if (root) {
    log << "model: " << mcfg.kind << ", " << model.table().entries.size() << " tensors in "
        << model.table().num_groups() << " groups, " << model.num_params()
        << " trainable parameters, NF4 " << human_bytes(static_cast<double>(model.nf4_bytes()))
        << "\n";
  }
  std::ofstream metrics;
  if (root && !cfg.metrics_file.empty()) {
    // A restart continues the metrics of the run it resumes.
    metrics.open(cfg.metrics_file, cfg.restart != "none" ? std::ios::app : std::ios::trunc);
    KQLORA_INPUT_CHECK(metrics.good(), cfg.metrics_file << ": cannot write the metrics file");
  }

  // (Plain variables, not structured bindings: lambdas below capture them.)
  const auto slice = slice_of(cfg.global_bs, rank, nranks);
  const int64_t first = slice.first, count = slice.second;
  // Micro-batches of at most micro_bs samples. FSDP gathers NF4 weights in every
  // micro-batch's forward and backward, collectively: there every rank runs as many
  // micro-batches as the largest slice (rank 0's) needs, a smaller slice's last ones
  // empty. (The split of a slice is the same as with its own count.)
  const int64_t largest = slice_of(cfg.global_bs, 0, nranks).second;
  const int64_t mb = std::min(cfg.micro_bs, largest);
  const int64_t micro_batches = ((fsdp ? largest : count) + mb - 1) / mb;
  // One micro-batch's buffers, in the form the model reads.
  Batch<Mem> buf;
  std::vector<float> rows, trows;
  std::vector<int32_t> ids, labels;
  if (spec.tokens) {
    buf.tokens = TokenMatrix<Mem>("kqlora::train::tokens", mb, spec.seq_len);
    buf.labels = TokenMatrix<Mem>("kqlora::train::labels", mb, spec.seq_len);
    ids.resize(static_cast<size_t>(mb * spec.seq_len));
    labels.resize(ids.size());
  } else {
    buf.inputs = Matrix<Mem>("kqlora::train::x", mb, spec.features);
    rows.resize(static_cast<size_t>(mb * spec.features));
    if (spec.target_features > 0) {
      buf.targets = Matrix<Mem>("kqlora::train::target", mb, spec.target_features);
      trows.resize(static_cast<size_t>(mb * spec.target_features));
    }
  }
  const bool mse = mcfg.loss == LossKind::mse;

  // Samples [first + m0, first + m0 + n) of `step` into the buffers' first n rows.
  auto load = [&](const DataSource& src, int64_t step, int64_t m0, int64_t n) {
    Batch<Mem> b;
    b.step = step;
    b.first_sample = first + m0;
    b.global_bs = cfg.global_bs;
    using Kokkos::ALL;
    const auto rows_n = Kokkos::make_pair(int64_t(0), n);
    if (spec.tokens) {
      b.tokens = Kokkos::subview(buf.tokens, rows_n, ALL);
      b.labels = Kokkos::subview(buf.labels, rows_n, ALL);
      src.tokens(step, first + m0, n, ids.data(), labels.data());
      upload(ids, b.tokens);
      upload(labels, b.labels);
      return b;
    }
    b.inputs = Matrix<Mem>(buf.inputs.data(), n, spec.features);
    if (buf.targets.data()) b.targets = Matrix<Mem>(buf.targets.data(), n, spec.target_features);
    if (src.synthetic()) {  // generated in place, on the device
      const int64_t g0 = src.global_sample(step, first + m0);
      const uint64_t seed = static_cast<uint64_t>(cfg.seed);
      fill_normal_rows(exec, b.inputs, seed, static_cast<uint64_t>(RandomStream::inputs), g0);
      if (b.targets.data())
        fill_normal_rows(exec, b.targets, seed, static_cast<uint64_t>(RandomStream::targets), g0);
    } else {
      src.inputs(step, first + m0, n, rows.data());
      upload(rows, b.inputs);
      if (b.targets.data()) {
        src.targets(step, first + m0, n, trows.data());
        upload(trows, b.targets);
      }
    }
    return b;
  };

  // The loss (and, for training, the gradients) of this rank's slice of a step's batch.
  auto run_batch = [&](const DataSource& src, int64_t step, bool train_pass, PhaseTimer* timer) {
    double loss = 0.0;
    const double normaliser = src.normaliser(step, mse);
    for (int64_t k = 0; k < micro_batches; ++k) {
      const int64_t m0 = k * mb, n = std::clamp<int64_t>(count - m0, 0, mb);
      if (timer) timer->enter(kData);
      const Batch<Mem> b = load(src, step, m0, n);
      if (timer) timer->enter(kForwardBackward);
      if (train_pass) {
        if (ddp && k + 1 == micro_batches) ddp->arm();          // the last micro-batch reduces
        loss += model.forward_backward(b, normaliser, m0 > 0);  // the first writes the grads
      } else {
        loss += model.loss(b, normaliser);
      }
    }
    return loss;
  };

  TrainSummary summary;
  PhaseTimer timer;
  int64_t last_saved = -1;
  const auto t_loop = Clock::now();
#if KQLORA_HAVE_HDF5
  auto save = [&](int64_t steps_done) {
    timer.enter(kCheckpoint);
    summary.last_checkpoint =
        save_checkpoint(cfg, model, opt, ddp ? ddp->optimizer_state(opt) : opt.state(), fsdp.get(),
                        comm, steps_done, data.synthetic() ? "synthetic" : data.path());
    last_saved = steps_done;
    if (root) log << "checkpoint: " << summary.last_checkpoint << "\n";
  };
#endif

  for (int64_t step = start_step; step < cfg.num_steps; ++step) {
    const double lr = scheduled_lr(cfg.lr_schedule, cfg.lr, step, cfg.warmup_steps, cfg.num_steps);
    double loss = run_batch(data, step, true, &timer);

    timer.enter(kComm);
    // The gradient of the whole global batch: a sum over the slices. A stop signal on any
    // rank travels with the loss, so every rank stops after the same step.
    if (ddp) ddp->finish();
    if (fsdp) fsdp->reduce_scatter_grads();
    double loss_and_stop[2] = {loss, signals::stop_requested() ? 1.0 : 0.0};
    if (nranks > 1) comm.wait(comm.allreduce_sum(loss_and_stop, 2));
    loss = loss_and_stop[0];
    const bool stop = loss_and_stop[1] > 0;

    timer.enter(kOptimizer);
    const double norm = fsdp  ? fsdp->grad_norm()
                        : ddp ? ddp->grad_norm(exec)
                              : grad_norm(exec, model.grads);
    const bool finite = std::isfinite(loss) && std::isfinite(norm);
    if (!finite) {
      KQLORA_CHECK(cfg.nonfinite != "stop",
                   "step " << step + 1 << ": the " << (std::isfinite(loss) ? "gradient" : "loss")
                           << " is not finite (loss " << loss << ", gradient norm " << norm
                           << "); stopping without updating the weights (nonfinite = skip "
                              "skips such steps instead)");
      ++summary.steps_skipped;
    } else {
      if (cfg.grad_clip > 0 && norm > 0) {
        const double coef = cfg.grad_clip / (norm + 1e-6);
        if (coef < 1.0) scale_grads(exec, opt_grads, static_cast<float>(coef));
      }
      opt.step(opt_params, opt_grads, lr);
      if (fsdp) {
        timer.enter(kComm);
        fsdp->gather_params();  // every rank's updated chunk to everyone
      }
    }
    if (ddp) {
      timer.enter(kComm);
      ddp->updated();  // node-shared: every rank's chunk updated (or the step skipped)
    }
    if (finite && !fsdp) model.params_changed();
    summary.losses.push_back(finite ? loss : NAN);
    summary.steps_done = step + 1;

    const double elapsed = seconds_since(t_loop);
    if (root && ((step + 1) % cfg.log_every == 0 || step + 1 == cfg.num_steps)) {
      const double sps = static_cast<double>((step + 1) * cfg.global_bs) / elapsed;
      const double eta = elapsed / (step + 1) * (cfg.num_steps - step - 1);
      log << "step " << std::setw(6) << step + 1 << "/" << cfg.num_steps << "  loss "
          << std::setprecision(6) << std::scientific << loss << std::defaultfloat << "  lr "
          << std::setprecision(3) << lr << "  |g| " << std::setprecision(4) << norm
          << "  samples/s " << std::fixed << std::setprecision(1) << sps << std::defaultfloat
          << "  elapsed " << human_time(elapsed) << "  ETA " << human_time(eta)
          << (finite ? "" : "  (non-finite: step skipped)") << "\n";
      log.flush();
    }
    if (metrics.is_open() && ((step + 1) % cfg.log_every == 0 || step + 1 == cfg.num_steps)) {
      metrics << std::setprecision(17) << "{\"step\": " << step + 1 << ", \"loss\": ";
      if (finite)
        metrics << loss;
      else
        metrics << "null";
      metrics << ", \"lr\": " << lr << ", \"grad_norm\": ";
      if (std::isfinite(norm))
        metrics << norm;
      else
        metrics << "null";
      metrics << ", \"skipped\": " << (finite ? "false" : "true") << ", \"elapsed_s\": " << elapsed
              << "}\n";
      metrics.flush();
    }
    if (eval && (step + 1) % cfg.eval_every == 0) {
      timer.enter(kEval);
      double eval_loss = run_batch(*eval, step, false, nullptr);
      comm.wait(comm.allreduce_sum(&eval_loss, 1));
      if (root)
        log << "eval   " << std::setw(6) << step + 1 << "  loss " << std::scientific
            << std::setprecision(6) << eval_loss << std::defaultfloat << "\n";
      if (metrics.is_open())
        metrics << std::setprecision(17) << "{\"step\": " << step + 1
                << ", \"eval_loss\": " << eval_loss << "}\n";
    }
#if KQLORA_HAVE_HDF5
    if (cfg.checkpoint_every > 0 && (step + 1) % cfg.checkpoint_every == 0) save(step + 1);
#endif
    if (stop && step + 1 < cfg.num_steps) {
#if KQLORA_HAVE_HDF5
      if (last_saved != step + 1) save(step + 1);
#endif
      summary.preempted = true;
      if (root)
        log << "stopped by a signal after step " << step + 1 << " (checkpoint written); resume "
            << "with restart = latest\n";
      break;
    }
  }
#if KQLORA_HAVE_HDF5
  if (!summary.preempted && last_saved != cfg.num_steps &&
      (start_step < cfg.num_steps || cfg.restart == "none"))
    save(cfg.num_steps);
#else
  if (root) log << "no checkpoint written: this kqlora was built without HDF5\n";
#endif
  timer.enter(kData);
  if (collect_final) {
    for (const ParamEntry* e : model.table().of_kind(ParamKind::nf4))
      summary.final_base.emplace_back(
          e->name,
          nf4_copy_to<Kokkos::HostSpace>(fsdp ? fsdp->whole_nf4(e->offset) : model.nf4[e->offset]));
    auto hp = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), model.params);
    for (const ParamEntry* p : model.table().of_kind(ParamKind::trainable))
      summary.final_params.emplace_back(
          p->name, std::vector<float>(hp.data() + p->offset, hp.data() + p->offset + p->numel()));
  }

  // Timing table: min / avg / max over ranks.
  double total = seconds_since(t_start);
  double mn[kPhases + 1], sum[kPhases + 1], mx[kPhases + 1], mine[kPhases + 1];
  for (int p = 0; p < kPhases; ++p) mine[p] = timer.total[p];
  mine[kPhases] = total;
  {  // every rank's times on every rank, then min / sum / max
    std::vector<double> all(static_cast<size_t>((kPhases + 1) * nranks));
    comm.wait(comm.allgather(mine, all.data(), sizeof(mine)));
    for (int p = 0; p <= kPhases; ++p) {
      mn[p] = mx[p] = all[p];
      sum[p] = 0;
      for (int r = 0; r < nranks; ++r) {
        const double v = all[r * (kPhases + 1) + p];
        mn[p] = std::min(mn[p], v);
        mx[p] = std::max(mx[p], v);
        sum[p] += v;
      }
    }
  }
  const double peak_tracked = static_cast<double>(memory::tracked_peak_bytes());
  const double rss_above = static_cast<double>(memory::peak_rss_bytes() - rss_start);
  if (root) {
    log << "\n"
        << std::left << std::setw(18) << "phase" << std::right << std::setw(11) << "min"
        << std::setw(11) << "avg" << std::setw(11) << "max" << std::setw(9) << "% total\n";
    const double avg_total = sum[kPhases] / nranks;
    auto row = [&](const char* name, double a, double b, double c) {
      log << std::left << std::setw(18) << name << std::right << std::fixed << std::setprecision(3)
          << std::setw(10) << a << "s" << std::setw(10) << b << "s" << std::setw(10) << c << "s"
          << std::setw(8) << std::setprecision(1) << 100.0 * b / avg_total << "%\n"
          << std::defaultfloat;
    };
    double phases_avg = 0;
    for (int p = 0; p < kPhases; ++p) {
      row(phase_names[p], mn[p], sum[p] / nranks, mx[p]);
      phases_avg += sum[p] / nranks;
    }
    row("setup", avg_total - phases_avg, avg_total - phases_avg, avg_total - phases_avg);
    row("total", mn[kPhases], avg_total, mx[kPhases]);
    log << "(setup: initialisation, quantization and file reading, on average)\n";
    if (ddp && ddp->shares_memory()) {
      const auto& st = ddp->stats();
      log << "DDP: gradients, weights and optimizer state in node shared memory; each rank "
             "sums and updates 1/"
          << nranks << " of " << human_bytes(st.bytes / std::max<int64_t>(1, summary.steps_done))
          << " per step; waited for the other ranks " << human_time(st.waited_s) << ", summing "
          << human_time(st.sum_s) << "\n";
    } else if (ddp) {
      const auto& st = ddp->stats();
      log << "DDP: " << ddp->num_buckets() << " bucket(s) per step, "
          << human_bytes(st.bytes / std::max<int64_t>(1, summary.steps_done))
          << " reduced per step; "
          << "reductions in flight " << human_time(st.in_flight_s) << ", waited for "
          << human_time(st.waited_s) << ": " << std::fixed << std::setprecision(1)
          << (st.in_flight_s > 0 ? 100.0 * std::max(0.0, 1.0 - st.waited_s / st.in_flight_s) : 0.0)
          << std::defaultfloat << "% of the communication hidden behind the backward\n";
    }
    log << "peak memory (rank 0): tracked allocations " << human_bytes(peak_tracked)
        << ", RSS above start-up " << human_bytes(rss_above) << "\n";
  }
  if (ddp) ddp->keep_nothing_for_model();  // (the model goes with it)
  return summary;
}

}  // namespace kqlora
