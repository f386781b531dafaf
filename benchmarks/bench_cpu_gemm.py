"""The encoder's dense layers one GEMM at a time, through each CPU library XLA offers, against PyTorch.

    python benchmarks/bench_cpu_gemm.py --rounds 10

MiniLM's projections at [32, 136] tokens (M = 4352): q/k/v/out (384 -> 384), the FFN up (384 -> 1536) and
down (1536 -> 384) projections, each `x @ w + b` jitted with XLA's own (Eigen) dots (`xla_cpu.NO_YNNPACK`,
what DenseEncoder uses below jaxlib 0.12) and with YNNPACK fusions (XLA's default), against `torch.addmm` and
numpy's `@` in the same process (best of `--rounds`, interleaved). The per-call times include allocating the
output: run under the same allocator settings for all (benchmarks/README.md "PyTorch's page faults").
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402

SHAPES = {"qkv_out_384x384": (4352, 384, 384), "ffn_up_384x1536": (4352, 384, 1536),
          "ffn_down_1536x384": (4352, 1536, 384)}


def gemm_fns(m: int, k: int, n: int, threads: int) -> dict:
    """One `x @ w + b` of [m, k] x [k, n] per implementation: name -> call."""
    import jax
    import numpy as np
    import torch

    from replug_jax import xla_cpu

    rng = np.random.default_rng(0)
    x, w, b = (rng.standard_normal(shape, dtype=np.float32) for shape in ((m, k), (k, n), (n,)))
    fns, args = {}, tuple(map(jax.numpy.asarray, (x, w, b)))
    for name, options in (("xla_eigen", xla_cpu.NO_YNNPACK), ("xla_ynnpack", {})):
        fn = jax.jit(lambda x, w, b: x @ w + b, compiler_options=options)
        fn(*args).block_until_ready()
        fns[name] = lambda fn=fn, args=args: fn(*args).block_until_ready()
    torch.set_num_threads(threads)
    tx, tw, tb = map(torch.from_numpy, (x, w, b))
    fns["torch_addmm"] = lambda: torch.addmm(tb, tx, tw)
    fns["numpy"] = lambda: x @ w + b
    return fns


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--out", default="benchmarks/results.jsonl")
    args = p.parse_args(argv)
    command = "python benchmarks/bench_cpu_gemm.py " + " ".join(sys.argv[1:] if argv is None else argv)
    peak, rows = common.matmul_peak_gflops(), []
    for shape_name, (m, k, n) in SHAPES.items():
        times = common.interleaved_best(gemm_fns(m, k, n, args.threads), args.rounds)
        for impl, seconds in times.items():
            rows.append({"benchmark": "cpu_gemm", "shape": shape_name, "impl": impl, "ms": seconds * 1e3,
                         "gflops": 2 * m * k * n / seconds / 1e9, "vs_torch": times["torch_addmm"] / seconds,
                         "peak_gflops": peak, "command": command.strip()})
    common.print_table(rows, ["shape", "impl", "ms", "gflops", "vs_torch"])
    common.write_rows(rows, args.out)
    return rows


if __name__ == "__main__":
    main()
