"""Training checkpoints with orbax (the only module that imports it): atomic, the newest N kept,
restored into an abstract target, with a checksum and a fallback past a corrupt latest step.

    ckpt = Checkpointer("run/checkpoints", max_to_keep=3)
    ckpt.save(step, {"params": p, "opt_state": o, "step": step, "rng": key}, {"data_position": 1234, "index_version": 2})
    restored = ckpt.restore(jax.eval_shape(init_state))   # None on an empty directory
    if restored: step, state, meta = restored

Layout: `<directory>/<step>/{state, meta}`: `state` is orbax's StandardSave of the pytree
(OCDBT/zarr), `meta` a JSON item holding the caller's meta and a CRC-32 of every state
leaf. Orbax writes each step into `<step>.orbax-checkpoint-tmp-*` and renames it into place
only when complete, so a save killed midway (SIGKILL included) never replaces or damages
the previous good checkpoint; the leftover temp folder is removed when the next
Checkpointer opens the directory. Saving is synchronous by default (`save` returns with the
step on disk); `async_save=True` lets orbax finish writing in the background (`wait()`
blocks until it has); the leaves are copied to host before `save` returns either way, so
the train step may donate its buffers right after.

Restoring uses the abstract target's tree (optax states come back as their NamedTuple
types) and its shardings where given. A step that cannot be read, or whose leaves do not
match the saved checksums (orbax does not notice flipped bits in array data), is skipped
with a warning naming it; once an older step restores, the bad newer ones are moved to
`<directory>/corrupt/` so that later saves of those step numbers are not refused. If no
step restores (e.g. the target does not match the saved tree) nothing is moved and
CheckpointError is raised. No pickle anywhere.
"""
from __future__ import annotations

import functools
import json
import logging
import os
import time
import warnings
import zlib

import jax
import numpy as np
import orbax.checkpoint as ocp

log = logging.getLogger(__name__)
FORMAT = "replug_jax.checkpoint/1"
CORRUPT_DIR = "corrupt"


class CheckpointError(RuntimeError):
    """No checkpoint in the directory could be restored (all steps failed)."""


def _host_leaf(leaf):
    """A leaf as a numpy array for the checksum (typed PRNG keys as their key data); None if not addressable."""
    if isinstance(leaf, jax.Array):
        if not leaf.is_fully_addressable:
            return None  # multi-host sharded: orbax checks its own shards; we skip the checksum
        if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            leaf = jax.random.key_data(leaf)
    elif isinstance(leaf, (bool, int, float, complex)):  # Python scalars are stored in jax's default dtypes
        return np.asarray(leaf, dtype=jax.dtypes.canonicalize_dtype(np.result_type(leaf)))
    return np.asarray(jax.device_get(leaf))


def checksums(state) -> dict[str, str | None]:
    """{leaf path: "crc32 dtype shape"} of a pytree (None for leaves this host cannot read in full)."""
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
        a = _host_leaf(leaf)
        if a is None:
            out[jax.tree_util.keystr(path)] = None
            continue
        data = np.ascontiguousarray(a)
        out[jax.tree_util.keystr(path)] = f"{zlib.crc32(data.view(np.uint8).reshape(-1)):08x} {data.dtype} {list(data.shape)}"
    return out


def _abstract_leaf(leaf):
    if isinstance(leaf, jax.Array):
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=leaf.sharding)
    if isinstance(leaf, np.ndarray):
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype)
    return leaf


def _describe(err: BaseException) -> str:
    """The innermost cause of an error on one line (tensorstore wraps the useful part deep inside)."""
    while err.__cause__ is not None:
        err = err.__cause__
    return f"{type(err).__name__}: {' '.join(str(err).split())[:300]}"


def _quiet(method):
    """Run `method` with absl logging at WARNING: orbax logs every save and restore at INFO."""
    from absl import logging as absl_logging

    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        level = absl_logging.get_verbosity()
        absl_logging.set_verbosity(min(level, absl_logging.WARNING))
        try:
            return method(*args, **kwargs)
        finally:
            absl_logging.set_verbosity(level)

    return wrapper


class Checkpointer:
    """Numbered checkpoints of a state pytree plus JSON meta in `directory`, the newest `max_to_keep` kept."""

    @_quiet
    def __init__(self, directory: str, max_to_keep: int = 3, *, async_save: bool = False, verify: bool = True):
        if max_to_keep < 1:
            raise ValueError(f"max_to_keep must be >= 1, got {max_to_keep}")
        self.directory, self.max_to_keep, self.verify = os.path.abspath(directory), max_to_keep, verify
        options = ocp.CheckpointManagerOptions(
            enable_async_checkpointing=async_save, cleanup_tmp_directories=True, create=True,
            preservation_policy=ocp.checkpoint_managers.LatestN(max_to_keep))
        self._manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "meta"))

    @_quiet
    def all_steps(self) -> list[int]:
        """The finalised steps on disk, oldest first (not yet checked for corruption)."""
        self._manager.reload()
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        steps = self.all_steps()
        return steps[-1] if steps else None

    @_quiet
    def save(self, step: int, state, meta: dict | None = None) -> None:
        """Write `state` (a pytree of arrays and scalars) and `meta` (JSON-serialisable) as checkpoint `step`."""
        step = int(step)
        meta = dict(meta or {})
        try:
            json.dumps(meta)
        except (TypeError, ValueError) as e:
            raise TypeError(f"checkpoint meta must be JSON-serialisable: {e}") from None
        self._manager.wait_until_finished()  # a previous async save must be final before comparing steps
        latest = self.latest_step()
        if latest is not None and step <= latest:
            raise ValueError(f"checkpoint step {step} is not newer than the latest saved step {latest} in "
                             f"{self.directory}")
        record = {"format": FORMAT, "step": step, "meta": meta,
                  "checksums": checksums(state) if self.verify else None}
        self._manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                         meta=ocp.args.JsonSave(record)), force=True)

    @_quiet
    def wait(self) -> None:
        """Block until an asynchronous save is on disk (a no-op for synchronous saving)."""
        self._manager.wait_until_finished()

    @_quiet
    def restore(self, abstract_state, step: int | None = None):
        """(step, state, meta) of the newest restorable checkpoint (or of `step`), or None if there is none.

        `abstract_state`: the state's tree of jax.ShapeDtypeStruct (e.g. `jax.eval_shape(init)`;
        leaves without `sharding=` get the sharding they were saved with) or of arrays, whose
        shapes, dtypes and shardings are used (e.g. a freshly initialised state).
        """
        abstract_state = jax.tree.map(_abstract_leaf, abstract_state)
        self.wait()
        steps = self.all_steps()
        if step is not None:
            if step not in steps:
                raise FileNotFoundError(f"no checkpoint step {step} in {self.directory} (steps: {steps})")
            return self._restore_step(step, abstract_state)
        failures: list[tuple[int, Exception]] = []
        for s in reversed(steps):
            try:
                result = self._restore_step(s, abstract_state)
            except Exception as e:  # unreadable, truncated, missing files, checksum mismatch
                failures.append((s, e))
                continue
            for bad, err in failures:
                moved = self._quarantine(bad)
                message = (f"checkpoint step {bad} in {self.directory} is corrupt or incomplete "
                           f"({_describe(err)}); restored step {s} instead"
                           + (f"; moved the bad one to {moved}" if moved else ""))
                warnings.warn(message, RuntimeWarning, stacklevel=2)
                log.warning(message)
            if failures:
                self._manager.reload()
            return result
        if not failures:
            return None
        details = "; ".join(f"step {s}: {_describe(e)}" for s, e in failures)
        raise CheckpointError(f"no checkpoint in {self.directory} could be restored ({details})") from failures[0][1]

    def _restore_step(self, step: int, abstract_state):
        restored = self._manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()))
        record, state = restored["meta"], restored["state"]
        if not isinstance(record, dict) or record.get("format") != FORMAT:
            raise CheckpointError(f"step {step}: not a {FORMAT} checkpoint")
        saved = record.get("checksums")
        if self.verify and saved is not None:
            found = checksums(state)
            # a leaf restored into another dtype (the target asked for it) cannot be compared
            bad = [k for k, v in saved.items() if v is not None and found.get(k) is not None and found[k] != v
                   and found[k].split(" ", 1)[1] == v.split(" ", 1)[1]]
            if bad or set(saved) != set(found):
                raise CheckpointError(f"step {step}: leaves {bad or sorted(set(saved) ^ set(found))} do not match "
                                      f"their saved checksums")
        return step, state, record["meta"]

    def _quarantine(self, step: int) -> str | None:
        """Move a bad step's folder to `<directory>/corrupt/<step>-<time>` (process 0 only)."""
        if jax.process_index() != 0:
            return None
        src = os.path.join(self.directory, str(step))
        if not os.path.isdir(src):
            return None
        dst = os.path.join(self.directory, CORRUPT_DIR, f"{step}-{int(time.time())}")
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        os.replace(src, dst)
        return dst

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
