"""The first-contact probe of an OpenAI-compatible server: what it returns and how to ask it.

`probe(client)` returns a `ProbeResult`; `HTTPLM.probe()` runs it and applies what it found. The client
passed in needs `transport`, `model`, `tokenizer`, `start_text`, `prompt_logprobs`, `logprobs`,
`token_prompts`, `body(...)`, `completions(...)` and `text_echoes(...)`: HTTPLM's public methods.

Requests that do not wait on each other's answers are sent side by side (`side_by_side`: a server that batches
concurrent requests, as ours and vLLM do, answers them together; a remote one's latency is paid once): the
next-token candidates, the top log-probs allowed and the max_tokens check; the token-id and text echoes of the
prompt-format check; then, with the probe's result applied, `probe_requests`' checks of how to ask for scores and
generations. Errors are raised in the order the checks would have run one after another.

What it finds out, in order:
  * model, window and end tokens: the model id, `max_model_len` and `eos_token_id` (an id or a list: ours names
    them; vLLM's card does not, and generation then learns them: lm/http/generation.py) from `/models` (a server
    serving several models needs `model=`);
  * prompt log-probs present and aligned: a probe text is echoed; a token t that the server itself
    reports as the next token after text Q (its generation log-probs) must get the same log-prob
    when Q + t is echoed. A value found one position early is a shift by one (llama-cpp-python's
    echo, its issue #1983), refused. Where that is inconclusive, induction on a repeated text
    (near-zero log-probs on the last repetition) verifies it; else a warning says it is unverified;
  * max_tokens: 0 when the server reads it as "no new tokens", else 1 (the generated token is dropped);
  * empty contexts: the server's own start token when it conditions the first prompt token on one
    (llama.cpp, vLLM with a BOS model); else a document-start text it reads as one token
    (`start_text`, the tokenizer's document-start token, LocalLM's candidates; through the server's
    /tokenize, its id becomes the client's `start_id` for token-id prompts); else refused;
  * prompt format (with a tokenizer): the probe text is sent as token ids; the server must take
    them and give the same log-probs as for the text (else the tokenizer is not the server's, an
    error). Then every pair is sent as `context ids + continuation ids`, the contract's one rule.
    A server that refuses token prompts gets text prompts, and the result says so.
"""
from __future__ import annotations

import dataclasses
import math
import re
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from replug_jax.lm.http.echo import Echo, echo_values, id_prompt_values
from replug_jax.lm.http.transport import BlackBoxServerError, Refused
from replug_jax.models.tokenizer import DOCUMENT_START_TOKENS

PROBE_ITEMS = " apple river tiger violet cloud lemon"
PROBE_TEXT = "Words:" + PROBE_ITEMS * 3  # the last repetition is predictable by induction
PROBE_TOP = 5  # top log-probs asked for in the probe (OpenAI's legacy maximum)
GENERATION_TOP = 20  # top log-probs the per-token mixture asks for where the server allows them


@dataclasses.dataclass
class ProbeResult:
    """Settings the client applies, and the findings in words (kept in `HTTPLM.stats()`)."""

    model: str | None
    max_length: int | None  # the server's window in tokens, when it says
    max_tokens: int  # 0 or 1 in scoring requests
    start: str | None  # "server": it conditions the first prompt token itself; "text": send start_text; None
    start_text: str | None
    token_prompts: bool  # send context ids + continuation ids
    leading: int  # entries the server echoes before a token-id prompt's own (its start token)
    top_logprobs: int  # the most next-token log-probs one request gets (ensembled generation's top-n)
    findings: dict
    end_ids: tuple[int, ...] = ()  # the served model's end-of-sequence token ids, where its /models card names them


def side_by_side(*calls):
    """Each zero-argument call's result, the calls run at once in threads (independent requests); the first
    exception in call order is raised once all have ended."""
    with ThreadPoolExecutor(len(calls)) as pool:
        futures = [pool.submit(call) for call in calls]
    return [future.result() for future in futures]


def _or_failure(call):
    """The call's result, or the Refused / BlackBoxServerError it raised (a check that reads a refusal as a finding)."""
    try:
        return call()
    except (Refused, BlackBoxServerError) as e:
        return e


def probe(client) -> ProbeResult:
    """Check the server on a probe text; raise BlackBoxServerError naming what is wrong."""
    t = client.transport
    model, max_length, end_ids = _model_card(client)
    client.model = model  # requests from here on name it
    text = probe_text(max_length or client.max_length)
    candidates, wide, max_tokens_check = side_by_side(
        lambda: _next_token_candidates(client, text), lambda: _next_token_candidates(client, text, GENERATION_TOP),
        lambda: _or_failure(lambda: (1, None) if client.prompt_logprobs else _check_max_tokens_zero(client)))
    targets = _clean_candidates(candidates)
    echo = client.text_echoes([text + (targets[0][0] if targets else "")], 1, PROBE_TOP)[0]
    first = [i for i, e in enumerate(echo.ends) if e > 0][0]
    nulls = [i for i in range(first + 1, len(echo.logprobs)) if echo.logprobs[i] is None]
    if len(nulls) == len(echo.logprobs) - first - 1:
        raise BlackBoxServerError(f"{t.base_url}: returned no prompt log-probabilities (token_logprobs are null)")
    if nulls:
        raise BlackBoxServerError(f"{t.base_url}: returned null log-probabilities for {len(nulls)} of "
                                  f"{len(echo.logprobs)} prompt tokens after the first")
    findings = {"model": model, "alignment": _check_alignment(client, echo, targets, text)}
    if isinstance(max_tokens_check, Exception):  # said after the echo's own faults, as when it was sent after it
        raise max_tokens_check
    max_tokens, max_tokens_found = max_tokens_check
    if max_tokens_found:
        findings["max_tokens"] = max_tokens_found
    start, start_text = "server", client.start_text
    if echo.logprobs[first] is not None:
        findings["start"] = "the server conditions the first token on its own start token"
    else:
        start_text, findings["start"] = _check_start_text(client, max_tokens)
        start = "text" if start_text else None
    if client.start_id is None and start_text and client.tokenizer is not None:  # the server's /tokenize
        ids = client.tokenizer.encode(start_text)  # an empty context's token-id prompt: that start token
        client.start_id = ids[0] if len(ids) == 1 else None
    token_prompts, leading, findings["prompt_format"] = _check_token_prompts(client, max_tokens, text)
    top = findings["top_logprobs"] = _top_logprobs_allowed(len(wide), len(candidates))
    return ProbeResult(model, max_length, max_tokens, start, start_text, token_prompts, leading, top, findings,
                       end_ids)


def probe_lookahead(client) -> tuple[bool, str]:
    """Whether the second step of a two-token greedy continuation gives the top log-probs that a request for the
    next token after the text and the first token gives (tokens and values to 1e-3): ensembled generation then
    asks each pass once for its own continuation (lm/http/generation.py), else once per step. Asked with the
    probe's result applied (prompts sent as generation sends them)."""
    from replug_jax.lm.http.generation import continuation_tops, pass_prompt

    text, top = probe_text(client.max_length), min(client.top_logprobs, PROBE_TOP)
    prompt = pass_prompt(client, "", text, 2)
    try:
        two = continuation_tops(client, prompt, top, 2, [])
    except BlackBoxServerError as e:
        return False, f"one request per pass per step (a two-token continuation failed: {e})"
    if len(two) < 2:
        return False, "one request per pass per step (the server's continuation ended at once)"
    first = two[0][0]
    ids = client.tokenizer.encode(first) if client.tokenizer is not None else []
    if isinstance(prompt, list) and len(ids) != 1:
        return False, "one request per pass per step (its probe token does not re-encode to one token)"
    try:
        one = continuation_tops(client, prompt + (ids if isinstance(prompt, list) else first), top, 1, [])
    except BlackBoxServerError as e:
        return False, f"one request per pass per step (a next-token request failed: {e})"
    later, asked = two[1][1], one[0][1] if one else {}
    same = max(later, key=later.get) == max(asked, key=asked.get) if asked else False
    same = same and all(abs(later[t] - asked[t]) <= 1e-3 for t in set(later) & set(asked))
    if same:
        return True, "each pass's own continuation in one request (its later steps agree with next-token requests)"
    return False, ("one request per pass per step: the server's later generated steps disagree with a request "
                   "for the next token")


def probe_text(max_length: int | None) -> str:
    """PROBE_TEXT, cut to fit a small window (ASCII: at most one token per character, 8 to spare)."""
    return PROBE_TEXT if not max_length or len(PROBE_TEXT) + 8 <= max_length else PROBE_TEXT[: max(8, max_length - 8)]


def _model_card(client) -> tuple[str | None, int | None, tuple[int, ...]]:
    """(model id, window, end-of-sequence ids) from the server's /models: None, None, () where it says nothing."""
    t = client.transport
    try:
        models = t.get(t.base_url + "/models").get("data") or []
    except (Refused, BlackBoxServerError, AttributeError):
        models = []
    ids = [m.get("id") for m in models if isinstance(m, dict)]
    if client.model is None and len(ids) > 1:
        raise BlackBoxServerError(f"{t.base_url} serves {len(ids)} models ({', '.join(map(str, ids[:5]))}, ...): "
                                  "pass model=")
    model = client.model or (ids[0] if ids else None)
    card = next((m for m in models if isinstance(m, dict) and m.get("id") == model), {})
    window = card.get("max_model_len")
    ends = card.get("eos_token_id")
    ends = [ends] if isinstance(ends, int) else ends if isinstance(ends, list) else []
    end_ids = tuple(e for e in ends if isinstance(e, int) and not isinstance(e, bool) and e >= 0)
    return model, (window if isinstance(window, int) and not isinstance(window, bool) else None), end_ids


def _next_token_candidates(client, text: str, top: int = PROBE_TOP) -> dict[str, float]:
    """{token text: log p} for the next token after `text`, from the server's own generation log-probs
    ({} where the server refuses the request)."""
    body = {"prompt": text, "max_tokens": 1, "temperature": 0, "logprobs": top, "echo": False,
            **({"model": client.model} if client.model else {})}
    try:
        lp = client.transport.post(client.transport.base_url + "/completions", body, optional=True)["choices"][0]
        lp = lp.get("logprobs") or {}
    except (Refused, BlackBoxServerError, KeyError, IndexError, TypeError):
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


def _top_logprobs_allowed(got: int, at_probe_top: int) -> int:
    """How many next-token log-probs a request gets: GENERATION_TOP where the server takes and fills it (`got`
    entries for GENERATION_TOP), else what it returned for PROBE_TOP (OpenAI's API refuses `logprobs` above 5 with
    a 400)."""
    return min(got, GENERATION_TOP) if got > PROBE_TOP else max(1, min(at_probe_top, PROBE_TOP))


def _check_max_tokens_zero(client) -> tuple[int, str]:
    """(0, ...) when the server takes max_tokens=0 as 'no new tokens'; else (1, why)."""
    prompt = "Hello world"
    t = client.transport
    try:
        reply = t.post(t.base_url + "/completions", client.body([prompt], 0, client.logprobs), optional=True)
        text = reply["choices"][0].get("text") or ""
    except Refused as e:
        return 1, f"max_tokens=1: the server refused max_tokens=0 ({e})"
    except (KeyError, IndexError, TypeError, AttributeError) as e:
        raise BlackBoxServerError(f"{t.base_url}: malformed completions response ({e})") from None
    if len(text) > len(prompt):
        return 1, "max_tokens=1: the server generated text for max_tokens=0 (read as unlimited)"
    client.parse_text(reply["choices"][0], prompt)
    return 0, "max_tokens=0"


def _check_alignment(client, echo: Echo, targets: list[tuple[str, float]], text: str) -> str:
    """'verified ...' or 'unverified'; raises on a misaligned server. `echo` is of `text` + targets[0]."""
    base_url, at = client.transport.base_url, len(text)
    for k, (token, expected) in enumerate(targets[:3]):
        if k:
            echo = client.text_echoes([text + token], 1, PROBE_TOP)[0]
        verdict = _alignment_verdict(echo, token, expected, at)
        if verdict == "aligned":
            return "verified against the server's generation log-probs"
        if verdict == "ambiguous":  # e.g. a random model whose log-probs are all alike: try another token
            continue
        got = verdict[1]
        if verdict[0] == "shifted":
            raise BlackBoxServerError(
                f"{base_url}: log-probabilities shifted by one position: the server's own log p of "
                f"{token!r} after the probe text is {expected:.3f}, but its echo puts that value one token "
                f"early and gives {got:.3f} for {token!r} (entry i is evaluated with the distribution after "
                "token i; llama-cpp-python issue #1983)")
        raise BlackBoxServerError(
            f"{base_url}: log-probabilities are misaligned: echo gives {got:.3f} for {token!r} after the "
            f"probe text, the server's own generation log-prob is {expected:.3f}")
    repeat = len(PROBE_ITEMS)
    last = [v for s, v in zip(echo.starts, echo.logprobs) if at - repeat < s < at and v is not None]
    first = [v for s, v in zip(echo.starts, echo.logprobs) if len("Words:") < s < len("Words:") + repeat and v is not None]
    if last and first and np.mean(last) > -1.0 and np.mean(last) > np.mean(first) + 2.0:
        return "verified by induction on a repeated text"
    warnings.warn(f"{base_url}: could not verify that prompt log-probabilities are aligned to their tokens "
                  "(no usable generation log-probs and no induction on the probe text)")
    return "unverified"


def _check_start_text(client, max_tokens: int) -> tuple[str | None, str]:
    """(start_text, finding): a document-start text the server reads as one token: `start_text` if given,
    else LocalLM's candidates in order ("<|endoftext|>", "<s>", "<|begin_of_text|>")."""
    candidates = [client.start_text] if client.start_text else list(DOCUMENT_START_TOKENS)
    for text in candidates:
        try:
            echo = client.text_echoes([text + " The"], max_tokens, client.logprobs, optional=True)[0]
        except (BlackBoxServerError, Refused):
            continue
        before = [i for i, e in enumerate(echo.ends) if 0 < e <= len(text)]
        after = [i for i, e in enumerate(echo.ends) if e > len(text)]
        if len(before) == 1 and echo.starts[before[0]] == 0 and after and echo.logprobs[after[0]] is not None:
            return text, f"empty contexts are sent after start_text {text!r}"
    return None, f"the server adds no start token and reads none of {candidates} as one token: empty contexts are refused"


def _check_token_prompts(client, max_tokens: int, text: str) -> tuple[bool, int, str]:
    """(send token ids?, leading entries, finding). Token ids need a tokenizer, a server that takes them,
    and the same log-probs as the text prompt (else the tokenizer is not the server's: an error)."""
    if client.tokenizer is None or client.token_prompts is False:
        why = "no tokenizer given" if client.tokenizer is None else "token_prompts=False"
        return False, 0, f"text ({why}): the server's tokens of the joined text are scored"
    ids = client.tokenizer.encode(text)

    def id_echo():
        try:
            return echo_values(client.completions([ids], max_tokens, client.logprobs, optional=True)[0],
                               client.prompt_logprobs)
        except (KeyError, TypeError) as e:
            raise Refused(str(e)) from None

    values, text_echo = side_by_side(lambda: _or_failure(id_echo),
                                     lambda: _or_failure(lambda: client.text_echoes([text], max_tokens, client.logprobs)))
    if isinstance(values, Exception):
        if client.token_prompts:
            raise BlackBoxServerError(f"{client.transport.base_url}: token_prompts=True but the server refused a "
                                      f"token-id prompt ({values})") from None
        return False, 0, f"text (the server refused token-id prompts: {values}): the server's tokens are scored"
    if isinstance(text_echo, Exception):
        raise text_echo
    text_echo = text_echo[0]
    text_values = [v for v, s, e in zip(text_echo.logprobs, text_echo.starts, text_echo.ends) if e > s]
    same = lambda mine, first: len(text_values) == len(ids) and all(
        a is not None and b is not None and math.isclose(a, b, abs_tol=2e-3)
        for a, b in zip(mine[first:], text_values[first:]))
    for leading in range(0, min(2, len(values) - len(ids)) + 1):
        if same(values[leading : leading + len(ids)], 1):
            return True, leading, "token ids: context ids + continuation ids (the contract's rule)"
    if client.start_id is not None and text_echo.logprobs[0] is None and text_values[0] is not None:
        # the text's first token was conditioned on something: a start token the server adds to text prompts only
        # (vLLM); with that token sent first, ids must give the text's values, and they are then sent as built
        choice = client.completions([[client.start_id] + ids], max_tokens, client.logprobs)[0]
        if same(echo_values(choice, client.prompt_logprobs)[1 : 1 + len(ids)], 0):
            return True, 0, ("token ids: context ids + continuation ids (the contract's rule; the server adds its "
                             "start token to text prompts only)")
    raise BlackBoxServerError(
        f"{client.transport.base_url}: the tokenizer given is not the server's: the probe text is {len(ids)} tokens "
        f"for it and {len(text_values)} for the server, or their log-probs differ; pass the model's tokenizer "
        "(or token_prompts=False to score the server's own tokens of the joined text)")


def _clean_candidates(candidates: dict[str, float]) -> list[tuple[str, float]]:
    """Next tokens whose text re-tokenises safely (a word with a leading space, else one ASCII character), best first."""
    ranked = sorted(candidates.items(), key=lambda kv: -kv[1])
    ok = lambda v: math.isfinite(v) and v <= 1e-3
    words = [(t, v) for t, v in ranked if re.match(r"^ [A-Za-z]+$", t) and ok(v)]
    chars = [(t, v) for t, v in ranked if re.match(r"^[A-Za-z0-9.,;:!?]$", t) and ok(v)]
    return words + chars


def _alignment_verdict(echo: Echo, token: str, expected: float, at: int):
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


# What the probe finds about requests themselves (after `probe`, its result applied): how many prompts one scoring
# request may carry, whether echoed log-probabilities need `logprobs` >= 1, whether the server computes only the
# log-probs asked for (`echo_from`), and how to ask for generations (lookahead, tokens by id).
#
# Settings given to HTTPLM's constructor are kept as they are. `logprobs=0` is OpenAI's "the chosen tokens' log-probs,
# no alternatives": a server that answers it with the same numbers is asked 0, so it computes and sends no top
# alternatives per echoed token (our own server computes them in a second pass; over a 3x cost measured here).

BATCH_PROMPTS = 16  # prompts per completions request where the probe finds the server answers lists exactly


@dataclasses.dataclass
class RequestSettings:
    """How the client asks for scores and generations, and the findings in words (kept in `HTTPLM.stats()`)."""

    logprobs: int  # scoring requests' `logprobs`: 0 or 1
    prompts_per_request: int
    echo_from: bool
    lookahead: bool  # generation: each pass's own continuation in one request
    token_ids: bool  # generation: tokens named by id
    findings: dict


def probe_requests(client, logprobs_given: int | None, batch_given: int | None) -> RequestSettings:
    """The checks below, side by side. The batching and echo_from checks are sent at the `logprobs` the logprobs
    check is expected to find (0, or the value given), and again, as requests will be sent, where it finds 1 (what
    they found or raised at 0 is then dropped)."""
    expected = 0 if logprobs_given is None else logprobs_given
    scoring = lambda logprobs: side_by_side(lambda: probe_batching(client, batch_given, logprobs),  # noqa: E731
                                            lambda: probe_echo_from(client, logprobs))
    (logprobs, logprobs_found), at_expected, (lookahead, generation), (token_ids, generated_tokens) = side_by_side(
        lambda: probe_logprobs(client, logprobs_given), lambda: _or_failure(lambda: scoring(expected)),
        lambda: probe_lookahead(client), lambda: probe_token_ids(client))
    if logprobs != expected:
        at_expected = scoring(logprobs)
    elif isinstance(at_expected, Exception):
        raise at_expected
    (batch, batching), (echo_from, echo_from_found) = at_expected
    return RequestSettings(logprobs, batch, echo_from, lookahead, token_ids, {
        "prompts_per_request": batching, "logprobs": logprobs_found, "echo_from": echo_from_found,
        "generation": generation, "generated_tokens": generated_tokens})


def probe_batching(client, given: int | None, logprobs: int) -> tuple[int, str]:
    """(prompts per request, the finding): `BATCH_PROMPTS` where the server answers a list of two probe pairs
    with each pair's own numbers (1e-4), else 1; a size `given` to the client's constructor is kept as it is.
    logprobs: the scoring requests' `logprobs`."""
    if given is not None:
        return given, f"{given} (as given)"
    try:
        pairs = [client.prepare_prompt(PROBE_TEXT[:24], PROBE_TEXT[24:40]),
                 client.prepare_prompt(PROBE_TEXT[:12], PROBE_TEXT[12:30])]
    except ValueError:  # a window too small for the probe pairs
        return 1, "1: not probed (the server's window is too small for the probe pairs)"
    score = lambda items: client.score_chunk(items, probing=True, logprobs=logprobs)  # noqa: E731
    first, second, together = side_by_side(lambda: score(pairs[:1])[0], lambda: score(pairs[1:])[0],
                                           lambda: _or_failure(lambda: score(pairs)))
    if isinstance(together, Exception):
        return 1, f"1: the server refused a list of prompts ({str(together)[:120]})"
    if not all(a.shape == b.shape and np.allclose(a, b, atol=1e-4) for a, b in zip((first, second), together)):
        return 1, "1: the server answered a list of prompts with other numbers than one prompt at a time"
    return BATCH_PROMPTS, f"{BATCH_PROMPTS}: the server answers a list of prompts with each prompt's own numbers"


def probe_logprobs(client, given: int | None) -> tuple[int, str]:
    """(the `logprobs` of scoring requests, the finding): 0 where the server answers an echoed probe pair with the
    same log-probs (1e-4) at 0 as at 1, else 1; a value `given` to the client's constructor is kept."""
    if given is not None:
        return given, f"{given} (as given)"
    try:
        pair = client.prepare_prompt(PROBE_TEXT[:24], PROBE_TEXT[24:40])
    except ValueError:  # a window too small for the probe pair
        return 1, "1: not probed (the server's window is too small for the probe pair)"
    with_top, without = side_by_side(lambda: client.score_chunk([pair], probing=True, logprobs=1)[0],
                                     lambda: _or_failure(lambda: client.score_chunk([pair], probing=True, logprobs=0)[0]))
    if isinstance(without, Exception):
        return 1, f"1: the server refused logprobs=0 ({str(without)[:120]})"
    if with_top.shape != without.shape or not np.allclose(with_top, without, atol=1e-4):
        return 1, "1: the server's echoed log-probs differ at logprobs=0"
    return 0, "0: the server echoes the prompt's log-probs without alternatives"


def probe_echo_from(client, logprobs: int) -> tuple[bool, str]:
    """(whether scoring requests send `echo_from`, the finding): our own server's extension (docs/http.md), by which
    it computes log-probs from the continuation's first token on (the LM head at those positions alone, as the local
    backend scores) and echoes null before it. Sent only where a probe pair comes back with nulls before its
    continuation and the continuation's own numbers (1e-4); another server is never sent the field. logprobs: the
    scoring requests' `logprobs`."""
    if not client.token_prompts:
        return False, "not sent: text prompts (a token index means nothing to the server's own tokens)"
    try:
        ids, n = client.prepare_prompt(PROBE_TEXT[:24], PROBE_TEXT[24:40])
    except ValueError:  # a window too small for the probe pair
        return False, "not sent: not probed (the server's window is too small for the probe pair)"
    start = len(ids) - n

    def from_start():
        choice = client.completions([ids], client.score_max_tokens, logprobs, True, 0, [start], echo_from=True)[0]
        return id_prompt_values(choice, len(ids), client.leading, client.score_max_tokens, client.prompt_logprobs)

    whole, values = side_by_side(lambda: client.score_chunk([(ids, n)], probing=True, logprobs=logprobs)[0],
                                 lambda: _or_failure(from_start))
    if isinstance(values, Exception):
        return False, f"not sent: the server refused it ({str(values)[:120]})"
    if any(v is not None for v in values[:start]):
        return False, "not sent: the server ignores it (every prompt token's log-prob is computed)"
    if any(v is None for v in values[start:]) or not np.allclose(values[start:], whole, atol=1e-4):
        return False, "not sent: the server answered it with other numbers than a whole echo"
    return True, "sent: the server computes each prompt's log-probs from its continuation on"


def probe_token_ids(client) -> tuple[bool, str]:
    """(whether generation asks for tokens by id, the finding): vLLM's `return_tokens_as_token_ids` (our server
    honours it too), by which every generated token and top entry is named "token_id:N". A token's own text may be
    part of a character beyond ASCII (byte-level BPE splits them), so a client that mixes and appends token texts
    loses those bytes; by id, nothing is lost and the text is decoded here as the sequence grows. Asked where the
    client sends token-id prompts and can decode ids, and kept where a two-token continuation comes back with every
    token and top entry labelled and the labels decode to the server's own text."""
    from replug_jax.lm.http.generation import TOKEN_ID_LABEL, completion_body, label_id, pass_prompt

    if not client.token_prompts:
        return False, "texts: text prompts"
    if not hasattr(client.tokenizer, "decode"):
        return False, "texts: the client cannot decode ids (no local tokenizer, no /detokenize)"
    prompt = pass_prompt(client, "", PROBE_TEXT, 2)
    body = completion_body(client, prompt, 2, 2, token_ids=True)
    try:
        reply = client.transport.post(client.base_url + "/completions", body, optional=True, retries=0)
        choice = reply["choices"][0]
        tokens, tops = choice["logprobs"]["tokens"], choice["logprobs"]["top_logprobs"]
        ids = [label_id(t) for t in tokens]
        labelled = bool(tokens) and all(i is not None for i in ids) and all(
            all(k.startswith(TOKEN_ID_LABEL) for k in top) for top in tops)
        same_text = labelled and client.tokenizer.decode(ids) == choice["text"]
    except (Refused, BlackBoxServerError, KeyError, IndexError, TypeError, AttributeError, ValueError) as e:
        return False, f"texts: tokens by id are not usable here ({str(e)[:120]})"
    if not labelled:
        return False, "texts: the server ignores return_tokens_as_token_ids (a character split over tokens may be lost)"
    if not same_text:
        return False, "texts: the server's token ids decode here to another text than its own"
    return True, "ids: the server names tokens by id (return_tokens_as_token_ids), decoded here as the answer grows"

