#include "kqlora/parallel/data_parallel.hpp"

#include <cstdlib>
#include <ostream>

#include "kqlora/core/error.hpp"
#include "kqlora/parallel/broadcast_model.hpp"
#include "kqlora/parallel/ddp_buckets.hpp"
#include "kqlora/parallel/ddp_shared_memory.hpp"
#include "kqlora/parallel/fsdp.hpp"
#include "kqlora/parallel/single_process.hpp"

namespace kqlora {

Switch parse_switch(const std::string& v, const std::string& key) {
  if (v == "on") return Switch::on;
  if (v == "off") return Switch::off;
  KQLORA_INPUT_CHECK(v == "auto", key << ": expected auto|on|off, got '" << v << "'");
  return Switch::automatic;
}

namespace {
const char* switch_name(Switch s) {
  return s == Switch::on ? "on" : s == Switch::off ? "off" : "auto";
}

/// The environment variable (0 or 1), where set, overrides the deck's key.
Switch with_override(Switch deck, const char* env, const char* key, bool root, std::ostream& log) {
  const char* v = std::getenv(env);
  if (!v) return deck;
  const std::string s = v;
  KQLORA_INPUT_CHECK(s == "0" || s == "1", env << ": expected 0 or 1, got '" << s << "'");
  const Switch o = s == "1" ? Switch::on : Switch::off;
  if (root)
    log << env << "=" << s << " overrides " << key << " = " << switch_name(deck) << " (now "
        << switch_name(o) << ")\n";
  return o;
}
}  // namespace

template <class ExecSpace>
std::unique_ptr<DataParallel<ExecSpace>> make_data_parallel(const ExecSpace& exec,
                                                            Communicator& comm,
                                                            Model<ExecSpace>& model,
                                                            DataParallelConfig cfg,
                                                            std::ostream& log) {
  using Mem = typename ExecSpace::memory_space;
  constexpr bool device_memory = !std::is_same<Mem, Kokkos::HostSpace>::value;
  const bool root = comm.rank() == 0;
  // FSDP: base weights and parameter chunks sharded (at any world size, 1 included).
  if (cfg.parallel == "fsdp") return std::make_unique<Fsdp<ExecSpace>>(exec, comm, model);
  if (comm.size() == 1 && cfg.single_process)
    return std::make_unique<SingleProcess<ExecSpace>>(model);
  // (single_process = off at one rank: the buckets, whose collectives are the point; node
  // shared memory only where asked for by name)
  if (comm.size() == 1 && cfg.shared_memory == Switch::automatic) cfg.shared_memory = Switch::off;
  cfg.shared_memory =
      with_override(cfg.shared_memory, "KQLORA_DDP_SHARED_MEMORY", "ddp_shared_memory", root, log);
  cfg.overlap = with_override(cfg.overlap, "KQLORA_DDP_OVERLAP", "ddp_overlap", root, log);
  // DDP: rank 0's weights on every rank (a restart reads the same files on every rank: the
  // state is rank 0's already).
  if (cfg.fresh) broadcast_model(comm, model);
  if (cfg.shared_memory != Switch::off) {
    auto shared = DdpSharedMemory<ExecSpace>::create(comm, model, cfg.optimizer, cfg.fresh);
    if (shared) return shared;
    KQLORA_INPUT_CHECK(cfg.shared_memory != Switch::on,
                       "ddp_shared_memory = on: the ranks cannot share memory (they are not all "
                       "on one node, or the model is in device memory)");
  }
  // auto: non-blocking reductions driven between panels for device memory (the work
  // leaves the compute stream), blocking at once for host memory (measured faster: the
  // reduction's arithmetic runs on the cores that compute anyway).
  const bool overlap = cfg.overlap == Switch::automatic ? device_memory : cfg.overlap == Switch::on;
  return std::make_unique<DdpBuckets<ExecSpace>>(comm, model, cfg.bucket_mb, overlap);
}

template std::unique_ptr<DataParallel<Kokkos::DefaultExecutionSpace>> make_data_parallel(
    const Kokkos::DefaultExecutionSpace&, Communicator&, Model<Kokkos::DefaultExecutionSpace>&,
    DataParallelConfig, std::ostream&);

}  // namespace kqlora
