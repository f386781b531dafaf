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
