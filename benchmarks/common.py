"""Shared helpers for the benchmark scripts: timing, the machine's matmul peak, result rows."""
from __future__ import annotations

import json
import os
import time

import numpy as np


def cpu_model() -> str:
    """This host's CPU model and widest vector ISA ("... (AVX-512)" / "(AVX2)"), from /proc/cpuinfo."""
    try:
        text = open("/proc/cpuinfo", encoding="utf-8").read()
    except OSError:
        import platform

        return platform.processor() or platform.machine()
    name = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "?")
    isa = "AVX-512" if " avx512f" in text else "AVX2" if " avx2" in text else "no AVX2"
    return f"{name} ({isa}, {os.cpu_count()} cores)"


def best_time(fn, repeats: int = 3) -> float:
    """Best wall time of `repeats` calls (after the caller's warm-up), in seconds."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def interleaved_best(fns: dict, rounds: int = 3) -> dict:
    """Best wall time of each function, calling them in turn for `rounds` rounds.

    Alternating gives every implementation the same chances at a quiet moment on a shared,
    noisy machine; callers warm each function up (compile) before.
    """
    best = {name: float("inf") for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            best[name] = min(best[name], best_time(fn, 1))
    return best


def matmul_peak_gflops(n: int = 2048, repeats: int = 5) -> float:
    """fp32 GEMM throughput of numpy on this machine right now (the roofline for CPU numbers)."""
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    a @ a
    return 2 * n**3 / best_time(lambda: a @ a, repeats) / 1e9


def transformer_flops_per_token(num_params_non_embedding: int, vocab: int, hidden: int, layers: int, seq: int) -> float:
    """Forward FLOPs per token: 2 * matmul params + the LM head + attention (QK^T and AV, causal average)."""
    return 2 * num_params_non_embedding + 2 * vocab * hidden + 2 * layers * seq * hidden


def write_rows(rows: list[dict], path: str) -> None:
    """Append benchmark rows (with the command that produced them, and the date, CPU, Python and jaxlib they ran
    on) to a JSON-lines file."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "a") as f:
        for row in rows:
            f.write(json.dumps({**run_record(), **row}) + "\n")


def run_record() -> dict:
    """When and on what a benchmark ran: date, CPU (`cpu_model`), Python and jax versions."""
    import datetime
    import platform

    import jax

    return {"date": datetime.date.today().isoformat(), "cpu": cpu_model(), "python": platform.python_version(),
            "jax": jax.__version__}


def print_table(rows: list[dict], columns: list[str]) -> None:
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        cells = [f"{row[c]:.3g}" if isinstance(row.get(c), float) else str(row.get(c, "")) for c in columns]
        print("| " + " | ".join(cells) + " |")

