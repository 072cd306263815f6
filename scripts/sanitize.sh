#!/usr/bin/env bash
# The sanitizer stages of CI (docs/testing.md §1–§3), run by scripts/test.sh after the normal
# build and tests. Each builds, into its own directory with clang and the CUDA platform off, only
# the targets it runs:
#
#   asan   build-asan: AddressSanitizer + UndefinedBehaviorSanitizer (-fno-sanitize-recover) with
#          libFuzzer's coverage, trials on. Builds the unit-test binaries, autopar-tune and the
#          fuzz targets (not distributed_test); runs the unit tests of those binaries and the
#          fault tests, but the slow ones below, and the stalled-rank trial under mpirun.
#   fuzz   the same build's tests/fuzz targets (libFuzzer), each for $AUTOPAR_FUZZ_SECONDS
#          (default 25) on a scratch corpus plus its seeds; prints the executions per target.
#   tsan   build-tsan: ThreadSanitizer with AUTOPAR_TRIALS=OFF. Builds coord_test and
#          autopar-tune; runs coord_test (the coordinator: journal, protocol, replay, tuner and
#          the status server, the only threaded code: Boost.Asio on its own thread) and the
#          status server under a live search.
#
# Usage: scripts/sanitize.sh [asan|fuzz|tsan]...  (default: all three, in that order).
# Every finding fails the stage: a sanitizer report ends the program with a non-zero status, and
# the test fails on it. Nothing is suppressed. Two settings are not suppressions:
#   allocator_may_return_null=1  malloc returns NULL when it cannot allocate, as C says, instead of
#                                ASan aborting: the device turns that NULL into `oom`
#                                (DeviceMemoryUnbudgeted.AllocatorRefusalIsOomNotAnAbort).
#   detect_leaks=0 for processes that start MPI: Open MPI does not free what MPI_Init allocates
#                  (every leak reported there is inside MPI_Init, hwloc or an MCA plugin).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
stages=("$@")
if ((${#stages[@]} == 0)); then stages=(asan fuzz tsan); fi
jobs=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)  # nproc honours both
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

# step <what> <command>...: runs a part of a stage and prints how long it took.
step() {
  local what=$1 start=$SECONDS
  shift
  "$@"
  echo "sanitize.sh: $what took $((SECONDS - start)) s"
}

# The unit-test binaries the asan stage builds: every one of tests/CMakeLists.txt with trials on
# and CUDA off. One missing here is not silently skipped: its ctest entry <name>_NOT_BUILT fails.
asan_unit_binaries=(spec_test space_test perf_test search_test coord_test cli_test device_test
                    trial_test)
# The fuzz targets: one per seed directory (tests/fuzz/CMakeLists.txt: fuzz_<name>, seeds in
# corpus/<name>/).
mapfile -t fuzz_targets < <(cd "$root/tests/fuzz/corpus" && ls -d -- */ | tr -d /)

# Tests the asan stage leaves out, each 4 to over 15 minutes under ASan+UBSan on two cores:
# planning at scale (HF families on up to 128 GPUs, NVL72 racks, every planned flag line), the
# crash-and-resume loop that restarts the tuner 20 times, and the status server's two searches
# of 1500 and twice 3000 trials (past the 300 s limit each had). The normal build runs them; the
# smaller planning, journal and resume tests and coord_test's status-server suites run the same code
# under ASan, and the tsan stage the status-server search with 150 trials.
asan_slow='Cli\.TodaysHuggingFaceFamiliesPlan|Cli\.Nvl72RacksRankTensorParallelAcrossTraysOnNvlink'
asan_slow+='|MegatronFlags\.PlannedLinesUseOnlyTableFlags|fault_resume_after_sigkill'
asan_slow+='|status_server_during_search|status_flood_leaves_the_results_written'
# unit and fault entries that run no instrumented code of ours (Python checks of the scripts and
# the tree, the install test, gpu_check.sh without a GPU), and the fuzz targets' seed runs, which
# the fuzz stage repeats on the same seeds for longer. The normal build runs them all.
asan_not_ours='test_sources_are_declared|gpu_check_report_verdicts|gpu_skips_are_reported_as_skipped'
asan_not_ours+='|check_megatron_flags_reads_a_checkout|autopar_train_replaces_parallel_flags'
asan_not_ours+='|bench_accuracy_statistics|bench_search_configuration_keys'
asan_not_ours+='|check_layering_module_graph|install_exports_a_cmake_package'
asan_not_ours+='|gpu_check_skips_without_a_gpu|fuzz_.*_seeds'
# Tests whose processes start MPI: run with detect_leaks=0 (above).
asan_mpi='cli_tune_exit_codes_and_outputs|launcher_relaunches_after_a_killed_worker|trial_cli_np4'
asan_mpi+='|megatron_backend_end_to_end_np4'

asan_build() {
  local dir=$root/build-asan
  configure "$dir" -DAUTOPAR_SANITIZE=address,undefined -DAUTOPAR_LIBFUZZER=ON -DAUTOPAR_TRIALS=ON
  cmake --build "$dir" -j"$jobs" --target autopar-tune "${asan_unit_binaries[@]}" \
    "${fuzz_targets[@]/#/fuzz_}"
}

asan_tests() {
  (cd "$root/build-asan" &&
     ctest -L '^(unit|fault)$' -E "^($asan_slow|$asan_not_ours|$asan_mpi)$" --output-on-failure \
       -j"$jobs" --timeout 900 &&
     ASAN_OPTIONS=detect_leaks=0:$asan_options ctest -R "^($asan_mpi)$" --output-on-failure \
       --timeout 900)
}

# status_server_search <build dir>: tests/fault/status_server_test.py, the endpoint read while a
# replay search writes the board. Its CTest entry runs a 3000-trial search twice, far too long
# under ThreadSanitizer; 150 trials still give thousands of reads during the search.
status_server_search() {
  local dir=$1
  timeout 900 python3 "$root/tests/fault/status_server_test.py" --bin "$dir/autopar-tune" \
    --work "$dir/tests/fault/status-search" --max-trials 150
}

asan() {
  step "asan: build" asan_build
  step "asan: tests" asan_tests
}

fuzz() {
  local dir=$root/build-asan seconds=${AUTOPAR_FUZZ_SECONDS:-25} target name log runs
  local work=$dir/fuzz-run
  # Nothing to do when the asan stage built them; the fuzz stage alone builds them.
  step "fuzz: build" cmake --build "$dir" -j"$jobs" --target "${fuzz_targets[@]/#/fuzz_}"
  rm -rf "$work"
  mkdir -p "$work"
  for name in "${fuzz_targets[@]}"; do
    target=$dir/tests/bin/fuzz_$name
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
    if [[ -z $runs ]]; then
      tail -n 20 "$log"
      echo "sanitize.sh: fuzz target $name printed no 'Done N runs' line"
      exit 1
    fi
    echo "sanitize.sh: fuzz $name: $runs, corpus $(ls "$work/$name" | wc -l) new inputs"
  done
}

tsan_build() {
  local dir=$root/build-tsan
  configure "$dir" -DAUTOPAR_SANITIZE=thread -DAUTOPAR_TRIALS=OFF
  cmake --build "$dir" -j"$jobs" --target coord_test autopar-tune
}

# The whole binary in one process, from where ctest would run it (tests/).
tsan_coord_test() { (cd "$root/build-tsan/tests" && ./bin/coord_test); }

tsan() {
  step "tsan: build" tsan_build
  step "tsan: coord_test" tsan_coord_test
  step "tsan: status server under a search" status_server_search "$root/build-tsan"
}

for stage in "${stages[@]}"; do
  case $stage in
    asan | fuzz | tsan) step "stage $stage" "$stage" ;;
    *) echo "sanitize.sh: unknown stage '$stage' (asan, fuzz, tsan)"; exit 2 ;;
  esac
done
