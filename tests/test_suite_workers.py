"""The suite's own set-up under pytest-xdist (`make test` runs 2 workers): a test marked `exclusive` runs, its module
fixtures' set-up included, while no other worker is in a test (tests/conftest.py), the others side by side."""
import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def own_session_env(*also_drop: str) -> dict[str, str]:
    """This environment for a pytest session of its own: without this session's lock and worker variables (and
    `also_drop`)."""
    drop = ("REPLUG_JAX_TEST_LOCK", "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT") + also_drop
    return {key: value for key, value in os.environ.items() if key not in drop}

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
    env = own_session_env()
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


def test_an_exclusive_test_skipped_by_a_true_condition_does_not_wait_to_be_alone(tmp_path):
    """A reader test whose LM is not installed (`skipif(True)`) takes the shared lock: pytest reads skipif inside the
    lock, and waiting alone for a skip idled a worker while the other stayed busy."""
    conftest = open(os.path.join(ROOT, "tests", "conftest.py")).read()
    (tmp_path / "conftest.py").write_text(conftest + "\n\ndef pytest_collection_finish(session):\n"
                                          "    for item in session.items:\n"
                                          "        print('RUNS_ALONE', item.name, _runs_alone(item))\n")
    (tmp_path / "test_marks.py").write_text(
        "import pytest\n\n@pytest.mark.exclusive\ndef test_alone():\n    pass\n\n"
        "@pytest.mark.exclusive\n@pytest.mark.skipif(True, reason='not installed')\ndef test_skipped():\n    pass\n\n"
        "@pytest.mark.exclusive\n@pytest.mark.skipif(False, reason='installed')\ndef test_installed():\n    pass\n\n"
        "@pytest.mark.exclusive\n@pytest.mark.parametrize('name', [pytest.param('a', marks=pytest.mark.skipif(True, "
        "reason='x')), 'b'])\ndef test_param(name):\n    pass\n\ndef test_plain():\n    pass\n")
    env = own_session_env()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "--collect-only", "."],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    found = dict(line.split()[1:] for line in done.stdout.splitlines() if line.startswith("RUNS_ALONE"))
    assert found == {"test_alone": "True", "test_skipped": "False", "test_installed": "True", "test_param[a]": "False",
                     "test_param[b]": "True", "test_plain": "False"}


def test_workers_take_the_longest_files_first(tmp_path):
    """Under `--dist loadfile` the files go to the workers in LONGEST_FIRST's order (tests/conftest.py), not in
    pytest-xdist's own order by test count, which handed the two-test, four-minute test_readme.py out last."""
    shutil.copy(os.path.join(ROOT, "tests", "conftest.py"), tmp_path / "conftest.py")
    for name, count in (("test_harness.py", 1), ("test_readme.py", 1), ("test_many.py", 12)):
        (tmp_path / name).write_text(LOG_TEST + "".join(f"\ndef test_{i}():\n    log('{name}', 0.1)\n"
                                                        for i in range(count)))
    env = own_session_env()
    env["INTERVALS"] = str(tmp_path / "intervals.jsonl")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist",
                           "loadfile", "."], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = sorted(json.loads(line) for line in open(tmp_path / "intervals.jsonl"))
    first = {worker: min((start, name) for name, w, start, _ in rows if w == worker)[1] for worker in ("gw0", "gw1")}
    assert sorted(first.values()) == ["test_harness.py", "test_readme.py"], first


def test_the_processes_a_test_launches_reuse_compiled_modules():
    """A process the suite launches writes and reads compiled modules (each of the suite's processes would otherwise
    compile torch, transformers and jax from source: PYTHONDONTWRITEBYTECODE on the CI machines), to the session's
    folder where that variable was set (tests/conftest.py)."""
    probe = ("import importlib.util, os, sys; import replug_jax.jobs.downstream as m; "
             "print(sys.flags.dont_write_bytecode, os.path.exists(importlib.util.cache_from_source(m.__file__)))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["0", "True"], done.stdout + done.stderr[-2000:]


def test_a_later_run_of_the_suite_reads_back_the_programs_an_earlier_one_compiled(tmp_path):
    """The suite's XLA compilation cache outlives its run (tests/conftest.py: one folder per CPU kind, under
    ~/.cache, or $REPLUG_JAX_TEST_XLA_CACHE): a second session compiles nothing the first compiled."""
    shutil.copy(os.path.join(ROOT, "tests", "conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_compiles.py").write_text(
        "import os, jax, jax.numpy as jnp, jax.monitoring as m\n\n"
        "def test_compile():\n"
        "    hits = []\n"
        "    m.register_event_listener(lambda event, **kw: hits.append(event) if 'cache_hits' in event else None)\n"
        "    jax.jit(lambda x: jnp.sin(x) * 3 + jnp.cos(x))(jnp.arange(7.0)).block_until_ready()\n"
        "    print('CACHE', os.environ['JAX_COMPILATION_CACHE_DIR'], len(hits))\n")
    env = own_session_env("JAX_COMPILATION_CACHE_DIR")  # with its own cache folder
    env["REPLUG_JAX_TEST_XLA_CACHE"] = str(tmp_path / "xla")
    said = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "."],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        said.append([line.split()[1:] for line in done.stdout.splitlines() if line.startswith("CACHE")][0])
    assert [folder for folder, _ in said] == [str(tmp_path / "xla")] * 2
    assert said[0][1] == "0" and int(said[1][1]) >= 1, said  # the jitted function (and jnp.arange's program)


def test_the_suites_xla_cache_drops_entries_written_long_ago(tmp_path):
    """An entry written 15 days ago goes as a session starts; one of yesterday stays."""
    import time

    from tests.conftest import prune_old_entries

    old, recent = tmp_path / "old-cache", tmp_path / "recent-cache"
    for path, days in ((old, 15), (recent, 1)):
        path.write_bytes(b"x")
        os.utime(path, (time.time() - days * 86400,) * 2)
    prune_old_entries(str(tmp_path))
    assert not old.exists() and recent.exists()
    prune_old_entries(str(tmp_path / "absent"))  # no folder yet: nothing to do


def test_a_worker_keeps_its_compiled_programs_for_the_next_module_until_its_memory_limit(tmp_path):
    """Two modules call one jitted function: traced once while the process holds less than the limit (a quarter of
    the machine's memory), again in the second module once it holds more (the programs dropped after the first)."""
    shutil.copy(os.path.join(ROOT, "tests", "conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "shared_program.py").write_text(
        "import os\nimport jax\n\n@jax.jit\ndef double(x):\n"
        "    with open(os.environ['TRACES'], 'a') as f:\n        f.write('traced\\n')\n    return 2 * x\n")
    for name in ("a", "b"):
        (tmp_path / f"test_{name}.py").write_text("from shared_program import double\n\n"
                                                  f"def test_{name}():\n    assert float(double(1.0)) == 2.0\n")
    traces = {}
    for limit in (None, "0"):
        env = own_session_env("REPLUG_JAX_TEST_KEEP_PROGRAMS_BELOW")
        env["TRACES"] = str(tmp_path / f"traces_{limit}.txt")
        if limit is not None:
            env["REPLUG_JAX_TEST_KEEP_PROGRAMS_BELOW"] = limit
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                               "test_a.py", "test_b.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        traces[limit] = open(env["TRACES"]).read().count("traced")
    assert traces == {None: 1, "0": 2}


def test_the_torch_reference_is_read_back_from_the_saved_copy(tmp_path, monkeypatch):
    """Once transformers' load of a GGUF (the PyTorch reference) is saved, later processes read the copy, never the
    GGUF: here the copy is a tiny model of its own beside bytes that are no GGUF at all, and it is what loads.
    (test_real_weights.py, `slow`: the saved copy equals a fresh load bit for bit.)"""
    import torch

    from tests import hf_tiny
    from tests.conftest import load_torch_reference, torch_reference_dir

    monkeypatch.setenv("REPLUG_JAX_TEST_TORCH_REFERENCE", str(tmp_path / "reference"))
    not_a_gguf = tmp_path / "model.gguf"
    not_a_gguf.write_bytes(b"no GGUF here")
    want = hf_tiny.tiny_qwen2(torch_reference_dir(str(not_a_gguf)))  # saved where the reference of that file goes
    model, tokenizer = load_torch_reference(str(not_a_gguf))
    got, expected = model.state_dict(), want.state_dict()
    assert got.keys() == expected.keys() and all(torch.equal(got[key], expected[key]) for key in expected)
    assert tokenizer("ab").input_ids
    not_a_gguf.write_bytes(b"other bytes")  # another file's reference is another folder: not there, so a load
    with pytest.raises(Exception):
        load_torch_reference(str(not_a_gguf))
