#!/usr/bin/env bash
# clang-tidy (14) with the checked-in .clang-tidy (bugprone-*, performance-*, less the checks it
# says are noise here) on the C++ sources changed since the baseline commit of
# scripts/format_check.sh, committed or not: the same rule as the format check, so the tree is
# held to it as it is touched rather than in one sweeping commit (docs/testing.md §7). CI's tidy
# stage (scripts/test.sh) runs it on build/ right after the build and its tests.
#
#   scripts/tidy_check.sh [BUILD_DIR]      BUILD_DIR: a configured and built tree with
#                                          compile_commands.json (default $AUTOPAR_BUILD_DIR or build/)
#
# Headers are checked through the sources that include them (HeaderFilterRegex). Only files in
# the build's compile_commands.json are checked (a CUDA-less build skips src/device/cuda/). The
# build must have run: the protobuf headers are generated. Every finding is an error (exit 1).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
build=${1:-${AUTOPAR_BUILD_DIR:-$root/build}}
tidy=${CLANG_TIDY:-clang-tidy-14}
baseline=$(sed -n 's/^baseline=\([0-9a-f]*\)$/\1/p' scripts/format_check.sh)
db=$build/compile_commands.json
jobs=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)  # nproc honours both

if ! command -v "$tidy" >/dev/null; then
  echo "tidy_check.sh: $tidy not found; scripts/setup.sh installs it (Debian package clang-tidy-14)"
  exit 1
fi
if [[ ! -f $db ]]; then
  echo "tidy_check.sh: no $db; configure and build first (CMAKE_EXPORT_COMPILE_COMMANDS is on)"
  exit 1
fi
if ! git cat-file -e "$baseline^{commit}" 2>/dev/null; then
  echo "tidy_check.sh: the baseline commit $baseline is not in this clone (a shallow clone?)"
  exit 1
fi
mapfile -t changed < <(git diff --name-only --diff-filter=ACMR "$baseline" -- '*.cc' | sort -u)
files=()
for f in "${changed[@]}"; do
  if grep -qF "\"file\": \"$root/$f\"" "$db"; then files+=("$f"); fi
done
if ((${#files[@]} == 0)); then
  echo "tidy_check.sh: no C++ source changed since ${baseline:0:7} is in $db"
  exit 0
fi
echo "tidy_check.sh: ${#files[@]} sources changed since ${baseline:0:7}, $jobs at a time"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
printf '%s\n' "${files[@]}" |
  xargs -P "$jobs" -n 1 "$tidy" -p "$build" --quiet --warnings-as-errors='*' >"$log" 2>&1 ||
  status=$?
grep -v -e '^[0-9]* warnings\? generated' -e '^Suppressed [0-9]* warnings' \
  -e '^Use -header-filter' "$log" || true
if ((status != 0)); then
  echo "tidy_check.sh: clang-tidy findings above (.clang-tidy lists the checks)"
  exit 1
fi
echo "tidy_check.sh: no clang-tidy findings in the ${#files[@]} sources changed since ${baseline:0:7}"
