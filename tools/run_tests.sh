#!/usr/bin/env bash
# From a fresh clone on Debian 12: install the dependencies, build, run every test.
#   tools/run_tests.sh            (extra CMake arguments in KQLORA_CMAKE_ARGS)
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps_debian.sh
# Root may run mpiexec (containers, CI); Open MPI refuses it otherwise.
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" OPENBLAS_NUM_THREADS=1
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release ${KQLORA_CMAKE_ARGS:-}
cmake --build build -j"$(nproc)"
cd build
ctest --output-on-failure
