"""The scoring server's HTTP side: the OpenAI completions contract over a `ScoringEngine` (see replug_jax.serve)."""
from __future__ import annotations

import asyncio
import hmac
import json
import threading
import time
import uuid

from replug_jax.server.engine import MAX_NEW_TOKENS, MAX_TOP_LOGPROBS, RequestError, ScoringEngine

MAX_BODY_BYTES = 8 << 20  # a request body larger than this gets 413 before it is read
MAX_PROMPTS = 1024  # prompts in one completions request


class BodyTooLarge(RequestError):
    """A body over the limit (HTTP 413)."""


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


def _prompts(prompt, vocab_size: int, max_prompts: int = MAX_PROMPTS) -> list:
    """The request's prompts: texts, or token-id lists (OpenAI's `prompt` as [int] or [[int]])."""
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        prompt = [prompt]
    if isinstance(prompt, list) and len(prompt) > max_prompts:
        raise RequestError(f"{len(prompt)} prompts in one request: at most {max_prompts}")
    ok = isinstance(prompt, list) and prompt and all(
        isinstance(p, str) or (isinstance(p, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in p))
        for p in prompt)
    if not ok:
        raise RequestError("'prompt' must be a string, a list of strings, a list of token ids or a list of such lists")
    for p in prompt:
        if isinstance(p, list) and any(not 0 <= t < vocab_size for t in p):
            raise RequestError(f"token ids must be in [0, {vocab_size})")
    return prompt


def _tokenise(engine: ScoringEngine, prompt, text_start: bool):
    """(ids, starts, ends, text) of a prompt; `text_start`: a text prompt begins with the start token (zero-width),
    as vLLM's tokenizer adds it to text prompts while token-id prompts are taken as they are."""
    if not isinstance(prompt, str):
        return engine.pieces(prompt)
    ids, starts, ends, text = engine.tokens(prompt)
    return ([engine.lm.start_id] + ids, [0] + starts, [0] + ends, text) if text_start else (ids, starts, ends, text)


async def _complete(engine: ScoringEngine, model_name: str, body: dict, max_top: int = MAX_TOP_LOGPROBS,
                    text_start: bool = False, max_prompts: int = MAX_PROMPTS) -> dict:
    """The completions response for one request body; `max_top` caps `logprobs` (OpenAI's API allows 5)."""
    prompts = _prompts(body.get("prompt"), engine.lm.tokenizer.vocab_size, max_prompts)
    if body.get("stream"):
        raise RequestError("streaming is not supported")
    if _field(body, "n", int, 1, 1, 1) != 1 or _field(body, "best_of", int, 1, 1, 1) != 1:
        raise RequestError("only n=1 is supported")
    max_tokens = _field(body, "max_tokens", int, 16, 0, MAX_NEW_TOKENS)
    logprobs = _field(body, "logprobs", int, None, 0, max_top)
    prompt_logprobs = _field(body, "prompt_logprobs", int, None, 0, max_top)
    echo = _field(body, "echo", bool, False)
    _field(body, "temperature", float, 1.0)
    # tokenised on a worker thread: a large prompt never stalls the event loop (other clients, /health)
    tokenised = await asyncio.to_thread(lambda: [_tokenise(engine, p, text_start) for p in prompts])
    for ids, *_ in tokenised:
        engine.check_length(len(ids), max_tokens)
    wants_prompt_values = (echo and logprobs is not None) or prompt_logprobs is not None
    values = await asyncio.wrap_future(engine.score([ids for ids, *_ in tokenised])) if wants_prompt_values else None
    choices, used = [], 0
    for i, (ids, starts, ends, text) in enumerate(tokenised):
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
    prompt_tokens = sum(len(ids) for ids, *_ in tokenised)
    return {"id": f"cmpl-{uuid.uuid4().hex[:24]}", "object": "text_completion", "created": int(time.time()),
            "model": model_name, "choices": choices,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": used, "total_tokens": prompt_tokens + used}}


def make_app(lm, *, model_name: str | None = None, max_batch_rows: int = 32, batch_wait: float = 0.01,
             add_start_token: bool = False, api_key: str | None = None, max_top_logprobs: int = MAX_TOP_LOGPROBS,
             start_token_on_text: bool = False, max_body_bytes: int = MAX_BODY_BYTES, max_prompts: int = MAX_PROMPTS):
    """The Starlette application serving `lm` (a LocalLM); `app.state.engine` owns the model thread.
    add_start_token: every prompt is conditioned on the start token (llama.cpp); start_token_on_text: text prompts
    only begin with it, token-id prompts are taken as they are (vLLM).
    max_top_logprobs: the largest `logprobs` accepted (a 400 above it, as OpenAI's API does above 5).
    max_body_bytes / max_prompts: larger bodies get 413 before they are read, more prompts 400. The API key is
    compared in constant time."""
    if not 1 <= max_top_logprobs <= MAX_TOP_LOGPROBS:
        raise ValueError(f"max_top_logprobs must be in [1, {MAX_TOP_LOGPROBS}], got {max_top_logprobs}")
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    if add_start_token and start_token_on_text:
        raise ValueError("add_start_token (every prompt) and start_token_on_text (text prompts only) exclude each other")
    if start_token_on_text and lm.start_id is None:
        raise ValueError("start_token_on_text: the tokenizer has no document-start token")
    engine = ScoringEngine(lm, max_batch_rows=max_batch_rows, batch_wait=batch_wait, add_start_token=add_start_token)
    model_name = model_name or lm.name

    def error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
        return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": None}}, status)

    def authorised(request: Request) -> bool:
        given = request.headers.get("authorization", "").encode()
        return api_key is None or hmac.compare_digest(given, f"Bearer {api_key}".encode())

    too_large = f"the request body is larger than {max_body_bytes} bytes"

    async def json_body(request: Request) -> dict:
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max_body_bytes:
            raise BodyTooLarge(too_large)  # refused before a byte of the body is read
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_body_bytes:
                raise BodyTooLarge(too_large)
            chunks.append(chunk)
        try:
            body = json.loads(b"".join(chunks))
        except ValueError:
            raise RequestError("the body is not JSON") from None
        if not isinstance(body, dict):
            raise RequestError("the body must be a JSON object")
        return body

    async def completions(request: Request):
        if not authorised(request):
            return error(401, "missing or wrong API key", "authentication_error")
        try:
            return JSONResponse(await _complete(engine, model_name, await json_body(request), max_top_logprobs,
                                                  start_token_on_text, max_prompts))
        except RequestError as e:
            return error(413 if isinstance(e, BodyTooLarge) else 400, str(e))

    async def tokenize(request: Request):
        if not authorised(request):
            return error(401, "missing or wrong API key", "authentication_error")
        try:
            body = await json_body(request)
            if not isinstance(body.get("prompt"), str):
                raise RequestError("'prompt' must be a string")
        except RequestError as e:
            return error(413 if isinstance(e, BodyTooLarge) else 400, str(e))
        ids = await asyncio.to_thread(lm.tokenizer.encode, body["prompt"])
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
