// The NCCL backend of dist::Communicator (built with KQLORA_ENABLE_NCCL): collectives on
// device memory, on a communication stream that waits for the compute stream Kokkos uses
// (an event recorded there), so they overlap the compute that follows. Bootstrapped from
// MPI the nccl-tests way: rank 0 calls ncclGetUniqueId, MPI_Bcast of the id,
// ncclCommInitRank on the GPU Kokkos selected. NCCL counts are elements. Every CUDA and
// NCCL call is checked; a wait past the deadline aborts the communicator (ncclCommAbort)
// and throws.
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <string>

#include "kqlora/core/mpi_check.hpp"
#include "kqlora/dist/communicator.hpp"
#include "kqlora/dist/nccl_communicator.hpp"

#define KQLORA_CHECK_CUDA(call)                                                   \
  do {                                                                            \
    const cudaError_t kqlora_cuda_rc_ = (call);                                   \
    KQLORA_THROW_IF(kqlora_cuda_rc_ != cudaSuccess,                               \
                    #call << " failed: " << cudaGetErrorString(kqlora_cuda_rc_)); \
  } while (0)

#define KQLORA_CHECK_NCCL(call)                                                   \
  do {                                                                            \
    const ncclResult_t kqlora_nccl_rc_ = (call);                                  \
    KQLORA_THROW_IF(kqlora_nccl_rc_ != ncclSuccess,                               \
                    #call << " failed: " << ncclGetErrorString(kqlora_nccl_rc_)); \
  } while (0)

namespace kqlora::dist {

namespace {

class NcclRequest : public Request {
 public:
  cudaEvent_t done_event = nullptr;
  ~NcclRequest() override {
    if (done_event) cudaEventDestroy(done_event);  // no throw from a destructor
  }
};

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(int device, cudaStream_t compute) : device_(device), compute_(compute) {
    KQLORA_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
    KQLORA_CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &size_));
    ncclUniqueId id;
    if (rank_ == 0) KQLORA_CHECK_NCCL(ncclGetUniqueId(&id));
    KQLORA_CHECK_MPI(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD));
    KQLORA_CHECK_CUDA(cudaSetDevice(device_));
    KQLORA_CHECK_NCCL(ncclCommInitRank(&comm_, size_, id, rank_));
    KQLORA_CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    KQLORA_CHECK_CUDA(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
  }

  ~NcclCommunicator() override {
    if (comm_) ncclCommDestroy(comm_);
    if (ready_) cudaEventDestroy(ready_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  const char* backend() const override { return "NCCL"; }
  MPI_Comm mpi_comm() const override { return MPI_COMM_WORLD; }  // its bootstrap

  std::unique_ptr<Request> broadcast(void* data, int64_t bytes, int root) override {
    auto r = begin("broadcast");
    KQLORA_CHECK_NCCL(
        ncclBroadcast(data, data, static_cast<size_t>(bytes), ncclUint8, root, comm_, stream_));
    return end(std::move(r));
  }
  std::unique_ptr<Request> allreduce_sum(float* data, int64_t count) override {
    auto r = begin("allreduce");
    KQLORA_CHECK_NCCL(ncclAllReduce(data, data, static_cast<size_t>(count), ncclFloat32, ncclSum,
                                    comm_, stream_));
    return end(std::move(r));
  }
  std::unique_ptr<Request> allreduce_sum(double* data, int64_t count) override {
    auto r = begin("allreduce");
    KQLORA_CHECK_NCCL(ncclAllReduce(data, data, static_cast<size_t>(count), ncclFloat64, ncclSum,
                                    comm_, stream_));
    return end(std::move(r));
  }
  std::unique_ptr<Request> allgather(const void* send, void* recv, int64_t bytes) override {
    auto r = begin("allgather");
    KQLORA_CHECK_NCCL(
        ncclAllGather(send, recv, static_cast<size_t>(bytes), ncclUint8, comm_, stream_));
    return end(std::move(r));
  }
  std::unique_ptr<Request> reduce_scatter_sum(const float* send, float* recv,
                                              int64_t count) override {
    auto r = begin("reduce-scatter");
    KQLORA_CHECK_NCCL(ncclReduceScatter(send, recv, static_cast<size_t>(count), ncclFloat32,
                                        ncclSum, comm_, stream_));
    return end(std::move(r));
  }

  bool test(Request& base) override {
    auto& r = static_cast<NcclRequest&>(base);
    if (r.done) return true;
    ncclResult_t async = ncclSuccess;
    KQLORA_CHECK_NCCL(ncclCommGetAsyncError(comm_, &async));
    KQLORA_THROW_IF(
        async != ncclSuccess && async != ncclInProgress,
        "NCCL " << r.what << " failed on rank " << rank_ << ": " << ncclGetErrorString(async));
    const cudaError_t q = cudaEventQuery(r.done_event);
    if (q == cudaErrorNotReady) return false;
    KQLORA_CHECK_CUDA(q);
    r.done = true;
    return true;
  }

  /// After a timeout the communicator is unusable: abort it so no kernel stays stuck.
  void on_timeout() override {
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
  }

 private:
  int device_;
  cudaStream_t compute_, stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;
  ncclComm_t comm_ = nullptr;

  std::unique_ptr<NcclRequest> begin(const char* what) {
    auto r = std::make_unique<NcclRequest>();
    r->what = what;
    // The communication stream waits for what the compute stream has queued so far.
    KQLORA_CHECK_CUDA(cudaEventRecord(ready_, compute_));
    KQLORA_CHECK_CUDA(cudaStreamWaitEvent(stream_, ready_, 0));
    KQLORA_CHECK_CUDA(cudaEventCreateWithFlags(&r->done_event, cudaEventDisableTiming));
    return r;
  }
  std::unique_ptr<Request> end(std::unique_ptr<NcclRequest> r) {
    KQLORA_CHECK_CUDA(cudaEventRecord(r->done_event, stream_));
    return r;
  }
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(int device, void* compute_stream) {
  return std::make_unique<NcclCommunicator>(device, static_cast<cudaStream_t>(compute_stream));
}

}  // namespace kqlora::dist
