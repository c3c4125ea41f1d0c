#!/usr/bin/env bash
# Rehearses the GPU check (tools/gpu_check.sh; docs/GPU.md, "The GPU check") on this
# machine, in a chroot that holds only what the lent GPU machine's image has, so that a
# check which would fail there for lack of a library or a tool fails here first. Needs
# root, mounts, Debian's package mirror and PyPI (not for CI):
#
#   bash tools/gpu_rehearse.sh [--root DIR] [--stage DIR] [--out DIR] [--keep] [--rebuild]
#        [--no-git] [--limit-s 600] [-- ARGS]
#
#   --root DIR   the chroot (default /var/tmp/kqlora-rehearsal), made on the first run and
#                reused (DIR/etc/kqlora-rehearsal.marker lists what it holds) unless it is
#                missing, broken or made from another recipe; --rebuild makes it again.
#                Downloads are kept in DIR.cache (debs/, wheels/), so that a rebuild
#                downloads nothing again.
#   --stage DIR  what tools/gpu_prep.sh staged (default gpu_stage; a folder inside the
#                repository, as the device tool carries it); missing or empty is allowed
#                (the check then stops at its own "missing" message).
#   --out DIR    where the check's out folder (gpu_report.md, logs/) comes back (default
#                gpu_rehearsal_out, git-ignored), with the whole console output
#                (check.log) and this script's record (rehearsal.log).
#   --keep       keep the copied tree and its build folder (DIR/work/repo/build-gpu-check)
#                for a later run with -- --reuse-build; without it the copy is removed.
#   --no-git     copy the tree without .git (the device copy has one, but its image may
#                lack git: what the check then does without either).
#   --limit-s S  the check's wall-clock limit (default 600: the device tool's command; the
#                source build needs more on 2 cores than on the device's 16).
#   -- ARGS      more options for gpu_check.sh, after --stage STAGE --out "$OUT" (a later
#                option wins).
#
# The chroot: Debian bookworm (debootstrap --variant=minbase) plus python3, python3-venv,
# ca-certificates and the base tools a typical Ubuntu-based CUDA image surely has (bash,
# coreutils, util-linux, procps, hostname, findutils, grep, sed, gawk, diffutils, tar,
# xz-utils, gzip, git, libc-bin), gcc and g++ (nvcc's host compiler), and in a venv
# (/opt/venv, first on PATH) the pip wheels the device has: torch 2.11 (PyPI's build,
# CUDA 13 with its nvidia-* wheels: cuBLAS, NCCL, ...), transformers, safetensors, h5py,
# numpy, cmake, ninja. No Kokkos, MPI, HDF5, BLAS or GoogleTest: checked on every run
# (files and dpkg), and the rehearsal refuses to run otherwise. Bound read-only: the CUDA
# toolkit at its path (/usr/local/cuda -> /usr/local/cuda-13.0); /proc, /sys, /dev,
# /dev/pts and a fresh /dev/shm, all unmounted on exit. This machine has no driver: the
# toolkit's STUB libcuda.so, as /opt/stub-driver/libcuda.so.1 on LD_LIBRARY_PATH, lets
# CUDA binaries load and run up to their first CUDA call, which fails (no device).
# The working tree is copied as the device tool copies it (tracked files and untracked
# ones git does not ignore, .git, and the stage) to /work/repo, and there, as root, in an
# empty environment (PATH, HOME, LANG=C.UTF-8, OUT, LD_LIBRARY_PATH; no CUDA_HOME), with
# the device's 600 s limit:
#   bash tools/gpu_check.sh --stage STAGE --out "$OUT" ARGS
# Prints the check's wall time and its report; exits with the check's exit status (124
# past the limit), or 2 on bad input, or 3 when the chroot cannot be made or fails its
# audit.
set -euo pipefail
cd "$(dirname "$0")/.."
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
[ "${1:-}" = -h ] || [ "${1:-}" = --help ] && { usage; exit 0; }
root=/var/tmp/kqlora-rehearsal stage=gpu_stage out=gpu_rehearsal_out keep=0 rebuild=0 git=1
limit=600
check_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --root) root=${2:?--root needs a value}; shift 2 ;;
    --stage) stage=${2:?--stage needs a value}; shift 2 ;;
    --out) out=${2:?--out needs a value}; shift 2 ;;
    --keep) keep=1; shift ;;
    --limit-s) limit=${2:?--limit-s needs a value}; shift 2 ;;
    --rebuild) rebuild=1; shift ;;
    --no-git) git=0; shift ;;
    --) shift; check_args=("$@"); break ;;
    *) echo "gpu_rehearse.sh: unknown option '$1' (--help)" >&2; exit 2 ;;
  esac
done
die() { echo "gpu_rehearse.sh: $1" >&2; exit "${2:-2}"; }
[ "$(id -u)" = 0 ] || die "needs root (debootstrap, chroot, mounts)"
[ -f tools/gpu_check.sh ] || die "tools/gpu_check.sh not found in $PWD"
repo=$PWD
case "$root" in /*) ;; *) root=$PWD/$root ;; esac
root=${root%/}
case "$root" in
  / | /usr* | /etc* | /home | /root | /var | /var/tmp | /tmp | /work | "$repo"*)
    die "--root $root: pick a folder of its own (it is deleted when rebuilt)" ;;
esac
cache=$root.cache
# The device's toolkit path: /usr/local/cuda -> /usr/local/cuda-13.0 here.
cuda_link=/usr/local/cuda
cuda_dir=$(readlink -f "$cuda_link" 2>/dev/null || true)
[ -n "$cuda_dir" ] && [ -x "$cuda_dir/bin/nvcc" ] ||
  die "no CUDA toolkit at $cuda_link (nvcc missing): the rehearsal binds it into the chroot"
stub=$cuda_dir/lib64/stubs/libcuda.so
[ -f "$stub" ] || die "$stub missing (the toolkit's stub driver)"
# The stage: a folder inside the repository (the device tool carries ignored folders of it).
stage_rel=$(realpath -m --relative-to="$repo" "$stage")
case "$stage_rel" in
  ..* | /*) die "--stage $stage is outside the repository (the device carries only folders in it)" ;;
esac
stage_mib=0
if [ -d "$stage_rel" ]; then
  stage_mib=$(($(du -sb "$stage_rel" | cut -f1) / 1048576))
  [ "$stage_mib" -le 64 ] || die "--stage $stage_rel weighs $stage_mib MiB: the device carries 64 MiB at most"
elif [ -e "$stage_rel" ]; then
  die "--stage $stage_rel is not a folder"
fi
if [ -d "$out" ] && [ -n "$(ls -A "$out")" ] && [ ! -f "$out/rehearsal.log" ]; then
  die "--out $out holds files this script did not write (no rehearsal.log): pick another folder"
fi
mkdir -p "$out"
out=$(realpath "$out")
find "$out" -mindepth 1 -maxdepth 1 -exec rm -rf {} +  # (an earlier rehearsal's)

# What the chroot holds; RECIPE names it in the marker (a change rebuilds the chroot).
suite=bookworm
mirror=$(sed -n 's/^URIs: *\(http[^ ]*debian\)$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
mirror=${mirror:-http://deb.debian.org/debian}
debs=(python3 python3-venv ca-certificates bash coreutils util-linux procps hostname findutils
  grep sed gawk diffutils tar xz-utils gzip git libc-bin gcc g++)
# PyPI's torch 2.11 is the CUDA 13 build (nvidia-cublas, nvidia-nccl-cu13, ... as wheels),
# the device's; the others unpinned, as there.
wheels=("torch==2.11.*" transformers safetensors h5py numpy cmake ninja)
recipe="kqlora-rehearsal 1; $suite minbase; ${debs[*]}; ${wheels[*]}"
marker=$root/etc/kqlora-rehearsal.marker
venv=/opt/venv
chroot_path=$venv/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

log=$out/rehearsal.log
: >"$log"
t_start=$(date +%s)
phase_t0=$t_start
phase_name=""
stamp() { echo "== [$(date +%T)] $*"; }
record() { echo "$*" >>"$log"; }
phase() {  # phase NAME: ends the running phase (its time into the log), starts NAME
  local now
  now=$(date +%s)
  [ -z "$phase_name" ] || record "phase $phase_name: $((now - phase_t0)) s"
  phase_name=$1 phase_t0=$now
  [ -z "$1" ] || stamp "$1"
}
record "gpu_rehearse.sh, $(date -u '+%Y-%m-%d %H:%M UTC'), kqlora $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"
record "root $root, stage $stage_rel ($([ -d "$stage_rel" ] && echo "$stage_mib MiB" || echo missing)), out $out, toolkit $cuda_dir (bound read-only), driver: STUB $stub"

# --- mounts: every one recorded, all undone on exit ------------------------------------
mounts=()
in_root() {  # the mount points under $root, deepest first
  awk -v r="$root/" 'index($5, r) == 1 { print $5 }' /proc/self/mountinfo | sort -r
}
mnt() {  # mnt DEST MOUNT-ARGS...: mounts, records DEST
  local dest=$1
  shift
  mkdir -p "$dest"
  mount "$@" "$dest"
  mounts+=("$dest")
}
bind_ro() {  # bind_ro SRC DEST
  mnt "$2" --bind "$1"
  mount -o remount,bind,ro "$2"
}
kill_inside() {  # ends the processes this rehearsal left in the chroot (by their ids)
  local p r pids=()
  for p in /proc/[0-9]*; do
    r=$(readlink "$p/root" 2>/dev/null) || continue
    case "$r" in "$root" | "$root"/*) pids+=("${p#/proc/}") ;; esac
  done
  [ ${#pids[@]} -eq 0 ] && return 0
  echo "gpu_rehearse.sh: ending processes left in the chroot: ${pids[*]}" >&2
  kill -TERM "${pids[@]}" 2>/dev/null || true
  sleep 2
  kill -KILL "${pids[@]}" 2>/dev/null || true
}
unmount_all() {
  local i m
  [ ${#mounts[@]} -eq 0 ] && [ -z "$(in_root)" ] && return 0
  kill_inside
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
    umount "${mounts[i]}" 2>/dev/null || umount -l "${mounts[i]}" 2>/dev/null || true
  done
  mounts=()
  for m in $(in_root); do umount "$m" 2>/dev/null || umount -l "$m" || true; done
  if [ -n "$(in_root)" ]; then
    echo "gpu_rehearse.sh: still mounted under $root: $(in_root | tr '\n' ' ')" >&2
    return 1
  fi
}
trap 'unmount_all' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
mount_base() {  # /proc, /sys, /dev (with /dev/pts and a fresh /dev/shm) for the chroot
  mnt "$root/proc" -t proc proc
  mnt "$root/sys" -t sysfs -o ro sysfs
  mnt "$root/dev" --bind /dev
  mnt "$root/dev/pts" --bind /dev/pts
  mnt "$root/dev/shm" -t tmpfs -o mode=1777,nosuid,nodev tmpfs
}
[ -z "$(in_root)" ] || die "something is already mounted under $root ($(in_root | tr '\n' ' ')): another rehearsal running?" 3
# in_chroot CMD...: CMD in the chroot, in an empty environment
in_chroot() {
  chroot "$root" /usr/bin/env -i PATH="$chroot_path" HOME=/root LANG=C.UTF-8 "$@"
}

# --- the chroot ------------------------------------------------------------------------
healthy() {
  [ -f "$marker" ] && [ "$(sed -n 's/^recipe: //p' "$marker")" = "$recipe" ] &&
    [ -x "$root$venv/bin/python3" ] && [ -x "$root/usr/bin/git" ] &&
    in_chroot python3 -c 'import glob, torch, numpy, h5py, safetensors, transformers, nvidia
n = list(nvidia.__path__)[0]  # (cuBLAS and NCCL from the nvidia-* wheels, as on the device)
assert glob.glob(n + "/*/lib/libcublas.so.*") and glob.glob(n + "/nccl/lib/libnccl.so.*")' 2>/dev/null &&
    in_chroot cmake --version >/dev/null 2>&1 && in_chroot ninja --version >/dev/null 2>&1
}
build_chroot() {
  if [ -e "$root" ]; then
    # (deleted only when it is a chroot: a Debian tree or this script's marker)
    [ -f "$root/etc/debian_version" ] || [ -f "$marker" ] || [ -z "$(ls -A "$root")" ] ||
      die "$root exists and is not a chroot this script made: move it away or pick another --root" 3
    phase "remove the old chroot $root"
    rm -rf --one-file-system "$root"
  fi
  mkdir -p "$root" "$cache/debs" "$cache/wheels"
  if ! command -v debootstrap >/dev/null; then
    phase "apt-get install debootstrap (on this machine)"
    apt-get install -y -q debootstrap >/dev/null || {
      apt-get update -q >/dev/null && apt-get install -y -q debootstrap >/dev/null
    } || die "apt-get install debootstrap failed" 3
  fi
  phase "debootstrap $suite (minbase) from $mirror into $root"
  debootstrap --variant=minbase --cache-dir="$cache/debs" "$suite" "$root" "$mirror" \
    >"$out/debootstrap.log" 2>&1 || {
    tail -20 "$out/debootstrap.log" >&2
    die "debootstrap failed (whole log: $out/debootstrap.log)" 3
  }
  phase "apt-get install ${debs[*]}"
  if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    cp /etc/apt/sources.list.d/debian.sources "$root/etc/apt/sources.list.d/"
    : >"$root/etc/apt/sources.list"
  fi
  cp /etc/resolv.conf "$root/etc/resolv.conf"
  mount_base
  mnt "$root/var/cache/apt/archives" --bind "$cache/debs"
  { in_chroot apt-get update -q && DEBIAN_FRONTEND=noninteractive in_chroot apt-get install -y -q \
      --no-install-recommends "${debs[@]}"; } >"$out/apt.log" 2>&1 || {
    tail -20 "$out/apt.log" >&2
    die "apt-get install in the chroot failed (whole log: $out/apt.log)" 3
  }
  phase "pip: ${wheels[*]} into $venv (wheels kept in $cache/wheels)"
  in_chroot python3 -m venv "$venv"
  mnt "$root/var/cache/kqlora-wheels" --bind "$cache/wheels"
  local pipi=(python3 -m pip install -q --no-cache-dir --disable-pip-version-check)
  if ! in_chroot "${pipi[@]}" --no-index --find-links /var/cache/kqlora-wheels "${wheels[@]}" \
    >"$out/pip.log" 2>&1; then
    stamp "downloading from PyPI (a few GB the first time)"
    # (this machine's CA bundle, for the download alone: its network may need its own CA)
    cp "${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}" "$root/var/cache/host-ca.crt"
    in_chroot PIP_CERT=/var/cache/host-ca.crt python3 -m pip download -q \
      --disable-pip-version-check --no-cache-dir \
      --only-binary=:all: -d /var/cache/kqlora-wheels "${wheels[@]}" >>"$out/pip.log" 2>&1 &&
      in_chroot "${pipi[@]}" --no-index --find-links /var/cache/kqlora-wheels "${wheels[@]}" \
        >>"$out/pip.log" 2>&1 || {
      tail -20 "$out/pip.log" >&2
      die "pip in the chroot failed (whole log: $out/pip.log)" 3
    }
  fi
  unmount_all
  phase "marker"
  rm -f "$root/etc/resolv.conf" "$root/var/cache/host-ca.crt"  # (the check runs offline on the device)
  {
    echo "recipe: $recipe"
    echo "made: $(date -u '+%Y-%m-%d %H:%M UTC') from $mirror"
    echo "debs asked for: ${debs[*]}"
    echo "dpkg: $(in_chroot dpkg-query -W | wc -l) packages"
    echo "pip ($venv):"
    in_chroot python3 -m pip list --format=freeze --disable-pip-version-check | sed 's/^/  /'
  } >"$marker"
}
phase "the chroot $root"
if [ $rebuild = 0 ] && healthy; then
  stamp "reusing it ($(sed -n 's/^made: //p' "$marker"))"
  record "chroot: reused, $(sed -n 's/^made: //p' "$marker")"
else
  [ $rebuild = 1 ] && stamp "--rebuild" || stamp "missing, broken or from another recipe: making it"
  build_chroot
  healthy || die "the chroot just made fails its own check (python3 -c 'import torch, ...', cuBLAS and NCCL wheels, cmake, ninja)" 3
  record "chroot: made, $(sed -n 's/^made: //p' "$marker")"
fi

# --- audit: nothing the device lacks ----------------------------------------------------
phase "audit: no Kokkos, MPI, HDF5, BLAS or GoogleTest in the chroot"
hits=$(find "$root" \( -path "$root/proc" -o -path "$root/sys" -o -path "$root/dev" \
  -o -path "$root/work" -o -path "$root$cuda_dir" -o -path "$root/var/cache" \) -prune -o \
  \( -iname 'libkokkos*' -o -iname 'libmpi*' -o -iname 'libhdf5*' -o -iname '*openblas*' \
  -o -iname 'libblas*' -o -iname 'libcblas*' -o -iname 'liblapack*' -o -iname 'libgtest*' \
  -o -iname 'libgmock*' -o -name 'Kokkos_Core.hpp' -o -name 'mpi.h' -o -name 'hdf5.h' \
  -o -name 'cblas.h' -o -name 'gtest.h' -o -iname 'GTestConfig.cmake' \) -print |
  sed "s|^$root||" | sort)
wheel_hits=$(grep "^$venv/lib/python3[^/]*/site-packages/" <<<"$hits" || true)
bad_hits=$(grep -v "^$venv/lib/python3[^/]*/site-packages/" <<<"$hits" || true)
bad_debs=$(in_chroot dpkg-query -W -f='${db:Status-Abbrev} ${Package} ${Version}\n' |
  awk '$1 ~ /^.i/ { print $2, $3 }' |
  grep -E '^(lib)?(kokkos|openmpi|mpich|mpi-default|hdf5|openblas|blas|cblas|lapack|atlas|gtest|gmock|googletest)' || true)
{
  echo "audit (find over the chroot, but /proc /sys /dev /work /var/cache and the toolkit):"
  echo "  outside the pip wheels: ${bad_hits:-none}"
  echo "  inside the pip wheels (vendored by the wheels, as on the device; no CMake package finds them):"
  sed 's/^/    /' <<<"${wheel_hits:-none}"
  echo "  dpkg packages of Kokkos, MPI, HDF5, BLAS/LAPACK, GoogleTest (any, -dev or not): ${bad_debs:-none}"
} | tee -a "$log"
record "chroot: $(du -sh --one-file-system "$root" 2>/dev/null | cut -f1) ($(in_chroot dpkg-query -W | wc -l) Debian packages)"
[ -z "$bad_hits" ] && [ -z "$bad_debs" ] ||
  die "the chroot holds what the device lacks (above): refusing to rehearse (--rebuild, or remove them)" 3

# --- copy the working tree as the device tool does ------------------------------------
phase "copy the working tree (tracked and unignored files, $([ $git = 1 ] && echo ".git, ")$stage_rel) to $root/work/repo"
dest=$root/work/repo
if [ -d "$dest" ]; then  # a --keep run's copy: its build folders stay, as on the device
  find "$dest" -mindepth 1 -maxdepth 1 ! -name 'build-gpu-check' -exec rm -rf {} +
fi
mkdir -p "$dest"
git ls-files -z --cached --others --exclude-standard |
  while IFS= read -r -d '' f; do
    if [ -e "$f" ] || [ -L "$f" ]; then printf '%s\0' "$f"; fi
  done |
  tar --null -T - -cf - | tar -C "$dest" -xf -
[ $git = 1 ] && tar -cf - .git | tar -C "$dest" -xf -
[ -d "$stage_rel" ] && tar -cf - "$stage_rel" | tar -C "$dest" -xf -
tree_mib=$(($(du -sb --exclude=build-gpu-check "$dest" | cut -f1) / 1048576))
record "copy: $tree_mib MiB (the tree, $([ $git = 1 ] && echo ".git, " || echo "no .git, ")the stage)"
rm -rf "$root/work/out"
mkdir -p "$root/work/out"
mkdir -p "$root/opt/stub-driver"
cp "$stub" "$root/opt/stub-driver/libcuda.so.1"
echo "STUB libcuda.so.1, the CUDA toolkit's lib64/stubs/libcuda.so (no driver here): every CUDA call fails" \
  >"$root/opt/stub-driver/README"

# --- run the check ---------------------------------------------------------------------
phase "mounts"
mount_base
bind_ro "$cuda_dir" "$root$cuda_dir"
ln -sfn "$cuda_dir" "$root$cuda_link"
facts=$(in_chroot bash -c 'echo "glibc: $(ldd --version | head -1)"; echo "python3: $(command -v python3), $(python3 --version)"
  echo "cmake: $(cmake --version | head -1)"; echo "ninja: $(ninja --version)"; echo "g++: $(g++ --version | head -1)"
  echo "git: $(git --version)"; echo "nvcc: $(nvcc --version | tail -2 | head -1)"
  python3 -c "import torch, numpy, h5py, transformers; print(\"torch\", torch.__version__, \"(CUDA\", torch.version.cuda, \"), numpy\", numpy.__version__, \", h5py\", h5py.__version__, \", transformers\", transformers.__version__)"' 2>&1)
record "$facts"
echo "$facts"
stamp "the driver here is a STUB (/opt/stub-driver/libcuda.so.1 = $stub): CUDA binaries run up to their first CUDA call, which fails (no device)"
check_cmd=(bash tools/gpu_check.sh --stage "$stage_rel" --out /work/out "${check_args[@]}")
record "check: ${check_cmd[*]} (in /work/repo, OUT=/work/out, timeout $limit s)"
phase "check: ${check_cmd[*]}"
t0=$(date +%s)
set +e
timeout --kill-after=15 "$limit" chroot "$root" /usr/bin/env -i PATH="$chroot_path" HOME=/root \
  LANG=C.UTF-8 OUT=/work/out LD_LIBRARY_PATH=/opt/stub-driver \
  /bin/bash -c 'cd /work/repo && exec "$@"' gpu_check "${check_cmd[@]}" 2>&1 |
  tee "$out/check.log"
rc=${PIPESTATUS[0]}
set -e
wall=$(($(date +%s) - t0))
phase "copy the out folder back to $out"
unmount_all
cp -a "$root/work/out/." "$out/"
if [ $keep = 0 ]; then
  rm -rf "$root/work"
fi
phase ""
record "check: exit $rc after $wall s$([ "$rc" = 124 ] && echo " (past the $limit s limit)")"
record "total: $(($(date +%s) - t_start)) s"
echo
if [ ! -f "$out/gpu_report.md" ]; then
  echo "(no gpu_report.md came back)"
elif grep -qxF "$(head -1 "$out/gpu_report.md")" "$out/check.log"; then
  echo "(the report: above, as the check printed it; $out/gpu_report.md)"
else
  cat "$out/gpu_report.md"
fi
echo
grep '^phase \|^chroot: ' "$log" | sed 's/^/  /'
stamp "the check: exit $rc after $wall s (limit $limit s); out folder: $out (rehearsal.log, check.log)"
exit "$rc"
