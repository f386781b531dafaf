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
        _open_host_store(lambda: "127.0.0.1")  # one machine: loopback only
        return True
    if multihost:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU hosts (TPU and GPU ignore it)
        jax.distributed.initialize(heartbeat_timeout_seconds=HEARTBEAT_S)
        _open_host_store(reachable_address)
        return True
    return False


ENV_STORE_HOST = "REPLUG_JAX_HOST_STORE_HOST"  # the address process 0 serves the host store on (multihost)
_store_client = None
_store = None  # process 0's server


def reachable_address() -> str:
    """The address of this host that its peers reach it by: $REPLUG_JAX_HOST_STORE_HOST, or the first address
    that is not loopback among those its host name and full name resolve to (IPv4 before IPv6). Debian and
    SLURM hosts often map their name to 127.0.1.1: then the variable must say the address on the shared network."""
    import ipaddress

    if os.environ.get(ENV_STORE_HOST):
        return os.environ[ENV_STORE_HOST]
    found = []
    for name in dict.fromkeys((socket.gethostname(), socket.getfqdn())):
        try:
            found += [info[4][0] for info in socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)]
        except OSError:
            continue
    usable = [a for a in dict.fromkeys(found) if not ipaddress.ip_address(a.split("%")[0]).is_loopback]
    if not usable:
        raise RuntimeError(f"this host's name {socket.gethostname()!r} resolves only to {found or 'nothing'}, which its "
                           f"peers cannot reach: set {ENV_STORE_HOST} to this host's address on the network they share")
    return sorted(usable, key=lambda a: ":" in a)[0]


ADDRESS_CHARS = 128  # the broadcast record's size: '{"host", "port", "secret"}' as JSON, as code points


def encode_address(record: dict):
    """The host store's address and secret as a fixed-size int32 array (what one device broadcast carries)."""
    import numpy as np

    text = json.dumps(record, separators=(",", ":"))
    if len(text) > ADDRESS_CHARS:
        raise ValueError(f"host store address too long to broadcast: {len(text)} characters, at most {ADDRESS_CHARS} "
                         f"(host {record.get('host')!r})")  # the record itself holds the secret
    return np.array([ord(c) for c in text] + [0] * (ADDRESS_CHARS - len(text)), np.int32)


def decode_address(array) -> dict:
    return json.loads("".join(chr(int(c)) for c in array if c))


def _open_host_store(lead_host) -> None:
    """Process 0 serves the host store (host_store.py) on `lead_host()` with a random secret; address, port and
    secret reach the others in one device broadcast (the only collective at start-up, before other JAX work)."""
    global _store_client, _store
    from jax.experimental import multihost_utils

    from replug_jax.parallel import host_store

    record = {"host": "", "port": 0, "secret": ""}
    if is_lead():
        record = {"host": lead_host(), "secret": host_store.new_secret()}
        _store = host_store.HostStore(record["host"], secret=record["secret"], readers=process_count())
        record["port"] = _store.port  # the server lives as long as the process
    record = decode_address(multihost_utils.broadcast_one_to_all(encode_address(record)))
    _store_client = host_store.HostStoreClient(record["host"], record["port"], record["secret"])


# --- helpers every job uses; with one process they cost nothing and need no collective ---------------------------


def _joined() -> bool:
    """Whether this process joined others (`initialize` opened the host store)."""
    return _store_client is not None


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
    from replug_jax.parallel import sharding

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
    """Every process's `text` under `key` (one key per call), through the host store: one set and one gather
    per process (the store frees the keys once all have them); waits up to TIMEOUT_MS."""
    client = _client()
    client.set(f"{key}/{process_index()}", text)
    return client.gather(key, process_count(), TIMEOUT_MS / 1000)


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


def all_succeed(what: str, fn):
    """fn() on every process, then agree on the outcome: if it raised on any process, every process raises a
    RuntimeError naming that process and its error, so none waits at a later barrier for a peer that failed.
    With one process it is fn()."""
    error, failure = None, None
    try:
        out = fn()
    except Exception as e:  # noqa: BLE001 (reported to every peer, then raised)
        out, error, failure = None, f"{type(e).__name__}: {e}", e
    if process_count() > 1:
        failed = [(i, text) for i, text in enumerate(allgather_json(error)) if text is not None]
        if failed:
            raise RuntimeError(f"{what} failed on process {failed[0][0]}: {failed[0][1]}") from failure
    elif failure is not None:
        raise failure
    return out


def fail_fast(fn, *args, **kwargs):
    """fn(*args, **kwargs); with several processes (launched, or the hosts of a slice) an exception kills this
    process at once (after printing it): its peers are stopped by the launcher or by the coordination service's
    heartbeat, instead of jax.distributed's shutdown waiting 5 minutes for peers that wait 24 h at a barrier."""
    try:
        return fn(*args, **kwargs)
    except BaseException:
        if _joined() and process_count() > 1:
            import traceback

            traceback.print_exc()
            sys.stderr.flush()
            os._exit(1)
        raise
