#!/usr/bin/env python3
"""scripts/bench_search.py's identity of a configuration: a replay table's row, a trials.csv row
and the recommendation's spec text name one configuration by one key (etp left out of a spec
where the experts follow tp, uneven stages 0 when not given), two configurations that differ only
in etp or in their uneven stages have different keys, and a table with two rows of one key is
refused rather than read as one configuration; --dump's record of a run, and the tuning world
seeds kept apart from the held-out ones; the calibration's tail probability of the stop rule's
misses under its own claims; scripts/world_oracle.py's rank of the first
configuration within 2% of the best in the order of a world's structure.

usage: bench_search_test.py SOURCE_DIR
"""
import importlib.util
import os
import sys
import tempfile
import unittest

SOURCE_DIR = sys.argv.pop(1) if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__),
                                                                    "..", "..")
spec = importlib.util.spec_from_file_location(
    "bench_search", os.path.join(SOURCE_DIR, "scripts", "bench_search.py"))
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)
sys.path.insert(0, os.path.join(SOURCE_DIR, "scripts"))
oracle_spec = importlib.util.spec_from_file_location(
    "world_oracle", os.path.join(SOURCE_DIR, "scripts", "world_oracle.py"))
oracle = importlib.util.module_from_spec(oracle_spec)
oracle_spec.loader.exec_module(oracle)

HEADER = ("tp,pp,dp,cp,up,ep,vpp,mbs,sp,recompute,recompute_layers,dist_opt,step_time_s,"
          "peak_memory_gib,status,etp,pp_first,pp_last")


def table_row(line):
    return dict(zip(HEADER.split(","), line.split(",")))


class KeyTest(unittest.TestCase):
    def test_spec_and_table_row_name_one_configuration(self):
        row = table_row("4,1,8,1,1,8,1,1,on,full,1,on,3.5,60,ok,4,0,0")
        spec_text = "tp=4,pp=1,dp=8,cp=1,up=1,ep=8,vpp=1,mbs=1,sp=on,recompute=full," \
                    "recompute_layers=1,dist_opt=on"
        self.assertEqual(bench.key_of(row), bench.key_of(bench.spec_row(spec_text)))

    def test_etp_and_uneven_stages_tell_configurations_apart(self):
        base = table_row("4,4,2,1,1,8,1,1,on,none,0,on,3.5,60,ok,4,0,0")
        etp = table_row("4,4,2,1,1,8,1,1,on,none,0,on,3.5,60,ok,1,0,0")
        uneven = table_row("4,4,2,1,1,8,1,1,on,none,0,on,3.5,60,ok,4,6,10")
        keys = {bench.key_of(r) for r in (base, etp, uneven)}
        self.assertEqual(len(keys), 3)
        self.assertEqual(bench.key_of(etp),
                         bench.key_of(bench.spec_row(
                             "tp=4,pp=4,dp=2,cp=1,up=1,ep=8,etp=1,vpp=1,mbs=1,sp=on,"
                             "recompute=none,dist_opt=on")))
        self.assertEqual(bench.key_of(uneven),
                         bench.key_of(bench.spec_row(
                             "tp=4,pp=4,pp_first=6,pp_last=10,dp=2,cp=1,up=1,ep=8,vpp=1,mbs=1,"
                             "sp=on,recompute=none,dist_opt=on")))

    def test_a_table_with_two_rows_of_one_configuration_is_refused(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "t.csv")
            with open(path, "w") as f:
                f.write(HEADER + "\n")
                f.write("4,4,2,1,1,8,1,1,on,none,0,on,3.5,60,ok,4,0,0\n")
                f.write("4,4,2,1,1,8,1,1,on,none,0,on,3.9,60,ok,4,0,0\n")
            t = bench.Table("t", "t", "", path, None, None)
            with self.assertRaisesRegex(ValueError, "a second row"):
                t.load()

    def test_distinct_rows_load_with_their_own_times(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "t.csv")
            with open(path, "w") as f:
                f.write(HEADER + "\n")
                f.write("4,4,2,1,1,8,1,1,on,none,0,on,3.5,60,ok,4,0,0\n")
                f.write("4,4,2,1,1,8,1,1,on,none,0,on,3.1,60,ok,4,6,10\n")
            t = bench.Table("t", "t", "", path, None, None)
            t.load()
            self.assertEqual(len(t.time), 2)
            self.assertAlmostEqual(t.best, 3.1)



class DumpTest(unittest.TestCase):
    def test_a_run_that_never_got_within_2_percent_dumps_null(self):
        t = bench.Table("m.interactions.4", "m", "", "unused", "interactions", 4)
        t.time = {"a": 1.0, "b": 1.5}
        t.best = 1.0
        run = {"trials": [("ok", "b", "b"), ("oom", "a", "b")], "stop_reason": "converged",
               "p_improvement": 0.01, "recent_error": 0.5, "proposal_ms": 1.0}
        e = bench.evaluate(run, t)
        r = bench.dump_record(t, "thompson", 3, e)
        self.assertEqual(r["to2"], None)
        self.assertAlmostEqual(r["regret"], 0.5)
        self.assertEqual((r["trials"], r["oom"], r["seed"], r["family"]), (2, 1, 3, "interactions"))
        self.assertEqual(r["stop"], "converged")

    def test_tuning_seeds_are_apart_from_the_held_out_ones(self):
        tuning = set(bench.WORLD_SEEDS["tune"]) | set(bench.WORLD_SEEDS["tune-extra"])
        self.assertFalse(tuning & set(bench.WORLD_SEEDS["held-out"]))


class CalibrationTest(unittest.TestCase):
    def test_the_tail_is_that_of_the_runs_own_claims(self):
        self.assertEqual(bench.tail_probability([0.1, 0.2], 0), 1.0)
        self.assertAlmostEqual(bench.tail_probability([0.5, 0.5], 1), 0.75)
        self.assertAlmostEqual(bench.tail_probability([0.5, 0.5], 2), 0.25)
        self.assertAlmostEqual(bench.tail_probability([0.1, 0.2, 0.3], 3), 0.006)
        self.assertEqual(bench.tail_probability([0.0] * 5, 1), 0.0)

    def test_more_misses_than_the_claims_allow_is_flagged(self):
        # 200 stops claiming 1% each: 2 expected; 3 above 2% is well within it, 8 is not.
        self.assertGreater(bench.tail_probability([0.01] * 200, 3), 0.3)
        self.assertLess(bench.tail_probability([0.01] * 200, 8), 0.01)


class OracleTest(unittest.TestCase):
    def test_rank_follows_the_structure_over_the_configurations_that_fit(self):
        # The structure puts a first, but a does not fit; b is its second and the table's best
        # lies 3% off it; c, last in the structure, is within 2% of the best.
        table = {"a": None, "b": 10.3, "c": 10.1, "d": 10.0}
        structure = {"a": 9.0, "b": 9.5, "c": 9.9, "d": 9.7}
        self.assertEqual(oracle.oracle_rank(table, structure), (2, 2))
        structure["d"] = 9.4
        self.assertEqual(oracle.oracle_rank(table, structure), (1, 2))

    def test_a_row_that_fits_without_a_time_in_the_twin_is_refused(self):
        with self.assertRaises(ValueError):
            oracle.oracle_rank({"a": 1.0}, {"a": None})
        self.assertEqual(oracle.oracle_rank({"a": None}, {"a": 1.0}), (None, 0))


if __name__ == "__main__":
    unittest.main()
