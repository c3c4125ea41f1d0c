#include "kqlora/train/trainer.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <ostream>
#include <sstream>
#include <type_traits>

#include "kqlora/build_config.hpp"
#include "kqlora/core/blas_selection.hpp"
#include "kqlora/core/build_info.hpp"
#include "kqlora/core/content_hash.hpp"
#include "kqlora/core/fma_peak.hpp"
#include "kqlora/core/gemm_engine.hpp"
#include "kqlora/core/gpu_device.hpp"
#include "kqlora/core/human_units.hpp"
#include "kqlora/core/runtime.hpp"
#include "kqlora/core/seconds_since.hpp"
#include "kqlora/core/signals.hpp"
#include "kqlora/nn/model_registry.hpp"
#include "kqlora/parallel/comm_choice.hpp"
#include "kqlora/parallel/data_parallel.hpp"
#include "kqlora/parallel/world.hpp"
#include "kqlora/train/batch_loader.hpp"
#include "kqlora/train/component_configs.hpp"
#include "kqlora/train/data.hpp"
#include "kqlora/train/init.hpp"
#include "kqlora/train/memory_check.hpp"
#include "kqlora/train/preference_loss.hpp"
#include "kqlora/train/reference_logps_file.hpp"
#include "kqlora/train/run_checkpoints.hpp"
#include "kqlora/train/run_report.hpp"
#if KQLORA_HAVE_HDF5
#include "kqlora/train/checkpointing.hpp"
#endif
#if KQLORA_HAVE_NCCL
#include "kqlora/parallel/nccl_communicator.hpp"
#endif

namespace kqlora {

namespace {

using Exec = Kokkos::DefaultExecutionSpace;
using Mem = Exec::memory_space;

/// The final model, whole (FSDP shards gathered), for tests that compare runs.
void collect(Model<Exec>& model, DataParallel<Exec>& dp, TrainSummary& summary) {
  for (const ParamEntry* e : model.table().of_kind(ParamKind::nf4))
    summary.final_base.emplace_back(e->name,
                                    nf4_copy_to<Kokkos::HostSpace>(dp.whole_nf4(e->offset)));
  // device-wide: end of run
  auto hp = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), model.params);
  for (const ParamEntry* p : model.table().of_kind(ParamKind::trainable))
    summary.final_params.emplace_back(
        p->name, std::vector<float>(hp.data() + p->offset, hp.data() + p->offset + p->numel()));
}

std::string describe_model(const Model<Exec>& m) {
  std::ostringstream os;
  os << "model: " << m.config().kind << ", " << m.table().entries.size() << " tensors in "
     << m.table().num_groups() << " group(s), " << m.num_params() << " trainable parameters, NF4 "
     << human_bytes(static_cast<double>(m.nf4_bytes()));
  for (const auto& n : m.notes()) os << "\nnote: " << n;
  return os.str();
}

/// The note for a data file in HDF5's older format (no metadata checksums).
std::string unchecksummed_data_note(const DataSource& d) {
  return "note: " + d.path() +
         ": HDF5 metadata not checksummed (the older file format, h5py's default): damage to "
         "it cannot be detected; `h5repack --low=2 --high=2 IN OUT` rewrites it checksummed "
         "(docs/RELIABILITY.md)\n";
}

/// Sums `v` (and `tokens`, `flops`) over ranks; a stop signal on any rank travels with
/// it, so every rank stops after the same step.
bool sum_and_stop(Communicator& comm, double& v, double* tokens = nullptr, double* flops = nullptr,
                  double* aux = nullptr) {
  double all[5] = {v, stop_requested() ? 1.0 : 0.0, tokens ? *tokens : 0, flops ? *flops : 0,
                   aux ? *aux : 0};
  if (comm.size() > 1) comm.wait(comm.allreduce_sum(all, 5));
  v = all[0];
  if (tokens) *tokens = all[2];
  if (flops) *flops = all[3];
  if (aux) *aux = all[4];
  return all[1] > 0;
}

/// The FMA peak of the cores this run computes on (host runs; 0 on a device, whose peak
/// kqlora does not measure, and for bfloat16 products on bfloat16 hardware, which the float32 FMA
/// peak does not bound): one core's, measured now, times the threads of all ranks.
/// The deck's preference objective (objective != sft).
PreferenceConfig preference_config(const Config& cfg) {
  PreferenceConfig p;
  p.objective = cfg.objective;
  p.loss_type = cfg.loss_type;
  p.beta = cfg.beta;
  p.label_smoothing = cfg.label_smoothing;
  p.simpo_gamma = cfg.simpo_gamma;
  return p;
}

/// A token file's form must be the objective's: pairs for a preference objective, SFT rows
/// for sft.
void check_form(const Config& cfg, const DataSource& d, const std::string& key) {
  if (d.synthetic()) return;
  const bool pairs = d.form() == "pairs";
  KQLORA_INPUT_CHECK(
      pairs == (cfg.objective != "sft"),
      key << " " << d.path() << ": "
          << (pairs ? "preference pairs (form \"pairs\"), but objective = sft: set objective = "
                      "dpo, simpo or orpo"
                    : "SFT rows, but objective = " + cfg.objective +
                          " needs preference pairs (tools/tokenize_sft.py on prompt / chosen / "
                          "rejected rows; docs/MODELS.md, \"Data files\")"));
}

/// The sums of every rank's preference metrics.
void sum_over_ranks(Communicator& comm, PreferenceSums& s) {
  if (comm.size() > 1) comm.wait(comm.allreduce_sum(s.v, PreferenceSums::kCount));
}

double run_peak_flops(const Communicator& comm, const Config& cfg) {
  if (!std::is_same<Mem, Kokkos::HostSpace>::value) return 0;
  if (cfg.dtype == DType::bfloat16 && host_bf16_products()) return 0;
  const int threads = std::max(blas_threads(), Exec().concurrency());
  return fma_peak_flops(0.2) * threads * comm.size();
}

/// Where the run's model lives: host memory, or this rank's GPU shared with the ranks that
/// compute on the same one (a collective over `comm` in a device build).
MemoryPlacement run_placement(Communicator& comm) {
  int sharing = 1;
  if (!std::is_same<Mem, Kokkos::HostSpace>::value && comm.size() > 1) {
    const DevicePlace mine{host_name(), gpu_uuid(gpu_ordinal())};
    const std::vector<DevicePlace> places = gather_device_places(comm, mine);
    sharing = static_cast<int>(std::count_if(places.begin(), places.end(), [&](const auto& p) {
      return p.host == mine.host && p.device == mine.device;
    }));
  }
  return build_placement(sharing, std::string(comm.backend()) == "NCCL", comm.device_buffers());
}

}  // namespace

std::unique_ptr<Communicator> make_communicator(const Config& cfg, std::string* note) {
  std::unique_ptr<Communicator> comm;
  std::string why;
#if KQLORA_HAVE_NCCL && defined(KOKKOS_ENABLE_CUDA)
  // auto: NCCL where the model lives in device memory and every rank has a GPU of its own
  // (comm_choice.hpp), MPI otherwise.
  const bool device_memory = !std::is_same<Mem, Kokkos::HostSpace>::value;
  // One rank that runs no collective (the single-process strategy) needs no NCCL: neither
  // its start-up nor its buffers (`comm = nccl` still makes it, as asked).
  const bool collectives =
      world_size() > 1 || cfg.single_process == "off" || cfg.parallel == "fsdp";
  if (cfg.comm == "nccl" || (cfg.comm == "auto" && collectives)) {
    Kokkos::Cuda cuda;
    const DevicePlace mine{host_name(), gpu_uuid(cuda.cuda_device())};
#if KQLORA_HAVE_MPI
    std::unique_ptr<Communicator> mpi = make_mpi_communicator(true);
    mpi->set_timeout(cfg.comm_timeout_s);
    const std::vector<DevicePlace> places = gather_device_places(*mpi, mine);
#else
    std::unique_ptr<Communicator> mpi;  // (a world of one)
    const std::vector<DevicePlace> places = {mine};
#endif
    const CommChoice choice = choose_comm(cfg.comm, device_memory, true, places);
    why = choice.note;
    if (choice.nccl) {
      comm = make_nccl_communicator(cuda.cuda_device(), cuda.cuda_stream(), cfg.comm_timeout_s);
      // NCCL's lazily made buffers (NVLS's: about 1 GiB on NVSwitch nodes) exist before the
      // memory check reads the free GPU memory (run_placement): the run's collectives once,
      // at a bucket's size (docs/GPU.md, "Memory").
      const int64_t free_before = gpu_free_memory(cuda.cuda_device()).bytes;
      nccl_warm_up(*comm, static_cast<int64_t>(cfg.bucket_mb * (1 << 20)), cfg.parallel == "fsdp");
      // (what those buffers took, measured: the GPU check reads this line)
      why += "; NCCL's first collectives took " +
             human_bytes(
                 static_cast<double>(free_before - gpu_free_memory(cuda.cuda_device()).bytes)) +
             " of GPU memory";
    } else {
      comm = std::move(mpi);
    }
  }
#else
  (void)choose_comm(cfg.comm, false, false, {});  // (refuses nccl; the choice is MPI's)
#endif
#if KQLORA_HAVE_MPI
  if (!comm) comm = make_mpi_communicator(true);
#else
  if (!comm) comm = make_self_communicator();
#endif
  comm->set_timeout(cfg.comm_timeout_s);
  if (note) *note = why;
  return comm;
}

TrainSummary train(const Config& cfg, std::ostream& log) {
  std::string note;
  auto comm = make_communicator(cfg, &note);
  if (comm->rank() == 0 && !note.empty()) log << note << "\n";
  return train(cfg, *comm, log);
}

TrainSummary train(const Config& cfg, Communicator& comm, std::ostream& log, bool collect_final) {
  KQLORA_INPUT_CHECK(comm.size() <= cfg.global_bs,
                     "global_bs " << cfg.global_bs << " is smaller than the " << comm.size()
                                  << " ranks (each rank needs a sample)");
  const Exec exec;
  RunReport report(cfg, comm, exec, log);
  // Before the first allocation: a run that cannot fit is refused, naming the keys.
  const int node_ranks = std::max(1, std::min(comm.size(), ranks_on_this_node()));
  const int64_t seq_len = model_kind(cfg.model).tokens ? token_file_seq_len(cfg.data_file) : 0;
  const MemoryPlacement placement = run_placement(comm);
  check_memory(cfg, comm.size(), node_ranks, seq_len, "the deck", placement);
  {
    const MemoryEstimate e = estimate_memory(cfg, comm.size(), node_ranks, seq_len, placement);
    report.set_memory_estimate(e.per_rank + e.device_per_rank);
    if (report.root()) log << e.report() << "\n";
  }
  auto checkpoints = make_run_checkpoints<Exec>(cfg, comm, log);
  // The weights are written once, by the initialisation or the restart (and, with
  // node-shared DDP, only into the shared memory): no zeros to write first. A restart
  // takes the whole state from a checkpoint (any layout, world size and parallel mode).
  auto model = make_model(exec, model_config(cfg), false);
  // The data first: a file that scores nothing or was made with another tokenizer is
  // refused before the base is quantized (minutes for a 7B).
  TokenFileChecks checks;
  checks.tokenizer_check = cfg.tokenizer_check == "on";
  if (checks.tokenizer_check && !cfg.hf_model_dir.empty())
    checks.tokenizer = tokenizer_identity(cfg.hf_model_dir);
  const DataSource data(cfg.data_file, model->input(), cfg.global_bs, cfg.seed, "data_file",
                        cfg.shuffle, checks);
  // (Token files: the eval rows may be as long as they need, independently of data_file's.)
  std::unique_ptr<DataSource> eval;
  if (!cfg.eval_file.empty())
    eval = std::make_unique<DataSource>(cfg.eval_file, model->input(), cfg.global_bs, cfg.seed,
                                        "eval_file", false, checks);
  check_form(cfg, data, "data_file");
  if (eval) check_form(cfg, *eval, "eval_file");
  const bool preference = cfg.objective != "sft";
  const PreferenceConfig objective = preference_config(cfg);
  const bool resume = cfg.restart != "none";
  std::ostringstream init_log;
  if (!resume) initialize_model(exec, *model, cfg.init_file, init_log);
  if (report.root()) log << init_log.str();
  const int64_t start_step = resume ? checkpoints->open_restart(*model) : 0;
  checkpoints->note_base(*model);  // (whole, before FSDP shards it)
  // (a precomputed reference's side file is keyed by the base: its identity, whole too)
  std::string base_identity;
#if KQLORA_HAVE_HDF5
  if (preference && cfg.precompute_ref_log_probs && needs_reference(objective))
    base_identity = model_base_hash(*model);
#endif
  const std::string model_line = describe_model(*model);
  auto dp = make_data_parallel(exec, comm, *model, data_parallel_config(cfg, !resume), log);
  if (report.root()) dp->describe(log);
  Optimizer<Exec> opt = dp->make_optimizer(exec, optimizer_config(cfg));
  if (resume) checkpoints->restore_state(*model, *dp, opt);
  // A preference objective's frozen reference: the base with the adapters the run started
  // from (none: zeros, the base alone), the same on a restart (docs/TRAINING.md).
  Model<Exec>::Vec reference;
  std::string reference_hash;
  if (preference && needs_reference(objective)) {
    const std::vector<float> start =
        starting_trainables(model->config(), model->table(), cfg.init_file);
    ContentHash h;
    h.add(start.data(), sizeof(float) * start.size());
    reference_hash = h.hex();
    checkpoints->note_reference(reference_hash);
    reference = Model<Exec>::Vec("kqlora::train::reference", start.size());
    // device-wide: set-up
    Kokkos::deep_copy(reference,
                      Kokkos::View<const float*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(
                          start.data(), start.size()));
  }
  // (Measured once the run is set up: a run refused before costs no measurement.)
  report.set_peak_flops(run_peak_flops(comm, cfg));
  const InputSpec spec = data.spec();  // (token models: the file's sequence length)
  const bool lockstep = dp->nf4_shards() != nullptr;
  BatchLoader<Exec> batches(exec, cfg, spec, comm.rank(), comm.size(), lockstep);
  std::unique_ptr<BatchLoader<Exec>> eval_batches;
  if (eval)
    eval_batches = std::make_unique<BatchLoader<Exec>>(exec, cfg, eval->spec(), comm.rank(),
                                                       comm.size(), lockstep);
  // precompute_ref_log_probs: the reference's log-probabilities of every pair, once (or
  // from the side file an earlier run on the same data, base and adapters left)
  std::vector<double> ref_data, ref_eval;
  if (cfg.precompute_ref_log_probs && reference.data()) {
    auto precompute = [&](const DataSource& d, BatchLoader<Exec>& b, const std::string& what,
                          std::vector<double>& out) {
      const auto t = std::chrono::steady_clock::now();
      ContentHash k;
      k.add(d.content_hash());
      k.add(base_identity);
      k.add(reference_hash);
      // (what else makes the numbers: the model's keys -- the adapters' scale among them --
      // config.json and kqlora's version)
      k.add(model->config().to_text());
      k.add(model->config().arch_text);
      k.add(version());
      const std::string key = k.hex(), path = reference_logps_path(cfg.save_dir, what, key);
      double found = 0;
      try {  // (a damaged file is computed again, on every rank alike)
        found = read_reference_logps(path, key, 2 * d.rows(), out) ? 1 : 0;
      } catch (const InputError& e) {
        log << "note: " << e.what() << ": computing the reference again\n";
      }
      if (comm.size() > 1) comm.wait(comm.allreduce_sum(&found, 1));
      if (found < comm.size()) {  // (every rank computes its share; a sum over the ranks)
        out = b.reference_logps(*model, d, reference, comm.rank(), comm.size());
        if (comm.size() > 1)
          comm.wait(comm.allreduce_sum(out.data(), static_cast<int64_t>(out.size())));
        if (report.root()) write_reference_logps(path, key, out);
      }
      if (report.root())
        log << "reference: " << what << "'s " << d.rows() << " pairs' log-probabilities "
            << (found < comm.size() ? "precomputed in " : "read in ")
            << human_time(seconds_since(t)) << " (" << path << ")\n";
    };
    precompute(data, batches, "data_file", ref_data);
    if (eval) precompute(*eval, *eval_batches, "eval_file", ref_eval);
  }
  if (report.root()) {
    for (const DataSource* d : {&data, static_cast<const DataSource*>(eval.get())}) {
      if (d && !d->synthetic() && !d->metadata_checksummed()) log << unchecksummed_data_note(*d);
      if (d)
        for (const auto& note : d->notes()) log << note << "\n";
    }
    log << model_line << "\n";
  }

  TrainSummary summary;
  const std::string source = data.synthetic() ? "synthetic" : data.path();
  int64_t last_saved = -1;
  auto save = [&](int64_t steps_done) {
    report.enter(Phase::checkpoint);
    summary.last_checkpoint = checkpoints->save(*model, *dp, opt, steps_done, source);
    last_saved = steps_done;
  };
  for (int64_t step = start_step; step < cfg.num_steps; ++step) {
    const double lr = scheduled_lr(cfg.lr_schedule, cfg.lr, step, cfg.warmup_steps, cfg.num_steps);
    // A global batch without a scored label (token data, all -100) has no loss to
    // follow: the step is skipped on every rank alike (each computes the count alone).
    const bool empty = data.normaliser(step, cfg.loss == "mse") == 0;
    bool stop = false;
    if (empty) {
      double zero = 0;
      stop = sum_and_stop(comm, zero);
      summary.losses.push_back(NAN);
      summary.steps_empty += 1;
      summary.steps_done = step + 1;
      if (report.root())
        log << "warning: step " << step + 1 << ": the global batch has no scored label (each "
            << "-100 or at a document's first position); skipped, no update ("
            << summary.steps_empty << " so far)\n";
    } else {
      PreferenceSums sums;
      double loss =
          preference ? batches.run_preference(*model, dp.get(), data, step, objective, reference,
                                              sums, &report, ref_data.empty() ? nullptr : &ref_data)
                     : batches.run(*model, dp.get(), data, step, &report);
      report.enter(Phase::communication);
      dp->reduce_gradients();  // the gradient of the whole global batch
      double tokens = batches.tokens(), flops = batches.flops(), aux = batches.aux();
      stop = sum_and_stop(comm, loss, &tokens, &flops, &aux);
      if (preference) {
        sum_over_ranks(comm, sums);
        report.set_step_metrics(sums.means(objective));
      }
      report.enter(Phase::optimizer);
      const double norm = dp->grad_norm(exec);
      const bool finite = std::isfinite(loss) && std::isfinite(norm);
      KQLORA_CHECK(finite || cfg.nonfinite != "stop",
                   "step " << step + 1 << ": the " << (std::isfinite(loss) ? "gradient" : "loss")
                           << " is not finite (loss " << loss << ", gradient norm " << norm
                           << "); stopping without updating the weights (nonfinite = skip "
                              "skips such steps instead)");
      if (finite) {
        if (cfg.grad_clip > 0 && norm > 0 && cfg.grad_clip / (norm + 1e-6) < 1.0)
          scale_grads(exec, dp->chunk_grads(), static_cast<float>(cfg.grad_clip / (norm + 1e-6)));
        opt.step(dp->chunk_params(), dp->chunk_grads(), lr);
      }
      if (dp->communicates()) report.enter(Phase::communication);
      dp->after_update(finite);  // every rank's model holds the step's weights
      summary.losses.push_back(finite ? loss : NAN);
      summary.steps_skipped += finite ? 0 : 1;
      summary.steps_done = step + 1;
      report.step(step, loss, lr, norm, finite, tokens, flops, aux);
    }
    if (eval && (step + 1) % cfg.eval_every == 0) {
      report.enter(Phase::evaluation);
      PreferenceSums sums;
      double eval_loss = preference ? eval_batches->run_preference(
                                          *model, nullptr, *eval, -1, objective, reference, sums,
                                          nullptr, ref_eval.empty() ? nullptr : &ref_eval)
                                    : eval_batches->evaluate(*model, *eval);
      sum_and_stop(comm, eval_loss);
      if (preference) sum_over_ranks(comm, sums);
      report.eval(
          step, eval_loss,
          preference ? sums.means(objective) : std::vector<std::pair<std::string, double>>());
    }
    if (cfg.checkpoint_every > 0 && (step + 1) % cfg.checkpoint_every == 0) save(step + 1);
    if (stop && step + 1 < cfg.num_steps) {
      if (last_saved != step + 1) save(step + 1);
      summary.preempted = true;
      if (report.root())
        log << "stopped by a signal after step " << step + 1 << " (checkpoint written); resume "
            << "with restart = latest\n";
      break;
    }
  }
  if (!summary.preempted && last_saved != cfg.num_steps && (start_step < cfg.num_steps || !resume))
    save(cfg.num_steps);
  report.enter(Phase::data);
  if (collect_final) collect(*model, *dp, summary);
  std::ostringstream stats;
  dp->report(stats, summary.steps_done);
  report.finish(stats.str());
  dp->keep_nothing_for_model();  // (the model goes with it)
  return summary;
}

}  // namespace kqlora
