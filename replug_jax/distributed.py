"""Multi-process JAX (the multi-controller runtime, `jax.distributed`).

On a TPU VM slice every host runs the same command and `jax.distributed.initialize()` finds the others
by itself (`multihost=True` in a config). On one machine, `python -m replug_jax.launch --processes N -- CMD`
starts N copies of CMD and tells each, through the environment variables below, where the coordinator is
(127.0.0.1), how many processes there are and which one it is; `initialize` then joins them, with gloo
for collectives between CPU devices. Tests use the same route.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import os
import socket
import sys
import threading

ENV_COORDINATOR = "REPLUG_JAX_COORDINATOR"  # host:port of process 0's coordinator service
ENV_NUM_PROCESSES = "REPLUG_JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "REPLUG_JAX_PROCESS_ID"
# A process that stops heart-beating (killed, its host lost) fails the coordination service within this many
# seconds, and the service's error aborts every other process (a barrier would otherwise wait TIMEOUT_MS).
HEARTBEAT_S = int(os.environ.get("REPLUG_JAX_HEARTBEAT_S", 60))


def launched() -> bool:
    """Whether this process was started by `replug_jax.launch` as one of several."""
    return bool(os.environ.get(ENV_NUM_PROCESSES))


def initialize(multihost: bool = False) -> bool:
    """Join the other processes of this job, if there are any; returns whether it did.

    Started by the launcher: the coordinator, count and id come from the environment. `multihost`
    (TPU VMs, SLURM, ...): `jax.distributed.initialize()` detects them. Otherwise nothing happens.
    Call it before any other JAX work (it must precede the first use of a backend). A process that dies
    stops the others within `HEARTBEAT_S` seconds ($REPLUG_JAX_HEARTBEAT_S, default 60): the coordination
    service misses its heartbeat and aborts every peer, with or without a common launcher.
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
        jax.distributed.initialize(coordinator_address=address, num_processes=count, process_id=index,
                                   heartbeat_timeout_seconds=HEARTBEAT_S)
        _open_host_store("127.0.0.1")
        return True
    if multihost:
        jax.distributed.initialize(heartbeat_timeout_seconds=HEARTBEAT_S)
        _open_host_store(socket.gethostbyname(socket.gethostname()))
        return True
    return False


_store_client = None


def _open_host_store(lead_host: str) -> None:
    """Process 0 serves the host store (host_store.py); its address reaches the others in one device broadcast
    (the only collective at start-up, before any other JAX work)."""
    global _store_client
    import numpy as np
    from jax.experimental import multihost_utils

    from replug_jax import host_store

    port = host_store.HostStore().port if is_lead() else 0  # the server lives as long as the process
    ip = [int(part) for part in lead_host.split(".")] if is_lead() else [0, 0, 0, 0]
    address = np.asarray(multihost_utils.broadcast_one_to_all(np.array(ip + [port], np.int32)))
    _store_client = host_store.HostStoreClient(".".join(str(int(x)) for x in address[:4]), int(address[4]))


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


def per_process_path(path: str) -> str:
    """`path` itself with one process; with several, `stem.p{index}.ext`: a file only this process opens (an
    SQLite cache on a TPU VM's shared file system is unsafe when several hosts write one file)."""
    if process_count() == 1:
        return path
    stem, ext = os.path.splitext(path)
    return f"{stem}.p{process_index()}{ext}"


def share(total: int, index: int | None = None, count: int | None = None) -> range:
    """The contiguous rows [start, stop) of `total` that process `index` of `count` owns (sizes differ by <= 1)."""
    index = process_index() if index is None else index
    count = process_count() if count is None else count
    if not 0 <= index < count:
        raise ValueError(f"process index {index} is not in [0, {count})")
    start = total * index // count
    return range(start, total * (index + 1) // count)


@dataclasses.dataclass(frozen=True)
class WorkSplit:
    """How a job's items are split: into `count` shares, this process doing share `index`."""

    index: int
    count: int

    def share(self, total: int) -> range:
        return share(total, self.index, self.count)

    def gather(self, value) -> list:
        """Every share's `value`, in share order (one share: [value], no collective)."""
        return allgather_json(value) if self.count > 1 else [value]


def lm_work_split(lm) -> WorkSplit:
    """Each process its own share of the items, unless `lm`'s mesh spans processes: then its jitted calls are
    collective, so every process steps through all items in lockstep (the same batches, in the same order)
    and holds the whole result: one share."""
    from replug_jax import sharding

    mesh = getattr(lm, "mesh", None)
    if mesh is not None and sharding.spans_processes(mesh):
        return WorkSplit(0, 1)
    return WorkSplit(process_index(), process_count())


# Host-side agreement goes through the host store (host_store.py: a key-value store served by process 0), not
# device collectives: no gloo context with its 30 s set-up deadline, and no ordering
# constraint against the jitted collectives running on the devices. In every process a thread of a given
# name (the main thread, "index-refresh-v3", ...) makes the same calls in the same order, so a counter per
# thread name names them alike, and threads never wait on each other's calls.
_counters: dict[str, itertools.count] = {}


def _next_call() -> str:
    name = threading.current_thread().name
    return f"{name}/{next(_counters.setdefault(name, itertools.count()))}"


TIMEOUT_MS = int(float(os.environ.get("REPLUG_JAX_BARRIER_TIMEOUT_S", 24 * 3600)) * 1000)  # a slow share is fine


def _client():
    """The host store's client (host_store.py), opened by `initialize`."""
    if _store_client is None:
        raise RuntimeError("several processes but no host store: call distributed.initialize() first")
    return _store_client


def barrier(name: str) -> None:
    """Wait until every process reaches this barrier (a no-op with one process); `name` says which in errors."""
    if process_count() > 1:
        number = _next_call()  # the id: names may differ between processes (paths), the call order does not
        try:
            allgather_text(f"replug_jax/barrier/{number}", "")
        except Exception as e:
            raise RuntimeError(f"process {process_index()}: barrier {number} ({name}) failed: {e}") from e


def allgather_json(value) -> list:
    """[value of process 0, value of process 1, ...] for any JSON value (exact: sent as text)."""
    text = json.dumps(value)
    if process_count() == 1:
        return [json.loads(text)]
    return [json.loads(t) for t in allgather_text(f"replug_jax/gather/{_next_call()}", text)]


def allgather_text(key: str, text: str) -> list[str]:
    """Every process's `text` under `key` (one key per call), through the host store; waits up to TIMEOUT_MS."""
    client = _client()
    client.key_value_set(f"{key}/{process_index()}", text)
    return [client.blocking_key_value_get(f"{key}/{p}", TIMEOUT_MS) for p in range(process_count())]


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


def fail_fast(fn, *args, **kwargs):
    """fn(*args, **kwargs); with several processes an exception kills this process at once (after printing
    it), so the launcher stops the others instead of jax.distributed's shutdown waiting 5 minutes for them."""
    try:
        return fn(*args, **kwargs)
    except BaseException:
        if launched() and process_count() > 1:
            import traceback

            traceback.print_exc()
            sys.stderr.flush()
            os._exit(1)
        raise
