"""An experiment: SmolLM2 scoring with its dense layers through OpenBLAS as an XLA FFI custom call, against XLA's dots.

    python benchmarks/bench_ffi_gemm.py --rounds 4

Builds benchmarks/ffi_gemm.cc with g++ against this jaxlib's FFI headers (`jax.ffi.include_dir()`), loads numpy's
bundled OpenBLAS, then times in one process (best of `--rounds`, interleaved): one GEMM of [4 x 448, 576] x [576, 1536]
through XLA's dot and the custom call (numpy's own call is left out: OpenBLAS's threads keep spinning after it
and slow whatever runs next); and one scoring call of 4 REPLUG passes (~450 tokens, the workload
of bench_scoring.py) with every dense layer through XLA's dots (what LocalLM does) or the custom call, against
PyTorch's per-pass loop with the head at the continuation. Nothing in replug_jax uses the custom call: see
benchmarks/README.md "A BLAS GEMM inside XLA's programs" for why.
"""
from __future__ import annotations

import argparse
import ctypes
import glob
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def build_ffi_gemm(parts_per_thread: int):
    """Compile and register the custom call "replug_ffi_gemm"; returns matmul(x [..., k], w [k, n]) -> [..., n]."""
    import jax
    import numpy as np

    so = os.path.join(tempfile.mkdtemp(), "ffi_gemm.so")
    subprocess.run(["g++", "-O2", "-std=c++17", "-shared", "-fPIC", f"-DPARTS_PER_THREAD={parts_per_thread}",
                    f"-I{jax.ffi.include_dir()}", "-o", so, os.path.join(HERE, "ffi_gemm.cc"), "-ldl"],
                   check=True, stderr=subprocess.DEVNULL)
    lib = ctypes.CDLL(so)
    blas = glob.glob(os.path.join(os.path.dirname(np.__file__) + ".libs", "libscipy_openblas*.so"))
    if not blas or lib.replug_gemm_init(blas[0].encode(), b"scipy_cblas_sgemm64_") != 0:
        raise SystemExit("numpy's bundled OpenBLAS (scipy_cblas_sgemm64_) was not found: this experiment needs it")
    jax.ffi.register_ffi_target("replug_ffi_gemm", jax.ffi.pycapsule(lib.ReplugGemm), platform="cpu")
    return lambda x, w: jax.ffi.ffi_call("replug_ffi_gemm", jax.ShapeDtypeStruct(x.shape[:-1] + w.shape[-1:], x.dtype))(x, w)


def gemm_fns(matmul, m=4 * 448, k=576, n=1536) -> dict:
    import jax
    import numpy as np

    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
    jx, jw = jax.numpy.asarray(x), jax.numpy.asarray(w)
    xla, ffi = jax.jit(lambda a, b: a @ b), jax.jit(matmul)
    return {"gemm_xla": lambda: xla(jx, jw).block_until_ready(), "gemm_ffi": lambda: ffi(jx, jw).block_until_ready()}


def scoring_fns(matmul, threads: int) -> tuple[dict, int]:
    """({name: one scoring call of 4 passes}, real tokens) with XLA's dots, the custom call, and PyTorch."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import numpy as np
    import bench_scoring
    import replug_jax as rj
    from replug_jax.models import causal_lm

    class FfiDense(nn.Module):  # nn.Dense's "kernel" [in, out], no bias (Llama's layers)
        features: int

        @nn.compact
        def __call__(self, x):
            return matmul(x, self.param("kernel", nn.initializers.zeros, (x.shape[-1], self.features), jnp.float32))

    lm = rj.load_lm("smollm2", batch_size=4)
    pairs = bench_scoring.workload(lm.tokenizer, 4, 128, 192, 128)
    width = -(-max(len(c) + len(y) for c, y in pairs) // 32) * 32
    ids, mask, targets = (np.zeros((4, w), np.int32) for w in (width, width, 136))
    for i, (c, y) in enumerate(pairs):
        ids[i, : len(c) + len(y)], mask[i, : len(c) + len(y)] = c + y, 1
        targets[i, : len(y)] = np.arange(len(c), len(c) + len(y))
    params, config, fns, outputs = lm.params, lm.config, {}, {}
    xla_dense = causal_lm._dense
    for name, dense in (("scoring_xla", xla_dense), ("scoring_ffi", lambda features, dtype, name, use_bias: FfiDense(features, name=name))):
        causal_lm._dense = dense  # read when the blocks are traced, just below
        fn = jax.jit(lambda p, *a, name=name: causal_lm.logprobs_at(p, config, *a)).lower(params, ids, mask, targets).compile()
        outputs[name] = np.asarray(fn(params, ids, mask, targets))
        fns[name] = lambda fn=fn: fn(params, ids, mask, targets).block_until_ready()
    causal_lm._dense = xla_dense
    print("largest log-prob difference, custom call against XLA's dots:",
          float(np.abs(outputs["scoring_ffi"] - outputs["scoring_xla"]).max()))
    _, per_pass_head, _ = bench_scoring.torch_scorers(threads)
    per_pass_head(pairs)
    fns["scoring_torch_per_pass_head_at_continuation"] = lambda: per_pass_head(pairs)
    return fns, int(mask.sum())


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--parts-per-thread", type=int, default=2, help="row blocks per XLA pool thread")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--out", default="benchmarks/results.jsonl")
    args = p.parse_args()
    matmul = build_ffi_gemm(args.parts_per_thread)
    fns, tokens = scoring_fns(matmul, args.threads)
    fns.update(gemm_fns(matmul))
    times = common.interleaved_best(fns, args.rounds)
    command = "python " + " ".join(sys.argv)
    rows = [{"benchmark": "ffi_gemm_experiment", "impl": name, "ms": seconds * 1e3,
             "tokens_per_s": tokens / seconds if name.startswith("scoring") else None,
             "vs_torch": times["scoring_torch_per_pass_head_at_continuation"] / seconds if name.startswith("scoring") else None,
             "command": command} for name, seconds in times.items()]
    common.print_table(rows, ["impl", "ms", "tokens_per_s", "vs_torch"])
    common.write_rows(rows, args.out)


if __name__ == "__main__":
    main()
