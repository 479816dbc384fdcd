#!/usr/bin/env bash
# The README's main job: installs what is missing, builds strata and its examples, and trains
# the Transformer example on the fortunes corpus (GPU when present, else CPU). Extra
# arguments go to the example, e.g. scripts/run-main.sh --steps 100.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

build=${STRATA_BUILD_DIR:-build}
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}  # cache hits across clones in other folders
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_BUILD_EXAMPLES=ON
cmake --build "$build" -j "$(nproc)" --target transformer
mkdir -p out
cd out
exec "../$build/examples/transformer" "$@"
