#!/usr/bin/env bash
# Fuzzes the file parsers with libFuzzer, AddressSanitizer and UBSan: safetensors
# (parse_safetensors) and IDX (read_idx, plain and gzip). Each target runs for SECONDS.
#   scripts/fuzz.sh [SECONDS]     (default 60 per target)
#   STRATA_FUZZ_LIB_DIR   a build folder whose libstrata to link (e.g. build, after
#                         scripts/test.sh): nothing else is built. Without it the library is
#                         built in STRATA_FUZZ_BUILD (default build-fuzz).
# The parser sources are compiled instrumented into each fuzzer; the rest of strata (Tensor,
# factories) comes from a plain build of the library. Seeds are tests/io/corpus and
# tests/data/corpus; new inputs and crashes (crash-*) go to the build folder. Exits non-zero
# when a target finds a crash.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
root=$PWD
command -v clang++ >/dev/null || { echo "fuzz: clang++ is needed (apt-get install clang)"; exit 1; }

if [[ -n "${STRATA_FUZZ_LIB_DIR:-}" ]]; then
  build=$STRATA_FUZZ_LIB_DIR
  [[ -f "$build/libstrata.so" ]] || { echo "fuzz: no libstrata.so in $build"; exit 1; }
else
  build=${STRATA_FUZZ_BUILD:-build-fuzz}
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_BUILD_TESTS=OFF \
    -DSTRATA_BUILD_EXAMPLES=OFF -DSTRATA_BUILD_BENCHMARKS=OFF >/dev/null
  cmake --build "$build" --target strata -j "$(nproc)"
fi
out="$build/fuzz"
mkdir -p "$out"

fuzzer() {  # name, extra sources and libraries...
  local name=$1
  shift
  clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -Iinclude -I"$build/gen_include" -Isrc -Itests "$@" \
    -L"$build" -lstrata -lfmt -Wl,-rpath,"$(cd "$build" && pwd)" -o "$out/$name"
}
fuzzer fuzz_safetensors tests/io/fuzz_safetensors.cpp src/io/json.cpp src/io/safetensors_view.cpp \
  src/io/safetensors.cpp src/io/mapped_file.cpp src/io/atomic_file.cpp
fuzzer fuzz_idx tests/data/fuzz_idx.cpp src/data/idx.cpp src/io/atomic_file.cpp -lz

run() {  # name, seed corpus
  mkdir -p "$out/$1.corpus"
  echo "fuzz: $1 for ${seconds}s"
  (cd "$out" && "./$1" -max_total_time="$seconds" -max_len=4096 -print_final_stats=1 \
    -artifact_prefix="$1-" "$1.corpus" "$root/$2" 2>&1 | tail -12)
}
run fuzz_safetensors tests/io/corpus
run fuzz_idx tests/data/corpus
