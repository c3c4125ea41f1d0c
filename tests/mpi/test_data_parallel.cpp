// Data parallelism under mpiexec (np 1..4): every rank runs the one-process reference over
// MPI_COMM_SELF, then the real run over all ranks, and compares: NF4 bytes equal, LoRA
// parameters within rtol 1e-5 / atol 1e-6, for DDP with sgd and adam, even and uneven
// slices, micro-batches; DDP both through node shared memory (the default on one node) and
// through bucket reductions (ddp_shared_memory = off, as across nodes); and the DDP
// broadcast gives every rank rank 0's exact bytes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "kqlora/io/checkpoint.hpp"
#include "kqlora/io/checkpoint_diff.hpp"
#include "kqlora/nn/lora_stack.hpp"
#include "kqlora/parallel/broadcast_model.hpp"
#include "kqlora/parallel/comm_choice.hpp"
#include "kqlora/parallel/world.hpp"
#include "kqlora/train/component_configs.hpp"
#include "kqlora/train/config.hpp"
#include "kqlora/train/init.hpp"
#include "kqlora/train/trainer.hpp"
#include "token_mlp_model.hpp"

namespace {

using Exec = Kokkos::DefaultExecutionSpace;

std::string base_dir() {
  return std::string(KQLORA_TEST_BIN_DIR) + "/../tests/tmp_mpi";
}

void run_and_compare(const std::string& name, const std::string& keys) {
  auto world = kqlora::make_mpi_communicator(true);
  auto self = kqlora::make_mpi_communicator(false);
  const int r = world->rank(), n = world->size();
  const std::string dir = base_dir() + "/" + name + "_np" + std::to_string(n);
  std::vector<std::string> overrides;
  std::istringstream ss(keys);
  for (std::string k; ss >> k;) overrides.push_back(k);
  overrides.push_back("log_every=1000");
  auto ref_keys = overrides, run_keys = overrides;
  ref_keys.push_back("save_dir=" + dir + "/ref_rank" + std::to_string(r));
  ref_keys.push_back("parallel=ddp");  // the one-process reference
  run_keys.push_back("save_dir=" + dir + "/run");
  std::ostringstream log;
  const auto ref =
      kqlora::train(kqlora::parse_deck_text("", "test", ref_keys, 1), *self, log, true);
  const auto got =
      kqlora::train(kqlora::parse_deck_text("", "test", run_keys, n), *world, log, true);
  ASSERT_EQ(ref.final_base.size(), got.final_base.size());
  for (size_t l = 0; l < ref.final_base.size(); ++l) {
    const auto& a = ref.final_base[l].second;
    const auto& b = got.final_base[l].second;
    ASSERT_EQ(a.layout, b.layout);
    EXPECT_EQ(0,
              std::memcmp(a.quantized_data.data(), b.quantized_data.data(), a.layout.num_bytes()))
        << name << " np=" << n << " rank " << r << ": " << ref.final_base[l].first;
    EXPECT_EQ(0, std::memcmp(a.quantized_scalers.data(), b.quantized_scalers.data(),
                             a.layout.num_blocks()));
    EXPECT_EQ(0, std::memcmp(a.quantization_factor.data(), b.quantization_factor.data(),
                             4 * a.layout.num_scaler_blocks()));
    EXPECT_EQ(a.scaler_mean, b.scaler_mean);
  }
  ASSERT_EQ(ref.final_params.size(), got.final_params.size());
  for (size_t i = 0; i < ref.final_params.size(); ++i) {
    const auto& a = ref.final_params[i].second;
    const auto& b = got.final_params[i].second;
    ASSERT_EQ(a.size(), b.size());
    double worst = 0;
    for (size_t j = 0; j < a.size(); ++j)
      worst =
          std::max(worst, std::fabs(double(a[j]) - b[j]) - (1e-5 * std::fabs(double(a[j])) + 1e-6));
    EXPECT_LE(worst, 0.0) << name << " np=" << n << " rank " << r << ": "
                          << ref.final_params[i].first;
  }
  // A loss = sum step can cancel to near zero: its rounding scales with the terms summed,
  // of the size of the run's largest loss, not with the result.
  double scale = 0;
  for (double l : ref.losses) scale = std::max(scale, std::fabs(l));
  for (size_t s = 0; s < ref.losses.size(); ++s)
    EXPECT_NEAR(got.losses[s], ref.losses[s], 1e-5 * scale + 1e-6) << "step " << s + 1;
  // Every rank wrote its file.
  EXPECT_EQ(static_cast<int>(kqlora::checkpoint_files(dir + "/run").size()), n);
}

}  // namespace

// Every rank gathers the same places (here made up: GPUs by rank parity on one host), so
// every rank makes the same choice: NCCL while no two ranks share a GPU, else MPI.
TEST(DataParallel, RanksAgreeOnWhoSharesAGpu) {
  auto world = kqlora::make_mpi_communicator(true);
  const int r = world->rank(), n = world->size();
  const auto places =
      kqlora::gather_device_places(*world, {kqlora::host_name(), "GPU-" + std::to_string(r % 2)});
  ASSERT_EQ(static_cast<int>(places.size()), n);
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(places[i].host, kqlora::host_name());
    EXPECT_EQ(places[i].device, "GPU-" + std::to_string(i % 2));
  }
  const auto c = kqlora::choose_comm("auto", true, true, places);
  EXPECT_EQ(c.nccl, n <= 2) << c.note;
  if (n == 3) EXPECT_NE(c.note.find("ranks 0 and 2 share GPU GPU-0"), std::string::npos) << c.note;
}

// A GPU-aware MPI takes device pointers in blocking collectives only (Open MPI's CUDA
// support): DDP must not hand them to its non-blocking ones.
TEST(DataParallel, GpuAwareMpiTakesDevicePointersInBlockingCallsOnly) {
  setenv("KQLORA_GPU_AWARE_MPI", "1", 1);
  auto aware = kqlora::make_mpi_communicator(false);
  unsetenv("KQLORA_GPU_AWARE_MPI");
  EXPECT_TRUE(aware->device_buffers());
  EXPECT_FALSE(aware->nonblocking_device_buffers());
}

TEST(DataParallel, DdpAdamEvenSlices) {
  run_and_compare("ddp_adam_even",
                  "dim=64 num_linears=3 lora_rank=8 global_bs=12 num_steps=4 "
                  "loss=mse optimizer=adam lr=1e-2 activation=gelu bias=true");
}

/// DDP gradients summed by bucket reductions instead of through node shared memory.
const std::string kBuckets = " ddp_shared_memory=off";

TEST(DataParallel, DdpAdamBuckets) {
  run_and_compare("ddp_adam_buckets",
                  "dim=64 num_linears=3 lora_rank=8 global_bs=12 num_steps=4 "
                  "loss=mse optimizer=adamw weight_decay=0.1 lr=1e-2 activation=gelu" +
                      kBuckets);
}

TEST(DataParallel, DdpSharedMemoryUnevenChunks) {
  // 2 layers of rank 3 over dim 40 with biases: 560 parameters, chunks of whole cache
  // lines (np 3: 192 + 192 + 176; np 4: 144 x 3 + 128), AdamW with weight decay.
  run_and_compare("ddp_shm_chunks",
                  "dim=40 num_linears=2 lora_rank=3 bias=true global_bs=6 num_steps=5 "
                  "loss=mse optimizer=adamw weight_decay=0.1 lr=1e-2 activation=relu");
}

TEST(DataParallel, DdpSgdUnevenSlicesMicroBatches) {
  // 7 samples: np 2 -> 4+3, np 3 -> 3+2+2, np 4 -> 2+2+2+1; micro-batches of 2.
  run_and_compare("ddp_sgd_uneven",
                  "dim=64 num_linears=2 lora_rank=8 global_bs=7 micro_bs=2 "
                  "num_steps=4 loss=sum optimizer=sgd lr=1e-4 momentum=0.9");
}

TEST(DataParallel, DdpSmallBucketsAndClipping) {
  // SGD, no clipping: any missing or doubled bucket changes the update.
  run_and_compare("ddp_buckets",
                  "dim=64 num_linears=4 lora_rank=4 global_bs=9 num_steps=3 "
                  "loss=mse optimizer=sgd lr=1e-9 bucket_mb=0.001" +
                      kBuckets);
  // Clipping active: the global norm must be that of the summed gradient (node shared
  // memory: summed from every rank's chunk; buckets: of the whole summed vector).
  run_and_compare("ddp_clip",
                  "dim=64 num_linears=2 lora_rank=4 global_bs=5 num_steps=3 "
                  "loss=sum optimizer=sgd lr=1e-3 grad_clip=1");
  run_and_compare("ddp_clip_buckets",
                  "dim=64 num_linears=2 lora_rank=4 global_bs=5 num_steps=3 "
                  "loss=sum optimizer=sgd lr=1e-3 grad_clip=1" +
                      kBuckets);
}

TEST(DataParallel, DdpNonBlockingOverlap) {
  // The non-blocking bucket reductions (driven between panels, finished after the
  // backward; the default on GPUs) give the same results as the blocking ones.
  run_and_compare("ddp_overlap",
                  "dim=64 num_linears=4 lora_rank=4 global_bs=9 num_steps=3 "
                  "loss=mse optimizer=sgd lr=1e-9 bucket_mb=0.001 micro_bs=2 ddp_overlap=on" +
                      kBuckets);
}

TEST(DataParallel, FsdpAdamUnevenSlices) {
  // 5 scaler blocks per weight (64 x 80 with blocks 64 / 16 ... partial last) over N ranks.
  run_and_compare(
      "fsdp_adam",
      "parallel=fsdp checkpoint_layout=per_rank dim=80 num_linears=3 lora_rank=8 global_bs=7 "
      "num_steps=4 loss=mse optimizer=adam lr=1e-2 activation=silu "
      "bias=true block_size=64 scaler_block_size=16");
}

TEST(DataParallel, FsdpSgdMicroBatches) {
  // SGD without clipping: any error in the gradient sums shows (Adam would hide a scale).
  run_and_compare("fsdp_sgd",
                  "parallel=fsdp checkpoint_layout=per_rank dim=64 num_linears=2 "
                  "lora_rank=4 global_bs=8 micro_bs=3 num_steps=3 loss=sum "
                  "optimizer=sgd lr=1e-4 momentum=0.9");
}

TEST(DataParallel, FsdpClippingUsesTheGlobalNorm) {
  run_and_compare("fsdp_clip",
                  "parallel=fsdp checkpoint_layout=per_rank dim=64 num_linears=2 "
                  "lora_rank=4 global_bs=5 num_steps=3 loss=sum optimizer=sgd "
                  "lr=1e-3 grad_clip=1");
}

TEST(DataParallel, FsdpUnevenSlicesMicroBatches) {
  // 7 samples in micro-batches of 2: np 3 -> 3+2+2, rank 0 runs 2 micro-batches and the
  // others 1 + an empty one, so that every rank joins each gather of the NF4 weights.
  run_and_compare("fsdp_uneven_micro",
                  "parallel=fsdp checkpoint_layout=per_rank dim=64 num_linears=2 lora_rank=8 "
                  "global_bs=7 micro_bs=2 num_steps=3 loss=mse optimizer=adam lr=1e-2");
}

TEST(DataParallel, ReduceScatterSumsEveryBlockAcrossPieces) {
  // More floats a rank than one piece of the communicator's reduction (and a count that
  // is not a multiple of it): every rank receives its block summed over the ranks. The
  // values are small integers, so the sum is exact in any order and equals the float64
  // one.
  auto world = kqlora::make_mpi_communicator(true);
  const int r = world->rank(), n = world->size();
  const int64_t count = (int64_t(1) << 20) + 4099;
  std::vector<float> send(count * n), recv(count, -1.0f);
  auto value = [](int rank, int64_t i) { return static_cast<float>((i * 7 + rank * 13) % 1001); };
  for (int64_t i = 0; i < count * n; ++i) send[i] = value(r, i);
  world->wait(world->reduce_scatter_sum(send.data(), recv.data(), count));
  int64_t wrong = 0;
  for (int64_t i = 0; i < count; ++i) {
    double sum = 0;
    for (int q = 0; q < n; ++q) sum += value(q, r * count + i);
    wrong += recv[i] != sum;
  }
  EXPECT_EQ(wrong, 0) << "rank " << r << " of " << n;
  // Nothing to reduce: every rank still joins, and nothing is written.
  const std::vector<float> before = recv;
  world->wait(world->reduce_scatter_sum(send.data(), recv.data(), 0));
  EXPECT_EQ(recv, before);
}

TEST(DataParallel, BroadcastGivesEveryRankRank0sBytes) {
  auto world = kqlora::make_mpi_communicator(true);
  kqlora::Config cfg = kqlora::parse_deck_text("", "t", {"dim=64", "num_linears=2", "lora_rank=8"});
  kqlora::ModelConfig m = kqlora::model_config(cfg);
  m.seed = 100 + world->rank();  // every rank starts from different values
  kqlora::LoraStack<Exec> model(Exec(), m);
  std::ostringstream log;
  kqlora::initialize_model(Exec(), model, "", log);
  // Rank 0's own bytes, for the comparison after the broadcast.
  m.seed = 100;
  kqlora::LoraStack<Exec> rank0(Exec(), m);
  kqlora::initialize_model(Exec(), rank0, "", log);
  kqlora::broadcast_model(*world, model);
  for (int l = 0; l < 2; ++l) {
    auto a = kqlora::nf4_host(model.nf4[l]);
    auto b = kqlora::nf4_host(rank0.nf4[l]);
    EXPECT_EQ(0, std::memcmp(a.quantized_data.data(), b.quantized_data.data(),
                             a.quantized_data.extent(0)));
    EXPECT_EQ(0, std::memcmp(a.quantized_scalers.data(), b.quantized_scalers.data(),
                             a.quantized_scalers.extent(0)));
    EXPECT_EQ(0, std::memcmp(a.quantization_factor.data(), b.quantization_factor.data(),
                             4 * a.quantization_factor.extent(0)));
    EXPECT_EQ(a.scaler_mean, b.scaler_mean);
  }
  auto p = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), model.params);
  auto q = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), rank0.params);
  EXPECT_EQ(0, std::memcmp(p.data(), q.data(), 4 * p.extent(0)));
}

namespace {

kqlora::CheckpointContents load_state(const std::string& path) {
  std::vector<kqlora::CheckpointContents> parts;
  for (const auto& f : kqlora::checkpoint_files(path))
    parts.push_back(kqlora::read_checkpoint_file(f, true));
  return kqlora::assemble_checkpoint(parts, path);
}

kqlora::Config deck(const std::string& extra, int n) {
  std::vector<std::string> keys;
  // (the stack's own keys only for the stack: other models refuse keys they do not read)
  const bool stack = extra.find("model=") == std::string::npos;
  std::istringstream ss(
      std::string(stack ? "dim=64 num_linears=3 loss=mse activation=gelu lora_rank=8 " : "") +
      "global_bs=7 optimizer=adam lr=1e-2 log_every=1000 checkpoint_layout=per_rank " + extra);
  for (std::string k; ss >> k;) keys.push_back(k);
  return kqlora::parse_deck_text("", "test", keys, n);
}

void expect_same_state(const std::string& a, const std::string& b, double rtol, double atol) {
  kqlora::DiffOptions o;
  o.rtol = rtol;
  o.atol = atol;
  // Exact comparisons cover the optimizer state too; across world sizes the gradients are
  // summed in another order, so only the parameters are compared (allclose).
  o.optimizer = rtol == 0 && atol == 0;
  const auto x = load_state(a), y = load_state(b);
  EXPECT_EQ(x.step, y.step);
  for (const auto& line : kqlora::diff_checkpoints(x, y, o))
    EXPECT_TRUE(line.equal) << a << " vs " << b << ": " << line.name << " " << line.detail
                            << " max|diff| " << line.max_abs;
}

/// For DDP and FSDP, per_rank and shared layouts: 2 * half steps straight, and half +
/// restart + half, bit-identical parameters and optimizer state; `check(dir)` looks at the
/// split run's save_dir too.
template <class F>
void expect_exact_restarts(const std::string& name, const std::string& model_keys, int half,
                           F&& check) {
  auto world = kqlora::make_mpi_communicator(true);
  const int n = world->size();
  std::ostringstream log;
  const std::string all = " num_steps=" + std::to_string(2 * half);
  for (const std::string layout : {"per_rank", "shared"})
    for (const std::string mode : {"ddp", "fsdp"}) {
      const std::string dir =
          base_dir() + "/" + name + "_" + mode + "_" + layout + "_np" + std::to_string(n);
      const std::string keys = model_keys + " parallel=" + mode + " checkpoint_layout=" + layout;
      kqlora::train(deck(keys + all + " save_dir=" + dir + "/straight", n), *world, log);
      kqlora::train(
          deck(keys + " num_steps=" + std::to_string(half) + " save_dir=" + dir + "/split", n),
          *world, log);
      kqlora::train(deck(keys + all + " restart=latest save_dir=" + dir + "/split", n), *world,
                    log);
      expect_same_state(dir + "/straight", dir + "/split", 0, 0);
      check(dir + "/split");
    }
}

}  // namespace

// single_process = off: a world of one runs DDP's bucketed reductions through the
// communicator instead of the single-process strategy (on a one-GPU machine NCCL's
// collectives then really run). A sum over one rank changes nothing: the losses, the final
// parameters and the checkpoint (optimizer state included) are bit-identical to the
// single-process run's, and the run's report says the buckets ran. (Over MPI_COMM_SELF on
// every rank: a world of one at any np.)
TEST(DataParallel, SingleProcessOffRunsDdpBucketsAtOneRank) {
  auto self = kqlora::make_mpi_communicator(false);
  const int r = kqlora::world_rank();
  const std::string dir = base_dir() + "/single_process_off_rank" + std::to_string(r);
  const std::string keys =
      "comm=mpi micro_bs=3 global_bs=6 num_steps=4 checkpoint_every=2 bucket_mb=0.001 "
      "dim=64 num_linears=3 lora_rank=8 loss=mse optimizer=adam lr=1e-2 activation=gelu";
  std::ostringstream log_one, log_ddp;
  const auto one = kqlora::train(deck(keys + " save_dir=" + dir + "/one", 1), *self, log_one, true);
  const auto ddp = kqlora::train(deck(keys + " single_process=off save_dir=" + dir + "/ddp", 1),
                                 *self, log_ddp, true);
  ASSERT_EQ(one.losses.size(), 4u);
  ASSERT_EQ(ddp.losses.size(), one.losses.size());
  for (size_t s = 0; s < one.losses.size(); ++s)
    EXPECT_EQ(ddp.losses[s], one.losses[s]) << "step " << s + 1;  // bit for bit
  ASSERT_EQ(ddp.final_params.size(), one.final_params.size());
  for (size_t i = 0; i < one.final_params.size(); ++i)
    EXPECT_EQ(ddp.final_params[i].second, one.final_params[i].second) << one.final_params[i].first;
  expect_same_state(dir + "/one", dir + "/ddp", 0, 0);  // rtol = atol = 0: optimizer too
  // The report: buckets (several, 1 KiB each, over 3 layers of 2 x 64 x 8 floats), none
  // in the single-process run.
  const std::string text = log_ddp.str();
  const size_t at = text.find("DDP: ");
  ASSERT_NE(at, std::string::npos) << text;
  const int buckets = std::atoi(text.c_str() + at + 5);
  EXPECT_GE(buckets, 3) << text.substr(at, 120);
  EXPECT_NE(text.find("bucket(s) per step", at), std::string::npos) << text.substr(at, 120);
  EXPECT_EQ(log_one.str().find("DDP: "), std::string::npos) << log_one.str();
}

TEST(Restart, ExactAtTheSameWorldSizeDdpAndFsdp) {
  expect_exact_restarts("resume", "", 3, [](const std::string&) {});
}

TEST(Checkpoint, SharedFileEqualsPerRankFiles) {
  // The shared file (laid out by rank 0, chunks written by their ranks, partial chunks at
  // FSDP shard boundaries written collectively) holds exactly what the per-rank files hold:
  // a 2048 x 2048 weight has 2 chunks of NF4 data, cut by the FSDP shards at any N.
  auto world = kqlora::make_mpi_communicator(true);
  const int n = world->size();
  const std::string dir = base_dir() + "/shared_vs_per_rank_np" + std::to_string(n);
  std::ostringstream log;
  for (const std::string mode : {"ddp", "fsdp"}) {
    const std::string keys =
        "dim=2048 num_linears=2 lora_rank=4 global_bs=5 num_steps=2 "
        "parallel=" +
        mode + " save_dir=" + dir + "/" + mode;
    kqlora::train(deck(keys + "/per_rank", n), *world, log);
    kqlora::train(deck(keys + "/shared checkpoint_layout=shared", n), *world, log);
    ASSERT_EQ(kqlora::checkpoint_files(dir + "/" + mode + "/shared").size(), 1u);
    ASSERT_EQ(static_cast<int>(kqlora::checkpoint_files(dir + "/" + mode + "/per_rank").size()), n);
    expect_same_state(dir + "/" + mode + "/per_rank", dir + "/" + mode + "/shared", 0, 0);
  }
}

TEST(Restart, DdpSharedMemoryStateResumedWithBuckets) {
  // The optimizer state sharded over node shared memory is written whole: a run resumed
  // with bucket reductions (every rank holding all of it) continues as the straight run.
  auto world = kqlora::make_mpi_communicator(true);
  const int n = world->size();
  const std::string dir = base_dir() + "/shm_to_buckets_np" + std::to_string(n);
  std::ostringstream log;
  for (const std::string layout : {"per_rank", "shared"}) {
    const std::string d = dir + "/" + layout, l = " checkpoint_layout=" + layout;
    kqlora::train(deck("num_steps=6 save_dir=" + d + "/straight" + l, n), *world, log);
    kqlora::train(deck("num_steps=3 save_dir=" + d + "/split" + l, n), *world, log);
    kqlora::train(deck("num_steps=6 restart=latest save_dir=" + d + "/split" + l + kBuckets, n),
                  *world, log);
    expect_same_state(d + "/straight", d + "/split", 1e-5, 1e-6);
  }
}

TEST(Restart, AcrossWorldSizesAndParallelModes) {
  // Saved by one process with DDP, resumed by all ranks with FSDP (and the other way):
  // allclose to the straight run.
  auto world = kqlora::make_mpi_communicator(true);
  auto self = kqlora::make_mpi_communicator(false);
  const int n = world->size(), r = world->rank();
  const std::string dir = base_dir() + "/reshard_np" + std::to_string(n);
  const std::string mine = dir + "/rank" + std::to_string(r);
  std::ostringstream log;
  kqlora::train(deck("num_steps=6 save_dir=" + mine + "/straight", 1), *self, log);
  kqlora::train(deck("num_steps=3 save_dir=" + mine + "/half", 1), *self, log);
  kqlora::train(
      deck("parallel=fsdp num_steps=6 restart=" + mine + "/half save_dir=" + dir + "/fsdp", n),
      *world, log);
  expect_same_state(mine + "/straight", dir + "/fsdp", 1e-5, 1e-6);
  // And back: FSDP at 3 steps (this world) resumed by one process with DDP.
  kqlora::train(deck("parallel=fsdp num_steps=3 save_dir=" + dir + "/fsdp_half", n), *world, log);
  kqlora::train(deck("num_steps=6 restart=" + dir + "/fsdp_half save_dir=" + mine + "/back", 1),
                *self, log);
  expect_same_state(mine + "/straight", mine + "/back", 1e-5, 1e-6);
}

TEST(Restart, RefusesAnotherModel) {
  auto self = kqlora::make_mpi_communicator(false);
  const std::string dir = base_dir() + "/refuse_rank" + std::to_string(kqlora::world_rank());
  std::ostringstream log;
  kqlora::train(deck("num_steps=1 save_dir=" + dir, 1), *self, log);
  try {
    kqlora::train(
        deck(
            "num_steps=2 dim=32 lora_rank=4 dtype=bfloat16 block_size=32 restart=latest save_dir=" +
                dir,
            1),
        *self, log);
    ADD_FAILURE() << "a restart with another model was accepted";
  } catch (const kqlora::InputError& e) {
    const std::string m = e.what();
    for (const char* k : {"dim: checkpoint 64, deck 32", "lora_rank", "dtype", "block_size"})
      EXPECT_NE(m.find(k), std::string::npos) << m;
  }
  // Steps, schedule, logging and checkpointing may change.
  EXPECT_NO_THROW(
      kqlora::train(deck("num_steps=3 lr_schedule=cosine log_every=5 checkpoint_every=1 "
                         "restart=latest save_dir=" +
                             dir,
                         1),
                    *self, log));
}

// The model interface carries a second model (tests/mpi/token_mlp_model.cpp: token ids in,
// a frozen dense embedding, two rectangular NF4 weights in one group, a trainable head)
// that no library code knows: DDP (node shared memory and buckets) and FSDP at this world
// size give the one-process results, and a restart continues exactly.
namespace {
const std::string kTokenMlp =
    " model=test_token_mlp dim=16 lora_rank=4 lora_alpha=8 block_size=16 scaler_block_size=8 ";
}

TEST(SecondModel, DataParallelEqualsOneProcess) {
  tokenmlp::register_token_mlp();
  const std::string keys = kTokenMlp + "global_bs=7 micro_bs=2 num_steps=4 optimizer=adam lr=1e-2";
  run_and_compare("token_mlp_ddp", keys);
  run_and_compare("token_mlp_buckets", keys + " bucket_mb=0.0001" + kBuckets);
  run_and_compare("token_mlp_fsdp", keys + " parallel=fsdp checkpoint_layout=per_rank");
}

TEST(SecondModel, RestartIsExact) {
  tokenmlp::register_token_mlp();
  expect_exact_restarts("token_mlp_resume", kTokenMlp, 2, [](const std::string& dir) {
    // The checkpoint names its model: its table comes back from the file alone.
    const auto c = load_state(dir);
    EXPECT_EQ(c.table.model_kind, "test_token_mlp");
    EXPECT_EQ(c.table.count(kqlora::ParamKind::nf4), 2);
    ASSERT_NE(c.table.find("embed.weight"), nullptr);
    EXPECT_EQ(c.table.find("embed.weight")->kind, kqlora::ParamKind::dense);
  });
}
