"""One completions request -> its response (the OpenAI contract) over a `ScoringEngine`; app.py serves it."""
from __future__ import annotations

import asyncio
import dataclasses
import math
import time
import uuid

from replug_jax.models.detokenize import IncrementalText
from replug_jax.models.stop_strings import cut_at_stop
from replug_jax.server.engine import MAX_NEW_TOKENS, MAX_TOP_LOGPROBS, CompletionRequestError, ScoringEngine

MAX_PROMPTS = 1024  # prompts in one completions request
MAX_STOPS = 4  # stop strings in one request (OpenAI's limit)
MAX_PROMPT_TOKENS = 1 << 18  # prompt tokens in one request, all its prompts together (16 prompts of 16k tokens)
MAX_RESPONSE_BYTES = 32 << 20  # a response larger than this is refused (400): ask for fewer prompts or log-probs
# about the fewest bytes a log-prob takes in a response (measured on a byte-level vocabulary): a legacy entry (a
# token's text and a float), a vLLM `prompt_logprobs` entry ({"logprob", "rank", "decoded_token"})
ENTRY_BYTES, VLLM_ENTRY_BYTES = 12, 48


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one request may ask: `max_top` caps `logprobs` (OpenAI's API allows 5); `text_start`: a text prompt
    begins with the start token (zero-width), as vLLM's tokenizer adds it to text prompts."""

    model_name: str
    max_top: int = MAX_TOP_LOGPROBS
    max_prompts: int = MAX_PROMPTS
    max_prompt_tokens: int = MAX_PROMPT_TOKENS
    text_start: bool = False
    max_response_bytes: int = MAX_RESPONSE_BYTES


def _field(body: dict, name: str, kind, default, low=None, high=None):
    value = body.get(name, default)
    if value is None:
        return default
    if kind is bool and not isinstance(value, bool) or kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise CompletionRequestError(f"'{name}' must be {kind.__name__}", param=name)
    if kind is float and (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)):
        raise CompletionRequestError(f"'{name}' must be a number", param=name)
    if low is not None and not low <= value <= high:
        raise CompletionRequestError(f"'{name}' must be between {low} and {high}, got {value}", param=name)
    return value


def _stops(body: dict) -> tuple[str, ...]:
    """The request's `stop`: a string or a list of up to MAX_STOPS strings (OpenAI's contract); () when absent."""
    stop = body.get("stop")
    if stop is None:
        return ()
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > MAX_STOPS:
        raise CompletionRequestError(f"'stop' must be a non-empty string or a list of at most {MAX_STOPS} of them", param="stop")
    return tuple(stop)


def _echo_from(body: dict, count: int) -> list[int]:
    """The request's `echo_from` (this server's extension, docs/http.md): per prompt, the first prompt token whose
    log-prob is computed (earlier ones are echoed with null log-probs); a whole number for every prompt or a list of
    one per prompt; 0 when absent."""
    value = body.get("echo_from")
    if value is None:
        return [0] * count
    values = [value] * count if not isinstance(value, list) else value
    if len(values) != count or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise CompletionRequestError("'echo_from' must be a whole number >= 0 or a list of one per prompt", param="echo_from")
    return values


def _is_ids(p) -> bool:
    return isinstance(p, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in p)


def _prompts(prompt, vocab_size: int, limits: Limits) -> list:
    """The request's prompts: texts, or token-id lists (OpenAI's `prompt` as [int] or [[int]])."""
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt and _is_ids(prompt):
        prompt = [prompt]
    if isinstance(prompt, list) and len(prompt) > limits.max_prompts:
        raise CompletionRequestError(f"{len(prompt)} prompts in one request: at most {limits.max_prompts}", param="prompt")
    if not (isinstance(prompt, list) and prompt and all(isinstance(p, str) or _is_ids(p) for p in prompt)):
        raise CompletionRequestError("'prompt' must be a string, a list of strings, a list of token ids or a list of such lists",
                           param="prompt")
    _check_tokens(sum(len(p) for p in prompt if isinstance(p, list)), limits)  # before any work on the texts
    for p in prompt:
        if isinstance(p, list) and any(not 0 <= t < vocab_size for t in p):
            raise CompletionRequestError(f"token ids must be in [0, {vocab_size})", param="prompt")
    return prompt


def _check_tokens(count: int, limits: Limits) -> None:
    if count > limits.max_prompt_tokens:
        raise CompletionRequestError(f"{count} prompt tokens in one request: at most {limits.max_prompt_tokens} (send fewer "
                           "or shorter prompts a request)", param="prompt")


def too_large(size: int, limit: int, at_least: str = "") -> CompletionRequestError:
    """The refusal of a response of `size` bytes over `limit` (`at_least`: "at least ", for an estimate)."""
    return CompletionRequestError(f"the response would be {at_least}{size} bytes, over this server's limit of {limit}: send "
                        "fewer prompts a request or ask for fewer log-probs")


def _check_response(prompt_tokens: int, prompts: int, max_tokens: int, logprobs, prompt_logprobs, echo: bool,
                    limits: Limits) -> None:
    """Refuse, before any work, a request whose log-probs alone (tokens × entries asked) pass the response cap."""
    legacy = 0 if logprobs is None else (prompt_tokens * echo + prompts * max_tokens) * (1 + logprobs)
    # vLLM's form: no entry for each prompt's first token, and N (not N + 1) where the prompt token is among the top N
    vllm = 0 if prompt_logprobs is None else (prompt_tokens - prompts) * max(prompt_logprobs, 1)
    size = ENTRY_BYTES * legacy + VLLM_ENTRY_BYTES * vllm
    if size > limits.max_response_bytes:
        raise too_large(size, limits.max_response_bytes, "at least ")


def _tokenise(engine: ScoringEngine, prompt, text_start: bool):
    """(ids, starts, ends, text) of a prompt; `text_start`: a text prompt begins with the start token (zero-width),
    as vLLM's tokenizer adds it to text prompts while token-id prompts are taken as they are."""
    if not isinstance(prompt, str):
        return engine.pieces(prompt)
    ids, starts, ends, text = engine.tokens(prompt)
    return ([engine.lm.start_id] + ids, [0] + starts, [0] + ends, text) if text_start else (ids, starts, ends, text)


def check_model_name(body: dict, model_name: str) -> None:
    """`model`, where given, must be the served one: 404 `model_not_found` otherwise, as OpenAI answers."""
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise CompletionRequestError("'model' must be a string", param="model")
    if model is not None and model != model_name:
        raise CompletionRequestError(f"The model `{model}` does not exist: this server serves `{model_name}`", status=404,
                           code="model_not_found", param="model")


async def complete(engine: ScoringEngine, body: dict, limits: Limits) -> dict:
    """The completions response for one request body (refusals: CompletionRequestError)."""
    check_model_name(body, limits.model_name)
    prompts = _prompts(body.get("prompt"), engine.lm.tokenizer.vocab_size, limits)
    if body.get("stream"):
        raise CompletionRequestError("streaming is not supported", param="stream")
    if _field(body, "n", int, 1, 1, 1) != 1 or _field(body, "best_of", int, 1, 1, 1) != 1:
        raise CompletionRequestError("only n=1 is supported", param="n")
    max_tokens = _field(body, "max_tokens", int, 16, 0, MAX_NEW_TOKENS)
    logprobs = _field(body, "logprobs", int, None, 0, limits.max_top)
    prompt_logprobs = _field(body, "prompt_logprobs", int, None, 0, limits.max_top)
    echo = _field(body, "echo", bool, False)
    stop = _stops(body)
    if _field(body, "temperature", float, 0.0, 0.0, 2.0) > 0 and max_tokens:
        raise CompletionRequestError("this server decodes greedily: set 'temperature' to 0 (or max_tokens to 0 to score the "
                           "prompt only)", param="temperature")
    # tokenised on a worker thread: a large prompt never stalls the event loop (other clients, /health)
    tokenised = await asyncio.to_thread(lambda: [_tokenise(engine, p, limits.text_start) for p in prompts])
    _check_tokens(sum(len(ids) for ids, *_ in tokenised), limits)
    _check_response(sum(len(ids) for ids, *_ in tokenised), len(prompts), max_tokens, logprobs, prompt_logprobs, echo,
                    limits)
    for ids, *_ in tokenised:
        engine.check_length(len(ids), max_tokens)
    all_ids = [ids for ids, *_ in tokenised]
    wants_prompt_values = (echo and logprobs is not None) or prompt_logprobs is not None
    starts = _echo_from(body, len(all_ids))
    top = max(logprobs if echo and logprobs else 0, prompt_logprobs or 0)
    tops = [[None] * len(i) for i in all_ids]
    if top and wants_prompt_values and all(0 < s < len(i) for i, s in zip(all_ids, starts)):
        # the echoed tokens' top entries from the scoring pass itself (only from `echo_from` on: null before)
        values, tops = map(list, zip(*await asyncio.wrap_future(engine.score(all_ids, starts, top))))
    else:
        values = await asyncio.wrap_future(engine.score(all_ids, starts)) if wants_prompt_values else None
        if top:  # every position's: a second forward pass over each prompt
            tops = await asyncio.wrap_future(engine.prompt_tops(all_ids, top))
    as_ids = _field(body, "return_tokens_as_token_ids", bool, False)
    decode = _Decoder(engine.lm.tokenizer, as_ids)
    # every prompt's generation submitted at once: the engine decodes them together
    pending = [engine.generate(ids, max_tokens, logprobs or 0, stop) for ids in all_ids] if max_tokens else []
    try:
        generations = [await asyncio.wrap_future(f) for f in pending] if max_tokens else [[] for _ in all_ids]
    except asyncio.CancelledError:  # the client has gone: none of its prompts is worth decoding (those the engine
        for future in pending:  # has not taken yet are dropped; its rows already decoding leave at the next chunk)
            future.cancel()
        raise
    choices, used = [], 0
    for i, (ids, starts, ends, text) in enumerate(tokenised):
        gen = generated_text(engine.lm.tokenizer, generations[i], stop, max_tokens, top=logprobs or 0)
        choice: dict = {"index": i, "text": (text if echo else "") + gen.text, "logprobs": None,
                        "finish_reason": gen.finish}
        if logprobs is not None:
            tokens, offsets, lps, top_lps = [], [], [], []
            if echo:
                if engine.add_start_token:  # the start token: zero-width, nothing precedes it
                    tokens, offsets, lps, top_lps = [""], [0], [None], [None]
                tokens += [decode.label(t, text[s:e]) for t, s, e in zip(ids, starts, ends)]
                offsets += starts
                lps += values[i]
                top_lps += [None if t is None or not logprobs else _keyed((decode(j), v) for j, v in t[:logprobs])
                            for t in tops[i]]
            cursor = len(text) if echo else 0
            for share, (tid, lp, _), alternatives in zip(gen.shares, gen.tokens, gen.alternatives):
                tokens.append(decode.label(tid, share)), offsets.append(cursor), lps.append(lp)
                top_lps.append(_keyed((decode.label(j, t), v) for j, t, v in alternatives))
                cursor += len(share)
            choice["logprobs"] = {"tokens": tokens, "text_offset": offsets, "token_logprobs": lps,
                                  "top_logprobs": top_lps}
        if prompt_logprobs is not None:  # vLLM's form: the token and the top `prompt_logprobs`; null where
            choice["prompt_logprobs"] = [  # nothing precedes the token
                None if v is None else _vllm_entry(t, text[s:e], v, (best or [])[:prompt_logprobs], decode)
                for t, s, e, v, best in zip(ids, starts, ends, values[i], tops[i])]
        used += len(gen.tokens)
        choices.append(choice)
    prompt_tokens = sum(len(ids) for ids in all_ids)
    return {"id": f"cmpl-{uuid.uuid4().hex[:24]}", "object": "text_completion", "created": int(time.time()),
            "model": limits.model_name, "choices": choices,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": used, "total_tokens": prompt_tokens + used}}


def _vllm_entry(token: int, text: str, value: float, best: list, decode) -> dict:
    """{token id: {"logprob", "rank", "decoded_token"}} for the prompt token and its position's best tokens."""
    ranks = {j: r + 1 for r, (j, _) in enumerate(best)}
    entry = {str(token): {"logprob": value, "rank": ranks.get(token), "decoded_token": text}}
    for j, v in best:
        entry.setdefault(str(j), {"logprob": v, "rank": ranks[j], "decoded_token": decode(j)})
    return entry


@dataclasses.dataclass
class GeneratedText:
    """A generation as a response gives it: `text` (whole characters, cut before the first stop string, without
    EOS's text), the tokens kept (through the one that completes a stop string), each token's share of the text
    (models/detokenize.py), each step's alternatives [(id, share, log p)] best first, and the finish reason."""

    text: str
    tokens: list
    shares: list[str]
    alternatives: list[list[tuple[int, str, float]]]
    finish: str


def generated_text(tokenizer, generated: list, stop: tuple[str, ...], max_tokens: int, top: int = 0) -> GeneratedText:
    """The engine's [(id, log p, [(id, log p)] best)] generation -> GeneratedText, detokenized as it grows: a
    character split over tokens comes out whole, and a stop string is matched on the text, a stop of one
    multi-byte character too. Each alternative's share is the text it would have added at its step."""
    stream = IncrementalText(tokenizer)
    shares, alternatives, stopped = [], [], False
    for tid, _, best in generated:
        alternatives.append([(j, stream.share(j), v) for j, v in best[:top]])
        shares.append(stream.push(tid))
        if stop and cut_at_stop(stream.text, stop)[1]:
            stopped = True
            break
    kept = generated[: len(shares)]
    if shares and not stopped:
        shares[-1] += stream.finish()
        stopped = cut_at_stop(stream.text, stop)[1]  # a stop string in bytes held back to the end (U+FFFD)
    eos = bool(kept) and kept[-1][0] == tokenizer.eos_id
    text = "".join(shares[:-1] if eos else shares)
    text, _ = cut_at_stop(text, stop)
    finish = "stop" if stopped or eos or len(kept) < max_tokens else "length"
    return GeneratedText(text, kept, shares, alternatives, finish)


def _keyed(entries) -> dict:
    """{key: log p} of (key, log p) pairs best first; of equal keys (an unfinished character's "") the best kept."""
    out: dict = {}
    for key, value in entries:
        out.setdefault(key, value)
    return out


class _Decoder:
    """A token id's text, decoded once per request; `as_ids`: its label "token_id:N" instead (vLLM's
    `return_tokens_as_token_ids`), which names a token whole where its text is part of a character."""

    def __init__(self, tokenizer, as_ids: bool = False):
        self.tokenizer, self.as_ids, self.seen = tokenizer, as_ids, {}

    def __call__(self, token: int) -> str:
        if self.as_ids:
            return f"token_id:{token}"
        if token not in self.seen:
            self.seen[token] = self.tokenizer.decode([token])
        return self.seen[token]

    def label(self, token: int, text: str) -> str:
        """How a response names a token of known text: the text, or its "token_id:N" label."""
        return f"token_id:{token}" if self.as_ids else text
