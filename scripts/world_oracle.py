#!/usr/bin/env python3
"""What a searcher that knew a world's structure would need (docs/search.md §11).

A world's time is its structure times an independent per-row factor (`make-replay-table --noise`).
`--noise 0` with the same truth seed gives the structure alone: the per-row draws are still taken,
so every other draw is the same. A searcher that knew the structure exactly, and which
configurations fit, would measure the configurations that fit in the structure's order; the rank
of the first within 2% of the table's best is its trials to 2%. Prints that rank per table and
how many configurations lie within 2% of the best.

  python3 scripts/world_oracle.py --bin build-dev/autopar-tune --world-seeds tune \\
      --families interactions,kernel,memory,noisy,mixed

near_memory is refused: its memory scaling follows the times, so the noise-free twin's set of
configurations that fit is not the table's.
"""

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_search  # noqa: E402  (the suite's worlds, their tables and keys)


def oracle_rank(table, structure):
    """(rank, within): the first configuration within 2% of the best in the structure's order of
    the configurations that fit in the table (key -> time; absent or None: does not fit), and
    how many fit within 2%."""
    fits = {k: t for k, t in table.items() if t is not None}
    if not fits:
        return None, 0
    best = min(fits.values())
    missing = [k for k in fits if structure.get(k) is None]
    if missing:
        raise ValueError(f"{len(missing)} rows fit in the table but have no time in its twin")
    order = sorted(fits, key=lambda k: structure[k])
    rank = next(i + 1 for i, k in enumerate(order) if fits[k] <= best * 1.02)
    return rank, sum(t <= best * 1.02 for t in fits.values())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", required=True)
    ap.add_argument("--world-seeds", choices=sorted(bench_search.WORLD_SEEDS), default="tune")
    ap.add_argument("--families", default="interactions,kernel,memory,noisy,mixed")
    a = ap.parse_args()
    families = a.families.split(",")
    for f in families:
        if f not in bench_search.FAMILIES or f == "near_memory":
            sys.exit(f"--families: '{f}' is not one of "
                     f"{', '.join(x for x in bench_search.FAMILIES if x != 'near_memory')}")
    print(f"{'table':40} {'oracle rank':>11} {'within 2%':>9}")
    with tempfile.TemporaryDirectory() as work:
        for t in bench_search.world_tables(work, a.world_seeds):
            if t.family not in families:
                continue
            bench_search.make_table(a.bin, t, t.family)
            twin = bench_search.Table(t.name + ".structure", t.label, t.flags + " --noise 0",
                                      os.path.join(work, t.name + ".structure.csv"), t.family,
                                      t.truth_seed)
            bench_search.make_table(a.bin, twin, twin.family)
            rank, within = oracle_rank(t.time, twin.time)
            print(f"{t.name:40} {rank if rank else '-':>11} {within:>9}", flush=True)


if __name__ == "__main__":
    main()
