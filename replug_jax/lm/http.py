"""The HTTP backend of the black-box LM contract: OpenAI-compatible `/v1/completions` servers.

    lm = HTTPLM("http://127.0.0.1:8000/v1")            # or rj.load_lm("http://127.0.0.1:8000/v1")
    lps = lm.score(["The capital of France is"], [" Paris."])
    lm.stats()                                           # {"requests": .., "retries": .., "failures": .., ...}

How a pair is scored. The text `context + continuation` is sent as the prompt with
`echo=True, logprobs=1, max_tokens=0` (vLLM's `prompt_logprobs` form with `prompt_logprobs=True`).
The server tokenises it and echoes, per prompt token, its text, its character offset and
log p(token | tokens before it). The continuation's tokens are the SERVER's tokens, chosen by
character offset: a token belongs to the continuation when it ends after the boundary
(len(context)). A server token that straddles the boundary (the context's last characters
merged with the continuation's first) therefore counts as a continuation token, conditioned on
the context without those characters. So token counts are the server's own, and bits per byte
(log-probs summed over the continuation's bytes) stays comparable across backends. Unlike
LocalLM, which tokenises context and continuation apart, the server tokenises the joined text;
at a word boundary (" Paris" after "is") both give the same tokens.

Empty contexts and `max_tokens` follow what the probe (`replug_jax.lm.http_probe`, run on
construction unless `probe=False`) found: an empty context is sent as the continuation alone when
the server conditions the first prompt token on a start token it adds itself, after a
document-start text the server reads as one token otherwise (`start_text`, by default the
tokenizer's document-start token, LocalLM's choice), and is an error without one. Requests carry
`max_tokens=0` only once the probe has seen the server read it as "no new tokens"; else
`max_tokens=1` and the generated token is dropped (it starts at the end of the prompt).

Every response is validated: prompt log-probs present (null only for the first token), one offset
and one log-prob per echoed token, offsets monotonic and covering the prompt; missing or null
log-probs raise `BlackBoxServerError`, never a silently wrong score.

Requests: `prompts_per_request` prompts per request (1 works everywhere; llama-cpp-python
refuses lists), up to `concurrency` in flight, retried with exponential backoff on timeouts,
connection errors, 429 and 5xx (Retry-After honoured), never on other 4xx. The API key is read
from the environment variable `api_key_env`, sent as a Bearer token, and kept out of logs and
error messages.

vLLM's `prompt_logprobs` form carries no text offsets: they are rebuilt by matching each
`decoded_token` against the prompt, so a prompt whose tokens split a character cannot be aligned
and raises. Contexts are not cut to the server's window: an over-long prompt is the server's
4xx, raised as `BlackBoxServerError` with its message.

count_tokens: the local `tokenizer` when given, else the server's vLLM-style `POST /tokenize`.
"""
from __future__ import annotations

import dataclasses
import email.utils
import http.client
import json
import math
import os
import random
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Sequence

import numpy as np

from replug_jax.lm.blackbox import check_pairs
from replug_jax.lm.local import document_start_id
from replug_jax.models.tokenizer import TextTokenizer

MAX_DELAY = 60.0  # seconds, cap on backoff and Retry-After


class BlackBoxServerError(RuntimeError):
    """A server that cannot be used, or a request that failed for good; the message says which."""


@dataclasses.dataclass
class _Echo:
    """A prompt's tokens as the server echoed them, in prompt character coordinates."""

    tokens: list[str]
    starts: list[int]  # [n] start offsets; token i spans [starts[i], ends[i])
    ends: list[int]
    logprobs: list[float | None]
    top: list[dict | None] | None


class HTTPLM:
    """An OpenAI-compatible completions server behind `score(contexts, continuations)`."""

    def __init__(self, base_url: str, model: str | None = None, *, api_key_env: str = "OPENAI_API_KEY",
                 concurrency: int = 8, timeout: float = 60, max_retries: int = 5, backoff: float = 0.5,
                 tokenizer: TextTokenizer | str | None = None, probe: bool = True, prompt_logprobs: bool = False,
                 prompts_per_request: int = 1, logprobs: int = 1, start_text: str | None = None):
        parts = urllib.parse.urlsplit(base_url.rstrip("/"))
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"{base_url!r} is not an http(s) URL")
        path = parts.path if parts.path not in ("", "/") else "/v1"
        self.base_url = urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))
        self.root_url = urllib.parse.urlunsplit((parts.scheme, parts.netloc, re.sub(r"/v1$", "", path), "", ""))
        if isinstance(tokenizer, str):
            from replug_jax.api import load_tokenizer

            tokenizer = load_tokenizer(tokenizer)
        self.model, self.tokenizer, self.name = model, tokenizer, model or self.base_url
        self.concurrency, self.timeout, self.max_retries, self.backoff = concurrency, timeout, max_retries, backoff
        self.prompt_logprobs, self.prompts_per_request, self.logprobs = prompt_logprobs, prompts_per_request, logprobs
        self._api_key = os.environ.get(api_key_env) or None
        self.start_text = start_text if start_text is not None else _document_start_text(tokenizer)
        self.max_length: int | None = None
        self._max_tokens = 1  # 0 once the probe has seen the server accept it
        self._start: str | None = None  # "server": it conditions the first token itself; "text": send start_text
        self._lock = threading.Lock()
        self._stats = {"requests": 0, "retries": 0, "failures": 0, "prompts": 0}
        self._probe_info: dict = {"alignment": "not probed"}
        if probe:
            self.probe()

    def __repr__(self) -> str:
        return f"HTTPLM({self.base_url!r}, model={self.model!r})"

    # ---- the black-box contract -------------------------------------------------------------------------------

    def score(self, contexts: Sequence[str], continuations: Sequence[str], progress: bool = False) -> list[np.ndarray]:
        """log p of each continuation token (the server's tokens) given its context: a list of float32 [T_i]."""
        check_pairs(contexts, continuations)
        items = [self._prompt(c, y) for c, y in zip(contexts, continuations)]
        chunks = [list(range(i, min(i + self.prompts_per_request, len(items))))
                  for i in range(0, len(items), self.prompts_per_request)]
        out: list[np.ndarray | None] = [None] * len(items)
        from tqdm.auto import tqdm

        pool = ThreadPoolExecutor(max(1, self.concurrency))
        try:
            futures = {pool.submit(self._score_chunk, [items[i] for i in chunk]): chunk for chunk in chunks}
            for future in tqdm(as_completed(futures), total=len(futures), disable=not progress, desc="http score",
                               unit="req"):
                for i, lps in zip(futures[future], future.result()):
                    out[i] = lps
        finally:
            pool.shutdown(wait=True, cancel_futures=True)  # on an error, nothing partial is returned
        return out  # type: ignore[return-value]

    def count_tokens(self, text: str) -> int:
        """Tokens of `text`: the local tokenizer when given, else the server's vLLM-style /tokenize."""
        if self.tokenizer is not None:
            return len(self.tokenizer.encode(text))
        body = {"prompt": text, "add_special_tokens": False, **({"model": self.model} if self.model else {})}
        try:
            reply = self._post(self.root_url + "/tokenize", body, optional=True)
        except _Refused as e:
            raise NotImplementedError(f"{self.base_url}: no local tokenizer and the server has no /tokenize "
                                      f"({e}); pass tokenizer=") from None
        return int(reply["count"]) if "count" in reply else len(reply["tokens"])

    def probe(self) -> dict:
        """Check the server on a probe text (see `replug_jax.lm.http_probe`); raise BlackBoxServerError naming
        what is wrong. Returns the findings, also kept in `stats()`."""
        from replug_jax.lm.http_probe import probe  # that module builds on this one

        return probe(self)

    def stats(self) -> dict:
        """Counters for results: HTTP requests sent, retries, requests failed for good, prompts scored; probe findings."""
        with self._lock:
            return {**self._stats, **self._probe_info}

    # ---- requests ---------------------------------------------------------------------------------------------

    def _prompt(self, context: str, continuation: str) -> tuple[str, int]:
        """(prompt text, boundary offset) for one pair."""
        if context:
            return context + continuation, len(context)
        if self._start == "text":
            return self.start_text + continuation, len(self.start_text)
        if self._start == "server":
            return continuation, 0
        raise ValueError(f"{self.base_url}: an empty context cannot be scored: the server gives no log-probability to "
                         "the first prompt token (it adds no start-of-document token) and no start_text is usable "
                         f"({self._probe_info.get('start', 'not probed')}); pass start_text=")

    def _body(self, prompts: list[str], max_tokens: int, logprobs: int) -> dict:
        body: dict = {"prompt": prompts[0] if len(prompts) == 1 else prompts, "max_tokens": max_tokens,
                      "temperature": 0}
        if self.model:
            body["model"] = self.model
        if self.prompt_logprobs:
            body.update(prompt_logprobs=0, max_tokens=max(1, max_tokens))
        else:
            body.update(echo=True, logprobs=logprobs)
        return body

    def _score_chunk(self, items: list[tuple[str, int]]) -> list[np.ndarray]:
        prompts = [p for p, _ in items]
        echoes = self._echo(prompts, self._max_tokens, self.logprobs)
        with self._lock:
            self._stats["prompts"] += len(prompts)
        try:
            return [self._select(e, prompt, boundary) for e, (prompt, boundary) in zip(echoes, items)]
        except BlackBoxServerError as e:
            self._count("failures")
            raise BlackBoxServerError(f"{self.base_url}: {e}") from None

    def _echo(self, prompts: list[str], max_tokens: int, logprobs: int, optional: bool = False) -> list[_Echo]:
        reply = self._post(self.base_url + "/completions", self._body(prompts, max_tokens, logprobs), optional=optional)
        try:
            choices = sorted(reply["choices"], key=lambda c: c.get("index", 0))
            if len(choices) != len(prompts):
                raise BlackBoxServerError(f"{len(choices)} choices for {len(prompts)} prompts")
            return [self._parse(c, p) for c, p in zip(choices, prompts)]
        except BlackBoxServerError as e:
            if not optional:
                self._count("failures")
            raise BlackBoxServerError(f"{self.base_url}: {e}") from None
        except (KeyError, TypeError, AttributeError) as e:
            if not optional:
                self._count("failures")
            raise BlackBoxServerError(f"{self.base_url}: malformed completions response ({type(e).__name__}: {e})") from None

    def _headers(self) -> dict:
        headers = {"Content-Type": "application/json", "User-Agent": "replug_jax"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        return headers

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._stats[key] += n

    def _redact(self, text: str) -> str:
        return text.replace(self._api_key, "***") if self._api_key else text

    def _get(self, url: str) -> dict:
        return self._post(url, None, optional=True)

    def _post(self, url: str, body: dict | None, optional: bool = False) -> dict:
        """JSON request with retries. optional: a 4xx raises _Refused and is not counted as a failure."""
        data = None if body is None else json.dumps(body).encode()
        for attempt in range(self.max_retries + 1):
            self._count("requests")
            retry_after = None
            try:
                request = urllib.request.Request(url, data=data, headers=self._headers(), method="GET" if data is None else "POST")
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    raw = response.read()
                try:
                    return json.loads(raw)
                except ValueError:
                    self._count("failures")
                    raise BlackBoxServerError(self._redact(f"{url}: response is not JSON: {raw[:200]!r}")) from None
            except urllib.error.HTTPError as e:
                detail = _excerpt(e)
                if e.code != 429 and e.code < 500:
                    if optional:
                        raise _Refused(self._redact(f"HTTP {e.code}: {detail}")) from None
                    self._count("failures")
                    raise BlackBoxServerError(self._redact(f"{url}: HTTP {e.code} (not retried): {detail}")) from None
                what, retry_after = f"HTTP {e.code}: {detail}", _retry_after(e.headers.get("Retry-After"))
            except (TimeoutError, urllib.error.URLError, http.client.HTTPException, ConnectionError, OSError) as e:
                reason = getattr(e, "reason", e)
                what = f"{type(e).__name__}: {reason}" if not isinstance(reason, TimeoutError) else f"timed out after {self.timeout}s"
            if attempt == self.max_retries:
                break
            self._count("retries")
            delay = retry_after if retry_after is not None else self.backoff * 2**attempt * (1 + 0.1 * random.random())
            time.sleep(min(delay, MAX_DELAY))
        self._count("failures")
        raise BlackBoxServerError(self._redact(f"{url}: failed after {self.max_retries} retries; last error: {what}"))

    # ---- responses --------------------------------------------------------------------------------------------

    def _parse(self, choice: dict, prompt: str) -> _Echo:
        """One choice -> _Echo in prompt coordinates, structure checked; generated tokens dropped."""
        if self.prompt_logprobs:
            return _parse_prompt_logprobs(choice, prompt)
        lp = choice.get("logprobs")
        if not lp or not lp.get("token_logprobs"):
            raise BlackBoxServerError("returned no prompt log-probabilities (logprobs missing from the response)")
        tokens, offsets, values = lp.get("tokens"), lp.get("text_offset"), lp["token_logprobs"]
        top = lp.get("top_logprobs")
        if tokens is None or offsets is None or len(tokens) != len(values) or len(offsets) != len(values):
            raise BlackBoxServerError(f"token count does not match: {len(tokens or [])} tokens, {len(values)} "
                                      f"log-probabilities, {len(offsets or [])} text offsets")
        if any(v is not None and (not isinstance(v, (int, float)) or not math.isfinite(v) or v > 1e-3) for v in values):
            raise BlackBoxServerError("returned log-probabilities that are not finite numbers <= 0")
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
        return _Echo(pick(tokens), pick(starts), pick(ends), pick(values),
                     pick(top) if isinstance(top, list) and len(top) == len(values) else None)

    def _select(self, echo: _Echo, prompt: str, boundary: int) -> np.ndarray:
        """Log-probs of the tokens that end after the boundary: the continuation as the server tokenised it."""
        idx = [i for i, e in enumerate(echo.ends) if e > boundary]
        if not idx:
            raise BlackBoxServerError(f"no echoed token covers the continuation of {prompt[-40:]!r}")
        values = [echo.logprobs[i] for i in idx]
        if any(v is None for v in values):
            first = [i for i, e in enumerate(echo.ends) if e > 0][0]
            if idx[0] == first and values[0] is None and all(v is not None for v in values[1:]):
                raise BlackBoxServerError("returned no log-probability for the prompt's first token, which is the "
                                          "continuation's first token (empty context): the server adds no start token")
            raise BlackBoxServerError(f"returned no log-probability for {sum(v is None for v in values)} of the "
                                      f"{len(values)} continuation tokens")
        out = np.asarray(values, dtype=np.float32)
        if not np.all(np.isfinite(out)) or out.max() > 1e-3:
            raise BlackBoxServerError("returned log-probabilities that are not finite numbers <= 0")
        return out


class _Refused(Exception):
    """A 4xx answer to an optional request (a feature the server does not have)."""


def _document_start_text(tokenizer: TextTokenizer | None) -> str | None:
    """The text of the tokenizer's document-start token (LocalLM's choice), if it encodes back to that one token."""
    if tokenizer is None:
        return None
    tid = document_start_id(tokenizer)
    text = tokenizer.backend.id_to_token(tid) if tid is not None else None
    return text if text and tokenizer.encode(text) == [tid] else None


def _parse_prompt_logprobs(choice: dict, prompt: str) -> _Echo:
    """vLLM's `prompt_logprobs`: [None | {token_id: {logprob, rank, decoded_token}}]; offsets rebuilt from the text.

    The first entry is None; its token's text is what precedes the second token's text (nothing,
    when the second token starts the prompt: then the first is a start token the server added)."""
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
    return _Echo(tokens, starts, starts[1:] + [len(prompt)], values, None)


def _excerpt(error: urllib.error.HTTPError) -> str:
    try:
        body = error.read()[:300].decode("utf-8", "replace")
    except Exception:  # noqa: BLE001 - a body we cannot read is simply not shown
        body = ""
    return " ".join(body.split()) or (error.reason or "")


def _retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (seconds or an HTTP date)."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        try:
            return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
        except (TypeError, ValueError):
            return None
