"""The model thread of the scoring server: batches the prompts of concurrent requests into LocalLM calls.

Scoring (echo log-probs) runs each batch of prompts through LocalLM: every token's log-prob, or (a request's
`echo_from`) only those from a given token on, read as the local backend reads a continuation's
(`LocalLM.score_token_pairs`: the LM head at those positions alone). Generation goes to the decoding batch
(server/decoding_batch.py): each prompt prefilled once into a key/value cache, then a token per step, the prompts of
concurrent requests decoded together in rows that refill as they finish, each row stopping at its own stop strings,
EOS or token budget. The thread alternates a chunk of decoding steps with the scoring work that waits, so neither a
short generation nor a scoring request waits for a long generation to end, and while rows are decoding, decoding
gets as much of the model's time as the scoring beside it (chunks of steps until it has had the seconds a scoring
batch took), so a queue that scoring keeps full starves no generation (it waited for the queue to empty: 42.8 s
against 1.9 s alone beside 3 clients of 16 prompts, issue 85; benchmarks/bench_server_fairness.py); a generation
request joins the decoding batch ahead of the scoring that waits. A finished generation's key/value cache is kept
for later prompts that begin as it did (server/prefix_cache.py: REPLUG's re-asked passes, the passes' shared few-shot
block), up to `prefix_cache_bytes`. A prompt whose request's client has gone (its future
cancelled: server/completions.py cancels every prompt of such a request) is dropped, waiting or decoding.
"""
from __future__ import annotations

import collections
import functools
import itertools
import queue
import threading
import time
from concurrent.futures import Future

import jax
import numpy as np

from replug_jax.models import causal_lm
from replug_jax.models.detokenize import token_shares
from replug_jax.models.served_model import ServedModel, check_served
from replug_jax.models.stop_strings import StopMasks
from replug_jax.parallel import sharding
from replug_jax.server.decoding_batch import DecodingBatch, GenerationRequest
from replug_jax.server.prefix_cache import PrefixCache

MAX_NEW_TOKENS = 256  # tokens one request may generate
MAX_TOP_LOGPROBS = 20
PREFIX_CACHE_BYTES = 1 << 30  # kept key/value rows of finished generations (server/prefix_cache.py)


class CompletionRequestError(ValueError):
    """A request the server refuses with a message for the client: HTTP `status` (400), OpenAI's error `code`."""

    def __init__(self, message: str, status: int = 400, code: str | None = None, param: str | None = None):
        super().__init__(message)
        self.status, self.code, self.param = status, code, param


class ScoringEngine:
    """One worker thread owns the model: it batches the prompts of concurrent requests into LocalLM calls."""

    def __init__(self, lm: ServedModel, *, max_batch_rows: int = 32, batch_wait: float = 0.01,
                 add_start_token: bool = False, prefix_cache_bytes: int = PREFIX_CACHE_BYTES):
        check_served(lm)
        self.lm, self.max_batch_rows, self.add_start_token = lm, max_batch_rows, add_start_token
        self.batch_wait = batch_wait
        if add_start_token and lm.start_id is None:
            raise ValueError("--add-start-token: the tokenizer has no document-start token")
        self._top_k = min(MAX_TOP_LOGPROBS, lm.config.vocab_size)
        self._params = _placed_params(lm.params)
        self._tops = self._compile(functools.partial(_position_tops, config=lm.config, dtype=lm.dtype, k=self._top_k))
        self._decoding = DecodingBatch(lm, self._params, max_rows=max_batch_rows, top=self._top_k,
                                       stop_masks=StopMasks(lm.tokenizer, lm.config.vocab_size),
                                       lead=[lm.start_id] if add_start_token else [], batch_wait=batch_wait,
                                       prefixes=PrefixCache(prefix_cache_bytes))
        self._abandoned_scoring = 0  # scoring requests dropped because their client had gone
        self.working = threading.Lock()  # held by the model thread from taking a request to answering its batch
        # generation requests first (joining the decoding batch is cheap, and they would wait behind every scoring
        # batch a full queue holds), then scoring in arrival order, the stop last: (rank, arrival, item)
        self._queue: queue.PriorityQueue = queue.PriorityQueue()
        self._arrivals = itertools.count()
        self._thread = threading.Thread(target=self._run, name="replug-scoring", daemon=True)
        self._thread.start()

    @property
    def abandoned(self) -> int:
        """Requests (a generation: each prompt) dropped because their client had gone."""
        return self._abandoned_scoring + self._decoding.abandoned

    @property
    def prefix_cache(self) -> dict:
        """What the prefix cache holds and did: rows kept, bytes, hits, misses, tokens reused and prefilled."""
        cache = self._decoding.prefixes
        return {"rows": len(cache), "bytes": cache.nbytes, "budget_bytes": cache.budget_bytes, **cache.stats}

    @property
    def decoding_rows(self) -> int:
        """Prompts being decoded now."""
        return sum(1 for row in self._decoding.rows if row)

    def close(self) -> None:
        self._put(None)
        self._thread.join(timeout=30)

    def tokens(self, text: str) -> tuple[list[int], list[int], list[int], str]:
        """(ids, start offsets, end offsets, text) of a text prompt; token i spans text[starts[i]:ends[i]]."""
        ids, offsets = self.lm.tokenizer.encode_with_offsets(text)
        ends = list(np.maximum.accumulate([end for _, end in offsets])) if offsets else []
        ends = [int(e) for e in ends]
        if ends:
            ends[-1] = len(text)
        return list(ids), [0] + ends[:-1], ends, text

    def pieces(self, ids: list[int]) -> tuple[list[int], list[int], list[int], str]:
        """(ids, starts, ends, text) of a token-id prompt: each token's share of the prompt's text (whole characters,
        models/detokenize.py), concatenated."""
        texts = token_shares(self.lm.tokenizer, ids)
        ends = list(np.cumsum([len(t) for t in texts])) if texts else []
        ends = [int(e) for e in ends]
        return list(ids), [0] + ends[:-1], ends, "".join(texts)

    def check_length(self, n: int, new_tokens: int = 0) -> None:
        total = n + int(self.add_start_token) + new_tokens
        if total > self.lm.max_length:
            raise CompletionRequestError(f"prompt of {n} tokens (+{new_tokens} to generate) exceeds the model's context window "
                               f"of {self.lm.max_length} tokens")
        if n == 0:
            raise CompletionRequestError("the prompt is empty")

    def score(self, prompts: list[list[int]], starts: list[int] | None = None, top: int = 0) -> Future:
        """Future of [per prompt: list of log p per token (None where nothing precedes the token, and before the
        prompt's `starts` entry: the first token whose log-prob is asked)]. `top` > 0 (with every start > 0): per
        prompt (that list, per token its position's top-`top` (token id, log p) pairs, best first, or None), from the
        same forward pass (LocalLM.score_token_pairs(top=)), not a second one (`prompt_tops`)."""
        starts = starts or [0] * len(prompts)
        if top and not all(0 < s < len(p) for p, s in zip(prompts, starts)):
            raise ValueError("top tokens from the scoring pass are read from a start inside each prompt")
        return self._submit("score", [(p, s, top) for p, s in zip(prompts, starts)])

    def generate(self, ids: list[int], new_tokens: int, top: int, stop: tuple[str, ...] = ()) -> Future:
        """Future of [(token id, log p, [(token id, log p)] top entries, best first)] for greedy next tokens, through
        the token whose text completes a stop string, or EOS; the caller decodes texts, off the model thread."""
        future: Future = Future()
        self._put(("generate", GenerationRequest(list(ids), int(new_tokens), int(top), tuple(stop), future), future))
        return future

    def prompt_tops(self, prompts: list[list[int]], k: int) -> Future:
        """Future of [per prompt: per token, its position's top-k (token id, log p) pairs, best first (None where
        nothing precedes the token)]: one extra forward pass per prompt."""
        return self._submit("tops", (prompts, k))

    def _submit(self, kind: str, payload) -> Future:
        future: Future = Future()
        self._put((kind, payload, future))
        return future

    RANKS = {"generate": 0, None: 2}  # every other kind (score, tops): 1

    def _put(self, item) -> None:
        self._queue.put((self.RANKS.get(item[0] if item else None, 1), next(self._arrivals), item))

    def _take(self, block: bool = True, timeout: float | None = None):
        return self._queue.get(block=block, timeout=timeout)[2]

    def _run(self) -> None:
        pending: collections.deque = collections.deque()
        owed = 0.0  # seconds of decoding owed: scoring ran this long while rows were busy
        while True:
            if not self._decoding.busy:
                owed = 0.0
            if owed > 0:  # decoding gets as much time as scoring took, however full the queue stays
                item = _DECODE
            elif pending:
                item = pending.popleft()
            elif self._decoding.busy:  # a chunk of decoding steps whenever nothing else waits
                try:
                    wait = self._decoding.seconds_to_gather()
                    item = self._take(timeout=wait) if wait > 0 else self._take(block=False)
                except queue.Empty:
                    item = _DECODE
            else:
                item = self._take()
            if item is None:
                self._decoding.fail(RuntimeError("the server is stopping"))
                return
            with self.working:  # whoever holds it (a test, a pause) keeps the model idle; requests wait, cancellable
                started = time.perf_counter()
                if item is _DECODE:
                    try:
                        self._decoding.step()
                    except Exception as e:  # noqa: BLE001 - handed to every prompt being decoded
                        self._decoding.fail(e)
                    owed = max(0.0, owed - (time.perf_counter() - started))
                elif item[0] == "generate":
                    self._decoding.add(item[1])
                else:
                    self._answer(item, pending)
                    if self._decoding.busy:
                        owed += time.perf_counter() - started

    def _answer(self, item, pending: collections.deque) -> None:
        """Work on `item` and the requests of its kind that join it within batch_wait (others go to `pending`)."""
        batch = [item] if self._claim(item) else []
        rows = len(item[1])
        deadline = time.monotonic() + self.batch_wait
        while item[0] == "score" and rows < self.max_batch_rows:
            try:  # prompts of requests arriving within batch_wait seconds join this batch (the same kind)
                more = self._take(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if more is None or more[0] != item[0]:
                pending.append(more)
                break
            if self._claim(more):
                batch.append(more)
                rows += len(more[1])
        if not batch:
            return
        if item[0] == "tops":
            _resolve(item[2], self._prompt_tops, *item[1])
            return
        try:
            flat = self._score_rows([p for _, prompts, _ in batch for p in prompts])
        except Exception as e:  # noqa: BLE001 - handed to every waiting request
            for _, _, future in batch:
                future.set_exception(e)
            return
        for _, prompts, future in batch:
            mine, flat = flat[: len(prompts)], flat[len(prompts):]
            future.set_result(mine if prompts[0][2] else [values for values, _ in mine])

    def _claim(self, item) -> bool:
        """Whether to work on a queued request: False (and counted) when its client has gone."""
        if item[2].set_running_or_notify_cancel():
            return True
        self._abandoned_scoring += 1
        return False

    def _score_rows(self, items: list[tuple[list[int], int, int]]) -> list[tuple[list, list | None]]:
        """Per (prompt, start, top), (log p of each token from `start` on: None before it and where nothing precedes
        the token; with top > 0, each token's position's top (token id, log p) pairs, None before `start`). From the
        first token: prompts sharing a long prefix score it once (LocalLM.score_prompts); from a later one: as a
        context and a continuation (LocalLM.score_token_pairs, the local backend's scoring, its top tokens from the
        same pass)."""
        lead = [self.lm.start_id] if self.add_start_token else []
        out: list = [None] * len(items)
        whole = [i for i, (_, start, _) in enumerate(items) if start == 0]
        if whole:
            scored = self.lm.score_prompts([lead + items[i][0] for i in whole], lead=1)
            for i, values in zip(whole, scored):
                out[i] = ([] if lead else [None]) + [float(v) for v in values], None
        for top in sorted({top for ids, start, top in items if 0 < start < len(ids)}):
            tails = [i for i, (ids, start, t) in enumerate(items) if 0 < start < len(ids) and t == top]
            pairs = [(lead + items[i][0][: items[i][1]], items[i][0][items[i][1] :]) for i in tails]
            for i, scored in zip(tails, self.lm.score_token_pairs(pairs, top=top)):
                before = [None] * items[i][1]
                if not top:
                    out[i] = before + [float(v) for v in scored], None
                    continue
                values, top_lps, top_ids = causal_lm.unpack_top(np.asarray(scored))  # [T], [T, top], [T, top]
                out[i] = before + values.tolist(), before + [list(zip(j, v)) for j, v in
                                                             zip(top_ids.tolist(), top_lps.tolist())]
        return [([None] * len(items[i][0]), None) if row is None else row for i, row in enumerate(out)]

    def _prompt_tops(self, prompts: list[list[int]], k: int) -> list[list]:
        shift, out = int(self.add_start_token), []
        for ids in prompts:
            prefix = ([self.lm.start_id] if shift else []) + list(ids)
            length = sharding.length_bucket(len(prefix), self.lm.length_multiple, self.lm.max_length)
            packed = self._tops(*sharding.pad_rows([prefix], length, self.lm.pad_id, 1))[0]  # [L, 2K]
            values, idx = packed[:, :k].tolist(), packed[:, self._top_k : self._top_k + k].astype(np.int64).tolist()
            out.append([None if i + shift == 0 else list(zip(idx[i + shift - 1], values[i + shift - 1]))
                        for i in range(len(ids))])
        return out

    def _compile(self, fn):
        """fn(params, *arrays) -> numpy array(s), jitted on the LM's parameters as they are placed."""
        jitted = jax.jit(fn)

        def run(*arrays):
            out = jitted(self._params, *arrays)
            as_numpy = lambda x: np.asarray(sharding.local_copy(x))  # noqa: E731
            return tuple(map(as_numpy, out)) if isinstance(out, tuple) else as_numpy(out)
        return run


def _position_tops(params, ids, mask, *, config, dtype, k):
    """The top-k next-token log-probs after every position, values then ids (as floats): [B, L, 2k]."""
    logp = jax.nn.log_softmax(causal_lm.logits(params, config, ids, mask, dtype), axis=-1)
    values, idx = jax.lax.top_k(logp.astype(jax.numpy.float32), k)  # float32 holds ids < 2^24 exactly
    return jax.numpy.concatenate([values, idx.astype(jax.numpy.float32)], axis=-1)


def _placed_params(params):
    """The LM's parameters as the model thread's functions take them: the first device's copy of replicated
    parameters (no copy made), sharded ones as they are."""
    if all(getattr(x, "sharding", None) is not None and x.sharding.is_fully_replicated for x in jax.tree.leaves(params)):
        return jax.tree.map(lambda x: x.addressable_shards[0].data, params)
    return params


_DECODE = object()  # the model thread's own work item: a chunk of decoding steps


def _resolve(future: Future, fn, *args) -> None:
    try:
        future.set_result(fn(*args))
    except Exception as e:  # noqa: BLE001
        future.set_exception(e)
