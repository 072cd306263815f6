#!/usr/bin/env python3
"""Search quality on replay tables: Thompson sampling against random and analytic-only (and grid).

Every searcher runs as a whole `autopar-tune tune --backend replay` study (journal, stop rules and
all) per seed. A run's recommendation after k trials is the study's own (trials.csv `best_config`:
the fastest measured configuration where measurements do not disagree, the lowest estimate where a
repeated measurement showed noise, docs/search.md §7); its regret is that configuration's step time
in the table (noise-free: a `noisy` world measures around it) over the table's best, minus one. Per
table, over the seeds:

  to 2%       trials until the recommendation is within 2% of the table's best (median, p90;
              ">N" when runs never got there: they count as infinitely many)
  regret      at the stop (median, max): where the searcher's stop rule, the space or the
              --max-trials cap ended the run
  stop        trials at the stop (median), and how the runs stopped
  oom         OOM trials / all trials, pooled over the seeds
  calibration (Thompson, over all tables of the suite) the mean P(an unmeasured configuration is
              > 2% better) the stop rule claimed when it stopped (converged,
              no_likely_improvement or noise_limited) against the fraction of those runs that
              stopped with regret > 2%; and how likely that many runs above 2% (or more) would
              be if each run's claim were true (the Poisson-binomial tail): "overconfident"
              below 0.05

Suites (--suite):

  worlds (default)  4 models x 6 world families of `make-replay-table --world` (interactions,
                    kernel, memory, noisy, near_memory, mixed; include/autopar/coord/worlds.h) x 3
                    world seeds. --world-seeds held-out (default) uses seeds 101-103, the tables to
                    report on; --world-seeds tune uses 1-3 and tune-extra 4-6, the tables to tune
                    the search on (never report the held-out ones as tuned). A model's tables use
                    truth seed seed + 10 x (model index), so no two models share a world's
                    parameters.
                    Targets per table (issue 13): Thompson median to 2% <= 15, p90 <= 40, regret
                    at stop median 0% and max <= 2%, OOM trials <= 20%.
  today             the (a) tables of before (the scaled truth: per-table compute 0.8-1.2 and
                    communication 0.5-2.0 factors, 3% per-configuration noise, memory scale,
                    surprise OOMs; truth seeds 1-4) and the measured CPU table (b). Target:
                    Thompson within 2% in at most a tenth of random's trials (median) on a table
                    of 500 or more configurations, in fewer trials than every baseline on a smaller
                    one.

Every run is capped at --max-trials (worlds: 300; today: none, as before), so baselines without a
stop rule are bounded; on the worlds suite only their trials to 2% are reported. Exit status 1 when
a target is missed.
"""
import argparse
import concurrent.futures
import csv
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time

MODELS = [
    ("llama2-7b, 2x8 a100", "llama2_7b_2x8_a100",
     "--model llama2-7b --gpu a100-80gb --nnodes 2 --nproc-per-node 8 --global-batch-size 128 "
     "--seq-length 4096", 1),
    ("llama2-70b, 8x8 h100", "llama2_70b_8x8_h100",
     "--model llama2-70b --gpu h100 --nnodes 8 --nproc-per-node 8 --global-batch-size 512 "
     "--seq-length 4096", 2),
    ("gpt3-175b, 16x8 a100", "gpt3_175b_16x8_a100",
     "--model gpt3-175b --gpu a100-80gb --nnodes 16 --nproc-per-node 8 --global-batch-size 1536 "
     "--seq-length 2048", 3),
    ("mixtral-8x7b, 4x8 h100", "mixtral_8x7b_4x8_h100",
     "--model mixtral-8x7b --gpu h100 --nnodes 4 --nproc-per-node 8 --global-batch-size 256 "
     "--seq-length 4096", 4),
]
FAMILIES = ["interactions", "kernel", "memory", "noisy", "near_memory", "mixed"]
WORLD_SEEDS = {"tune": [1, 2, 3], "tune-extra": [4, 5, 6], "held-out": [101, 102, 103]}
SEEDLESS = {"grid", "analytic"}  # same proposals whatever the seed: run once
MODEL_STOPS = {"converged", "no_likely_improvement", "noise_limited"}
# Every column that tells two configurations apart (the uneven stages and etp included: a key
# without them gave one key to rows of different times).
KEY = ["tp", "pp", "pp_first", "pp_last", "split_embedding", "split_loss", "dp", "cp", "up", "ep",
       "etp", "vpp", "mbs", "sp", "recompute", "recompute_layers", "dist_opt"]
TARGET = {"median": 15, "p90": 40, "regret_max": 0.02, "oom": 0.20}


class Table:
    def __init__(self, name, label, flags, path, family=None, truth_seed=None):
        self.name, self.label, self.flags, self.path = name, label, flags, path
        self.family, self.truth_seed = family, truth_seed

    def load(self):
        self.time = {}
        self.rows = 0
        seen = set()
        for row in csv.DictReader(open(self.path)):
            self.rows += 1
            key = key_of(row)
            if key in seen:
                raise ValueError(f"{self.path}:{self.rows + 1}: a second row of {key}")
            seen.add(key)
            if row["status"] == "ok":
                self.time[key] = float(row["step_time_s"])
        self.best = min(self.time.values())


def key_of(row):
    if row is None:
        return None

    def norm(column, v):
        if column in ("sp", "dist_opt", "split_embedding", "split_loss"):
            return "on" if v in ("on", "true", "1") else "off"
        return v or "0"
    # A spec leaves etp out where the experts follow tp, a table without the column likewise.
    if not row.get("etp"):
        row = dict(row, etp=row.get("tp", "0"))
    return tuple(norm(c, row.get(c, "0")) for c in KEY)


def spec_row(spec):
    """The columns of a configuration spec (tp=2,pp=4,...); an empty spec gives None."""
    if not spec:
        return None
    return dict(item.split("=", 1) for item in spec.split(","))


def run_study(binary, table, searcher, seed, study, max_trials):
    shutil.rmtree(study, ignore_errors=True)
    cmd = [binary, "tune", "--backend", "replay", "--replay-table", table.path,
           *table.flags.split(), "--searcher", searcher, "--seed", str(seed), "--study", study,
           "--quiet", "--format", "json"]
    if max_trials:
        cmd += ["--max-trials", str(max_trials)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}\nexit {r.returncode}: {r.stderr}")
    result = json.loads(r.stdout)
    trials, fastest = [], (math.inf, None)
    for row in csv.DictReader(open(os.path.join(study, "trials.csv"))):
        if row["status"] == "ok":
            fastest = min(fastest, (float(row["step_time_s"]), key_of(row)))
        # A build from before `best_config` recommended its fastest measurement.
        chosen = (key_of(spec_row(row["best_config"])) if "best_config" in row else fastest[1])
        trials.append((row["status"], key_of(row), chosen))
    shutil.rmtree(study, ignore_errors=True)
    p = result.get("stop_p_improvement")
    e = result.get("stop_recent_error")
    return {"trials": trials, "stop_reason": result["stop_reason"],
            "p_improvement": p if isinstance(p, (int, float)) else None,
            "recent_error": e if isinstance(e, (int, float)) else None,
            "proposal_ms": result["timing"]["proposal_ms_median"]}


def evaluate(run, table):
    """Regret of the recommendation after each trial (inf before the first measurement)."""
    regret = []
    for _, _, chosen in run["trials"]:
        regret.append(table.time[chosen] / table.best - 1 if chosen else math.inf)
    to2 = next((i + 1 for i, r in enumerate(regret) if r <= 0.02 + 1e-12), math.inf)
    return {"regret": regret, "to2": to2, "final": regret[-1] if regret else math.inf,
            "n": len(regret), "oom": sum(s == "oom" for s, _, _ in run["trials"]),
            "stop": run["stop_reason"], "p_improvement": run["p_improvement"],
            "recent_error": run.get("recent_error"), "proposal_ms": run["proposal_ms"]}


def median(values):
    return statistics.median(values) if values else math.nan


def p90(values):  # nearest rank, so an infinite value stays infinite
    v = sorted(values)
    return v[max(0, math.ceil(0.9 * len(v)) - 1)] if v else math.nan


def quartiles(values):
    if len(values) < 2:
        return values[0], values[0]
    v = sorted(values)
    return v[max(0, math.ceil(0.25 * len(v)) - 1)], v[max(0, math.ceil(0.75 * len(v)) - 1)]


def fmt(v, longest=None):
    """A trial count; a run that never got there shows as more than the longest such run."""
    if v == math.inf:
        return f">{longest}" if longest else ">max"
    return f"{v:g}"


def pct(v):
    return "  inf" if v == math.inf else f"{100 * v:5.1f}"


def stats(evals):
    return {"median": median([e["to2"] for e in evals]), "p90": p90([e["to2"] for e in evals]),
            "never": sum(e["to2"] == math.inf for e in evals),
            "regret_median": median([e["final"] for e in evals]),
            "regret_max": max(e["final"] for e in evals),
            "stop_median": median([e["n"] for e in evals]),
            "oom": sum(e["oom"] for e in evals) / max(1, sum(e["n"] for e in evals)),
            "capped": sum(e["stop"] == "max_trials" for e in evals),
            "longest": max((e["n"] for e in evals if e["to2"] == math.inf), default=None)}


# ---- the worlds suite: one line per table ----

def world_verdict(s):
    missed = []
    if not s["median"] <= TARGET["median"]:
        missed.append("median")
    if not s["p90"] <= TARGET["p90"]:
        missed.append("p90")
    if not s["regret_median"] <= 1e-12:
        missed.append("regret-med")
    if not s["regret_max"] <= TARGET["regret_max"] + 1e-12:
        missed.append("regret-max")
    if not s["oom"] <= TARGET["oom"]:
        missed.append("oom")
    return missed


def report_worlds(tables, evals, searchers, cap):
    print(f"\nThompson columns: trials to 2% (median, p90), regret at stop % (median, max), "
          f"trials at stop (median), OOM trials %, runs stopped by the {cap}-trial cap; "
          "baselines: trials to 2% (median/p90)")
    others = [s for s in searchers if s != "thompson"]
    head = (f"{'table':40} {'rows':>5} {'ok':>5} | {'med':>5} {'p90':>5} {'rg med':>6} "
            f"{'rg max':>6} {'stop':>5} {'oom%':>5} {'cap':>3} | "
            + " ".join(f"{s[:8]:>13}" for s in others) + " | verdict")
    print(head)
    print("-" * len(head))
    failed = []
    for t in tables:
        line = f"{t.name:40} {t.rows:5d} {len(t.time):5d} | "
        if "thompson" in searchers:
            s = stats(evals[(t.name, "thompson")])
            line += (f"{fmt(s['median'], s['longest']):>5} {fmt(s['p90'], s['longest']):>5} "
                     f"{pct(s['regret_median']):>6} {pct(s['regret_max']):>6} "
                     f"{s['stop_median']:5g} {100 * s['oom']:5.1f} {s['capped']:3d} | ")
        for o in others:
            b = stats(evals[(t.name, o)])
            line += f"{fmt(b['median'], b['longest']) + '/' + fmt(b['p90'], b['longest']):>13} "
        if "thompson" in searchers:
            missed = world_verdict(s)
            line += "| " + ("PASS" if not missed else "FAIL " + ",".join(missed))
            if missed:
                failed.append(t.name)
        print(line)
    if "thompson" in searchers:
        print(f"\nper family (Thompson, pooled over models and world seeds):")
        print(f"{'family':14} {'tables':>6} {'to2 med':>8} {'p90':>6} {'rg med%':>8} "
              f"{'rg max%':>8} {'oom%':>6} {'pass':>5}")
        for fam in sorted({t.family for t in tables}, key=str):
            ts = [t for t in tables if t.family == fam]
            pooled = [e for t in ts for e in evals[(t.name, "thompson")]]
            s = stats(pooled)
            passed = sum(t.name not in failed for t in ts)
            print(f"{str(fam):14} {len(ts):6d} {fmt(s['median'], s['longest']):>8} {fmt(s['p90'], s['longest']):>6} "
                  f"{pct(s['regret_median']):>8} {pct(s['regret_max']):>8} "
                  f"{100 * s['oom']:6.1f} {passed:3d}/{len(ts)}")
    return failed


# ---- the today suite: the block per table of before ----

def report_today(t, evals, searchers):
    print(f"\n## {t.label}: {t.rows} configurations ({len(t.time)} run, "
          f"{t.rows - len(t.time)} oom), best {t.best:.4g} s")
    header = (f"{'searcher':10} {'to 2% (median)':>15} {'p25-p75':>13} {'p90':>6} {'regret':>8} "
              f"{'worst':>7} {'stop':>7} {'oom%':>6} {'regret@TS':>10} {'prop ms':>8}")
    print(header)
    print("-" * len(header))
    medians = {}
    ts_stop = [e["n"] for e in evals[(t.name, "thompson")]] if "thompson" in searchers else None
    for s in searchers:
        es = evals[(t.name, s)]
        st = stats(es)
        medians[s] = st["median"]
        lo, hi = quartiles([e["to2"] for e in es])
        at_ts = ([e["regret"][min(n, e["n"]) - 1] if e["n"] else math.inf
                  for e, n in zip(es, ts_stop)] if ts_stop else [math.nan])
        print(f"{s:10} {fmt(st['median'], st['longest']):>15} {fmt(lo) + '-' + fmt(hi):>13} "
              f"{fmt(st['p90'], st['longest']):>6} {100 * st['regret_median']:7.2f}% "
              f"{100 * st['regret_max']:6.2f}% {st['stop_median']:7g} {100 * st['oom']:6.1f} "
              f"{100 * median(at_ts):9.2f}% {median([e['proposal_ms'] for e in es]):8.3f}"
              + (f"  ({st['never']} runs never within 2%)" if st["never"] else ""))
    if "thompson" not in searchers or "random" not in searchers:
        return "PASS"
    ts = medians["thompson"]
    reached = ts != math.inf
    if t.rows >= 500:
        target = "Thompson within 2% in <= 1/10 of random's trials, median"
        verdict = "PASS" if reached and ts * 10 <= medians["random"] else "FAIL"
        figure = f"random/thompson = {medians['random'] / ts:.1f}x"
    else:
        target = "Thompson within 2% in fewer trials than every baseline, median"
        others = {s: m for s, m in medians.items() if s != "thompson"}
        verdict = "PASS" if reached and all(ts < m for m in others.values()) else "FAIL"
        figure = "thompson " + fmt(ts) + " vs " + ", ".join(
            f"{s} {fmt(m)}" for s, m in others.items())
    print(f"target ({target}): {figure}  {verdict}")
    return verdict


def tail_probability(claims, observed):
    """P(at least `observed` of the runs end above 2%) when each run does so with the probability
    it claimed (independently): the upper tail of the Poisson-binomial distribution, by dynamic
    programming over the runs. Small (< 0.05) means the stop rule claims less doubt than its runs
    show."""
    dist = [1.0]  # dist[k]: P(k runs above 2%) over the runs so far
    for p in claims:
        nxt = [0.0] * (len(dist) + 1)
        for k, q in enumerate(dist):
            nxt[k] += q * (1 - p)
            nxt[k + 1] += q * p
        dist = nxt
    return min(1.0, sum(dist[observed:]))


def report_calibration(tables, evals):
    runs = [(t, e) for t in tables for e in evals.get((t.name, "thompson"), [])]
    stopped = [(t, e) for t, e in runs if e["stop"] in MODEL_STOPS]
    print(f"\n## stop-rule calibration (Thompson, {len(tables)} tables, {len(runs)} runs)")
    if not stopped:
        print("no run stopped on the posterior")
        return

    def line(label, group):
        claims = [e["p_improvement"] for _, e in group if e["p_improvement"] is not None]
        claimed = statistics.fmean(claims)
        above = sum(e["final"] > 0.02 + 1e-12 for _, e in group)
        tail = tail_probability(claims, above)
        print(f"{label:16} {len(group):5d} stops  claimed P(>2% better unmeasured) "
              f"{100 * claimed:5.2f}%  observed regret > 2% {100 * above / len(group):5.1f}% "
              f"({above}, {sum(claims):.1f} expected, P(>= {above}) {tail:.3f})"
              + ("  (overconfident)" if tail < 0.05 else ""))
    line("all", stopped)
    for fam in sorted({t.family for t in tables if t.family}):
        group = [(t, e) for t, e in stopped if t.family == fam]
        if group:
            line(fam, group)
    reasons = {}
    for _, e in runs:
        reasons[e["stop"]] = reasons.get(e["stop"], 0) + 1
    print("stops: " + ", ".join(f"{r} {n}" for r, n in sorted(reasons.items())))


def dump_record(t, searcher, seed, e):
    """One run as --dump writes it (infinite figures as null)."""
    def finite(v):
        return v if isinstance(v, (int, float)) and math.isfinite(v) else None
    return {"table": t.name, "family": t.family, "searcher": searcher, "seed": seed,
            "stop": e["stop"], "p_improvement": e["p_improvement"],
            "recent_error": e["recent_error"], "trials": e["n"], "to2": finite(e["to2"]),
            "regret": finite(e["final"]), "oom": e["oom"]}


def world_tables(work, world_seeds):
    """The worlds suite's tables, each model x family x seed of WORLD_SEEDS[world_seeds], with
    truth seed seed + 10 x (model index) (not loaded: make_table writes and loads them)."""
    for m, (label, name, flags, _) in enumerate(MODELS):
        for fam in FAMILIES:
            for ws in WORLD_SEEDS[world_seeds]:
                truth = ws + 10 * m
                full = f"{name}.{fam}.{truth}"
                yield Table(full, f"{label}, {fam}, truth seed {truth}", flags,
                            os.path.join(work, full + ".csv"), fam, truth)


def make_table(binary, t, world):
    cmd = [binary, "make-replay-table", *t.flags.split(), "--truth-seed", str(t.truth_seed),
           "--output", t.path]
    if world:
        cmd += ["--world", world]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"make-replay-table failed: {' '.join(cmd)}: {r.stderr}")
    t.load()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", required=True)
    ap.add_argument("--work", default=os.path.join(
        "/dev/shm" if os.path.isdir("/dev/shm") else os.environ.get("TMPDIR", "/tmp"),
        f"autopar-bench-search-{os.getpid()}"))
    ap.add_argument("--suite", choices=["worlds", "today"], default="worlds")
    ap.add_argument("--world-seeds", choices=sorted(WORLD_SEEDS), default="held-out")
    ap.add_argument("--seeds", type=int, default=20, help="search seeds per searcher and table")
    ap.add_argument("--searchers", default=None,
                    help="comma-separated (worlds: thompson,random,analytic; today: also grid)")
    ap.add_argument("--max-trials", type=int, default=None,
                    help="cap per run (worlds: 300; today: 0, none)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--cpu-table", default=None, help="exhaustive CPU table (b), today suite")
    ap.add_argument("--only", default=None,
                    help="comma-separated terms; run the tables whose name contains every one "
                         "(a model such as llama2_70b, a family such as near_memory, a seed)")
    ap.add_argument("--dump", default=None,
                    help="write one JSON line per run (table, family, searcher, seed, stop "
                         "reason, claimed P(improvement), trials, trials to 2%%, final regret, "
                         "OOM trials) to this file, for analyses beyond the tables")
    a = ap.parse_args()
    searchers = (a.searchers.split(",") if a.searchers else
                 ["thompson", "random", "analytic"] if a.suite == "worlds" else
                 ["thompson", "random", "grid", "analytic"])
    cap = a.max_trials if a.max_trials is not None else (300 if a.suite == "worlds" else 0)
    terms = a.only.split(",") if a.only else []
    os.makedirs(os.path.join(a.work, "studies"), exist_ok=True)
    seeds = list(range(1, a.seeds + 1))
    start = time.monotonic()

    if a.suite == "today":
        tables = [Table(name, f"(a) {label}", flags, os.path.join(a.work, name + ".csv"), None,
                        today_seed) for label, name, flags, today_seed in MODELS]
    else:
        tables = list(world_tables(a.work, a.world_seeds))
    tables = [t for t in tables if all(term in t.name for term in terms)]
    cpu = None
    if a.suite == "today" and a.cpu_table and all(term in "cpu" for term in terms):
        flags_file = os.path.splitext(a.cpu_table)[0] + ".flags"
        if not os.path.exists(a.cpu_table):
            print(f"\n## (b) {a.cpu_table}: absent, skipped (it is measured by the CPU trial "
                  "runner: see tests/data/replay/README.md)")
        elif not os.path.exists(flags_file):
            print(f"\n## (b) {a.cpu_table}: skipped, {flags_file} (its model flags) is missing")
        else:
            cpu = Table("cpu", f"(b) {os.path.basename(a.cpu_table)}",
                        open(flags_file).read().strip(), a.cpu_table)
    if not tables and not cpu:
        sys.exit(f"no table matches --only {a.only}")

    print(f"# search quality, suite {a.suite}"
          + (f" ({a.world_seeds} worlds)" if a.suite == "worlds" else "")
          + f": {len(tables) + (cpu is not None)} tables, {a.seeds} seeds per searcher "
          f"({', '.join(searchers)}; grid and analytic-only ignore the seed and run once)"
          + (f", at most {cap} trials per run" if cap else ""))
    evals, futures = {}, {}
    dump = open(a.dump, "w") if a.dump else None
    try:
        for t in tables:
            make_table(a.bin, t, t.family)
        if cpu:
            cpu.load()
            tables.append(cpu)
        with concurrent.futures.ThreadPoolExecutor(max_workers=a.jobs) as pool:
            for t in tables:
                for s in searchers:
                    for seed in ([1] if s in SEEDLESS else seeds):
                        study = os.path.join(a.work, "studies", f"{t.name}.{s}.{seed}")
                        job = pool.submit(run_study, a.bin, t, s, seed, study, cap)
                        futures[job] = (t, s, seed)
            for done, f in enumerate(concurrent.futures.as_completed(futures), 1):
                t, s, seed = futures[f]
                e = evaluate(f.result(), t)
                evals.setdefault((t.name, s), []).append(e)
                if dump:
                    dump.write(json.dumps(dump_record(t, s, seed, e)) + "\n")
                    dump.flush()
                if done % 100 == 0 or done == len(futures):
                    print(f"{done}/{len(futures)} studies, {time.monotonic() - start:.0f} s",
                          file=sys.stderr, flush=True)
        for t in tables:  # one run of a seedless searcher stands for every seed
            for s in searchers:
                if s in SEEDLESS:
                    evals[(t.name, s)] = evals[(t.name, s)] * len(seeds)
        if a.suite == "worlds":
            failed = report_worlds(tables, evals, searchers, cap)
        else:
            failed = [t.name for t in tables
                      if report_today(t, evals, searchers) == "FAIL"]
        if "thompson" in searchers:
            report_calibration(tables, evals)
    finally:
        shutil.rmtree(a.work, ignore_errors=True)
        if dump:
            dump.close()
    print(f"\n{len(tables)} tables, {len(futures)} studies, {time.monotonic() - start:.0f} s wall "
          f"with --jobs {a.jobs}")
    if failed:
        print(f"targets missed on {len(failed)} of {len(tables)} tables")
        sys.exit(1)
    print("every target met")


if __name__ == "__main__":
    main()
