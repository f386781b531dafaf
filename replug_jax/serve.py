"""A scoring server: a local JAX LM behind the OpenAI completions contract, with correct echo log-probs.

    python -m replug_jax.serve --lm smollm2 --port 8000 [--host 127.0.0.1 --batch-size 8]
    # then, anywhere: rj.load_lm("http://HOST:8000/v1").score(contexts, continuations)

Endpoints (Starlette + uvicorn):
  POST /v1/completions  `prompt` a string, a list of strings, token ids or a list of token-id lists (a token
                        prompt is scored as given). With `echo` and `logprobs`, every prompt token comes back
                        with its text (`tokens`), its character offset (`text_offset`), log p(token | tokens
                        before it) (`token_logprobs`; null for the first token, which nothing precedes) and its
                        position's real top-`logprobs` tokens (`top_logprobs`: a second forward pass over the
                        prompt; `logprobs: 0` skips it). vLLM's `prompt_logprobs: k` form is answered too (the
                        token and the top k). The prompt is scored as given, with no start token added (as
                        OpenAI's servers do), unless the server was started with --add-start-token: then the
                        LM's document-start token conditions the first prompt token and is echoed as a
                        zero-width token with a null log-prob. `max_tokens` (default 16, at most 256) generates
                        greedily through a key/value cache, stopping at `stop` (a string or up to 4) or EOS:
                        `temperature` above 0 is refused (400) unless max_tokens is 0 (the prompt scored only).
                        A request whose client closes its connection is dropped before the model works on it.
                        A `model` other than the served one is refused with OpenAI's 404 `model_not_found`.
                        The prompts of concurrent requests are scored (through LocalLM) or decoded together,
                        up to --max-batch-rows prompts per call, waiting up to --batch-wait-ms for more.
                        A finished generation's key/value cache is kept (up to --prefix-cache-mb, least recently
                        used dropped first), and a later prompt beginning with the same 16 tokens or more starts
                        from it: only its own tokens are computed (server/prefix_cache.py).
  GET  /v1/models       the model id and `max_model_len`.
  POST /tokenize        vLLM's form: {"prompt": text} -> {"tokens": [...], "count": n, "max_model_len": L}.
  GET  /health          200 {"status": "ok", "prefix_cache": {rows, bytes, hits, reused_tokens, ...}}.

Limits: a body over 8 MiB gets 413 before it is read; more than 1,024 prompts or --max-prompt-tokens prompt
tokens in one request, a response over 32 MiB or a body nested too deeply for the JSON parser, 400; more than
--max-concurrent requests at once, 429 with Retry-After. Errors are OpenAI's JSON error bodies (404 for an
unknown path, e.g. /v1/chat/completions). With --api-key-env NAME, requests must carry `Authorization: Bearer
$NAME`; without a key the server answers loopback addresses only (a non-loopback --host is refused at start).
"""
from __future__ import annotations

import argparse
import os

from replug_jax.server.app import MAX_CONCURRENT, BackgroundServer, check_exposure, is_loopback, make_app
from replug_jax.server.completions import MAX_PROMPT_TOKENS
from replug_jax.server.engine import PREFIX_CACHE_BYTES

__all__ = ["BackgroundServer", "is_loopback", "make_app", "main"]


def port_in_use(host: str, port: int) -> str | None:
    """Why `host:port` cannot be listened on (the OS's words: "Address already in use"), or None where it can."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: a closed port's TIME_WAIT is free
        try:
            probe.bind((host, port))
        except OSError as e:
            return e.strerror or str(e)
    return None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m replug_jax.serve", description=__doc__.split("\n")[0])
    parser.add_argument("--lm", required=True, help="as rj.load_lm takes: packaged name, local dir, .gguf path, hub id")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--batch-size", type=int, default=8, help="LocalLM batch size (rounded up to the devices)")
    parser.add_argument("--max-batch-rows", type=int, default=32, help="prompts batched into one LocalLM call")
    parser.add_argument("--batch-wait-ms", type=float, default=10, help="how long a batch waits for more prompts")
    parser.add_argument("--max-length", type=int, default=0, help="0: the model's own window")
    parser.add_argument("--dtype", default="auto", help="compute and weight dtype (auto: bfloat16 on TPU/GPU, float32 on CPU)")
    parser.add_argument("--model-name", default=None, help="the id in /v1/models and responses (default: --lm)")
    parser.add_argument("--add-start-token", action="store_true",
                        help="condition every prompt on the LM's document-start token (as llama.cpp's BOS)")
    parser.add_argument("--start-token-on-text", action="store_true",
                        help="begin text prompts (not token-id prompts) with the start token, as vLLM does")
    parser.add_argument("--max-top-logprobs", type=int, default=20,
                        help="the largest 'logprobs' accepted (OpenAI's API: 5)")
    parser.add_argument("--max-prompt-tokens", type=int, default=MAX_PROMPT_TOKENS,
                        help="prompt tokens in one request, all its prompts together")
    parser.add_argument("--max-concurrent", type=int, default=MAX_CONCURRENT,
                        help="requests answered at once (more get 429)")
    parser.add_argument("--prefix-cache-mb", type=float, default=PREFIX_CACHE_BYTES / 2**20,
                        help="MiB of finished generations' key/value caches kept for prompts that begin as they did "
                             "(REPLUG's re-asked passes, a shared few-shot block); 0: none")
    parser.add_argument("--api-key-env", default=None, help="require 'Bearer $VAR' (the key is read from VAR)")
    args = parser.parse_args(argv)
    import uvicorn

    from replug_jax.loading import load_lm

    api_key = os.environ.get(args.api_key_env) if args.api_key_env else None
    if args.api_key_env and not api_key:
        parser.error(f"--api-key-env {args.api_key_env}: the variable is not set")
    try:
        check_exposure(args.host, api_key)
    except ValueError as e:
        parser.error(f"--{e}")
    if args.prefix_cache_mb < 0:
        parser.error(f"--prefix-cache-mb {args.prefix_cache_mb}: a size in MiB, 0 or more")
    taken = port_in_use(args.host, args.port)  # said before the model loads, and before "serving"
    if taken:
        parser.error(f"--port {args.port}: {args.host}:{args.port} cannot be served ({taken}): is another server "
                     "there? Choose another --port")
    lm = load_lm(args.lm, batch_size=args.batch_size, max_length=args.max_length or None, dtype=args.dtype)
    app = make_app(lm, model_name=args.model_name or args.lm, max_batch_rows=args.max_batch_rows,
                   batch_wait=args.batch_wait_ms / 1000, add_start_token=args.add_start_token, api_key=api_key,
                   max_top_logprobs=args.max_top_logprobs, start_token_on_text=args.start_token_on_text,
                   max_prompt_tokens=args.max_prompt_tokens, max_concurrent=args.max_concurrent,
                   prefix_cache_bytes=int(args.prefix_cache_mb * 2**20))
    print(f"serving {args.lm} at http://{args.host}:{args.port}/v1", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="info")


if __name__ == "__main__":
    main()
