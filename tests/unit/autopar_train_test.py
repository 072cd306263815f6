#!/usr/bin/env python3
"""launcher/autopar-train, run as a user would against a made-up study directory: every
parallelism flag of the training command replaced by the study's best.args in each of Megatron-LM's
forms (a value, `--flag=value`, a list), the command's other flags kept in their order, the flags
kept only while the new configuration allows them, and the conflicting pairs refused.

usage: autopar_train_test.py SOURCE_DIR
"""
import os
import shlex
import subprocess
import sys
import tempfile
import unittest

SOURCE_DIR = None

# Megatron-LM's parallelism flags (NVIDIA/Megatron-LM d98e8a6) and one value of each that no
# best.args below holds. Written out here, not read from the launcher, so a flag it forgets fails.
VALUED = {
    "--tensor-model-parallel-size": "3", "--pipeline-model-parallel-size": "3",
    "--context-parallel-size": "3", "--expert-model-parallel-size": "3",
    "--expert-tensor-parallel-size": "3",
    "--num-layers-per-virtual-pipeline-stage": "3", "--num-virtual-stages-per-pipeline-rank": "3",
    "--microbatch-group-size-per-virtual-pipeline-stage": "3",
    "--decoder-first-pipeline-num-layers": "3", "--decoder-last-pipeline-num-layers": "3",
    "--pipeline-model-parallel-layout": "Et|(tt|)*3,t|tL",
    "--micro-batch-size": "3", "--global-batch-size": "3",
    "--recompute-granularity": "full", "--recompute-method": "block", "--recompute-num-layers": "3",
    "--num-distributed-optimizer-instances": "3",
    "--virtual-pipeline-model-parallel-size": "3", "--model-parallel-size": "3",
    "--batch-size": "3",
}
LISTS = {
    "--cp-comm-type": ["a2a", "p2p", "a2a+p2p"],
    "--hierarchical-context-parallel-sizes": ["3", "5"],
    "--recompute-modules": ["core_attn", "mlp", "moe_act"],
}
SWITCHES = [
    "--sequence-parallel", "--account-for-embedding-in-pipeline-split",
    "--account-for-loss-in-pipeline-split", "--recompute-activations",
    "--distribute-saved-activations", "--moe-layer-recompute", "--use-distributed-optimizer",
    "--overlap-grad-reduce", "--overlap-param-gather", "--checkpoint-activations",
]
BEST = ("--tensor-model-parallel-size 4 --pipeline-model-parallel-size 2 --micro-batch-size 1 "
        "--global-batch-size 64 --sequence-parallel --use-distributed-optimizer "
        "--overlap-grad-reduce --overlap-param-gather --grad-reduce-in-bf16")
PREFIX = ["torchrun", "--nproc-per-node", "8", "--nnodes", "2", "pretrain_gpt.py"]


class AutoparTrain(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.study = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def run_launcher(self, best, command, launcher_args=()):
        """(exit code, stdout words, stderr) of autopar-train with best.args holding `best`."""
        if best is not None:
            with open(os.path.join(self.study, "best.args"), "w") as f:
                f.write(best + "\n")
        launcher = os.path.join(SOURCE_DIR, "launcher", "autopar-train")
        r = subprocess.run([sys.executable, launcher, "--study", self.study, *launcher_args, "--",
                            *command], capture_output=True, text=True, timeout=60)
        return r.returncode, shlex.split(r.stdout), r.stderr

    def replaced(self, user_words, best=BEST):
        """The launcher's command for PREFIX + user_words, checked to exit 0."""
        rc, out, err = self.run_launcher(best, PREFIX + user_words)
        self.assertEqual(rc, 0, err)
        return out

    def interleave(self, forms):
        """The user's command: each form between flags of the user's own that must stay."""
        words, kept = [], []
        for i, form in enumerate(forms):
            mine = [f"--keep-{i}", f"v{i}"]
            words += mine + form
            kept += mine
        return words + ["--keep-last"], kept + ["--keep-last"]

    def check_all_removed(self, forms):
        words, kept = self.interleave(forms)
        self.assertEqual(self.replaced(words), PREFIX + kept + BEST.split())

    def test_valued_flags_removed_with_their_value(self):
        self.check_all_removed([[flag, value] for flag, value in VALUED.items()])

    def test_valued_flags_removed_in_the_equals_form(self):
        self.check_all_removed([[f"{flag}={value}"] for flag, value in VALUED.items()])

    def test_lists_removed_with_all_their_values(self):
        self.check_all_removed([[flag, *values] for flag, values in LISTS.items()])

    def test_lists_removed_in_the_equals_form(self):
        # argparse gives `--cp-comm-type=a2a` that one value; a word after it is not the flag's.
        words, kept = self.interleave([[f"{flag}={values[0]}"] for flag, values in LISTS.items()])
        self.assertEqual(self.replaced(words), PREFIX + kept + BEST.split())

    def test_switches_removed(self):
        self.check_all_removed([[flag] for flag in SWITCHES])

    def test_other_flags_kept_in_order(self):
        user = ["--num-layers", "32", "--hidden-size", "4096", "--bf16", "--lr", "-1e-4",
                "--data-path", "a", "b", "--tensor-model-parallel-size", "8", "--seq-length=4096",
                "--tp-comm-overlap-cfg", "cfg.yaml", "--no-align-param-gather"]
        kept = [w for w in user if w not in ("--tensor-model-parallel-size", "8")]
        self.assertEqual(self.replaced(user), PREFIX + kept + BEST.split())

    def test_flags_before_the_script_untouched(self):
        # torchrun's own flags are not the script's, even when they look like them.
        command = ["torchrun", "--micro-batch-size", "9", "train.py", "--micro-batch-size", "2"]
        rc, out, err = self.run_launcher(BEST, command)
        self.assertEqual(rc, 0, err)
        self.assertEqual(out, command[:4] + BEST.split())

    def test_one_quoted_command_split_like_a_shell(self):
        rc, out, err = self.run_launcher(BEST, ["python3 pretrain_gpt.py --lr 1 --sequence-parallel"])
        self.assertEqual(rc, 0, err)
        self.assertEqual(out, ["python3", "pretrain_gpt.py", "--lr", "1"] + BEST.split())

    def test_best_args_comments_skipped(self):
        self.assertEqual(self.replaced(["--lr", "1"], best="# study x\n" + BEST),
                         PREFIX + ["--lr", "1"] + BEST.split())

    def test_stderr_lists_what_was_replaced(self):
        rc, _, err = self.run_launcher(BEST, PREFIX + ["--context-parallel-size", "2", "--lr", "1"])
        self.assertEqual(rc, 0, err)
        self.assertIn("replaced: --context-parallel-size 2", err)

    def test_dispatcher_replaced_only_when_best_names_one(self):
        user = ["--moe-token-dispatcher-type", "flex", "--lr", "1"]
        self.assertEqual(self.replaced(user), PREFIX + user + BEST.split())
        best = BEST + " --expert-model-parallel-size 8 --moe-token-dispatcher-type alltoall"
        self.assertEqual(self.replaced(user, best=best), PREFIX + ["--lr", "1"] + best.split())

    def test_any_flag_of_best_args_replaces_the_users(self):
        best = BEST + " --some-future-flag 7"
        self.assertEqual(self.replaced(["--some-future-flag", "3", "--lr", "1"], best=best),
                         PREFIX + ["--lr", "1"] + best.split())

    def test_tp_comm_overlap_kept_with_tp_and_sequence_parallel(self):
        user = ["--lr", "1", "--tp-comm-overlap", "--bf16"]
        self.assertEqual(self.replaced(user), PREFIX + user + BEST.split())

    def test_tp_comm_overlap_dropped_without_tp(self):
        best = BEST.replace("--tensor-model-parallel-size 4", "--tensor-model-parallel-size 1")
        rc, out, err = self.run_launcher(best, PREFIX + ["--tp-comm-overlap", "--bf16"])
        self.assertEqual(rc, 0, err)
        self.assertEqual(out, PREFIX + ["--bf16"] + best.split())
        self.assertIn("dropped --tp-comm-overlap", err)
        self.assertIn("--tensor-model-parallel-size 1", err)

    def test_tp_comm_overlap_dropped_without_sequence_parallel(self):
        best = BEST.replace(" --sequence-parallel", "")
        rc, out, err = self.run_launcher(best, PREFIX + ["--tp-comm-overlap", "--bf16"])
        self.assertEqual(rc, 0, err)
        self.assertEqual(out, PREFIX + ["--bf16"] + best.split())
        self.assertIn("dropped --tp-comm-overlap", err)
        self.assertIn("--sequence-parallel", err)

    def test_optimizer_step_overlap_needs_virtual_stages(self):
        user = ["--overlap-param-gather-with-optimizer-step", "--bf16"]
        rc, out, err = self.run_launcher(BEST, PREFIX + user)
        self.assertEqual(rc, 0, err)
        self.assertEqual(out, PREFIX + ["--bf16"] + BEST.split())
        self.assertIn("dropped --overlap-param-gather-with-optimizer-step", err)
        best = BEST + " --num-virtual-stages-per-pipeline-rank 2"
        self.assertEqual(self.replaced(user, best=best), PREFIX + user + best.split())

    def test_no_p2p_overlap_dropped_with_virtual_stages_on_two_stages(self):
        user = ["--num-layers", "32", "--no-overlap-p2p-communication"]
        best = BEST + " --num-layers-per-virtual-pipeline-stage 4"
        rc, out, err = self.run_launcher(best, PREFIX + user)
        self.assertEqual(rc, 0, err)
        self.assertEqual(out, PREFIX + ["--num-layers", "32"] + best.split())
        self.assertIn("dropped --no-overlap-p2p-communication", err)
        # 32 layers / pp 2 in stages of 16: no interleaving, Megatron turns the overlap off itself.
        best = BEST + " --num-layers-per-virtual-pipeline-stage 16"
        self.assertEqual(self.replaced(user, best=best), PREFIX + user + best.split())
        best = BEST.replace("--pipeline-model-parallel-size 2", "--pipeline-model-parallel-size 4")
        best += " --num-virtual-stages-per-pipeline-rank 2"
        self.assertEqual(self.replaced(user, best=best), PREFIX + user + best.split())

    def check_conflict(self, best, user, first, second):
        rc, out, err = self.run_launcher(best, PREFIX + user)
        self.assertEqual(rc, 2, f"{first} with {second} was not refused: {out} {err}")
        self.assertEqual(out, [])
        lines = [line for line in err.splitlines() if "conflict:" in line]
        self.assertTrue(any(first in line and second in line for line in lines),
                        f"no line names {first} and {second}:\n{err}")

    def test_conflicts_refused(self):
        cases = [
            # (added to best.args, the user's command, the two flags the message names)
            ("--virtual-pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 4",
             [], "--virtual-pipeline-model-parallel-size", "--num-layers-per-virtual-pipeline-stage"),
            ("--virtual-pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2",
             [], "--virtual-pipeline-model-parallel-size", "--num-virtual-stages-per-pipeline-rank"),
            ("--num-layers-per-virtual-pipeline-stage 4 --num-virtual-stages-per-pipeline-rank 2",
             [], "--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank"),
            ("--num-virtual-stages-per-pipeline-rank 2 --pipeline-model-parallel-layout Et|t|t|tL",
             [], "--num-virtual-stages-per-pipeline-rank", "--pipeline-model-parallel-layout"),
            ("--num-layers-per-virtual-pipeline-stage 4 --decoder-first-pipeline-num-layers 6",
             [], "--num-layers-per-virtual-pipeline-stage", "--decoder-first-pipeline-num-layers"),
            ("--decoder-last-pipeline-num-layers 6 --account-for-loss-in-pipeline-split",
             [], "--decoder-last-pipeline-num-layers", "--account-for-loss-in-pipeline-split"),
            ("--pipeline-model-parallel-layout Et|t|t|tL --account-for-embedding-in-pipeline-split",
             [], "--pipeline-model-parallel-layout", "--account-for-embedding-in-pipeline-split"),
            ("--pipeline-model-parallel-layout Et|t|tL", [],
             "--pipeline-model-parallel-layout", "--pipeline-model-parallel-size"),
            ("--num-virtual-stages-per-pipeline-rank 2", ["--hybrid-layer-pattern", "M*M*"],
             "--hybrid-layer-pattern", "--num-virtual-stages-per-pipeline-rank"),
            ("", ["--num-layers", "31"], "--num-layers", "--pipeline-model-parallel-size"),
            ("--num-layers-per-virtual-pipeline-stage 3", ["--num-layers", "32"],
             "--num-layers", "--num-layers-per-virtual-pipeline-stage"),
            ("--num-virtual-stages-per-pipeline-rank 3", ["--num-layers", "32"],
             "--num-layers", "--num-virtual-stages-per-pipeline-rank"),
            ("--num-virtual-stages-per-pipeline-rank 2 --decoder-first-pipeline-num-layers 5",
             ["--num-layers", "32"], "--decoder-first-pipeline-num-layers",
             "--num-virtual-stages-per-pipeline-rank"),
            ("--decoder-first-pipeline-num-layers 16 --decoder-last-pipeline-num-layers 8",
             ["--num-layers", "32"], "--num-layers", "--decoder-first-pipeline-num-layers"),
            ("--num-virtual-stages-per-pipeline-rank 2 --decoder-last-pipeline-num-layers 4",
             ["--num-layers", "31"], "--num-layers", "--decoder-last-pipeline-num-layers"),
            ("--recompute-activations --recompute-granularity full --recompute-method uniform "
             "--recompute-num-layers 1", [], "--recompute-activations", "--recompute-granularity"),
            ("--recompute-granularity selective --recompute-method block", [],
             "--recompute-granularity selective", "--recompute-method"),
            ("--recompute-granularity full --recompute-num-layers 1", [],
             "--recompute-granularity full", "--recompute-method"),
            ("--moe-layer-recompute --recompute-granularity full --recompute-method uniform "
             "--recompute-num-layers 1", [], "--moe-layer-recompute", "--recompute-granularity"),
            ("--distribute-saved-activations --recompute-granularity full --recompute-method "
             "uniform --recompute-num-layers 1", [], "--distribute-saved-activations",
             "--sequence-parallel"),
            ("--cp-comm-type a2a+p2p --context-parallel-size 4", [],
             "--cp-comm-type a2a+p2p", "--hierarchical-context-parallel-sizes"),
            ("--context-parallel-size 4 --cp-comm-type a2a+p2p "
             "--hierarchical-context-parallel-sizes 2 4", [],
             "--hierarchical-context-parallel-sizes", "--context-parallel-size"),
            ("", ["--hybrid-context-parallel"], "--hybrid-context-parallel",
             "--pipeline-model-parallel-size"),
            ("", ["--tensor-parallel-num-weight-shards", "6"],
             "--tensor-parallel-num-weight-shards", "--tensor-model-parallel-size"),
            ("", ["--use-torch-fsdp2"], "--use-torch-fsdp2", "--use-distributed-optimizer"),
            ("", ["--seq-length", "4096", "--lr", "1", "--seq-length=8192"],
             "--seq-length", "'4096' and '8192'"),
            ("--expert-model-parallel-size 2 --expert-model-parallel-size 4", [],
             "--expert-model-parallel-size", "'2' and '4'"),
            ("--no-foo", ["--foo"], "--foo", "--no-foo"),
        ]
        for added, user, first, second in cases:
            with self.subTest(first=first, second=second):
                self.check_conflict(f"{BEST} {added}", user, first, second)

    def test_overlaps_need_what_they_overlap(self):
        self.check_conflict(BEST.replace(" --use-distributed-optimizer", ""), [],
                            "--overlap-param-gather", "--use-distributed-optimizer")
        self.check_conflict(BEST.replace(" --overlap-grad-reduce", ""), [],
                            "--overlap-param-gather", "--overlap-grad-reduce")
        # Dropped from the user's command, refused from best.args.
        self.check_conflict(BEST.replace(" --sequence-parallel", "") + " --tp-comm-overlap", [],
                            "--tp-comm-overlap", "--sequence-parallel")
        self.check_conflict(BEST.replace(" --use-distributed-optimizer", ""),
                            ["--fp8-param-gather"], "--fp8-param-gather",
                            "--use-distributed-optimizer")

    def test_consistent_configurations_pass(self):
        for added, user in [
                ("--num-virtual-stages-per-pipeline-rank 2 --decoder-first-pipeline-num-layers 6",
                 ["--num-layers", "30"]),
                ("--num-virtual-stages-per-pipeline-rank 4", ["--num-layers", "32"]),
                ("--decoder-last-pipeline-num-layers 15", ["--num-layers", "32"]),
                ("--pipeline-model-parallel-layout Et|(t|)*2,tL", ["--num-layers", "4"]),
                ("--context-parallel-size 8 --cp-comm-type a2a+p2p "
                 "--hierarchical-context-parallel-sizes 2 4", []),
                ("--recompute-granularity full --recompute-method block --recompute-num-layers 2",
                 []),
                ("", ["--seq-length", "4096", "--seq-length=4096", "--bf16", "--bf16"]),
                ("", ["--tensor-parallel-num-weight-shards", "8"])]:
            with self.subTest(added=added, user=user):
                self.assertEqual(self.replaced(user, best=f"{BEST} {added}"),
                                 PREFIX + user + f"{BEST} {added}".split())

    def test_bad_inputs(self):
        rc, _, err = self.run_launcher(None, PREFIX)
        self.assertEqual(rc, 1)
        self.assertIn("best.args", err)
        rc, _, err = self.run_launcher("# nothing", PREFIX)
        self.assertEqual(rc, 2)
        self.assertIn("holds no flags", err)
        rc, _, err = self.run_launcher(BEST.replace("size 4", "size four"), PREFIX)
        self.assertEqual(rc, 2)
        self.assertIn("--tensor-model-parallel-size: expected an integer, got 'four'", err)
        rc, _, err = self.run_launcher("stray " + BEST, PREFIX)
        self.assertEqual(rc, 2)
        self.assertIn("'stray'", err)
        launcher = os.path.join(SOURCE_DIR, "launcher", "autopar-train")
        r = subprocess.run([sys.executable, launcher, "--study", self.study], capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(r.returncode, 2)
        self.assertIn("after `--`", r.stderr)

    def test_the_flag_table_beside_the_script(self):
        """The rules are launcher/megatron_flags.txt's, read from beside the script (through a
        symlink to it); without the table, or with a line it cannot read, exit 1 naming it."""
        with open(os.path.join(self.study, "best.args"), "w") as f:
            f.write(BEST + "\n")
        source = os.path.join(SOURCE_DIR, "launcher")
        elsewhere = os.path.join(self.study, "bin")
        os.makedirs(elsewhere)
        os.symlink(os.path.join(source, "autopar-train"), os.path.join(elsewhere, "autopar-train"))
        alone = os.path.join(self.study, "alone")
        os.makedirs(alone)
        with open(os.path.join(source, "autopar-train")) as f, \
                open(os.path.join(alone, "autopar-train"), "w") as g:
            g.write(f.read())
        for launcher, rc, said in [(os.path.join(elsewhere, "autopar-train"), 0, ""),
                                   (os.path.join(alone, "autopar-train"), 1, "megatron_flags.txt")]:
            r = subprocess.run([sys.executable, launcher, "--study", self.study, "--",
                                *PREFIX, "--tensor-model-parallel-size", "8"],
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, rc, r.stderr)
            self.assertIn(said, r.stderr)
        with open(os.path.join(alone, "megatron_flags.txt"), "w") as f:
            f.write("--tensor-model-parallel-size three replaced\n")
        r = subprocess.run([sys.executable, os.path.join(alone, "autopar-train"), "--study",
                            self.study, "--", *PREFIX], capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 1)
        self.assertIn("megatron_flags.txt:1", r.stderr)


if __name__ == "__main__":
    SOURCE_DIR = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                                 os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    unittest.main(argv=[sys.argv[0]], verbosity=2)
