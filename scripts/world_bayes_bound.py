#!/usr/bin/python3
"""How many trials a searcher that knew the interaction worlds' law would need (docs/search.md §11).

An interaction world (include/autopar/coord/worlds.h) is the scaled truth times one lognormal
factor per cell of four pairs of knobs (tp×pp, mbs×recompute, tp×mbs, pp×vpp):

  log t_i = log S_i + Σ_p sd_p·c_{p, cell_p(i)} + d_i,   c ~ N(0, 1),   d_i ~ N(0, 0.03²)

with S_i the scaled structure (`make-replay-table --world scaled --noise 0`, same truth seed) and
d_i the row's own deviation. The searcher here is given everything but the draws: S_i exactly,
which configurations fit, the per-row sd, and the cells' prior, either as the world has it
(`--pairs true`: the four pairs at their drawn sd) or as a tuner could know it (`--pairs knobs`:
every pair of the knobs of §3 that vary, at an even share of the same total variance), or as a
tuner could learn it (`--pairs learn`: every such pair may interact, a priori with probability
`--inclusion-prior`, its cells then N(0, τ²) with τ one of 0.05, 0.1, 0.2; the indicators and τ
are drawn by Gibbs sampling given the measurements, and the improvement is averaged over the
draws; policy ei only). It keeps the exact Gaussian posterior of the cells and proposes by a
policy:

  thompson  the argmin of one joint draw (cells and deviations) over the unmeasured that fit
  ei        the largest expected improvement on the best measured time (the exact predictive)
  mceiJ     the largest improvement averaged over J joint draws (what a sampler can compute)
  eis       ei over a shortlist: the 64 of lowest posterior mean and the picks of 4 draws

A run's trials to 2% is the first trial whose best measurement is within 2% of the table's best
(tables are noise-free). What this needs is a bound on what the posterior of §3 can do with the
same worlds: it knows what §3 must learn (S's component scales, the scales, which pairs matter).

  scripts/world_bayes_bound.py --bin build-dev/autopar-tune --pairs knobs --seeds 3
  scripts/world_bayes_bound.py --bin build-dev/autopar-tune --pairs learn --policies ei --seeds 2

Needs numpy: the system's /usr/bin/python3 (its shebang) with python3-numpy, which
scripts/setup.sh installs.
"""

import argparse
import math
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_search  # noqa: E402  (the suite's worlds, their tables and keys)

COLUMN = {c: i for i, c in enumerate(bench_search.KEY)}
WORLD_PAIRS = [("tp", "pp"), ("mbs", "recompute"), ("tp", "mbs"), ("pp", "vpp")]
ROW_SD = 0.03  # make-replay-table's default --noise: the per-row deviation
SQRT2 = math.sqrt(2.0)


def value(key, knob):
    """A knob's value in a bench_search key; recompute with its layer count, as the world's."""
    if knob == "recompute":
        return key[COLUMN["recompute"]] + ":" + key[COLUMN["recompute_layers"]]
    return key[COLUMN[knob]]


# The knobs of the posterior's level effects and interactions (§3, candidates.cc's kKnobs) that a
# bench_search key holds: the stage split is not one of them.
KNOBS = ["tp", "pp", "dp", "cp", "up", "ep", "etp", "vpp", "mbs", "sp", "recompute", "dist_opt"]


def varying_knobs(keys):
    return [c for c in KNOBS if len({value(k, c) for k in keys}) > 1]


class World:
    """A table read for the bound: log S, log t (fits only), and each row's cell per pair."""

    def __init__(self, keys, structure, table, pairs, sds):
        self.log_s = np.log([structure[k] for k in keys])
        self.fits = np.array([k in table for k in keys])
        self.log_t = np.array([math.log(table[k]) if k in table else np.inf for k in keys])
        cells = {}
        rows = [[cells.setdefault((p, value(k, a), value(k, b)), len(cells))
                 for p, (a, b) in enumerate(pairs)] for k in keys]
        self.cells = np.array(rows, dtype=np.int64)  # rows × pairs
        self.weight = np.zeros(len(cells))
        for (p, _, _), j in cells.items():
            self.weight[j] = sds[p]


def expected_improvement(mu, sd, best):
    """E[max(0, best − t)] for t ~ N(mu, sd²) (log times); before any measurement, on the lowest
    mean."""
    z = ((best if best < math.inf else mu.min()) - mu) / sd
    cdf = 0.5 * (1 + np.array([math.erf(x / SQRT2) for x in z]))
    return sd * (z * cdf + np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi))


def first_within_2pct(world, propose, observe, max_trials=300):
    """The first trial whose best measurement is within 2% of the best that fits; None when
    max_trials do not get there. `propose(cand, best)` picks one of the unmeasured rows that fit
    (`cand`, indices into the world) given the best log time so far; `observe(i)` learns row i."""
    unmeasured = world.fits.copy()
    goal = world.log_t[world.fits].min() + math.log(1.02)
    best = math.inf
    for trial in range(1, max_trials + 1):
        i = propose(np.flatnonzero(unmeasured), best)
        unmeasured[i] = False
        best = min(best, world.log_t[i])
        if best <= goal:
            return trial
        observe(i)
    return None


def trials_to_2pct(world, policy, seed, max_trials=300):
    """first_within_2pct under the exact Gaussian posterior of the cells, proposing by `policy`."""
    rng = np.random.default_rng(seed)
    k = len(world.weight)
    precision, shift = np.eye(k), np.zeros(k)  # prior N(0, I) on the cells

    def propose(cand, best):
        covariance = np.linalg.inv(precision)
        mean = covariance @ shift
        cells, w = world.cells[cand], world.weight[world.cells[cand]]
        if policy == "eis":
            # The 64 of lowest posterior mean and the picks of 4 draws (the search's rule, §6).
            mu = world.log_s[cand] + (w * mean[cells]).sum(1)
            root = np.linalg.cholesky(covariance)
            short = set(np.argsort(mu, kind="stable")[:64].tolist())
            for _ in range(4):
                t = (world.log_s[cand] + (w * (mean + root @ rng.standard_normal(k))[cells]).sum(1)
                     + ROW_SD * rng.standard_normal(len(cand)))
                short.add(int(np.argmin(t)))
            cand = cand[np.array(sorted(short))]
            cells, w = world.cells[cand], world.weight[world.cells[cand]]
        if policy in ("ei", "eis"):
            mu = world.log_s[cand] + (w * mean[cells]).sum(1)
            var = np.full(len(cand), ROW_SD ** 2)
            for p in range(cells.shape[1]):
                for q in range(cells.shape[1]):
                    var += w[:, p] * w[:, q] * covariance[cells[:, p], cells[:, q]]
            return cand[np.argmax(expected_improvement(mu, np.sqrt(var), best))]
        draws = 1 if policy == "thompson" else int(policy[4:])
        root = np.linalg.cholesky(covariance)
        t = np.array([world.log_s[cand] + (w * (mean + root @ rng.standard_normal(k))[cells]).sum(1)
                      + ROW_SD * rng.standard_normal(len(cand)) for _ in range(draws)])
        if policy == "thompson":
            return cand[np.argmin(t[0])]
        ref = best if best < math.inf else t.min(axis=1, keepdims=True)
        gain = np.maximum(0.0, ref - t).mean(axis=0)
        return cand[np.argmax(gain)] if gain.max() > 0 else cand[np.argmin(t.mean(axis=0))]

    def observe(i):
        nonlocal precision, shift
        a = np.zeros(k)
        np.add.at(a, world.cells[i], world.weight[world.cells[i]])
        precision += np.outer(a, a) / ROW_SD ** 2
        shift += a * (world.log_t[i] - world.log_s[i]) / ROW_SD ** 2

    return first_within_2pct(world, propose, observe, max_trials)


# --pairs learn: the scales an interacting pair's cells may have, and the Gibbs schedule.
LEARN_SCALES = (0.05, 0.1, 0.2)
GIBBS_SWEEPS, GIBBS_KEPT = 12, 8


def same_cell(world, a, b):
    """pairs × |a| × |b|: whether rows a and b share each pair's cell."""
    return world.cells[a].T[:, :, None] == world.cells[b].T[:, None, :]


def log_evidence(same, v, r):
    """log N(r; 0, Σ_p v_p·S_p + ROW_SD²·I) up to a constant, S_p = same[p]."""
    chol = np.linalg.cholesky(np.tensordot(v, same, axes=1) + ROW_SD ** 2 * np.eye(len(r)))
    a = np.linalg.solve(chol, r)
    return -0.5 * a @ a - np.log(np.diag(chol)).sum()


def inclusion_draws(world, measured, rng, prior):
    """Per-pair cell variances, one vector per kept sweep of a Gibbs sampler over which pairs
    interact (each a priori with probability `prior`) and their scale (uniform over
    LEARN_SCALES), given the measured rows; from the prior before any measurement."""
    pairs = world.cells.shape[1]
    if not measured:
        return [(rng.random(pairs) < prior) * rng.choice(LEARN_SCALES) ** 2
                for _ in range(GIBBS_KEPT)]
    rows = np.array(measured)
    r = world.log_t[rows] - world.log_s[rows]
    same = same_cell(world, rows, rows).astype(float)
    on, tau, draws = np.zeros(pairs, dtype=bool), LEARN_SCALES[0], []
    for sweep in range(GIBBS_SWEEPS):
        for p in rng.permutation(pairs):
            ll = []
            for value in (False, True):
                on[p] = value
                ll.append(log_evidence(same, on * tau ** 2, r)
                          + math.log(prior if value else 1 - prior))
            on[p] = rng.random() < 1 / (1 + math.exp(min(700.0, ll[0] - ll[1])))
        ll = np.array([log_evidence(same, on * t ** 2, r) for t in LEARN_SCALES])
        w = np.exp(ll - ll.max())
        tau = LEARN_SCALES[rng.choice(len(LEARN_SCALES), p=w / w.sum())]
        if sweep >= GIBBS_SWEEPS - GIBBS_KEPT:
            draws.append(on * tau ** 2)
    return draws


def trials_to_2pct_learned(world, seed, prior, max_trials=300):
    """first_within_2pct by the exact expected improvement, averaged over inclusion_draws."""
    rng = np.random.default_rng(seed)
    measured = []

    def propose(cand, best):
        score = np.zeros(len(cand))
        rows = np.array(measured, dtype=np.int64)
        r = world.log_t[rows] - world.log_s[rows]
        same_mm = same_cell(world, rows, rows).astype(float)
        same_cm = same_cell(world, cand, rows).astype(float)
        for v in inclusion_draws(world, measured, rng, prior):
            mu, var = world.log_s[cand].copy(), np.full(len(cand), v.sum() + ROW_SD ** 2)
            if measured:
                chol = np.linalg.cholesky(np.tensordot(v, same_mm, axes=1)
                                          + ROW_SD ** 2 * np.eye(len(rows)))
                a = np.linalg.solve(chol, np.tensordot(v, same_cm, axes=1).T)
                mu += a.T @ np.linalg.solve(chol, r)
                var -= (a * a).sum(0)
            score += expected_improvement(mu, np.sqrt(np.maximum(var, 1e-12)), best)
        return cand[np.argmax(score)]

    return first_within_2pct(world, propose, measured.append, max_trials)


def drawn_sds(binary, t):
    """The table's four pair sds, from make-replay-table's summary line."""
    cmd = [binary, "make-replay-table", *t.flags.split(), "--truth-seed", str(t.truth_seed),
           "--world", "interactions", "--output", os.devnull]
    r = subprocess.run(cmd, capture_output=True, text=True)
    sds = [float(x) for x in re.findall(r"[a-z]+\*[a-z]+ ([0-9.]+)", r.stderr)]
    if r.returncode != 0 or len(sds) != len(WORLD_PAIRS):
        sys.exit(f"make-replay-table: no interaction summary: {' '.join(cmd)}: {r.stderr}")
    return sds


def summary(values):
    v = [x if x is not None else math.inf for x in values]
    return f"median {bench_search.median(v):g} p90 {bench_search.p90(v):g}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", required=True)
    ap.add_argument("--world-seeds", choices=sorted(bench_search.WORLD_SEEDS), default="held-out")
    ap.add_argument("--pairs", choices=["true", "knobs", "learn"], default="knobs")
    ap.add_argument("--inclusion-prior", type=float, default=0.15,
                    help="--pairs learn: a pair's prior probability of interacting")
    ap.add_argument("--policies", default="thompson,ei,mcei4")
    ap.add_argument("--seeds", type=int, default=3)
    a = ap.parse_args()
    policies = a.policies.split(",")
    for p in policies:
        if p not in ("thompson", "ei", "eis") and not re.fullmatch(r"mcei[1-9][0-9]*", p):
            sys.exit(f"--policies: '{p}' is not one of thompson, ei, eis, mceiJ (J draws, J >= 1)")
    if a.pairs == "learn" and policies != ["ei"]:
        sys.exit("--pairs learn: --policies must be ei (the improvement over the Gibbs draws)")
    if not 0 < a.inclusion_prior < 1:
        sys.exit(f"--inclusion-prior: must be in (0, 1), got {a.inclusion_prior}")
    runs = {p: [] for p in policies}
    with tempfile.TemporaryDirectory() as work:
        for t in bench_search.world_tables(work, a.world_seeds):
            if t.family != "interactions":
                continue
            bench_search.make_table(a.bin, t, t.family)
            twin = bench_search.Table(t.name + ".scaled", t.label, t.flags + " --noise 0",
                                      os.path.join(work, t.name + ".scaled.csv"), "scaled",
                                      t.truth_seed)
            bench_search.make_table(a.bin, twin, "scaled")
            keys = list(twin.time)
            sds = drawn_sds(a.bin, t)
            pairs = WORLD_PAIRS
            if a.pairs in ("knobs", "learn"):
                knobs = varying_knobs(keys)
                pairs = [(x, y) for i, x in enumerate(knobs) for y in knobs[i + 1:]]
                sds = [math.sqrt(sum(s * s for s in sds) / len(pairs))] * len(pairs)
            world = World(keys, twin.time, t.time, pairs, sds)
            line = []
            for p in policies:
                r = [trials_to_2pct_learned(world, s, a.inclusion_prior) if a.pairs == "learn"
                     else trials_to_2pct(world, p, s) for s in range(1, a.seeds + 1)]
                runs[p] += r
                line.append(f"{p} {' '.join(str(x) if x else '-' for x in r)}")
            print(f"{t.name:40} {len(pairs):3} pairs  " + "  ".join(line), flush=True)
    for p, r in runs.items():
        print(f"{p:10} runs {len(r)}  trials to 2% {summary(r)}")


if __name__ == "__main__":
    main()
