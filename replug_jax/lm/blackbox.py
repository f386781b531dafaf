"""The black-box LM contract: the only thing REPLUG may ask of a language model.

    score(contexts, continuations) -> [np.ndarray of log p(token) per continuation token]

Every backend (`LocalLM`, `HTTPLM` against any OpenAI-compatible server, our own
`replug_jax.serve`) implements `BlackBoxLM` with ONE scoring rule, `pair_token_ids`:

  * the continuation's tokens are the LM tokenizer's tokens of the continuation text alone;
    the context is tokenised apart and the two id lists are concatenated. So the split is
    wherever the caller puts it (mid-word, mid-character cluster, either side of a space):
    every backend scores the same token sequence and returns one value per continuation token.
    Write continuations with their leading space (" Paris", not "Paris") where the text has one;
  * an empty context becomes the tokenizer's document-start token (`document_start_id`), so the
    first continuation token is predicted from a start of document;
  * the context is cut from the LEFT to fit the LM's window (`max_length` tokens in all, counting
    the continuation); a continuation that leaves no room for one context token is a ValueError
    raised before any work is done.

Generation (`generate`, REPLUG's ensembled decoding, §3.2 applied token by token): question b has
K passes, pass i being `shared_prefix ∘ contexts[b][i]` (each part tokenised apart, by the rule
above; the context cut from the left so that the prompt and `max_new_tokens` fit the window). At
every step the K next-token distributions are mixed in probability space with weights
λ = exp(log_weights[b]) (`mixture.mixed_logprobs_jax`), the most probable token is taken
(greedy) and appended to all K passes, until a stop string appears or `max_new_tokens` tokens.
With K = 1 and weight 1 this is plain greedy decoding. `generation_room(prefix, max_new_tokens)` and
`scoring_room(continuation)` (optional: where a backend knows them) say how many context tokens a generation pass or
a scored pair keeps, so a caller can name what a cut prompt still holds.

`HTTPLM` follows this rule exactly whenever it knows the model's tokenizer and the server takes
prompts as token ids (OpenAI, vLLM, llama.cpp and our server do): it sends `context ids +
continuation ids`. Only for a server that refuses token prompts (or without a tokenizer) does it
fall back to text prompts, choosing the server's own tokens by character offset; `stats()` then
says `"prompt_format": "text ..."`, since a split inside a word can then tokenise differently.
"""
from __future__ import annotations

import dataclasses
from typing import Protocol, Sequence, runtime_checkable

import numpy as np

from replug_jax.method.posterior import passage_part
from replug_jax.models.tokenizer import TextTokenizer


@runtime_checkable
class BlackBoxLM(Protocol):
    name: str

    def score(self, contexts: Sequence[str], continuations: Sequence[str]) -> list[np.ndarray]:
        """log p(y_t | context, y_<t) for each token of each continuation: a list of float32 [T_i]."""
        ...

    def count_tokens(self, text: str) -> int:
        """How many tokens `text` is for this LM (for chunking and budgets)."""
        ...

    def fingerprint(self) -> str:
        """A short id of everything that changes a score (weights, dtype, window, server): for caches."""
        ...

    def generate(self, contexts: Sequence[Sequence[str]], log_weights, *, max_new_tokens: int,
                 stop: Sequence[str] = ("\n",), shared_prefix: str = "") -> list["Generation"]:
        """REPLUG's ensembled greedy decoding (module docstring): one Generation per question. Optional keywords an
        LM may take (callers look before passing them): `progress`, `on_answer(question, Generation)` called as
        each answer completes, which `CachedLM` uses to store every answer at once (lm/cache.py), and `mixing`
        (MIXINGS: "logits", FlashRAG's logit average with log_weights = log w, needs every pass's whole next-token
        distribution: the local LM only)."""
        ...

    def score_with_query(self, contexts: Sequence[str], queries: Sequence[str],
                         continuations: Sequence[str], prefix: str = "") -> list[tuple[np.ndarray, np.ndarray]]:
        """From ONE pass `prefix ∘ context ∘ query ∘ continuation` per triple (`query_token_ids`'s rule): the
        log-probs of the query's tokens [T_q] and of the continuation's [T_c] (empty for an empty continuation).
        An LM with `score_top` also takes `top=n`: the continuation's part is then a `TopScores`."""
        ...


MIXINGS = ("probabilities", "logits")  # generate(mixing=): REPLUG's λ-mixture; FlashRAG's logit average (local LMs)


def check_mixing(mixing: str, posterior=None) -> str:
    """`generate(mixing=)` checked: one of MIXINGS; FlashRAG's logit average has no posterior weights."""
    if mixing not in MIXINGS:
        raise ValueError(f"mixing={mixing!r}: one of {MIXINGS}")
    if mixing == "logits" and posterior is not None:
        raise ValueError("mixing='logits' (FlashRAG's logit average) takes its weights as given, not a posterior")
    return mixing


@dataclasses.dataclass
class Generation:
    """One question's decoded answer: `text` cut before the first stop string; `token_ids` and their
    mixture log-probs `logprobs` as chosen (the stop token included); finish_reason "stop" or "length"."""

    text: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    # with a `PrefillPosterior` (method/posterior.py): the weights decoded with, per pass [K] (-inf: dropped), and log p(x | prefix, d) [K]
    log_weights: list[float] | None = None
    query_logliks: list[float] | None = None


@dataclasses.dataclass
class TopScores:
    """One scored continuation with the LM's most probable next tokens at each of its positions: what the contract's
    optional `score_top(contexts, continuations, top)` returns (the local LM has it; callers look: `hasattr`)."""

    logprobs: np.ndarray  # [T] float32: log p of each continuation token
    top_logprobs: np.ndarray  # [T, n] float32: the n best next-token log-probs at each position, best first
    top_ids: np.ndarray  # [T, n] int64: their token ids
    token_ids: list[int]  # [T]: the continuation's own tokens, as scored

    def packed(self) -> np.ndarray:
        """[T · (2 + 2n)] float32 (token id, log-prob, top log-probs, top ids per position; ids exact below 2^24):
        how a cache stores it (`from_packed` reads it back)."""
        return np.concatenate([np.asarray(self.token_ids, np.float32).reshape(-1, 1),
                               np.asarray(self.logprobs, np.float32).reshape(-1, 1), self.top_logprobs,
                               self.top_ids.astype(np.float32)], axis=1).ravel()

    def tail(self, start: int) -> "TopScores":
        """The scores of the tokens from `start` on (a query's and a continuation's, split)."""
        return TopScores(self.logprobs[start:], self.top_logprobs[start:], self.top_ids[start:], self.token_ids[start:])

    @classmethod
    def from_packed(cls, flat: np.ndarray, top: int) -> "TopScores":
        x = np.asarray(flat, np.float32).reshape(-1, 2 + 2 * top)
        return cls(x[:, 1], x[:, 2 : 2 + top], x[:, 2 + top :].astype(np.int64), x[:, 0].astype(np.int64).tolist())


def check_generation_inputs(contexts, log_weights, max_new_tokens: int) -> np.ndarray:
    """log_weights as float32 [B, K] (-inf for missing passes), after checking the call; errors name the problem."""
    if isinstance(contexts, str) or any(isinstance(c, str) for c in contexts):
        raise TypeError("generate takes, per question, a list of pass contexts (a list of lists of strings)")
    if not contexts or any(len(c) == 0 for c in contexts):
        raise ValueError("every question needs at least one pass context")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    k = max(len(c) for c in contexts)
    out = np.full((len(contexts), k), -np.inf, np.float32)
    if len(log_weights) != len(contexts):
        raise ValueError(f"{len(contexts)} questions but {len(log_weights)} rows of log_weights")
    for b, (ctx, w) in enumerate(zip(contexts, log_weights)):
        w = np.asarray(w, np.float32)
        if w.shape != (len(ctx),):
            raise ValueError(f"question {b}: {len(ctx)} passes but {w.shape} log_weights")
        if not np.isfinite(w).any() or np.isnan(w).any() or (w > 1e-4).any():
            raise ValueError(f"question {b}: log_weights must be log-probabilities (<= 0, some finite, no NaN)")
        out[b, : len(ctx)] = w
    return out


def check_pairs(contexts: Sequence[str], continuations: Sequence[str]) -> None:
    """Reject calls that cannot be scored, with a message that names the problem."""
    if isinstance(contexts, str) or isinstance(continuations, str):
        raise TypeError("score takes lists of contexts and continuations, not single strings")
    if len(contexts) != len(continuations):
        raise ValueError(f"{len(contexts)} contexts but {len(continuations)} continuations")
    empty = [i for i, c in enumerate(continuations) if not c]
    if empty:
        raise ValueError(f"continuations {empty[:5]} are empty: there is nothing to score")


def pair_token_ids(tokenizer: TextTokenizer, context: str, continuation: str, max_length: int | None,
                   start_id: int | None) -> tuple[list[int], list[int]]:
    """(context ids, continuation ids) as every backend scores them (the module docstring's rule).

    max_length: the window in tokens (None: unbounded); start_id: the document-start token for an
    empty context (None: an empty context is an error)."""
    cont = continuation_ids(tokenizer, continuation, max_length)
    ctx = tokenizer.encode(context) if context else []
    if not ctx:
        if start_id is None:
            raise ValueError("empty context and the tokenizer has no document-start token to condition on")
        ctx = [start_id]
    if max_length is not None:
        ctx = ctx[-(max_length - len(cont)):]
    return ctx, cont


def query_token_ids(tokenizer: TextTokenizer, context: str, query: str, continuation: str, max_length: int | None,
                    start_id: int | None, prefix: str = "") -> tuple[list[int], list[int], list[int]]:
    """(context ids, query ids, continuation ids) of one `score_with_query` pass. `context + query` is tokenised as
    one text, as REPLUG's pass context `d ∘ x` is, and the query's tokens are those that start at or after its first
    character (a token straddling the boundary stays with the context); the continuation is tokenised apart (the
    contract's rule), so the pass is REPLUG's own (`pair_token_ids(context + query, continuation)`) on every path. The
    context is cut from the LEFT to fit; the query must keep a token, the continuation may be empty. A `prefix` (a
    generation's shared prefix: `generation_prompt_ids`'s rule) is tokenised apart, kept whole and put first."""
    ids, n_ctx = query_boundary(tokenizer, context, query)
    ctx, query_ids = ids[:n_ctx], ids[n_ctx:]
    if not query_ids:
        raise ValueError(f"query {query[:40]!r} has no tokens of its own after its context: there is nothing to score")
    cont = tokenizer.encode(continuation) if continuation else []
    prefix_ids = tokenizer.encode(prefix) if prefix else []
    scored = len(query_ids) + len(cont) + len(prefix_ids)
    if max_length is not None and scored >= max_length:
        raise ValueError(f"query, continuation{' and shared prefix' if prefix_ids else ''} of {scored} tokens do not fit the LM's {max_length}-token window "
                         "with at least one context token")
    if not ctx and not prefix_ids:
        if start_id is None:
            raise ValueError("empty context and the tokenizer has no document-start token to condition on")
        ctx = [start_id]
    if max_length is not None:
        ctx = ctx[len(ctx) - (max_length - scored):] if max_length - scored < len(ctx) else ctx
    return prefix_ids + ctx, query_ids, cont


def query_boundary(tokenizer: TextTokenizer, context: str, query: str) -> tuple[list[int], int]:
    """(ids of `context + query` tokenised as one text, how many of them are the context's): the tokens starting
    before the query's first character. Without character offsets (a server's /tokenize without pieces) the context's
    are those `encode(context)` shares with the whole, plus the one straddling the boundary where they part (exact
    unless two tokens straddle it); the ids are the same either way."""
    if not context:
        return tokenizer.encode(query), 0
    if hasattr(tokenizer, "encode_with_offsets"):
        ids, offsets = tokenizer.encode_with_offsets(context + query)
        return list(ids), sum(1 for start, _ in offsets if start < len(context))
    ids, alone = tokenizer.encode(context + query), tokenizer.encode(context)
    shared = next((i for i, (a, b) in enumerate(zip(ids, alone)) if a != b), min(len(ids), len(alone)))
    return list(ids), shared if shared == len(alone) else min(shared + 1, len(ids))


def query_token_count(tokenizer: TextTokenizer, context: str, query: str) -> int:
    """How many of `context`'s tokens (`tokenizer.encode(context)`, as `generation_prompt_ids` has them) are the
    query's it ends with: those starting at or after the query's first character (`query_token_ids`'s rule)."""
    ids, n_ctx = query_boundary(tokenizer, passage_part(context, query), query)
    n = len(ids) - n_ctx
    if not n:
        raise ValueError(f"query {query[:40]!r} has no tokens of its own after its passage: there is nothing to score")
    return n


def split_query_scores(scored: Sequence[np.ndarray],
                       query_lengths: Sequence[int]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each pass's scores of `query ids + continuation ids` split into (query [T_q], continuation [T_c])."""
    return [(np.asarray(s[:n], np.float32), np.asarray(s[n:], np.float32)) for s, n in zip(scored, query_lengths)]


def check_query_triples(contexts: Sequence[str], queries: Sequence[str], continuations: Sequence[str]) -> None:
    """Reject `score_with_query` calls that cannot be scored, naming the problem."""
    if any(isinstance(x, str) for x in (contexts, queries, continuations)):
        raise TypeError("score_with_query takes lists of contexts, queries and continuations, not single strings")
    if not len(contexts) == len(queries) == len(continuations):
        raise ValueError(f"{len(contexts)} contexts, {len(queries)} queries and {len(continuations)} continuations")
    empty = [i for i, q in enumerate(queries) if not q]
    if empty:
        raise ValueError(f"queries {empty[:5]} are empty: log p(query | context) needs a query")


def generation_prompt_ids(tokenizer: TextTokenizer, prefix: str, context: str, max_length: int | None,
                          max_new_tokens: int, start_id: int | None) -> tuple[list[int], list[int]]:
    """(prefix ids, context ids) of one generation pass, as every backend sends them: the shared prefix kept
    whole, the context cut from the LEFT so that prefix + context + max_new_tokens fit `max_length`
    (None: unbounded); an empty prompt is the document-start token. Errors name the problem."""
    prefix_ids = tokenizer.encode(prefix) if prefix else []
    ctx = tokenizer.encode(context) if context else []
    if not ctx and prefix_ids:
        raise ValueError("a pass context is empty after the shared prefix: end the prompt in the context")
    if not ctx:
        if start_id is None:
            raise ValueError("an empty prompt and the tokenizer has no document-start token to condition on")
        ctx = [start_id]
    if max_length is not None:
        room = _generation_room(len(prefix_ids), max_length, max_new_tokens)
        if room < 1:
            raise ValueError(f"a shared prefix of {len(prefix_ids)} tokens and max_new_tokens={max_new_tokens} "
                             f"leave no room in the LM's {max_length}-token window")
        ctx = ctx[-room:]
    return prefix_ids, ctx


def generation_room(tokenizer: TextTokenizer, prefix: str, max_length: int | None, max_new_tokens: int) -> int | None:
    """How many context tokens a generation pass keeps after the shared `prefix` (`generation_prompt_ids`' rule:
    the context is cut from the left to this many); None without a window."""
    if max_length is None:
        return None
    return _generation_room(len(tokenizer.encode(prefix)) if prefix else 0, max_length, max_new_tokens)


def _generation_room(prefix_tokens: int, max_length: int, max_new_tokens: int) -> int:
    return max_length - prefix_tokens - max_new_tokens


def scoring_room(tokenizer: TextTokenizer, continuation: str, max_length: int | None) -> int | None:
    """How many context tokens a scored pair keeps before `continuation` (`pair_token_ids`' rule); None without a window."""
    return None if max_length is None else max_length - len(continuation_ids(tokenizer, continuation, max_length))


def continuation_ids(tokenizer: TextTokenizer, continuation: str, max_length: int | None) -> list[int]:
    """The continuation's ids, refused when empty or when they leave no room for a context token."""
    cont = tokenizer.encode(continuation)
    if not cont:
        raise ValueError(f"continuation {continuation[:40]!r} has no tokens")
    if max_length is not None and len(cont) >= max_length:
        raise ValueError(f"continuation of {len(cont)} tokens does not fit the LM's {max_length}-token window "
                         "with at least one context token; split it into shorter pieces")
    return cont
