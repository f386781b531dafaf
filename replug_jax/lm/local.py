"""The local JAX backend of the black-box LM contract.

All (context, continuation) pairs of a call are tokenised, sorted by length, padded to
fixed length buckets and a fixed batch size, and scored by one jitted function per
bucket with the batch split over every device. One-token continuations of one context (MMLU's
option letters) are scored from one forward pass of that context, and rows that share a long prefix (a
few-shot block) read it from one key/value cache (lm/shared_prefix.py).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import numpy as np

from replug_jax.base.progress import tqdm
from replug_jax.lm import shared_prefix
from replug_jax.lm.blackbox import (
    check_pairs,
    check_query_triples,
    generation_room,
    pair_token_ids,
    query_token_ids,
    scoring_room,
    split_query_scores,
    TopScores,
)
from replug_jax.models import causal_lm, partition, precision
from replug_jax.models.tokenizer import TextTokenizer, document_start_id, tokenizer_fingerprint
from replug_jax.models.weights import weights_fingerprint
from replug_jax.parallel import sharding, xla_cpu

CONTINUATION_MULTIPLE = 32  # scored positions per row are padded to a multiple of this
# rows are padded to a multiple of `length_multiple` or of 1/8 of their length's power of two, whichever is larger
# (`sharding.length_bucket`): at most 8 buckets per doubling, ≤ 12.5% padding from 256 tokens on (below that, up
# to 31 tokens of padding; past 2,048 tokens steps of 256 and more, still ≤ 12.5%). 32 / 8 measured 5-7% faster
# scoring than a flat 64 on ~450-token passes at the same demo time (benchmarks/README.md "CPU speed").
LENGTH_STEPS_PER_OCTAVE = 8


GENERATION_QUESTIONS = 8  # questions one generate call decodes together, by default
SCORING_INPUTS = 4  # ids, mask, target positions, predict-from positions: [b, L], [b, L], [b, T], [b, T]


def _scored_logprobs(params, ids, mask, target_positions, predict_from, *, config, dtype, top):
    return causal_lm.logprobs_at(params, config, ids, mask, target_positions, predict_from, dtype=dtype, top=top)


def scoring_function(config: causal_lm.CausalLMConfig, dtype, top: int = 0):
    """`fn(params, ids, mask, targets, predict_from) -> [b, T]` log-probs: the program `score` runs per length bucket
    (`sharding.batch_program` jits it; the TPU plan compiles the same). `top` > 0: [b, T, 1 + 2·top], each position's
    top tokens beside (`causal_lm.logprobs_at`), the program `score_top` runs."""
    return functools.partial(_scored_logprobs, config=config, dtype=dtype, top=top)


class LocalLM:
    """A causal LM in JAX behind `score(contexts, continuations)`."""

    weights_at_prefill = True  # `generate(posterior=)` reads the posterior's log p(x | d) in its own prefill

    def __init__(self, config: causal_lm.CausalLMConfig, params, tokenizer: TextTokenizer, *, name: str = "lm",
                 max_length: int | None = None, batch_size: int = 4, length_multiple: int = 32,
                 dtype=None, param_dtype=None, mesh=None, model_parallel: int = 1,
                 min_shared_prefix: int = shared_prefix.MIN_SHARED_PREFIX,
                 generation_questions: int = GENERATION_QUESTIONS):
        """`dtype`: compute dtype (None: bf16 on accelerators, fp32 on CPU, `models/precision.py`); `param_dtype`:
        the weights' (None: `dtype`). `mesh` (default: `sharding.lm_mesh(model_parallel)` over this process's
        devices): batches split over its "data" axis, weights over its "model" axis by models/partition.py.
        `min_shared_prefix`: rows of one call sharing this many leading tokens compute them once (0: never).
        `generation_questions`: the most questions one `generate` call decodes together (their passes' key/value
        caches are on the devices at once: `python -m replug_jax.plan` says how many fit a TPU)."""
        if generation_questions < 1:
            raise ValueError(f"generation_questions must be at least 1, got {generation_questions}")
        self.config, self.tokenizer, self.name = config, tokenizer, name
        self.max_length = min(max_length or config.max_position, config.max_position)
        params = precision.cast_floating(params, precision.weight_dtype(dtype, param_dtype))
        dtype = precision.resolve(dtype)
        self.length_multiple, self.dtype = length_multiple, dtype
        self.start_id = document_start_id(tokenizer)
        self.pad_id = tokenizer.pad_id if tokenizer.pad_id is not None else 0
        mesh = mesh or sharding.lm_mesh(model_parallel)
        batch_size = sharding.round_up(batch_size, sharding.data_size(mesh))
        self._batch_fn = sharding.ShardedBatchFn(scoring_function(config, dtype), params, batch_size, mesh,
                                                 num_inputs=SCORING_INPUTS,
                                                 param_shardings=partition.param_shardings(params, mesh, config),
                                                 compiler_options=xla_cpu.options(xla_cpu.LM_SCORING, mesh))
        self._batch_fns = {0: self._batch_fn}  # top -> the scoring program (`score_top`'s built on first use)
        self._generator = None
        self.generation_questions = generation_questions
        self.min_shared_prefix = min_shared_prefix
        self._prefix_scorers: dict = {}  # top -> shared_prefix.PrefixScorer

    @property
    def params(self):
        return self._batch_fn.params

    @property
    def batch_size(self) -> int:
        return self._batch_fn.batch_size

    @property
    def mesh(self):
        """The LM's device mesh: batches over its "data" axis, weights over "model" (if it has one)."""
        return self._batch_fn.mesh

    @property
    def param_shardings(self):
        """Where each weight lives (a pytree of NamedShardings like `params`)."""
        return self._batch_fn.param_shardings

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text))

    def pair_tokens(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """(context ids, continuation ids) as scored: `blackbox.pair_token_ids`, the one rule of every backend."""
        return pair_token_ids(self.tokenizer, context, continuation, self.max_length, self.start_id)

    def fingerprint(self) -> str:
        """A hash of the weights, model config, tokenizer, dtype and window: what changes a score (for caches)."""
        return weights_fingerprint(self.params, [self.name, str(self.dtype), self.max_length,
                                                 dataclasses.asdict(self.config), tokenizer_fingerprint(self.tokenizer)])

    def generate(self, contexts, log_weights, *, max_new_tokens: int, stop=("\n",), shared_prefix: str = "",
                 progress: bool = False, posterior=None, on_answer=None, mixing: str = "probabilities"):
        """REPLUG's ensembled greedy decoding (the contract in lm/blackbox.py), with a KV cache per pass and
        the shared prefix computed once (lm/local_generate.py): one `Generation` per question. `posterior` (a
        `method.posterior.PrefillPosterior`): the weights are fixed at prefill from the LM's posterior over the passes.
        `on_answer(question, Generation)`: called as each answer is decoded (a batch of questions at a time).
        `mixing="logits"`: FlashRAG's logit average with weights log w (method/logit_average.py), for comparison."""
        if self._generator is None:
            from replug_jax.lm.local_generate import LocalGenerator

            self._generator = LocalGenerator(self, self.generation_questions)
        return self._generator.generate(contexts, log_weights, max_new_tokens=max_new_tokens, stop=stop,
                                        shared_prefix=shared_prefix, progress=progress, posterior=posterior,
                                        on_answer=on_answer, mixing=mixing)

    def generation_room(self, prefix: str, max_new_tokens: int) -> int | None:
        """How many context tokens `generate` keeps after `prefix` (`blackbox.generation_room`)."""
        return generation_room(self.tokenizer, prefix, self.max_length, max_new_tokens)

    def scoring_room(self, continuation: str) -> int | None:
        """How many context tokens `score` keeps before `continuation` (`blackbox.scoring_room`)."""
        return scoring_room(self.tokenizer, continuation, self.max_length)

    def score(self, contexts: Sequence[str], continuations: Sequence[str], progress: bool = False) -> list[np.ndarray]:
        """log p of each continuation token given its context and the tokens before it."""
        check_pairs(contexts, continuations)
        pairs = [self.pair_tokens(c, y) for c, y in zip(contexts, continuations)]
        return self.score_token_pairs(pairs, progress=progress)

    def score_top(self, contexts: Sequence[str], continuations: Sequence[str], top: int,
                  progress: bool = False) -> list[TopScores]:
        """`score`, with the `top` most probable next tokens at every continuation position from the same forward
        pass (what decides whether the continuation is the greedy one: method/greedy_match.py)."""
        check_pairs(contexts, continuations)
        pairs = [self.pair_tokens(c, y) for c, y in zip(contexts, continuations)]
        packed = self.score_token_pairs(pairs, progress=progress, top=top)
        return [TopScores(*causal_lm.unpack_top(x), list(cont)) for x, (_, cont) in zip(packed, pairs)]

    def score_with_query(self, contexts: Sequence[str], queries: Sequence[str], continuations: Sequence[str],
                         prefix: str = "", progress: bool = False, top: int = 0) -> list[tuple[np.ndarray, object]]:
        """(log p of each query token, of each continuation token) from one row `context ∘ query ∘ continuation`
        per triple (the contract's `score_with_query`): the query's scores come from the same forward pass.
        `top` > 0: the continuation's part as a `TopScores` (`score_top`), from that pass too."""
        check_query_triples(contexts, queries, continuations)
        triples = [query_token_ids(self.tokenizer, c, q, y, self.max_length, self.start_id, prefix)
                   for c, q, y in zip(contexts, queries, continuations)]
        scored = self.score_token_pairs([(c, q + y) for c, q, y in triples], progress=progress, top=top)
        if not top:
            return split_query_scores(scored, [len(q) for _, q, _ in triples])
        out = []
        for x, (_, q, y) in zip(scored, triples):
            lps, top_lps, top_ids = causal_lm.unpack_top(x)
            out.append((lps[: len(q)], TopScores(lps[len(q) :], top_lps[len(q) :], top_ids[len(q) :], list(y))))
        return out

    def score_token_pairs(self, pairs: list[tuple[list[int], list[int]]], progress: bool = False,
                          top: int = 0) -> list[np.ndarray]:
        """Like `score`, for pre-tokenised (context ids, continuation ids) pairs; contexts must not be empty.
        `top` > 0: per pair [T, 1 + 2·top], the top tokens beside (`causal_lm.logprobs_at`).

        One-token continuations of one context (MMLU's " A" .. " D") share one forward pass (`_rows`); rows that
        share at least `min_shared_prefix` leading tokens read them from one key/value cache (lm/shared_prefix.py)."""
        if any(not ctx for ctx, _ in pairs):
            raise ValueError("every context needs at least one token (use pair_tokens, which adds the document-start token)")
        rows = self._rows(pairs)
        out: list[np.ndarray | None] = [None] * len(pairs)
        groups, alone = shared_prefix.prefix_groups([r.ids for r in rows], [min(r.predict_from) for r in rows],
                                                    self.min_shared_prefix)
        self._score_rows([rows[i] for i in alone], out, progress, top)
        # many groups (a prefix per pass): one bar over them; one group (a subject's few-shot block): its batches
        for common, members in tqdm(groups, disable=not progress or len(groups) < 2, desc="score after shared prefixes",
                                    unit="prefix"):
            self._score_after_prefix(common, [rows[i] for i in members], out, progress and len(groups) == 1, top)
        return out  # type: ignore[return-value]

    def score_prompts(self, prompts: list[list[int]], lead: int = 1) -> list[np.ndarray]:
        """Echo scoring (the scoring server's): per token-id prompt, log p(token | tokens before it) of every token
        after its first `lead` ones: [len - lead] float32 (empty when nothing is scored). Prompts of one call that
        share a long prefix (a passage and question under each of several gold answers) score it once: the prefix
        as one row, each prompt's rest after it from one key/value cache (`score_token_pairs`)."""
        out: list[np.ndarray] = [np.zeros(0, np.float32)] * len(prompts)
        scored = [i for i, p in enumerate(prompts) if len(p) > lead]
        rows = [prompts[i] for i in scored]
        groups, alone = shared_prefix.prefix_groups(rows, [len(r) - 1 for r in rows], self.min_shared_prefix)
        pairs, parts = [], []  # parts: per scored prompt, the indices of its pairs, in order
        for j in alone:
            parts.append((scored[j], [len(pairs)]))
            pairs.append((rows[j][:lead], rows[j][lead:]))
        for common, members in groups:
            prefix = rows[members[0]][:common]
            parts += [(scored[j], [len(pairs), len(pairs) + 1 + m]) for m, j in enumerate(members)]
            pairs.append((prefix[:lead], prefix[lead:]))  # the prefix's own tokens, once
            pairs += [(prefix, rows[j][common:]) for j in members]
        values = self.score_token_pairs(pairs) if pairs else []
        for i, pieces in parts:
            out[i] = np.concatenate([values[k] for k in pieces]).astype(np.float32)
        return out

    def target_arrays(self, targets: list[list[int]], predict_from: list[list[int]], length: int):
        """(targets, predict_from) [b, T] int32, T a bucket of the longest list (≤ `length`); zeros past each."""
        width = sharding.length_bucket(max(len(t) for t in targets), CONTINUATION_MULTIPLE, length)
        target_ids = np.zeros((len(targets), width), np.int32)  # [b, T]: where each scored token sits
        predict = np.zeros((len(targets), width), np.int32)  # [b, T]: the position that predicts it
        for j, (t, p) in enumerate(zip(targets, predict_from)):
            target_ids[j, : len(t)], predict[j, : len(t)] = t, p
        return target_ids, predict

    def _scoring_program(self, top: int) -> sharding.ShardedBatchFn:
        """The scoring program with `top` tokens beside (0: the plain one), built once, on the same placed weights."""
        if top not in self._batch_fns:
            plain = self._batch_fn
            self._batch_fns[top] = sharding.ShardedBatchFn(
                scoring_function(self.config, self.dtype, top), plain.params, plain.batch_size, plain.mesh,
                num_inputs=SCORING_INPUTS, param_shardings=plain.param_shardings,
                compiler_options=xla_cpu.options(xla_cpu.LM_SCORING, plain.mesh))
        return self._batch_fns[top]

    def _score_rows(self, rows: list["_ScoredRow"], out: list, progress: bool, top: int = 0) -> None:
        """Each row as one sequence, in length-bucketed batches; each pair's scores into `out`."""
        if not rows:
            return
        program = self._scoring_program(top)
        batches = sharding.bucketed_batches([r.ids for r in rows], self._batch_fn.batch_size, self.length_multiple,
                                            self.max_length, self.pad_id, progress, desc="score",
                                            per_octave=LENGTH_STEPS_PER_OCTAVE)
        for idx, ids, mask in batches:
            targets, predict = self.target_arrays([rows[i].targets for i in idx], [rows[i].predict_from for i in idx],
                                                  ids.shape[1])
            lps = program(ids, mask, targets, predict)  # [b, T] ([b, T, 1 + 2·top])
            for j, i in enumerate(idx):
                rows[i].deliver(lps[j], out)

    def _score_after_prefix(self, common: int, rows: list["_ScoredRow"], out: list, progress: bool,
                            top: int = 0) -> None:
        """Rows sharing their first `common` tokens: those once into a cache, each row's rest after it."""
        if top not in self._prefix_scorers:
            self._prefix_scorers[top] = shared_prefix.PrefixScorer(self, top)
        suffixes = [(r.ids[common:], [t - common for t in r.targets], [p - common for p in r.predict_from])
                    for r in rows]
        for idx, lps in self._prefix_scorers[top].score(rows[0].ids[:common], suffixes, LENGTH_STEPS_PER_OCTAVE,
                                                        progress):
            for j, i in enumerate(idx):
                rows[i].deliver(lps[j], out)

    def _rows(self, pairs) -> list["_ScoredRow"]:
        """The forward rows for `pairs`: context + continuation each, except that the one-token continuations of
        one context go into one row, context + [a, b, ...], all predicted from the context's last position."""
        rows, shared = [], {}
        for p, (ctx, cont) in enumerate(pairs):
            if len(cont) == 1:
                shared.setdefault(tuple(ctx), []).append(p)
            else:
                start = len(ctx)
                rows.append(_ScoredRow(ctx + cont, list(range(start, start + len(cont))),
                                       list(range(start - 1, start + len(cont) - 1)), [(p, slice(0, len(cont)))]))
        for ctx, members in shared.items():
            room = self.max_length - len(ctx)  # >= 1: pair_tokens leaves a one-token continuation its place
            for at in range(0, len(members), room):  # a row never outgrows the window
                group, start = members[at : at + room], len(ctx)
                rows.append(_ScoredRow(list(ctx) + [pairs[p][1][0] for p in group],
                                       list(range(start, start + len(group))), [start - 1] * len(group),
                                       [(p, slice(j, j + 1)) for j, p in enumerate(group)]))
        return rows


@dataclasses.dataclass
class _ScoredRow:
    """One forward row: ids, the positions scored and the positions predicting them, and (pair, slice of the
    row's scores) for each pair it answers."""

    ids: list[int]
    targets: list[int]
    predict_from: list[int]
    pieces: list[tuple[int, slice]]

    def deliver(self, scores: np.ndarray, out: list) -> None:
        """The row's scores [T] (or [T, 1 + 2·top]) to the pairs it answers: out[pair] = float32 log-probs."""
        for pair, where in self.pieces:
            out[pair] = scores[where].astype(np.float32)
