#!/usr/bin/env python3
"""scripts/check_megatron_flags.py's reading of a Megatron-LM checkout, on a small made-up one
(argparse calls and ArgumentGroupFactory dataclasses, as a work tree and as a git directory), its
verdicts on flag lines, and its skip without a checkout.

usage: check_megatron_flags_test.py SOURCE_DIR
"""
import contextlib
import io
import os
import subprocess
import sys
import tempfile

ARGUMENTS = '''
from megatron.core.cfg import ChildConfig

def _add_args(parser):
    group = parser.add_argument_group(title='x')
    group.add_argument('--grad-reduce-in-bf16', action='store_true')
    group.add_argument('--cp-comm-type', nargs='+', type=str, default=["p2p"])
    group.add_argument('--mode', type=str, choices=['a', 'b'])
    group.add_argument('--old-name', '--new-name', type=int)
    exclude = ["hidden"]
    factory = ArgumentGroupFactory(ChildConfig, exclude=exclude)
    return parser
'''
CONFIG = '''
from dataclasses import dataclass, field
from typing import ClassVar, Literal, Optional

@dataclass
class BaseConfig:
    tensor_model_parallel_size: int = 1
    sequence_parallel: bool = False
    hierarchical_sizes: Optional[list[int]] = None

@dataclass
class ChildConfig(BaseConfig):
    add_bias: bool = True
    granularity: Optional[Literal['full', 'selective']] = None
    fp8: Optional[Literal['e4m3', 'hybrid']] = field(
        default=None, metadata={"argparse_meta": {"arg_names": ["--fp8-format"]}}
    )
    internal: int = field(default=0, init=False)
    hidden: int = 3
    counter: ClassVar[int] = 0
    size: int | None = None
'''


def write(root, rel, text):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def main(source_dir):
    sys.path.insert(0, os.path.join(source_dir, "scripts"))
    import check_megatron_flags as cmf

    problems = []

    def check(cond, what):
        if not cond:
            problems.append(what)

    with tempfile.TemporaryDirectory() as tree:
        write(tree, "megatron/training/arguments.py", ARGUMENTS)
        write(tree, "megatron/core/cfg.py", CONFIG)
        git = ["git", "-C", tree, "-c", "user.name=t", "-c", "user.email=t@t"]
        subprocess.run(git + ["init", "-q"], check=True)
        subprocess.run(git + ["add", "-A"], check=True)
        subprocess.run(git + ["commit", "-qm", "x"], check=True)
        for where in (tree, os.path.join(tree, ".git")):
            flags = cmf.megatron_flags(cmf.Source(where))
            arity = {name: f.arity for name, f in flags.items()}
            want = {"--grad-reduce-in-bf16": "switch", "--cp-comm-type": "list", "--mode": "one",
                    "--old-name": "one", "--new-name": "one",
                    "--tensor-model-parallel-size": "one", "--sequence-parallel": "switch",
                    "--hierarchical-sizes": "list", "--no-add-bias": "switch",
                    "--disable-add-bias": "switch", "--granularity": "one",
                    "--fp8-format": "one", "--size": "one"}
            check(arity == want, f"{where}: flags {sorted(arity.items())}")
            check(flags["--granularity"].choices == ["full", "selective"], "Literal choices")
            check(flags["--mode"].choices == ["a", "b"], "add_argument choices")
            check(len(cmf.Source(where).commit()) == 40, f"{where}: commit")

            ok = ("--tensor-model-parallel-size 2 --cp-comm-type a2a+p2p "
                  "--hierarchical-sizes 2 4 --sequence-parallel --fp8-format hybrid")
            check(cmf.check_line(ok, flags) == [], f"{ok}: {cmf.check_line(ok, flags)}")
            for bad, words in [("--ds-sequence-parallel-size 2", "not a Megatron-LM flag"),
                               ("--sequence-parallel on", "a switch"),
                               ("--tensor-model-parallel-size 2 4", "takes one value"),
                               ("--cp-comm-type --mode a", "takes values"),
                               ("--granularity block", "not one of"),
                               ("--add-bias", "not a Megatron-LM flag"),
                               ("--internal 1", "not a Megatron-LM flag"),
                               ("--hidden 1", "not a Megatron-LM flag")]:
                said = cmf.check_line(bad, flags)
                check(len(said) == 1 and words in said[0], f"{bad}: {said}")

            # The shared flag table: an arity that differs is a problem, an absent flag a note.
            table = os.path.join(tree, "megatron_flags.txt")
            write(tree, "megatron_flags.txt",
                  "# rules\n--tensor-model-parallel-size one replaced\n"
                  "--sequence-parallel one replaced\n  needs --x why\n"
                  "--old-spelling one replaced\n")
            said, absent = cmf.check_table(table, flags)
            check(len(said) == 1 and "line 3: --sequence-parallel is a switch" in said[0],
                  f"table: {said}")
            check(absent == ["--old-spelling"], f"table's absent flags: {absent}")

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cmf.main([])
    check(code == 0 and out.getvalue().startswith("skipped:"), f"no checkout: {code} {out.getvalue()}")
    with contextlib.redirect_stderr(io.StringIO()):
        check(cmf.main(["--megatron", "/nonexistent/megatron"]) == 2, "a missing checkout is bad usage")

    for p in problems:
        print("FAIL:", p)
    print(f"{len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else
                  os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")))
