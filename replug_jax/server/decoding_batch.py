"""The scoring server's decoding batch: rows that refill as they finish (continuous batching, as vLLM's scheduler).

Each prompt to generate from takes a row of one key/value cache. The model thread (server/engine.py) alternates
`step`s with its scoring work; a step
1. drops the rows whose client has gone (their future cancelled: server/completions.py cancels every prompt of such
   a request) and admits waiting prompts into free rows: they are prefilled together into a cache of their own
   and copied into their rows (kv_cache.insert_rows); a prompt sharing its beginning with a row kept from an earlier
   request (server/prefix_cache.py) starts from that row instead, and only its own tokens are computed (`_resume`);
2. decodes every row CHUNK_STEPS tokens at most (models/decoding.py's `decode_steps`, greedy, the step's top
   log-probs kept), each row to its own budget, EOS or a token holding a whole stop string;
3. retires the rows that are done: their budget spent, EOS, or a stop string in their text, matched on the host on
   the text decoded as it grows (models/detokenize.py), so a stop string spanning tokens ends its row within
   CHUNK_STEPS tokens instead of at its budget; a retired row is kept in the prefix cache (its prompt and the tokens
   its cache holds).

A short request admitted beside a long one leaves after its own tokens. The batch has a power of two of rows (at
least the busy ones, at most `max_rows`) and a power of two of slots (SLOT_MULTIPLE at least); when a row's tokens
would pass the slots, the busy rows are repacked (kv_cache.take_rows, kv_cache.compact: each row's tokens moved to
the front). Compiled shapes: the chunk per (rows, slots), the prefill per (prompts, length bucket), the prompts resumed
together per (prompts, slots, own tokens' length bucket). Admitted prompts take slots that end where the written ones
end (kv_cache.insert_rows' `end`), so the cache every decoding step reads stays as wide as its longest row: appended
after the written slots, each admission moved every row's slots on by its width, and with REPLUG's passes of a few
hundred tokens admitted a few at a time the cache grew by that width each time until a repack compacted it. Resumed
prompts are padded to the length bucket of their own tokens, not its power of two (150 own tokens: 160, not 256);
prefill is compute-bound on a CPU, so the padding was paid in full: the QA job's first mixture step through the
server replayed on the engine, 54 s before and 40 s after (benchmarks/profile_served_generation.py,
benchmarks/README.md).
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
from replug_jax.server.prefix_cache import PrefixCache

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
    held: list[int]  # the tokens of the row's cache in order (start token, prompt, generated), the last ones maybe not yet
    out: list = dataclasses.field(default_factory=list)  # [(token id, log p, [(token id, log p)] best first)]
    done: bool = False


class DecodingBatch:
    """The rows being decoded and the prompts waiting for one (module docstring). Used by the model thread alone."""

    def __init__(self, lm: ServedModel, params, *, max_rows: int, top: int, stop_masks: StopMasks,
                 lead: list[int], batch_wait: float, prefixes: PrefixCache | None = None):
        self.lm, self.params, self.top, self.stop_masks, self.lead = lm, params, top, stop_masks, lead
        self.prefixes = prefixes if prefixes is not None else PrefixCache(0)
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
        self._insert_first = jax.jit(_insert_first, static_argnames="slots")
        self._start = jax.jit(_start, static_argnames="slots")
        self._resume = jax.jit(functools.partial(_resume, config=lm.config, dtype=lm.dtype))
        self._take_row = jax.jit(_take_row, static_argnames="slots")
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
            self.rows[r].held.extend(tokens[r, : counts[r]].tolist())  # appended on the device, maybe all but the last
            self._take(self.rows[r], [(int(tokens[r, j]), float(lps[r, j]),
                                       list(zip(top_ids[r, j].tolist(), top_lps[r, j].tolist())))
                                      for j in range(int(counts[r]))], stops[r])
        retired = [r for r in busy if self.rows[r].done]
        if retired and self.prefixes.enabled:
            held = np.asarray(self._cache["count"])  # [R] tokens each row's cache holds
            for r in retired:
                self._keep(r, self.rows[r].held[: int(held[r])])
        for r in retired:
            request, out = self.rows[r].request, self.rows[r].out
            _answer(request.future, [(t, lp, best[:request.top]) for t, lp, best in out])
            self.rows[r] = None

    def _keep(self, r: int, ids: list[int]) -> None:
        """Row r's cache, holding `ids`, kept for later prompts that begin as it does (server/prefix_cache.py)."""
        if self.prefixes.wants(ids):
            self.prefixes.keep(ids, self._take_row(self._cache, np.array([r], np.int32), slots=_slot_bucket(len(ids))))

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
        found = [self.prefixes.find(p) if self.prefixes.enabled else None for p in prompts]  # (kept row, shared)
        fresh = [i for i, hit in enumerate(found) if hit is None]  # prefilled together
        hits = [i for i, hit in enumerate(found) if hit]  # resumed together from their kept rows
        width = sharding.length_bucket(max(len(prompts[i]) for i in fresh), self.lm.length_multiple,
                                       self.lm.max_length) if fresh else 0
        resumed = _Resumed.plan([(prompts[i], found[i][1]) for i in hits], self.lm) if hits else None
        rows = max(len(self.rows), 1 << (busy + count - 1).bit_length())
        widest = max(width, resumed.inserted if hits else 0)
        self._make_room(CHUNK_STEPS, rows, widest)
        end = np.int32(max(self._length, widest))  # the new rows' slots end where the written ones do
        free = [i for i, row in enumerate(self.rows) if row is None][:count]
        if fresh:
            logits, new_cache = self._prefilled([prompts[i] for i in fresh], width)
            self._cache, self._logits = self._insert(self._cache, self._logits, new_cache, logits,
                                                     _places([free[i] for i in fresh], len(self.rows)), end)
        if hits:
            logits, new_cache = self._resumed([found[i][0].cache for i in hits], resumed)
            self._cache, self._logits = self._insert_first(self._cache, self._logits, new_cache, logits,
                                                           _places([free[i] for i in hits], len(self.rows)), end,
                                                           slots=resumed.inserted)
        self._length = int(end)
        for r, request, prompt in zip(free, new, prompts):
            self.rows[r] = _Row(request, IncrementalText(self.lm.tokenizer), held=list(prompt))

    def _prefilled(self, prompts: list[list[int]], width: int):
        """The prompts prefilled together (a power of two of rows: few shapes to compile): (logits [n, V], cache)."""
        n = 1 << (len(prompts) - 1).bit_length()
        ids, mask = sharding.pad_rows(prompts + [[self.lm.pad_id]] * (n - len(prompts)), width, self.lm.pad_id, n)
        return self._prefill(self.params, ids, mask)

    def _resumed(self, kept: list[dict], plan: "_Resumed"):
        """The kept rows' shared tokens, each prompt's own appended, in one forward pass (a power of two of rows):
        (logits [n, V], cache)."""
        n = 1 << (len(kept) - 1).bit_length()
        starts = [self._start(cache, np.int32(shared), slots=plan.slots) for cache, shared in zip(kept, plan.shared)]
        ids, mask = sharding.pad_rows(plan.own + [[self.lm.pad_id]] * (n - len(plan.own)), plan.width, self.lm.pad_id,
                                      n)
        return self._resume(self.params, starts + [starts[0]] * (n - len(starts)), ids, mask)

    def _make_room(self, need: int, rows: int | None = None, widest: int = 0) -> None:
        """At least `need` free slots after the written ones, or after the first `widest` where those are more (new
        rows' slots end where the written ones do: `_admit`), and `rows` rows (default: as many as now, fewer where
        the busy rows fit in fewer): the busy rows repacked into a new cache when that changes anything."""
        busy = [i for i, row in enumerate(self.rows) if row]
        if rows is None:
            rows = 1 << (len(busy) - 1).bit_length() if busy else 1
        if self._cache is not None and rows == len(self.rows) and max(self._length, widest) + need <= self._slots:
            return
        if self._cache is None:
            self._slots = _slot_bucket(widest + need)
            self._cache = kv_cache.init_cache(self.lm.config, rows, self._slots, self.lm.dtype)
            self._logits = jnp.zeros((rows, self.lm.config.vocab_size), jnp.float32)
            self.rows, self._length = [None] * rows, 0
            return
        order = busy + [len(self.rows)] * (rows - len(busy))  # busy rows first; the rest empty
        counts = np.asarray(self._cache["count"])
        used = max([int(counts[i]) for i in busy], default=0)
        self._slots = _slot_bucket(max(used, widest) + need)
        self._cache, self._logits = self._repack(self._cache, self._logits, np.array(order, np.int32),
                                                 slots=self._slots)
        self._length = int(self._cache["length"])
        self.rows = [self.rows[i] for i in busy] + [None] * (rows - len(busy))

    def _reset(self) -> None:
        self._cache = self._logits = None
        self.rows, self._slots, self._length = [], 0, 0


def _places(rows: list[int], nowhere: int) -> np.ndarray:
    """Batch rows for a power of two of new rows: the given ones, then `nowhere` (a filler's row: dropped)."""
    n = 1 << (len(rows) - 1).bit_length()
    return np.array(rows + [nowhere] * (n - len(rows)), np.int32)


def _slot_bucket(n: int) -> int:
    return max(SLOT_MULTIPLE, 1 << (n - 1).bit_length())


def _chunk(params, cache, logits, stop_masks, limits, done, *, config, dtype, top):
    return decoding.decode_steps(params, config, cache, logits, stop_masks, limits, done, steps=CHUNK_STEPS,
                                 dtype=dtype, top=top)


def _prefill(params, ids, mask, *, config, dtype):
    """Prompts [n, W] into a cache of their own: -> (next-token logits after each [n, V], the cache)."""
    cache = kv_cache.init_cache(config, ids.shape[0], ids.shape[1], dtype)
    return kv_cache.extend(params, config, cache, ids, mask, dtype)


def _insert(cache, logits, new_cache, new_logits, rows, end):
    """The new rows' caches into rows `rows` of the batch's, their slots ending at `end`, and their logits."""
    return kv_cache.insert_rows(cache, new_cache, rows, end), logits.at[rows].set(new_logits, mode="drop")


def _insert_first(cache, logits, new_cache, new_logits, rows, end, *, slots):
    """`_insert` of a compacted cache's first `slots` slots (where its real tokens lie)."""
    return _insert(cache, logits, kv_cache.first_slots(new_cache, slots), new_logits, rows, end)


@dataclasses.dataclass
class _Resumed:
    """The shapes of prompts resumed together from kept rows: each row's first `shared` tokens in `slots` slots, the
    prompts' `own` tokens appended (padded to `width`) after the longest shared part, in one forward pass; the first
    `inserted` slots go into the batch (every real token lies there), once for all of them."""

    shared: list[int]
    own: list[list[int]]
    width: int
    slots: int
    inserted: int

    @classmethod
    def plan(cls, prompts: list[tuple[list[int], int]], lm) -> "_Resumed":
        own = [ids[shared:] for ids, shared in prompts]
        longest_own, longest_shared = max(map(len, own)), max(shared for _, shared in prompts)
        width = sharding.length_bucket(longest_own, lm.length_multiple, lm.max_length)
        slots = _slot_bucket(longest_shared + width)
        inserted = min(sharding.length_bucket(longest_shared + longest_own, lm.length_multiple, lm.max_length), slots)
        return cls([shared for _, shared in prompts], own, width, slots, inserted)


def _start(kept, shared, *, slots):
    """A kept row's first `shared` tokens, the rest forgotten, in a cache of `slots` slots ([0, shared) real)."""
    return kv_cache.compact(kv_cache.truncate(kept, shared), slots)


def _resume(params, starts, ids, mask, *, config, dtype):
    """One-row caches `starts` (`_start`'s, as many as `ids` [n, W] has rows) stacked, each row's `ids` (mask
    [n, W]) appended after the longest one's tokens: -> (next-token logits [n, V], the n-row cache). A row's
    positions go on from its own tokens (its count), whatever the empty slots between."""
    cache = {name: jnp.concatenate([s[name] for s in starts], axis=1 if name in ("k", "v") else 0)
             for name in ("k", "v", "key_mask", "count")}
    cache["length"] = jnp.max(jnp.stack([s["length"] for s in starts]))
    return kv_cache.extend(params, config, cache, ids, mask, dtype)


def _take_row(cache, rows, *, slots):
    """Rows `rows` [n] of the batch's cache as a cache of their own, each row's real tokens first in `slots` slots."""
    return kv_cache.compact(kv_cache.take_rows(cache, rows), slots)


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
