#!/usr/bin/env python3
"""The module graph of docs/architecture.md §2, checked on the sources: every `#include "..."` in
src/, include/ and kernels/ must go from a folder to itself or to a folder below it, and the pure
core must not include MPI, CUDA or protobuf headers.

    spec -> space -> perf -> search          the pure core (and common, the header-only base)
    kernels <- device <- trial               trial also reads the core's specs and cost model
    proto <- coord                           coord sits on search; no MPI, no devices
    cli                                      on top of everything

A file's folder is its module: src/<m>/..., include/autopar/<m>/..., kernels/...; a header
directly under include/autopar/ (generated ones, e.g. version.h) belongs to common. An include
"autopar/<m>/x.h" or "src/<m>/x.h" names module m, "kernels/x.h" kernels, "proto/x.h" proto, a
bare "x.h" a file next to the includer. A folder's private headers (src/<m>/) are for that folder
alone. An include that names no known module, or a folder missing from LAYERS, is an error too,
so a new folder has to be placed in the graph here (and in docs/architecture.md §2).

usage: check_layering.py [ROOT]     ROOT defaults to the repository this script is in.
Exit 0 when every edge is allowed; 1 with one line per forbidden edge, as FILE:LINE: ....
"""
import os
import re
import sys

CORE = {"common", "spec", "space", "perf", "search"}
# The modules each module may include (besides itself).
LAYERS = {
    "common": set(),
    "spec": {"common"},
    "space": {"common", "spec"},
    "perf": {"common", "spec", "space"},
    "search": {"common", "spec", "space", "perf"},
    "kernels": set(),
    # device and trial report failures as device::Status values, never InputError
    # (architecture.md §5), so common is not theirs.
    "device": {"kernels"},
    "trial": {"device", "kernels", "spec", "space", "perf"},
    "proto": set(),
    "coord": {"common", "spec", "space", "perf", "search", "proto"},
    "cli": {"common", "spec", "space", "perf", "search", "kernels", "device", "trial", "proto",
            "coord"},
}
# System headers a module must not include: the core builds and tests without MPI, CUDA and
# protobuf; coord has no MPI (its MPI channel lives in cli); the host kernels (kernels/*.cc, *.h)
# are plain C++, their CUDA twins are *.cu and *.cuh.
MPI = r"mpi\.h"
CUDA = r"(cuda\w*\.h|cuda/.*|cublas\w*\.h|cudnn\w*\.h|nccl\.h)"
PROTOBUF = r"google/protobuf/.*"
FORBIDDEN_SYSTEM = {m: [MPI, CUDA, PROTOBUF] for m in CORE}
FORBIDDEN_SYSTEM["coord"] = [MPI, CUDA]
FORBIDDEN_SYSTEM["kernels_host"] = [MPI, CUDA, PROTOBUF]

INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
SOURCES = re.compile(r".*\.(cc|h|cu|cuh)$")


def module_of_file(rel):
    """The module of a source file given relative to the root, or None if it has none."""
    parts = rel.split("/")
    if parts[0] == "src" and len(parts) > 2:
        return parts[1]
    if parts[0] == "include" and len(parts) > 2 and parts[1] == "autopar":
        return parts[2] if len(parts) > 3 else "common"
    if parts[0] == "kernels":
        return "kernels"
    return None


def module_of_include(path, includer_rel, root):
    """(module, private) of a quoted include; module None when it names nothing known."""
    parts = path.split("/")
    if parts[0] == "autopar":
        return (parts[1] if len(parts) > 2 else "common"), False
    if parts[0] == "src" and len(parts) > 2:
        return parts[1], True
    if parts[0] in ("kernels", "proto"):
        return parts[0], False
    here = os.path.dirname(includer_rel)
    if os.path.exists(os.path.join(root, here, path)):
        rel = os.path.normpath(os.path.join(here, path))
        return module_of_file(rel), rel.startswith("src/")
    return None, False


def check_file(root, rel, problems):
    mod = module_of_file(rel)
    if mod not in LAYERS:
        problems.append(f"{rel}:1: folder '{mod}' is not in LAYERS of scripts/check_layering.py "
                        "(place it in the module graph, docs/architecture.md §2)")
        return
    allowed = LAYERS[mod]
    system_rules = FORBIDDEN_SYSTEM.get(mod, [])
    if mod == "kernels" and not rel.endswith((".cu", ".cuh")):
        system_rules = FORBIDDEN_SYSTEM["kernels_host"]
    with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            kind, path = m.groups()
            where = f"{rel}:{lineno}"
            if kind == "<":
                for rule in system_rules:
                    if re.fullmatch(rule, path):
                        problems.append(f"{where}: {mod} must not include <{path}> "
                                        f"(no MPI/CUDA/protobuf below their layer)")
                continue
            target, private = module_of_include(path, rel, root)
            if target is None:
                problems.append(f'{where}: #include "{path}" names no known module')
            elif target == mod:
                continue
            elif private:
                problems.append(f'{where}: {mod} -> {target}: #include "{path}" is private to '
                                f"src/{target}/")
            elif target not in allowed:
                problems.append(f'{where}: {mod} -> {target}: #include "{path}" goes up the '
                                f"module graph ({mod} may include "
                                f"{', '.join(sorted(allowed)) or 'nothing else'})")


def main(root):
    problems = []
    count = 0
    for top in ("src", "include", "kernels"):
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames.sort()
            for name in sorted(filenames):
                if SOURCES.match(name):
                    rel = os.path.relpath(os.path.join(dirpath, name), root)
                    check_file(root, rel, problems)
                    count += 1
    for p in problems:
        print(p)
    print(f"check_layering.py: {count} files, {len(problems)} forbidden includes")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else
                  os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")))
