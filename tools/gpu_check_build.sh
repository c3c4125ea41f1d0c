# Sourced by tools/gpu_check.sh --from-source (docs/GPU.md, "The GPU check"): the fallback
# when the stage's binaries cannot load on the GPU machine. build_from_source builds, on that
# machine, from the stage's sources/ (tools/gpu_prep.sh --with-sources), into $work: parallel
# HDF5 with the staged Open MPI wheel (beside Kokkos), Kokkos (CUDA + Serial, $arch) and
# Kokkos Kernels (cuBLAS, no host BLAS: the machine has none), GoogleTest, then kqlora's
# binaries ($gpu_targets) with the stage's configuration (tools/gpu_build_common.sh), and
# leaves them in $kq/bin with the wheel in $kq/mpi, as the prebuilt stage would. NCCL is the
# machine's nvidia-nccl wheel's (the one the runs load), else the toolkit's. Without a
# working MPI or HDF5 it builds without both, and without the targets that need HDF5. Reads
# $stage, $work, $kq, $jobs, $arch (set by gpu_check.sh).
source tools/gpu_build_common.sh

build_from_source() {
  local src=$work/src have_hdf5=0 targets hdf5_pid kq_args
  find_cuda_home || return 1
  echo "CUDA_HOME=$CUDA_HOME"
  rm -rf "$src"
  mkdir -p "$src"
  for f in kokkos googletest hdf5; do tar -C "$src" -xJf "$stage/sources/$f.tar.xz" || return 1; done
  unpack_mpi || return 1
  # (the wheel's compiler wrappers find their prefix through OPAL_PREFIX)
  if OPAL_PREFIX=$kq/mpi "$kq/mpi/bin/mpicc" --showme:version >/dev/null 2>&1; then
    echo "== HDF5 (in the background)"
    (OPAL_PREFIX=$kq/mpi build_hdf5 "$src/hdf5" "$work/hdf5" "$kq/mpi" "$jobs" >"$work/hdf5.log" 2>&1) &
    hdf5_pid=$!
  else
    echo "the staged Open MPI's mpicc does not run here: building without MPI and HDF5"
  fi
  echo "== GoogleTest"
  cmake -S "$src/googletest" -B "$work/gtest-build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_INSTALL_PREFIX="$work/gtest" -DBUILD_GMOCK=OFF >/dev/null &&
    cmake --build "$work/gtest-build" -j"$jobs" >/dev/null && cmake --install "$work/gtest-build" >/dev/null || {
    [ -z "${hdf5_pid:-}" ] || kill "$hdf5_pid" 2>/dev/null
    return 1
  }
  echo "== Kokkos and Kokkos Kernels"
  bash tools/build_cuda.sh "$src/kokkos" "$src/kokkos-kernels" --deps-only --no-host-blas \
    --arch "$arch" --out "$work/deps" --jobs "$jobs" || {
    [ -z "${hdf5_pid:-}" ] || kill "$hdf5_pid" 2>/dev/null
    return 1
  }
  if [ -n "${hdf5_pid:-}" ]; then
    wait "$hdf5_pid" && [ -f "$work/hdf5/lib/libhdf5.a" ] && have_hdf5=1
    [ $have_hdf5 = 1 ] || { echo "HDF5 failed (the end of $work/hdf5.log below): without MPI and HDF5"; tail -15 "$work/hdf5.log"; }
  fi
  if [ $have_hdf5 = 1 ]; then
    targets=$gpu_targets
    mapfile -t kq_args < <(kqlora_gpu_args "$kq/mpi" "$work/hdf5")
  else
    targets=$gpu_targets_without_hdf5
    mapfile -t kq_args < <(kqlora_gpu_args "" "")
  fi
  mapfile -t -O "${#kq_args[@]}" kq_args < <(wheel_nccl_args)
  echo "== kqlora: $targets (${kq_args[*]: -2})"
  OPAL_PREFIX=$kq/mpi PATH=$kq/mpi/bin:$PATH bash tools/build_cuda.sh "$src/kokkos" "$src/kokkos-kernels" --kqlora-only \
    --out "$work/deps" --jobs "$jobs" --targets "$targets" -- "${kq_args[@]}" -DGTEST_ROOT="$work/gtest" ||
    return 1
  rm -rf "$kq/bin"
  mkdir -p "$kq/bin"
  local t f
  for t in $targets; do
    f=$work/deps/kqlora/bin/$t
    [ -x "$f" ] || f=$work/deps/kqlora/tests/$t
    cp "$f" "$kq/bin/" || return 1
  done
}
