#!/usr/bin/env python3
"""The test layout (tests/CMakeLists.txt): every test source under tests/ is named in the
CMakeLists.txt that declares it, so none is silently left out of the build, and no two test
sources share a file name.

usage: test_layout_test.py SOURCE_DIR
"""
import os
import re
import sys
from collections import defaultdict

# Where each folder's test sources must be named: a file `unit/x_test.cc` must appear, as that
# relative path, in tests/CMakeLists.txt; a file in tests/gpu/ by its own name in tests/gpu/....
DECLARED_IN = {
    "unit": ("CMakeLists.txt", "unit/{name}"),
    "distributed": ("distributed/CMakeLists.txt", "{name}"),
    "gpu": ("gpu/CMakeLists.txt", "{name}"),
    "fault": ("fault/CMakeLists.txt", "{name}"),
    "fuzz": ("fuzz/CMakeLists.txt", "{name}"),
}
# Test sources: C++ files and the scripts ctest runs (headers are included, not declared).
SOURCE = re.compile(r".*\.(cc|py|sh)$")


def main(source_dir):
    tests = os.path.join(source_dir, "tests")
    problems = []
    by_name = defaultdict(list)
    for folder, (cmake, pattern) in DECLARED_IN.items():
        with open(os.path.join(tests, cmake)) as f:
            # Comments may mention a file that is not declared; only code counts.
            code = "\n".join(line.split("#", 1)[0] for line in f)
        for name in sorted(os.listdir(os.path.join(tests, folder))):
            if not SOURCE.match(name):
                continue
            by_name[name].append(f"{folder}/{name}")
            wanted = pattern.format(name=name)
            if not re.search(r"(^|[\s/}])" + re.escape(wanted) + r"(\s|\)|$)", code, re.M):
                problems.append(f"tests/{folder}/{name} is not named in tests/{cmake}")
    for name, paths in sorted(by_name.items()):
        if len(paths) > 1:
            problems.append(f"{name} is the name of several test files: {', '.join(paths)}")
    for p in problems:
        print("FAIL:", p)
    print(f"{sum(len(p) for p in by_name.values())} test sources, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else
                  os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")))
