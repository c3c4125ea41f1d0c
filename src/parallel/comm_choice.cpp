#include "kqlora/parallel/comm_choice.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "kqlora/core/error.hpp"

namespace kqlora {

namespace {

/// "ranks 0, 2 and 3"
std::string rank_list(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i)
    s += (i == 0 ? "" : i + 1 == ranks.size() ? " and " : ", ") + std::to_string(ranks[i]);
  return s;
}

}  // namespace

CommChoice choose_comm(const std::string& requested, bool device_memory, bool have_nccl,
                       const std::vector<DevicePlace>& places) {
  KQLORA_CHECK(requested == "auto" || requested == "mpi" || requested == "nccl",
               "choose_comm: comm = " << requested);
  if (requested == "mpi") return {false, ""};
  KQLORA_INPUT_CHECK(have_nccl || requested != "nccl",
                     "comm = nccl: this kqlora was built without NCCL on a CUDA Kokkos");
  if (!have_nccl) return {false, "comm = auto: MPI (this kqlora has no NCCL)"};
  if (requested == "auto" && !device_memory)
    return {false, "comm = auto: MPI (the model lives in host memory)"};
  // Ranks by (host, GPU): a group of more than one cannot each own an NCCL rank.
  std::map<std::pair<std::string, std::string>, std::vector<int>> groups;
  for (size_t r = 0; r < places.size(); ++r)
    groups[{places[r].host, places[r].device}].push_back(static_cast<int>(r));
  for (const auto& [place, ranks] : groups) {
    if (ranks.size() < 2) continue;
    const std::string what = rank_list(ranks) + " share GPU " + place.second + " on " +
                             place.first + "; NCCL needs a GPU of its own for every rank";
    KQLORA_INPUT_CHECK(requested != "nccl",
                       "comm = nccl: " << what
                                       << " (give each rank its own GPU, e.g. "
                                          "cluster_scripts/gpu_bind.sh with as many ranks as "
                                          "GPUs, or set comm = mpi)");
    return {false, "comm = auto: " + what + ": using MPI"};
  }
  return {true, "comm = " + requested + ": NCCL (one GPU per rank over " +
                    std::to_string(places.size()) + " rank(s))"};
}

std::vector<DevicePlace> gather_device_places(Communicator& comm, const DevicePlace& mine) {
  constexpr int64_t kHost = 64, kDevice = 48, kRecord = kHost + kDevice;
  char record[kRecord] = {};
  std::memcpy(record, mine.host.data(), std::min<size_t>(mine.host.size(), kHost - 1));
  std::memcpy(record + kHost, mine.device.data(),
              std::min<size_t>(mine.device.size(), kDevice - 1));
  std::vector<char> all(static_cast<size_t>(kRecord * comm.size()));
  comm.wait(comm.allgather(record, all.data(), kRecord));
  std::vector<DevicePlace> places(static_cast<size_t>(comm.size()));
  for (int r = 0; r < comm.size(); ++r) {
    const char* at = all.data() + r * kRecord;
    places[r].host.assign(at, strnlen(at, kHost));
    places[r].device.assign(at + kHost, strnlen(at + kHost, kDevice));
  }
  return places;
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "unknown-host";
  return name;
}

}  // namespace kqlora
