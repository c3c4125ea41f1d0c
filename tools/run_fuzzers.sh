#!/usr/bin/env bash
# libFuzzer over kqlora's input readers (tests/fuzz): builds build-fuzz/ with clang,
# KQLORA_FUZZ=ON (everything instrumented, ASan + UBSan), then runs each target on a copy
# of its seed corpus (tests/fuzz/corpus/<target>) for FUZZ_SECONDS (default 60) each.
# A finding stops its target and leaves the input as build-fuzz/fuzz/crash-*.
#   tools/run_fuzzers.sh                  (targets: deck json hf_config safetensors
#   FUZZ_SECONDS=600 tools/run_fuzzers.sh  checkpoint token_data; or name some)
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
CC=clang CXX=clang++ cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DKQLORA_FUZZ=ON -DKQLORA_ENABLE_TESTS=OFF -DKQLORA_NATIVE=OFF ${KQLORA_CMAKE_ARGS:-}
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(deck json hf_config safetensors checkpoint token_data)
cmake --build build-fuzz -j"$(nproc)" --target "${targets[@]/#/fuzz_}"
cd build-fuzz/fuzz
failed=0
for t in "${targets[@]}"; do
  rm -rf "corpus_$t" && cp -r "../../tests/fuzz/corpus/$t" "corpus_$t"
  echo "== fuzz_$t: ${FUZZ_SECONDS:-60} s"
  rc=0
  ./"fuzz_$t" -max_total_time="${FUZZ_SECONDS:-60}" -rss_limit_mb=2048 -malloc_limit_mb=65536 -timeout=20 \
    -print_final_stats=1 "corpus_$t" > "fuzz_$t.log" 2>&1 || rc=$?
  grep -E "stat::number_of_executed_units|==[0-9]+==ERROR|SUMMARY|Test unit written" \
    "fuzz_$t.log" || true
  [ "$rc" -eq 0 ] || { echo "fuzz_$t: FINDING (exit $rc; log build-fuzz/fuzz/fuzz_$t.log)"; failed=1; }
done
exit "$failed"
