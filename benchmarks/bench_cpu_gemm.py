"""The encoder's dense layers one GEMM at a time, through each CPU library XLA offers, against PyTorch.

    python benchmarks/bench_cpu_gemm.py --rounds 10
    python benchmarks/bench_cpu_gemm.py --rounds 15 --lm-mlp     # SmolLM2's gated MLP as one program

MiniLM's projections at [32, 136] tokens (M = 4352): q/k/v/out (384 -> 384), the FFN up (384 -> 1536) and
down (1536 -> 384) projections, each `x @ w + b` jitted with XLA's own (Eigen) dots (`xla_cpu.NO_YNNPACK`,
what DenseEncoder used below jaxlib 0.12 until issue 72) and with YNNPACK fusions (XLA's default), against `torch.addmm` and
numpy's `@` in the same process (best of `--rounds`, interleaved). The per-call times include allocating the
output: run under the same allocator settings for all (benchmarks/README.md "PyTorch's page faults").
`--lm-mlp`: SmolLM2's MLP, down(silu(gate(x)) * up(x)) at [4 x 480, 576] tokens (a scoring batch), jitted under
each XLA option set this jaxlib accepts (its defaults, without YNNPACK, oneDNN's dot fusions), against PyTorch,
with each one's largest difference from a float64 numpy reference (an option that computes wrong numbers shows).
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

    from replug_jax.parallel import xla_cpu

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


MLP_OPTIONS = {"xla_defaults": {}, "xla_eigen": {"xla_cpu_experimental_ynn_fusion_type": ""},
               "xla_onednn_dots": {"xla_cpu_use_onednn": True, "xla_cpu_experimental_ynn_fusion_type": "",
                                   "xla_cpu_experimental_onednn_fusion_type": "LIBRARY_FUSION_TYPE_DOT"}}


def mlp_fns(threads: int, tokens: int = 4 * 480, width: int = 576, hidden: int = 1536) -> tuple[dict, dict]:
    """({name: call}, {name: max |difference| from float64}) of SmolLM2's gated MLP per XLA option set and torch.
    oneDNN is left out under jaxlib < 0.12, whose compiler aborts the process on it (benchmarks/README.md)."""
    import jax
    import numpy as np
    import torch

    from replug_jax.parallel import xla_cpu

    rng = np.random.default_rng(0)
    x, gate, up, down = (rng.standard_normal(s, dtype=np.float32) * scale for s, scale in (
        ((tokens, width), 1.0), ((width, hidden), 0.05), ((width, hidden), 0.05), ((hidden, width), 0.05)))
    silu = lambda h: h / (1 + np.exp(-h))
    x64, g64, u64, d64 = (a.astype(np.float64) for a in (x, gate, up, down))
    exact = (silu(x64 @ g64) * (x64 @ u64)) @ d64
    fns, errors, args = {}, {}, tuple(map(jax.numpy.asarray, (x, gate, up, down)))
    for name, options in MLP_OPTIONS.items():
        if "xla_cpu_use_onednn" in options and xla_cpu.JAXLIB_VERSION < (0, 12):
            continue
        fn = jax.jit(lambda x, g, u, d: (jax.nn.silu(x @ g) * (x @ u)) @ d, compiler_options=options)
        errors[name] = float(np.abs(np.asarray(fn(*args)) - exact).max())
        fns[name] = lambda fn=fn: fn(*args).block_until_ready()
    torch.set_num_threads(threads)
    tx, tg, tu, td = map(torch.from_numpy, (x, gate, up, down))

    def torch_mlp():
        with torch.inference_mode():
            return (torch.nn.functional.silu(tx @ tg) * (tx @ tu)) @ td

    errors["torch"] = float(np.abs(torch_mlp().numpy() - exact).max())
    fns["torch"] = torch_mlp
    return fns, errors


def main_mlp(args, command: str) -> list[dict]:
    fns, errors = mlp_fns(args.threads)
    times = common.interleaved_best(fns, args.rounds)
    flops = 3 * 2 * 4 * 480 * 576 * 1536
    rows = [{"benchmark": "cpu_lm_mlp", "impl": impl, "ms": seconds * 1e3, "gflops": flops / seconds / 1e9,
             "vs_torch": times["torch"] / seconds, "max_abs_error": errors[impl], "command": command}
            for impl, seconds in times.items()]
    common.print_table(rows, ["impl", "ms", "gflops", "vs_torch", "max_abs_error"])
    common.write_rows(rows, args.out)
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--lm-mlp", action="store_true", help="SmolLM2's gated MLP as one program under each XLA option set")
    p.add_argument("--out", default="benchmarks/results.jsonl")
    args = p.parse_args(argv)
    command = ("python benchmarks/bench_cpu_gemm.py " + " ".join(sys.argv[1:] if argv is None else argv)).strip()
    if args.lm_mlp:
        return main_mlp(args, command)
    peak, rows = common.matmul_peak_gflops(), []
    for shape_name, (m, k, n) in SHAPES.items():
        times = common.interleaved_best(gemm_fns(m, k, n, args.threads), args.rounds)
        for impl, seconds in times.items():
            rows.append({"benchmark": "cpu_gemm", "shape": shape_name, "impl": impl, "ms": seconds * 1e3,
                         "gflops": 2 * m * k * n / seconds / 1e9, "vs_torch": times["torch_addmm"] / seconds,
                         "peak_gflops": peak, "command": command})
    common.print_table(rows, ["shape", "impl", "ms", "gflops", "vs_torch"])
    common.write_rows(rows, args.out)
    return rows


if __name__ == "__main__":
    main()
