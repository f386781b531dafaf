"""A child of `replug_jax.launch` in tests/test_multiprocess.py: device search on a mesh whose devices are NOT
grouped by process (p0, p1, p0, p1), each process with its own number of queries, checked against numpy.

    python tests/device_search_child.py
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from replug_jax.parallel import distributed  # noqa: E402

assert distributed.initialize(), "not started by replug_jax.launch"

import jax  # noqa: E402
import numpy as np  # noqa: E402

from replug_jax.parallel import sharding  # noqa: E402
from replug_jax.retrieval.device_index import DeviceIndex  # noqa: E402

by_process = [[d for d in jax.devices() if d.process_index == p] for p in range(jax.process_count())]
interleaved = [d for group in zip(*by_process) for d in group]
assert [d.process_index for d in interleaved] == [0, 1] * (len(interleaved) // 2), "a 2-process launch expected"
mesh = sharding.data_mesh(interleaved)
matrix = np.random.default_rng(0).normal(size=(37, 8)).astype(np.float32)
index = DeviceIndex.from_embeddings(matrix, metric="cosine", mesh=mesh)
me = jax.process_index()
queries = np.random.default_rng(10 + me).normal(size=(3 + 2 * me, 8)).astype(np.float32)
scores, rows = index.search(queries, k=5)
unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)
expected = np.argsort(-(unit(queries) @ unit(matrix).T), axis=1, kind="stable")[:, :5]
assert (rows == expected).all(), (me, rows.tolist(), expected.tolist())
print(f"process {me}: {len(queries)} queries searched on an interleaved mesh, rows equal numpy's", flush=True)
