"""Device mesh, shardings and fixed-shape batching shared by every jitted batch function.

All batch work (corpus embedding, LM scoring, the ensemble) splits the batch over the mesh axis
"data". The retriever's mesh is 1-D ("data": parameters replicated); the LM's may be 2-D
("data", "model": `lm_mesh`), its weights split over "model" by the rules in models/partition.py.
Shapes are padded to buckets so a function compiles once per bucket, not once per call.

With several processes (`replug_jax.parallel.distributed`) each process embeds and scores its own share
on its own devices (`data_mesh()`: the local ones, no collective); the LSR train step and the
on-device search use `global_mesh()`, every device of every process.
"""
from __future__ import annotations

from typing import Callable, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

DATA_AXIS = "data"
MODEL_AXIS = "model"


def data_mesh(devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A 1-D mesh over `devices` (default: this process's own) with axis 'data'."""
    devices = list(devices) if devices is not None else jax.local_devices()
    return Mesh(np.array(devices), (DATA_AXIS,))


def lm_mesh(model_parallel: int = 1, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A ("data", "model") mesh over `devices` (default: this process's own): `model_parallel` devices hold
    one copy of the LM's weights between them, len(devices) / model_parallel copies split the batch."""
    devices = list(devices) if devices is not None else jax.local_devices()
    if model_parallel < 1 or len(devices) % model_parallel:
        raise ValueError(f"lm_model_parallel={model_parallel} does not divide the {len(devices)} devices")
    grid = np.array(devices).reshape(len(devices) // model_parallel, model_parallel)
    return Mesh(grid, (DATA_AXIS, MODEL_AXIS))


def spans_processes(mesh: Mesh) -> bool:
    """Whether `mesh` holds devices of several processes: its jitted calls are then collective, and every
    process must make them with the same batches in the same order (lockstep)."""
    return len({d.process_index for d in mesh.devices.flat}) > 1


def job_lm_mesh(model_parallel: int) -> Mesh:
    """A job's LM mesh: over this process's devices, or over every process's when `model_parallel` is more
    than one host has (the model axis then spans hosts, as on a multi-host TPU slice)."""
    spanning = model_parallel > jax.local_device_count() and jax.process_count() > 1
    return lm_mesh(model_parallel, jax.devices() if spanning else None)


def data_size(mesh: Mesh) -> int:
    """How many ways the batch is split: the size of the mesh's "data" axis."""
    return mesh.shape[DATA_AXIS]


def mesh_shape(mesh: Mesh) -> dict[str, int]:
    """{"data": D, "model": M} (M = 1 on a 1-D mesh): what results.json records as "lm_mesh"."""
    return {DATA_AXIS: mesh.shape[DATA_AXIS], MODEL_AXIS: mesh.shape.get(MODEL_AXIS, 1)}


def global_mesh() -> Mesh:
    """A 1-D mesh over every device of every process (one process: the same as `data_mesh()`)."""
    return data_mesh(jax.devices())


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Leading (batch) axis split over the mesh."""
    return NamedSharding(mesh, P(DATA_AXIS))


def process_rows(batch: NamedSharding, shape: tuple[int, ...]) -> np.ndarray:
    """Global indices of the rows this process holds under `batch` (rows split on axis 0), in the order of its
    local data: its devices' row slices, ascending, replicas once (`jax.make_array_from_process_local_data`'s
    layout). Taken from each device's own index, so a mesh whose devices are not grouped by process works."""
    spans = sorted({(i[0].start or 0, shape[0] if i[0].stop is None else i[0].stop)
                    for i in batch.addressable_devices_indices_map(shape).values()})
    return np.concatenate([np.arange(a, b) for a, b in spans])


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def round_up(n: int, multiple: int) -> int:
    """Smallest multiple of `multiple` that is >= n (and >= multiple)."""
    return max(multiple, -(-n // multiple) * multiple)


def power_of_two_rows(rows: int, cap: int, mesh: Mesh) -> int:
    """Rows per call for `rows` rows: a power of two, at least the mesh's data-axis size, at most `cap`, so a
    small call does not pay for filler rows and the shapes stay few."""
    return min(cap, round_up(1 << (rows - 1).bit_length(), data_size(mesh)))


def length_bucket(length: int, multiple: int, cap: int, per_octave: int | None = None) -> int:
    """Padded sequence length for `length` tokens: a multiple of `multiple`, at most `cap`.

    With `per_octave`, the step grows with the length: a multiple of the larger of `multiple` and 1/per_octave of
    the power of two at or below `length`: every doubling of the length has at most `per_octave` buckets, and rows
    pad at most 1/per_octave once that share exceeds `multiple` (e.g. multiple 32, per_octave 8: steps of 32 up to
    511 tokens, 64 for 512-1023, 128 for 1024-2047, 256 for 2048-4095, ...; below 256 tokens the fixed 32 governs,
    so a short row pads up to 31 tokens, more than 1/8 of it). A bucket past `cap` is cut to `cap`."""
    if length > cap:
        raise ValueError(f"sequence of {length} tokens exceeds the maximum length {cap}")
    if per_octave:
        multiple = max(multiple, (1 << (max(length, 1).bit_length() - 1)) // per_octave)
    return min(round_up(length, multiple), cap)


def pad_rows(rows: Sequence[Sequence[int]], length: int, pad_id: int, num_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad token rows into ids and mask arrays of shape [num_rows, length] (int32)."""
    ids = np.full((num_rows, length), pad_id, dtype=np.int32)
    mask = np.zeros((num_rows, length), dtype=np.int32)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
        mask[i, : len(row)] = 1
    return ids, mask


def bucketed_batches(rows: Sequence[Sequence[int]], batch_size: int | Callable[[int], int], multiple: int, cap: int,
                     pad_id: int, progress: bool = False, desc: str = "batches", per_octave: int | None = None,
                     own_bucket: bool = False, least: int = 0):
    """Rows sorted by length and yielded as fixed-shape batches: (row indices, ids, mask).

    ids and mask are [len(indices), L] with L = length_bucket(longest row, ...); the caller's
    ShardedBatchFn pads the row count up. `own_bucket`: a batch never mixes length buckets, so every row is padded
    to its own bucket and its result does not depend on the rows beside it (XLA's CPU programs round differently at
    other lengths): the encoder's choice, so that a query ranks passages the same alone as among others.
    `batch_size`: rows per batch, or (with `own_bucket`) a function of the bucket's padded length. `least`: the
    shortest padded length (shorter rows share its bucket).
    """
    from replug_jax.base.progress import tqdm

    lengths = np.array([len(r) for r in rows], np.int64)
    order = np.argsort(lengths, kind="stable")
    if callable(batch_size) and not own_bucket:
        raise ValueError("rows per batch as a function of the length needs own_bucket")
    if not len(rows):
        return
    runs, sizes = [order], [batch_size]  # rows in length order; with own_bucket, split where the bucket changes
    if own_bucket:
        size = {n: max(min(least, cap), length_bucket(int(n), multiple, cap, per_octave)) for n in np.unique(lengths)}
        runs = np.split(order, np.flatnonzero(np.diff([size[n] for n in lengths[order]])) + 1)
        sizes = [batch_size(size[lengths[run[0]]]) if callable(batch_size) else batch_size for run in runs]
    groups = [run[at : at + n] for run, n in zip(runs, sizes) for at in range(0, len(run), n)]
    for idx in tqdm(groups, disable=not progress, desc=desc, unit="batch"):
        batch = [rows[i] for i in idx]
        length = max(min(least, cap), length_bucket(max(len(r) for r in batch), multiple, cap, per_octave))
        ids, mask = pad_rows(batch, length, pad_id, len(batch))
        yield idx, ids, mask


def local_copy(x):
    """This process's copy of an array replicated over several processes' devices (other values unchanged)."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable and x.is_fully_replicated:
        return x.addressable_data(0)
    return x


def batch_program(fn: Callable, mesh: Mesh, param_shardings, num_inputs: int, compiler_options: dict | None = None):
    """`jax.jit(fn)` as `ShardedBatchFn` runs it: parameters placed by `param_shardings`, the `num_inputs` batch
    arrays split over "data", the output too; on a mesh spanning several processes (an LM split over hosts) every
    process calls with the same batch (lockstep) and gets the whole result back, replicated. Also what the TPU plan
    compiles (replug_jax/plan/)."""
    batch = batch_sharding(mesh)
    out = batch if batch.is_fully_addressable else replicated(mesh)
    return jax.jit(fn, in_shardings=(param_shardings,) + (batch,) * num_inputs, out_shardings=out,
                   compiler_options=compiler_options)


class ShardedBatchFn:
    """`fn(params, *batch_arrays) -> batch_array` jitted once per input shape, batch over the "data" axis.

    The batch size must be a multiple of the data-axis size; `__call__` pads fewer rows up
    to `batch_size` and returns only the real rows as numpy. `param_shardings` (a pytree of
    NamedShardings like `params`; default: replicated) places the parameters, e.g. the LM's over "model".
    `compiler_options`: XLA options for this program (`xla_cpu.options`).
    """

    def __init__(self, fn: Callable, params, batch_size: int, mesh: Mesh | None = None, num_inputs: int = 2,
                 param_shardings=None, compiler_options: dict | None = None):
        self.mesh = mesh or data_mesh()
        n = data_size(self.mesh)
        if batch_size % n:
            raise ValueError(f"batch size {batch_size} is not a multiple of the {n}-way data axis")
        self.batch_size = batch_size
        self.param_shardings = param_shardings if param_shardings is not None else replicated(self.mesh)
        self.params = jax.device_put(params, self.param_shardings)
        self._batch = batch_sharding(self.mesh)
        self.jitted = batch_program(fn, self.mesh, self.param_shardings, num_inputs, compiler_options)

    def __call__(self, *arrays: np.ndarray, params=None, padded_rows: int | None = None) -> np.ndarray:
        """fn(params, *arrays) for arrays with `rows <= batch_size` leading rows: [rows, ...] numpy.

        `params` (same structure and shapes) replaces the stored parameters for this call only,
        without recompiling: e.g. a retriever's current training parameters. `padded_rows`: the rows the program
        runs (a multiple of the data axis, default the batch size); one program is compiled per count.
        """
        rows, padded = arrays[0].shape[0], padded_rows or self.batch_size
        if rows > padded or padded > self.batch_size or padded % data_size(self.mesh):
            raise ValueError(f"{rows} rows padded to {padded}: at most the batch size {self.batch_size}, "
                             f"a multiple of the {data_size(self.mesh)}-way data axis")
        if rows < padded:
            arrays = tuple(np.pad(a, ((0, padded - rows),) + ((0, 0),) * (a.ndim - 1)) for a in arrays)
        arrays = jax.device_put(tuple(arrays), self._batch)
        params = self.params if params is None else self.place_params(params)
        return np.asarray(local_copy(self.jitted(params, *arrays)))[:rows]

    def place_params(self, params):
        """`params` replicated over the mesh (a no-op for params already placed there). Parameters replicated
        over every process's devices (the LSR train state) are taken from this process's own copy."""
        return jax.device_put(jax.tree.map(local_copy, params), self.param_shardings)

