#!/usr/bin/env python3
"""scripts/check_layering.py: passes on the repository's own tree, and on made-up trees fails with
FILE:LINE and the forbidden edge for each kind of violation (a lower layer including a higher one,
another folder's private header, a banned system header, an unknown folder or include) while
passing a made-up tree whose edges all go down the graph.

usage: check_layering_test.py SOURCE_DIR
"""
import os
import subprocess
import sys
import tempfile

SOURCE_DIR = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                             os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(SOURCE_DIR, "scripts", "check_layering.py")
failures = []


def run(root):
    p = subprocess.run([sys.executable, SCRIPT, root], capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def tree(files):
    """A temporary tree holding {relative path: text}."""
    d = tempfile.TemporaryDirectory()
    for rel, text in files.items():
        path = os.path.join(d.name, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    return d


def expect(name, ok, detail):
    print(("ok   " if ok else "FAIL ") + name)
    if not ok:
        failures.append(name)
        print(detail)


# Allowed edges only: down the graph, own private headers, a header next to the file.
CLEAN = {
    "include/autopar/spec/model.h": '#include "autopar/common/errors.h"\n',
    "include/autopar/search/rng.h": '#include "autopar/perf/cost_model.h"\n',
    "include/autopar/perf/cost_model.h": '#include "autopar/space/config.h"\n',
    "include/autopar/space/config.h": '#include "autopar/spec/model.h"\n',
    "include/autopar/common/errors.h": "#include <string>\n",
    "src/spec/internal.h": "#pragma once\n",
    "src/spec/yaml.cc": '#include "internal.h"\n#include "src/spec/internal.h"\n',
    "src/coord/tuner.cc": '#include "autopar/search/rng.h"\n#include "proto/autopar.pb.h"\n'
                          "#include <google/protobuf/message.h>\n",
    "src/trial/runner.cc": '#include "autopar/device/device.h"\n#include "kernels/adam.h"\n'
                           '#include "autopar/perf/cost_model.h"\n#include <mpi.h>\n',
    "include/autopar/device/device.h": '#include "kernels/adam.h"\n',
    "kernels/adam.h": "#include <cstdint>\n",
    "kernels/cuda_adam.cu": '#include <cuda_runtime.h>\n#include "kernels/adam.h"\n',
    "src/cli/main.cc": '#include "autopar/coord/tuner.h"\n#include "autopar/trial/trial.h"\n'
                       '#include "autopar/device/device.h"\n#include <mpi.h>\n',
}

rc, out = run(SOURCE_DIR)
expect("the repository's tree passes", rc == 0, out)

with tree(CLEAN) as root:
    rc, out = run(root)
    expect("a made-up tree of allowed edges passes", rc == 0 and "0 forbidden" in out, out)

# Each violation alone on top of the clean tree: (name, extra files, what the output must say).
VIOLATIONS = [
    ("a lower layer includes a higher one",
     {"src/spec/presets.cc": '// x\n#include "autopar/search/rng.h"\n'},
     "src/spec/presets.cc:2: spec -> search"),
    ("a public header includes a higher layer",
     {"include/autopar/space/space.h": '#include "autopar/perf/cost_model.h"\n'},
     "include/autopar/space/space.h:1: space -> perf"),
    ("coord includes the trial runner",
     {"src/coord/replay.cc": '#include "autopar/trial/trial.h"\n'},
     "src/coord/replay.cc:1: coord -> trial"),
    ("the device layer includes the coordinator",
     {"src/device/device.cc": '\n\n#include "autopar/coord/backend.h"\n'},
     "src/device/device.cc:3: device -> coord"),
    ("the kernels include the device layer",
     {"kernels/norms.cc": '#include "autopar/device/device.h"\n'},
     "kernels/norms.cc:1: kernels -> device"),
    ("another folder's private header",
     {"src/trial/probe.cc": '#include "src/cli/rank_worker.h"\n'},
     "src/trial/probe.cc:1: trial -> cli"),
    ("a relative include reaching into another folder",
     {"src/perf/rank.cc": '#include "../spec/internal.h"\n'},
     "src/perf/rank.cc:1: perf -> spec"),
    ("the core includes MPI",
     {"src/perf/time_model.cc": "#include <mpi.h>\n"},
     "src/perf/time_model.cc:1: perf must not include <mpi.h>"),
    ("the core includes protobuf",
     {"src/search/state.cc": "#include <google/protobuf/message.h>\n"},
     "src/search/state.cc:1: search must not include <google/protobuf/message.h>"),
    ("coord includes MPI",
     {"src/coord/channel.cc": "  #  include <mpi.h>\n"},
     "src/coord/channel.cc:1: coord must not include <mpi.h>"),
    ("a host kernel includes CUDA",
     {"kernels/gemm.cc": "#include <cuda_runtime.h>\n"},
     "kernels/gemm.cc:1: kernels must not include <cuda_runtime.h>"),
    ("a folder missing from the graph",
     {"src/newthing/a.cc": "#include <string>\n"},
     "folder 'newthing' is not in LAYERS"),
    ("an include that names no module",
     {"src/space/space.cc": '#include "nowhere/x.h"\n'},
     'src/space/space.cc:1: #include "nowhere/x.h" names no known module'),
]
for name, extra, wanted in VIOLATIONS:
    with tree({**CLEAN, **extra}) as root:
        rc, out = run(root)
        expect(name, rc == 1 and wanted in out and "1 forbidden" in out,
               f"rc={rc}, wanted {wanted!r} in:\n{out}")

print(f"{len(failures)} failures")
sys.exit(1 if failures else 0)
