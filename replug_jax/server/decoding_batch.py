"""The scoring server's decoding batch: rows that refill as they finish (continuous batching, as vLLM's scheduler).

Each prompt to generate from takes a row of one key/value cache. The model thread (server/engine.py) alternates
`step`s with its scoring work; a step
1. drops the rows whose client has gone (their future cancelled: server/completions.py cancels every prompt of such
   a request) and admits waiting prompts into free rows: they are prefilled together into a cache of their own
   and copied into their rows (kv_cache.insert_rows);
2. decodes every row CHUNK_STEPS tokens at most (models/decoding.py's `decode_steps`, greedy, the step's top
   log-probs kept), each row to its own budget, EOS or a token holding a whole stop string;
3. retires the rows that are done: their budget spent, EOS, or a stop string in their text, matched on the host on
   the text decoded as it grows (models/detokenize.py), so a stop string spanning tokens ends its row within
   CHUNK_STEPS tokens instead of at its budget.

A short request admitted beside a long one leaves after its own tokens. The batch has a power of two of rows (at
least the busy ones, at most `max_rows`) and a power of two of slots (SLOT_MULTIPLE at least); when a row's tokens
would pass the slots, the busy rows are repacked (kv_cache.take_rows, kv_cache.compact: each row's tokens moved to
the front). Compiled shapes: the chunk per (rows, slots), the prefill per (prompts, length bucket).
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import time
from concurrent.futures import Future, InvalidStateError

import jax
import jax.numpy as jnp
import numpy as np

from replug_jax.models import decoding, kv_cache
from replug_jax.models.detokenize import IncrementalText
from replug_jax.models.served_model import ServedModel
from replug_jax.models.stop_strings import StopMasks, cut_at_stop
from replug_jax.parallel import sharding

CHUNK_STEPS = 8  # tokens decoded between two looks at the rows (stop strings, new prompts, clients gone)
SLOT_MULTIPLE = 256  # the cache's slots: a power of two, at least this


@dataclasses.dataclass
class GenerationRequest:
    """One prompt to decode greedily: `new_tokens` at most, `top` alternatives a step, ended by `stop` strings."""

    ids: list[int]
    new_tokens: int
    top: int
    stop: tuple[str, ...]
    future: Future
    arrived: float = dataclasses.field(default_factory=time.monotonic)


@dataclasses.dataclass
class _Row:
    request: GenerationRequest
    text: IncrementalText
    out: list = dataclasses.field(default_factory=list)  # [(token id, log p, [(token id, log p)] best first)]
    done: bool = False


class DecodingBatch:
    """The rows being decoded and the prompts waiting for one (module docstring). Used by the model thread alone."""

    def __init__(self, lm: ServedModel, params, *, max_rows: int, top: int, stop_masks: StopMasks,
                 lead: list[int], batch_wait: float):
        self.lm, self.params, self.top, self.stop_masks, self.lead = lm, params, top, stop_masks, lead
        self.max_rows = 1 << max(max_rows, 1).bit_length() - 1  # a power of two
        self.batch_wait = batch_wait
        self.waiting: collections.deque[GenerationRequest] = collections.deque()
        self.rows: list[_Row | None] = []
        self.abandoned = 0  # prompts dropped because their client had gone
        self._cache = self._logits = None
        self._slots = 0
        self._length = 0  # slots written (the cache's `length`, mirrored on the host)
        self._chunk = jax.jit(functools.partial(_chunk, config=lm.config, dtype=lm.dtype, top=top))
        self._prefill = jax.jit(functools.partial(_prefill, config=lm.config, dtype=lm.dtype))
        self._insert = jax.jit(_insert)
        self._repack = jax.jit(_repack, static_argnames="slots")

    @property
    def busy(self) -> bool:
        return bool(self.waiting) or any(self.rows)

    def add(self, request: GenerationRequest) -> None:
        if request.new_tokens <= 0:
            _answer(request.future, [])
        else:
            self.waiting.append(request)

    def seconds_to_gather(self) -> float:
        """How long to wait for more prompts before the first step of an idle batch (prompts arriving together
        prefill together)."""
        if any(self.rows) or not self.waiting:
            return 0.0
        return max(0.0, self.waiting[0].arrived + self.batch_wait - time.monotonic())

    def fail(self, error: Exception) -> None:
        """Every row's and waiting prompt's future gets `error`; the batch is empty after."""
        for request in [row.request for row in self.rows if row] + list(self.waiting):
            if request.future.set_running_or_notify_cancel():
                request.future.set_exception(error)
        self.waiting.clear()
        self._reset()

    def step(self) -> None:
        """Admit what waits, decode one chunk, retire the rows that are done (module docstring)."""
        self._drop_abandoned()
        self._admit()
        if not any(self.rows):
            self._reset()
            return
        self._make_room(CHUNK_STEPS)  # may repack: the busy rows' places are read after it
        busy = [i for i, row in enumerate(self.rows) if row]
        done = np.array([row is None for row in self.rows])
        limits = np.array([0 if row is None else row.request.new_tokens - len(row.out) for row in self.rows], np.int32)
        stops = np.stack([self.stop_masks(row.request.stop if row else ()) for row in self.rows])  # [R, V]
        tokens, lps, counts, (top_lps, top_ids), self._cache, self._logits = self._chunk(
            self.params, self._cache, self._logits, stops, limits, done)
        tokens, lps, counts = np.asarray(tokens), np.asarray(lps), np.asarray(counts)
        top_lps, top_ids = np.asarray(top_lps), np.asarray(top_ids)
        self._length = int(self._cache["length"])
        for r in busy:
            self._take(self.rows[r], [(int(tokens[r, j]), float(lps[r, j]),
                                       list(zip(top_ids[r, j].tolist(), top_lps[r, j].tolist())))
                                      for j in range(int(counts[r]))], stops[r])
            if self.rows[r].done:
                request, out = self.rows[r].request, self.rows[r].out
                _answer(request.future, [(t, lp, best[:request.top]) for t, lp, best in out])
                self.rows[r] = None

    def _take(self, row: _Row, new: list, stop_mask: np.ndarray) -> None:
        """Append a chunk's tokens to a row; it is done at its budget, a stop token, or a stop string in its text
        (kept through the token that completes it)."""
        for item in new:
            row.out.append(item)
            row.text.push(item[0])
            if row.request.stop and cut_at_stop(row.text.text, row.request.stop)[1] or stop_mask[item[0]]:
                row.done = True
                return
        row.done = len(row.out) >= row.request.new_tokens

    def _drop_abandoned(self) -> None:
        for r, row in enumerate(self.rows):
            if row and row.request.future.cancelled():
                self.rows[r] = None
                self.abandoned += 1
        kept = [request for request in self.waiting if not request.future.cancelled()]
        self.abandoned += len(self.waiting) - len(kept)
        self.waiting = collections.deque(kept)

    def _admit(self) -> None:
        """Waiting prompts into free rows (the batch grown to a power of two up to max_rows), prefilled together."""
        busy = sum(1 for row in self.rows if row)
        count = min(len(self.waiting), self.max_rows - busy)
        if count <= 0:
            return
        new = [self.waiting.popleft() for _ in range(count)]
        prompts = [self.lead + request.ids for request in new]
        width = sharding.length_bucket(max(len(p) for p in prompts), self.lm.length_multiple, self.lm.max_length)
        rows = max(len(self.rows), 1 << (busy + count - 1).bit_length())
        self._make_room(width + CHUNK_STEPS, rows)
        free = [i for i, row in enumerate(self.rows) if row is None][:count]
        n = 1 << (count - 1).bit_length()  # a power of two of prompts: few shapes to compile
        ids, mask = sharding.pad_rows(prompts + [[self.lm.pad_id]] * (n - count), width, self.lm.pad_id, n)
        at = np.array(free + [len(self.rows)] * (n - count), np.int32)  # filler prompts land nowhere
        logits, new_cache = self._prefill(self.params, ids, mask)
        self._cache, self._logits = self._insert(self._cache, self._logits, new_cache, logits, at)
        self._length += width
        for r, request in zip(free, new):
            self.rows[r] = _Row(request, IncrementalText(self.lm.tokenizer))

    def _make_room(self, need: int, rows: int | None = None) -> None:
        """At least `need` free slots after the written ones and `rows` rows (default: as many as now, fewer where
        the busy rows fit in fewer): the busy rows repacked into a new cache when that changes anything."""
        busy = [i for i, row in enumerate(self.rows) if row]
        if rows is None:
            rows = 1 << (len(busy) - 1).bit_length() if busy else 1
        if self._cache is not None and rows == len(self.rows) and self._length + need <= self._slots:
            return
        if self._cache is None:
            self._slots = _slot_bucket(need)
            self._cache = kv_cache.init_cache(self.lm.config, rows, self._slots, self.lm.dtype)
            self._logits = jnp.zeros((rows, self.lm.config.vocab_size), jnp.float32)
            self.rows, self._length = [None] * rows, 0
            return
        order = busy + [len(self.rows)] * (rows - len(busy))  # busy rows first; the rest empty
        counts = np.asarray(self._cache["count"])
        used = max([int(counts[i]) for i in busy], default=0)
        self._slots = _slot_bucket(used + need)
        self._cache, self._logits = self._repack(self._cache, self._logits, np.array(order, np.int32),
                                                 slots=self._slots)
        self._length = int(self._cache["length"])
        self.rows = [self.rows[i] for i in busy] + [None] * (rows - len(busy))

    def _reset(self) -> None:
        self._cache = self._logits = None
        self.rows, self._slots, self._length = [], 0, 0


def _slot_bucket(n: int) -> int:
    return max(SLOT_MULTIPLE, 1 << (n - 1).bit_length())


def _chunk(params, cache, logits, stop_masks, limits, done, *, config, dtype, top):
    return decoding.decode_steps(params, config, cache, logits, stop_masks, limits, done, steps=CHUNK_STEPS,
                                 dtype=dtype, top=top)


def _prefill(params, ids, mask, *, config, dtype):
    """Prompts [n, W] into a cache of their own: -> (next-token logits after each [n, V], the cache)."""
    cache = kv_cache.init_cache(config, ids.shape[0], ids.shape[1], dtype)
    return kv_cache.extend(params, config, cache, ids, mask, dtype)


def _insert(cache, logits, new_cache, new_logits, rows):
    return kv_cache.insert_rows(cache, new_cache, rows), logits.at[rows].set(new_logits, mode="drop")


def _repack(cache, logits, rows, *, slots):
    taken = kv_cache.take_rows(cache, rows)
    return kv_cache.compact(taken, slots), jnp.take(logits, rows, axis=0, mode="fill", fill_value=0)


def _answer(future: Future, result) -> None:
    """Resolve a prompt's future, unless its client has gone (cancelled) meanwhile."""
    try:
        if future.set_running_or_notify_cancel():
            future.set_result(result)
    except InvalidStateError:
        pass
