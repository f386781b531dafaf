"""Exact search on the accelerators: the embedding matrix split over every device of every process.

    index = DeviceIndex.from_embeddings(E, metric="cosine", dtype="bfloat16", meta=faiss_index.meta)
    scores, rows = index.search(Q, k=4, exclude=[{12, 13}, None])   # as DenseIndex.search

An alternative to the host FAISS index when the matrix fits in device memory (21M x 768 in bf16 is
32 GB: a TPU pod slice's HBM). Rows are split over the global mesh's "data" axis (padded to a multiple
of the device count; pad rows are never returned). Each device scores every query against its rows
and keeps its own top candidates (`lax.top_k`), and a second top over the devices' candidates merges them. As the
flat FAISS index's exact search does (`exact_search.py`), the candidates are then ranked on the host by float64 sums,
ties to the lower row, so that a query ranks the same alone and in any batch: the device's float32 scores round by
the shape a query sits in, so every row within their error bound of a query's last wanted score is a candidate (a
whole tie group: the device is asked deeper until the window closes), and the candidates' stored vectors come back
with them (gathered on their devices). Scores are the float32 of those float64 sums: of the stored (bf16 or float16:
rounded) vectors and the query rounded as the device multiplies it.

With several processes a search is collective: every process calls it the same number of times with
its own queries (any number, even none); the queries are gathered, and each process gets its own rows
of the answer. Exclusions must then be per-query row lists (their longest list sets one depth for all).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from replug_jax.parallel import distributed, sharding
from replug_jax.retrieval.exact_search import ERROR_PER_DIM, best_by_exact_score, float64_scores
from replug_jax.retrieval.index import METRICS, Exclude, exclusion_rule, prepare_rows, search_excluding

DTYPES = ("float32", "bfloat16", "float16")
WINDOW = 16  # candidates past the depth asked: the error window past the last wanted score is usually inside
# a device's float32 dot product (accumulation order free on GPU and TPU, TPU's float32 by bf16 passes) is held to a
# few times the classic bound of one ordered sum: a wider window costs a few candidates, a narrower a wrong rank
ACCELERATOR_ERROR = 4.0


def _next_power_of_two(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _top_depth(queries, matrix, *, depth: int, count: int, per_device: int, mesh):
    """(scores [Q, depth] float32, rows [Q, depth] int32) of queries [Q, D] against matrix [N_pad, D]."""

    def local(q, m):  # q [Q, D] (all queries), m [per_device, D] (this device's rows)
        scores = jnp.dot(q.astype(m.dtype), m.T, preferred_element_type=jnp.float32,  # [Q, per_device]
                         precision=jax.lax.Precision.HIGHEST)  # a float32 matrix searched exactly (not TF32 on GPU)
        first = jax.lax.axis_index(sharding.DATA_AXIS) * per_device
        rows = first + jnp.arange(per_device, dtype=jnp.int32)
        scores = jnp.where(rows[None, :] < count, scores, -jnp.inf)  # pad rows never win
        best, where = jax.lax.top_k(scores, min(depth, per_device))  # [Q, d_local]
        return best, rows[where]

    spec = P(None, sharding.DATA_AXIS)
    best, rows = jax.shard_map(local, mesh=mesh, in_specs=(P(), P(sharding.DATA_AXIS)), out_specs=(spec, spec))(
        queries, matrix)  # [Q, devices * d_local]
    top, where = jax.lax.top_k(best, depth)
    return top, jnp.take_along_axis(rows, where, axis=1)


def search_program(depth: int, count: int, per_device: int, mesh):
    """`_top_depth` jitted as `DeviceIndex` runs it, the answer replicated (the TPU plan compiles the same):
    (queries [Q, D] over "data", matrix [N_pad, D] over "data") -> (scores, rows) [Q, depth]."""
    return jax.jit(functools.partial(_top_depth, depth=depth, count=count, per_device=per_device, mesh=mesh),
                   out_shardings=sharding.replicated(mesh))


def _stored_vectors(rows, matrix, *, per_device: int, mesh):
    """The stored vectors [Q, W, D] (matrix dtype) of rows [Q, W] (replicated): each device fills its own rows, zeros
    elsewhere, and the sum over devices is exact (one non-zero term per entry)."""

    def local(r, m):  # r [Q, W] global rows, m [per_device, D]
        first = jax.lax.axis_index(sharding.DATA_AXIS) * per_device
        mine = (r >= first) & (r < first + per_device)
        picked = jnp.where(mine[..., None], m[jnp.clip(r - first, 0, per_device - 1)], 0)  # [Q, W, D]
        return jax.lax.psum(picked, sharding.DATA_AXIS)

    return jax.shard_map(local, mesh=mesh, in_specs=(P(), P(sharding.DATA_AXIS)), out_specs=P())(rows, matrix)


def _row_norm_max(matrix):
    return jnp.sqrt(jnp.max(jnp.sum(jnp.square(matrix.astype(jnp.float32)), axis=1)))


class DeviceIndex:
    """Exact inner-product / cosine search over a device-resident [N, D] matrix; `meta` as DenseIndex's."""

    def __init__(self, matrix: jax.Array, count: int, meta: dict, mesh):
        self.matrix, self._count, self.meta, self.mesh = matrix, count, meta, mesh
        self._per_device = matrix.shape[0] // mesh.devices.size
        self._fns: dict[int, callable] = {}
        self._gather = jax.jit(functools.partial(_stored_vectors, per_device=self._per_device, mesh=mesh),
                               out_shardings=sharding.replicated(mesh))
        self._row_norm: float | None = None

    @property
    def count(self) -> int:
        return self._count

    @property
    def dim(self) -> int:
        return int(self.matrix.shape[1])

    def __len__(self) -> int:
        return self.count

    @classmethod
    def from_embeddings(cls, embeddings: np.ndarray, metric: str = "cosine", dtype: str = "float32",
                        meta: dict | None = None, mesh=None) -> "DeviceIndex":
        """Place embeddings [N, D] (an array or a memmap: each process reads only its devices' rows) on `mesh`
        (default: every device of every process), rows unit-normalised for the cosine metric."""
        if metric not in METRICS:
            raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
        if embeddings.ndim != 2 or embeddings.shape[0] == 0:
            raise ValueError(f"empty embeddings: need a non-empty [N, D] array, got shape {embeddings.shape}")
        mesh = mesh or sharding.global_mesh()
        n, d = embeddings.shape
        padded = sharding.round_up(n, mesh.devices.size)

        def block(index):  # this device's rows [stop - start, D], zeros past N
            start, stop = index[0].start or 0, index[0].stop or padded
            out = np.zeros((stop - start, d), np.float32)
            real = prepare_rows(embeddings[start:min(stop, n)], metric)  # [<= stop - start, D]
            out[: len(real)] = real
            return out.astype(jnp.dtype(dtype))

        matrix = jax.make_array_from_callback((padded, d), NamedSharding(mesh, P(sharding.DATA_AXIS, None)), block)
        meta = {**(meta or {}), "dimension": d, "metric": metric, "count": n, "device_dtype": dtype}
        return cls(matrix, n, meta, mesh)

    def _fn(self, depth: int):
        if depth not in self._fns:  # one compile per (depth, query bucket)
            self._fns[depth] = search_program(depth, self.count, self._per_device, self.mesh)
        return self._fns[depth]

    def row_norm(self) -> float:
        """The largest stored row norm: 1 for unit rows (cosine), else measured once on the devices."""
        if self.meta["metric"] == "cosine":
            return 1.0
        if self._row_norm is None:
            self._row_norm = float(np.asarray(jax.jit(_row_norm_max, out_shardings=sharding.replicated(self.mesh))(
                self.matrix).addressable_data(0)))
        return self._row_norm

    def top(self, queries: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores [Q, depth] float32, rows [Q, depth] int64) of this process's queries [Q, D], best first, ties to the
        lower row, ranked by float64 sums (the same alone and in any batch); collective."""
        asks = distributed.allgather_json([len(queries), min(depth, self.count)])  # [[queries, depth]] per process
        sizes, depth = [n for n, _ in asks], max(d for _, d in asks)  # one depth for all processes
        local_devices = len(self.mesh.local_devices)
        bucket = sharding.round_up(_next_power_of_two(max(sizes)), local_devices)  # queries per process, padded
        if max(sizes) == 0:
            return np.zeros((0, depth), np.float32), np.zeros((0, depth), np.int64)
        prepared = prepare_rows(queries, self.meta["metric"]).astype(self.matrix.dtype)  # [Q, D] as multiplied
        padded = np.zeros((bucket, self.dim), self.matrix.dtype)
        padded[: len(queries)] = prepared
        split = sharding.batch_sharding(self.mesh)
        global_queries = jax.make_array_from_process_local_data(split, padded)
        mine = sharding.process_rows(split, global_queries.shape)[: len(queries)]  # where this process's queries sit
        error = self.dim * ERROR_PER_DIM * ACCELERATOR_ERROR * self.row_norm()
        margin = error * np.linalg.norm(prepared.astype(np.float32), axis=1)  # [Q]: a score difference's bound
        width = min(self.count, depth + WINDOW)
        while True:  # deeper until every query's window past its depth-th score is inside the candidates
            scores, rows = self._fn(width)(global_queries, self.matrix)  # [processes * bucket, width], replicated
            local = np.asarray(scores.addressable_data(0))[mine]
            open_ = width < self.count and bool((local[:, -1] >= local[:, depth - 1] - margin).any())
            if width == self.count or not any(distributed.allgather_json(open_)):
                break
            width = min(self.count, 2 * width)
        vectors = np.asarray(self._gather(rows, self.matrix).addressable_data(0))[mine]  # [Q, width, D]
        rows = np.asarray(rows.addressable_data(0))[mine].astype(np.int64)  # [Q, width]
        cand_q = np.repeat(np.arange(len(queries)), width)
        exact = float64_scores(vectors.reshape(-1, self.dim), prepared[cand_q])
        return best_by_exact_score(cand_q, rows.reshape(-1), exact, len(queries), depth)

    def search(self, queries: np.ndarray, k: int, exclude: Exclude = None) -> tuple[np.ndarray, np.ndarray]:
        """Top-k (scores [Q, k] float32, rows [Q, k] int64), as `DenseIndex.search`; collective."""
        queries = np.asarray(queries, np.float32)
        if queries.ndim != 2 or queries.shape[1] != self.dim:
            raise ValueError(f"queries must be [Q, {self.dim}] (the index dimension), got shape {queries.shape}")
        if callable(exclude) and distributed.process_count() > 1:
            raise ValueError("with several processes, exclude must be per-query row lists, not a callable")
        depth = k if exclude is None else int(exclusion_rule(exclude, len(queries), k, self.count)[1].max(initial=k))
        scores, rows = self.top(queries, depth)  # deep enough for list exclusions: one collective call

        def search_fn(todo, depth):
            if depth <= rows.shape[1]:
                return scores[todo, :depth], rows[todo, :depth]
            return self.top(queries[todo], depth)  # one process only: a callable exclusion went deeper

        return search_excluding(search_fn, self.count, len(queries), k, exclude)
