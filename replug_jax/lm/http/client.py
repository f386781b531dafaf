"""The HTTP backend of the black-box LM contract: OpenAI-compatible `/v1/completions` servers.

    lm = HTTPLM("http://127.0.0.1:8000/v1", tokenizer=tok)   # or rj.load_lm(url, tokenizer="smollm2")
    lps = lm.score(["The capital of France is"], [" Paris."])
    lm.stats()   # {"requests", "retries", "failures", "prompts", "prompt_format", "alignment", ...}

A pair is scored with the contract's one rule (`replug_jax.lm.blackbox`) whenever the client has
the model's tokenizer and the server takes token-id prompts (the probe checks both): the prompt
is `context ids + continuation ids`, cut from the left to the server's window, and the last
len(continuation ids) echoed log-probs are the answer, equal to LocalLM's for any split. The request asks
`echo=True, logprobs=0` (1 where the probe sees the server need it; vLLM's `prompt_logprobs` form with
`prompt_logprobs=True`) and `max_tokens=0`, or 1 where the server refuses 0 (the generated token is dropped), and
`echo_from` (the continuation's first token) where the probe finds the server computes only the log-probs asked
for (our server's extension, docs/http.md).

Without a local tokenizer the server's own `/tokenize` builds the token-id prompts (`tokenization.py`;
`stats()["tokenizer"]` says which), so exact scores are the default. Fallback, stated in `stats()["prompt_format"]`:
for a server with neither `/tokenize` nor token prompts, the text `context + continuation` is sent, and the
continuation's tokens are the server's tokens that end after the boundary (a token straddling it counts as a
continuation token); the context is then cut by the local tokenizer when there is one, else not at all (an
over-long prompt is the server's 4xx, raised as `BlackBoxServerError`).

Empty contexts: the document-start token (LocalLM's choice), or the server's own start token when
it conditions the first prompt token on one. Every response is validated (`echo`); requests
are retried and counted (`transport`). No JAX is imported here.
"""
from __future__ import annotations

import hashlib
import json
import threading
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Sequence

import numpy as np

from replug_jax.lm.blackbox import (
    check_pairs,
    check_query_triples,
    continuation_ids,
    pair_token_ids,
    query_token_ids,
    split_query_scores,
)
from replug_jax.lm.http.echo import (
    Echo,
    continuation_array,
    id_prompt_values,
    parse_prompt_logprobs,
    parse_text_echo,
    select_continuation,
    top_scores,
)
from replug_jax.lm.http.generation import http_generate
from replug_jax.lm.http.probe import BATCH_PROMPTS, probe_requests  # noqa: F401 (BATCH_PROMPTS: re-exported)
from replug_jax.lm.http.transport import BlackBoxServerError, Transport
from replug_jax.lm.http.context_room import cut_text_context, generation_room, score_window, scoring_room
from replug_jax.models.tokenizer import TextTokenizer, document_start_id, document_start_text, tokenizer_fingerprint

__all__ = ["HTTPLM", "BlackBoxServerError"]


class HTTPLM:
    """An OpenAI-compatible completions server behind `score(contexts, continuations)`.

    tokenizer: the model's tokenizer (a TextTokenizer; `rj.load_lm` resolves names): token-id prompts.
    max_length: the server's window in tokens (default: what `/models` says). token_prompts: None lets
    the probe decide, False forces text prompts, True makes a refusal an error. prompts_per_request: prompts
    sent in one completions request (the API takes a list); None lets the probe decide (up to
    `BATCH_PROMPTS` where the server answers a list with the same numbers as one prompt at a time, else 1)."""

    def __init__(self, base_url: str, model: str | None = None, *, api_key_env: str = "OPENAI_API_KEY",
                 concurrency: int = 8, timeout: float = 60, max_retries: int = 5, backoff: float = 0.5,
                 tokenizer: TextTokenizer | None = None, probe: bool = True, prompt_logprobs: bool = False,
                 prompts_per_request: int | None = None, logprobs: int | None = None,
                 start_text: str | None = None, max_length: int | None = None, token_prompts: bool | None = None):
        if tokenizer is not None and not isinstance(tokenizer, TextTokenizer):
            raise TypeError("tokenizer must be a TextTokenizer (rj.load_lm resolves names), got "
                            f"{type(tokenizer).__name__}")
        self.transport = Transport(base_url, api_key_env=api_key_env, timeout=timeout, max_retries=max_retries,
                                   backoff=backoff)
        self.base_url = self.transport.base_url
        self.model, self.tokenizer, self.name = model, tokenizer, model or self.base_url
        if prompts_per_request is not None and prompts_per_request < 1:
            raise ValueError(f"prompts_per_request must be at least 1 (or None: probed), got {prompts_per_request}")
        self.concurrency, self._logprobs_setting, self.logprobs = concurrency, logprobs, 1 if logprobs is None else \
            logprobs  # None: the probe decides (0 where the server allows it)
        self._batch_setting, self.prompts_per_request = prompts_per_request, prompts_per_request or 1
        self.prompt_logprobs, self.token_prompts, self.max_length = prompt_logprobs, token_prompts, max_length
        self.start_id = document_start_id(tokenizer) if tokenizer is not None else None
        self.start_text = start_text if start_text is not None else document_start_text(tokenizer)
        self.score_max_tokens, self._start, self._leading, self.top_logprobs = 1, None, 0, 5  # 5: OpenAI's cap
        self._findings: dict = {"alignment": "not probed", "prompt_format": "text (not probed)"}
        self.lookahead = False  # generation: each pass's own continuation in one request (the probe checks it)
        self.echo_from = False  # scoring: only the continuation's log-probs computed (`echo_from`; the probe checks it)
        self.token_ids = False  # generation: tokens named by id (`return_tokens_as_token_ids`; the probe checks it)
        # generation stops at these ids (the model's end of sequence): the local tokenizer's, the server card's, and
        # any a completion showed (`learn_end_token`)
        self.end_ids: frozenset[int] = frozenset() if tokenizer is None or tokenizer.eos_id is None else \
            frozenset([tokenizer.eos_id])
        self._lock = threading.Lock()
        if probe:
            self.probe()

    def __repr__(self) -> str:
        return f"HTTPLM({self.base_url!r}, model={self.model!r})"

    @property
    def timeout(self) -> float:
        return self.transport.timeout

    @timeout.setter
    def timeout(self, seconds: float) -> None:
        self.transport.timeout = seconds

    # ---- the black-box contract -------------------------------------------------------------------------------

    def score(self, contexts: Sequence[str], continuations: Sequence[str], progress: bool = False) -> list[np.ndarray]:
        """log p of each continuation token given its context: a list of float32 [T_i] (module docstring)."""
        check_pairs(contexts, continuations)
        items = [self.prepare_prompt(c, y) for c, y in zip(contexts, continuations)]  # every error before any request
        return self._score_items(items, progress)

    @property
    def gives_top_tokens(self) -> bool:
        """Whether a scoring request also gives each continuation position's top tokens from the same pass, by id:
        token-id prompts, `echo_from` honoured and tokens named by id (our server; the probe checks each)."""
        return bool(self.token_prompts and self.echo_from and self.token_ids and not self.prompt_logprobs)

    @property
    def score_top(self):
        """`score` with each continuation position's `top` most probable next tokens (`TopScores`, lm/blackbox.py),
        from the scoring request itself (`logprobs=top`); only where `gives_top_tokens` (callers look: `hasattr`)."""
        if not self.gives_top_tokens:
            raise AttributeError(f"{self.base_url}: this server's scoring gives no top tokens by id from the scoring "
                                 "pass (token-id prompts, echo_from and tokens named by id are needed)")
        return self._score_top

    def _score_top(self, contexts: Sequence[str], continuations: Sequence[str], top: int,
                   progress: bool = False) -> list:
        check_pairs(contexts, continuations)
        items = [self.prepare_prompt(c, y) for c, y in zip(contexts, continuations)]
        return self._score_items(items, progress, top)

    def score_with_query(self, contexts: Sequence[str], queries: Sequence[str], continuations: Sequence[str],
                         prefix: str = "", progress: bool = False, top: int = 0) -> list[tuple[np.ndarray, object]]:
        """(log p of each query token, of each continuation token) from one echoed prompt `context ∘ query ∘
        continuation` per triple (the contract's `score_with_query`, token-id prompts only). `top` > 0 (where
        `gives_top_tokens`): the continuation's part as a `TopScores` (`score_top`), from that request too."""
        if top and not self.gives_top_tokens:
            self.score_top  # noqa: B018 - raises, naming what the server lacks
        check_query_triples(contexts, queries, continuations)
        if not self.token_prompts:
            raise BlackBoxServerError(f"{self.base_url}: log p(query | passage) needs token-id prompts, and this "
                                      f"server is scored with text prompts ({self._findings.get('prompt_format')}); "
                                      "use the method replug (retrieval weights only) with this server")
        window = score_window(self)
        triples = [query_token_ids(self.tokenizer, c, q, y, window, self.start_id, prefix)
                   for c, q, y in zip(contexts, queries, continuations)]
        own_start = self._start == "server" and self._leading  # an empty context: the server's start token
        items = [(([] if own_start and not c and not prefix else ctx) + q + y, len(q) + len(y))
                 for c, (ctx, q, y) in zip(contexts, triples)]
        scored = self._score_items(items, progress, top)
        if top:
            return [(x.logprobs[: len(q)], x.tail(len(q))) for x, (_, q, _) in zip(scored, triples)]
        return split_query_scores(scored, [len(q) for _, q, _ in triples])

    def _score_items(self, items: list, progress: bool, top: int = 0) -> list:
        """Prepared prompts scored in chunks of `prompts_per_request`, `concurrency` requests at a time (`top` > 0:
        as `TopScores`)."""
        chunks = [list(range(i, min(i + self.prompts_per_request, len(items))))
                  for i in range(0, len(items), self.prompts_per_request)]
        out: list[np.ndarray | None] = [None] * len(items)
        from replug_jax.base.progress import tqdm

        pool = ThreadPoolExecutor(max(1, self.concurrency))
        try:
            futures = {pool.submit(self.score_chunk, [items[i] for i in chunk], top=top): chunk for chunk in chunks}
            for future in tqdm(as_completed(futures), total=len(futures), disable=not progress, desc="http score",
                               unit="req"):
                for i, lps in zip(futures[future], future.result()):
                    out[i] = lps
        finally:
            pool.shutdown(wait=True, cancel_futures=True)  # on an error, nothing partial is returned
        return out  # type: ignore[return-value]

    def generate(self, contexts, log_weights, *, max_new_tokens: int, stop=("\n",), shared_prefix: str = "",
                 top_n: int | None = None, progress: bool = False, on_answer=None):
        """REPLUG's ensembled greedy decoding through the server (generation.py): a per-token mixture over each
        pass's top-n next tokens (at most the probe's `top_logprobs`: 20, or OpenAI's 5), or one pass in one request.
        `on_answer(question, Generation)`: called as each question's answer completes."""
        top = self.top_logprobs if top_n is None else min(top_n, self.top_logprobs)
        return http_generate(self, contexts, log_weights, max_new_tokens=max_new_tokens, stop=stop,
                             shared_prefix=shared_prefix, top_n=top, on_answer=on_answer, progress=progress)

    def generation_room(self, prefix: str, max_new_tokens: int) -> int | None:
        """Context tokens `generate` keeps after `prefix` (None with text prompts): windows.py."""
        return generation_room(self, prefix, max_new_tokens)

    def scoring_room(self, continuation: str) -> int | None:
        """Context tokens `score` keeps before `continuation` (None with text prompts): windows.py."""
        return scoring_room(self, continuation)

    @property
    def leading(self) -> int:
        """Entries the server echoes before a token-id prompt's own (its start token): they use window room."""
        return self._leading

    def count_tokens(self, text: str) -> int:
        """Tokens of `text`: the local tokenizer when given, else the server's /tokenize."""
        if self.tokenizer is None:
            raise NotImplementedError(f"{self.base_url}: no local tokenizer and the server has no /tokenize; "
                                      "pass tokenizer=")
        return len(self.tokenizer.encode(text))

    def fingerprint(self) -> str:
        """What changes a score here: server, model, window, how prompts are sent and the tokenizer that builds
        token-id prompts (not the remote weights)."""
        key = [self.base_url, self.model, self.max_length, self._findings.get("prompt_format"), self._start,
               self.start_text, self._leading, self._tokenizer_fingerprint(), self.token_ids]
        return hashlib.sha256(json.dumps(key, default=str).encode()).hexdigest()[:16]

    def _tokenizer_fingerprint(self) -> str:
        tok = self.tokenizer
        return tokenizer_fingerprint(tok) if tok is None or isinstance(tok, TextTokenizer) else tok.fingerprint()

    def probe(self) -> dict:
        """Probe the server (`replug_jax.lm.http.probe`) and apply what it found; returns the findings."""
        from replug_jax.lm.http.probe import probe

        self.transport.check_listening()  # a dead address fails in about a second, named
        if self.tokenizer is None and self.token_prompts is not False:  # exact scores need no local tokenizer
            from replug_jax.lm.http.tokenization import ServerTokenizer

            self.tokenizer = ServerTokenizer.connect(self)
            if self.tokenizer is not None and self.start_id is None:
                self.start_id = self.tokenizer.bos_id  # empty contexts: the server tokenizer's start token
        result = probe(self)
        self.model = result.model
        self.max_length = self.max_length or result.max_length
        self.score_max_tokens, self._start, self.start_text = result.max_tokens, result.start, result.start_text
        self.token_prompts, self._leading, self.top_logprobs = result.token_prompts, result.leading, result.top_logprobs
        asked = probe_requests(self, self._logprobs_setting, self._batch_setting)  # logprobs: 0 where allowed
        self.logprobs, self.prompts_per_request, self.echo_from = asked.logprobs, asked.prompts_per_request, \
            asked.echo_from
        self.lookahead, self.token_ids = asked.lookahead, asked.token_ids
        self.end_ids |= frozenset(result.end_ids)
        if self.tokenizer is not None and self.tokenizer.eos_id is None and result.end_ids:
            self.tokenizer.eos_id = result.end_ids[0]  # the server's /tokenize: its model card's end token
        with self._lock:
            self._findings = {**result.findings, "tokenizer": self._tokenizer_kind(), **asked.findings,
                              "end_of_sequence": self._end_finding(result.end_ids)}
        return self._findings

    def _end_finding(self, announced) -> str:
        if announced:
            return f"token ids {sorted(self.end_ids)} (the server's /models card names {list(announced)})"
        if self.end_ids:
            return f"token ids {sorted(self.end_ids)} (the local tokenizer's)"
        return ("learned from completions the server ends itself (its /models card names no end token, and no "
                "local tokenizer was given)")

    def learn_end_token(self, token_id: int) -> None:
        """Take `token_id` as an end-of-sequence token of the served model from here on (a completion the server
        ended at it: lm/http/generation.py)."""
        with self._lock:
            if token_id in self.end_ids:
                return
            self.end_ids |= {int(token_id)}
            self._findings["end_of_sequence"] = (f"token ids {sorted(self.end_ids)} (learned from completions the "
                                                 "server ended itself; its /models card names none)")
        self.transport.count("end_tokens_learned")

    def _tokenizer_kind(self) -> str:
        if self.tokenizer is None:
            return "none: text prompts (no tokenizer given and the server has no /tokenize)"
        return "local" if isinstance(self.tokenizer, TextTokenizer) else "the server's /tokenize"

    def stats(self) -> dict:
        """Counters (requests, retries, failures, prompts) and the probe's findings, prompt_format included."""
        with self._lock:
            return {**self.transport.stats(), **self._findings}

    # ---- requests: public for the probe -----------------------------------------------------------------------

    def body(self, prompts: list, max_tokens: int, logprobs: int, starts: list[int] | None = None,
             echo_from: bool | None = None, token_ids: bool = False) -> dict:
        """A completions request body; prompts are texts or token-id lists; `starts`: per prompt, the first token
        whose log-prob is needed, sent as `echo_from` where the probe found the server honours it (`echo_from`:
        that setting, None for the client's own)."""
        body: dict = {"prompt": prompts[0] if len(prompts) == 1 else prompts, "max_tokens": max_tokens,
                      "temperature": 0}
        if starts is not None and (self.echo_from if echo_from is None else echo_from):
            body["echo_from"] = starts
        if self.model:
            body["model"] = self.model
        if token_ids:  # top entries named by id ("token_id:N")
            body["return_tokens_as_token_ids"] = True
        if self.prompt_logprobs:
            body.update(prompt_logprobs=0, max_tokens=max(1, max_tokens))
        else:
            body.update(echo=True, logprobs=logprobs)
        return body

    def completions(self, prompts: list, max_tokens: int, logprobs: int, optional: bool = False,
                    retries: int | None = None, starts: list[int] | None = None,
                    echo_from: bool | None = None, token_ids: bool = False) -> list[dict]:
        """POST /completions; the choices in prompt order (their count checked). optional, retries: as
        `Transport.post` (optional with retries=0: one try, and any failure raises `Refused`); starts, echo_from,
        token_ids: as `body`."""
        body = self.body(prompts, max_tokens, logprobs, starts, echo_from, token_ids)
        reply = self.transport.post(self.base_url + "/completions", body, optional=optional, retries=retries)
        try:
            choices = sorted(reply["choices"], key=lambda c: c.get("index", 0))
        except (KeyError, TypeError, AttributeError) as e:
            raise self._failure(f"malformed completions response ({type(e).__name__}: {e})", optional) from None
        if len(choices) != len(prompts):
            raise self._failure(f"{len(choices)} choices for {len(prompts)} prompts", optional)
        return choices

    def parse_text(self, choice: dict, prompt: str) -> Echo:
        return parse_prompt_logprobs(choice, prompt) if self.prompt_logprobs else parse_text_echo(choice, prompt)

    def text_echoes(self, prompts: list[str], max_tokens: int, logprobs: int, optional: bool = False,
                    retries: int | None = None) -> list[Echo]:
        """Text prompts echoed, each as an Echo in prompt coordinates."""
        choices = self.completions(prompts, max_tokens, logprobs, optional, retries)
        try:
            return [self.parse_text(c, p) for c, p in zip(choices, prompts)]
        except (BlackBoxServerError, KeyError, TypeError, AttributeError) as e:
            raise self._failure(str(e), optional) from None

    # ---- scoring ----------------------------------------------------------------------------------------------

    def prepare_prompt(self, context: str, continuation: str):
        """A token-id prompt (ids, continuation length) or a text prompt (text, boundary offset)."""
        window = score_window(self)
        if self.token_prompts:
            if not context and self._start == "server" and self._leading:  # its own start token conditions it
                cont = continuation_ids(self.tokenizer, continuation, window)
                return cont, len(cont)
            ctx, cont = pair_token_ids(self.tokenizer, context, continuation, window, self.start_id)
            return ctx + cont, len(cont)
        if isinstance(self.tokenizer, TextTokenizer) and window:  # cut by the local tokens
            context = cut_text_context(self.tokenizer, context, continuation, window)
        if context:
            return context + continuation, len(context)
        if self._start == "text":
            return self.start_text + continuation, len(self.start_text)
        if self._start == "server":
            return continuation, 0
        raise ValueError(f"{self.base_url}: an empty context cannot be scored: the server gives no log-probability to "
                         "the first prompt token (it adds no start-of-document token) and no start_text is usable "
                         f"({self._findings.get('start', 'not probed')}); pass start_text=")

    def score_chunk(self, items: list, probing: bool = False, logprobs: int | None = None,
                    top: int = 0) -> list[np.ndarray]:
        """One request's scores; probing: one try, a refusal or failure raises `Refused`, prompts not counted;
        logprobs: the request's `logprobs` (None: the client's probed setting); top > 0 (token-id prompts): the
        continuations' top tokens too, up to the server's cap (`TopScores`, `echo.top_scores`)."""
        prompts = [p for p, _ in items]
        retries = 0 if probing else None
        logprobs = min(top, self.top_logprobs) if top else self.logprobs if logprobs is None else logprobs
        if self.token_prompts:  # each prompt's log-probs are read from its continuation's (query's) first token on
            starts = [len(ids) - n for ids, n in items]
            choices = self.completions(prompts, self.score_max_tokens, logprobs, probing, retries, starts,
                                       token_ids=bool(top))
        else:
            echoes = self.text_echoes(prompts, self.score_max_tokens, logprobs, probing, retries)
        if not probing:
            self.transport.count("prompts", len(prompts))
        try:
            if self.token_prompts and top:
                return [self._select_top(c, ids, n, top) for c, (ids, n) in zip(choices, items)]
            if self.token_prompts:
                return [self._select_ids(c, ids, n) for c, (ids, n) in zip(choices, items)]
            return [select_continuation(e, p, b) for e, (p, b) in zip(echoes, items)]
        except (BlackBoxServerError, KeyError, TypeError, AttributeError) as e:
            raise self._failure(str(e), probing) from None

    def _select_ids(self, choice: dict, ids: list[int], n: int) -> np.ndarray:
        values = id_prompt_values(choice, len(ids), self._leading, self.score_max_tokens, self.prompt_logprobs)
        return continuation_array(values[-n:], first_is_prompt_start=n == len(ids) and self._leading == 0)

    def _select_top(self, choice: dict, ids: list[int], n: int, top: int):
        entries = (choice["logprobs"].get("top_logprobs") or [])[self._leading : self._leading + len(ids)]
        if len(entries) != len(ids):
            raise BlackBoxServerError(f"echoed {len(entries)} top entries for a prompt of {len(ids)} token ids")
        return top_scores(self._select_ids(choice, ids, n), ids[len(ids) - n :], entries[len(ids) - n :], top)

    def _failure(self, message: str, optional: bool = False) -> BlackBoxServerError:
        if not optional:
            self.transport.count("failures")
        return BlackBoxServerError(self.transport.redact(f"{self.base_url}: {message}"))

