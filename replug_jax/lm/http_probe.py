"""The first-contact probe of an HTTPLM server: what it returns, how it is aligned, how it starts a document.

`HTTPLM.probe()` runs `probe(lm)` on construction (unless `probe=False`). It takes the model id and
its window from `/models` (a server serving several models needs `model=`), then echoes a probe
text, which the client's own parsing checks (log-probs present, one offset and one log-prob per
token, offsets covering the prompt) and which must carry a log-prob for every token after the first.
The findings are returned and kept in `lm.stats()`; the settings they imply are set on `lm`
(`model`, `max_length`, `start_text` and how empty contexts and `max_tokens` are sent).

Alignment is checked against the server itself: a token t the server reports for the next
position after probe text Q (its own generation log-probs, which servers compute from the sampling
distribution) must get the same log-prob when Q + t is echoed. A value found one position early is
named a shift by one (llama-cpp-python's echo, its issue #1983, for models that add no BOS token).
Where that check is inconclusive the probe looks for induction on a repeated text (near-zero
log-probs on the last repetition) and otherwise warns that alignment is unverified.

max_tokens: a server that refuses `max_tokens=0`, or reads it as "unlimited" (llama-cpp-python),
keeps `max_tokens=1`, and the client drops the generated token (it starts at the end of the prompt).

Empty contexts. If the server conditions the first prompt token on a start token it adds itself
(llama.cpp and vLLM with a BOS model), the continuation is sent alone. If it returns no log-prob
for the first prompt token (the OpenAI convention), the continuation is sent after a
document-start text the probe has seen the server read as a single token: `start_text`, else the
document-start token of `tokenizer`, else the first of LocalLM's candidates ("<|endoftext|>",
"<s>", "<|begin_of_text|>") that works; so against our own server an empty context is scored
exactly as LocalLM scores it. Without one, an empty context is an error.
"""
from __future__ import annotations

import math
import re
import warnings

import numpy as np

from replug_jax.lm.http import HTTPLM, BlackBoxServerError, _Echo, _Refused
from replug_jax.lm.local import DOCUMENT_START_TOKENS

PROBE_ITEMS = " apple river tiger violet cloud lemon"
PROBE_TEXT = "Words:" + PROBE_ITEMS * 3  # the last repetition is predictable by induction
PROBE_TOP = 5  # top log-probs asked for in the probe (OpenAI's legacy maximum)


def probe(lm: HTTPLM) -> dict:
    """Check the server on a probe text; raise BlackBoxServerError naming what is wrong. Returns the findings."""
    info: dict = {}
    try:  # the model id (required by some servers) and its window
        models = lm._get(lm.base_url + "/models").get("data") or []
    except (_Refused, BlackBoxServerError, AttributeError):
        models = []
    ids = [m.get("id") for m in models if isinstance(m, dict)]
    if lm.model is None and len(ids) > 1:
        raise BlackBoxServerError(f"{lm.base_url} serves {len(ids)} models ({', '.join(map(str, ids[:5]))}, ...): "
                                  "pass model=")
    lm.model = lm.model or (ids[0] if ids else None)
    for m in models:
        if isinstance(m, dict) and m.get("id") == lm.model and isinstance(m.get("max_model_len"), int):
            lm.max_length = m["max_model_len"]
    candidates = _next_token_candidates(lm, PROBE_TEXT)
    targets = _clean_candidates(candidates)
    prompt = PROBE_TEXT + (targets[0][0] if targets else "")
    echo = lm._echo([prompt], 1, PROBE_TOP)[0]
    values = echo.logprobs
    first = [i for i, e in enumerate(echo.ends) if e > 0][0]
    nulls = [i for i in range(first + 1, len(values)) if values[i] is None]
    if len(nulls) == len(values) - first - 1:
        raise BlackBoxServerError(f"{lm.base_url}: returned no prompt log-probabilities (token_logprobs are null)")
    if nulls:
        raise BlackBoxServerError(f"{lm.base_url}: returned null log-probabilities for {len(nulls)} of "
                                  f"{len(values)} prompt tokens after the first")
    info["alignment"] = _check_alignment(lm, echo, targets, len(PROBE_TEXT))
    if not lm.prompt_logprobs:
        info["max_tokens"] = _check_max_tokens_zero(lm)
    if values[first] is not None:
        lm._start, info["start"] = "server", "the server conditions the first token on its own start token"
    else:
        info["start"] = _check_start_text(lm)
    info["model"] = lm.model
    with lm._lock:
        lm._probe_info = info
    return info


def _next_token_candidates(lm: HTTPLM, text: str) -> dict[str, float]:
    """{token text: log p} for the next token after `text`, from the server's own generation log-probs."""
    body = {"prompt": text, "max_tokens": 1, "temperature": 0, "logprobs": PROBE_TOP, "echo": False,
            **({"model": lm.model} if lm.model else {})}
    try:
        lp = lm._post(lm.base_url + "/completions", body, optional=True)["choices"][0].get("logprobs") or {}
    except (_Refused, BlackBoxServerError, KeyError, IndexError, TypeError):
        return {}
    out = {}
    for token, value in zip(lp.get("tokens") or [], lp.get("token_logprobs") or []):
        if isinstance(value, (int, float)):
            out[token] = float(value)
        break
    top = (lp.get("top_logprobs") or [None])[0]
    if isinstance(top, dict):
        out.update({k: float(v) for k, v in top.items() if isinstance(v, (int, float))})
    return out


def _check_max_tokens_zero(lm: HTTPLM) -> str:
    """Use max_tokens=0 when the server takes it as 'no new tokens'; else keep 1 (the generated token is dropped)."""
    prompt = "Hello world"
    try:
        reply = lm._post(lm.base_url + "/completions", lm._body([prompt], 0, lm.logprobs), optional=True)
        text = reply["choices"][0].get("text") or ""
    except _Refused as e:
        return f"max_tokens=1: the server refused max_tokens=0 ({e})"
    except (KeyError, IndexError, TypeError, AttributeError) as e:
        raise BlackBoxServerError(f"{lm.base_url}: malformed completions response ({e})") from None
    if len(text) > len(prompt):
        return "max_tokens=1: the server generated text for max_tokens=0 (read as unlimited)"
    lm._parse(reply["choices"][0], prompt)
    lm._max_tokens = 0
    return "max_tokens=0"


def _check_alignment(lm: HTTPLM, echo: _Echo, targets: list[tuple[str, float]], at: int) -> str:
    """'verified ...' or 'unverified'; raises on a misaligned server. `echo` is of PROBE_TEXT + targets[0]."""
    for k, (token, expected) in enumerate(targets[:3]):
        if k:
            echo = lm._echo([PROBE_TEXT + token], 1, PROBE_TOP)[0]
        verdict = _alignment_verdict(echo, token, expected, at)
        if verdict == "aligned":
            return "verified against the server's generation log-probs"
        if verdict == "ambiguous":  # e.g. a random model whose log-probs are all alike: try another token
            continue
        got = verdict[1]
        if verdict[0] == "shifted":
            raise BlackBoxServerError(
                f"{lm.base_url}: log-probabilities shifted by one position: the server's own log p of "
                f"{token!r} after the probe text is {expected:.3f}, but its echo puts that value one token "
                f"early and gives {got:.3f} for {token!r} (entry i is evaluated with the distribution after "
                "token i; llama-cpp-python issue #1983)")
        raise BlackBoxServerError(
            f"{lm.base_url}: log-probabilities are misaligned: echo gives {got:.3f} for {token!r} after the "
            f"probe text, the server's own generation log-prob is {expected:.3f}")
    repeat = len(PROBE_ITEMS)
    last = [v for s, v in zip(echo.starts, echo.logprobs) if at - repeat < s < at and v is not None]
    first = [v for s, v in zip(echo.starts, echo.logprobs) if len("Words:") < s < len("Words:") + repeat and v is not None]
    if last and first and np.mean(last) > -1.0 and np.mean(last) > np.mean(first) + 2.0:
        return "verified by induction on a repeated text"
    warnings.warn(f"{lm.base_url}: could not verify that prompt log-probabilities are aligned to their tokens "
                  "(no usable generation log-probs and no induction on the probe text)")
    return "unverified"


def _check_start_text(lm: HTTPLM) -> str:
    """Find a document-start text the server reads as one token: `start_text` if given, else the tokenizer's,
    else LocalLM's candidates in order ("<|endoftext|>", "<s>", "<|begin_of_text|>")."""
    candidates = [lm.start_text] if lm.start_text else list(DOCUMENT_START_TOKENS)
    for text in candidates:
        prompt = text + " The"
        try:
            echo = lm._echo([prompt], lm._max_tokens, lm.logprobs, optional=True)[0]
        except (BlackBoxServerError, _Refused):
            continue
        before = [i for i, e in enumerate(echo.ends) if 0 < e <= len(text)]
        after = [i for i, e in enumerate(echo.ends) if e > len(text)]
        if len(before) == 1 and echo.starts[before[0]] == 0 and after and echo.logprobs[after[0]] is not None:
            lm.start_text, lm._start = text, "text"
            return f"empty contexts are sent after start_text {text!r}"
    return f"the server adds no start token and reads none of {candidates} as one token: empty contexts are refused"


def _clean_candidates(candidates: dict[str, float]) -> list[tuple[str, float]]:
    """Next tokens whose text re-tokenises safely (a word with a leading space, else one ASCII character), best first."""
    ranked = sorted(candidates.items(), key=lambda kv: -kv[1])
    ok = lambda v: math.isfinite(v) and v <= 1e-3
    words = [(t, v) for t, v in ranked if re.match(r"^ [A-Za-z]+$", t) and ok(v)]
    chars = [(t, v) for t, v in ranked if re.match(r"^[A-Za-z0-9.,;:!?]$", t) and ok(v)]
    return words + chars


def _alignment_verdict(echo: _Echo, token: str, expected: float, at: int):
    """Is the echoed log-prob of `token` (at character `at`) the server's generation log-prob `expected`?

    'aligned'; ('shifted', got) when the value sits one entry early (or in the previous entry's top
    log-probs) and closer than at its own entry; ('misaligned', got); 'ambiguous' when both explanations
    fit equally well or the token is not found (re-tokenised differently)."""
    j = next((i for i, s in enumerate(echo.starts) if s == at and echo.ends[i] == at + len(token)), None)
    if j is None or j == 0 or echo.logprobs[j] is None:
        return "ambiguous"
    tol = 0.05 + 0.01 * abs(expected)
    got = echo.logprobs[j]
    early = [echo.logprobs[j - 1]] + ([(echo.top[j - 1] or {}).get(token)] if echo.top else [])
    d_aligned = abs(got - expected)
    d_shifted = min([abs(v - expected) for v in early if isinstance(v, (int, float))] or [math.inf])
    if d_aligned <= tol and d_aligned < d_shifted - 1e-4:
        return "aligned"
    if d_shifted <= tol and d_shifted < d_aligned - 1e-4:
        return ("shifted", got)
    if d_aligned <= tol:
        return "ambiguous"
    return ("misaligned", got)
