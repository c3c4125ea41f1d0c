#!/usr/bin/env bash
# Shared-file checkpoint write (2 ranks, fsync included) against `dd conv=fdatasync` on the
# same disk, in the same run; then the restart of that state with the file in the page
# cache, against a warm `cat FILE > /dev/null` in the same run, and its set-up split (read
# and verify, model, DDP set-up, optimizer state). With BASE_BIN=DIR (another build's
# bin/), that build's restart runs right after, on the same warm file. Usage:
#   [BASE_BIN=DIR] tools/bench_checkpoint.sh [build/bin] [RUN_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build/bin}
dir=${2:-run/bench_checkpoint}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
[ "$(id -u)" -ne 0 ] || export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
rm -rf "$dir" && mkdir -p "$dir"
# This machine's VM hands memory the guest frees back to the host (free page reporting,
# after about 2 s): page-cache writes into memory freed just before run at 2 GB/s, into
# memory idle for seconds at 0.5 GB/s. dd is measured both ways -- "warm", right after a
# 1 GB file is deleted, and "cold", after 6 s idle -- and the checkpoint against both.
run_dd() {
  dd if=/dev/zero of="$dir/dd.bin" bs=1M count=1024 conv=fdatasync 2>&1 | tail -n 1
  rm -f "$dir/dd.bin"
}
sync
run_dd > /dev/null  # leaves 1 GB just freed
dd_warm=$(run_dd)
echo "dd warm: $dd_warm"
sync
sleep 6
dd_cold=$(run_dd)
echo "dd cold: $dd_cold"
mpirun --oversubscribe -np 2 "$bin/kqlora-train" input/bench_checkpoint.in save_dir="$dir/ck" > "$dir/write.log"
bytes=$(du -sb "$dir/ck/step-00000000/checkpoint.h5" | cut -f1)
write_s=$(grep "^checkpoint I/O" "$dir/write.log" | awk '{print $4}' | tr -d s)
file="$dir/ck/step-00000000/checkpoint.h5"
cat "$file" > /dev/null
cat_s=$( { /usr/bin/time -f "%e" cat "$file" > /dev/null; } 2>&1 )
echo "warm cat of the file: $cat_s s"
/usr/bin/time -f "%e" -o "$dir/restart.time" mpirun --oversubscribe -np 2 "$bin/kqlora-train" \
    input/bench_checkpoint.in save_dir="$dir/ck" restart=latest > "$dir/restart.log"
grep "^restart: step" "$dir/restart.log"
if [ -n "${BASE_BIN:-}" ]; then
  cat "$file" > /dev/null
  mpirun --oversubscribe -np 2 "$BASE_BIN/kqlora-train" input/bench_checkpoint.in \
      save_dir="$dir/ck" restart=latest > "$dir/restart_base.log"
  echo "restart set-up with $BASE_BIN: $(grep "^setup" "$dir/restart_base.log" | awk '{print $2}')"
fi
python3 - "$dd_warm" "$dd_cold" "$bytes" "$write_s" "$(cat "$dir/restart.time")" "$dir/restart.log" "$cat_s" <<'PY'
import re, sys
warm, cold, size, write_s, restart_total, log = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]), sys.argv[6]
cat_s = float(sys.argv[7])
def bandwidth(line):  # MB/s, from dd's own bytes and seconds
    m = re.search(r"^(\d+) bytes .* copied, ([\d.]+) s", line)
    return int(m.group(1)) / float(m.group(2)) / 1e6
bw, w, c = size / write_s / 1e6, bandwidth(warm), bandwidth(cold)
setup = float(re.search(r"^setup\s+([\d.]+)s", open(log).read(), re.M).group(1))
print(f"checkpoint {size / 1e9:.3f} GB written by 2 ranks in {write_s:.2f} s (fsync included): "
      f"{bw:.0f} MB/s = {100 * bw / w:.0f}% of dd warm ({w:.0f} MB/s), "
      f"{100 * bw / c:.0f}% of dd cold ({c:.0f} MB/s)")
print(f"restart of that state: {setup:.2f} s of setup (reading, checks, sharding) "
      f"in a {restart_total:.2f} s run")
# Each rank reads its part of the file (the ranks of a node together read it once).
m = re.search(r"reading ([\d.]+)s, checksums ([\d.]+)s for ([\d.]+) GB", open(log).read())
if m:
    rv = float(m.group(1)) + float(m.group(2))
    print(f"read + verify on rank 0 ({m.group(3)} GB of the file, the ranks at once): {rv:.2f} s "
          f"= {rv / cat_s:.2f}x the warm cat of the whole file")
PY
