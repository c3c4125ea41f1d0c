#pragma once
// Checked CUDA runtime calls: KQLORA_CHECK_CUDA(cudaMalloc(...)) throws kqlora::Error naming
// the call and the CUDA error string. For code compiled against the CUDA runtime only (the
// NCCL backend, core/gpu_device.cpp in a CUDA build).

#include <cuda_runtime.h>

#include "kqlora/core/error.hpp"

#define KQLORA_CHECK_CUDA(call)                                                \
  do {                                                                         \
    const cudaError_t kqlora_cuda_rc_ = (call);                                \
    KQLORA_CHECK(kqlora_cuda_rc_ == cudaSuccess,                               \
                 #call << " failed: " << cudaGetErrorString(kqlora_cuda_rc_)); \
  } while (0)
