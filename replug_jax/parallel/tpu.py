"""TPU slices as the TPU compiler on this machine sees them: nothing runs, nothing needs a TPU (libtpu's compiler).

    slice_ = tpu_slice("v5e-8")       # a TpuSlice: 8 chips of "v5e", one host, the chip's published figures
    devices = topology_devices(slice_)   # 8 compile-only devices: meshes of them are compiled for, never run

Names are the ones a TPU VM is rented by: "v5e-8" (also "v5litepod-8"), "v6e-8", "v4-8", "v5p-8", "v4-32", "v5e-256":
for v5e and v6e the number counts chips, for v4 and v5p TensorCores (two a chip, one JAX device each chip:
"megacore"). A topology name ("v5e:2x4") is taken too. Hosts are as Cloud TPU builds them: 8 chips a host for v5e
and v6e (4 below 8 chips), 4 for v4 and v5p.

`CHIPS` holds each chip's published figures (Google Cloud's TPU pages; per-link ICI from "How to Scale Your Model",
Austin et al. 2025): the plan divides model FLOPs and bytes by them. They are figures of the hardware, not of any
program, but for `usable_hbm_bytes`: the HBM the compiler gives one program, read off its refusal of a program too
large (`compiler_hbm`; tests/test_tpu_plan.py checks the table against it).

libtpu is found as JAX finds it (the `libtpu` package, or TPU_LIBRARY_PATH). Its start-up writes warnings to the
process's stderr ("could not determine TPU accelerator type", ...) on a machine without a TPU: `topology_devices`
catches that output and shows it only when loading the topology fails.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import tempfile

GIB = 2**30


@dataclasses.dataclass(frozen=True)
class Chip:
    kind: str  # "v5e"
    hbm_bytes: int  # HBM per chip
    usable_hbm_bytes: int  # what the TPU compiler gives one program (libtpu 0.0.42's "available HBM")
    peak_flops: float  # bf16 FLOP/s per chip
    hbm_bandwidth: float  # bytes/s per chip
    ici_link_bandwidth: float  # bytes/s one way, per ICI link
    ici_links: int  # ICI links per chip
    megacore: bool  # two TensorCores a chip, one JAX device


CHIPS = {
    "v4": Chip("v4", 32 * GIB, int(30.75 * GIB), 275e12, 1.2e12, 4.5e10, 6, True),
    "v5e": Chip("v5e", 16 * GIB, int(15.75 * GIB), 197e12, 8.19e11, 4.5e10, 4, False),
    "v5p": Chip("v5p", 96 * GIB, int(95.74 * GIB), 459e12, 2.765e12, 9e10, 6, True),
    "v6e": Chip("v6e", 32 * GIB, int(31.25 * GIB), 918e12, 1.638e12, 9e10, 4, False),
}
ALIASES = {"v5litepod": "v5e", "v5lite": "v5e", "v6": "v6e", "v5": "v5p"}  # rental and topology spellings
TOPOLOGY_PREFIX = {"v4": "v4", "v5e": "v5e", "v5p": "v5", "v6e": "v6e"}  # libtpu's topology names
SHAPES_2D = {1: (1, 1), 4: (2, 2), 8: (2, 4), 16: (4, 4), 32: (4, 8), 64: (8, 8), 128: (8, 16), 256: (16, 16)}
SHAPES_3D = {4: (2, 2, 1), 8: (2, 2, 2), 16: (2, 2, 4), 32: (2, 4, 4), 64: (4, 4, 4), 128: (4, 4, 8),
             256: (4, 8, 8), 512: (8, 8, 8), 1024: (8, 8, 16), 2048: (8, 16, 16), 4096: (16, 16, 16)}


class UnknownSlice(ValueError):
    """A TPU name that is not a known slice."""


@dataclasses.dataclass(frozen=True)
class TpuSlice:
    name: str  # as given ("v5e-8")
    chip: Chip
    shape: tuple[int, ...]  # chips per dimension of the slice
    chips_per_host: tuple[int, int, int]

    @property
    def chips(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def hosts(self) -> int:
        per_host = self.chips_per_host[0] * self.chips_per_host[1] * self.chips_per_host[2]
        return max(1, self.chips // per_host)

    @property
    def topology_name(self) -> str:
        return f"{TOPOLOGY_PREFIX[self.chip.kind]}:{'x'.join(map(str, self.shape))}"

    def describe(self) -> str:
        hosts = f"{self.hosts} hosts" if self.hosts > 1 else "1 host"
        return (f"{self.name}: {self.chips} TPU {self.chip.kind} chips ({self.topology_name}, {hosts}), "
                f"{self.chip.hbm_bytes / GIB:.0f} GiB HBM and {self.chip.peak_flops / 1e12:.0f} TFLOP/s bf16 a chip")


def tpu_slice(name: str) -> TpuSlice:
    """A slice by its rental name ("v5e-8", "v4-32") or topology name ("v5e:2x4"); UnknownSlice otherwise."""
    text = name.strip().lower()
    known = ", ".join(f"{k}-N" for k in CHIPS)
    match = re.fullmatch(r"(v\d+[a-z]*)[-:]([\dx]+)", text)
    if not match:
        raise UnknownSlice(f"unknown TPU {name!r}: give a slice as rented ({known}, e.g. v5e-8, v4-32) or a topology "
                           "(v5e:2x4)")
    kind, size = ALIASES.get(match.group(1), match.group(1)), match.group(2)
    if kind not in CHIPS:
        raise UnknownSlice(f"unknown TPU kind {match.group(1)!r} in {name!r}: one of {', '.join(CHIPS)}")
    chip = CHIPS[kind]
    table = SHAPES_3D if chip.megacore else SHAPES_2D
    if "x" in size:
        shape = tuple(int(d) for d in size.split("x"))
        if len(shape) != (3 if chip.megacore else 2):
            raise UnknownSlice(f"{name!r}: a {kind} topology has {3 if chip.megacore else 2} dimensions")
    else:
        count = int(size) // (2 if chip.megacore else 1)  # v4-8 and v5p-8 count TensorCores: 4 chips
        if count not in table:
            unit = "TensorCores" if chip.megacore else "chips"
            sizes = ", ".join(str(c * (2 if chip.megacore else 1)) for c in table)
            raise UnknownSlice(f"{name!r}: {kind} slices come with {sizes} {unit}")
        shape = table[count]
    chips = 1
    for d in shape:
        chips *= d
    per_host = (2, 2, 1) if chip.megacore or chips < 8 else (2, 4, 1)  # Cloud TPU's hosts
    per_host = tuple(min(a, b) for a, b in zip(per_host, tuple(shape) + (1,) * (3 - len(shape))))
    return TpuSlice(name, chip, shape, per_host)


@contextlib.contextmanager
def captured_stderr():
    """The process's file descriptor 2 sent to a temporary file for the block (C++ libraries write there, not to
    sys.stderr); yields a dict whose "text" holds what was written, once the block has ended."""
    captured = {"text": ""}
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield captured
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            captured["text"] = sink.read().decode("utf-8", "replace")


def topology_devices(slice_: TpuSlice) -> list:
    """The slice's compile-only devices, libtpu's start-up output kept back (shown in the error if it fails).
    Needs libtpu (pip install "libtpu==0.0.42.*", the version jax[tpu]==0.10.2 pins) and a JAX whose backend is not
    the TPU it plans for (JAX_PLATFORMS=cpu: `python -m replug_jax.plan` sets it)."""
    from jax.experimental import topologies

    # compile-only: no chip is opened, so libtpu's one-process lock (/tmp/libtpu_lockfile) is not needed, and another
    # process planning, or a test worker beside one, would otherwise be refused ("ABORTED: ... lockfile")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    chip_config = "megacore" if slice_.chip.megacore else "default"
    name = slice_.topology_name
    with captured_stderr() as written:  # libtpu's start-up warnings, kept back
        try:
            topology = topologies.get_topology_desc(topology_name=name, platform="tpu", chip_config_name=chip_config,
                                                    chips_per_host_bounds=slice_.chips_per_host)
        except Exception as e:
            failure = e
        else:
            failure = None
    if failure is not None:
        noise = written["text"].strip()
        raise RuntimeError(f"the TPU compiler could not load topology {name} ({type(failure).__name__}: "
                           f"{failure}){'; libtpu said: ' + noise[-2000:] if noise else ''}. Is libtpu installed? "
                           'pip install "libtpu==0.0.42.*"') from failure
    devices = list(topology.devices)
    if len(devices) != slice_.chips:
        raise RuntimeError(f"topology {name} gave {len(devices)} devices, expected {slice_.chips} chips")
    return devices


def compiler_hbm(devices) -> int:
    """The HBM (bytes) the TPU compiler gives one program on these devices: from its refusal of a 1 TiB one."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    x = jax.ShapeDtypeStruct((1 << 20,), jnp.float32, sharding=NamedSharding(Mesh(np.array(devices[:1]), ("x",)),
                                                                             PartitionSpec()))
    try:
        jax.jit(lambda v: jnp.cumsum(jnp.tile(v, 1 << 18))[:: 1 << 18]).lower(x).compile()
    except Exception as e:
        refused = out_of_memory(str(e))
        if refused:
            return refused[1]
        raise
    raise RuntimeError("the TPU compiler took a 1 TiB program: its HBM limit is unknown")


OUT_OF_MEMORY = re.compile(r"required[^(]*\(([\d.]+)([KMGT]?)\)[^(]*available HBM \(([\d.]+)([KMGT]?)\)")
UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def out_of_memory(message: str) -> tuple[int, int] | None:
    """(bytes needed, bytes available) of the TPU compiler's refusal of a program too large for a chip, else None:
    'RESOURCE_EXHAUSTED: ... required for HLO temporaries (24.25G) exceeds available HBM (15.75G)'."""
    found = OUT_OF_MEMORY.search(message)
    if not found:
        return None
    return int(float(found.group(1)) * UNITS[found.group(2)]), int(float(found.group(3)) * UNITS[found.group(4)])


def libtpu_version() -> str | None:
    """The installed libtpu's version (what compiled the plan's programs), or None."""
    try:
        from importlib import metadata

        return metadata.version("libtpu")
    except Exception:
        return None
