"""The suite's own set-up under pytest-xdist (`make test` runs 2 workers): a test marked `exclusive` runs, its module
fixtures' set-up included, while no other worker is in a test (tests/conftest.py), the others side by side."""
import json
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

LOG_TEST = '''
import json, os, time
import pytest

def log(name, seconds):
    start = time.time()
    time.sleep(seconds)
    with open(os.environ["INTERVALS"], "a") as f:
        f.write(json.dumps([name, os.environ.get("PYTEST_XDIST_WORKER"), start, time.time()]) + "\\n")
'''


def test_an_exclusive_test_runs_alone_and_the_others_side_by_side(tmp_path):
    shutil.copy(os.path.join(ROOT, "tests", "conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_alone.py").write_text(LOG_TEST + "\n@pytest.fixture(scope='module')\ndef big():\n"
                                            "    log('fixture', 0.6)\n\n@pytest.mark.exclusive\ndef test_alone(big):\n"
                                            "    log('alone', 1.0)\n")
    (tmp_path / "test_shared.py").write_text(LOG_TEST + "".join(f"\ndef test_{i}():\n    log('shared{i}', 0.4)\n"
                                                                for i in range(8)))
    env = {key: value for key, value in os.environ.items()  # a session of its own, not this one's lock
           if key not in ("REPLUG_JAX_TEST_LOCK", "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT")}
    env["INTERVALS"] = str(tmp_path / "intervals.jsonl")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "."],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [json.loads(line) for line in open(tmp_path / "intervals.jsonl")]
    assert len(rows) == 10 and {worker for _, worker, _, _ in rows} == {"gw0", "gw1"}
    shared = [row for row in rows if row[0] not in ("alone", "fixture")]
    for alone in ("fixture", "alone"):  # the test and its module fixture's set-up: nothing beside them
        (_, _, start, end), = [row for row in rows if row[0] == alone]
        assert all(s_end <= start or s_start >= end for _, _, s_start, s_end in shared), alone
    # unmarked tests did run side by side: the two workers' intervals overlap somewhere
    assert any(a[1] != b[1] and a[2] < b[3] and b[2] < a[3] for a in shared for b in shared)
