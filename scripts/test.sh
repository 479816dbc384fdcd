#!/usr/bin/env bash
# The README's test command: installs what is missing, builds strata with its tests, and runs
# the whole suite with CTest. CUDA tests are compiled and report "skipped" without a GPU.
#   STRATA_BUILD_DIR   build folder (default: build)
#   STRATA_SANITIZE=1  also build and run the core and file-parser tests (labels core,
#                      sanitize) under ASan and UBSan (build-asan/)
#   STRATA_FUZZ_SECONDS=N  also fuzz the safetensors and IDX parsers for N s each
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

build=${STRATA_BUILD_DIR:-build}
jobs=$(nproc)
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}  # cache hits across clones in other folders
# the sanitizer build has debug info, whose folder ccache would otherwise hash: clones elsewhere
# would miss the cache
export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}

# benchmarks build with scripts/bench.sh; the test command leaves them out to save CI time
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_BUILD_TESTS=ON -DSTRATA_BUILD_BENCHMARKS=OFF
cmake --build "$build" -j "$jobs"
ctest --test-dir "$build" --output-on-failure -j "$jobs"

if [[ "${STRATA_SANITIZE:-0}" == "1" ]]; then
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTRATA_SANITIZE=ON \
    -DSTRATA_WITH_CUDA=OFF -DSTRATA_BUILD_EXAMPLES=OFF -DSTRATA_BUILD_BENCHMARKS=OFF
  # only the core and parser tests run under the sanitizers: build just those targets
  labels='core|sanitize'
  asan_tests=$(ctest --test-dir build-asan -N -L "$labels" | sed -n 's/^ *Test *#[0-9]*: *//p')
  cmake --build build-asan -j "$jobs" --target $asan_tests
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-asan --output-on-failure -j "$jobs" -L "$labels"
fi

if [[ "${STRATA_FUZZ_SECONDS:-0}" -gt 0 ]]; then
  STRATA_FUZZ_LIB_DIR="$build" scripts/fuzz.sh "$STRATA_FUZZ_SECONDS"
fi
