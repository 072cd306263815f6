"""The command line every fault test takes: --bin, the autopar-tune binary, and --work, a scratch
directory (emptied, then created)."""
import argparse
import os
import shutil


def parse():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    return a
