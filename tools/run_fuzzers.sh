#!/usr/bin/env bash
# libFuzzer over kqlora's input readers (tests/fuzz): builds build-fuzz/ with clang,
# KQLORA_FUZZ=ON (everything instrumented, ASan + UBSan), then runs each target on a copy
# of its seed corpus (tests/fuzz/corpus/<target>) for FUZZ_SECONDS (default 60) each.
#   tools/run_fuzzers.sh                  (targets: deck json hf_config safetensors
#   FUZZ_SECONDS=600 tools/run_fuzzers.sh  checkpoint token_data sentencepiece; or name some)
# The fuzzers run in libFuzzer's fork mode and go on after a crash, an out-of-memory or a
# timeout; each input that caused one (build-fuzz/fuzz/art_<target>/) is run again alone
# and sorted by the first stack frame that is neither an allocator, a libc copy nor
# libFuzzer: inside Debian's HDF5 (an upstream limitation on files in its older format,
# docs/RELIABILITY.md) or anywhere else (a finding in kqlora: the script exits 1).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps_debian.sh
command -v clang++ > /dev/null || apt-get install -y clang libclang-rt-14-dev
# allocator_may_return_null: HDF5 allocates sizes read from a file's metadata before it can
# check them (the older file format has no checksums); a failed malloc is how it refuses
# them, as it does without ASan; -malloc_limit_mb above rss_limit_mb lets such a request
# (HDF5 1.10 sizes an older-format object header from the file: up to 4 GiB) fail or pass
# as it would outside the fuzzer, while the resident memory stays bounded
# (docs/RELIABILITY.md, upstream limitations).
export ASAN_OPTIONS="detect_leaks=0:allocator_may_return_null=1:${ASAN_OPTIONS:-}"
limits=(-rss_limit_mb=2048 -malloc_limit_mb=65536 -timeout=20)
CC=clang CXX=clang++ cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DKQLORA_FUZZ=ON -DKQLORA_ENABLE_TESTS=OFF -DKQLORA_NATIVE=OFF ${KQLORA_CMAKE_ARGS:-}
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(deck json hf_config safetensors checkpoint token_data sentencepiece)
cmake --build build-fuzz -j"$(nproc)" --target "${targets[@]/#/fuzz_}"
cd build-fuzz/fuzz

# Where an artifact's failure happens: "hdf5", "kqlora" (anything else) or "none" (it
# does not fail when run alone). Run again with a malloc limit under the RSS limit, so that
# an out-of-memory stop names the allocation that caused it.
where_it_fails() {
  local out
  if out=$(./"fuzz_$1" -rss_limit_mb=4096 -malloc_limit_mb=1024 -timeout=20 "$2" 2>&1); then
    echo none
    return
  fi
  local first
  first=$(printf '%s\n' "$out" | awk '/ERROR|runtime error|deadly signal/ { on = 1 } on' |
    { grep -E '^ +#[0-9]+ ' || true; } |
    { grep -vE 'interceptor|__asan|__sanitizer|sysdeps|libc\.so|[^_]malloc|calloc|realloc|strdup|operator new|memcpy|memmove|memset|fuzzer::|LLVMFuzzer|libc_start|_start' || true; } |
    awk 'NR == 1')
  case "$first" in
    *libhdf5*) echo hdf5 ;;
    *) echo kqlora ;;
  esac
}

failed=0
for t in "${targets[@]}"; do
  rm -rf "corpus_$t" "art_$t" && cp -r "../../tests/fuzz/corpus/$t" "corpus_$t" && mkdir "art_$t"
  echo "== fuzz_$t: ${FUZZ_SECONDS:-60} s"
  ./"fuzz_$t" -fork=1 -ignore_crashes=1 -ignore_ooms=1 -ignore_timeouts=1 \
    -max_total_time="${FUZZ_SECONDS:-60}" "${limits[@]}" -artifact_prefix="art_$t/" \
    "corpus_$t" > "fuzz_$t.log" 2>&1 || true
  grep -E '^#[0-9]+:' "fuzz_$t.log" | tail -n 1 || { tail "fuzz_$t.log"; failed=1; }
  declare -A count=([hdf5]=0 [kqlora]=0 [none]=0)
  for a in "art_$t"/*; do
    [ -e "$a" ] || continue
    w=$(where_it_fails "$t" "$a")
    count[$w]=$((count[$w] + 1))
    [ "$w" != kqlora ] || echo "fuzz_$t: FINDING in kqlora: build-fuzz/fuzz/$a"
  done
  echo "fuzz_$t: inputs that failed: ${count[kqlora]} in kqlora, ${count[hdf5]} inside HDF5" \
    "(upstream), ${count[none]} not failing when run alone"
  [ "${count[kqlora]}" -eq 0 ] || failed=1
  unset count
done
exit "$failed"
