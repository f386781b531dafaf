"""Two processes where one fails (tests/test_launch.py): the job must end in bounded time with the error named.

    python tests/failure_child.py raise      # joined as two hosts of a slice (multihost=True, a SLURM-like
                                             # environment, no launcher): process 1 raises in fail_fast while
                                             # process 0 waits at a barrier
    python tests/failure_child.py rebuild    # under the launcher: building a dense index fails on process 1
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from replug_jax.parallel import distributed  # noqa: E402


class FailingEncoder:
    """Embeds with random unit vectors; raises on process `fails_on`."""

    dim = 8

    def __init__(self, fails_on: int):
        self.fails_on = fails_on

    def fingerprint(self):
        return "failing-encoder"

    def embed(self, texts):
        if distributed.process_index() == self.fails_on:
            raise OSError("disk full while embedding (on purpose)")
        v = np.random.default_rng(len(texts)).normal(size=(len(texts), self.dim)).astype(np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)


def raise_in_one(index):
    distributed.barrier("both joined")
    print(f"process {index} joined", flush=True)
    if index == 1:
        raise ValueError("process 1 fails on purpose")
    distributed.barrier("never reached by process 1")
    print("passed a barrier its peer never reached", flush=True)


def rebuild(workdir):
    from replug_jax.retrieval.build import build_dense_index
    from replug_jax.retrieval.datastore import Datastore

    store = Datastore(ids=[f"c{i}" for i in range(40)], titles=[""] * 40, texts=[f"text {i}" for i in range(40)],
                      sources=[f"d{i}" for i in range(40)])
    try:
        build_dense_index(FailingEncoder(fails_on=1), store, os.path.join(workdir, "index"), progress=False)
    except RuntimeError as e:
        print(f"process {distributed.process_index()} stopped: {e}", flush=True)
        return
    print("built an index although a share failed", flush=True)


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "raise":
        assert distributed.initialize(multihost=True)
        distributed.fail_fast(raise_in_one, distributed.process_index())
    else:
        assert distributed.initialize()
        rebuild(sys.argv[2])
