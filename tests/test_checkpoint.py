"""Checkpoints: typed round trip into an abstract target, retention, meta, corrupt-latest fallback,
and a save loop killed with SIGKILL that still restores its last complete step."""
import glob
import os
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from replug_jax.train.checkpoint import CORRUPT_DIR, Checkpointer, CheckpointError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_state(step: int, size: int = 64):
    kernel = jax.random.normal(jax.random.key(step), (size, 32))  # incompressible: the data file is the largest
    params = {"dense": {"kernel": kernel, "bias": jnp.arange(32.0) + step}}
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(optax.linear_schedule(0.0, 1e-3, 10)))
    opt_state = tx.init(params)
    grads = jax.tree.map(jnp.ones_like, params)
    for _ in range(step):
        _, opt_state = tx.update(grads, opt_state, params)
    return {"params": params, "opt_state": opt_state, "step": step, "rng": jax.random.fold_in(jax.random.key(0), step)}


def assert_same(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        if jax.dtypes.issubdtype(jnp.asarray(x).dtype, jax.dtypes.prng_key):
            x, y = jax.random.key_data(x), jax.random.key_data(y)
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_round_trip_keeps_optax_types_meta_and_sharding(tmp_path):
    state = make_state(3)
    meta = {"data_position": 1234, "index_version": 2, "note": "héllo", "losses": [1.5, 0.25], "nested": {"a": None}}
    with Checkpointer(str(tmp_path)) as ckpt:
        assert ckpt.restore(jax.eval_shape(lambda: state)) is None and ckpt.latest_step() is None
        ckpt.save(3, state, meta)
        assert ckpt.latest_step() == 3
    mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    replicated = NamedSharding(mesh, PartitionSpec())
    abstract = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=replicated),
                            jax.eval_shape(lambda: state))
    step, restored, restored_meta = Checkpointer(str(tmp_path)).restore(abstract)
    assert step == 3 and restored_meta == meta
    clip_state, adam_chain = restored["opt_state"]
    assert type(clip_state) is optax.EmptyState
    assert type(adam_chain[0]) is optax.ScaleByAdamState and type(adam_chain[1]) is optax.ScaleByScheduleState
    assert int(adam_chain[0].count) == 3 and int(adam_chain[1].count) == 3
    assert restored["params"]["dense"]["kernel"].sharding == replicated
    assert jax.dtypes.issubdtype(restored["rng"].dtype, jax.dtypes.prng_key)
    assert_same(restored, state)
    with pytest.raises(TypeError, match="JSON"):
        Checkpointer(str(tmp_path)).save(4, state, {"bad": object()})


def test_newest_n_kept_and_steps_only_grow(tmp_path):
    ckpt = Checkpointer(str(tmp_path / "run"), max_to_keep=2)
    for step in (1, 2, 3, 4):
        ckpt.save(step, make_state(step), {"step": step})
    assert ckpt.all_steps() == [3, 4]
    with pytest.raises(ValueError, match="not newer"):
        ckpt.save(4, make_state(4))
    step, state, meta = ckpt.restore(jax.eval_shape(lambda: make_state(0)))
    assert step == 4 and meta == {"step": 4}
    assert_same(state, make_state(4))
    assert_same(ckpt.restore(make_state(0), step=3)[1], make_state(3))  # a concrete target works too


def _largest_file(folder):
    files = [p for p in glob.glob(os.path.join(folder, "**"), recursive=True) if os.path.isfile(p)]
    return max(files, key=os.path.getsize)


def _truncate(step_dir):
    path = _largest_file(os.path.join(step_dir, "state"))
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


def _delete(step_dir):
    os.remove(_largest_file(os.path.join(step_dir, "state")))


def _flip(step_dir):  # orbax itself restores this without noticing: the checksums catch it
    path = _largest_file(os.path.join(step_dir, "state"))
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        byte = f.read(1)[0]
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte ^ 0x10]))


def _break_meta(step_dir):
    with open(os.path.join(step_dir, "meta", "metadata"), "w") as f:
        f.write('{"format": ')


# orbax leaves its read coroutines to the garbage collector when a read fails: not our error
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("corrupt", [_truncate, _delete, _flip, _break_meta])
def test_corrupt_latest_falls_back_with_a_warning(tmp_path, corrupt):
    ckpt = Checkpointer(str(tmp_path), max_to_keep=3)
    for step in (1, 2, 3):
        ckpt.save(step, make_state(step, size=512), {"step": step})
    corrupt(str(tmp_path / "3"))
    abstract = jax.eval_shape(lambda: make_state(0, size=512))
    with pytest.warns(RuntimeWarning, match="checkpoint step 3 .* restored step 2"):
        step, state, meta = Checkpointer(str(tmp_path)).restore(abstract)
    assert step == 2 and meta == {"step": 2}
    assert_same(state, make_state(2, size=512))
    assert os.listdir(tmp_path / CORRUPT_DIR)[0].startswith("3-")  # kept aside for inspection
    ckpt = Checkpointer(str(tmp_path))
    assert ckpt.all_steps() == [1, 2]
    ckpt.save(3, make_state(3, size=512), {"step": 3})  # the run goes on and saves step 3 again
    assert ckpt.restore(abstract)[0] == 3


def test_nothing_restorable_raises_and_moves_nothing(tmp_path):
    ckpt = Checkpointer(str(tmp_path))
    ckpt.save(1, make_state(1))
    wrong = jax.eval_shape(lambda: {"params": make_state(1)["params"]})
    with pytest.raises(CheckpointError, match="step 1"):
        ckpt.restore(wrong)
    assert ckpt.all_steps() == [1] and not os.path.exists(tmp_path / CORRUPT_DIR)


def test_async_save_then_wait(tmp_path):
    ckpt = Checkpointer(str(tmp_path), async_save=True)
    ckpt.save(5, make_state(5), {"k": 1})
    ckpt.wait()
    step, state, meta = ckpt.restore(jax.eval_shape(lambda: make_state(0)))
    assert (step, meta) == (5, {"k": 1})
    assert_same(state, make_state(5))
    ckpt.close()


CHILD = """
import sys
import jax.numpy as jnp
from replug_jax.train.checkpoint import Checkpointer
ckpt = Checkpointer(sys.argv[1], max_to_keep=2)
for step in range(1, 100000):
    ckpt.save(step, {"w": jnp.full((512, 1024), step, jnp.float32), "step": step}, {"step": step})
    print(step, flush=True)
"""


def test_sigkill_mid_save_keeps_last_complete_step(tmp_path):
    directory = str(tmp_path / "ckpt")
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}
    out_path = tmp_path / "stdout"
    mid_save, deadline = False, time.time() + 120
    with open(out_path, "w") as out:
        child = subprocess.Popen([sys.executable, "-c", CHILD, directory], env=env, stdout=out, stderr=subprocess.DEVNULL)
    try:
        while time.time() < deadline and child.poll() is None:
            names = os.listdir(directory) if os.path.isdir(directory) else []
            done = [n for n in names if n.isdigit()]
            if len(done) >= 2 and any(".orbax-checkpoint-tmp" in n for n in names):
                mid_save = True  # a save is being written right now
                break
            time.sleep(0.001)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    assert mid_save, "never saw a save in progress"
    printed = [int(line) for line in out_path.read_text().split()]
    ckpt = Checkpointer(directory, max_to_keep=2)  # cleans the killed save's temp folder
    abstract = {"w": jax.ShapeDtypeStruct((512, 1024), jnp.float32), "step": jax.ShapeDtypeStruct((), jnp.int32)}
    step, state, meta = ckpt.restore(abstract)
    assert step in (printed[-1], printed[-1] + 1)  # the last save that finished (its print may not have)
    assert meta == {"step": step} and int(state["step"]) == step and np.all(np.asarray(state["w"]) == step)
    assert not any(".orbax-checkpoint-tmp" in n for n in os.listdir(directory))
    ckpt.save(step + 1, {"w": jnp.zeros((512, 1024)), "step": step + 1}, {"step": step + 1})
    assert ckpt.latest_step() == step + 1
