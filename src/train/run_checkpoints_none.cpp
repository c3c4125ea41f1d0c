// RunCheckpoints of a build without HDF5: no checkpoint can be written or read.
#include <ostream>

#include "kqlora/core/error.hpp"
#include "kqlora/train/run_checkpoints.hpp"

namespace kqlora {

namespace {

template <class ExecSpace>
class NoCheckpoints : public RunCheckpoints<ExecSpace> {
 public:
  NoCheckpoints(bool root, std::ostream& log) : root_(root), log_(log) {}
  int64_t open_restart(Model<ExecSpace>&) override { return 0; }
  void restore_state(Model<ExecSpace>&, DataParallel<ExecSpace>&, Optimizer<ExecSpace>&) override {}
  std::string save(Model<ExecSpace>&, DataParallel<ExecSpace>&, const Optimizer<ExecSpace>&,
                   int64_t, const std::string&) override {
    if (root_) log_ << "no checkpoint written: this kqlora was built without HDF5\n";
    return "";
  }

 private:
  bool root_;
  std::ostream& log_;
};

}  // namespace

template <class ExecSpace>
std::unique_ptr<RunCheckpoints<ExecSpace>> make_run_checkpoints(const Config& cfg,
                                                                Communicator& comm,
                                                                std::ostream& log) {
  KQLORA_INPUT_CHECK(cfg.checkpoint_every == 0 && cfg.restart == "none",
                     "this kqlora was built without HDF5: it has no checkpoints ("
                         << (cfg.restart != "none" ? "restart" : "checkpoint_every")
                         << " asks for one)");
  return std::make_unique<NoCheckpoints<ExecSpace>>(comm.rank() == 0, log);
}

template std::unique_ptr<RunCheckpoints<Kokkos::DefaultExecutionSpace>> make_run_checkpoints(
    const Config&, Communicator&, std::ostream&);

}  // namespace kqlora
