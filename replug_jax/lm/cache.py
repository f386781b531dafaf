"""A black-box LM whose scores go through a persistent cache: no (context, continuation) is scored twice.

    lm = CachedLM(rj.load_lm("smollm2"), "runs/shared/lm_cache.sqlite")
    lps = lm.score(contexts, continuations)  # list of [T_i] float32, from disk where it can

With an API LM every call costs money, and an LSR grid or a re-run evaluation asks for the
same passes again and again. SQLite (stdlib) keeps the per-token log-probabilities on disk,
safe against a crash mid-write and shareable by runs that follow each other. Keys hash the
LM's name and fingerprint (weights, dtype, window, tokenizer; or server, model and prompt format),
the context and the continuation. Everything else (name,
tokenizer, count_tokens, generate, ...) is the wrapped LM's.

An LM whose mesh spans processes scores in lockstep: every process must make the same calls. Each process's
cache may hold other pairs (its own file, filled by an earlier split run), so hits and misses are decided
together: the processes check that they were asked the same pairs, then all score the union of their misses.

Misses are scored and stored `store_every` pairs at a time: a run killed an hour into one call keeps all but the
last chunk's scores, and its re-run starts from there.

`generate` goes through the same file: each question's `Generation` is kept under its inputs (shared prefix, its
passes, their weights, the new-token budget, the stop strings, a `PrefillPosterior`'s query, α and keep), stored as
it completes where the LM says so (`on_answer`: the local backend per batch, the HTTP client per question, all the
questions in one call so none waits for another's chunk), else `generations_every` questions at a time (an LM
without `on_answer`, or in lockstep over processes); so a QA job killed mid-generation loses only the answers in
flight, and its rerun says how many it read back and decodes the rest.
"""
from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import os
import sqlite3
import threading
from typing import Sequence

import numpy as np

from replug_jax.base import console
from replug_jax.base.progress import progress_keyword, tqdm
from replug_jax.lm.blackbox import (
    Generation,
    check_generation_inputs,
    check_mixing,
    check_pairs,
    check_query_triples,
    TopScores,
)
from replug_jax.method.posterior import PrefillPosterior


class CachedLM:
    """`score`, `score_with_query`, `generate` (and `score_top` where the LM has it) through an on-disk cache; every
    other attribute is the LM's."""

    store_every = 512  # misses scored (in one call of the LM) between commits: minutes of a small LM on a CPU
    generations_every = 8  # questions generated (in one call of an LM without `on_answer`) between commits: a killed
    # run loses at most these

    def __init__(self, lm, path: str):
        self.path = os.path.abspath(path)
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self.lm = lm
        self.namespace = json.dumps({"lm": lm.name, "lm_fingerprint": lm.fingerprint()}, sort_keys=True, default=str)
        self._lock = threading.Lock()  # one connection, shared by the training loop's threads
        self.db = sqlite3.connect(self.path, check_same_thread=False, timeout=60)
        self.db.execute("CREATE TABLE IF NOT EXISTS token_logprobs (key TEXT PRIMARY KEY, logprobs BLOB)")
        self.db.execute("CREATE TABLE IF NOT EXISTS generations (key TEXT PRIMARY KEY, generation TEXT)")
        self.db.commit()
        self.hits = self.misses = 0
        self.generation_hits = self.generation_misses = 0

    def __getattr__(self, name):
        if name == "score_top":  # only where the LM gives top tokens (callers look for it: `hasattr`)
            getattr(self.__dict__["lm"], name)
            return self._score_top
        return getattr(self.__dict__["lm"], name)

    def _key(self, *texts: str) -> str:
        return hashlib.sha256("\0".join((self.namespace, *texts)).encode()).hexdigest()

    def _lookup(self, keys: list[str], table: str = "token_logprobs") -> dict:
        """The stored values of those `keys` found in `table`: float32 arrays (token_logprobs) or JSON texts."""
        column = "logprobs" if table == "token_logprobs" else "generation"
        found = {}
        for start in range(0, len(keys), 500):  # SQLite limits the number of bound parameters
            chunk = keys[start : start + 500]
            rows = self.db.execute(f"SELECT key, {column} FROM {table} WHERE key IN ({','.join('?' * len(chunk))})",
                                   chunk)
            found.update({k: np.frombuffer(v, np.float32) if column == "logprobs" else v for k, v in rows})
        return found

    def score(self, contexts: Sequence[str], continuations: Sequence[str], progress: bool = False) -> list[np.ndarray]:
        """Per-token log-probabilities [T_i] of each continuation after its context (the LM's `score`)."""
        if len(contexts) != len(continuations):
            raise ValueError(f"{len(contexts)} contexts but {len(continuations)} continuations")
        keys = [self._key(c, y) for c, y in zip(contexts, continuations)]
        compute = lambda idx, bar: self.lm.score([contexts[i] for i in idx], [continuations[i] for i in idx],
                                                 **progress_keyword(self.lm.score, bar))
        return self._through_cache(keys, compute, progress)

    def score_with_query(self, contexts: Sequence[str], queries: Sequence[str], continuations: Sequence[str],
                         prefix: str = "", progress: bool = False, top: int = 0) -> list[tuple[np.ndarray, object]]:
        """The LM's `score_with_query` through the cache: (query log-probs [T_q], continuation log-probs [T_c]; with
        `top`, the LM's `TopScores`)."""
        check_query_triples(contexts, queries, continuations)
        head = ("\0prefix\0" + prefix,) if prefix else ()  # (no prefix: the keys stored before prefixes existed)
        head += (f"\0top{top}\0",) if top else ()
        keys = [self._key(*head, c, "\0query\0" + q, y) for c, q, y in zip(contexts, queries, continuations)]

        def compute(idx, bar):  # stored as [T_q, query log-probs..., continuation log-probs (packed TopScores)...]
            pairs = self.lm.score_with_query([contexts[i] for i in idx], [queries[i] for i in idx],
                                             [continuations[i] for i in idx],
                                             **progress_keyword(self.lm.score_with_query, bar),
                                             **({"prefix": prefix} if prefix else {}),  # a contract without it too
                                             **({"top": top} if top else {}))
            return [np.concatenate([[len(q)], q, c.packed() if top else c]) for q, c in pairs]

        stored = self._through_cache(keys, compute, progress)
        return [(x[1 : 1 + int(x[0])], TopScores.from_packed(x[1 + int(x[0]) :], top) if top else x[1 + int(x[0]) :])
                for x in stored]

    def _score_top(self, contexts: Sequence[str], continuations: Sequence[str], top: int,
                   progress: bool = False) -> list[TopScores]:
        """The LM's `score_top` through the cache (stored packed: `TopScores.packed`)."""
        check_pairs(contexts, continuations)
        keys = [self._key(f"\0top{top}\0", c, y) for c, y in zip(contexts, continuations)]

        def compute(idx, bar):
            return [x.packed() for x in self.lm.score_top([contexts[i] for i in idx], [continuations[i] for i in idx],
                                                          top, **progress_keyword(self.lm.score_top, bar))]

        return [TopScores.from_packed(x, top) for x in self._through_cache(keys, compute, progress)]

    def generate(self, contexts: Sequence[Sequence[str]], log_weights, *, max_new_tokens: int,
                 stop: Sequence[str] = ("\n",), shared_prefix: str = "", progress: bool = False,
                 posterior: PrefillPosterior | None = None, mixing: str = "probabilities") -> list[Generation]:
        """The LM's `generate` (one `Generation` per question) through the cache: a question asked before with the
        same inputs is not decoded again."""
        weights = check_generation_inputs(contexts, log_weights, max_new_tokens)  # [B, K] float32, -inf: no pass
        head = json.dumps(["\0generate", shared_prefix, max_new_tokens, list(stop),
                           [posterior.alpha, posterior.keep] if posterior else None]
                          + ([check_mixing(mixing, posterior)] if mixing != "probabilities" else []))
        keys = [self._key(head, *ctx, "\0weights\0" + weights[b, : len(ctx)].tobytes().hex(),
                          "\0query\0" + posterior.queries[b] if posterior else "")
                for b, ctx in enumerate(contexts)]

        def compute(idx, bar, stored=None):
            extra = {"posterior": PrefillPosterior([posterior.queries[i] for i in idx], posterior.alpha,
                                                   posterior.keep)} if posterior else {}  # a contract without it too
            if mixing != "probabilities":
                extra["mixing"] = mixing
            if stored is not None:  # each answer into the file as it completes
                extra["on_answer"] = lambda j, g: stored(idx[j], _as_json(g))
            gens = self.lm.generate([contexts[i] for i in idx], [log_weights[i] for i in idx],
                                    max_new_tokens=max_new_tokens, stop=stop, shared_prefix=shared_prefix,
                                    **progress_keyword(self.lm.generate, bar), **extra)
            return [_as_json(g) for g in gens]

        streamed = "on_answer" in inspect.signature(self.lm.generate).parameters and not self._lockstep()
        stored = self._through_cache(keys, compute, progress, table="generations", streamed=streamed)
        return [Generation(**json.loads(x)) for x in stored]

    def _through_cache(self, keys: list[str], compute, progress: bool = False,
                       table: str = "token_logprobs", streamed: bool = False) -> list:
        """The cached values of `keys` in `table`; compute(positions, progress) -> values for the distinct misses,
        stored `store_every` (`generations_every`) at a time (one progress bar over the chunks where there are
        several, else the LM's own); `streamed`: all misses in one call, compute(positions, progress, stored) calling
        stored(position, value) as each completes, which stores it at once. token_logprobs holds float32 arrays,
        generations JSON texts."""
        arrays = table == "token_logprobs"
        with self._lock:
            found = self._lookup(keys, table)
        first: dict[str, int] = {}  # one LM call per distinct uncached key
        for i, k in enumerate(keys):
            if k not in found:
                first.setdefault(k, i)
        missing = list(first.values())
        if self._lockstep():
            missing = self._agreed_misses(keys, missing)
        if found and (progress or not arrays):  # a job's call: what a rerun read back, said
            what = "scores" if arrays else "answers"
            console.phase(f"LM cache: {len(keys) - len(missing)} of {len(keys)} {what} read back from {self.path}, "
                          f"{len(missing)} to compute")
        every, unit = (self.store_every, "pair") if arrays else (self.generations_every, "question")
        if streamed and missing:  # one call; each value stored by `stored` as it completes
            def stored(position: int, value) -> None:
                with self._lock:
                    self.db.execute(f"INSERT OR REPLACE INTO {table} VALUES (?, ?)", (keys[position], value))
                    self.db.commit()

            found.update({keys[i]: x for i, x in zip(missing, compute(missing, progress, stored))})
        chunks = [] if streamed else [missing[start : start + every] for start in range(0, len(missing), every)]
        over_chunks = progress and len(chunks) > 1  # one bar over the chunks, else the LM's own for its one call
        with tqdm(total=len(missing), disable=not over_chunks, unit=unit,
                  desc=f"{'score' if arrays else 'generate'} (stored every {every} {unit}s)") as bar:
            for chunk in chunks:  # the same chunks in every process of a lockstep call (`missing` is agreed)
                new = {keys[i]: np.asarray(x, np.float32) if arrays else x
                       for i, x in zip(chunk, compute(chunk, progress and not over_chunks))}
                with self._lock:
                    self.db.executemany(f"INSERT OR REPLACE INTO {table} VALUES (?, ?)",
                                        [(k, v.tobytes() if arrays else v) for k, v in new.items()])
                    self.db.commit()
                found.update(new)
                bar.update(len(chunk))
        with self._lock:
            if arrays:
                self.misses += len(missing)
                self.hits += len(keys) - len(missing)
            else:
                self.generation_misses += len(missing)
                self.generation_hits += len(keys) - len(missing)
        return [found[k].copy() if arrays else found[k] for k in keys]

    def _lockstep(self) -> bool:
        """Whether the wrapped LM's calls are collective over several processes (its mesh spans them)."""
        mesh = getattr(self.lm, "mesh", None)
        if mesh is None:
            return False
        from replug_jax.parallel import sharding

        return sharding.spans_processes(mesh)

    @staticmethod
    def _agreed_misses(keys: list[str], missing: list[int]) -> list[int]:
        """The union of every process's misses (positions in `keys`), after checking that every process was
        asked the same pairs (a divergence would feed different inputs to one collective program)."""
        from replug_jax.parallel import distributed

        digest = hashlib.sha256("".join(keys).encode()).hexdigest()
        reports = distributed.allgather_json({"pairs": digest, "missing": missing})
        if len({r["pairs"] for r in reports}) > 1:
            raise RuntimeError("processes scoring in lockstep were asked different pairs: their jobs diverged")
        return sorted(set().union(*(r["missing"] for r in reports)))

    def cache_stats(self) -> dict:
        total = self.hits + self.misses
        stats = {"cache_hits": self.hits, "cache_misses": self.misses, "cache_hit_rate": self.hits / total if total else 0.0}
        if self.generation_hits + self.generation_misses:  # a job that generated: how many answers came from disk
            stats.update(generations_from_cache=self.generation_hits, generations_decoded=self.generation_misses)
        return stats

    def stats(self) -> dict:
        inner = self.lm.stats() if hasattr(self.lm, "stats") else {}
        return {**inner, **self.cache_stats()}

    def close(self) -> None:
        self.db.close()


def _as_json(generation: Generation) -> str:
    """A Generation as the cache stores it (-inf weights as -Infinity, json's own)."""
    return json.dumps(dataclasses.asdict(generation))
