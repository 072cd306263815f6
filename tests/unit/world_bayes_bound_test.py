#!/usr/bin/python3
"""scripts/world_bayes_bound.py: a row's cells (one per pair of knob values, recompute with its
layer count), the knobs it counts as varying, and the searcher's trials to 2% on made-up worlds:
a world whose structure is its truth is solved by the first proposal, and a cell learnt from one
configuration moves the prediction of every configuration that shares it; with --pairs learn, the
pair that explains the measurements is the one drawn as interacting.

usage: world_bayes_bound_test.py SOURCE_DIR   (needs numpy)
"""
import importlib.util
import math
import os
import sys
import unittest

SOURCE_DIR = sys.argv.pop(1) if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__),
                                                                    "..", "..")
sys.path.insert(0, os.path.join(SOURCE_DIR, "scripts"))
spec = importlib.util.spec_from_file_location(
    "world_bayes_bound", os.path.join(SOURCE_DIR, "scripts", "world_bayes_bound.py"))
bound = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bound)
KEY = bound.bench_search.KEY

POLICIES = ["thompson", "ei", "eis", "mcei4"]


def key(tp, pp, mbs=1, recompute="none", layers=0):
    values = dict.fromkeys(KEY, "0")
    values.update(tp=str(tp), pp=str(pp), mbs=str(mbs), recompute=recompute,
                  recompute_layers=str(layers), sp="off", dist_opt="off")
    return tuple(values[c] for c in KEY)


class CellsTest(unittest.TestCase):
    def test_rows_sharing_a_pair_of_values_share_its_cell(self):
        keys = [key(1, 2), key(1, 2, mbs=2), key(2, 2), key(1, 2, recompute="full", layers=1),
                key(1, 2, recompute="full", layers=2)]
        world = bound.World(keys, dict.fromkeys(keys, 1.0), dict.fromkeys(keys, 1.0),
                            bound.WORLD_PAIRS, [0.1] * 4)
        tp_pp = world.cells[:, 0]
        self.assertEqual(tp_pp[0], tp_pp[1])   # mbs does not move the tp×pp cell
        self.assertNotEqual(tp_pp[0], tp_pp[2])
        mbs_recompute = world.cells[:, 1]
        self.assertNotEqual(mbs_recompute[3], mbs_recompute[4])  # recompute with its layers
        self.assertEqual(bound.varying_knobs(keys), ["tp", "mbs", "recompute"])

    def test_a_table_row_that_does_not_fit_is_never_proposed(self):
        keys = [key(1, 1), key(2, 1), key(4, 1)]
        structure = {keys[0]: 1.0, keys[1]: 2.0, keys[2]: 3.0}
        table = {keys[1]: 2.0, keys[2]: 3.0}  # keys[0] runs out of memory
        world = bound.World(keys, structure, table, bound.WORLD_PAIRS, [0.05] * 4)
        for policy in POLICIES:
            self.assertEqual(bound.trials_to_2pct(world, policy, seed=1), 1, policy)


class SearchTest(unittest.TestCase):
    def test_a_world_whose_truth_is_its_structure_takes_one_trial(self):
        # Every prediction equally sure, so the improvement is largest at the lowest mean; the
        # draws of Thompson wander, and only find it.
        keys = [key(tp, pp, mbs) for tp in (1, 2, 4) for pp in (1, 2, 4) for mbs in (1, 2)]
        structure = {k: 1.0 + 0.05 * i for i, k in enumerate(keys)}
        world = bound.World(keys, structure, structure, bound.WORLD_PAIRS, [0.08] * 4)
        for policy in ("ei", "eis"):
            self.assertEqual(bound.trials_to_2pct(world, policy, seed=3), 1, policy)
        for policy in ("thompson", "mcei4"):
            self.assertIsNotNone(bound.trials_to_2pct(world, policy, seed=3), policy)

    def test_a_fast_cell_learnt_from_one_configuration_draws_its_siblings(self):
        # Eight tp×pp cells of structure 1.0-1.07; the cell tp=4,pp=4 runs 30% faster than the
        # structure says. Its siblings at other mbs share the cell: once one is measured, the
        # exact improvement goes to the fastest of them (within 2% of the best) next.
        keys = [key(tp, pp, mbs) for tp in (1, 2, 4) for pp in (1, 2, 4) for mbs in (1, 2, 4)]
        structure = {k: 1.0 + 0.01 * i for i, k in enumerate(keys)}
        table = {k: t * (0.7 if k[0] == "4" and k[1] == "4" else 1.0) for k, t in structure.items()}
        best = min(table, key=table.get)
        world = bound.World(keys, structure, table, [("tp", "pp")], [0.3])
        first = sorted(keys, key=structure.get)
        self.assertNotEqual(first[0], best)
        trials = bound.trials_to_2pct(world, "ei", seed=1)
        self.assertIsNotNone(trials)
        self.assertLess(trials, len(keys) // 2)
        self.assertTrue(math.isclose(world.log_t[keys.index(best)], math.log(table[best])))


class LearnedPairsTest(unittest.TestCase):
    """--pairs learn: which pairs interact is drawn from the measurements."""

    def test_the_pair_that_explains_the_measurements_is_drawn_as_interacting(self):
        # tp×pp's cell tp=4,pp=4 runs 30% faster than the structure; mbs interacts with nothing.
        keys = [key(tp, pp, mbs) for tp in (1, 2, 4) for pp in (1, 2, 4) for mbs in (1, 2, 4)]
        structure = {k: 1.0 + 0.01 * i for i, k in enumerate(keys)}
        table = {k: t * (0.7 if k[0] == "4" and k[1] == "4" else 1.0) for k, t in structure.items()}
        pairs = [("tp", "pp"), ("tp", "mbs"), ("pp", "mbs")]
        world = bound.World(keys, structure, table, pairs, [0.1] * 3)
        measured = list(range(len(keys)))  # every row: the data say which pair it is
        draws = bound.inclusion_draws(world, measured, bound.np.random.default_rng(5), 0.3)
        mean = bound.np.mean(draws, axis=0)
        self.assertGreater(mean[0], 5 * max(mean[1], mean[2], 1e-9))

    def test_the_learning_searcher_never_proposes_a_row_that_does_not_fit(self):
        keys = [key(1, 1), key(2, 1), key(4, 1)]
        structure = {keys[0]: 1.0, keys[1]: 2.0, keys[2]: 3.0}
        table = {keys[1]: 2.0, keys[2]: 3.0}  # keys[0] runs out of memory
        world = bound.World(keys, structure, table, bound.WORLD_PAIRS, [0.05] * 4)
        self.assertEqual(bound.trials_to_2pct_learned(world, seed=1, prior=0.15), 1)


if __name__ == "__main__":
    unittest.main()
