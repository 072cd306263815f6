#!/usr/bin/env bash
# Installs every Debian package the build, the tests and the benchmarks need. Idempotent: does
# nothing (and needs no network) when everything is already there.
set -euo pipefail

packages=(
  build-essential cmake pkg-config git
  libopenmpi-dev openmpi-bin
  libboost-dev
  libprotobuf-dev protobuf-compiler
  libyaml-cpp-dev
  libopenblas-dev
  libgtest-dev libgmock-dev
  python3 python3-matplotlib python3-numpy
  # scripts/format_check.sh and scripts/sanitize.sh: clang-format-diff, clang with its sanitizer
  # and libFuzzer runtimes; scripts/tidy_check.sh: clang-tidy.
  clang-format-14 clang-14 libclang-rt-14-dev clang-tidy-14
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} > 0)); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
