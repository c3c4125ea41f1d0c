#!/usr/bin/env bash
# From a fresh clone on Debian 12: install the dependencies, build, run every test.
#   tools/run_tests.sh            (extra CMake arguments in KQLORA_CMAKE_ARGS)
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/build.sh
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
# The tests side by side, one per core (the Python reference checks alone take 6 minutes
# on 2 cores when torch and transformers are installed), one BLAS thread each.
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"
cd build
# Every test but the rebuild without MPI and HDF5 (a second build of the library, 4 - 5
# minutes of both cores on an AMD EPYC Zen 1), which .ci/run runs after this one:
#   (cd build && ctest -R build_without_mpi_hdf5)
ctest --output-on-failure -j"$(nproc)" -E "^build_without_mpi_hdf5$"
