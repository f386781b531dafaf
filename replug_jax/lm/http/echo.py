"""Reading prompt log-probabilities out of OpenAI-compatible completions responses.

Two response forms are read: the legacy `echo=True, logprobs=N` form (`choice.logprobs` with
`tokens`, `text_offset`, `token_logprobs`, `top_logprobs`) and vLLM's `prompt_logprobs` form
(`choice.prompt_logprobs`: [None | {token_id: {logprob, rank, decoded_token}}]).

  * token-id prompts (the contract's rule, `replug_jax.lm.blackbox`): `id_prompt_values` takes the
    values of the prompt's own tokens, skipping the `leading` entries a server adds (its start
    token) and any generated token after them;
  * text prompts (the fallback): `parse_text_echo` / `parse_prompt_logprobs` put every echoed token
    in prompt character coordinates and `select_continuation` keeps the tokens that end after the
    context/continuation boundary: the SERVER's tokens of the joined text.

Every function checks the structure it reads and raises `BlackBoxServerError` naming what is
wrong (missing or null log-probs, counts that do not match, offsets that do not cover the prompt),
never a silently wrong score.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from replug_jax.lm.http.transport import BlackBoxServerError


@dataclasses.dataclass
class Echo:
    """A prompt's tokens as the server echoed them, in prompt character coordinates."""

    tokens: list[str]
    starts: list[int]  # [n] start offsets; token i spans [starts[i], ends[i])
    ends: list[int]
    logprobs: list[float | None]
    top: list[dict | None] | None


def _check_values(values) -> None:
    if any(v is not None and (not isinstance(v, (int, float)) or not math.isfinite(v) or v > 1e-3) for v in values):
        raise BlackBoxServerError("returned log-probabilities that are not finite numbers <= 0")


def echo_values(choice: dict, prompt_logprobs_form: bool) -> list[float | None]:
    """Every prompt (and generated) entry's log-prob, in order, from either response form."""
    if prompt_logprobs_form:
        entries = choice.get("prompt_logprobs")
        if not entries:
            raise BlackBoxServerError("returned no prompt log-probabilities (prompt_logprobs missing from the response)")
        return [None if not isinstance(e, dict) else _chosen(e) for e in entries]
    lp = choice.get("logprobs")
    if not lp or not lp.get("token_logprobs"):
        raise BlackBoxServerError("returned no prompt log-probabilities (logprobs missing from the response)")
    values = lp["token_logprobs"]
    _check_values(values)
    return list(values)


def _chosen(entry: dict) -> float | None:
    """The prompt token's own log-prob in a vLLM entry: its first option, where vLLM puts it (the ranks are not
    read: the prompt token's may be any, or null, and the top options follow it)."""
    options = list(entry.values())
    value = options[0].get("logprob") if options and isinstance(options[0], dict) else None
    _check_values([value])
    return value


def id_prompt_values(choice: dict, num_prompt: int, leading: int, max_trailing: int,
                     prompt_logprobs_form: bool) -> list[float | None]:
    """The log-probs of a token-id prompt's own `num_prompt` tokens (entry i: token i given tokens < i)."""
    values = echo_values(choice, prompt_logprobs_form)
    if not leading + num_prompt <= len(values) <= leading + num_prompt + max_trailing:
        raise BlackBoxServerError(f"echoed {len(values)} log-probabilities for a prompt of {num_prompt} token ids "
                                  f"(expected {leading} leading + {num_prompt} + at most {max_trailing} generated)")
    return values[leading : leading + num_prompt]


def parse_text_echo(choice: dict, prompt: str) -> Echo:
    """The legacy echo form of a text prompt -> Echo in prompt coordinates; generated tokens dropped."""
    values = echo_values(choice, False)
    lp = choice["logprobs"]
    tokens, offsets, top = lp.get("tokens"), lp.get("text_offset"), lp.get("top_logprobs")
    if tokens is None or offsets is None or len(tokens) != len(values) or len(offsets) != len(values):
        raise BlackBoxServerError(f"token count does not match: {len(tokens or [])} tokens, {len(values)} "
                                  f"log-probabilities, {len(offsets or [])} text offsets")
    text = choice.get("text") or ""
    at = 0 if text.startswith(prompt) else text.find(prompt)
    if at < 0:
        raise BlackBoxServerError("did not echo the prompt (echoed text does not contain it)")
    if any(b < a for a, b in zip(offsets, offsets[1:])) or (offsets and not 0 <= offsets[0] <= offsets[-1] <= len(text)):
        raise BlackBoxServerError("text offsets are not monotonic within the echoed text")
    starts = [o - at for o in offsets]
    ends = [min(e, len(prompt)) for e in starts[1:] + [len(text) - at]]  # a generated token may be unlisted
    keep = [i for i, s in enumerate(starts) if s < len(prompt)]  # generated tokens start at the prompt's end
    if not keep or starts[0] > 0 or ends[keep[-1]] < len(prompt):
        raise BlackBoxServerError("echoed tokens do not cover the prompt")
    pick = lambda xs: [xs[i] for i in keep]
    return Echo(pick(tokens), pick(starts), pick(ends), pick(values),
                pick(top) if isinstance(top, list) and len(top) == len(values) else None)


def parse_prompt_logprobs(choice: dict, prompt: str) -> Echo:
    """vLLM's `prompt_logprobs` of a text prompt -> Echo; offsets rebuilt by matching `decoded_token`s.

    The first entry is None; its token's text is what precedes the second token's text (nothing,
    when the second token starts the prompt: then the first is a start token the server added).
    A prompt whose tokens split a character cannot be aligned and raises."""
    entries = choice.get("prompt_logprobs")
    if not entries:
        raise BlackBoxServerError("returned no prompt log-probabilities (prompt_logprobs missing from the response)")
    options = [[(o.get("decoded_token") or "", o.get("logprob")) for o in e.values()] if isinstance(e, dict) else []
               for e in entries]
    tokens, starts, values, cursor = [], [], [], 0
    for k, opts in enumerate(options):
        if k == 0 and entries[0] is None:
            following = [t for t, _ in options[1]] if len(options) > 1 else []
            ends = [e for e in range(len(prompt) + 1) if any(t and prompt.startswith(t, e) for t in following)]
            end = ends[0] if ends else len(prompt)
            tokens.append(prompt[:end]), starts.append(0), values.append(None)
            cursor = end
            continue
        match = [(t, v) for t, v in opts if prompt.startswith(t, cursor)]
        if not match:
            raise BlackBoxServerError(f"cannot align prompt_logprobs token {k} to the prompt text at character {cursor}")
        token, value = max(match, key=lambda tv: len(tv[0]))
        tokens.append(token), starts.append(cursor), values.append(value)
        cursor += len(token)
    if cursor != len(prompt):
        raise BlackBoxServerError("prompt_logprobs tokens do not cover the prompt")
    _check_values(values)
    return Echo(tokens, starts, starts[1:] + [len(prompt)], values, None)


def select_continuation(echo: Echo, prompt: str, boundary: int) -> np.ndarray:
    """Log-probs of the echoed tokens that end after `boundary`: the continuation as the server tokenised it.

    A server token straddling the boundary counts as a continuation token."""
    idx = [i for i, e in enumerate(echo.ends) if e > boundary]
    if not idx:
        raise BlackBoxServerError(f"no echoed token covers the continuation of {prompt[-40:]!r}")
    return continuation_array([echo.logprobs[i] for i in idx], first_is_prompt_start=idx[0] == first_token(echo))


def first_token(echo: Echo) -> int:
    """The index of the first echoed token with any width (a server's start token is zero-width)."""
    return [i for i, e in enumerate(echo.ends) if e > 0][0]


def continuation_array(values: list[float | None], first_is_prompt_start: bool) -> np.ndarray:
    """The continuation's log-probs as float32 [T]; a missing value is an error that names its cause."""
    if any(v is None for v in values):
        if first_is_prompt_start and values[0] is None and all(v is not None for v in values[1:]):
            raise BlackBoxServerError("returned no log-probability for the prompt's first token, which is the "
                                      "continuation's first token (empty context): the server adds no start token")
        raise BlackBoxServerError(f"returned no log-probability for {sum(v is None for v in values)} of the "
                                  f"{len(values)} continuation tokens")
    out = np.asarray(values, dtype=np.float32)
    if not np.all(np.isfinite(out)) or out.max() > 1e-3:
        raise BlackBoxServerError("returned log-probabilities that are not finite numbers <= 0")
    return out


def top_scores(values: np.ndarray, token_ids: list[int], entries: list, top: int) -> TopScores:
    """A continuation's `TopScores` from its echoed tokens' top entries, named by id ("token_id:N": our server's
    and vLLM's `return_tokens_as_token_ids`) and taken from the scoring pass (our server with `echo_from`).
    values [T], token_ids [T], entries [T] ({label: log p} or None). A position whose entry is missing, names a
    token by text, or holds fewer than `top` tokens says nothing about the others: its list is then the
    continuation's own token at log p 0 (any other token may hold all of that pass's mass), which is a true bound
    (method/greedy_match.py leaves such a position open unless the other passes decide it)."""
    from replug_jax.lm.blackbox import TopScores
    from replug_jax.lm.http.generation import label_id

    top_lps = np.zeros((len(token_ids), top), np.float32)  # [T, top]
    top_ids = np.repeat(np.asarray(token_ids, np.int64)[:, None], top, axis=1)  # [T, top]: unknown by default
    for t, entry in enumerate(entries):
        best = sorted(((label_id(k), v) for k, v in (entry or {}).items()), key=lambda kv: -kv[1] if
                      isinstance(kv[1], (int, float)) else math.inf)[:top]
        if len(best) == top and all(i is not None and isinstance(v, (int, float)) for i, v in best):
            _check_values([v for _, v in best])
            top_ids[t], top_lps[t] = [i for i, _ in best], [v for _, v in best]
    return TopScores(np.asarray(values, np.float32), top_lps, top_ids, list(token_ids))
