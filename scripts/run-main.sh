#!/usr/bin/env bash
# The README's main job: installs what is missing, builds strata, the Transformer example and
# strata-tokenize, tokenizes the fortunes corpus into token shards on first run (out/data/), and
# trains the Transformer example on them (GPU when present, else CPU). Extra arguments go to the example, e.g.
# scripts/run-main.sh --steps 100, or --resume to continue from out/'s last checkpoint.
#   STRATA_BUILD_DIR     build folder (default: build)
#   STRATA_FORTUNES_DIR  folder of fortune text files (default: /usr/share/games/fortunes)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

build=$(realpath -m "${STRATA_BUILD_DIR:-build}")  # absolute: the work below runs in out/
fortunes=$(realpath -m "${STRATA_FORTUNES_DIR:-/usr/share/games/fortunes}")
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}  # cache hits across clones in other folders
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_BUILD_EXAMPLES=ON
cmake --build "$build" -j "$(nproc)" --target transformer strata-tokenize
mkdir -p out/data
cd out

if [[ ! -f data/fortunes-train.bin || ! -f data/fortunes-val.bin ]]; then
  # The English text files: not the .dat indexes nor the .u8 names of the same text, not
  # subfolders (the offensive set lives in off/); links are followed but each text is taken
  # once.
  files=()
  declare -A seen=()
  while IFS= read -r -d '' f; do
    real=$(realpath "$f")
    [[ -n ${seen[$real]:-} ]] || files+=("$f")
    seen[$real]=1
  done < <(find -L "$fortunes" -mindepth 1 -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' -print0 | sort -z)
  if ((${#files[@]} == 0)); then
    echo "run-main: no fortune text files in $fortunes (install Debian's fortunes package)" >&2
    exit 1
  fi
  "$build/tools/strata-tokenize" --out data/fortunes-train.bin --val data/fortunes-val.bin --val-fraction 0.1 \
    "${files[@]}"
fi
exec "$build/examples/transformer" "$@"
