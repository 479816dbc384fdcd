#!/usr/bin/env bash
# Builds the benchmarks and prints their tables. ops: strata beside LibTorch on GEMM,
# elementwise and reduction workloads, run side by side in one process with repetitions
# interleaved, ending with a summary of medians (case, strata, LibTorch, ratio, % of the
# measured FMA peak or memcpy bandwidth). data: JPEG decoding and augmentation through the
# DataLoader, token-window sampling, and safetensors save / load / serialize beside a plain
# copy of the same bytes (needs ~1 GB free in $TMPDIR or /tmp). Do not run it while
# building on the same cores.
#   STRATA_BENCH_SUITE    ops, data or all (default: all)
#   STRATA_BENCH_DIR      build folder (default: build-bench)
#   STRATA_BENCH_THREADS  threads for strata and LibTorch alike (default: 2)
#   STRATA_BENCH_REPS     repetitions per case; the summary shows their median (default: 5)
#   STRATA_BENCH_FILTER   regex of cases to run, e.g. 'gemm_' or 'jpeg_' (default: all)
set -euo pipefail
cd "$(dirname "$0")/.."
suite=${STRATA_BENCH_SUITE:-all}
case "$suite" in
  ops) targets=(bench_ops) ;;
  data) targets=(bench_data) ;;
  all) targets=(bench_ops bench_data) ;;
  *) echo "bench.sh: STRATA_BENCH_SUITE must be ops, data or all, not '$suite'" >&2; exit 2 ;;
esac
scripts/setup.sh --bench

build=${STRATA_BENCH_DIR:-build-bench}
threads=${STRATA_BENCH_THREADS:-2}
reps=${STRATA_BENCH_REPS:-5}
filter=${STRATA_BENCH_FILTER:-.}
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_BUILD_BENCHMARKS=ON \
  -DSTRATA_BUILD_TESTS=OFF -DSTRATA_BUILD_EXAMPLES=OFF >/dev/null
cmake --build "$build" --target "${targets[@]}" -j "$(nproc)"

# both libraries get the same threads; OpenBLAS (LibTorch's BLAS) reads its own variable
export STRATA_BENCH_THREADS=$threads OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads
echo "command: $0 (STRATA_BENCH_SUITE=$suite STRATA_BENCH_THREADS=$threads STRATA_BENCH_REPS=$reps STRATA_BENCH_FILTER='$filter')"
for target in "${targets[@]}"; do
  "$build/benchmarks/$target" --benchmark_repetitions="$reps" --benchmark_enable_random_interleaving=true \
    --benchmark_min_time=0.3 --benchmark_filter="$filter" | tee "$build/$target.txt"
  echo "(also written to $build/$target.txt)"
done
