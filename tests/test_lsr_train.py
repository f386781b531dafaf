"""REPLUG LSR end to end: training runs, refreshes its index, and survives SIGKILL exactly."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests import lsr_tiny_run

SCRIPT = os.path.join(os.path.dirname(__file__), "lsr_tiny_run.py")
STEPS = 9
# index version serving step t (t = 1..9) with refresh_every=3, swap_after=1 (lsr_tiny_run.SETTINGS): a build
# requested after step s is swapped in at the first maybe_swap (start of a step) with step >= s + swap_after
EXPECTED_INDEX_VERSIONS = [0, 0, 0, 1, 1, 1, 2, 2, 2]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return lsr_tiny_run.save_models(tmp_path_factory.mktemp("models"))


def run(models, workdir, delay=0.0):
    return subprocess.Popen([sys.executable, SCRIPT, models, str(workdir), str(STEPS), str(delay)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def metrics(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.mark.slow  # a second check: test_lsr_loop's crash-and-resume keeps the resume in the core suite
def test_killed_run_resumes_to_the_same_parameters_and_losses(models, tmp_path):
    reference = tmp_path / "reference"
    proc = run(models, reference)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    ref_metrics = metrics(reference)
    assert [m["step"] for m in ref_metrics] == list(range(1, STEPS + 1))
    # refresh_every=3, swap_after=1: version 0 (the initial index) serves steps 1-3; the build requested after
    # step 3 is swapped in by maybe_swap at the start of step 4 (3 + swap_after), the one requested after step 6
    # at step 7; none is requested after the last step (9)
    assert [m["index_version"] for m in ref_metrics] == EXPECTED_INDEX_VERSIONS
    assert [m["step"] for m in ref_metrics if m.get("refresh_swapped")] == [4, 7]
    assert all(m["refresh_ok"] for m in ref_metrics if m.get("refresh_swapped"))
    assert os.path.isfile(reference / "loss.png") and os.listdir(reference / "tensorboard")

    killed = tmp_path / "killed"
    proc = run(models, killed, delay=0.4)
    deadline = time.time() + 300
    while time.time() < deadline:  # kill after step 5 was logged (a checkpoint exists at step 4)
        if os.path.isfile(killed / "metrics.jsonl") and len(metrics(killed)) >= 5:
            break
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert len(metrics(killed)) < STEPS, "the run finished before it could be killed"
    proc = run(models, killed)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    resumed = metrics(killed)
    assert [m["step"] for m in resumed] == list(range(1, STEPS + 1))
    np.testing.assert_allclose([m["loss"] for m in resumed], [m["loss"] for m in ref_metrics], rtol=1e-5, atol=1e-7)
    assert [m["index_version"] for m in resumed] == [m["index_version"] for m in ref_metrics]
    a, b = np.load(reference / "final_params.npz"), np.load(killed / "final_params.npz")
    for key in a.files:
        np.testing.assert_allclose(a[key], b[key], rtol=1e-5, atol=1e-7)
    # the resumed run took its LM scores of the first steps from the cache
    assert resumed[-1]["cache_hits"] > 0
