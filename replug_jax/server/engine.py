"""The model thread of the scoring server: batches the prompts of concurrent requests into LocalLM calls."""
from __future__ import annotations

import collections
import functools
import queue
import threading
import time
from concurrent.futures import Future

import jax
import numpy as np

from replug_jax import sharding
from replug_jax.models import causal_lm

MAX_NEW_TOKENS = 16
MAX_TOP_LOGPROBS = 20


class RequestError(ValueError):
    """A request the server refuses (HTTP 400) with a message for the client."""


class ScoringEngine:
    """One worker thread owns the model: it batches the prompts of concurrent requests into LocalLM calls."""

    def __init__(self, lm, *, max_batch_rows: int = 32, batch_wait: float = 0.01, add_start_token: bool = False):
        self.lm, self.max_batch_rows, self.add_start_token = lm, max_batch_rows, add_start_token
        self.batch_wait = batch_wait
        if add_start_token and lm.start_id is None:
            raise ValueError("--add-start-token: the tokenizer has no document-start token")
        fn = functools.partial(_last_logprobs, config=lm.config, dtype=lm.dtype)
        leaves = jax.tree.leaves(lm.params)
        if all(getattr(x, "sharding", None) is not None and x.sharding.is_fully_replicated for x in leaves):
            # generation is one row: run it on the first device's copy of the replicated params (no copy made)
            params = jax.tree.map(lambda x: x.addressable_shards[0].data, lm.params)
            jitted = jax.jit(fn)
            self._next = lambda ids, mask: np.asarray(jitted(params, ids, mask))  # [1, V] next-token log-probs
        else:
            mesh = getattr(lm, "mesh", None) or sharding.data_mesh()
            self._next = sharding.ShardedBatchFn(fn, lm.params, sharding.data_size(mesh), mesh,
                                                 param_shardings=getattr(lm, "param_shardings", None))
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
        """(ids, starts, ends, text) of a token-id prompt: each token's own decoded text, concatenated."""
        texts = [self.lm.tokenizer.decode([t]) for t in ids]
        ends = list(np.cumsum([len(t) for t in texts])) if texts else []
        ends = [int(e) for e in ends]
        return list(ids), [0] + ends[:-1], ends, "".join(texts)

    def check_length(self, n: int, new_tokens: int = 0) -> None:
        total = n + int(self.add_start_token) + new_tokens
        if total > self.lm.max_length:
            raise RequestError(f"prompt of {n} tokens (+{new_tokens} to generate) exceeds the model's context window "
                               f"of {self.lm.max_length} tokens")
        if n == 0:
            raise RequestError("the prompt is empty")

    def score(self, prompts: list[list[int]]) -> Future:
        """Future of [per prompt: list of log p per token (None where nothing precedes the token)]."""
        return self._submit("score", prompts)

    def generate(self, ids: list[int], new_tokens: int, top: int) -> Future:
        """Future of [(token id, log p, {token text: log p} top entries)] for greedy next tokens."""
        return self._submit("generate", (ids, new_tokens, top))

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
            if item[0] == "generate":
                _resolve(item[2], self._generate, *item[1])
                continue
            batch, rows = [item], len(item[1])
            deadline = time.monotonic() + self.batch_wait
            while rows < self.max_batch_rows:
                try:  # prompts of requests arriving within batch_wait seconds join this batch
                    more = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if more is None or more[0] != "score":
                    pending.append(more)
                    break
                batch.append(more)
                rows += len(more[1])
            try:
                flat = self._score_rows([p for _, prompts, _ in batch for p in prompts])
            except Exception as e:  # noqa: BLE001 - handed to every waiting request
                for _, _, future in batch:
                    future.set_exception(e)
                continue
            for _, prompts, future in batch:
                future.set_result(flat[: len(prompts)])
                flat = flat[len(prompts):]

    def _score_rows(self, prompts: list[list[int]]) -> list[list[float | None]]:
        if self.add_start_token:
            pairs = [([self.lm.start_id], ids) for ids in prompts]
        else:
            pairs = [(ids[:1], ids[1:]) for ids in prompts if len(ids) > 1]
        scored = iter(self.lm.score_token_pairs(pairs)) if pairs else iter(())
        out = []
        for ids in prompts:
            if self.add_start_token:
                out.append([float(v) for v in next(scored)])
            else:
                out.append([None] + ([float(v) for v in next(scored)] if len(ids) > 1 else []))
        return out

    def _generate(self, ids: list[int], new_tokens: int, top: int) -> list[tuple[int, float, dict]]:
        prefix = ([self.lm.start_id] if self.add_start_token else []) + list(ids)
        out = []
        for _ in range(new_tokens):
            length = sharding.length_bucket(len(prefix), self.lm.length_multiple, self.lm.max_length)
            row_ids, mask = sharding.pad_rows([prefix], length, self.lm.pad_id, 1)
            logp = self._next(row_ids, mask)[0]  # [V]
            best = int(np.argmax(logp))
            order = np.argsort(-logp)[:top] if top else []
            out.append((best, float(logp[best]), {self.lm.tokenizer.decode([int(i)]): float(logp[i]) for i in order}))
            if best == self.lm.tokenizer.eos_id or len(prefix) + 1 >= self.lm.max_length:
                break
            prefix.append(best)
        return out


def _last_logprobs(params, ids, mask, *, config, dtype):
    """Next-token log-probs after each row's last real token: [B, V]."""
    logits = causal_lm.logits(params, config, ids, mask, dtype)  # [B, L, V]
    last = mask.sum(-1) - 1  # [B]
    return jax.nn.log_softmax(jax.numpy.take_along_axis(logits, last[:, None, None], axis=1)[:, 0], axis=-1)


def _resolve(future: Future, fn, *args) -> None:
    try:
        future.set_result(fn(*args))
    except Exception as e:  # noqa: BLE001
        future.set_exception(e)
