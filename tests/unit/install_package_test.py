#!/usr/bin/env python3
"""`cmake --install` and the exported package (cmake/install.cmake): installs the build into a
scratch prefix, checks the binary, the launchers and the headers are there, runs the installed
binary from another directory (its GPU presets are compiled in; `--version` is project()'s), and
configures, builds and runs a tiny consumer project with find_package(autopar-tune) that links
autopar-tune::perf and includes the generated autopar/version.h.

usage: install_package_test.py BUILD_DIR CMAKE CXX VERSION [CXX_FLAGS]
CXX_FLAGS: the build's sanitizer flags, which a consumer of sanitized libraries must use too.
"""
import os
import subprocess
import sys
import tempfile

build_dir, cmake, cxx, version = sys.argv[1:5]
cxx_flags = sys.argv[5] if len(sys.argv) > 5 else ""
failures = []


def expect(name, ok, detail=""):
    print(("ok   " if ok else "FAIL ") + name)
    if not ok:
        failures.append(name)
        print(detail)


def run(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    return p.returncode, p.stdout + p.stderr


CONSUMER_CMAKE = """cmake_minimum_required(VERSION 3.22)
project(consumer LANGUAGES CXX)
set(CMAKE_CXX_STANDARD 20)
find_package(autopar-tune {version} CONFIG REQUIRED)
add_executable(consumer main.cc)
target_link_libraries(consumer PRIVATE autopar-tune::perf)
add_custom_target(show_executable COMMAND ${{CMAKE_COMMAND}} -E echo "exe=${{autopar-tune_EXECUTABLE}}")
"""
CONSUMER_MAIN = """#include <iostream>

#include "autopar/perf/params.h"
#include "autopar/spec/parse.h"
#include "autopar/version.h"

int main() {
  const autopar::ModelSpec m = autopar::ModelPreset("llama2-7b");
  std::cout << "version " << autopar::kVersion << "\\n";
  std::cout << "params " << autopar::CountParams(m).total() << "\\n";
  std::cout << "h100 " << autopar::GpuPreset("h100").peak_flops_bf16 << "\\n";
}
"""

with tempfile.TemporaryDirectory() as tmp:
    prefix = os.path.join(tmp, "prefix")
    rc, out = run([cmake, "--install", build_dir, "--prefix", prefix])
    expect("cmake --install succeeds", rc == 0, out)
    bin_dir = os.path.join(prefix, "bin")
    for name in ("autopar-tune", "autopar-mpirun", "autopar-train", "autopar-srun"):
        path = os.path.join(bin_dir, name)
        expect(f"bin/{name} is installed and executable", os.access(path, os.X_OK), out)
    srun = os.path.join(bin_dir, "autopar-srun")
    expect("bin/autopar-srun is a link to autopar-mpirun",
           os.path.islink(srun) and os.readlink(srun) == "autopar-mpirun")
    for rel in ("include/autopar/perf/cost_model.h", "include/autopar/spec/model.h",
                "include/autopar/common/errors.h", "include/autopar/version.h",
                "lib/cmake/autopar-tune/autopar-tuneConfig.cmake",
                "lib/cmake/autopar-tune/autopar-tuneConfigVersion.cmake"):
        expect(f"{rel} is installed", os.path.isfile(os.path.join(prefix, rel)))

    # Run from a directory with nothing of the project in it.
    elsewhere = os.path.join(tmp, "elsewhere")
    os.mkdir(elsewhere)
    tune = os.path.join(bin_dir, "autopar-tune")
    rc, out = run([tune, "--version"], cwd=elsewhere)
    expect("the installed binary prints project()'s version",
           rc == 0 and out.strip() == f"autopar-tune {version}", out)
    rc, out = run([tune, "presets"], cwd=elsewhere)
    expect("the installed binary lists the GPU presets from any directory",
           rc == 0 and "h100" in out and "gb300" in out, out)

    src = os.path.join(tmp, "consumer")
    os.mkdir(src)
    with open(os.path.join(src, "CMakeLists.txt"), "w") as f:
        f.write(CONSUMER_CMAKE.format(version=version))
    with open(os.path.join(src, "main.cc"), "w") as f:
        f.write(CONSUMER_MAIN)
    obj = os.path.join(tmp, "consumer-build")
    rc, out = run([cmake, "-S", src, "-B", obj, f"-DCMAKE_PREFIX_PATH={prefix}",
                   f"-DCMAKE_CXX_COMPILER={cxx}", f"-DCMAKE_CXX_FLAGS={cxx_flags}",
                   f"-DCMAKE_EXE_LINKER_FLAGS={cxx_flags}"])
    expect("a consumer configures with find_package(autopar-tune)", rc == 0, out)
    if rc == 0:
        rc, out = run([cmake, "--build", obj, "--target", "consumer", "show_executable"])
        expect("the consumer builds against autopar-tune::perf", rc == 0, out)
        expect("the package names the installed binary", f"exe={tune}" in out, out)
        rc, out = run([os.path.join(obj, "consumer")])
        expect("the consumer runs: version, parameter count, a preset",
               rc == 0 and f"version {version}\n" in out and "h100 9.89e+14" in out
               and "params 6738415616" in out, out)

print(f"{len(failures)} failures")
sys.exit(1 if failures else 0)
