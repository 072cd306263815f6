#!/usr/bin/env python3
"""A GPU check that travels: the CUDA build's gpu-labelled tests, benchmark and autopar-tune, with
the shared libraries a bare GPU machine lacks, in one folder that scripts/gpu_check.sh runs.

  gpu_bundle.py make BUILD_DIR OUT_DIR [--archive]   on the build machine (--archive: OUT_DIR.tar.gz)
  gpu_bundle.py run OUT_DIR WORK --gpus N [--kind gpu|bench] [--timeout S] [--budget-s S]
                                                     on the GPU machine (gpu_check.sh OUT_DIR does)
  gpu_bundle.py env OUT_DIR                          the environment to run the bundle's programs

Why: a GPU machine without a network or the build's packages (Open MPI, protobuf, yaml-cpp, a C++
toolchain, cmake) cannot build the project, yet it has the driver and, through a CUDA toolkit or
the NVIDIA Python wheels (nvidia-cudnn-*, nvidia-nccl-*, nvidia-cublas-*), the GPU libraries.

`make` takes the tests by their ctest label, as gpu_check.sh does on a build tree (`ctest -L
'^gpu$'`, the `bench` entries among them): each entry's program (the one mpiexec launches), its
arguments, ranks, environment and skip expression go into OUT_DIR/tests.json and the programs,
stripped of debug information, into OUT_DIR/bin beside autopar-tune. Every shared library they load
goes into OUT_DIR/lib, except the C/C++ runtime (every Linux machine has it) and the CUDA libraries
(the GPU machine's own must match its driver: `run` finds them). Open MPI's plug-ins (its MCA
components and PMIx's) go into OUT_DIR/openmpi and OUT_DIR/pmix with their libraries.

`run` executes every entry whose ranks fit the GPUs: one rank as an MPI singleton (no launcher
needed), more through mpirun when the machine has one (else the entry is reported not run). It
writes ctest_gpu.xml and ctest_bench.xml (JUnit, as `ctest --output-junit`; an entry is skipped when
its output matches its skip expression, as ctest decides) and the benchmark's JSON into WORK, which
is what scripts/gpu_check_report.py reads. It prints the environment gpu_check.sh then uses for the
trials (`env` subcommand). `--kind` runs only the gpu or only the bench entries (and writes only
that report); `--timeout` bounds each entry and `--budget-s` the whole run: an entry gets what is
left of the budget at most, and once it is spent the remaining entries are reported failed, not
run, so one hang cannot spend a device session's time.
"""
import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

# Loaded from the machine itself, never carried: the C and C++ runtime and the loader.
SYSTEM_LIBS = re.compile(r"^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libstdc\+\+|"
                         r"libgcc_s|libresolv|libutil)[.-]")
# The GPU machine's own, matched to its driver.
CUDA_LIBS = re.compile(r"^(libcuda|libcudart|libcublas|libcublasLt|libnccl|libcudnn[a-z_]*|"
                       r"libnvrtc|libnvJitLink|libnvidia-ml)[.-]")
# What the CUDA build links and `run` must find on the GPU machine.
CUDA_NEEDED = ["libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13", "libnccl.so.2",
               "libcudnn.so.9"]
LAUNCHERS = {"mpiexec", "mpirun", "orterun"}


def fail(message):
    print(f"gpu_bundle: {message}", file=sys.stderr)
    sys.exit(1)


def ctest_entries(build):
    """The gpu-labelled ctest entries of BUILD: name, program, args, ranks, env, labels, skip."""
    try:
        shown = subprocess.run(["ctest", "-N", "-L", "^gpu$", "--show-only=json-v1"], cwd=build,
                               check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as error:
        fail(f"ctest -N -L gpu in {build}: {error}")
    entries = []
    for test in json.loads(shown).get("tests", []):
        props = {p["name"]: p["value"] for p in test.get("properties", [])}
        command = list(test.get("command") or [])
        ranks = 1
        if command and os.path.basename(command[0]) in LAUNCHERS:
            # mpiexec -n R [its options] PROGRAM ARGS: the program is the first argument under BUILD.
            ranks = int(command[command.index("-n") + 1])
            first = next(i for i, arg in enumerate(command)
                         if os.path.isabs(arg) and arg.startswith(os.path.realpath(build)))
            command = command[first:]
        skip = props.get("SKIP_REGULAR_EXPRESSION") or []
        entries.append({
            "name": test["name"], "program": command[0], "args": command[1:], "ranks": ranks,
            "env": props.get("ENVIRONMENT") or [], "labels": props.get("LABELS") or [],
            "skip": skip if isinstance(skip, list) else [skip]})
    if not entries:
        fail(f"{build} has no gpu-labelled tests (configured without CUDA and NCCL?)")
    return entries


def shared_libs(path, missing_ok=False):
    """soname -> resolved path of every library `path` loads (ldd). One this machine cannot find
    fails, or with `missing_ok` is left out (plug-ins for fabrics absent here, skipped there too)."""
    out = subprocess.run(["ldd", path], check=not missing_ok, capture_output=True, text=True).stdout
    libs = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1] == "=>":
            if parts[2] == "not":
                if missing_ok:
                    continue
                fail(f"{path} needs {parts[0]}, which this machine cannot find")
            libs[parts[0]] = parts[2]
    return libs


def carry_libs(paths, lib_dir, carried, missing_ok=False):
    """Copies the libraries `paths` load, less the system's, CUDA's and those in `carried`, into
    lib_dir, adding them to `carried`."""
    for path in paths:
        for soname, resolved in shared_libs(path, missing_ok).items():
            if SYSTEM_LIBS.match(soname) or CUDA_LIBS.match(soname) or soname in carried:
                continue
            shutil.copy2(os.path.realpath(resolved), os.path.join(lib_dir, soname))
            carried[soname] = resolved


def open_mpi_plugin_dirs():
    """(Open MPI's MCA component folder, PMIx's) on this machine."""
    try:
        info = subprocess.run(["ompi_info", "--path", "pkglibdir"], check=True,
                              capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as error:
        fail(f"ompi_info --path pkglibdir: {error}")
    ompi = info.split(":", 1)[1].strip()
    pmix = [d for d in glob.glob("/usr/lib/*/pmix*/lib/pmix") + glob.glob("/usr/lib*/pmix*/lib/pmix")
            if os.path.isdir(d)]
    return ompi, (pmix[0] if pmix else None)


def make(args):
    build, out = os.path.realpath(args.build), os.path.realpath(args.out)
    entries = ctest_entries(build)
    tune = os.path.join(build, "autopar-tune")
    if not os.access(tune, os.X_OK):
        fail(f"{tune} is missing: build first")
    shutil.rmtree(out, ignore_errors=True)
    for sub in ("bin", "lib"):
        os.makedirs(os.path.join(out, sub))
    programs = sorted({e["program"] for e in entries} | {tune})
    for program in programs:
        target = os.path.join(out, "bin", os.path.basename(program))
        subprocess.run(["strip", "--strip-debug", "-o", target, program], check=True)
    for entry in entries:
        entry["program"] = os.path.basename(entry["program"])
    carried = {}
    carry_libs(programs, os.path.join(out, "lib"), carried)
    ompi, pmix = open_mpi_plugin_dirs()
    plugin_libs = []
    for source, name in ((ompi, "openmpi"), (pmix, "pmix")):
        if source is None:
            continue
        shutil.copytree(source, os.path.join(out, name), symlinks=False)
        plugin_libs += glob.glob(os.path.join(out, name, "**", "*.so"), recursive=True)
    carry_libs(plugin_libs, os.path.join(out, "lib"), carried, missing_ok=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=os.path.dirname(__file__),
                            capture_output=True, text=True).stdout.strip()
    with open(os.path.join(out, "tests.json"), "w") as f:
        json.dump({"commit": commit, "build": build, "tests": entries,
                   "libs": sorted(carried), "cuda_needed": CUDA_NEEDED}, f, indent=1)
    size = sum(os.path.getsize(p) for p in glob.glob(os.path.join(out, "**"), recursive=True)
               if os.path.isfile(p))
    print(f"gpu_bundle: {out}: {len(entries)} gpu-labelled entries, {len(programs)} programs, "
          f"{len(carried)} libraries, {size / 2**20:.1f} MiB (commit {commit[:12]})")
    if args.archive:
        archive = out + ".tar.gz"
        subprocess.run(["tar", "-czf", archive, "-C", os.path.dirname(out),
                        os.path.basename(out)], check=True)
        print(f"gpu_bundle: {archive}: {os.path.getsize(archive) / 2**20:.1f} MiB")


def find_cuda_libs(needed):
    """The folders holding each of `needed` on this machine: $AUTOPAR_CUDA_LIB_DIRS (':'-separated)
    first, then CUDA toolkits, the system's, and the NVIDIA Python wheels (site-packages/nvidia/*/lib
    of this Python and of environments under /opt and /usr)."""
    import site
    wheels = [os.path.join(p, "nvidia", "*", "lib") for p in site.getsitepackages()]
    wheels += ["/opt/*/lib/python3*/*-packages/nvidia/*/lib",
               "/opt/*/.venv/lib/python3*/*-packages/nvidia/*/lib",
               "/opt/*/*/lib/python3*/*-packages/nvidia/*/lib",
               "/usr/local/lib/python3*/*-packages/nvidia/*/lib",
               "/usr/lib/python3*/*-packages/nvidia/*/lib"]
    roots = [d for d in os.environ.get("AUTOPAR_CUDA_LIB_DIRS", "").split(":") if d]
    for pattern in ["/usr/local/cuda*/lib*", "/usr/local/cuda*/targets/*/lib",
                    "/usr/lib/x86_64-linux-gnu", "/usr/lib64"] + wheels:
        roots += sorted(glob.glob(pattern))
    found, missing = [], []
    for lib in needed:
        where = next((r for r in roots if os.path.exists(os.path.join(r, lib))), None)
        if where is None:
            missing.append(lib)
        elif where not in found:
            found.append(where)
    return found, missing


def environment(bundle):
    """The environment the bundle's programs run in (without a launcher for one rank)."""
    with open(os.path.join(bundle, "tests.json")) as f:
        manifest = json.load(f)
    cuda_dirs, missing = find_cuda_libs(manifest["cuda_needed"])
    if missing:
        fail("this machine lacks " + ", ".join(missing) + " (a CUDA 13 toolkit, or the NVIDIA "
             "Python wheels for cuDNN 9, NCCL 2 and cuBLAS 13)")
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = ":".join(
        [os.path.join(bundle, "lib")] + cuda_dirs + [p for p in env.get(
            "LD_LIBRARY_PATH", "").split(":") if p])
    # Open MPI and PMIx find their plug-ins in the bundle; a rank alone needs no daemon.
    env["OMPI_MCA_mca_base_component_path"] = os.path.join(bundle, "openmpi")
    env["PMIX_MCA_mca_base_component_path"] = os.path.join(bundle, "pmix")
    env["OMPI_MCA_ess_singleton_isolated"] = "1"
    env["OMPI_MCA_mca_base_component_show_load_errors"] = "0"
    env["OMP_NUM_THREADS"] = "1"
    return manifest, env


def junit(path, cases):
    """Writes `cases` [(name, verdict, text)] as a ctest-style JUnit file."""
    suite = ET.Element("testsuite", name="gpu_bundle", tests=str(len(cases)))
    for name, verdict, text in cases:
        case = ET.SubElement(suite, "testcase", name=name,
                             status={"passed": "run", "failed": "fail", "skipped": "notrun"}[verdict])
        if verdict == "failed":
            ET.SubElement(case, "failure", message="failed").text = text[-4000:]
        elif verdict == "skipped":
            ET.SubElement(case, "skipped", message=text[-400:])
        ET.SubElement(case, "system-out").text = text[-4000:]
    ET.ElementTree(suite).write(path, encoding="unicode")


def entry_timeout(per_entry_s, budget_s, elapsed_s):
    """The seconds an entry may run: `per_entry_s`, capped by what is left of `budget_s` (0: no
    budget) after `elapsed_s`; 0 when the budget is spent."""
    if budget_s <= 0:
        return per_entry_s
    return max(0, min(per_entry_s, int(budget_s - elapsed_s)))


def run(args):
    bundle, work = os.path.realpath(args.bundle), os.path.realpath(args.work)
    manifest, env = environment(bundle)
    os.makedirs(work, exist_ok=True)
    launcher = shutil.which("mpirun")
    kinds = [args.kind] if args.kind else ["gpu", "bench"]
    results = {kind: [] for kind in kinds}
    started = time.monotonic()
    for entry in manifest["tests"]:
        kind = "bench" if "bench" in entry["labels"] else "gpu"
        if kind not in results:
            continue
        argv = [os.path.join(bundle, "bin", entry["program"])] + entry["args"]
        entry_env = dict(env, **dict(e.split("=", 1) for e in entry["env"]))
        entry_env["AUTOPAR_GPU_BENCH_DIR"] = work
        if entry["ranks"] > args.gpus:
            results[kind].append((entry["name"], "skipped",
                                  f"needs {entry['ranks']} GPUs, the machine has {args.gpus}"))
            continue
        if entry["ranks"] > 1:
            if launcher is None:
                results[kind].append((entry["name"], "skipped",
                                      f"not run: {entry['ranks']} ranks need mpirun, absent here"))
                continue
            argv = [launcher, "-n", str(entry["ranks"]), "--oversubscribe", "--allow-run-as-root",
                    "-x", "LD_LIBRARY_PATH", "-x", "OMP_NUM_THREADS"] + argv
        timeout = entry_timeout(args.timeout, args.budget_s, time.monotonic() - started)
        if timeout <= 0:
            results[kind].append((entry["name"], "failed",
                                  f"not run: the time budget (--budget-s {args.budget_s}) was spent"))
            print(f"== {entry['name']}: not run, the time budget is spent", flush=True)
            continue
        print(f"== {entry['name']} (at most {timeout} s)", flush=True)
        try:
            done = subprocess.run(argv, env=entry_env, capture_output=True, text=True,
                                  timeout=timeout)
            text, code = done.stdout + done.stderr, done.returncode
        except subprocess.TimeoutExpired as expired:
            text = f"timed out after {timeout} s\n" + str(expired.stdout or "")
            code = -1
        print(text[-3000:], flush=True)
        if any(re.search(expr, text) for expr in entry["skip"]) and code == 0:
            verdict = "skipped"
        else:
            verdict = "passed" if code == 0 else "failed"
        results[kind].append((entry["name"], verdict, text))
    for kind, cases in results.items():
        junit(os.path.join(work, f"ctest_{kind}.xml"), cases)
    for kind, cases in results.items():
        counts = {v: sum(1 for c in cases if c[1] == v) for v in ("passed", "failed", "skipped")}
        print(f"gpu_bundle: {kind}: {counts}")


def print_env(args):
    _, env = environment(os.path.realpath(args.bundle))
    for key in ("LD_LIBRARY_PATH", "OMPI_MCA_mca_base_component_path",
                "PMIX_MCA_mca_base_component_path", "OMPI_MCA_ess_singleton_isolated",
                "OMPI_MCA_mca_base_component_show_load_errors", "OMP_NUM_THREADS"):
        print(f"export {key}='{env[key]}'")


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("make")
    p.add_argument("build")
    p.add_argument("out")
    p.add_argument("--archive", action="store_true", help="also OUT.tar.gz, for a transfer")
    p.set_defaults(func=make)
    p = sub.add_parser("run")
    p.add_argument("bundle")
    p.add_argument("work")
    p.add_argument("--gpus", type=int, required=True)
    p.add_argument("--kind", choices=("gpu", "bench"), help="only these entries (default: all)")
    p.add_argument("--timeout", type=int, default=900, help="seconds per entry at most")
    p.add_argument("--budget-s", type=int, default=0, help="seconds for the whole run (0: none)")
    p.set_defaults(func=run)
    p = sub.add_parser("env")
    p.add_argument("bundle")
    p.set_defaults(func=print_env)
    args = parser.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main(sys.argv[1:])
