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
    written = [json.loads(line) for line in open(out)]  # each row, with when and on what it ran (`common.run_record`)
    assert [{key: w[key] for key in r} for w, r in zip(written, rows)] == rows and len(written) == len(rows)
    assert all(w["date"] and w["cpu"] and w["python"] and w["jax"] for w in written)


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


@pytest.mark.slow  # a smoke run of a device benchmark script
def test_posterior_benchmark_runs_and_float32_weights_match_pytorch(tmp_path):
    """The posterior's cost and numerics script on tiny shapes (CPU): every row, the passes each scores, and in
    float32 the posterior weights and re-ranking's kept passes equal those from PyTorch float32's log-probs."""
    rows = load_script("bench_posterior").main(["--shapes", "tiny", "--questions", "4", "--depth", "6", "--k", "2",
                                                "--doc-tokens", "16", "--query-tokens", "6", "--cont-tokens", "3",
                                                "--new-tokens", "3", "--batch", "4", "--rounds", "1",
                                                "--out", str(tmp_path / "rows.jsonl")])
    cost = {r["impl"]: r for r in rows if r.get("benchmark") == "posterior_cost"}
    assert set(cost) == {"replug", "posterior", "rerank", "torch_per_pass", "torch_batched4", "generate",
                         "generate_posterior", "generate_rerank"}
    assert {impl: r["passes_per_question"] for impl, r in cost.items()} == {
        "replug": 2, "posterior": 2, "rerank": 6, "torch_per_pass": 2, "torch_batched4": 2, "generate": 2,
        "generate_posterior": 2, "generate_rerank": 6}
    assert all(r["ms_per_question"] > 0 for r in cost.values()) and cost["replug"]["vs_replug"] == 1.0
    checks = {(r["compute"], r["weights"]): r for r in rows if r.get("check") == "posterior_weights"}
    assert set(checks) == {("float32", "float32"), ("bfloat16", "float32"), ("bfloat16", "bfloat16")}
    exact = checks["float32", "float32"]
    assert exact["max_abs_dlog_lambda"] < 1e-4 and exact["rerank_same_kept_set"] == 1.0
    assert exact["ref_query_loglik_spread"] > 1e-3  # the passages do change log p(x | d): the check has a signal
    assert checks["bfloat16", "bfloat16"]["max_abs_dlog_lambda"] > exact["max_abs_dlog_lambda"]


@pytest.mark.slow  # a smoke run of the CPU search benchmark
def test_search_benchmark_compares_gemm_and_faiss_on_identical_rankings(tmp_path):
    bench = load_script("bench_search")
    rows = bench.main(["--rows", "3000", "--queries", "1,16", "--dim", "32", "--out", str(tmp_path / "rows.jsonl")])
    assert [(r["rows"], r["queries"]) for r in rows] == [(3000, 1), (3000, 16)]
    assert all(r["rows_as_numpy"] == r["gemm_as_ours"] == 1.0 and r["path"] == "gemm" for r in rows)
    assert all(r[f"{name}_ms"] > 0 for r in rows for name in ("ours", "gemm", "numpy", "faiss"))
    (excluded,) = bench.main(["--exclusion", "--rows", "3000", "--queries", "16", "--dim", "32", "--excluded", "100",
                              "--k", "4", "--out", str(tmp_path / "rows.jsonl")])
    assert excluded["excluded"] == 100 and excluded["ours_ms"] > 0 and excluded["ours_peak_mib"] > 0


@pytest.mark.slow  # a smoke run of the cost curve
def test_scale_benchmark_measures_every_stage_and_projects(tmp_path, capsys):
    out = str(tmp_path / "rows.jsonl")
    args = ["--passages", "600,1200", "--workdir", str(tmp_path / "w"), "--embed-sample", "32", "--out", out]
    rows = load_script("bench_scale").main(args)
    stages = {r["stage"] for r in rows}
    assert {"read", "chunk", "tokenizer batch (baseline)", "embed (measured rate x N)", "index build HNSW32",
            "search Flat, exclusion", "lsr batch (16 x 20)", "checkpoint (retriever)"} <= stages
    assert {r["passages"] for r in rows} == {600, 1200}
    saved = [json.loads(line) for line in open(out)]
    assert {r["passages"] for r in saved if r["benchmark"] == "scale_projection"} == {21_000_000, 36_000_000}
    capsys.readouterr()
    load_script("bench_scale").main(["--from-results", out])
    assert "| chunk |" in capsys.readouterr().out


@pytest.mark.slow  # a smoke run of the scoring profile (SmolLM2 from its package)
def test_scoring_profile_names_the_ops_where_the_time_goes(tmp_path):
    out = tmp_path / "rows.jsonl"
    rows = load_script("profile_scoring").main(["--passes", "4", "--top", "5", "--out", str(out)])
    ops = {r["op"] for r in rows}
    assert {"layers/gate_proj/dot_general", "layers/up_proj/dot_general", "layers/down_proj/dot_general"} <= ops
    assert sum(r["share"] for r in rows) == pytest.approx(1.0) and all(r["ms_per_call"] > 0 for r in rows)
    written = [json.loads(line) for line in open(out)]
    assert len(written) == len(rows) and all(r["python"] and r["jax"] and r["date"] for r in written)


@pytest.mark.slow  # a smoke run of the MLP benchmark
def test_lm_mlp_benchmark_times_each_xla_option_with_its_error(tmp_path):
    rows = load_script("bench_cpu_gemm").main(["--rounds", "1", "--lm-mlp", "--out", str(tmp_path / "rows.jsonl")])
    by_impl = {r["impl"]: r for r in rows}
    assert {"xla_defaults", "xla_eigen", "torch"} <= by_impl.keys()
    for impl in ("xla_defaults", "xla_eigen", "torch"):  # right to float32 rounding
        assert by_impl[impl]["max_abs_error"] < 1e-4 and by_impl[impl]["ms"] > 0, impl


@pytest.mark.slow  # a smoke run of the compiled TPU table (benchmarks/README.md "Compiled for the TPU")
def test_tpu_plan_table_runs_and_reads_the_compilers_figures(tmp_path, monkeypatch):
    monkeypatch.setenv("REPLUG_JAX_PLAN_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "plan.json"
    rows = load_script("tpu_plan").main(["--models", "smollm2", "--tpus", "v5e-8", "--encoder", "minilm",
                                         "--lsr-batch", "8", "--out", str(out)])
    (row,) = rows
    assert row["fits"] and row["model_parallel"] == 1 and 0 < row["scoring_mfu"] < 1 and row["decode_ms"] > 0
    written = json.load(open(out))
    assert written["rows"] == rows and written["retriever"][0]["embedding_fits"] and written["libtpu"]


@pytest.mark.slow  # a smoke run of the server's fairness benchmark
def test_server_fairness_benchmark_times_a_generation_alone_and_beside_a_full_queue(tmp_path):
    from tests import hf_tiny

    hf_tiny.tiny_gpt2(str(tmp_path), positions=256)
    row = load_script("bench_server_fairness").main(["--lm", str(tmp_path), "--tokens", "8", "--prompts", "16"])
    assert row["alone_s"] > 0 and row["beside_load_s"] > 0 and row["scoring_batches"] > 0
