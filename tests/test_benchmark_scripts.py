"""Every benchmark script a table in benchmarks/README.md cites still runs: each at a tiny size, in a process of its
own as its table's command runs it, its rows written (slow tier: they time nothing here). Scripts with a check of
their own figures are in tests/test_benchmarks.py."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# script -> its tiny arguments (every one writes its rows to --out, but those in PRINTS, which print their tables)
TINY = {
    "bench_bf16_cpu": ["--docs", "8", "--articles", "2", "--questions", "4", "--passes", "2", "--rounds", "1"],
    "bench_compile": ["--layers", "2,4"],
    "bench_cpu_gemm": ["--rounds", "1"],
    "bench_embedding": ["--docs", "8", "--batch-size", "4", "--rounds", "1"],
    "bench_generate": ["--questions", "1", "--passes", "2", "--prefix-tokens", "16", "--doc-tokens", "16",
                       "--new-tokens", "2", "--rounds", "1"],
    "bench_index": ["--corpus", "2000", "--dim", "32", "--queries", "10", "--k", "5"],
    "bench_index_plan": ["--texts", "3000", "--queries", "20", "--k", "5"],
    "bench_loading": ["--hidden", "64", "--layers", "2", "--shard-mb", "1", "--devices", "2"],
    "bench_lsr_pipeline": ["--steps", "2", "--batch", "2", "--k", "2"],
    "bench_mc_prefix": ["--lms", "smollm2", "--tasks", "sciq_mc", "--questions", "2", "--shots", "sciq_mc=1",
                        "--k", "1", "--rounds", "1"],
    "bench_probe": ["--delays", "0", "--rounds", "1"],
    "bench_scoring": ["--passes", "2", "--doc-tokens", "16", "--context-tokens", "16", "--cont-tokens", "8",
                      "--batch-sizes", "1", "--rounds", "1"],
    "bench_server_qa": ["--questions", "2", "--shots", "0", "--k", "1", "--methods", "none,replug"],
    "profile_served_generation": ["--questions", "2", "--shots", "0", "--k", "2"],
}
WORKDIR = {"bench_index_plan", "bench_lsr_pipeline", "bench_server_qa", "profile_served_generation"}  # take --workdir
PRINTS = {"bench_server_qa": "| replug |", "profile_served_generation": "replay, second (compiled) round"}  # script ->
# a line of its printed table


@pytest.mark.slow  # each script once, at a tiny size
@pytest.mark.parametrize("script", sorted(TINY))
def test_the_benchmark_script_runs_at_a_tiny_size(script, tmp_path):
    out = tmp_path / "rows.jsonl"
    args = list(TINY[script]) + (["--workdir", str(tmp_path / "work")] if script in WORKDIR else [])
    args += [] if script in PRINTS else ["--out", str(out)]
    done = subprocess.run([sys.executable, os.path.join("benchmarks", f"{script}.py"), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    if script in PRINTS:
        assert PRINTS[script] in done.stdout, done.stdout[-2000:]
        return
    rows = [json.loads(line) for line in open(out)]
    assert rows and all(r.get("command") for r in rows), rows[:2]
