"""A child of `replug_jax.launch` in tests/test_lm_mesh.py: an LM whose model axis spans both processes (what a
2-host TPU slice does), every process scoring the same pairs and generating for the same questions in lockstep;
process 0 writes the scores and generations.

    python tests/lm_mesh_child.py MODEL_DIR OUT.json MODEL_PARALLEL
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from replug_jax.parallel import distributed  # noqa: E402

assert distributed.initialize(), "not started by replug_jax.launch"

import jax  # noqa: E402

import replug_jax as rj  # noqa: E402
from replug_jax.parallel import sharding  # noqa: E402
from tests.test_lm_mesh import CONTEXTS, CONTINUATIONS, GEN_CONTEXTS, GEN_WEIGHTS  # noqa: E402

model_dir, out, model_parallel = sys.argv[1], sys.argv[2], int(sys.argv[3])
mesh = sharding.lm_mesh(model_parallel, jax.devices())  # every device of every process
lm = rj.load_lm(model_dir, batch_size=8, mesh=mesh)
split = lm.params["layers"]["up_proj"]["kernel"]  # the MLP columns (6 query heads split over 2 only)
assert not split.is_fully_addressable and split.sharding.spec[-1] == "model", split.sharding
scores = lm.score(CONTEXTS, CONTINUATIONS)
gens = lm.generate(GEN_CONTEXTS, GEN_WEIGHTS, max_new_tokens=6, stop=())  # the rows split over a spanning data axis
if distributed.is_lead():
    with open(out, "w") as f:
        json.dump({"mesh": sharding.mesh_shape(mesh), "scores": [s.tolist() for s in scores],
                   "generations": [{"ids": g.token_ids, "logprobs": g.logprobs} for g in gens]}, f)
print(f"process {jax.process_index()}: scored {len(scores)} pairs on a {sharding.mesh_shape(mesh)} mesh", flush=True)
