"""What the TPU compiler says of one device program: its memory (facts), its cost (estimates), its collectives.

    figures = compile_figures(lowered)          # a Figures: bytes per chip, or the compiler's refusal to fit
    figures = extrapolated(lower_at, layers)    # the costs of an LM `layers` deep, from two unrolled depths

Memory comes from `compiled.memory_analysis()`: the arguments, outputs, temporaries and generated code of one chip's
share of the partitioned program; a program that does not fit is refused by the compiler itself
(RESOURCE_EXHAUSTED, naming the bytes it needs and the HBM it may use), and `Figures.fits` says so.

Costs come from `compiled.cost_analysis()`: flops and bytes accessed per chip, and `optimal_seconds`, the TPU cost
model's time per call. Two traps, both measured with libtpu 0.0.42 (benchmarks/README.md "Compiled for the TPU"):
  * a loop's body is counted once, whatever its trip count: the LM's blocks run in one `scan` (so that compile time
    does not grow with depth), so its costs are read from the same program traced with the blocks unrolled
    (`causal_lm.layers_unrolled`) at two depths, 4 and 6 layers, and extrapolated: cost(L) = cost(6) +
    (L - 6) · (cost(6) - cost(4)) / 2 (an LM of 6 layers or fewer is compiled whole). Flops grow exactly linearly;
    the time estimate is steady from 4 layers on (per-layer figures of 4-6 and 8-16 layers agree to 2%), not below
    (the 1-2 and 2-4 differences were 0.6x and 1.1x of it on a 7B layer);
  * `optimal_seconds` counts -1.0 for every `ConcatBitcast` and `ZeroCrop` custom call (the cost model's
    "unknown"): the sum went negative for most LMs. Adding their count back gives a time that grows with depth as
    the flops do (the posterior's prefill, with one ZeroCrop: -33.95 s at 4 layers with 33 ConcatBitcasts, 0.053 s
    with both kinds added back, against a 0.036 s floor of its bytes at the chip's bandwidth). A time still below
    that floor (flops at peak, bytes at HBM bandwidth) is not used: the plan gives the floor and says so
    (`planner.program_row`).
Decoding's `while_loop` is costed through its body alone (`local_generate.decode_step`), times the steps.

Collectives are read off the compiled program's text (all-reduce, all-gather, reduce-scatter, all-to-all,
collective-permute: count and result bytes), and their time is estimated by a ring model over the chip's ICI links
(`collective_seconds`): arithmetic of ours, not the compiler's. Results are kept per program text, libtpu and jax
version in ~/.cache/replug_jax/tpu-plan ($REPLUG_JAX_PLAN_CACHE), so a plan run again compiles nothing it compiled.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import time

COST_DEPTHS = (4, 6)  # unrolled depths the LM's per-layer costs are read from (module docstring)
SENTINEL_CALLS = ('custom_call_target="ConcatBitcast"', 'custom_call_target="ZeroCrop"')  # each adds -1.0 to
# optimal_seconds (libtpu 0.0.42)
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
# how a program calls the host: custom calls (CPU, GPU), and on a TPU a send/recv to the host
HOST_CALLBACKS = ("xla_python_cpu_callback", "xla_python_gpu_callback", "xla_ffi_python_cpu_callback",
                  "xla_ffi_python_gpu_callback", "is_host_transfer = true", "is_host_transfer=true")
DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "f32": 4,
               "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16, "f8e4m3fn": 1, "f8e5m2": 1, "s4": 1, "u4": 1}
ADDITIVE = ("flops", "bytes_accessed", "est_seconds")
_RESULT = r"(\((?:[^()]|\([^()]*\))*\)|[a-z0-9]+\[[0-9,]*\](?:\{[^}]*\})?)"
COLLECTIVE_OP = re.compile(_RESULT + r" (" + "|".join(COLLECTIVES) + r")(?:-start)?\(")
SHAPE = re.compile(r"([a-z0-9]+)\[([0-9,]*)\]")


@dataclasses.dataclass
class Figures:
    """One program's figures per chip. Memory (bytes) is the compiler's fact; flops, bytes accessed and est_seconds
    are its cost model's counts (extrapolated over depth where `layers_from` says so)."""

    fits: bool = True
    argument_bytes: int = 0
    output_bytes: int = 0
    temp_bytes: int = 0
    code_bytes: int = 0
    alias_bytes: int = 0
    needed_bytes: int = 0  # a refused program: what the compiler said it needs
    available_bytes: int = 0  # ... and the HBM it may use
    flops: float = 0.0
    bytes_accessed: float = 0.0
    est_seconds: float = 0.0  # optimal_seconds, its sentinels (SENTINEL_CALLS) added back
    sentinels: int = 0
    collectives: dict = dataclasses.field(default_factory=dict)  # kind -> {"count", "bytes"}
    float64: bool = False
    host_callbacks: list = dataclasses.field(default_factory=list)
    compile_seconds: float = 0.0
    layers_from: list = dataclasses.field(default_factory=list)  # the unrolled depths the costs came from ([]: whole)
    refusal: str = ""

    @property
    def total_bytes(self) -> int:
        """Bytes a chip holds while the program runs: arguments, outputs not aliased to them, temporaries, code."""
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes + self.code_bytes

    @property
    def collective_bytes(self) -> float:
        return float(sum(c["bytes"] for c in self.collectives.values()))

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "total_bytes": self.total_bytes}


def cache_dir() -> str:
    return os.environ.get("REPLUG_JAX_PLAN_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "replug_jax",
                                                                   "tpu-plan")


def _cache_path(text: str, target: str) -> str:
    import jax

    from replug_jax.parallel.tpu import libtpu_version

    key = hashlib.sha256("\n".join([jax.__version__, str(libtpu_version()), target, text]).encode()).hexdigest()[:32]
    return os.path.join(cache_dir(), key + ".json")


def compile_figures(lowered, target: str) -> Figures:
    """Compile a `jax.stages.Lowered` for its TPU devices and read its figures, kept per program text and `target`
    (the slice's topology and chip: a program's text does not name its chip)."""
    program = lowered.as_text()
    path = _cache_path(program, target)
    try:
        with open(path, encoding="utf-8") as f:
            return Figures(**json.load(f))
    except (OSError, ValueError, TypeError):
        pass
    started = time.perf_counter()
    try:
        with _without_jax_compilation_cache():  # JAX's own cache cannot load a compile-only program
            compiled = lowered.compile()
    except Exception as e:  # the compiler's own refusal to fit names the bytes
        message = str(e)
        if "RESOURCE_EXHAUSTED" not in message:
            raise
        figures = _refused(message)
    else:
        figures = read_figures(compiled)
    figures.float64 = figures.float64 or holds_float64(program)  # as asked: the TPU compiler rewrites float64 away
    figures.host_callbacks = sorted(set(figures.host_callbacks) | set(host_callbacks(program)))
    figures.compile_seconds = time.perf_counter() - started
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".partial", "w", encoding="utf-8") as f:
        json.dump(dataclasses.asdict(figures), f)
    os.replace(path + ".partial", path)
    return figures


@contextlib.contextmanager
def _without_jax_compilation_cache():
    """JAX's persistent compilation cache off for the block (the public `jax_enable_compilation_cache` option),
    as it was after."""
    import jax

    before = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", before)


def _refused(message: str) -> Figures:
    from replug_jax.parallel.tpu import out_of_memory

    figures = Figures(fits=False, refusal=message.split("\n")[0][:500])
    figures.needed_bytes, figures.available_bytes = out_of_memory(message) or (0, 0)
    return figures


def read_figures(compiled) -> Figures:
    """Memory, costs and collectives of a compiled program (module docstring)."""
    memory = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    text = compiled.as_text()
    sentinels = sum(text.count(call) for call in SENTINEL_CALLS)
    return Figures(
        argument_bytes=int(memory.argument_size_in_bytes), output_bytes=int(memory.output_size_in_bytes),
        temp_bytes=int(memory.temp_size_in_bytes), code_bytes=int(memory.generated_code_size_in_bytes),
        alias_bytes=int(memory.alias_size_in_bytes), flops=float(cost.get("flops", 0.0)),
        bytes_accessed=float(cost.get("bytes accessed", 0.0)),
        est_seconds=float(cost.get("optimal_seconds", 0.0)) + sentinels, sentinels=sentinels,
        collectives=collectives(text), float64=holds_float64(text), host_callbacks=host_callbacks(text))


def collectives(hlo_text: str) -> dict:
    """{kind: {"count", "bytes"}} of the collective ops in a compiled program's text (bytes of their results)."""
    out: dict = {}
    for result, kind in COLLECTIVE_OP.findall(hlo_text):
        entry = out.setdefault(kind, {"count": 0, "bytes": 0})
        entry["count"] += 1
        shapes = SHAPE.findall(result)
        if result.startswith("(") and kind != "all-reduce" and len(shapes) > 1:
            shapes = shapes[len(shapes) // 2:]  # an async start's (operands, results): the results
        entry["bytes"] += sum(shape_bytes(dtype, dims) for dtype, dims in shapes)
    return out


def shape_bytes(dtype: str, dims: str) -> int:
    n = 1
    for d in filter(None, dims.split(",")):
        n *= int(d)
    return n * DTYPE_BYTES.get(dtype, 4)


def holds_float64(text: str) -> bool:
    """Whether a program's text (compiled HLO, or the StableHLO it was lowered to) holds a float64 value."""
    return bool(re.search(r"\b(f64|c128)\[|x(f64|complex<f64>)>|<f64>", text))


def host_callbacks(hlo_text: str) -> list[str]:
    return sorted({name for name in HOST_CALLBACKS if name in hlo_text})


def extrapolated(lower_at, layers: int, target: str) -> Figures:
    """The figures of an LM program `layers` deep: `lower_at(depth)` lowers it with `depth` unrolled blocks. Whole
    below COST_DEPTHS[-1] + 1 layers; else costs and collectives extrapolated from the two depths (module
    docstring). Memory is not read here (the job's own, scanned program gives it)."""
    low, high = COST_DEPTHS
    if layers <= high:
        figures = compile_figures(lower_at(layers), target)
        figures.layers_from = [layers]
        return figures
    a, b = compile_figures(lower_at(low), target), compile_figures(lower_at(high), target)
    if not (a.fits and b.fits):
        return a if not a.fits else b
    scale = (layers - high) / (high - low)
    out = dataclasses.replace(b, layers_from=[low, high], compile_seconds=a.compile_seconds + b.compile_seconds)
    for name in ADDITIVE:
        setattr(out, name, getattr(b, name) + scale * (getattr(b, name) - getattr(a, name)))
    out.collectives = {kind: {key: b.collectives[kind][key] + scale * (b.collectives[kind][key]
                                                                       - a.collectives.get(kind, {}).get(key, 0))
                              for key in ("count", "bytes")} for kind in b.collectives}
    out.float64, out.host_callbacks = a.float64 or b.float64, sorted(set(a.host_callbacks) | set(b.host_callbacks))
    return out


def collective_seconds(figures: Figures, chip, participants: int) -> float:
    """Our ring model of the collectives' time on one chip: each collective moves 2·(n-1)/n of its bytes for an
    all-reduce, (n-1)/n for the others, over the chip's ICI links one way (n: the chips of the mesh axis, taken
    as `participants`). An estimate of ours, not the compiler's."""
    if participants <= 1:
        return 0.0
    share = (participants - 1) / participants
    moved = sum(c["bytes"] * (2 * share if kind == "all-reduce" else share) for kind, c in figures.collectives.items())
    return moved / (chip.ici_link_bandwidth * chip.ici_links)
