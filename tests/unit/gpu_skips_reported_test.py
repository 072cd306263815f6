#!/usr/bin/env python3
"""Every gpu-labelled ctest entry reports a run without GPUs as skipped, not passed.

scripts/gpu_check.sh counts `ctest -L gpu` results (gpu_check_report.py: "none failed, more run
than skipped"). A GoogleTest binary whose cases all GTEST_SKIP exits 0, so an entry launched
through mpirun (one process per rank, not discovered case by case) is "passed" to ctest unless
its SKIP_REGULAR_EXPRESSION matches the skip message; then a 1-GPU machine would report the
2- and 4-GPU entries as passed although nothing ran. gtest_discover_tests sets the property on
the cases it adds; the mpirun entries need it set by hand (tests/gpu/CMakeLists.txt).

usage: gpu_skips_reported_test.py CTEST BUILD_DIR   (a build without CUDA has no gpu entries)
"""
import json
import subprocess
import sys


def main(ctest, build_dir):
    out = subprocess.run([ctest, "--show-only=json-v1", "-L", "^gpu$"], cwd=build_dir,
                         check=True, capture_output=True, text=True).stdout
    problems = []
    for test in json.loads(out).get("tests", []):
        props = {p["name"]: p["value"] for p in test.get("properties", [])}
        if not props.get("SKIP_REGULAR_EXPRESSION"):
            problems.append(f"{test['name']}: gpu-labelled, but no SKIP_REGULAR_EXPRESSION: a run "
                            "that skipped for want of GPUs would count as passed")
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
