# Functions of scripts/gpu-check.sh (sourced; $root, $bundle and $build come from it): making
# the bundle, finding NVIDIA's libraries on the GPU machine, and reading the tests' and
# benchmarks' output into the summary table. (Single-quoted $ORIGIN is meant literally.)
# shellcheck shell=bash disable=SC2154,SC2016

# ---- the bundle ------------------------------------------------------------------------------

# The build's own libraries are bundled; these come from the GPU machine: the C and C++
# runtimes, and NVIDIA's driver, cuDNN, cuBLAS and NCCL (in its toolkit and pip packages).
readonly NOT_BUNDLED='^(linux-vdso|ld-linux|libc\.so|libm\.so|libmvec|libstdc\+\+|libgcc_s|libdl\.so|librt\.so|'\
'libpthread|libutil|libresolv|libcuda\.so|libcudnn|libcublas|libnccl|libnvidia)'

cuda_toolkit_lib() {
  local d
  for d in "${CUDA_HOME:-/usr/local/cuda}/lib64" /usr/local/cuda/lib64 /usr/local/cuda/lib; do
    [[ -d $d ]] && { echo "$d"; return; }
  done
}

# cuDNN from NVIDIA's pip package when the toolkit has none (a GPU machine with PyTorch): its
# header folder and library as CMake arguments, one a line, or nothing.
pip_cudnn_args() {
  [[ -f ${CUDA_HOME:-/usr/local/cuda}/include/cudnn.h || -f /usr/local/cuda/include/cudnn.h ]] && return
  python3 - 2>/dev/null <<'EOF'
import glob, os
try:
    import nvidia.cudnn as c
    root = list(c.__path__)[0]
except Exception:
    raise SystemExit
libs = sorted(glob.glob(os.path.join(root, "lib", "libcudnn.so*")))
if os.path.isfile(os.path.join(root, "include", "cudnn.h")) and libs:
    print("-DSTRATA_CUDNN_INCLUDE_DIR=" + os.path.join(root, "include"))
    print("-DSTRATA_CUDNN_LIBRARY=" + libs[0])
EOF
}

configure_gpu_build() {
  local nvcc=() cudnn=()
  if ! command -v nvcc >/dev/null 2>&1 && [[ -x /usr/local/cuda/bin/nvcc ]]; then
    nvcc=(-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc)
  fi
  mapfile -t cudnn < <(pip_cudnn_args)
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$root}  # cache hits across build folders
  # RUNPATH $ORIGIN/lib for executables in the bundle's top folder, $ORIGIN for its libraries
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${nvcc[@]}" "${cudnn[@]}" \
    -DSTRATA_WITH_CUDA=ON -DSTRATA_CUDA_ARCHS="${STRATA_CUDA_ARCHS:-90}" -DSTRATA_WITH_DNNL=OFF \
    -DSTRATA_WITH_MPI=OFF -DSTRATA_BUILD_TESTS=ON -DSTRATA_BUILD_BENCHMARKS=ON -DSTRATA_BUILD_EXAMPLES=ON \
    -DSTRATA_NATIVE=OFF -DCMAKE_CXX_FLAGS="-march=${STRATA_BUNDLE_MARCH:-x86-64-v3}" \
    -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON '-DCMAKE_INSTALL_RPATH=$ORIGIN/lib;$ORIGIN' \
    -DCMAKE_EXE_LINKER_FLAGS=-Wl,--enable-new-dtags -DCMAKE_SHARED_LINKER_FLAGS=-Wl,--enable-new-dtags
}

# Token shards for the example: Debian's fortunes (as scripts/run-main.sh takes them), else
# strata's own docs. Prints where the text came from.
make_shards() {
  local dir=${STRATA_FORTUNES_DIR:-/usr/share/games/fortunes} files=() f real corpus
  declare -A seen=()
  if [[ -d $dir ]]; then
    while IFS= read -r -d '' f; do
      real=$(realpath "$f")
      [[ -n ${seen[$real]:-} ]] || files+=("$f")
      seen[$real]=1
    done < <(find -L "$dir" -mindepth 1 -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' -print0 | sort -z)
    corpus="fortunes ($dir)"
  fi
  if ((${#files[@]} == 0)); then
    files=("$root"/docs/*.md "$root"/README.md)
    corpus="strata's docs/*.md and README.md"
  fi
  LD_LIBRARY_PATH=$bundle/lib:$(cuda_toolkit_lib) "$bundle/strata-tokenize" --out "$bundle/data/train.bin" \
    --val "$bundle/data/val.bin" --val-fraction 0.1 "${files[@]}" >&2 || return 1
  echo "$corpus"
}

# make_bundle JOBS: configure and build build-gpu/, then fill gpu-bundle/.
make_bundle() {
  local jobs=$1 tests exe deps soname path corpus
  configure_gpu_build || return 1
  # without cuDNN the build would still succeed, and every convolution fail on the GPU
  if grep -q '^STRATA_CUDNN_LIBRARY:FILEPATH=.*NOTFOUND' "$build/CMakeCache.txt"; then
    echo "gpu-check: no cuDNN found (neither in the CUDA toolkit nor from pip's nvidia-cudnn)" >&2
    return 1
  fi
  tests=$(ctest --test-dir "$build" -N -L cuda | sed -n 's/^ *Test *#[0-9]*: *//p' | tr '\n' ' ')
  [[ -n ${tests// /} ]] || { echo "gpu-check: no test labelled cuda in $build" >&2; return 1; }
  # shellcheck disable=SC2086
  cmake --build "$build" -j "$jobs" --target $tests bench_gpu transformer resnet50 strata-tokenize || return 1

  rm -rf "$bundle"
  mkdir -p "$bundle/lib" "$bundle/data"
  local bins=()
  for exe in $tests; do bins+=("$build/tests/$exe"); done
  bins+=("$build/benchmarks/bench_gpu" "$build/examples/transformer" "$build/examples/resnet50" "$build/tools/strata-tokenize")
  for exe in "${bins[@]}"; do cp "$exe" "$bundle/" || return 1; done
  cp "$root/benchmarks/bench_gpu_torch.py" "$bundle/"

  deps=$(LD_LIBRARY_PATH=$build:$(cuda_toolkit_lib) ldd "${bins[@]}" | awk '/=>/ {print $1, $3}' | sort -u)
  if grep -q ' not$' <<<"$deps"; then
    echo "gpu-check: unresolved libraries: $(grep ' not$' <<<"$deps" | cut -d' ' -f1 | tr '\n' ' ')" >&2
    return 1
  fi
  while read -r soname path; do
    [[ $soname =~ $NOT_BUNDLED ]] || cp -L "$path" "$bundle/lib/$soname" || return 1
  done <<<"$deps"
  strip --strip-unneeded "$bundle"/lib/*
  strip "$bundle"/test_* "$bundle/bench_gpu" "$bundle/transformer" "$bundle/resnet50" "$bundle/strata-tokenize"
  if ! readelf -d "$bundle/bench_gpu" | grep -q 'RUNPATH.*\$ORIGIN/lib'; then
    echo "gpu-check: bench_gpu has no RUNPATH \$ORIGIN/lib:" \
      "$(readelf -d "$bundle/bench_gpu" | grep -E 'RPATH|RUNPATH')" >&2
    return 1
  fi
  corpus=$(make_shards) || return 1
  pack_large_libs || return 1

  local commit
  commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
  [[ -z $(git -C "$root" status --porcelain --untracked-files=no 2>/dev/null) ]] || commit+=" with uncommitted changes"
  {
    echo "commit: $commit"
    echo "made: $(date -u +%FT%TZ) on $(uname -m), gcc $(gcc -dumpfullversion 2>/dev/null)," \
      "nvcc $(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*')"
    echo "build: Release, CUDA archs ${STRATA_CUDA_ARCHS:-90}, -march=${STRATA_BUNDLE_MARCH:-x86-64-v3}," \
      "no oneDNN (CPU references on Eigen), no MPI"
    echo "corpus: $corpus"
    echo "packed: $(find "$bundle/lib" -name '*.xz' -printf '%f ')(xz; gpu-check.sh unpacks them outside the bundle)"
    echo "tests: ${tests% }"
  } >"$bundle/MANIFEST"
}

# Libraries over 8 MiB travel xz-compressed: the CUDA kernels make libstrata about 55 MiB, 8
# compressed, and the device tool carries 64 MiB with the working tree.
pack_large_libs() {
  local f
  for f in "$bundle"/lib/*; do
    [[ $f == *.xz ]] && continue
    if (($(stat -c %s "$f") > 8 * 1048576)); then xz -9 -T0 "$f" || return 1; fi
  done
}

# unpack_libs DIR: the bundle's compressed libraries, uncompressed into DIR (the bundle itself is
# left as it came, so it can travel again).
unpack_libs() {
  local f out
  for f in "$bundle"/lib/*.xz; do
    [[ -e $f ]] || continue
    out=$1/$(basename "${f%.xz}")
    if command -v xz >/dev/null 2>&1; then
      xz -dc "$f" >"$out" || return 1
    else
      python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
        "$f" "$out" || return 1
    fi
  done
}

# Every bundled program finds all its libraries with nothing but the bundle and the toolkit on
# LD_LIBRARY_PATH (NVIDIA's cuDNN and cuBLAS come from the toolkit here), and the first test
# binary starts and lists its tests.
bundle_loader_check() {
  local unpacked path exe first missing=""
  unpacked=$(mktemp -d /tmp/strata-gpu-bundle-check.XXXXXX)
  unpack_libs "$unpacked" || { rm -rf "$unpacked"; return 1; }
  path=$unpacked:$bundle/lib:$(cuda_toolkit_lib)
  for exe in "$bundle"/test_* "$bundle/bench_gpu" "$bundle/transformer" "$bundle/resnet50" "$bundle/strata-tokenize"; do
    missing+=$(env -i PATH="$PATH" LD_LIBRARY_PATH="$path" ldd "$exe" |
      awk -v e="${exe##*/}" '/not found/ {printf " %s: %s", e, $1}')
  done
  first=$(manifest_tests "$bundle/MANIFEST" | head -1)
  if [[ -n $missing ]] || ! env -i LD_LIBRARY_PATH="$path" "$bundle/$first" --gtest_list_tests >/dev/null; then
    echo "gpu-check: loader check failed:${missing:- $first does not start}" >&2
    rm -rf "$unpacked"
    return 1
  fi
  rm -rf "$unpacked"
  echo "loader check: every bundled program resolves its libraries from the bundle and $(cuda_toolkit_lib) alone"
}

bundle_report() {
  local bytes mib
  bytes=$(du -sb "$bundle" | cut -f1)
  mib=$((bytes / 1048576))
  echo "gpu-bundle/: $mib MiB ($bytes bytes) in $(find "$bundle" -type f | wc -l) files; largest:"
  find "$bundle" -type f -printf '%s %P\n' | sort -rn | head -6 | awk '{printf "  %8.1f MiB  %s\n", $1 / 1048576, $2}'
  sed 's/^/  /' "$bundle/MANIFEST"
  bundle_loader_check || return 1
  if ((bytes > 60 * 1048576)); then
    echo "gpu-check: the bundle is over 60 MiB: the device tool carries at most 64 MiB with the tree" >&2
    return 1
  fi
  echo "next: one device run with command 'scripts/gpu-check.sh' and carry [\"gpu-bundle\"]"
}

# The Debian packages a build here would need and lacks, as one line.
missing_build_deps() {
  local missing=() pair header
  command -v cmake >/dev/null 2>&1 || missing+=(cmake)
  command -v ninja >/dev/null 2>&1 || missing+=(ninja-build)
  command -v nvcc >/dev/null 2>&1 || [[ -x /usr/local/cuda/bin/nvcc ]] || missing+=("nvcc (the CUDA toolkit)")
  for pair in fmt/format.h:libfmt-dev eigen3/Eigen/Core:libeigen3-dev gtest/gtest.h:libgtest-dev \
    CLI/CLI.hpp:libcli11-dev turbojpeg.h:libturbojpeg0-dev png.h:libpng-dev zlib.h:zlib1g-dev \
    xxhash.h:libxxhash-dev; do
    header=${pair%%:*}
    [[ -f /usr/include/$header || -f /usr/local/include/$header ]] || missing+=("${pair#*:}")
  done
  if ((${#missing[@]})); then
    echo "missing here: ${missing[*]} (build the bundle elsewhere with scripts/gpu-check.sh --bundle)"
  else
    echo "no missing package found: see the build log"
  fi
}

# ---- the GPU machine -------------------------------------------------------------------------

# gpu_library_path FIRST: FIRST, then the folders of NVIDIA's pip packages (cuDNN, cuBLAS, NCCL
# and the CUDA runtime that PyTorch uses), then the toolkit's, joined with ':'.
gpu_library_path() {
  local dirs=("$1") d
  while IFS= read -r d; do [[ -n $d ]] && dirs+=("$d"); done < <(python3 - 2>/dev/null <<'EOF'
import glob, os
try:
    import nvidia  # a namespace package holding cudnn/, cublas/, cu13/, ...
    roots = list(nvidia.__path__)
except Exception:
    roots = []
found = {os.path.dirname(f) for r in roots for f in glob.glob(os.path.join(r, "**", "lib*.so*"), recursive=True)}
print("\n".join(sorted(found)))
EOF
  )
  if ((${#dirs[@]} == 1)); then  # no python3 that imports them: where pip puts them
    for d in /opt/*/.venv/lib/python3*/site-packages/nvidia/*/lib /usr/local/lib/python3*/dist-packages/nvidia/*/lib \
      /usr/lib/python3/dist-packages/nvidia/*/lib; do
      [[ -d $d ]] && dirs+=("$d")
    done
  fi
  for d in "${CUDA_HOME:-/usr/local/cuda}/lib64" /usr/local/cuda/lib64 /usr/local/cuda/lib; do
    [[ -d $d ]] && dirs+=("$d")
  done
  printf '%s\n' "${dirs[@]}" | awk '!seen[$0]++' | paste -sd:
}

manifest_field() { sed -n "s/^$2: //p" "$1"; }
manifest_tests() { manifest_field "$1" tests | tr ' ' '\n'; }

# "PASSED SKIPPED FAILED" counts from a GoogleTest log (0 where a line is absent).
gtest_counts() {
  awk '/^\[  PASSED  \] [0-9]+ test/ {p = $4} /^\[  SKIPPED \] [0-9]+ test/ {s = $4}
       /^\[  FAILED  \] [0-9]+ test/ {f = $4} END {printf "%d %d %d\n", p, s, f}' "$1"
}

# gtest_status LOG EXIT FAILED PASSED SKIPPED
gtest_status() {
  if (($2 == 124 || $2 == 137)); then echo timeout
  elif ! grep -q '^\[==========\] .* ran\.' "$1"; then echo crashed
  elif (($2 != 0 || $3 > 0)); then echo failed
  elif (($4 == 0 && $5 > 0)); then echo skipped
  else echo passed
  fi
}

# bench_table STRATA_LOG TORCH_LOG: bench_gpu's RESULT rows with PyTorch's beside them.
bench_table() {
  awk -F'\t' '
    function num(v) { return v ~ /^-?[0-9]+(\.[0-9]+)?$/ }
    function show(v) { return num(v) ? sprintf("%.1f", v) : "-" }
    $1 != "RESULT" { next }
    FILENAME == ARGV[1] { key[++n] = $2; strata[$2] = $3; unit[$2] = $4; note[$2] = $5; next }
    {
      torch[$2] = $3
      if (!($2 in unit)) { key[++n] = $2; strata[$2] = "-"; unit[$2] = $4 }
      if ($5 != "" && note[$2] == "") note[$2] = "PyTorch " $5
    }
    END {
      printf "%-20s %10s %10s %7s  %-9s %s\n", "benchmark", "strata", "PyTorch", "ratio", "unit", "note"
      if (n == 0) print "(no results: see bench.log)"
      for (i = 1; i <= n; i++) {
        # a *_fused row (strata with one of its fused kernels switched on) faces the plain PyTorch row
        k = key[i]; b = k; sub(/_fused$/, "", b); s = strata[k]
        t = (k in torch) ? torch[k] : (b in torch) ? torch[b] : "-"
        r = (num(s) && num(t) && t + 0 > 0) ? sprintf("%.2f", s / t) : "-"
        printf "%-20s %10s %10s %7s  %-9s %s\n", k, show(s), show(t), r, unit[k], substr(note[k], 1, 70)
      }
    }' "$1" "$2"
}

# example_line METRICS_CSV EXIT LOG: the example's first loss, its last-5 mean, validation loss
# and median tokens/s (steps past the first 5, without a validation in them).
example_line() {
  if [[ ! -s $1 ]]; then
    echo "example transformer: no metrics (exit $2): $(grep -m1 -i 'error' "$3" | cut -c1-150)"
    return
  fi
  awk -F, -v rc="$2" '
    NR > 1 { n++; loss[n] = $2; if ($5 != "") val = $5; if (n > 5 && $5 == "") tps[++m] = $4 + 0 }
    END {
      for (i = 2; i <= m; i++)  # insertion sort: mawk has no asort
        for (j = i; j > 1 && tps[j - 1] > tps[j]; j--) { x = tps[j]; tps[j] = tps[j - 1]; tps[j - 1] = x }
      med = m ? (m % 2 ? tps[(m + 1) / 2] : (tps[m / 2] + tps[m / 2 + 1]) / 2) : 0
      last = 0; k = 0
      for (i = (n > 5 ? n - 4 : 1); i <= n; i++) { last += loss[i]; k++ }
      printf "example transformer (4 layers, width 256, context 128, batch 32, cuda): %d steps, loss %.3f at step 1, " \
             "%.3f over the last %d, validation %s, %.0f tokens/s (median)%s\n",
             n, loss[1], last / k, k, (val == "" ? "-" : sprintf("%.3f", val)), med, (rc != 0 ? ", exit " rc : "")
    }' "$1"
}

# resnet_line METRICS_CSV EXIT LOG: the ResNet-50 example's first and last loss and its mean
# images/s past the timing warm-up (its own last line).
resnet_line() {
  if [[ ! -s $1 ]]; then
    echo "example resnet50: no metrics (exit $2): $(grep -m1 -i 'error' "$3" | cut -c1-150)"
    return
  fi
  local rate
  rate=$(grep -m1 '^mean throughput' "$3" | sed 's/^mean throughput //')
  awk -F, -v rc="$2" -v rate="${rate:--}" '
    NR > 1 { n++; if (n == 1) first = $2; last = $2 }
    END {
      printf "example resnet50 (synthetic 224x224, batch 64, channels-last, cuDNN benchmark, cuda): %d steps, " \
             "loss %.3f at step 1, %.3f at the last, %s%s\n", n, first, last, rate, (rc != 0 ? ", exit " rc : "")
    }' "$1"
}

# profile_steps WHAT LOGS TORCH_SCRIPT TORCH_LD_PATH: ncu's per-kernel GPU times of two training
# steps (--warmup 1 --reps 1) of WHAT in strata and in PyTorch, into LOGS/ncu_strata.txt and
# LOGS/ncu_torch.txt: gpt is bench_gpu's gpt_train row, gpt_fused its gpt_train_fused row (beside
# PyTorch's gpt_train), mlp, cnn and resnet50 its train_* rows. 1 when ncu is missing, 2 for an
# unknown WHAT.
profile_steps() {
  local rows torch_rows
  case $1 in
    gpt | gpt_fused) rows=(--only "$1") torch_rows=(--only gpt) ;;
    mlp | cnn | resnet50) rows=(--only train --workloads "$1") torch_rows=("${rows[@]}") ;;
    *) return 2 ;;
  esac
  local ncu candidate
  ncu=$(command -v ncu)
  for candidate in /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu; do
    [[ -z $ncu && -x $candidate ]] && ncu=$candidate
  done
  [[ -n $ncu ]] || return 1
  local args=(--clock-control none --cache-control none --metrics gpu__time_duration.sum --print-summary per-kernel)
  timeout -k 5 170 "$ncu" "${args[@]}" "$bundle/bench_gpu" "${rows[@]}" --warmup 1 --reps 1 >"$2/ncu_strata.txt" 2>&1
  LD_LIBRARY_PATH=$4 timeout -k 5 170 "$ncu" "${args[@]}" python3 "$3" "${torch_rows[@]}" --warmup 1 --reps 1 \
    >"$2/ncu_torch.txt" 2>&1
  return 0
}

# profile_lines WHAT LOGS RC: the table's profile part, the ten longest kernels of each library.
profile_lines() {
  case $3 in
    0) ;;
    1) echo "profile: ncu not found"; return ;;
    *) echo "profile: unknown workload '$1' (gpt, gpt_fused, mlp, cnn, resnet50)"; return ;;
  esac
  local side
  for side in strata torch; do
    echo "profile, $side (two $1 training steps; ncu_$side.txt):"
    python3 "$root/scripts/ncu-summary.py" "$2/ncu_$side.txt" --top 10 2>&1 | cut -c1-150 | sed 's/^/  /'
  done
}
