#!/usr/bin/env bash
# Fuzzes the safetensors parser with libFuzzer, AddressSanitizer and UBSan.
#   scripts/fuzz.sh [SECONDS]      (default 60; STRATA_FUZZ_BUILD picks the build folder)
# The io sources are compiled instrumented into the fuzzer; the rest of strata (Tensor,
# factories) comes from a plain build of the library. Seeds are tests/io/corpus; new inputs
# go to the build folder, crashes to the build folder as crash-*.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
build=${STRATA_FUZZ_BUILD:-build-fuzz}
command -v clang++ >/dev/null || { echo "fuzz: clang++ is needed (apt-get install clang)"; exit 1; }

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_BUILD_TESTS=OFF \
  -DSTRATA_BUILD_EXAMPLES=OFF -DSTRATA_BUILD_BENCHMARKS=OFF >/dev/null
cmake --build "$build" --target strata -j "$(nproc)"

clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -Iinclude -I"$build/gen_include" -Isrc \
  tests/io/fuzz_safetensors.cpp src/io/json.cpp src/io/safetensors_view.cpp src/io/safetensors.cpp \
  src/io/mapped_file.cpp src/io/atomic_file.cpp \
  -L"$build" -lstrata -lfmt -Wl,-rpath,"$PWD/$build" -o "$build/fuzz_safetensors"

mkdir -p "$build/fuzz_corpus"
cd "$build"
./fuzz_safetensors -max_total_time="$seconds" -max_len=4096 -print_final_stats=1 \
  fuzz_corpus ../tests/io/corpus
