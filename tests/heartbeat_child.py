"""Two processes joined WITHOUT the launcher (as two TPU hosts are): process VICTIM is SIGKILLed while the other
waits at a barrier; the coordination service's heartbeat must stop the survivor (tests/test_launch.py).

    REPLUG_JAX_COORDINATOR=... REPLUG_JAX_NUM_PROCESSES=2 REPLUG_JAX_PROCESS_ID=i python tests/heartbeat_child.py VICTIM
"""
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from replug_jax.parallel import distributed  # noqa: E402

assert distributed.initialize(), "the REPLUG_JAX_* environment is not set"
distributed.barrier("both joined")
print(f"process {distributed.process_index()} joined", flush=True)
if distributed.process_index() == int(sys.argv[1]):
    os.kill(os.getpid(), signal.SIGKILL)
distributed.barrier("never reached by the victim")
print("passed a barrier its peer never reached", flush=True)
