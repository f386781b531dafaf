"""The scoring server's HTTP side: the OpenAI completions contract over a `ScoringEngine` (see replug_jax.serve)."""
from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import threading
import time

from replug_jax.models.tokenizer import token_pieces
from replug_jax.server.completions import (
    MAX_PROMPT_TOKENS,
    MAX_PROMPTS,
    MAX_RESPONSE_BYTES,
    Limits,
    check_model_name,
    complete,
    too_large,
)
from replug_jax.server.engine import MAX_TOP_LOGPROBS, PREFIX_CACHE_BYTES, CompletionRequestError, ScoringEngine

MAX_BODY_BYTES = 8 << 20  # a request body larger than this gets 413 before it is read
MAX_CONCURRENT = 64  # requests in flight at once; more get 429 (with Retry-After)
DISCONNECT_POLL = 0.25  # seconds between checks that a waiting request's client is still connected
ROUTES = ("POST /v1/completions, GET /v1/models, POST /tokenize (/v1/tokenize), POST /detokenize (/v1/detokenize) "
          "and GET /health")


class BodyTooLarge(CompletionRequestError):
    """A body over the limit (HTTP 413)."""

    def __init__(self, message: str):
        super().__init__(message, status=413)


def is_loopback(host: str) -> bool:
    """Whether `host` (a name or an address) only serves this machine."""
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return (getattr(address, "ipv4_mapped", None) or address).is_loopback


def check_exposure(host: str, api_key: str | None) -> None:
    """ValueError for a server on a non-loopback `host` without an API key."""
    if not api_key and not is_loopback(host):
        raise ValueError(f"host {host} serves beyond this machine: require a key with --api-key-env VAR (api_key= "
                         "in Python; clients send 'Authorization: Bearer KEY'), or serve on 127.0.0.1")


def make_app(lm, *, model_name: str | None = None, max_batch_rows: int = 32, batch_wait: float = 0.01,
             add_start_token: bool = False, api_key: str | None = None, max_top_logprobs: int = MAX_TOP_LOGPROBS,
             start_token_on_text: bool = False, max_body_bytes: int = MAX_BODY_BYTES, max_prompts: int = MAX_PROMPTS,
             max_prompt_tokens: int = MAX_PROMPT_TOKENS, max_response_bytes: int = MAX_RESPONSE_BYTES,
             max_concurrent: int = MAX_CONCURRENT, with_pieces: bool = True, announce_end_tokens: bool = True,
             prefix_cache_bytes: int = PREFIX_CACHE_BYTES):
    """The Starlette application serving `lm` (a LocalLM); `app.state.engine` owns the model thread.
    with_pieces: /tokenize answers "with_pieces" (llama.cpp's form; False: ids only, as vLLM's).
    announce_end_tokens: /v1/models names the model's end-of-sequence token ids (`eos_token_id`, a list, as a Hugging
    Face generation config may give several), so that a client tokenizing through /tokenize stops where the model
    does (False: as vLLM, whose card names none; the client then learns them from the completions it gets).
    add_start_token: every prompt is conditioned on the start token (llama.cpp); start_token_on_text: text prompts
    only begin with it, token-id prompts are taken as they are (vLLM).
    prefix_cache_bytes: the key/value rows of finished generations kept for prompts that begin as they did
    (server/prefix_cache.py; 0: none kept); GET /health says what it holds and did.
    max_top_logprobs: the largest `logprobs` accepted (a 400 above it, as OpenAI's API does above 5).
    Limits: larger bodies get 413 before they are read; more prompts or prompt tokens, a larger response (refused
    before the model runs where its log-probs alone pass the cap), 400;
    more than `max_concurrent` requests at once, 429. Without `api_key` only loopback addresses are answered
    (403 elsewhere); the key is compared in constant time. Errors are OpenAI's JSON error bodies."""
    if not 1 <= max_top_logprobs <= MAX_TOP_LOGPROBS:
        raise ValueError(f"max_top_logprobs must be in [1, {MAX_TOP_LOGPROBS}], got {max_top_logprobs}")
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    if add_start_token and start_token_on_text:
        raise ValueError("add_start_token (every prompt) and start_token_on_text (text prompts only) exclude each other")
    if start_token_on_text and lm.start_id is None:
        raise ValueError("start_token_on_text: the tokenizer has no document-start token")
    engine = ScoringEngine(lm, max_batch_rows=max_batch_rows, batch_wait=batch_wait, add_start_token=add_start_token,
                           prefix_cache_bytes=prefix_cache_bytes)
    limits = Limits(model_name or lm.name, max_top_logprobs, max_prompts, max_prompt_tokens, start_token_on_text,
                    max_response_bytes)
    in_flight = [0]  # requests being answered (changed on the event loop only)

    def error(status: int, message: str, kind: str = "invalid_request_error", code=None, param=None, headers=None):
        return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}}, status,
                            headers=headers)

    def refused(request: Request):
        """The answer to a request refused before its body is read, or None."""
        server = request.scope.get("server") or ("", None)
        if api_key is None and _is_ip(server[0]) and not is_loopback(server[0]):
            return error(403, f"this server has no API key: it answers on loopback addresses only, not {server[0]}",
                         "permission_error")
        given = request.headers.get("authorization", "").encode()
        if api_key is not None and not hmac.compare_digest(given, f"Bearer {api_key}".encode()):
            return error(401, "missing or wrong API key", "authentication_error")
        if in_flight[0] >= max_concurrent:
            return error(429, f"more than {max_concurrent} requests at once: retry later", "rate_limit_error",
                         "rate_limit_exceeded", headers={"Retry-After": "1"})
        return None

    body_too_large = f"the request body is larger than {max_body_bytes} bytes"

    async def json_body(request: Request) -> dict:
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max_body_bytes:
            raise BodyTooLarge(body_too_large)  # refused before a byte of the body is read
        chunks, size = [], 0
        async for chunk in request.stream():  # a body growing past the limit (chunked) is read on and dropped, up to
            size += len(chunk)  # 4x the limit, so that the client gets the 413 rather than a reset connection
            if size > 4 * max_body_bytes:
                break
            if size <= max_body_bytes:
                chunks.append(chunk)
        if size > max_body_bytes:
            raise BodyTooLarge(body_too_large)
        try:
            body = json.loads(b"".join(chunks))
        except RecursionError:
            raise CompletionRequestError("the body is nested too deeply") from None
        except ValueError:
            raise CompletionRequestError("the body is not JSON") from None
        if not isinstance(body, dict):
            raise CompletionRequestError("the body must be a JSON object")
        return body

    def endpoint(answer):
        """`answer(body) -> dict` as a POST endpoint: refusals, the body's limits, CompletionRequestError -> its status."""
        async def handle(request: Request):
            early = refused(request)
            if early is not None:
                return early
            in_flight[0] += 1
            try:
                reply = await until_disconnected(request, answer(await json_body(request)))
                if reply is None:  # the client has gone: its work was dropped, and nobody reads this
                    return Response(status_code=499)
                response = JSONResponse(reply)
            except CompletionRequestError as e:
                return error(e.status, str(e), code=e.code, param=e.param)
            finally:
                in_flight[0] -= 1
            if len(response.body) > max_response_bytes:  # past the estimate `complete` refuses from before the work
                return error(400, str(too_large(len(response.body), max_response_bytes)))
            return response
        return handle

    async def tokenize(body: dict) -> dict:
        check_model_name(body, limits.model_name)
        if not isinstance(body.get("prompt"), str):
            raise CompletionRequestError("'prompt' must be a string", param="prompt")
        if body.get("with_pieces") and with_pieces:  # llama.cpp's form: each token and its text
            ids, pieces = await asyncio.to_thread(token_pieces, lm.tokenizer, body["prompt"])
            return {"tokens": [{"id": i, "piece": p} for i, p in zip(ids, pieces)], "count": len(ids),
                    "max_model_len": lm.max_length}
        ids = await asyncio.to_thread(lm.tokenizer.encode, body["prompt"])
        return {"tokens": ids, "count": len(ids), "max_model_len": lm.max_length}

    async def detokenize(body: dict) -> dict:
        """ids -> text (vLLM's form): a client that asks for generated tokens by id decodes them here."""
        check_model_name(body, limits.model_name)
        ids = body.get("tokens")
        if not (isinstance(ids, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in ids)):
            raise CompletionRequestError("'tokens' must be a list of token ids", param="tokens")
        if any(not 0 <= t < lm.tokenizer.vocab_size for t in ids):
            raise CompletionRequestError(f"token ids must be in [0, {lm.tokenizer.vocab_size})", param="tokens")
        return {"prompt": await asyncio.to_thread(lm.tokenizer.decode, ids)}

    end_tokens = [lm.tokenizer.eos_id] if announce_end_tokens and lm.tokenizer.eos_id is not None else []
    card = {"id": limits.model_name, "object": "model", "owned_by": "replug_jax", "max_model_len": lm.max_length,
            **({"eos_token_id": end_tokens} if end_tokens else {})}

    async def models(request: Request):
        early = refused(request)
        return early or JSONResponse({"object": "list", "data": [card]})

    async def health(request: Request):
        return JSONResponse({"status": "ok", "prefix_cache": engine.prefix_cache})

    async def not_found(request: Request, exc):
        status = getattr(exc, "status_code", 404)
        what = "is not served" if status == 404 else "does not take this method"
        return error(status, f"Invalid URL ({request.method} {request.url.path}): it {what}; this server answers "
                     f"{ROUTES} (no chat endpoint: send a prompt to /v1/completions)", code="unknown_url")

    async def internal(request: Request, exc):
        return error(500, f"internal server error ({type(exc).__name__})", "server_error")

    completions = endpoint(lambda body: complete(engine, body, limits))
    routes = [Route("/v1/completions", completions, methods=["POST"]),
              Route("/tokenize", endpoint(tokenize), methods=["POST"]),
              Route("/v1/tokenize", endpoint(tokenize), methods=["POST"]),
              Route("/detokenize", endpoint(detokenize), methods=["POST"]),
              Route("/v1/detokenize", endpoint(detokenize), methods=["POST"]), Route("/v1/models", models, methods=["GET"]),
              Route("/health", health, methods=["GET"])]
    app = Starlette(routes=routes, exception_handlers={404: not_found, 405: not_found, Exception: internal})
    app.state.engine = engine
    return app


async def until_disconnected(request, work, poll: float = DISCONNECT_POLL):
    """The result of the coroutine `work`, or None (the work cancelled: its queued model calls are dropped) once the
    client has closed its connection, e.g. after its own timeout."""
    task = asyncio.ensure_future(work)
    while not task.done():
        await asyncio.wait({task}, timeout=poll)
        if not task.done() and await request.is_disconnected():
            task.cancel()
            return None
    return task.result()


def _is_ip(host) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


class BackgroundServer:
    """`make_app(lm)` under uvicorn in a thread (tests, notebooks): `.url` is the /v1 base; `.stop()` ends it.
    A non-loopback `host` needs `api_key=` (ValueError otherwise)."""

    def __init__(self, lm, host: str = "127.0.0.1", port: int = 0, **app_kwargs):
        import uvicorn

        check_exposure(host, app_kwargs.get("api_key"))
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
