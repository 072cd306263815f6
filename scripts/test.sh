#!/usr/bin/env bash
# Fresh machine → installed, built, tested. The command CI runs (.ci/run) and the README gives.
#
# The stages of docs/testing.md §1, in order, each timed:
#   setup     scripts/setup.sh: the Debian packages (clang-14, clang-tidy-14 among them)
#   format    scripts/format_check.sh: C++ lines changed since the baseline are clang-formatted
#   layering  scripts/check_layering.py: the module graph
#   build     scripts/build.sh: everything, into build/ (or $AUTOPAR_BUILD_DIR)
#   tests     ctest -L 'unit|distributed|fault|gpu' in that build
#   tidy      scripts/tidy_check.sh: clang-tidy on the sources changed since the baseline, with
#             that build's compile_commands.json
#   asan, fuzz, tsan   scripts/sanitize.sh: ASan+UBSan (unit and fault tests), the fuzz targets
#             under it for a bounded time each, ThreadSanitizer (the coordinator and the status
#             server)
#
# Tests are selected by label (tests/CMakeLists.txt): unit, distributed, fault and gpu, i.e. all of
# them. The gpu-labelled ones skip without a GPU, so CI, which has none, runs and passes them and
# a GPU machine runs them for real (scripts/gpu_check.sh runs them alone, with the benchmarks).
# A test with none of the four labels fails this script rather than go unselected.
#
# A failed set-up or build ends the run at once (what follows needs it); any other failed stage
# fails the run but the later stages still run, so one CI run reports on all of them. The end
# prints each stage's result and wall time. AUTOPAR_SANITIZE_STAGES=0 leaves out the three
# sanitizer stages (a quick local run); CI runs them all.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${AUTOPAR_BUILD_DIR:-$root/build}
# Not exported: nproc honours OMP_NUM_THREADS, and the build, clang-tidy and the sanitizer stages
# size their parallelism with it. The tests get OMP_NUM_THREADS=1 (tests()).
unset OMP_NUM_THREADS OMP_THREAD_LIMIT
jobs=$(nproc)

summary=()
failed=()
run_start=$SECONDS

# stage <name> <command>...: runs one stage, times it, records its result.
stage() {
  local name=$1 start=$SECONDS rc=0
  shift
  echo "test.sh: ---- stage $name ----"
  "$@" || rc=$?
  local took=$((SECONDS - start))
  if ((rc == 0)); then
    summary+=("$(printf '%-9s ok      %5d s' "$name" "$took")")
  else
    summary+=("$(printf '%-9s FAILED  %5d s  (exit %d)' "$name" "$took" "$rc")")
    failed+=("$name")
  fi
  echo "test.sh: stage $name $( ((rc == 0)) && echo ok || echo FAILED) in $took s"
  return "$rc"
}

report() {
  echo "test.sh: ---- summary ----"
  printf 'test.sh: %s\n' "${summary[@]}"
  echo "test.sh: total $((SECONDS - run_start)) s"
  if ((${#failed[@]} > 0)); then
    echo "test.sh: FAILED: ${failed[*]}"
    exit 1
  fi
  echo "test.sh: every stage passed"
}

# (A function run by stage runs without set -e: every step returns on failure explicitly.)
tests() {
  local labels='^(unit|distributed|fault|gpu)$' listed
  listed=$(ctest --test-dir "$build" -N -LE "$labels") || return 1
  if grep -q 'Test *#' <<<"$listed"; then
    echo "$listed"
    echo "test.sh: the tests above have none of the labels unit, distributed, fault, gpu"
    return 1
  fi
  OMP_NUM_THREADS=1 ctest --test-dir "$build" -L "$labels" --output-on-failure -j"$jobs" \
    --timeout 900
}

stage setup "$root/scripts/setup.sh" || report
stage format "$root/scripts/format_check.sh" || true
stage layering python3 "$root/scripts/check_layering.py" || true
stage build "$root/scripts/build.sh" || report
stage tests tests || true
stage tidy "$root/scripts/tidy_check.sh" "$build" || true
if [[ ${AUTOPAR_SANITIZE_STAGES:-1} != 0 ]]; then
  stage asan "$root/scripts/sanitize.sh" asan || true
  stage fuzz "$root/scripts/sanitize.sh" fuzz || true
  stage tsan "$root/scripts/sanitize.sh" tsan || true
fi
report
