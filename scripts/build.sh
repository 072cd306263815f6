#!/usr/bin/env bash
# Configures and builds autopar-tune into build/ (or $AUTOPAR_BUILD_DIR). -Werror under CI.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${AUTOPAR_BUILD_DIR:-$root/build}
werror=OFF
if [[ -n ${CI:-} ]]; then werror=ON; fi
mkdir -p "$build"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=${CMAKE_BUILD_TYPE:-RelWithDebInfo} \
  -DAUTOPAR_WERROR=$werror >"$build/configure.log" 2>&1 || { cat "$build/configure.log"; exit 1; }
cmake --build "$build" -j"$(nproc)"
