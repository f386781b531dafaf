"""The accelerator benchmark runs end to end on CPU with tiny shapes, so it is ready when a GPU or TPU is lent."""
import importlib.util
import json
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_script(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "benchmarks", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # a smoke run of a device benchmark script
def test_accelerator_benchmark_runs_with_tiny_shapes_in_bf16(tmp_path):
    out = tmp_path / "rows.jsonl"
    rows = load_script("bench_accelerator").main(["--shapes", "tiny", "--dtype", "bfloat16", "--passes", "8",
                                                  "--batch", "8", "--rounds", "1", "--model-parallel", "2",
                                                  "--out", str(out)])
    seen = {(r["benchmark"], r["impl"]) for r in rows}
    assert seen == {("ensemble_scoring", "jax"), ("ensemble_scoring", "torch_per_pass"),
                    ("ensemble_scoring", "torch_batched8"), ("corpus_embedding", "jax"),
                    ("corpus_embedding", "torch_per_pass"), ("corpus_embedding", "torch_batched8"),
                    ("lsr_train_step", "jax"), ("lsr_train_step", "torch"), ("lsr_train_step", "torch_autocast")}
    for r in rows:
        assert r["tokens_per_s"] > 0 and 0 < r["mfu"] < 1 and r["dtype"] == "bfloat16", r
        assert r["command"].startswith("python benchmarks/bench_accelerator.py --shapes tiny")
        assert r["model_parallel"] == (2 if r["benchmark"] == "ensemble_scoring" else 1)
    assert [json.loads(line) for line in open(out)] == rows


@pytest.mark.slow  # a smoke run of a device check script
def test_accelerator_numerics_check_runs_and_reads_right(tmp_path):
    """The bf16 numerics script on tiny shapes (CPU): float32 equals PyTorch float32, bf16 is close, not equal."""
    rows = load_script("check_accelerator_numerics").main(["--shapes", "tiny", "--passes", "4", "--docs", "32",
                                                           "--out", str(tmp_path / "rows.jsonl")])
    lm = {(r["compute"], r["weights"]): r for r in rows if r["check"] == "lm_logprobs"}
    enc = {(r["compute"], r["weights"]): r for r in rows if r["check"] == "encoder_embeddings"}
    assert set(lm) == set(enc) == {("float32", "float32"), ("bfloat16", "float32"), ("bfloat16", "bfloat16")}
    assert lm["float32", "float32"]["max_abs_dlogp"] < 1e-5 and enc["float32", "float32"]["min_cosine_to_ref"] > 1 - 1e-6
    assert 1e-5 < lm["bfloat16", "bfloat16"]["max_abs_dlogp"] < 0.1 and enc["bfloat16", "bfloat16"]["top10_overlap"] > 0.8
