#!/usr/bin/env python3
"""Checks the flags autopar-tune emits against a Megatron-LM checkout's own argument parser.

    check_megatron_flags.py [--megatron PATH] [--bin AUTOPAR_TUNE]

PATH is a Megatron-LM work tree or git directory (a bare mirror is read at HEAD). Without one the
check is skipped (exit 0). The flags Megatron-LM accepts are read from the source, without
importing it (no torch): every `add_argument('--...')` of megatron/training/arguments.py, and the
flags its ArgumentGroupFactory derives from dataclass fields (megatron/training/argument_utils.py:
`--field-name`; a bool defaulting to False is a switch `--field-name`, any other bool
`--no-field-name`/`--disable-field-name`; `argparse_meta` arg_names replace the name; excluded and
init=False fields have none). Every line of `plan --format megatron` (or `predict`, for a
configuration the plan's space does not enumerate) for each setup below must use
only those flags, each with as many values as it takes and, where Megatron lists choices, one of
them; and every flag of launcher/megatron_flags.txt that the checkout parses must have the
table's arity (those it does not parse are listed). Exit 0 when every line passes, 1 when one does
not, 2 on bad usage.
"""
import argparse
import ast
import os
import subprocess
import sys

# (name, command, autopar-tune arguments): issue 11's acceptance setups, two that reach virtual
# stages, block recompute and both reduction-dtype flags, FP8 parameters, and uneven stages and
# the embedding and loss counted in the split (which `plan` does not enumerate: `predict` prints
# them).
SETUPS = [
    ("llama3-8b, seq 131072, up=2, 4 x 8 h100", "plan",
     ["--model", "llama3-8b", "--seq-length", "131072", "--global-batch-size", "64",
      "--gpu", "h100", "--nnodes", "4", "--nproc-per-node", "8", "--fix", "up=2"]),
    ("mixtral-8x7b, 32 x 8 h100", "plan",
     ["--model", "mixtral-8x7b", "--global-batch-size", "256", "--gpu", "h100",
      "--nnodes", "32", "--nproc-per-node", "8"]),
    ("mixtral-8x7b, flex dispatcher, 32 x 8 h100", "plan",
     ["--model", "mixtral-8x7b", "--global-batch-size", "256", "--gpu", "h100",
      "--nnodes", "32", "--nproc-per-node", "8", "--moe-token-dispatcher-type", "flex"]),
    ("deepseek-v3, 128 x 8 h800", "plan",
     ["--model", "deepseek-v3", "--global-batch-size", "4096", "--gpu", "h800",
      "--nnodes", "128", "--nproc-per-node", "8"]),
    ("llama3-70b, fp16, vpp=2, block recompute, 8 x 8 h100", "plan",
     ["--model", "llama3-70b", "--global-batch-size", "128", "--gpu", "h100", "--nnodes", "8",
      "--nproc-per-node", "8", "--fp16", "--fix", "vpp=2,recompute=full,recompute_layers=1"]),
    ("llama3-8b, bf16 gradient reduction, 1 x 8 h100", "plan",
     ["--model", "llama3-8b", "--global-batch-size", "64", "--gpu", "h100", "--nnodes", "1",
      "--nproc-per-node", "8", "--fix", "grad_reduce_dtype=bf16"]),
    ("llama3-8b, fp8 with fp8 parameters, 1 x 8 h100", "plan",
     ["--model", "llama3-8b", "--global-batch-size", "64", "--gpu", "h100", "--nnodes", "1",
      "--nproc-per-node", "8", "--fp8-format", "hybrid", "--fix", "fp8_param_gather=on"]),
    ("llama3-8b, uneven stages and vpp=2, 4 x 8 h100", "predict",
     ["--model", "llama3-8b", "--global-batch-size", "64", "--gpu", "h100", "--nnodes", "4",
      "--nproc-per-node", "8", "--config", "tp=8,pp=4,pp_first=2,pp_last=6,vpp=2"]),
    ("llama3-8b, 128k tokens, cp by all-gathered K and V, 4 x 8 h100", "plan",
     ["--model", "llama3-8b", "--seq-length", "131072", "--global-batch-size", "64",
      "--gpu", "h100", "--nnodes", "4", "--nproc-per-node", "8", "--fix", "cp_comm=allgather"]),
    ("llama3-405b, the embedding and the loss a model chunk each, 128 x 8 h100", "predict",
     ["--model", "llama3-405b", "--global-batch-size", "256", "--gpu", "h100", "--nnodes", "128",
      "--nproc-per-node", "8",
      "--config", "tp=8,pp=16,vpp=8,split_embedding=on,split_loss=on,sp=on,dist_opt=on"]),
]
TOP = "100"
ARGUMENTS_PY = "megatron/training/arguments.py"


class Source:
    """Files of a Megatron-LM checkout: a work tree, or a git directory read at HEAD."""

    def __init__(self, path):
        self.path = path
        self.tree = os.path.isfile(os.path.join(path, ARGUMENTS_PY))
        if not self.tree and self._git("rev-parse", "--git-dir") is None:
            raise ValueError(f"{path}: neither a Megatron-LM work tree ({ARGUMENTS_PY}) nor a "
                             "git directory")

    def _git(self, *args):
        cmd = ["git", "-C", self.path] if self.tree else ["git", f"--git-dir={self.path}"]
        r = subprocess.run(cmd + list(args), capture_output=True, text=True)
        return r.stdout if r.returncode == 0 else None

    def commit(self):
        out = self._git("rev-parse", "HEAD")
        return out.strip() if out else "unknown (not a git checkout)"

    def read(self, rel):
        if self.tree:
            with open(os.path.join(self.path, rel), encoding="utf-8") as f:
                return f.read()
        text = self._git("show", f"HEAD:{rel}")
        if text is None:
            raise FileNotFoundError(f"{self.path}: no {rel} at HEAD")
        return text

    def files_defining(self, class_name):
        """Python files under megatron/ with a top-level `class NAME`."""
        pattern = rf"^class {class_name}\b"
        if self.tree:
            r = subprocess.run(["grep", "-rlE", pattern, "--include=*.py",
                                os.path.join(self.path, "megatron")],
                               capture_output=True, text=True)
            return sorted(os.path.relpath(p, self.path) for p in r.stdout.split())
        out = self._git("grep", "-lE", pattern, "HEAD", "--", "megatron/*.py") or ""
        return sorted(line.split(":", 1)[1] for line in out.split())


class Flag:
    """One Megatron-LM option: how many values it takes ('switch', 'one', 'list') and its choices."""

    def __init__(self, arity="one", choices=None, where=""):
        self.arity, self.choices, self.where = arity, choices, where


def _literal(node):
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


def _arity(kwargs):
    action = _literal(kwargs["action"]) if "action" in kwargs else None
    if action in ("store_true", "store_false", "store_const", "count", "help", "version"):
        return "switch"
    nargs = _literal(kwargs["nargs"]) if "nargs" in kwargs else None
    if nargs in ("+", "*") or (isinstance(nargs, int) and nargs != 1):
        return "list"
    return "one"


def _choices(kwargs):
    if "choices" not in kwargs:
        return None
    values = _literal(kwargs["choices"])
    return [str(v) for v in values] if isinstance(values, (list, tuple)) else None


def add_argument_flags(tree, where):
    """Options of every `X.add_argument('--a', '--b', ...)` call."""
    flags = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"):
            continue
        names = [a.value for a in node.args
                 if isinstance(a, ast.Constant) and isinstance(a.value, str)
                 and a.value.startswith("--")]
        kwargs = {k.arg: k.value for k in node.keywords if k.arg}
        for name in names:
            flags[name] = Flag(_arity(kwargs), _choices(kwargs), where)
    return flags


def _unwrap_optional(ann):
    """Optional[X], X | None -> X; anything else as it is."""
    if isinstance(ann, ast.Subscript) and _name(ann.value) == "Optional":
        return ann.slice
    if isinstance(ann, ast.BinOp) and isinstance(ann.op, ast.BitOr):
        sides = [s for s in (ann.left, ann.right)
                 if not (isinstance(s, ast.Constant) and s.value is None)]
        if len(sides) == 1:
            return sides[0]
    return ann


def _name(node):
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _field_flag(cls_name, stmt, where):
    """(names, Flag) for one dataclass field, or None when the factory makes no option of it."""
    name = stmt.target.id
    ann = _unwrap_optional(stmt.annotation)
    if isinstance(ann, ast.Subscript) and _name(ann.value) == "ClassVar":
        return None
    default, meta = stmt.value, {}
    if isinstance(stmt.value, ast.Call) and _name(stmt.value.func) == "field":
        kw = {k.arg: k.value for k in stmt.value.keywords if k.arg}
        if "init" in kw and _literal(kw["init"]) is False:
            return None
        default = kw.get("default")
        if isinstance(kw.get("metadata"), ast.Dict):
            for k, v in zip(kw["metadata"].keys, kw["metadata"].values):
                if _literal(k) == "argparse_meta" and isinstance(v, ast.Dict):
                    meta = {_literal(mk): mv for mk, mv in zip(v.keys, v.values)}
    flag = Flag("one", None, f"{where}: {cls_name}.{name}")
    names = ["--" + name.replace("_", "-")]
    if _name(ann) == "bool":
        flag.arity = "switch"
        if not (isinstance(default, ast.Constant) and default.value is False):
            names = ["--no-" + name.replace("_", "-"), "--disable-" + name.replace("_", "-")]
    elif isinstance(ann, ast.Subscript) and _name(ann.value) in ("list", "List"):
        flag.arity = "list"
    elif isinstance(ann, ast.Subscript) and _name(ann.value) == "Literal":
        values = _literal(ann.slice)
        values = values if isinstance(values, tuple) else (values,)
        flag.choices = [str(v) for v in values]
    if "arg_names" in meta:
        names = _literal(meta["arg_names"]) or names
    overrides = {k: v for k, v in meta.items() if k in ("action", "nargs")}
    if overrides:
        flag.arity = _arity(overrides)
    if "choices" in meta:
        flag.choices = _choices(meta)
    return names, flag


def dataclass_flags(source, class_name, exclude, seen=None):
    """Options ArgumentGroupFactory(class_name, exclude) adds: the fields of the class and its
    bases, found by name under megatron/."""
    seen = set() if seen is None else seen
    if class_name in seen:
        return {}
    seen.add(class_name)
    flags = {}
    for rel in source.files_defining(class_name):
        tree = ast.parse(source.read(rel))
        for cls in tree.body:
            if not (isinstance(cls, ast.ClassDef) and cls.name == class_name):
                continue
            for base in cls.bases:
                if _name(base):
                    flags.update(dataclass_flags(source, _name(base), exclude, seen))
            for stmt in cls.body:
                if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                    continue
                if stmt.target.id in exclude:
                    continue
                made = _field_flag(class_name, stmt, rel)
                if made:
                    for n in made[0]:
                        flags[n] = made[1]
            return flags
    return flags


def megatron_flags(source):
    """Every option Megatron-LM's pretraining parser accepts, by flag."""
    tree = ast.parse(source.read(ARGUMENTS_PY))
    flags = add_argument_flags(tree, ARGUMENTS_PY)
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and _name(node.func) == "ArgumentGroupFactory"
                and node.args and _name(node.args[0])):
            continue
        exclude = set()
        for k in node.keywords:
            if k.arg == "exclude":
                value = _literal(k.value)
                if value is None and isinstance(k.value, ast.Name):
                    value = _assigned_list(tree, k.value.id, node)
                exclude = set(value or [])
        flags.update(dataclass_flags(source, _name(node.args[0]), exclude))
    return flags


def _assigned_list(tree, name, call):
    """The literal list last assigned to `name` in the function that holds `call`."""
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef) and any(n is call for n in ast.walk(fn)):
            for stmt in ast.walk(fn):
                if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                        and isinstance(stmt.targets[0], ast.Name)
                        and stmt.targets[0].id == name):
                    return _literal(stmt.value)
    return None


def check_line(line, flags):
    """Problems of one emitted flag line, in words (empty when Megatron-LM accepts it)."""
    words = line.split()
    problems, i = [], 0
    while i < len(words):
        name = words[i]
        if not name.startswith("--"):
            problems.append(f"'{name}' is not a flag")
            i += 1
            continue
        values = []
        i += 1
        while i < len(words) and not words[i].startswith("--"):
            values.append(words[i])
            i += 1
        flag = flags.get(name)
        if flag is None:
            problems.append(f"{name}: not a Megatron-LM flag")
            continue
        if flag.arity == "switch" and values:
            problems.append(f"{name}: a switch, given {' '.join(values)}")
        elif flag.arity == "one" and len(values) != 1:
            problems.append(f"{name}: takes one value, given {len(values)}")
        elif flag.arity == "list" and not values:
            problems.append(f"{name}: takes values, given none")
        if flag.choices is not None:
            problems += [f"{name}: '{v}' is not one of {', '.join(flag.choices)}"
                         for v in values if v not in flag.choices]
    return problems


def check_table(path, flags):
    """(problems, absent) of launcher/megatron_flags.txt, the rules autopar-train and the
    Megatron trials share: a flag the checkout parses with another arity is a problem; one it
    does not parse (an older Megatron-LM's name) is only listed."""
    problems, absent = [], []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            words = line.split()
            if len(words) != 3 or not words[0].startswith("--"):
                continue
            flag = flags.get(words[0])
            if flag is None:
                absent.append(words[0])
            elif flag.arity != words[1]:
                problems.append(f"line {number}: {words[0]} is a {flag.arity} in Megatron-LM, "
                                f"'{words[1]}' in the table")
    return problems, absent


def default_bin(root):
    if os.environ.get("AUTOPAR_BIN"):
        return os.environ["AUTOPAR_BIN"]
    return os.path.join(os.environ.get("AUTOPAR_BUILD_DIR", os.path.join(root, "build")),
                        "autopar-tune")


def main(argv):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--megatron", help="a Megatron-LM work tree or git directory")
    p.add_argument("--bin", help="autopar-tune (default: $AUTOPAR_BIN, else build/autopar-tune)")
    args = p.parse_args(argv)
    if not args.megatron:
        print("skipped: no Megatron-LM checkout given (--megatron PATH: a work tree or git dir)")
        return 0
    try:
        source = Source(args.megatron)
        flags = megatron_flags(source)
    except (ValueError, FileNotFoundError, SyntaxError) as e:
        print(f"check_megatron_flags: --megatron: {e}", file=sys.stderr)
        return 2
    binary = args.bin or default_bin(root)
    if not os.access(binary, os.X_OK):
        print(f"check_megatron_flags: --bin: no autopar-tune at {binary} (build it, or pass --bin)",
              file=sys.stderr)
        return 2
    print(f"Megatron-LM {source.commit()} ({args.megatron}): {len(flags)} flags")
    failed = 0
    for name, command, setup in SETUPS:
        top = ["--top", TOP] if command == "plan" else []
        r = subprocess.run([binary, command, *setup, *top, "--format", "megatron"],
                           capture_output=True, text=True)
        lines = [line for line in r.stdout.splitlines() if line.strip()]
        if r.returncode != 0 or not lines:
            print(f"FAIL {name}: {command} exited {r.returncode}: {r.stderr.strip()}")
            failed += 1
            continue
        bad = [(n, line, problems) for n, line in enumerate(lines, 1)
               for problems in [check_line(line, flags)] if problems]
        used = sorted({w for line in lines for w in line.split() if w.startswith("--")})
        print(f"{'FAIL' if bad else 'ok  '} {name}: {len(lines)} lines, {len(bad)} rejected; "
              f"flags: {' '.join(used)}")
        for n, line, problems in bad[:5]:
            print(f"     line {n}: {'; '.join(problems)}\n       {line}")
        failed += bool(bad)
    table = os.path.join(root, "launcher", "megatron_flags.txt")
    problems, absent = check_table(table, flags)
    print(f"{'FAIL' if problems else 'ok  '} launcher/megatron_flags.txt: {len(problems)} "
          f"arities differ; not in this checkout: {' '.join(absent) or 'none'}")
    for problem in problems:
        print(f"     {problem}")
    failed += bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
