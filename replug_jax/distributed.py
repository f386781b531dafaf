"""Multi-process JAX (the multi-controller runtime, `jax.distributed`).

On a TPU VM slice every host runs the same command and `jax.distributed.initialize()` finds the others
by itself (`multihost=True` in a config). On one machine, `python -m replug_jax.launch --processes N -- CMD`
starts N copies of CMD and tells each, through the environment variables below, where the coordinator is
(127.0.0.1), how many processes there are and which one it is; `initialize` then joins them, with gloo
for collectives between CPU devices. Tests use the same route.
"""
from __future__ import annotations

import os

ENV_COORDINATOR = "REPLUG_JAX_COORDINATOR"  # host:port of process 0's coordinator service
ENV_NUM_PROCESSES = "REPLUG_JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "REPLUG_JAX_PROCESS_ID"


def launched() -> bool:
    """Whether this process was started by `replug_jax.launch` as one of several."""
    return bool(os.environ.get(ENV_NUM_PROCESSES))


def initialize(multihost: bool = False) -> bool:
    """Join the other processes of this job, if there are any; returns whether it did.

    Started by the launcher: the coordinator, count and id come from the environment. `multihost`
    (TPU VMs, SLURM, ...): `jax.distributed.initialize()` detects them. Otherwise nothing happens.
    Call it before any other JAX work (it must precede the first use of a backend).
    """
    import jax

    if launched():
        try:
            count, index = int(os.environ[ENV_NUM_PROCESSES]), int(os.environ[ENV_PROCESS_ID])
            address = os.environ[ENV_COORDINATOR]
        except (KeyError, ValueError) as e:
            raise RuntimeError(f"replug_jax.launch environment is incomplete or malformed: {e!r} (set "
                               f"{ENV_COORDINATOR}, {ENV_NUM_PROCESSES} and {ENV_PROCESS_ID})") from None
        jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU devices of different processes
        jax.distributed.initialize(coordinator_address=address, num_processes=count, process_id=index)
        return True
    if multihost:
        jax.distributed.initialize()
        return True
    return False


# --- helpers every job uses; with one process they cost nothing and need no collective ---------------------------


def process_index() -> int:
    import jax

    return jax.process_index()


def process_count() -> int:
    import jax

    return jax.process_count()


def is_lead() -> bool:
    """Process 0: the one that prints, writes shared files and builds shared indexes."""
    return process_index() == 0


def share(total: int, index: int | None = None, count: int | None = None) -> range:
    """The contiguous rows [start, stop) of `total` that process `index` of `count` owns (sizes differ by <= 1)."""
    index = process_index() if index is None else index
    count = process_count() if count is None else count
    if not 0 <= index < count:
        raise ValueError(f"process index {index} is not in [0, {count})")
    start = total * index // count
    return range(start, total * (index + 1) // count)


def barrier(name: str) -> None:
    """Wait until every process reaches the barrier `name` (a no-op with one process)."""
    if process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def allgather_json(value) -> list:
    """[value of process 0, value of process 1, ...] for any JSON value (exact: sent as bytes)."""
    import json

    if process_count() == 1:
        return [json.loads(json.dumps(value))]
    import numpy as np
    from jax.experimental import multihost_utils

    data = np.frombuffer(json.dumps(value).encode(), np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.array([data.size], np.int32))).reshape(-1)
    padded = np.zeros(max(int(sizes.max()), 1), np.uint8)
    padded[: data.size] = data
    gathered = np.asarray(multihost_utils.process_allgather(padded))  # [processes, longest]
    return [json.loads(bytes(row[:size])) for row, size in zip(gathered, sizes.tolist())]


def lead_value(value):
    """Process 0's `value`, on every process: one decision for all (e.g. whether a saved index is reusable)."""
    return allgather_json(value)[0]


def lead_first(fn):
    """fn() on process 0 first, then on the others (which then find what process 0 wrote); its result."""
    if is_lead():
        out = fn()
        barrier(f"lead first: {getattr(fn, '__name__', 'fn')}")
        return out
    barrier(f"lead first: {getattr(fn, '__name__', 'fn')}")
    return fn()
