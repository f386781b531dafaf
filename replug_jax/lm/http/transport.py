"""JSON over HTTP for the black-box client: retries, backoff, counters and a secret API key.

    t = Transport("http://127.0.0.1:8000/v1", api_key_env="OPENAI_API_KEY")
    reply = t.post(t.base_url + "/completions", body)   # dict; raises BlackBoxServerError when it fails for good
    t.stats()                                           # {"requests", "retries", "failures", "prompts"}

Retried with exponential backoff: timeouts, connection errors, 429 and 5xx (Retry-After
honoured); never other 4xx. Before the first request, `check_listening` makes sure something listens at the
address: a dead address (connection refused, unknown host) fails in about a second, naming it, instead of after
the probe's retries. The API key is read from the environment variable `api_key_env`,
sent as a Bearer token, and kept out of logs and error messages. Standard library only.
"""
from __future__ import annotations

import email.utils
import http.client
import itertools
import json
import os
import random
import re
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

from replug_jax.base.errors import InputError

MAX_DELAY = 60.0  # seconds, cap on backoff and Retry-After
LISTEN_TRIES, LISTEN_BACKOFF = 3, 0.25  # a refused first connection: tried again after 0.25 s and 0.5 s, then refused


class BlackBoxServerError(RuntimeError):
    """A server that cannot be used, or a request that failed for good; the message says which."""


class ServerUnreachable(BlackBoxServerError, InputError):
    """Nothing listens at the server's address: the user's input (a URL), so reported in one line."""


class Refused(Exception):
    """A 4xx answer to an optional request (a feature the server does not have)."""


class Transport:
    """POST/GET JSON to one OpenAI-compatible server, with retries and thread-safe counters."""

    def __init__(self, base_url: str, *, api_key_env: str = "OPENAI_API_KEY", timeout: float = 60,
                 max_retries: int = 5, backoff: float = 0.5):
        parts = urllib.parse.urlsplit(base_url.rstrip("/"))
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"{base_url!r} is not an http(s) URL")
        path = parts.path if parts.path not in ("", "/") else "/v1"
        self.base_url = urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))
        self.root_url = urllib.parse.urlunsplit((parts.scheme, parts.netloc, re.sub(r"/v1$", "", path), "", ""))
        self.timeout, self.max_retries, self.backoff = timeout, max_retries, backoff
        self._api_key = os.environ.get(api_key_env) or None
        self._lock = threading.Lock()
        self._stats = {"requests": 0, "retries": 0, "failures": 0, "prompts": 0, "split_characters": 0,
                       "end_tokens_learned": 0}

    def stats(self) -> dict:
        with self._lock:
            return dict(self._stats)

    def count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._stats[key] += n

    def redact(self, text: str) -> str:
        return text.replace(self._api_key, "***") if self._api_key else text

    def check_listening(self, tries: int = LISTEN_TRIES, backoff: float = LISTEN_BACKOFF) -> None:
        """Raise BlackBoxServerError naming the address when nothing listens there: a refused TCP connection (or a
        host name that does not resolve, a network or host that cannot be reached) `tries` times, `backoff`, 2 ×
        `backoff`, ... seconds apart. A timeout is left to the requests' own retries (something may be slow to
        answer); through an HTTP proxy nothing is checked."""
        parts = urllib.parse.urlsplit(self.base_url)
        host, port = parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
        proxies = urllib.request.getproxies()
        if parts.scheme in proxies and not urllib.request.proxy_bypass(host):
            return
        for attempt in range(tries):
            try:
                with socket.create_connection((host, port), timeout=min(self.timeout, 10)):
                    return
            except (ConnectionRefusedError, socket.gaierror) as e:
                last = e
            except OSError as e:  # unreachable network or host: dead as well; a timeout: maybe only slow
                if isinstance(e, TimeoutError) or not isinstance(e.errno, int):
                    return
                last = e
            if attempt + 1 < tries:
                time.sleep(backoff * 2**attempt)
        self.count("failures")
        raise ServerUnreachable(f"{self.base_url}: nothing is listening at {host}:{port} ({type(last).__name__}: "
                                  f"{last}; {tries} tries over {backoff * (2 ** (tries - 1) - 1):.2g} s): start the "
                                  "server, or fix the address")

    def get(self, url: str) -> dict:
        return self.post(url, None, optional=True)

    def post(self, url: str, body: dict | None, optional: bool = False, retries: int | None = None) -> dict:
        """JSON request with retries. optional: a 4xx raises `Refused` and is not counted as a failure; with
        `retries=0` too, so does any failed attempt (a probe of a feature the server may break on: one try). A 429
        (too many requests at once, as the probe's side-by-side requests may get) says nothing of a feature: it is
        waited out, as Retry-After says, up to `max_retries` times even there."""
        data = None if body is None else json.dumps(body).encode()
        retries = self.max_retries if retries is None else retries
        for attempt in itertools.count():  # up to `retries` retries (a 429 raises them to max_retries)
            self.count("requests")
            retry_after = None
            try:
                request = urllib.request.Request(url, data=data, headers=self._headers(),
                                                 method="GET" if data is None else "POST")
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    raw = response.read()
                try:
                    return json.loads(raw)
                except ValueError:
                    self.count("failures")
                    raise BlackBoxServerError(self.redact(f"{url}: response is not JSON: {raw[:200]!r}")) from None
            except urllib.error.HTTPError as e:
                detail = _excerpt(e)
                if e.code != 429 and e.code < 500:
                    if optional:
                        raise Refused(self.redact(f"HTTP {e.code}: {detail}")) from None
                    self.count("failures")
                    raise BlackBoxServerError(self.redact(f"{url}: HTTP {e.code} (not retried): {detail}")) from None
                what, retry_after = f"HTTP {e.code}: {detail}", retry_after_seconds(e.headers.get("Retry-After"))
                if e.code == 429:
                    retries = max(retries, self.max_retries)
            except (TimeoutError, urllib.error.URLError, http.client.HTTPException, ConnectionError, OSError) as e:
                reason = getattr(e, "reason", e)
                what = (f"timed out after {self.timeout}s" if isinstance(reason, TimeoutError)
                        else f"{type(e).__name__}: {reason}")
            if attempt >= retries:
                break
            self.count("retries")
            delay = (retry_after * (1 + 0.5 * random.random()) if retry_after is not None  # jitter: requests told
                     else self.backoff * 2**attempt * (1 + 0.1 * random.random()))  # to wait together part again
            time.sleep(min(delay, MAX_DELAY))
        if optional and retries == 0:
            raise Refused(self.redact(what))
        self.count("failures")
        raise BlackBoxServerError(self.redact(f"{url}: failed after {retries} retries; last error: {what}"))

    def _headers(self) -> dict:
        headers = {"Content-Type": "application/json", "User-Agent": "replug_jax"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        return headers


def _excerpt(error: urllib.error.HTTPError) -> str:
    try:
        body = error.read()[:300].decode("utf-8", "replace")
    except Exception:  # noqa: BLE001 - a body we cannot read is simply not shown
        body = ""
    return " ".join(body.split()) or (error.reason or "")


def retry_after_seconds(value: str | None) -> float | None:
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
