#!/usr/bin/env python3
"""scripts/gpu_bundle.py on this CUDA build, on a machine without a GPU: the bundle holds every
gpu-labelled entry's program and the libraries the build links (none of the CUDA ones, which the GPU
machine brings), `env` points at them and at this machine's CUDA libraries, and `run` launches every
entry from the bundle, reporting each as ctest would (here: skipped for want of a GPU, none failed,
the entries needing more GPUs than given skipped by count) in JUnit files gpu_check_report.py reads.
A missing CUDA library is a clear error naming it.

usage: gpu_bundle_test.py SOURCE_DIR BUILD_DIR   (a CUDA build: it has gpu-labelled entries)
"""
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import unittest

SOURCE_DIR, BUILD_DIR = sys.argv[1], sys.argv[2]
SCRIPT = os.path.join(SOURCE_DIR, "scripts", "gpu_bundle.py")
spec = importlib.util.spec_from_file_location(
    "gpu_check_report", os.path.join(SOURCE_DIR, "scripts", "gpu_check_report.py"))
report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(report)
bundle_spec = importlib.util.spec_from_file_location("gpu_bundle", SCRIPT)
gpu_bundle = importlib.util.module_from_spec(bundle_spec)
bundle_spec.loader.exec_module(gpu_bundle)


def bundle_tool(*args, env=None):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, env=env)


class GpuBundleTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.bundle = os.path.join(cls.tmp.name, "bundle")
        made = bundle_tool("make", BUILD_DIR, cls.bundle)
        assert made.returncode == 0, made.stderr
        with open(os.path.join(cls.bundle, "tests.json")) as f:
            cls.manifest = json.load(f)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_holds_the_programs_and_non_cuda_libraries(self):
        tests = self.manifest["tests"]
        names = {t["name"] for t in tests}
        self.assertIn("cuda_collectives_test_np1", names)
        self.assertIn("gpu_bench_np1", names)
        for t in tests:
            self.assertTrue(os.access(os.path.join(self.bundle, "bin", t["program"]), os.X_OK))
        self.assertTrue(os.access(os.path.join(self.bundle, "bin", "autopar-tune"), os.X_OK))
        libs = set(os.listdir(os.path.join(self.bundle, "lib")))
        self.assertIn("libmpi.so.40", libs)
        self.assertTrue(any(lib.startswith("libprotobuf") for lib in libs))
        for lib in libs:
            self.assertNotRegex(lib, r"^(libcuda|libcudart|libcublas|libnccl|libcudnn|libc\.so)")
        bench = next(t for t in tests if t["name"] == "gpu_bench_np1")
        self.assertIn("AUTOPAR_ATTENTION=cudnn", bench["env"])
        self.assertEqual(bench["ranks"], 1)

    def test_env_points_at_the_bundle_and_the_cuda_libraries(self):
        shown = bundle_tool("env", self.bundle)
        self.assertEqual(shown.returncode, 0, shown.stderr)
        self.assertIn(os.path.join(self.bundle, "lib"), shown.stdout)
        self.assertIn("OMPI_MCA_ess_singleton_isolated='1'", shown.stdout)

    def test_a_missing_cuda_library_is_named(self):
        manifest = dict(self.manifest, cuda_needed=["libnot_a_cuda_library.so.99"])
        broken = os.path.join(self.tmp.name, "broken")
        os.makedirs(os.path.join(broken, "bin"), exist_ok=True)
        with open(os.path.join(broken, "tests.json"), "w") as f:
            json.dump(manifest, f)
        shown = bundle_tool("env", broken)
        self.assertNotEqual(shown.returncode, 0)
        self.assertIn("libnot_a_cuda_library.so.99", shown.stderr)

    def test_run_reports_every_entry_as_ctest_would(self):
        work = os.path.join(self.tmp.name, "work")
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="")  # no GPU, even on a GPU machine
        ran = bundle_tool("run", self.bundle, work, "--gpus", "1", env=env)
        self.assertEqual(ran.returncode, 0, ran.stderr)
        passed, failed, skipped, failed_names, _ = report.junit_counts(
            os.path.join(work, "ctest_gpu.xml"))
        gpu_entries = [t for t in self.manifest["tests"] if "bench" not in t["labels"]]
        self.assertEqual((passed, failed, skipped), (0, 0, len(gpu_entries)), failed_names)
        counts = report.junit_counts(os.path.join(work, "ctest_bench.xml"))
        self.assertEqual(counts[:3], (0, 0, 4))

    def test_run_one_kind_writes_only_its_report(self):
        work = os.path.join(self.tmp.name, "work_bench")
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
        ran = bundle_tool("run", self.bundle, work, "--gpus", "1", "--kind", "bench",
                          "--timeout", "60", "--budget-s", "300", env=env)
        self.assertEqual(ran.returncode, 0, ran.stderr)
        self.assertFalse(os.path.exists(os.path.join(work, "ctest_gpu.xml")))
        counts = report.junit_counts(os.path.join(work, "ctest_bench.xml"))
        self.assertEqual(counts[:3], (0, 0, 4))


class EntryTimeoutTest(unittest.TestCase):
    """gpu_check.sh's time budget: no entry may outlive what is left of it."""

    def test_an_entry_gets_the_budget_left_at_most(self):
        self.assertEqual(gpu_bundle.entry_timeout(60, 0, 1000.0), 60)  # no budget
        self.assertEqual(gpu_bundle.entry_timeout(60, 300, 10.0), 60)
        self.assertEqual(gpu_bundle.entry_timeout(60, 300, 270.5), 29)
        self.assertEqual(gpu_bundle.entry_timeout(60, 300, 300.0), 0)  # spent: not run
        self.assertEqual(gpu_bundle.entry_timeout(60, 300, 999.0), 0)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
