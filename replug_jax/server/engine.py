"""The model thread of the scoring server: batches the prompts of concurrent requests into LocalLM calls.

Scoring (echo log-probs) runs each batch of prompts through LocalLM: every token's log-prob, or (a request's
`echo_from`) only those from a given token on, read as the local backend reads a continuation's
(`LocalLM.score_token_pairs`: the LM head at those positions alone). Generation prefills each prompt once into a
key/value cache and decodes one token per step (models/decoding.py, the loop the local backend's ensembles use),
the prompts of concurrent requests decoded together, each stopping at its own stop strings, EOS or token budget.
A prompt whose request's client has gone (its future cancelled: server/completions.py cancels every prompt of such a
request) is dropped before the model takes it up; a batch under way runs to its end.
"""
from __future__ import annotations

import collections
import functools
import queue
import threading
import time
from concurrent.futures import Future

import jax
import numpy as np

from replug_jax.models import causal_lm, decoding, kv_cache
from replug_jax.models.detokenize import token_shares
from replug_jax.models.served_model import ServedModel, check_served
from replug_jax.models.stop_strings import StopMasks
from replug_jax.parallel import sharding

MAX_NEW_TOKENS = 256  # tokens one request may generate
NEW_TOKEN_MULTIPLE = 16  # decoding steps are compiled for multiples of this
MAX_TOP_LOGPROBS = 20


class CompletionRequestError(ValueError):
    """A request the server refuses with a message for the client: HTTP `status` (400), OpenAI's error `code`."""

    def __init__(self, message: str, status: int = 400, code: str | None = None, param: str | None = None):
        super().__init__(message)
        self.status, self.code, self.param = status, code, param


class ScoringEngine:
    """One worker thread owns the model: it batches the prompts of concurrent requests into LocalLM calls."""

    def __init__(self, lm: ServedModel, *, max_batch_rows: int = 32, batch_wait: float = 0.01,
                 add_start_token: bool = False):
        check_served(lm)
        self.lm, self.max_batch_rows, self.add_start_token = lm, max_batch_rows, add_start_token
        self.batch_wait = batch_wait
        if add_start_token and lm.start_id is None:
            raise ValueError("--add-start-token: the tokenizer has no document-start token")
        self._top_k = min(MAX_TOP_LOGPROBS, lm.config.vocab_size)
        self._tops = self._compile(functools.partial(_position_tops, config=lm.config, dtype=lm.dtype, k=self._top_k))
        self._stop_mask = StopMasks(lm.tokenizer, lm.config.vocab_size)
        self._decoders: dict[tuple, object] = {}
        self.abandoned = 0  # requests dropped because their client had gone
        self.working = threading.Lock()  # held by the model thread from taking a request to answering its batch
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="replug-scoring", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._queue.put(None)
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

    def score(self, prompts: list[list[int]], starts: list[int] | None = None) -> Future:
        """Future of [per prompt: list of log p per token (None where nothing precedes the token, and before the
        prompt's `starts` entry: the first token whose log-prob is asked)]."""
        return self._submit("score", list(zip(prompts, starts or [0] * len(prompts))))

    def generate(self, ids: list[int], new_tokens: int, top: int, stop: tuple[str, ...] = ()) -> Future:
        """Future of [(token id, log p, [(token id, log p)] top entries, best first)] for greedy next tokens, through
        the first token whose text holds a stop string (a stop string spanning tokens is cut by the caller) or EOS;
        the caller decodes texts, off the model thread."""
        return self._submit("generate", [(list(ids), int(new_tokens), int(top), tuple(stop))])

    def prompt_tops(self, prompts: list[list[int]], k: int) -> Future:
        """Future of [per prompt: per token, its position's top-k (token id, log p) pairs, best first (None where
        nothing precedes the token)]: one extra forward pass per prompt."""
        return self._submit("tops", (prompts, k))

    def _submit(self, kind: str, payload) -> Future:
        future: Future = Future()
        self._queue.put((kind, payload, future))
        return future

    def _run(self) -> None:
        pending: collections.deque = collections.deque()
        while True:
            item = pending.popleft() if pending else self._queue.get()
            if item is None:
                return
            with self.working:  # whoever holds it (a test, a pause) keeps the model idle; requests wait, cancellable
                self._answer(item, pending)

    def _answer(self, item, pending: collections.deque) -> None:
        """Work on `item` and the requests of its kind that join it within batch_wait (others go to `pending`)."""
        batch = [item] if self._claim(item) else []
        rows = len(item[1])
        deadline = time.monotonic() + self.batch_wait
        while item[0] in ("score", "generate") and rows < self.max_batch_rows:
            try:  # prompts of requests arriving within batch_wait seconds join this batch (the same kind)
                more = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
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
        work = self._score_rows if item[0] == "score" else self._generate_rows
        try:
            flat = work([p for _, prompts, _ in batch for p in prompts])
        except Exception as e:  # noqa: BLE001 - handed to every waiting request
            for _, _, future in batch:
                future.set_exception(e)
            return
        for _, prompts, future in batch:  # a score request's list of prompts; a generate request's one prompt
            future.set_result(flat[: len(prompts)] if item[0] == "score" else flat[0])
            flat = flat[len(prompts):]

    def _claim(self, item) -> bool:
        """Whether to work on a queued request: False (and counted) when its client has gone."""
        if item[2].set_running_or_notify_cancel():
            return True
        self.abandoned += 1
        return False

    def _score_rows(self, items: list[tuple[list[int], int]]) -> list[list[float | None]]:
        """Per (prompt, start), log p of each token from `start` on (None before it and where nothing precedes the
        token). From the first token: prompts sharing a long prefix score it once (LocalLM.score_prompts); from a
        later one: as a context and a continuation (LocalLM.score_token_pairs, the local backend's scoring)."""
        lead = [self.lm.start_id] if self.add_start_token else []
        out: list = [None] * len(items)
        whole = [i for i, (_, start) in enumerate(items) if start == 0]
        if whole:
            scored = self.lm.score_prompts([lead + items[i][0] for i in whole], lead=1)
            for i, values in zip(whole, scored):
                out[i] = ([] if lead else [None]) + [float(v) for v in values]
        tails = [i for i, (ids, start) in enumerate(items) if 0 < start < len(ids)]
        if tails:
            pairs = [(lead + items[i][0][: items[i][1]], items[i][0][items[i][1] :]) for i in tails]
            for i, values in zip(tails, self.lm.score_token_pairs(pairs)):
                out[i] = [None] * items[i][1] + [float(v) for v in values]
        return [[None] * len(items[i][0]) if row is None else row for i, row in enumerate(out)]

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

    def _generate_rows(self, requests: list[tuple]) -> list[list[tuple[int, float, list]]]:
        """Greedy decoding of (ids, new tokens, top, stop strings) requests together: one prefill of every prompt
        into a key/value cache, then one token per step (models/decoding.py)."""
        lm, shift = self.lm, [self.lm.start_id] if self.add_start_token else []
        prompts = [shift + ids for ids, *_ in requests]
        limits = [n for _, n, _, _ in requests]
        steps = sharding.round_up(max(max(limits), 1), NEW_TOKEN_MULTIPLE)
        width = sharding.length_bucket(max(len(p) for p in prompts), lm.length_multiple, lm.max_length)
        rows = 1 << (len(prompts) - 1).bit_length()  # a power of two: few shapes to compile
        ids, mask = sharding.pad_rows(prompts + [[lm.pad_id]] * (rows - len(prompts)), width, lm.pad_id, rows)
        stops = np.stack([self._stop_mask(stop) for *_, stop in requests]
                         + [self._stop_mask(())] * (rows - len(prompts)))  # [rows, V]
        budget = np.array(limits + [0] * (rows - len(prompts)), np.int32)  # filler rows generate nothing
        tokens, lps, counts, top_lps, top_ids = self._decoder(rows, width, steps)(ids, mask, stops, budget)
        out = []
        for r, (_, _, top, _) in enumerate(requests):
            out.append([(int(tokens[r, j]), float(lps[r, j]),
                         list(zip(top_ids[r, j, :top].tolist(), top_lps[r, j, :top].tolist())))
                        for j in range(int(counts[r]))])
        return out

    def _decoder(self, rows: int, width: int, steps: int):
        key = (rows, width, steps)
        if key not in self._decoders:
            fn = functools.partial(_decode, config=self.lm.config, dtype=self.lm.dtype, slots=width + steps,
                                   steps=steps, top=self._top_k)
            self._decoders[key] = self._compile(fn)
        return self._decoders[key]

    def _compile(self, fn):
        """fn(params, *arrays) -> numpy array(s), jitted on the LM's parameters as they are placed: the first
        device's copy of replicated parameters (no copy made), sharded ones as they are."""
        params = self.lm.params
        if all(getattr(x, "sharding", None) is not None and x.sharding.is_fully_replicated
               for x in jax.tree.leaves(params)):
            params = jax.tree.map(lambda x: x.addressable_shards[0].data, params)
        jitted = jax.jit(fn)

        def run(*arrays):
            out = jitted(params, *arrays)
            as_numpy = lambda x: np.asarray(sharding.local_copy(x))  # noqa: E731
            return tuple(map(as_numpy, out)) if isinstance(out, tuple) else as_numpy(out)
        return run


def _decode(params, ids, mask, stop_masks, limits, *, config, dtype, slots, steps, top):
    """Prefill the prompts [B, L] into a cache of `slots` positions, then greedy decoding (models/decoding.py):
    tokens [B, steps], log-probs [B, steps], counts [B], each step's top log-probs and ids [B, steps, top]."""
    cache = kv_cache.init_cache(config, ids.shape[0], slots, dtype)
    logits, cache = kv_cache.extend(params, config, cache, ids, mask, dtype)  # [B, V] after each prompt
    tokens, lps, counts, (top_lps, top_ids) = decoding.greedy_decode(
        params, config, cache, logits, stop_masks, limits, jax.numpy.zeros(limits.shape, bool), steps=steps,
        dtype=dtype, top=top)
    return tokens, lps, counts, top_lps, top_ids


def _position_tops(params, ids, mask, *, config, dtype, k):
    """The top-k next-token log-probs after every position, values then ids (as floats): [B, L, 2k]."""
    logp = jax.nn.log_softmax(causal_lm.logits(params, config, ids, mask, dtype), axis=-1)
    values, idx = jax.lax.top_k(logp.astype(jax.numpy.float32), k)  # float32 holds ids < 2^24 exactly
    return jax.numpy.concatenate([values, idx.astype(jax.numpy.float32)], axis=-1)


def _resolve(future: Future, fn, *args) -> None:
    try:
        future.set_result(fn(*args))
    except Exception as e:  # noqa: BLE001
        future.set_exception(e)
