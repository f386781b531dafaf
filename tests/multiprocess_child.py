"""A child of `replug_jax.launch` in tests/test_launch.py: joins the other processes and sums a global array.

    python tests/multiprocess_child.py [FAIL_PROCESS_ID]

Each process contributes (its id + 1) on each of its local devices to an array sharded over every
device of every process; the jitted sum over it needs a collective across processes (gloo on CPU).
Process FAIL_PROCESS_ID dies with code 3 after joining, to test the launcher's failure handling.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from replug_jax.parallel import distributed  # noqa: E402

assert distributed.initialize(), "not started by replug_jax.launch"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

index = jax.process_index()
if len(sys.argv) > 1 and int(sys.argv[1]) == index:
    print(f"process {index} fails on purpose", flush=True)
    os._exit(3)  # a crash: sys.exit would first wait in jax.distributed's shutdown barrier for the others
mesh = Mesh(np.array(jax.devices()), ("data",))
local = np.full((jax.local_device_count(),), index + 1.0, np.float32)
array = jax.make_array_from_process_local_data(NamedSharding(mesh, PartitionSpec("data")), local)
total = jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, PartitionSpec()))(array)
print(f"id={index} processes={jax.process_count()} devices={jax.device_count()} local={jax.local_device_count()} "
      f"sum={float(total):g}", flush=True)
