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

from replug_jax.models import causal_lm
from replug_jax.parallel import sharding

MAX_NEW_TOKENS = 16
MAX_TOP_LOGPROBS = 20


class RequestError(ValueError):
    """A request the server refuses with a message for the client: HTTP `status` (400), OpenAI's error `code`."""

    def __init__(self, message: str, status: int = 400, code: str | None = None, param: str | None = None):
        super().__init__(message)
        self.status, self.code, self.param = status, code, param


class ScoringEngine:
    """One worker thread owns the model: it batches the prompts of concurrent requests into LocalLM calls."""

    def __init__(self, lm, *, max_batch_rows: int = 32, batch_wait: float = 0.01, add_start_token: bool = False):
        self.lm, self.max_batch_rows, self.add_start_token = lm, max_batch_rows, add_start_token
        self.batch_wait = batch_wait
        if add_start_token and lm.start_id is None:
            raise ValueError("--add-start-token: the tokenizer has no document-start token")
        self._next = self._compile(functools.partial(_last_logprobs, config=lm.config, dtype=lm.dtype))  # [1, V]
        self._top_k = min(MAX_TOP_LOGPROBS, lm.config.vocab_size)
        self._tops = self._compile(functools.partial(_position_tops, config=lm.config, dtype=lm.dtype, k=self._top_k))
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="replug-scoring", daemon=True)
        self._thread.start()

    def _compile(self, fn):
        """fn(params, ids, mask) on one row -> numpy: on the first device's copy of replicated parameters (no copy
        made), else sharded as the LM's parameters are."""
        lm = self.lm
        leaves = jax.tree.leaves(lm.params)
        if all(getattr(x, "sharding", None) is not None and x.sharding.is_fully_replicated for x in leaves):
            params = jax.tree.map(lambda x: x.addressable_shards[0].data, lm.params)
            jitted = jax.jit(fn)
            return lambda ids, mask: np.asarray(jitted(params, ids, mask))
        mesh = getattr(lm, "mesh", None) or sharding.data_mesh()
        return sharding.ShardedBatchFn(fn, lm.params, sharding.data_size(mesh), mesh,
                                       param_shardings=getattr(lm, "param_shardings", None))

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
            if item[0] != "score":
                _resolve(item[2], self._generate if item[0] == "generate" else self._prompt_tops, *item[1])
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


def _position_tops(params, ids, mask, *, config, dtype, k):
    """The top-k next-token log-probs after every position, values then ids (as floats): [B, L, 2k]."""
    logp = jax.nn.log_softmax(causal_lm.logits(params, config, ids, mask, dtype), axis=-1)
    values, idx = jax.lax.top_k(logp.astype(jax.numpy.float32), k)  # float32 holds ids < 2^24 exactly
    return jax.numpy.concatenate([values, idx.astype(jax.numpy.float32)], axis=-1)


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
