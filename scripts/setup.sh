#!/usr/bin/env bash
# Installs the Debian packages strata needs to build, test and run its examples. Idempotent:
# it installs only what is missing, so running it again is quick. (oneDNN's CMake config
# looks for OpenCL, which libdnnl-dev only recommends: ocl-icd-opencl-dev is listed for it.)
#   scripts/setup.sh            build, test and example dependencies
#   scripts/setup.sh --bench    also LibTorch (the benchmark peer) and OpenBLAS
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config git
  libdnnl-dev ocl-icd-opencl-dev libeigen3-dev libfmt-dev libgtest-dev libgmock-dev libbenchmark-dev
  libopenmpi-dev openmpi-bin libcli11-dev libturbojpeg0-dev libpng-dev zlib1g-dev libxxhash-dev
  fortunes dataset-fashion-mnist python3 python3-pip
  clang libclang-rt-14-dev  # libFuzzer, for scripts/fuzz.sh
)
case "${1:-}" in
  "") ;;
  --bench) packages+=(libtorch-dev libopenblas0-openmp) ;;
  *) echo "setup: unknown argument '$1' (usage: scripts/setup.sh [--bench])" >&2; exit 2 ;;
esac

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  # through env: sudo's env_reset would drop a plain DEBIAN_FRONTEND=... prefix
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "setup: all packages present"
fi

# Python test peers (safetensors interop): installed only when missing; --break-system-packages
# only where pip refuses to install into a system Python.
if ! python3 -c 'import safetensors, numpy' 2>/dev/null; then
  echo "setup: installing safetensors numpy (pip)"
  python3 -m pip install -q safetensors numpy || python3 -m pip install -q --break-system-packages safetensors numpy
fi
