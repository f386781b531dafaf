"""A query-side REPLUG LSR run as one of several processes (a child of `replug_jax.launch` in tests/test_multiprocess.py).

    python tests/lsr_multiprocess_run.py MODELS_DIR WORKDIR STEPS PIPELINE SIDES [KILL_AT_LM_CALL [SWAP_AFTER]]

SIDES: "query" (query-side only) or "both" (documents trained too: refreshes every 3 steps).

The tiny problem of tests/lsr_tiny_run.py. Each process counts the (query, document) pairs it asked
the LM for and writes them to WORKDIR/lm_pairs.<process>.json; process 0 writes the final parameters
to WORKDIR/final_params.npz. With KILL_AT_LM_CALL every process SIGKILLs itself at that LM call.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from replug_jax.parallel import distributed  # noqa: E402

assert distributed.initialize(), "not started by replug_jax.launch"

import jax  # noqa: E402
import numpy as np  # noqa: E402

from replug_jax.train.loop import LSRSettings, train_lsr  # noqa: E402
from tests import lsr_tiny_run  # noqa: E402


def main(models, workdir, steps, pipeline, sides, kill_at=0, swap_after=None):
    index = jax.process_index()
    encoder, lm, store, initial_index, examples = lsr_tiny_run.load(models, os.path.join(workdir, f"setup{index}"))
    counting = lsr_tiny_run.CountingLM(lm, kill_at)
    settings = dict(lsr_tiny_run.settings_for(sides), **({} if swap_after is None else {"swap_after": swap_after}))
    settings = LSRSettings(steps=steps, pipeline=pipeline, **settings)
    out = train_lsr(encoder, counting, store, examples, workdir, settings, initial_index=initial_index, progress=False)
    with open(os.path.join(workdir, f"lm_pairs.{index}.json"), "w") as f:
        json.dump({"pairs": counting.pairs, "calls": counting.calls}, f)
    if index == 0:
        np.savez(os.path.join(workdir, "final_params.npz"), *[np.asarray(x) for x in jax.tree_util.tree_leaves(out["params"])])


if __name__ == "__main__":
    distributed.fail_fast(main, sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1", sys.argv[5],
                          int(sys.argv[6]) if len(sys.argv) > 6 else 0, int(sys.argv[7]) if len(sys.argv) > 7 else None)
