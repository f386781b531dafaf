"""What `python -m replug_jax.main` shows a person: phase lines, progress bars and the table on the console;
library INFO (JAX's backend probe, FAISS's loader, absl) only in WORKDIR/log.txt unless --verbosity asks."""
import json
import os
import subprocess
import sys

import pytest

from tests import hf_tiny

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOPICS = ["the river flows to the sea past the old mill", "stars shine over the quiet desert at night",
          "bread rises in the warm kitchen oven", "the violin plays a slow sad song"]
CONFIG = """from ml_collections import config_dict
def get_config():
    return config_dict.ConfigDict(dict(
        job="lm_eval", corpus={corpus!r}, eval_data={heldout!r}, encoder={enc!r}, lm={lm!r}, k=2, k_sweep=(1, 2),
        temperature=1.0, bm25_temperature=1.0, doc_tokens=24, query_tokens=16, context_tokens=16, stride_tokens=24,
        max_eval_docs=2, max_windows_per_doc=2, methods=("replug", "concat"), metric="cosine", index_factory="Flat",
        embedding_dtype="float32", lm_batch_size=8, lm_max_length=0, encoder_batch_size=8, seed=0, dtype="float32"))
"""


@pytest.fixture(scope="module")
def config_file(tmp_path_factory):
    root = tmp_path_factory.mktemp("console")
    hf_tiny.tiny_gpt2(str(root / "lm"), positions=256)
    hf_tiny.tiny_bert(str(root / "enc"))
    for name, n in (("corpus", 6), ("heldout", 2)):
        with open(root / f"{name}.jsonl", "w") as f:
            for i in range(n):
                text = " ".join(TOPICS[(i + j) % 4] for j in range(4)) + "."
                f.write(json.dumps({"id": f"{name}{i}", "title": f"T{i}", "text": text}) + "\n")
    path = root / "config.py"
    path.write_text(CONFIG.format(corpus=str(root / "corpus.jsonl"), heldout=str(root / "heldout.jsonl"),
                                  enc=str(root / "enc"), lm=str(root / "lm")))
    return str(path)


def run_main(config_file, workdir, *flags):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.run([sys.executable, "-m", "replug_jax.main", "--config", config_file, "--workdir", workdir, *flags],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout, proc.stderr


LIBRARY_NOISE = ("faiss.loader", "Loading faiss", "backend 'tpu'", "INFO")


def test_console_shows_phases_and_the_log_file_the_rest(config_file, tmp_path):
    out, err = run_main(config_file, str(tmp_path / "run"))
    phases = [line for line in out.splitlines() if line.startswith("[")]
    for what in ("lm_eval job", "data:", "models:", "datastore:", "index dense:", "scoring none", "scoring replug",
                 "scoring concat"):
        assert any(what in line for line in phases), f"no phase line for {what!r} in:\n{out}"
    assert "| replug |" in out  # the results table
    for noise in LIBRARY_NOISE:
        assert noise not in out + err, f"{noise!r} reached the console"
    log = open(tmp_path / "run" / "log.txt", encoding="utf-8").read()
    assert "faiss.loader" in log and "scoring replug" in log


def test_verbosity_brings_library_logging_to_the_console(config_file, tmp_path):
    out, err = run_main(config_file, str(tmp_path / "run"), "--verbosity=0")
    assert "faiss.loader" in out + err or "Loading faiss" in out + err
