"""Ensembled generation through an OpenAI-compatible server (the contract's `generate`, lm/blackbox.py).

Per-token mixture (a question with K > 1 passes): at every step each pass is asked for ONE next token
with its top-n log-probs (`logprobs=top_n`, no echo; n is what the probe found the server gives: 20,
or 5 from a server capped as OpenAI's API is), and the K answers are mixed over the union of
the returned tokens:  log p(t) = logsumexp_i(log λ_i + log p_i(t)), the chosen (argmax) token appended
to every pass. **Missing mass:** a token outside pass i's top-n counts p_i(t) = 0 there, so each mixed
value is a lower bound on the true mixture, exact for a token in every pass's top-n; the greedy choice
can differ from the local backend's only when a token missing from some pass's top-n would have won.
tests/test_generate_http.py measures it against the local backend on SmolLM2.

Sequence level (a question with one pass): the server decodes the whole answer in one request
(`max_tokens = max_new_tokens`): what the "vote" ensemble of `evaluate/qa.py` uses.

Prompts follow the contract: token ids (prefix ids + context ids, generated ids appended) when the
client sends token prompts, else text. No JAX is imported here.
"""
from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from replug_jax.lm.blackbox import (
    Generation,
    check_generation_inputs,
    generation_prompt_ids,
)
from replug_jax.lm.http.transport import BlackBoxServerError
from replug_jax.lm.http.windows import generation_window
from replug_jax.method import mixture
from replug_jax.models.stop_strings import cut_at_stop, tokens_through_stop


def http_generate(client, contexts, log_weights, *, max_new_tokens: int, stop=("\n",), shared_prefix: str = "",
                  top_n: int = 5) -> list[Generation]:
    """One Generation per question (module docstring); `client` is an HTTPLM."""
    weights = check_generation_inputs(contexts, log_weights, max_new_tokens)  # [B, K]
    prompts = [[_prompt(client, shared_prefix, c, max_new_tokens) for c in ctx] for ctx in contexts]
    with ThreadPoolExecutor(max(1, client.concurrency)) as pool:
        single = [b for b, p in enumerate(prompts) if len(p) == 1]
        out: dict[int, Generation] = dict(zip(single, pool.map(
            lambda b: _sequence(client, prompts[b][0], max_new_tokens, stop), single)))
        multi = [b for b in range(len(prompts)) if b not in out]
        state = {b: {"tokens": [], "ids": [], "lps": [], "done": False} for b in multi}
        for _ in range(max_new_tokens):
            live = [b for b in multi if not state[b]["done"]]
            if not live:
                break
            jobs = [(b, i) for b in live for i in range(len(prompts[b]))]
            tops = dict(zip(jobs, pool.map(lambda bi: _next_top(client, prompts[bi[0]][bi[1]], top_n), jobs)))
            for b in live:
                token, lp = _mixture_argmax([tops[(b, i)] for i in range(len(prompts[b]))], weights[b])
                s = state[b]
                s["tokens"].append(token), s["lps"].append(lp)
                ids = _token_ids(client, token)
                s["ids"] += ids
                prompts[b] = [p + (ids if isinstance(p, list) else token) for p in prompts[b]]
                text = "".join(s["tokens"])
                s["done"] = cut_at_stop(text, stop)[1] or _is_eos(client, ids)
        for b in multi:
            s = state[b]
            text = cut_at_stop("".join(s["tokens"]), stop)[0]
            out[b] = Generation(text, s["ids"], s["lps"], "stop" if s["done"] else "length")
    return [out[b] for b in range(len(prompts))]


def _prompt(client, prefix: str, context: str, max_new: int):
    """The pass prompt: token ids by the contract's rule (`generation_prompt_ids`, the prefix kept whole and the
    context cut from the left, as the local backend does), or text."""
    if not client.token_prompts:
        return prefix + context
    prefix_ids, context_ids = generation_prompt_ids(client.tokenizer, prefix, context, generation_window(client),
                                                    max_new, client.start_id)
    return prefix_ids + context_ids


def _body(client, prompt, max_tokens: int, top: int, stop=()) -> dict:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "logprobs": top, "echo": False}
    if stop:  # the server stops there too (OpenAI's `stop`, at most 4); the text is cut here either way
        body["stop"] = list(stop)[:4]
    return {**body, "model": client.model} if client.model else body


def _choice_logprobs(client, prompt, max_tokens: int, top: int, stop=()) -> tuple[dict, dict]:
    reply = client.transport.post(client.base_url + "/completions", _body(client, prompt, max_tokens, top, stop))
    try:
        choice = reply["choices"][0]
        lp = choice["logprobs"]
        if not lp or lp.get("token_logprobs") is None:
            raise KeyError("logprobs")
        return choice, lp
    except (KeyError, IndexError, TypeError):
        client.transport.count("failures")
        raise BlackBoxServerError(f"{client.base_url}: returned no log-probabilities for generated tokens") from None


def _next_top(client, prompt, top_n: int) -> dict[str, float]:
    """{token text: log p} for the next token: the server's top-n, its greedy token included."""
    _, lp = _choice_logprobs(client, prompt, 1, top_n)
    tops = (lp.get("top_logprobs") or [None])[0]
    out = {t: float(v) for t, v in (tops or {}).items() if isinstance(v, (int, float))}
    tokens, values = lp.get("tokens") or [], lp.get("token_logprobs") or []
    if tokens and values and isinstance(values[0], (int, float)):
        out.setdefault(tokens[0], float(values[0]))
    if not out:
        raise BlackBoxServerError(f"{client.base_url}: returned no top log-probabilities for the next token")
    return out


def _mixture_argmax(tops: list[dict[str, float]], log_weights: np.ndarray) -> tuple[str, float]:
    """The union's best token under Σ_i λ_i p_i(t), p_i = 0 outside pass i's top-n (`mixture.mixture_logprobs`);
    (token, log p), the first in sorted order among equals."""
    tokens = sorted(set().union(*tops))  # [N]
    per_pass = [[top.get(t, -math.inf) for t in tokens] for top in tops]  # [K, N]; -inf: not offered by that pass
    mixed = mixture.mixture_logprobs(np.asarray(log_weights)[: len(tops)], per_pass)  # [N]; weights past the passes: padding
    best = int(np.argmax(mixed))
    return (tokens[best], float(mixed[best])) if mixed[best] > -math.inf else (None, -math.inf)


def _sequence(client, prompt, max_new: int, stop) -> Generation:
    """The server's own greedy decoding of one pass, in one request."""
    choice, lp = _choice_logprobs(client, prompt, max_new, 1, [s for s in stop if s])
    tokens = lp.get("tokens") or []
    values = [float(v) for v in lp.get("token_logprobs") or []]
    keep = tokens_through_stop(len(tokens), lambda n: "".join(tokens[:n]), stop)
    tokens, values = tokens[:keep], values[:keep]
    text, stopped = cut_at_stop(choice.get("text") or "".join(tokens), stop)
    ids = [i for t in tokens for i in _token_ids(client, t)]
    finished = stopped or choice.get("finish_reason") == "stop"
    return Generation(text, ids, values, "stop" if finished else "length")


def _token_ids(client, token: str) -> list[int]:
    """The ids of a returned token text: its re-encoding (the token's own id for a token that decodes to
    whole characters; a byte fragment of a character may re-encode differently)."""
    return client.tokenizer.encode(token) if client.tokenizer is not None else []


def _is_eos(client, ids: list[int]) -> bool:
    eos = client.tokenizer.eos_id if client.tokenizer is not None else None
    return eos is not None and ids == [eos]
