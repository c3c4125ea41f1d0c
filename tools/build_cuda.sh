#!/usr/bin/env bash
# The CUDA configuration of kqlora (docs/GPU.md): Kokkos 4.x with CUDA, Kokkos Kernels with
# cuBLAS, NCCL, every app and test, from Kokkos and Kokkos Kernels source trees you name.
#
#   bash tools/build_cuda.sh KOKKOS_SRC KOKKOS_KERNELS_SRC [--arch HOPPER90] [--out DIR]
#        [--jobs N] [--targets "kqlora-train test_llama ..."] [--no-host-blas]
#        [--deps-only | --kqlora-only] [--kqlora-cmake "-DKQLORA_ENABLE_MPI=OFF ..."]
#        [-- KQLORA_CMAKE_ARG ...]
#   bash tools/build_cuda.sh --patch-only KOKKOS_SRC     (patches that tree in place)
#
# KOKKOS_SRC / KOKKOS_KERNELS_SRC: checkouts of github.com/kokkos/kokkos and
# kokkos-kernels (checked: tags 4.6.01 and 4.6.02, and the 4.6.99 / 4.7.99 development
# trees of 2026-12). They are copied into DIR/src and the
# copies patched for CUDA 13 where needed (your trees are left as they are):
#   - Kokkos_Cuda_Instance.hpp: cudaGraphAddDependencies takes edge data, and
#     cudaMemAdvise / cudaMemPrefetchAsync a cudaMemLocation, in CUDA 13;
#   - nvcc_wrapper's default architecture sm_70 (dropped by CUDA 13) raised to sm_90.
# Then Kokkos (CUDA + Serial, --arch: Kokkos_ARCH_<arch>, default HOPPER90 = H100/H200;
# AMPERE80 for A100)
# and Kokkos Kernels (BLAS component, cuBLAS) are installed under DIR/install, and kqlora is
# configured with their nvcc_wrapper in DIR/kqlora and built (all targets, or --targets),
# ninja when there is one. DIR defaults to build-cuda (git-ignored). The CUDA toolkit comes
# from CUDA_HOME or /usr/local/cuda; NCCL from NCCL_ROOT or the toolkit. Needs no GPU: it
# compiles and links; docs/GPU.md says how to run the result. Warnings are listed at the
# end (the build is expected warning-free) and written to DIR/warnings.txt.
# --no-host-blas: Kokkos Kernels without a host BLAS (its own host kernels; where no BLAS
# library is installed, e.g. a GPU image); --deps-only / --kqlora-only: the Kokkos half or
# the kqlora half (DIR/install already there); --kqlora-cmake (split at spaces) and the
# arguments after -- (each kept whole): more arguments for kqlora's
# configuration (tools/gpu_prep.sh passes MPI, HDF5 and static runtimes there). Kokkos and
# Kokkos Kernels are static libraries, compiled position-independent.
set -euo pipefail
cd "$(dirname "$0")/.."
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
[ "${1:-}" = -h ] || [ "${1:-}" = --help ] && { usage; exit 0; }
patch_kokkos() {  # the CUDA 13 adaptations, in place (a second run changes nothing)
  python3 - "$1" <<'PY'
import re, sys
root = sys.argv[1]
inst = root + "/core/src/Cuda/Kokkos_Cuda_Instance.hpp"
s = open(inst).read()
edits = [
    ("return cudaGraphAddDependencies(graph, from, to, numDependencies);",
     "#if CUDART_VERSION >= 13000\n    return cudaGraphAddDependencies(graph, from, to, nullptr, numDependencies);\n"
     "#else\n    return cudaGraphAddDependencies(graph, from, to, numDependencies);\n#endif"),
    ("return cudaMemAdvise(devPtr, count, advice, device);",
     "#if CUDART_VERSION >= 13000\n    cudaMemLocation loc{device == cudaCpuDeviceId ? cudaMemLocationTypeHost\n"
     "                                                  : cudaMemLocationTypeDevice, device};\n"
     "    return cudaMemAdvise(devPtr, count, advice, loc);\n"
     "#else\n    return cudaMemAdvise(devPtr, count, advice, device);\n#endif"),
]
for old, new in edits:
    if old in s:
        s = s.replace(old, new)
        print("patched:", old.split("(")[0].replace("return ", ""))
# (the stream argument: get_input_stream(stream) in 4.6, m_stream in later trees)
pat = re.compile(r"return cudaMemPrefetchAsync\(devPtr, count, dstDevice,\s*([^;]*?)\);")
if pat.search(s):
    s = pat.sub(lambda m: "#if CUDART_VERSION >= 13000\n    cudaMemLocation loc{dstDevice == cudaCpuDeviceId ? cudaMemLocationTypeHost\n"
                "                                                     : cudaMemLocationTypeDevice, dstDevice};\n"
                "    return cudaMemPrefetchAsync(devPtr, count, loc, 0, %s);\n"
                "#else\n    return cudaMemPrefetchAsync(devPtr, count, dstDevice, %s);\n#endif"
                % (m.group(1), m.group(1)), s)
    print("patched: cudaMemPrefetchAsync")
open(inst, "w").write(s)
w = root + "/bin/nvcc_wrapper"
t = open(w).read()
if 'default_arch="sm_70"' in t:
    open(w, "w").write(t.replace('default_arch="sm_70"', 'default_arch="sm_90"'))
    print("patched: nvcc_wrapper default_arch sm_90")
PY
}
if [ "${1:-}" = --patch-only ]; then
  [ -d "${2:-}/core/src/Cuda" ] || { echo "build_cuda.sh: --patch-only needs a Kokkos source tree" >&2; exit 2; }
  patch_kokkos "$2"
  exit 0
fi
[ $# -ge 2 ] || { usage >&2; exit 2; }
kokkos_src=$(realpath "$1") kk_src=$(realpath "$2")
shift 2
arch=HOPPER90 out=build-cuda jobs=$(nproc) targets="" host_blas=ON part=all kqlora_cmake=""
kqlora_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --arch) arch=${2:?--arch needs a value}; shift 2 ;;
    --out) out=${2:?--out needs a value}; shift 2 ;;
    --jobs) jobs=${2:?--jobs needs a value}; shift 2 ;;
    --targets) targets=${2:?--targets needs a value}; shift 2 ;;
    --no-host-blas) host_blas=OFF; shift ;;
    --deps-only) part=deps; shift ;;
    --kqlora-only) part=kqlora; shift ;;
    --kqlora-cmake) kqlora_cmake=${2?--kqlora-cmake needs a value}; shift 2 ;;
    --) shift; kqlora_args=("$@"); break ;;
    *) echo "build_cuda.sh: unknown option '$1' (--help)" >&2; exit 2 ;;
  esac
done
for d in "$kokkos_src/core/src/Cuda" "$kk_src/blas"; do
  [ -d "$d" ] || { echo "build_cuda.sh: $d not found (a Kokkos / Kokkos Kernels source tree?)" >&2; exit 2; }
done
# The toolkit: CUDA_HOME, else /usr/local/cuda, else the one whose nvcc is on PATH (exported:
# Kokkos' nvcc_wrapper and CMake's FindCUDAToolkit read it).
cuda=${CUDA_HOME:-/usr/local/cuda}
if [ ! -x "$cuda/bin/nvcc" ] && [ -z "${CUDA_HOME:-}" ] && command -v nvcc >/dev/null; then
  cuda=$(dirname "$(dirname "$(realpath "$(command -v nvcc)")")")
fi
[ -x "$cuda/bin/nvcc" ] || { echo "build_cuda.sh: no nvcc under $cuda (set CUDA_HOME)" >&2; exit 2; }
export CUDA_HOME=$cuda PATH=$cuda/bin:$PATH
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
mkdir -p "$out"
out=$(realpath "$out")
log=$out/build-deps.log  # Kokkos and Kokkos Kernels; kqlora's own: $out/build.log
: >"$log"
stamp() { echo "== [$(date +%T)] $*"; }
trap 'echo "build_cuda.sh: failed; the end of $log:" >&2; tail -25 "$log" >&2' ERR

prefix=$out/install
if [ $part != kqlora ]; then
stamp "copying the sources into $out/src and patching them for CUDA $("$cuda/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
rm -rf "$out/src"
mkdir -p "$out/src"
cp -r "$kokkos_src" "$out/src/kokkos"
cp -r "$kk_src" "$out/src/kokkos-kernels"
patch_kokkos "$out/src/kokkos"

rm -f "$out"/{kokkos,kokkos-kernels}/CMakeCache.txt  # (a rerun configures afresh)
stamp "Kokkos (CUDA + Serial, $arch) -> $prefix"
cmake -S "$out/src/kokkos" -B "$out/kokkos" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_INSTALL_PREFIX="$prefix" -DCMAKE_CXX_STANDARD=17 -DKokkos_ENABLE_CUDA=ON \
  -DKokkos_ENABLE_SERIAL=ON -DKokkos_ARCH_"${arch^^}"=ON -DCMAKE_POSITION_INDEPENDENT_CODE=ON \
  -DCMAKE_CXX_COMPILER="$out/src/kokkos/bin/nvcc_wrapper" -DCUDAToolkit_ROOT="$cuda" >>"$log" 2>&1
cmake --build "$out/kokkos" -j"$jobs" >>"$log" 2>&1
cmake --install "$out/kokkos" >>"$log" 2>&1
stamp "Kokkos Kernels (BLAS, cuBLAS) -> $prefix"
cmake -S "$out/src/kokkos-kernels" -B "$out/kokkos-kernels" "${gen[@]}" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$prefix" -DKokkos_ROOT="$prefix" \
  -DCMAKE_CXX_COMPILER="$prefix/bin/nvcc_wrapper" -DKokkosKernels_ENABLE_ALL_COMPONENTS=OFF \
  -DKokkosKernels_ENABLE_COMPONENT_BLAS=ON -DKokkosKernels_ENABLE_TPL_CUBLAS=ON \
  -DKokkosKernels_ENABLE_TPL_BLAS=$host_blas -DKokkosKernels_INST_DOUBLE=OFF \
  -DCMAKE_POSITION_INDEPENDENT_CODE=ON >>"$log" 2>&1
cmake --build "$out/kokkos-kernels" -j"$jobs" >>"$log" 2>&1
cmake --install "$out/kokkos-kernels" >>"$log" 2>&1
fi
[ $part != deps ] || { stamp "Kokkos and Kokkos Kernels installed under $prefix"; exit 0; }
rm -f "$out/kqlora/CMakeCache.txt"
stamp "kqlora with $prefix/bin/nvcc_wrapper -> $out/kqlora"
log=$out/build.log
: >"$log"
nccl=()
[ -n "${NCCL_ROOT:-}" ] && nccl=(-DNCCL_ROOT="$NCCL_ROOT")
cmake -S . -B "$out/kqlora" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DKokkos_ROOT="$prefix" \
  -DKokkosKernels_ROOT="$prefix" -DCMAKE_CXX_COMPILER="$prefix/bin/nvcc_wrapper" \
  -DCUDAToolkit_ROOT="$cuda" "${nccl[@]}" $kqlora_cmake "${kqlora_args[@]}" >>"$log" 2>&1 || {
  tail -30 "$log" >&2
  echo "build_cuda.sh: configuring kqlora failed (whole log: $log)" >&2
  exit 1
}
# shellcheck disable=SC2086
cmake --build "$out/kqlora" -j"$jobs" ${targets:+--target $targets} >>"$log" 2>&1 || {
  grep -E "error" "$log" | head -20
  echo "build_cuda.sh: the kqlora build failed (whole log: $log)" >&2
  exit 1
}
grep -E "warning" "$log" | sort -u >"$out/warnings.txt" || true
n=$(wc -l <"$out/warnings.txt")
stamp "built: $out/kqlora ($n warning line(s)$([ "$n" -gt 0 ] && echo ": $out/warnings.txt"))"
[ "$n" -eq 0 ] || head -20 "$out/warnings.txt"
