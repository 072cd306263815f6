#!/usr/bin/env python3
"""Lines of every function defined in the C++/CUDA sources, longest first: issue 15's rule is
none over 100 lines outside tests.

    scripts/function_lengths.py [--over N] [PATH ...]   (default: src include tools, N = 100)

A function's length runs from the first line of its signature to its closing brace; a lambda or
a local class counts in the function that holds it. The scan strips comments, string and
character literals, then matches braces: a `{` at namespace or class scope whose header has a
parameter list, and no `=` outside it, opens a function. Exit 1 when one is longer than N.
"""
import argparse
import os
import re
import sys

SOURCES = (".cc", ".h", ".cu", ".cuh", ".cpp", ".hpp")
CONTROL = re.compile(r"^(if|for|while|switch|catch|do|else|return)\b")
SCOPES = re.compile(r"\b(namespace|class|struct|union|enum)\b[^()]*$|^extern\s*\"C\"")


def strip(text):
    """Comments and literals blanked, newlines kept, so offsets keep their line numbers."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "R" and text.startswith('R"', i) and (i == 0 or not text[i - 1].isalnum()):
            m = re.match(r'R"([^(]*)\(', text[i:])
            if not m:
                out.append(c)
                i += 1
                continue
            end = text.find(")" + m.group(1) + '"', i)
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append('""' + re.sub(r"[^\n]", " ", text[i + 2:j]))
            i = j
        elif c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum() and i + 1 < n and text[i + 1].isalnum():
                out.append(" ")  # a digit separator: 1'000'000
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * max(0, j - i - 1) + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(path):
    text = strip(open(path, encoding="utf-8", errors="replace").read())
    # Preprocessor lines end no statement: blank them.
    text = re.sub(r"^[ \t]*#.*(?:\\\n.*)*", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text,
                  flags=re.M)
    stack = []  # (kind, start offset, name)
    last = 0  # offset just after the last ; { or }
    for i, c in enumerate(text):
        if c == ";":
            last = i + 1
        elif c == "{":
            header = text[last:i].strip()
            in_function = any(kind == "function" for kind, _, _ in stack)
            kind = "block"
            if not in_function and "(" in header and not CONTROL.match(header):
                outside = re.sub(r"\([^()]*\)", "", re.sub(r"\([^()]*\)", "", header))
                if "=" not in outside.replace("operator=", "") and not SCOPES.search(header):
                    kind = "function"
            elif not in_function and (SCOPES.search(header) or not header):
                kind = "scope"
            start = last + (len(text[last:i]) - len(text[last:i].lstrip()))
            name = re.sub(r"\s+", " ", header.split("(")[0]).split(" ")[-1] if header else ""
            stack.append((kind, start, name))
            last = i + 1
        elif c == "}":
            if stack:
                kind, start, name = stack.pop()
                if kind == "function":
                    first = text.count("\n", 0, start) + 1
                    end = text.count("\n", 0, i) + 1
                    yield end - first + 1, first, name
            last = i + 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--over", type=int, default=100)
    ap.add_argument("paths", nargs="*", default=["src", "include", "tools"])
    a = ap.parse_args()
    found = []
    for root in a.paths:
        files = [root] if os.path.isfile(root) else [
            os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f.endswith(SOURCES)]
        for path in sorted(files):
            for length, line, name in functions(path):
                if length > a.over:
                    found.append((length, f"{path}:{line}", name))
    for length, where, name in sorted(found, reverse=True):
        print(f"{length:5d}  {where}  {name}")
    print(f"function_lengths.py: {len(found)} function(s) over {a.over} lines")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
