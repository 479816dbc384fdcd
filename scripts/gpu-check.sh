#!/usr/bin/env bash
# The GPU check: strata's CUDA tests, the GPU benchmark beside PyTorch, and a short GPU training
# run of the Transformer example, in one command, for a GPU machine that has the CUDA toolkit,
# PyTorch and NVIDIA's pip libraries but not strata's build dependencies. Two stages:
#
#   scripts/gpu-check.sh --bundle   on a build machine with the Debian dependencies (no GPU
#       needed): configures build-gpu/ (Release, CUDA for $STRATA_CUDA_ARCHS or 90, no oneDNN,
#       so the CPU side of the CUDA tests runs on Eigen; no MPI; -march=x86-64-v3 instead of the
#       build host's -march=native, since the GPU host's CPU is unknown), builds the tests
#       labelled cuda, bench_gpu, the transformer and resnet50 examples and strata-tokenize,
#       and copies them into gpu-bundle/ with every shared library they need except the
#       system's (glibc, libstdc++, libgcc) and NVIDIA's (the driver's libcuda, cuDNN,
#       cuBLAS, NCCL), stripped, with RUNPATH $ORIGIN/lib, libraries over 8 MiB (libstrata)
#       xz-compressed; tokenizes a small corpus into gpu-bundle/data/; prints the size and
#       checks the programs load.
#   scripts/gpu-check.sh            on the GPU machine: finds the GPU (nvidia-smi), unpacks
#       libstrata into a temporary folder and puts it, gpu-bundle/lib, the pip packages'
#       NVIDIA library folders and the toolkit's lib64 on LD_LIBRARY_PATH, runs every bundled
#       test (per-test timeout), bench_gpu and benchmarks/bench_gpu_torch.py, trains the
#       Transformer example for 60 steps and the ResNet-50 example for 40 (synthetic images)
#       with --device cuda, and prints one table. Without a GPU it runs the tests (which
#       skip), says "no GPU visible" and stops. Without gpu-bundle/ it first
#       runs the --bundle stage there, and names the packages missing when that cannot work.
#       Full logs go to $OUT when set (the device tool's output folder; five files, six with
#       build.log), else to gpu-bundle/logs/.
#
# With the device tool (docs/gpu.md): run `scripts/gpu-check.sh --bundle` here, then one `run`
# call with command `scripts/gpu-check.sh`, carry ["gpu-bundle"] and timeout_s 590; everything
# the run reads besides the working tree (binaries, libraries, token shards) is in gpu-bundle/.
#
# Exit status: 0 when no test failed, 1 when a test failed, crashed, timed out or was not run,
# 2 when the tests passed but bench_gpu or the example failed, 3 when no bundle could be made.
# Environment: STRATA_CUDA_ARCHS (90), STRATA_BUNDLE_MARCH (x86-64-v3), STRATA_BUILD_JOBS
# (nproc), STRATA_FORTUNES_DIR (/usr/share/games/fortunes); on the GPU machine
# STRATA_GPU_TEST_TIMEOUT (90 s per test), STRATA_GPU_TEST_BUDGET (150 s for all tests),
# STRATA_GPU_BENCH_TIMEOUT (100 s), STRATA_GPU_TORCH_TIMEOUT (90 s), STRATA_GPU_EXAMPLE_TIMEOUT
# (60 s), STRATA_GPU_RESNET_TIMEOUT (45 s, the ResNet-50 example), STRATA_GPU_BENCH_ARGS
# (passed to both benchmarks, e.g. "--only gemm --reps 50"),
# STRATA_GPU_PROFILE=gpt|gpt_fused|mlp|cnn|resnet50 (1 = gpt: also time every kernel of two
# training steps of that workload, bench_gpu's gpt_train, gpt_train_fused (beside PyTorch's
# gpt_train) or a train_* row, in strata and in PyTorch
# with ncu, 170 s each at most: ncu_strata.txt, ncu_torch.txt, and the top kernels of each in
# the table). At most about 8 minutes in all (about 14 with the profile); the test rows are
# written to summary.txt as soon as the tests end, so a run cut short still leaves them. Built on
# the GPU machine (no bundle carried), the CUDA arch is the GPU's unless STRATA_CUDA_ARCHS says.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 3
root=$PWD
bundle=$root/gpu-bundle
build=$root/build-gpu
# shellcheck source=scripts/gpu-check-lib.sh
source "$root/scripts/gpu-check-lib.sh"

usage() {
  echo "usage: scripts/gpu-check.sh [--bundle]   (see the header of this script, or docs/gpu.md)"
}

run_checks() {
  local logs orig_ld_path=${LD_LIBRARY_PATH:-}
  if [[ -n ${OUT:-} ]]; then logs=$OUT; else logs=$bundle/logs; fi
  scratch=$(mktemp -d /tmp/strata-gpu-check.XXXXXX)  # global: the EXIT trap removes it
  trap 'rm -rf "$scratch"' EXIT

  local gpu=""
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    gpu=$(nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader 2>/dev/null |
      head -1)
    [[ -n $gpu ]] || gpu=$(nvidia-smi -L | head -1)
  fi

  if [[ ! -f $bundle/MANIFEST ]]; then
    # the GPU's own arch (compute_cap 9.0 -> 90) unless one is asked for
    local cap
    cap=$(cut -d, -f2 <<<"$gpu" | tr -d ' .')
    [[ -z ${STRATA_CUDA_ARCHS:-} && $cap =~ ^[0-9]+$ ]] && export STRATA_CUDA_ARCHS=$cap
    echo "gpu-check: no gpu-bundle/ here: building one on this machine first"
    mkdir -p "$logs"
    if ! make_bundle "$(nproc)" >"$logs/build.log" 2>&1; then
      tail -30 "$logs/build.log"
      echo "gpu-check: the build failed; $(missing_build_deps)"
      exit 3
    fi
  fi
  mkdir -p "$logs"

  mkdir -p "$scratch/lib"
  unpack_libs "$scratch/lib" || { echo "gpu-check: cannot unpack gpu-bundle/lib/*.xz" >&2; exit 3; }
  export LD_LIBRARY_PATH
  LD_LIBRARY_PATH=$scratch/lib:$(gpu_library_path "$bundle/lib")${orig_ld_path:+:$orig_ld_path}
  {
    echo "date: $(date -u +%FT%TZ)"
    echo "gpu: ${gpu:-none visible}"
    command -v nvidia-smi >/dev/null && nvidia-smi 2>&1
    echo "bundle:"; cat "$bundle/MANIFEST"
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    echo "ldd bench_gpu:"; ldd "$bundle/bench_gpu" 2>&1
  } >"$logs/env.txt"

  # ---- tests -----------------------------------------------------------------------------
  local per_test=${STRATA_GPU_TEST_TIMEOUT:-90} budget=${STRATA_GPU_TEST_BUDGET:-150}
  local start=$SECONDS test_rows=() notes=() any_test_failed=0 name
  : >"$logs/tests.log"
  for name in $(manifest_tests "$bundle/MANIFEST"); do
    local left=$((budget - (SECONDS - start)))
    if ((left < 10)); then
      test_rows+=("$(printf '%-28s %-10s %6s %6s %6s %6s' "$name" "not run" - - - -)")
      any_test_failed=1
      continue
    fi
    local limit=$((left < per_test ? left : per_test)) t0=$SECONDS rc=0
    timeout -k 5 "$limit" "$bundle/$name" --gtest_color=no >"$scratch/$name.log" 2>&1 || rc=$?
    local elapsed=$((SECONDS - t0)) status pass skip fail
    read -r pass skip fail < <(gtest_counts "$scratch/$name.log")
    status=$(gtest_status "$scratch/$name.log" "$rc" "$fail" "$pass" "$skip")
    # nvidia-smi sees a GPU that the tests do not (a driver older than the bundled CUDA
    # runtime, say): their GPU tests skip, which here is a failure, not a pass
    if [[ -n $gpu && ($status == passed || $status == skipped) ]] &&
      grep -q 'no CUDA device visible' "$scratch/$name.log"; then
      status="no device"
    fi
    [[ $status == passed || $status == skipped ]] || {
      any_test_failed=1
      notes+=("$name: $status (exit $rc): $(grep -m1 -E 'Failure|error|Error|FAILED|no CUDA device' "$scratch/$name.log" |
        cut -c1-160)")
    }
    test_rows+=("$(printf '%-28s %-10s %6s %6s %6s %5ss' "$name" "$status" "$pass" "$fail" "$skip" "$elapsed")")
    { echo "==== $name: $status (exit $rc, ${elapsed}s)"; cat "$scratch/$name.log"; } >>"$logs/tests.log"
  done

  if ((${#test_rows[@]} == 0)); then
    any_test_failed=1
    notes+=("no test listed in gpu-bundle/MANIFEST: nothing was run")
  fi

  print_header() {
    echo
    echo "== strata GPU check: ${gpu:-no GPU visible}; bundle $(manifest_field "$bundle/MANIFEST" commit)"
    printf '%-28s %-10s %6s %6s %6s %6s\n' test result pass fail skip time
    printf '%s\n' "${test_rows[@]}"
    local n
    for n in "${notes[@]}"; do echo "  $n"; done
  }

  print_header >"$logs/summary.txt"  # replaced by the whole table at the end

  if [[ -z $gpu ]]; then
    { print_header; echo "no GPU visible: the tests ran without one (skipped); benchmarks and the example were not run"
      echo "logs: $logs"; } | tee "$logs/summary.txt"
    exit "$any_test_failed"
  fi

  # ---- benchmarks --------------------------------------------------------------------------
  local bench_rc=0 torch_rc=0 py=$root/benchmarks/bench_gpu_torch.py
  [[ -f $py ]] || py=$bundle/bench_gpu_torch.py
  # shellcheck disable=SC2086
  timeout -k 5 "${STRATA_GPU_BENCH_TIMEOUT:-100}" "$bundle/bench_gpu" ${STRATA_GPU_BENCH_ARGS:-} \
    >"$scratch/bench_gpu.log" 2>&1 || bench_rc=$?
  # PyTorch loads its own CUDA libraries: it runs with the caller's library path
  # shellcheck disable=SC2086
  LD_LIBRARY_PATH=$orig_ld_path PYTHONUNBUFFERED=1 timeout -k 5 "${STRATA_GPU_TORCH_TIMEOUT:-90}" \
    python3 "$py" ${STRATA_GPU_BENCH_ARGS:-} >"$scratch/bench_torch.log" 2>&1 || torch_rc=$?
  { echo "==== bench_gpu (exit $bench_rc)"; cat "$scratch/bench_gpu.log"
    echo "==== bench_gpu_torch.py (exit $torch_rc)"; cat "$scratch/bench_torch.log"; } >"$logs/bench.log"

  # ---- the example ---------------------------------------------------------------------------
  local example_rc=0 ex=$scratch/example
  mkdir -p "$ex"
  (cd "$ex" && timeout -k 5 "${STRATA_GPU_EXAMPLE_TIMEOUT:-60}" "$bundle/transformer" --device cuda \
    --train-data "$bundle/data/train.bin" --val-data "$bundle/data/val.bin" --layers 4 --width 256 --heads 8 \
    --context 128 --batch 32 --steps 60 --warmup 10 --log-every 10 --eval-every 60 --eval-batches 4 \
    --sample-tokens 64 --checkpoint ckpt.safetensors --weights model.safetensors --metrics metrics.csv) \
    >"$scratch/example.log" 2>&1 || example_rc=$?
  local resnet_rc=0
  (cd "$ex" && timeout -k 5 "${STRATA_GPU_RESNET_TIMEOUT:-45}" "$bundle/resnet50" --device cuda --batch 64 \
    --synthetic-size 2560 --steps 40 --warmup 5 --channels-last --cudnn-benchmark --workers 4 --log-every 10 \
    --timing-warmup 10 \
    --metrics resnet50.csv) >"$scratch/resnet50.log" 2>&1 || resnet_rc=$?
  { echo "==== transformer (exit $example_rc)"; cat "$scratch/example.log"
    echo "==== metrics.csv"; cat "$ex/metrics.csv" 2>/dev/null
    echo "==== resnet50 (exit $resnet_rc)"; cat "$scratch/resnet50.log"
    echo "==== resnet50.csv"; cat "$ex/resnet50.csv" 2>/dev/null; } >"$logs/example.log"

  # ---- optional per-kernel profile ---------------------------------------------------------
  local profile_rc=0 profile=${STRATA_GPU_PROFILE:-0}
  [[ $profile == 1 ]] && profile=gpt
  if [[ $profile != 0 ]]; then
    profile_steps "$profile" "$logs" "$py" "$orig_ld_path" || profile_rc=$?
  fi

  {
    print_header
    echo
    bench_table "$scratch/bench_gpu.log" "$scratch/bench_torch.log"
    grep -q '^RESULT' "$scratch/bench_gpu.log" || echo "  $(tail -1 "$scratch/bench_gpu.log")"
    ((bench_rc == 0)) ||
      echo "  bench_gpu: exit $bench_rc$( ((bench_rc == 124 || bench_rc == 137)) && echo ' (timed out)'): see bench.log"
    grep -m1 '^SKIP' "$scratch/bench_torch.log" | sed 's/^/  /'
    ((torch_rc == 0)) || echo "  bench_gpu_torch.py: exit $torch_rc: see bench.log"
    echo
    example_line "$ex/metrics.csv" "$example_rc" "$scratch/example.log"
    resnet_line "$ex/resnet50.csv" "$resnet_rc" "$scratch/resnet50.log"
    if [[ $profile != 0 ]]; then
      echo
      profile_lines "$profile" "$logs" "$profile_rc"
    fi
    echo "logs: $logs (summary.txt env.txt tests.log bench.log example.log)"
  } | tee "$logs/summary.txt"

  ((any_test_failed)) && exit 1
  ((bench_rc != 0 || example_rc != 0 || resnet_rc != 0)) && exit 2
  exit 0
}

case "${1:-}" in
  --bundle)
    make_bundle "${STRATA_BUILD_JOBS:-$(nproc)}" || exit 3
    bundle_report
    ;;
  "") run_checks ;;
  -h | --help) usage ;;
  *) usage >&2; exit 2 ;;
esac
