#!/usr/bin/env bash
# The sanitizer stages of CI (docs/testing.md §2–§3), run by scripts/test.sh after the normal
# build and tests. Each builds into its own directory with clang and the CUDA backend off:
#
#   asan   build-asan: AddressSanitizer + UndefinedBehaviorSanitizer (-fno-sanitize-recover),
#          trials on; the unit and fault tests but the slow ones below, and the stalled-rank
#          trial under mpirun.
#   fuzz   the same build's tests/fuzz targets (libFuzzer), each for $AUTOPAR_FUZZ_SECONDS
#          (default 40) on a copy of its seed corpus; prints the executions per target.
#   tsan   build-tsan: ThreadSanitizer with AUTOPAR_TRIALS=OFF, the configuration without the
#          trial runner (so CI builds it); every unit test it has but the slow ones below, and the
#          status server, the only threaded code (Boost.Asio on its own thread), under a live
#          search.
#
# Usage: scripts/sanitize.sh [asan|fuzz|tsan]...  (default: all three, in that order).
# Every finding fails the stage: a sanitizer report ends the program with a non-zero status, and
# the test fails on it. Nothing is suppressed. Two settings are not suppressions:
#   allocator_may_return_null=1  malloc returns NULL when it cannot allocate, as C says, instead of
#                                ASan aborting: the backend turns that NULL into `oom`
#                                (BackendMemoryUnbudgeted.AllocatorRefusalIsOomNotAnAbort).
#   detect_leaks=0 for processes that start MPI: Open MPI does not free what MPI_Init allocates
#                  (every leak reported there is inside MPI_Init, hwloc or an MCA plugin).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
stages=("$@")
if ((${#stages[@]} == 0)); then stages=(asan fuzz tsan); fi
jobs=$(nproc)
export OMP_NUM_THREADS=1
export CC=${AUTOPAR_SANITIZE_CC:-clang-14} CXX=${AUTOPAR_SANITIZE_CXX:-clang++-14}
asan_options=allocator_may_return_null=1:check_initialization_order=1:strict_init_order=1
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:$asan_options}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}
werror=OFF
if [[ -n ${CI:-} ]]; then werror=ON; fi

# configure <dir> <cmake args>...: -O1 with line tables, which keeps reports readable and the
# build and the tests quick on two cores.
configure() {
  local dir=$1
  shift
  mkdir -p "$dir"
  cmake -S "$root" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" \
    -DAUTOPAR_CUDA=OFF -DAUTOPAR_WERROR=$werror "$@" >"$dir/configure.log" 2>&1 ||
    { cat "$dir/configure.log"; exit 1; }
}

timed() {
  local name=$1 start=$SECONDS
  shift
  "$@"
  echo "sanitize.sh: stage $name took $((SECONDS - start)) s"
}

# Tests the asan stage leaves out, each 4 to over 15 minutes under ASan+UBSan on two cores:
# planning at scale (HF families on up to 128 GPUs, NVL72 racks, every planned flag line) and the
# crash-and-resume loop that restarts the tuner 20 times. The normal build runs them; the smaller
# planning, journal and resume tests run the same code under ASan.
asan_slow='^(Cli\.TodaysHuggingFaceFamiliesPlan|Cli\.Nvl72RacksRankTensorParallelAcrossTraysOnNvlink'
asan_slow+='|MegatronFlags\.PlannedLinesUseOnlyTableFlags|fault_resume_after_sigkill)$'
# Tests whose processes start MPI: run with detect_leaks=0 (above).
asan_mpi='^(cli_tune_exit_codes_and_outputs|launcher_relaunches_after_a_killed_worker|trial_cli_np4)$'

asan() {
  local dir=$root/build-asan
  configure "$dir" -DAUTOPAR_SANITIZE=address,undefined -DAUTOPAR_LIBFUZZER=ON -DAUTOPAR_TRIALS=ON
  cmake --build "$dir" -j"$jobs"
  (cd "$dir" &&
     ctest -L '^(unit|fault)$' -E "$asan_slow|$asan_mpi" --output-on-failure -j"$jobs" \
       --timeout 900 &&
     ASAN_OPTIONS=detect_leaks=0:$asan_options ctest -R "$asan_mpi" --output-on-failure \
       --timeout 900)
}

fuzz() {
  local dir=$root/build-asan seconds=${AUTOPAR_FUZZ_SECONDS:-40} target name log runs
  local work=$dir/fuzz-run
  rm -rf "$work"
  mkdir -p "$work"
  for target in "$dir"/tests/bin/fuzz_*; do
    name=${target##*/fuzz_}
    mkdir -p "$work/$name"
    log=$work/$name.log
    seeds=("$root/tests/fuzz/corpus/$name")
    # The Megatron scripts of the test data are seeds too, read where they are.
    if [[ $name == megatron_flags ]]; then seeds+=("$root/tests/data/spec"); fi
    if ! "$target" -seed=1 -max_total_time="$seconds" -max_len=16384 -timeout=25 \
         -artifact_prefix="$work/$name-" "$work/$name" "${seeds[@]}" >"$log" 2>&1; then
      tail -n 60 "$log"
      echo "sanitize.sh: fuzz target $name failed; the input is under $work/$name-*"
      exit 1
    fi
    runs=$(sed -n 's/^Done \([0-9]*\) runs in \([0-9]*\) second.*/\1 executions in \2 s/p' "$log")
    echo "sanitize.sh: fuzz $name: ${runs:-?}, corpus $(ls "$work/$name" | wc -l) new inputs"
  done
}

tsan() {
  local dir=$root/build-tsan
  configure "$dir" -DAUTOPAR_SANITIZE=thread -DAUTOPAR_TRIALS=OFF
  cmake --build "$dir" -j"$jobs"
  (cd "$dir" && ctest -L '^unit$' -E "$asan_slow" --output-on-failure -j"$jobs" --timeout 900)
  # Its CTest entry allows 300 s for 3000 trials, which the search under ThreadSanitizer exceeds;
  # 300 trials still give thousands of reads while the search writes the board.
  timeout 900 python3 "$root/tests/fault/status_server_test.py" --bin "$dir/autopar-tune" \
    --work "$dir/tests/fault/status-tsan" --max-trials 300
}

for stage in "${stages[@]}"; do
  case $stage in
    asan | fuzz | tsan) timed "$stage" "$stage" ;;
    *) echo "sanitize.sh: unknown stage '$stage' (asan, fuzz, tsan)"; exit 2 ;;
  esac
done
