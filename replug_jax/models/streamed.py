"""Streamed, sharded loading of safetensors checkpoints: each device's slice read from the file, never the whole.

`lazy_state_dict(model_dir)` gives `{hf_name: LazyTensor}`: the shape of each tensor and a way to read any slice
of it (`safe_open(...).get_slice(...)`, memory-mapped). The converters of models/weights.py rename and
transpose LazyTensors as they do arrays, so `place(tree, shardings, dtype)` can build every parameter from its
devices' slices: each process reads only its own devices' slices, a slice that several devices hold
(replicas) is read once, and a split tensor is never whole in host memory.
"""
from __future__ import annotations

import dataclasses

import jax
import numpy as np
from safetensors import safe_open


@dataclasses.dataclass(frozen=True)
class LazyTensor:
    """A tensor of a safetensors file, not read yet; `transposed` views a 2-D tensor as its transpose."""

    path: str
    name: str
    file_shape: tuple[int, ...]
    transposed: bool = False
    reads: list | None = dataclasses.field(default=None, compare=False)  # (name, file slices) of every read

    @property
    def shape(self) -> tuple[int, ...]:
        return self.file_shape[::-1] if self.transposed else self.file_shape

    @property
    def ndim(self) -> int:
        return len(self.file_shape)

    @property
    def dtype(self):
        return np.dtype(np.float32)  # as read: float32 whatever the file holds

    @property
    def T(self) -> "LazyTensor":  # noqa: N802 (numpy's name)
        if self.ndim != 2:
            raise ValueError(f"{self.name}: only 2-D tensors are transposed")
        return dataclasses.replace(self, transposed=not self.transposed)

    def read(self, index: tuple = ()) -> np.ndarray:
        """The float32 values at `index` (a tuple of slices over `shape`; () or missing trailing ones: all)."""
        spans = tuple(_span(s, n) for s, n in zip(tuple(index) + (slice(None),) * (self.ndim - len(index)), self.shape))
        in_file = spans[::-1] if self.transposed else spans
        if self.reads is not None:
            self.reads.append((self.name, tuple((s.start, s.stop) for s in in_file)))
        with safe_open(self.path, framework="numpy") as f:
            tensor = f.get_slice(self.name)
            if tensor.get_dtype() == "BF16":  # numpy has no bfloat16: the flax reader, then a float32 copy
                with safe_open(self.path, framework="flax") as g:
                    part = np.array(g.get_slice(self.name)[in_file], dtype=np.float32)
            else:  # numpy's reader copies the slice out of the mapped file (flax's keeps a device buffer alive)
                part = np.asarray(tensor[in_file], dtype=np.float32)
        return part.T if self.transposed else part

    def __array__(self, dtype=None, copy=None):
        whole = self.read()
        return whole if dtype is None else whole.astype(dtype)


@dataclasses.dataclass(frozen=True)
class Stacked:
    """Per-layer tensors (LazyTensors or arrays) seen as one [layers, ...] tensor, stacked only when read: the
    scanned LM's weights, built slice by slice without a stacked copy of the whole on the host."""

    parts: tuple

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.parts),) + tuple(self.parts[0].shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def dtype(self):
        return np.dtype(np.float32)

    def read(self, index: tuple = ()) -> np.ndarray:
        index = tuple(index) + (slice(None),) * (self.ndim - len(index))
        layers = _span(index[0], len(self.parts))
        return np.stack([read_slice(p, index[1:]) for p in self.parts[layers]])

    def __array__(self, dtype=None, copy=None):
        whole = self.read()
        return whole if dtype is None else whole.astype(dtype)


def is_lazy(x) -> bool:
    return isinstance(x, (LazyTensor, Stacked))


def read_slice(x, index: tuple) -> np.ndarray:
    """float32 values of `x` (a LazyTensor, a Stacked or an array) at `index`."""
    return x.read(index) if is_lazy(x) else np.asarray(np.asarray(x)[tuple(index)], dtype=np.float32)


def stack_layers(layers: list[dict]) -> dict:
    """[{name: {kind: tensor}}] per layer -> {name: {kind: Stacked}}: the scanned LM's "layers" subtree."""
    return jax.tree.map(lambda *parts: Stacked(tuple(parts)), *layers, is_leaf=is_lazy)


def materialize(tree) -> dict:
    """Every lazy leaf read whole (float32 numpy); arrays unchanged."""
    return jax.tree.map(lambda x: np.asarray(x) if is_lazy(x) else x, tree, is_leaf=is_lazy)


def _span(s: slice, n: int) -> slice:
    start, stop, step = s.indices(n)
    if step != 1:
        raise ValueError("strided slices are not read")
    return slice(start, stop)


def lazy_state_dict(files: list[str], reads: list | None = None) -> dict[str, LazyTensor]:
    """Every tensor of the safetensors `files` (a checkpoint's shards) as a LazyTensor; `reads` (a list) records
    each slice read, for tests and accounting."""
    state = {}
    for path in files:
        with safe_open(path, framework="flax") as f:
            for name in f.keys():
                state[name] = LazyTensor(path, name, tuple(f.get_slice(name).get_shape()), reads=reads)
    return state


def place(tree, shardings, dtype) -> dict:
    """Each leaf of `tree` (LazyTensor, Stacked or array) as a jax.Array in `dtype` under its sharding (a tree
    like `tree`).

    Like `jax.make_array_from_callback` with a slice-reading callback, but one slice at a time: each distinct
    slice this process's devices hold is read, put on its devices (several for replicas, read once) and
    dropped before the next, so the host never holds more than one device's slice of a split tensor."""
    def build(tensor, sharding):
        indices = sharding.addressable_devices_indices_map(tensor.shape)  # device -> its index
        devices_of: dict[tuple, tuple] = {}  # slice -> (index, its devices)
        for device, index in indices.items():
            key = tuple((s.start, s.stop) for s in (_span(i, n) for i, n in zip(index, tensor.shape)))
            devices_of.setdefault(key, (index, []))[1].append(device)
        shards = {}
        for index, devices in devices_of.values():
            part = read_slice(tensor, index).astype(dtype)
            shards.update({d: jax.device_put(part, d) for d in devices})
            del part
        return jax.make_array_from_single_device_arrays(tensor.shape, sharding, [shards[d] for d in indices])

    return jax.tree.map(build, tree, shardings, is_leaf=is_lazy)
