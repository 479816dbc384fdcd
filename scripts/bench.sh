#!/usr/bin/env bash
# Builds the benchmarks and prints their tables. ops: strata beside LibTorch on GEMM,
# elementwise and reduction workloads, layers forward + backward (linear, conv2d, layer_norm,
# attention) and optimizer steps (AdamW, SGD), run side by side in one process with
# repetitions interleaved, ending with a summary of medians (case, strata, LibTorch, ratio, %
# of the measured FMA peak or memcpy bandwidth) and the FLOP and byte counting rules.
# data: JPEG decoding and augmentation through the DataLoader, token-window sampling, and
# safetensors save / load / serialize beside a plain copy of the same bytes (needs ~1 GB
# free in $TMPDIR or /tmp). train: end-to-end training
# throughput (mlp, cnn, resnet50, gpt) beside the LibTorch twins, rounds alternated, medians
# and ratios in one table (a few minutes; STRATA_BENCH_TRAIN_ARGS passes flags such as
# '--workloads gpt --phases'). Do not run it while building on the same cores.
#   STRATA_BENCH_SUITE    ops, data, train or all (default: all)
#   STRATA_BENCH_DIR      build folder (default: build-bench)
#   STRATA_BENCH_THREADS  threads for strata and LibTorch alike (default: 2)
#   STRATA_BENCH_REPS     ops and data: repetitions per case; the summary shows their median (default: 5)
#   STRATA_BENCH_FILTER   ops and data: regex of cases to run, e.g. 'gemm_' or 'jpeg_' (default: all)
#   STRATA_BENCH_TRAIN_ARGS  flags for bench_train (--workloads, --steps, --rounds, --warmup, --phases)
set -euo pipefail
cd "$(dirname "$0")/.."
suite=${STRATA_BENCH_SUITE:-all}
case "$suite" in
  ops) targets=(bench_ops) ;;
  data) targets=(bench_data) ;;
  train) targets=(bench_train) ;;
  all) targets=(bench_ops bench_data bench_train) ;;
  *) echo "bench.sh: STRATA_BENCH_SUITE must be ops, data, train or all, not '$suite'" >&2; exit 2 ;;
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
echo "command: $0 (STRATA_BENCH_SUITE=$suite STRATA_BENCH_THREADS=$threads STRATA_BENCH_REPS=$reps" \
  "STRATA_BENCH_FILTER='$filter' STRATA_BENCH_TRAIN_ARGS='${STRATA_BENCH_TRAIN_ARGS:-}')"
for target in "${targets[@]}"; do
  if [[ $target == bench_train ]]; then
    # a plain driver with its own warm-up and alternated rounds
    # shellcheck disable=SC2086
    "$build/benchmarks/$target" ${STRATA_BENCH_TRAIN_ARGS:-} | tee "$build/$target.txt"
    echo "(also written to $build/$target.txt)"
    continue
  fi
  "$build/benchmarks/$target" --benchmark_repetitions="$reps" --benchmark_enable_random_interleaving=true \
    --benchmark_min_time=0.3 --benchmark_filter="$filter" | tee "$build/$target.txt"
  echo "(also written to $build/$target.txt)"
done
