#!/usr/bin/env bash
# Installs the Debian dependencies and builds kqlora into build/ (Release). Sourced by the
# run scripts; extra CMake arguments in KQLORA_CMAKE_ARGS.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash tools/install_deps_debian.sh
# Root may run mpiexec (containers, CI); Open MPI refuses it otherwise.
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export OPENBLAS_NUM_THREADS=1
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release ${KQLORA_CMAKE_ARGS:-}
cmake --build build -j"$(nproc)"
