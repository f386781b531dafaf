"""examples/quickstart.ipynb runs top to bottom (offline, packaged assets) and reports sane perplexities.

The notebook is executed with nbclient in a fresh IPython kernel of this interpreter: a kernelspec
for sys.executable is installed into a temp JUPYTER_PATH, so no other Python's "python3" kernel is
picked up. The kernel gets this process's environment without the 8 fake CPU devices of conftest.py
(it is a separate process and runs like a researcher's notebook, on one device).
"""
import json
import math
import os
import re
import sys
import time

import ipykernel.kernelspec
import nbclient
import nbformat
import numpy as np
import pytest

NOTEBOOK = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "quickstart.ipynb")
KERNEL = "python3"


def _kernel_env(tmp_path) -> dict:
    env = dict(os.environ)
    flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "", env.pop("XLA_FLAGS", "")).strip()
    if flags:
        env["XLA_FLAGS"] = flags
    env.pop("MPLBACKEND", None)  # the kernel's inline backend must produce the figure as image/png
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", JAX_PLATFORMS="cpu",
               IPYTHONDIR=str(tmp_path / "ipython"))
    return env


def _text_outputs(cell) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")


def test_committed_notebook_has_no_outputs():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nbformat's MissingIDFieldWarning (a cell without an id) included
        nb = nbformat.read(NOTEBOOK, as_version=4)
        nbformat.validate(nb)
    assert all(c.get("id") for c in nb.cells)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)


@pytest.mark.slow  # the notebook's calls are each tested in the core suite
def test_quickstart_notebook_runs(tmp_path, monkeypatch):
    prefix = tmp_path / "jupyter"
    ipykernel.kernelspec.install(kernel_name=KERNEL, prefix=str(prefix))  # argv: [sys.executable, -m, ipykernel_launcher, ...]
    monkeypatch.setenv("JUPYTER_PATH", str(prefix / "share" / "jupyter"))  # searched before user and system dirs
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    spec = json.loads((prefix / "share" / "jupyter" / "kernels" / KERNEL / "kernel.json").read_text())
    assert spec["argv"][0] == sys.executable

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name=KERNEL, resources={"metadata": {"path": str(run_dir)}})
    start = time.perf_counter()
    client.execute(env=_kernel_env(tmp_path))  # raises CellExecutionError on any failing cell
    elapsed = time.perf_counter() - start

    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    warned = [o.text for o in outputs if o.output_type == "stream" and o.name == "stderr" and "Warning" in o.text]
    assert not warned, warned  # a researcher's notebook runs clean
    answer = [line for c in nb.cells for line in _text_outputs(c).splitlines() if line.startswith("answer:")]
    weights = [float(w) for w in re.findall(r"λ=([0-9.]+)", "".join(_text_outputs(c) for c in nb.cells))]
    assert len(answer) == 1 and len(weights) == 8 and math.isclose(sum(weights), 1.0, abs_tol=0.01)
    assert any(o.output_type == "display_data" and "image/png" in o.get("data", {}) for o in outputs), "no plot"

    summary_lines = [line for line in _text_outputs(nb.cells[-1]).splitlines() if line.startswith("{")]
    assert len(summary_lines) == 1, _text_outputs(nb.cells[-1])
    summary = json.loads(summary_lines[0])
    ppl_none, ppl_replug = summary["ppl_none"], summary["ppl_replug"]
    by_k = {int(k): v for k, v in summary["ppl_by_k"].items()}
    assert sorted(by_k) == [1, 2, 4, 8]
    for ppl in (ppl_none, ppl_replug, *by_k.values()):
        assert math.isfinite(ppl) and ppl > 1.0
    # an independent reference: REPLUG's mixture in float64 numpy from the notebook's own passes and scores
    doc_lps, scores = np.asarray(summary["doc_lps"], np.float64), np.asarray(summary["scores"], np.float64)  # [8, T], [8]
    assert doc_lps.shape[0] == 8 and np.all(np.diff(scores) <= 0)  # best first
    for k, ppl in by_k.items():
        log_w = scores[:k] - np.log(np.exp(scores[:k]).sum())  # softmax(s), τ = 1
        mixed = np.log(np.exp(log_w[:, None] + doc_lps[:k]).sum(axis=0))  # [T]
        assert math.isclose(ppl, math.exp(-mixed.mean()), rel_tol=1e-5), k
    assert math.isclose(by_k[1], math.exp(-doc_lps[0].mean()), rel_tol=1e-5)  # one document: its own perplexity
    assert math.isclose(by_k[8], ppl_replug, rel_tol=1e-6)  # the k sweep re-mixes the same top-8 passes
    assert math.isclose(summary["ppl_rag"], ppl_replug, rel_tol=1e-5)  # rj.REPLUG gives the notebook's own number
    # SmolLM2-135M on Wikipedia prose: a perplexity in the tens, not a broken model or tokenizer (~vocab size)
    assert ppl_none < 200 and ppl_replug < 200
    print(f"quickstart.ipynb: {elapsed:.0f} s; perplexity {ppl_none:.2f} without retrieval, {ppl_replug:.2f} with REPLUG")
