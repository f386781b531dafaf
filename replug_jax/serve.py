"""A scoring server: a local JAX LM behind the OpenAI completions contract, with correct echo log-probs.

    python -m replug_jax.serve --lm smollm2 --port 8000 [--host 127.0.0.1 --batch-size 8]
    # then, anywhere: rj.load_lm("http://HOST:8000/v1").score(contexts, continuations)

Endpoints (Starlette + uvicorn):
  POST /v1/completions  `prompt` a string or a list of strings; with `echo` and `logprobs`, every prompt
                        token comes back with its text (`tokens`), its character offset (`text_offset`)
                        and log p(token | tokens before it) (`token_logprobs`; null for the first token,
                        which nothing precedes). `top_logprobs` is null for prompt tokens (only the
                        chosen tokens' log-probs are computed) and the real top-k for generated tokens.
                        vLLM's `prompt_logprobs: 0` form is answered too. The prompt is scored as given,
                        with no start token added (as OpenAI's servers do), unless the server was started
                        with --add-start-token: then the LM's document-start token conditions the first
                        prompt token and is echoed as a zero-width token with a null log-prob.
                        `max_tokens` (default 16, at most 16) generates greedily, whatever the temperature;
                        0 scores the prompt only. Prompts from all concurrent requests are batched together
                        through LocalLM (up to --max-batch-rows prompts per call, waiting
                        up to --batch-wait-ms for more).
  GET  /v1/models       the model id and `max_model_len`.
  POST /tokenize        vLLM's form: {"prompt": text} -> {"tokens": [...], "count": n, "max_model_len": L}.
  GET  /health          200 {"status": "ok"}.

With --api-key-env NAME, requests must carry `Authorization: Bearer $NAME`.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import functools
import os
import queue
import threading
import time
import uuid
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
            self._next = sharding.ShardedBatchFn(fn, lm.params, mesh.devices.size, mesh)
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="replug-scoring", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=30)

    def tokens(self, text: str) -> tuple[list[int], list[int], list[int]]:
        """(ids, start offsets, end offsets) of a prompt; token i spans text[starts[i]:ends[i]]."""
        ids, offsets = self.lm.tokenizer.encode_with_offsets(text)
        ends = list(np.maximum.accumulate([end for _, end in offsets])) if offsets else []
        ends = [int(e) for e in ends]
        if ends:
            ends[-1] = len(text)
        return list(ids), [0] + ends[:-1], ends

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


def _field(body: dict, name: str, kind, default, low=None, high=None):
    value = body.get(name, default)
    if value is None:
        return default
    if kind is bool and not isinstance(value, bool) or kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise RequestError(f"'{name}' must be {kind.__name__}")
    if kind is float and not isinstance(value, (int, float)):
        raise RequestError(f"'{name}' must be a number")
    if low is not None and not low <= value <= high:
        raise RequestError(f"'{name}' must be between {low} and {high}, got {value}")
    return value


async def _complete(engine: ScoringEngine, model_name: str, body: dict) -> dict:
    """The completions response for one request body."""
    prompt = body.get("prompt")
    prompts = [prompt] if isinstance(prompt, str) else prompt
    if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) for p in prompts):
        raise RequestError("'prompt' must be a string or a non-empty list of strings")
    if body.get("stream"):
        raise RequestError("streaming is not supported")
    if _field(body, "n", int, 1, 1, 1) != 1 or _field(body, "best_of", int, 1, 1, 1) != 1:
        raise RequestError("only n=1 is supported")
    max_tokens = _field(body, "max_tokens", int, 16, 0, MAX_NEW_TOKENS)
    logprobs = _field(body, "logprobs", int, None, 0, MAX_TOP_LOGPROBS)
    prompt_logprobs = _field(body, "prompt_logprobs", int, None, 0, MAX_TOP_LOGPROBS)
    echo = _field(body, "echo", bool, False)
    _field(body, "temperature", float, 1.0)
    tokenised = [engine.tokens(p) for p in prompts]
    for ids, _, _ in tokenised:
        engine.check_length(len(ids), max_tokens)
    wants_prompt_values = (echo and logprobs is not None) or prompt_logprobs is not None
    values = await asyncio.wrap_future(engine.score([ids for ids, _, _ in tokenised])) if wants_prompt_values else None
    choices, used = [], 0
    for i, (text, (ids, starts, ends)) in enumerate(zip(prompts, tokenised)):
        generated = await asyncio.wrap_future(engine.generate(ids, max_tokens, logprobs or 0)) if max_tokens else []
        gen_texts = [engine.lm.tokenizer.decode([t]) for t, _, _ in generated]
        choice: dict = {"index": i, "text": (text if echo else "") + "".join(gen_texts), "logprobs": None,
                        "finish_reason": "length" if len(generated) == max_tokens else "stop"}
        if logprobs is not None:
            tokens, offsets, lps, tops = [], [], [], []
            if echo:
                if engine.add_start_token:  # the start token: zero-width, nothing precedes it
                    tokens, offsets, lps, tops = [""], [0], [None], [None]
                tokens += [text[s:e] for s, e in zip(starts, ends)]
                offsets += starts
                lps += values[i]
                tops += [None] * len(ids)
            cursor = len(text) if echo else 0
            for t, (tid, lp, top) in zip(gen_texts, generated):
                tokens.append(t), offsets.append(cursor), lps.append(lp), tops.append(top)
                cursor += len(t)
            choice["logprobs"] = {"tokens": tokens, "text_offset": offsets, "token_logprobs": lps,
                                  "top_logprobs": tops}
        if prompt_logprobs is not None:  # vLLM's form; null where nothing precedes the token
            choice["prompt_logprobs"] = [None if v is None else {str(t): {"logprob": v, "rank": None,
                                                                          "decoded_token": text[s:e]}}
                                         for t, s, e, v in zip(ids, starts, ends, values[i])]
        used += len(generated)
        choices.append(choice)
    prompt_tokens = sum(len(ids) for ids, _, _ in tokenised)
    return {"id": f"cmpl-{uuid.uuid4().hex[:24]}", "object": "text_completion", "created": int(time.time()),
            "model": model_name, "choices": choices,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": used, "total_tokens": prompt_tokens + used}}


def make_app(lm, *, model_name: str | None = None, max_batch_rows: int = 32, batch_wait: float = 0.01,
             add_start_token: bool = False, api_key: str | None = None):
    """The Starlette application serving `lm` (a LocalLM); `app.state.engine` owns the model thread."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    engine = ScoringEngine(lm, max_batch_rows=max_batch_rows, batch_wait=batch_wait, add_start_token=add_start_token)
    model_name = model_name or lm.name

    def error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
        return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": None}}, status)

    def authorised(request: Request) -> bool:
        return api_key is None or request.headers.get("authorization") == f"Bearer {api_key}"

    async def json_body(request: Request) -> dict:
        try:
            body = await request.json()
        except ValueError:
            raise RequestError("the body is not JSON") from None
        if not isinstance(body, dict):
            raise RequestError("the body must be a JSON object")
        return body

    async def completions(request: Request):
        if not authorised(request):
            return error(401, "missing or wrong API key", "authentication_error")
        try:
            return JSONResponse(await _complete(engine, model_name, await json_body(request)))
        except RequestError as e:
            return error(400, str(e))

    async def tokenize(request: Request):
        if not authorised(request):
            return error(401, "missing or wrong API key", "authentication_error")
        try:
            body = await json_body(request)
            if not isinstance(body.get("prompt"), str):
                raise RequestError("'prompt' must be a string")
        except RequestError as e:
            return error(400, str(e))
        ids = lm.tokenizer.encode(body["prompt"])
        return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": lm.max_length})

    async def models(request: Request):
        if not authorised(request):
            return error(401, "missing or wrong API key", "authentication_error")
        return JSONResponse({"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "replug_jax",
                                                         "max_model_len": lm.max_length}]})

    async def health(request: Request):
        return JSONResponse({"status": "ok"})

    routes = [Route("/v1/completions", completions, methods=["POST"]), Route("/tokenize", tokenize, methods=["POST"]),
              Route("/v1/tokenize", tokenize, methods=["POST"]), Route("/v1/models", models, methods=["GET"]),
              Route("/health", health, methods=["GET"])]
    app = Starlette(routes=routes)
    app.state.engine = engine
    return app


class BackgroundServer:
    """`make_app(lm)` under uvicorn in a thread (tests, notebooks): `.url` is the /v1 base; `.stop()` ends it."""

    def __init__(self, lm, host: str = "127.0.0.1", port: int = 0, **app_kwargs):
        import uvicorn

        self.app = make_app(lm, **app_kwargs)
        self._server = uvicorn.Server(uvicorn.Config(self.app, host=host, port=port, log_level="warning", lifespan="off"))
        self._thread = threading.Thread(target=self._server.run, name="replug-serve", daemon=True)
        self._thread.start()
        deadline = time.time() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.time() > deadline:
                raise RuntimeError(f"the server did not start on {host}:{port}")
            time.sleep(0.02)
        bound = self._server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://{host}:{bound}/v1"

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)
        self.app.state.engine.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m replug_jax.serve", description=__doc__.split("\n")[0])
    parser.add_argument("--lm", required=True, help="as rj.load_lm takes: packaged name, local dir, .gguf path, hub id")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--batch-size", type=int, default=8, help="LocalLM batch size (rounded up to the devices)")
    parser.add_argument("--max-batch-rows", type=int, default=32, help="prompts batched into one LocalLM call")
    parser.add_argument("--batch-wait-ms", type=float, default=10, help="how long a batch waits for more prompts")
    parser.add_argument("--max-length", type=int, default=0, help="0: the model's own window")
    parser.add_argument("--dtype", default="float32", help="bfloat16 on TPU/GPU")
    parser.add_argument("--model-name", default=None, help="the id in /v1/models and responses (default: --lm)")
    parser.add_argument("--add-start-token", action="store_true",
                        help="condition every prompt on the LM's document-start token (as llama.cpp's BOS)")
    parser.add_argument("--api-key-env", default=None, help="require 'Bearer $VAR' (the key is read from VAR)")
    args = parser.parse_args(argv)
    import jax.numpy as jnp
    import uvicorn

    import replug_jax as rj

    api_key = os.environ.get(args.api_key_env) if args.api_key_env else None
    if args.api_key_env and not api_key:
        parser.error(f"--api-key-env {args.api_key_env}: the variable is not set")
    lm = rj.load_lm(args.lm, batch_size=args.batch_size, max_length=args.max_length or None, dtype=jnp.dtype(args.dtype))
    app = make_app(lm, model_name=args.model_name or args.lm, max_batch_rows=args.max_batch_rows,
                   batch_wait=args.batch_wait_ms / 1000, add_start_token=args.add_start_token, api_key=api_key)
    print(f"serving {args.lm} at http://{args.host}:{args.port}/v1", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="info")


if __name__ == "__main__":
    main()
