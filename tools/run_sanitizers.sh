#!/usr/bin/env bash
# The whole test suite under AddressSanitizer and UndefinedBehaviorSanitizer: builds
# build-sanitize/ with KQLORA_SANITIZE=address,undefined (GCC), then runs ctest there. Any
# finding fails its test (-fno-sanitize-recover). Leak detection is off: MPI and HDF5 keep
# allocations until exit by design. The two tests that rebuild kqlora in other
# configurations (build_without_mpi_hdf5, install_consumer) are left to the main suite, as
# is tokenize_sft (Python alone, no kqlora code). -O1 -g1: the optimisation ASan's authors
# advise, line tables for the reports' stacks; it halves the build against -O2 -g.
#   tools/run_sanitizers.sh      (docs/RELIABILITY.md gives its time)
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps_debian.sh
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
# verify_asan_link_order=0: the fault-injection test preloads its library before ASan's.
export ASAN_OPTIONS="detect_leaks=0:verify_asan_link_order=0:abort_on_error=1:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"
cmake -S . -B build-sanitize -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" \
  -DKQLORA_SANITIZE=address,undefined ${KQLORA_CMAKE_ARGS:-}
cmake --build build-sanitize -j"$(nproc)"
cd build-sanitize
ctest --output-on-failure -j"$(nproc)" -E "^(build_without_mpi_hdf5|install_tree|install_consumer|tokenize_sft)$"
