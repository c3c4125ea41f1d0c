# No global fence in the library or the apps: on CUDA Kokkos::fence() is
# cudaDeviceSynchronize, which waits for every stream, the NCCL communication stream too,
# so a dead or stopped peer would hang the job instead of reaching comm_timeout_s. Fence
# the instance the work ran on (kqlora::fence(exec, label), core/kokkos_compat.hpp).
# Fails naming every file and line. Run by ctest as `no_global_fence`:
#   cmake -DROOT=<source dir> -P tests/check_no_global_fence.cmake
cmake_minimum_required(VERSION 3.18)
file(GLOB_RECURSE files "${ROOT}/src/*.cpp" "${ROOT}/src/*.hpp" "${ROOT}/include/*.hpp"
     "${ROOT}/apps/*.cpp" "${ROOT}/apps/*.hpp")
set(bad "")
foreach(f IN LISTS files)
  file(STRINGS "${f}" lines REGEX "Kokkos::fence[ ]*\\(|fence_all[ ]*\\(")
  foreach(line IN LISTS lines)
    file(RELATIVE_PATH rel "${ROOT}" "${f}")
    string(STRIP "${line}" line)
    string(APPEND bad "\n  ${rel}: ${line}")
  endforeach()
endforeach()
list(LENGTH files n)
if(n LESS 50)
  message(FATAL_ERROR "no_global_fence: only ${n} source files found under ${ROOT}")
endif()
if(bad)
  message(FATAL_ERROR "global fences (fence the execution-space instance instead):${bad}")
endif()
message(STATUS "no_global_fence: ${n} files, no Kokkos::fence() or fence_all()")
