"""Every experiment script experiments/README.md cites still runs: each at a tiny size, in a process of its own as its
table's command runs it, writing its table (slow tier: each runs whole jobs). posterior_qa.py, posterior_tables.py and
qa_lsr_pools.py have checks of their own figures (tests/test_posterior.py, tests/test_qa_lsr.py)."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# script -> (its tiny arguments, WORK standing for the test's folder; the file its table is written to, or None:
# printed)
TINY = {
    "lsr_grid": (["run", "qs_sum_b0.1_96x3", "--root", "WORK", "--set", "steps=1", "--set", "max_eval_docs=1",
                  "--set", "max_windows_per_doc=1", "--set", "max_train_examples=2", "--set", "batch_size=2",
                  "--set", "checkpoint_every=1"], "qs_sum_b0.1_96x3/results.json"),
    "lsr_headroom": (["--cache_dir", "WORK/shared", "--lm_cache", "WORK/lm_cache.sqlite", "--depth", "2", "--k", "1",
                      "--every", "40", "--seeds", "1", "--out", "WORK/headroom.json"], "headroom.json"),
    "methods_compared": (["--datasets", "nq", "--nq_retrieval", "examples/own_data/retrieval.json", "--ks", "2",
                          "--nq_questions", "2", "--workdir", "WORK"], "table.md"),
    "posterior_sweep": (["--workdir", "WORK", "--heldout", "2", "--dev", "2", "--depth", "4"], "table.md"),
    "posterior_windows": (["--workdir", "WORK", "--eval_docs", "1", "--windows_per_doc", "1"], "table.md"),
    "qa_headroom": (["--questions", "2", "--depth", "2", "--k", "1", "--cache_dir", "WORK/shared", "--lm_cache",
                     "WORK/lm_cache.sqlite", "--out", "WORK/headroom.json"], "headroom.json"),
    "qa_lsr": (["--questions", "2", "--workdir", "WORK", "--set", "steps=1", "--set", "batch_size=2",
                "--set", "max_train_examples=2"], "table.md"),
    "reader_effects": (["--lms", "smollm2", "--tasks", "sciq_mc", "--questions", "2", "--workdir", "WORK"],
                       "effects.md"),
}


@pytest.mark.slow  # each script once, at a tiny size
@pytest.mark.parametrize("script", sorted(TINY))
def test_the_experiment_script_runs_at_a_tiny_size(script, tmp_path):
    args, written = TINY[script]
    args = [a.replace("WORK", str(tmp_path)) for a in args]
    done = subprocess.run([sys.executable, os.path.join("experiments", f"{script}.py"), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=2400)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    assert os.path.getsize(tmp_path / written) > 0
    if script == "lsr_grid":  # the grid's table reads the cell back from --root
        table = subprocess.run([sys.executable, "experiments/lsr_grid.py", "table", "--root", str(tmp_path)],
                               cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert table.returncode == 0 and "| qs_sum_b0.1_96x3 |" in table.stdout, table.stderr[-2000:]
