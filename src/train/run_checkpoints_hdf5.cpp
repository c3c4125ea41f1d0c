// RunCheckpoints of a build with HDF5 (train/checkpointing.hpp does the work).
#include <chrono>
#include <iomanip>
#include <ostream>
#include <sstream>

#include "kqlora/core/human_units.hpp"
#include "kqlora/core/seconds_since.hpp"
#include "kqlora/io/checkpoint.hpp"
#include "kqlora/io/hdf5_file.hpp"
#include "kqlora/train/checkpointing.hpp"
#include "kqlora/train/init.hpp"
#include "kqlora/train/run_checkpoints.hpp"

namespace kqlora {

namespace {

using Clock = std::chrono::steady_clock;

template <class ExecSpace>
class Hdf5Checkpoints : public RunCheckpoints<ExecSpace> {
 public:
  Hdf5Checkpoints(const Config& cfg, Communicator& comm, std::ostream& log)
      : cfg_(cfg), comm_(comm), log_(log), root_(comm.rank() == 0) {
    check_save_dir(cfg.save_dir, comm);  // now, not after the training (every run saves)
  }

  int64_t open_restart(Model<ExecSpace>& model) override {
    const auto t = Clock::now();
    std::ostringstream notes;  // (every rank opens the files; rank 0 speaks)
    reader_ = std::make_unique<CheckpointReader>(load_restart(cfg_, notes));
    if (root_) log_ << notes.str();
    // A Hugging Face model resumes on the base it was trained on: quantized again from its
    // files (and the init_file) and compared with the checkpoint's bytes.
    // A checkpoint with base_hash holds no base: the one quantized again must be it.
    const std::string path = cfg_.restart == "latest" ? cfg_.save_dir : cfg_.restart;
    const std::string& stored_hash = reader_->contents().base_hash;
    restart_reference_ = reader_->contents().reference_hash;
    restart_path_ = path;
    std::vector<Nf4Tensor<Kokkos::HostSpace>> base;
    if (!cfg_.hf_model_dir.empty()) {
      std::ostringstream quiet;
      initialize_model(ExecSpace(), model, cfg_.init_file, quiet);
      if (stored_hash.empty()) base = nf4_snapshot(model);
    }
    if (!stored_hash.empty()) {
      KQLORA_INPUT_CHECK(!cfg_.hf_model_dir.empty(),
                         "restart from " << path << ": the checkpoint stores no base "
                                         << "(checkpoint_base = auto); hf_model_dir is needed");
      const std::string now = model_base_hash(model);
      KQLORA_INPUT_CHECK(now == stored_hash,
                         "restart from "
                             << path << ": the base quantized from " << cfg_.hf_model_dir
                             << " has hash " << now << ", the checkpoint's base_hash is "
                             << stored_hash
                             << " (the model's weights or the init_file changed since?)");
    } else {
      restore_frozen(model, *reader_);
      if (!base.empty()) check_same_base(model, base, cfg_.hf_model_dir, path);
    }
    open_s_ = seconds_since(t);
    set_up_ = Clock::now();
    return reader_->contents().step;
  }

  void note_base(const Model<ExecSpace>& model) override {
    if (cfg_.checkpoint_base == "auto" && !model.config().arch_text.empty())
      base_hash_ = model_base_hash(model);
  }

  void note_reference(const std::string& hash) override {
    KQLORA_INPUT_CHECK(restart_path_.empty() || restart_reference_ == hash,
                       "restart from "
                           << restart_path_ << ": the adapters this run starts from "
                           << "(its preference reference; init_file "
                           << (cfg_.init_file.empty() ? "none" : cfg_.init_file) << ", seed "
                           << cfg_.seed << ") have hash " << hash
                           << ", the checkpoint's reference_hash is "
                           << (restart_reference_.empty() ? "absent" : restart_reference_)
                           << ": the reference would change mid-run");
    reference_hash_ = hash;
  }

  void restore_state(Model<ExecSpace>& model, DataParallel<ExecSpace>& dp,
                     Optimizer<ExecSpace>& opt) override {
    // This rank's parameters (all of them, its FSDP chunk, or its chunk of the node-shared
    // weights) and their optimizer state, read straight into place; then every rank's
    // parameters made whole.
    const double parallel_s = seconds_since(set_up_);
    const auto t = Clock::now();
    const h5::ReadStats before = h5::read_stats();
    const double first_touch_s =
        restore_params(model, *reader_, dp.chunk_offset(), dp.chunk_params()) +
        restore_optimizer(opt, model, *reader_, dp.chunk_offset());
    dp.after_restore();
    const double state_s = seconds_since(t);
    const h5::ReadStats after = h5::read_stats();
    const auto& c = reader_->contents();
    if (root_)
      log_ << "restart: step " << c.step << " (" << c.world_size << " rank(s), " << c.parallel
           << ") -> " << comm_.size() << " rank(s), " << cfg_.parallel
           << "; set-up on rank 0: files and base weights " << human_time(open_s_) << ", "
           << dp.name() << " set-up " << human_time(parallel_s)
           << ", parameters and optimizer state " << human_time(state_s) << " (first touch "
           << human_time(first_touch_s) << ", reading " << human_time(after.read_s - before.read_s)
           << ", checksums " << human_time(after.verify_s - before.verify_s) << " for "
           << std::fixed << std::setprecision(3)
           << 1e-9 * static_cast<double>(after.bytes - before.bytes) << std::defaultfloat
           << " GB)\n";
    reader_.reset();  // (closes the files)
  }

  std::string save(Model<ExecSpace>& model, DataParallel<ExecSpace>& dp,
                   const Optimizer<ExecSpace>& opt, int64_t steps_done,
                   const std::string& data_source) override {
    const std::string dir = save_checkpoint(cfg_, model, opt, dp.optimizer_state(opt), dp, comm_,
                                            steps_done, data_source, base_hash_, reference_hash_);
    if (root_) log_ << "checkpoint: " << dir << "\n";
    return dir;
  }

 private:
  const Config& cfg_;
  Communicator& comm_;
  std::ostream& log_;
  bool root_;
  std::unique_ptr<CheckpointReader> reader_;
  std::string base_hash_;  // checkpoint_base = auto: the base's identity, written instead
  std::string reference_hash_, restart_reference_, restart_path_;
  double open_s_ = 0;
  Clock::time_point set_up_;
};

}  // namespace

template <class ExecSpace>
std::unique_ptr<RunCheckpoints<ExecSpace>> make_run_checkpoints(const Config& cfg,
                                                                Communicator& comm,
                                                                std::ostream& log) {
  return std::make_unique<Hdf5Checkpoints<ExecSpace>>(cfg, comm, log);
}

template std::unique_ptr<RunCheckpoints<Kokkos::DefaultExecutionSpace>> make_run_checkpoints(
    const Config&, Communicator&, std::ostream&);

}  // namespace kqlora
