#!/usr/bin/env bash
# The SHA-256 of the sources a kqlora build is made of (CMakeLists.txt, cmake/, src/,
# include/, apps/, tests/): of their contents and paths, not of a commit, since a copy of a
# working tree carries uncommitted files too. tools/gpu_prep.sh writes it into the stage's
# manifest; tools/gpu_check.sh compares it with the tree it runs in (docs/GPU.md).
#
#   bash tools/gpu_source_hash.sh [--list]      (--list: the files and their hashes)
#
# The files are git's (tracked, and untracked but not ignored) where the tree has a .git,
# else every file under those paths but Python's caches: the same set in a copy of the tree
# that the device tool made.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "${1:-}" = -h ] || [ "${1:-}" = --help ] && { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0; }
paths=(CMakeLists.txt cmake src include apps tests)
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  list() { git ls-files -z -co --exclude-standard -- "${paths[@]}"; }
else
  list() { find "${paths[@]}" -type f ! -name '*.pyc' ! -path '*/__pycache__/*' -print0; }
fi
hashes=$(list | LC_ALL=C sort -zu | while IFS= read -r -d '' f; do
  if [ -f "$f" ]; then sha256sum "$f"; fi  # (a deleted tracked file: not there to build)
done)
if [ "${1:-}" = --list ]; then
  echo "$hashes"
else
  echo "$hashes" | sha256sum | cut -d' ' -f1
fi
