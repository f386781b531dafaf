"""The REPLUG LSR training loop (§4, §5.2): retrieve, ask the black-box LM, update the retriever.

Each step: embed the batch's queries with the current retriever, search the current index
(top-k, the query's own source excluded), get ℓ(x, d, y) for every (query, document) pair
from the LM through the persistent cache, and run the jitted train step, which re-encodes
queries and documents with the current parameters and minimises KL(P_R ‖ Q). Every
`refresh_every` steps the refresher re-embeds the datastore on a background thread and
swaps the new index in `swap_after` steps later. Checkpoints are taken only when no
refresh is pending, so a killed run resumes exactly: same index version, same data
position, same parameters and losses as an uninterrupted run.
"""
from __future__ import annotations

import dataclasses
import os
import time

import jax
import numpy as np
from absl import logging
from tqdm.auto import tqdm

from replug_jax import console, lsr
from replug_jax.passages import DOC_TEMPLATE, document_passes
from replug_jax.retrieval.refresh import IndexRefresher
from replug_jax.retrieval.retriever import excluded_rows
from replug_jax.train import step as train_step_lib
from replug_jax.train.checkpoint import Checkpointer
from replug_jax.train.lm_cache import LMScoreCache
from replug_jax.train.metrics import MetricsLogger, plot_loss


LM_SCORES = ("sum", "mean")


@dataclasses.dataclass(frozen=True)
class LSRSettings:
    """Hyperparameters of REPLUG LSR (defaults: the paper's §5.2 where it gives them)."""

    k: int = 20
    steps: int = 25_000
    batch_size: int = 64
    learning_rate: float = 2e-5
    warmup_fraction: float = 0.1
    clip_norm: float = 1.0
    gamma: float = 0.1  # retrieval likelihood temperature
    beta: float = 0.1  # LM likelihood temperature
    direction: str = "pr_q"  # KL(P_R ‖ Q) as the paper writes it; "q_pr": KL(Q ‖ P_R) as Atlas
    lm_score: str = "sum"  # ℓ = Σ_t log p(y_t | d ∘ x, y_<t); "mean" divides by the token count
    refresh_every: int = 3_000
    swap_after: int = 1  # steps between a refresh request and its swap (0: synchronous)
    query_max_tokens: int = 192  # encoder tokens of a query x (fixed shape)
    doc_max_tokens: int = 192  # encoder tokens of a document (fixed shape)
    checkpoint_every: int = 500
    keep_checkpoints: int = 3
    log_every: int = 1
    metric: str = "cosine"
    index_factory: str = "Flat"
    embedding_dtype: str = "float32"  # of the refreshed corpus embeddings on disk
    doc_template: str = DOC_TEMPLATE

    def __post_init__(self):
        positive = ("k", "steps", "batch_size", "refresh_every", "query_max_tokens", "doc_max_tokens",
                    "checkpoint_every", "keep_checkpoints", "log_every")
        bad = [f"{name}={getattr(self, name)}" for name in positive if getattr(self, name) < 1]
        bad += [f"{name}={getattr(self, name)}" for name in ("learning_rate", "gamma", "beta")
                if not getattr(self, name) > 0]
        if bad:
            raise ValueError(f"LSRSettings: {', '.join(bad)} must be positive")
        choices = {"direction": lsr.DIRECTIONS, "lm_score": LM_SCORES, "metric": ("cosine", "ip"),
                   "embedding_dtype": ("float32", "float16")}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"LSRSettings: {name} must be one of {allowed}, got {getattr(self, name)!r}")
        if not 0 <= self.swap_after < self.refresh_every:
            raise ValueError(f"LSRSettings: need 0 <= swap_after < refresh_every (one refresh at a time), got "
                             f"swap_after={self.swap_after}, refresh_every={self.refresh_every}")
        if self.clip_norm is not None and not self.clip_norm > 0:
            raise ValueError(f"LSRSettings: clip_norm must be positive or None, got {self.clip_norm}")
        if not 0 <= self.warmup_fraction < 1:
            raise ValueError(f"LSRSettings: warmup_fraction must be in [0, 1), got {self.warmup_fraction}")
        if "{text}" not in self.doc_template:
            raise ValueError("LSRSettings: doc_template must contain {text}")

    def index_versions_to_keep(self) -> int:
        """Saved index versions to keep so that every kept checkpoint finds the index it names.

        The kept checkpoints and the present span at most keep_checkpoints * (checkpoint_every + the
        deferral of a checkpoint past a pending refresh, max(swap_after, 1) steps); an index version is
        swapped in every refresh_every steps; one more for a build saved before its swap."""
        span = self.keep_checkpoints * (self.checkpoint_every + max(self.swap_after, 1))
        return -(-span // self.refresh_every) + 2


def make_batch(encoder, datastore, examples, rows: np.ndarray, lm_scores: np.ndarray, *, query_max_tokens: int,
               doc_max_tokens: int) -> dict:
    """Fixed-shape arrays of the jitted step for B examples and their K retrieved rows."""
    b, k = rows.shape
    query_ids, query_mask = encoder.padded([e.query for e in examples], query_max_tokens)  # [B, Lq]
    texts = [datastore.texts[r] if r >= 0 else "" for r in rows.reshape(-1)]
    doc_ids, doc_mask = encoder.padded(texts, doc_max_tokens)  # [B*K, Ld]
    return {"query_ids": query_ids, "query_mask": query_mask,
            "doc_ids": doc_ids.reshape(b, k, -1), "doc_mask_tokens": doc_mask.reshape(b, k, -1),
            "doc_valid": rows >= 0, "lm_scores": np.where(rows >= 0, lm_scores, 0.0).astype(np.float32)}


def supervise(cache: LMScoreCache, datastore, examples, rows: np.ndarray, *, lm_score: str = "sum",
              doc_template: str = DOC_TEMPLATE) -> np.ndarray:
    """ℓ(x, d, y) for every example and retrieved row: [B, K] (0 where no document).

    lm_score "sum": Σ_t log p(y_t | d ∘ x, y_<t); "mean": divided by the continuation's token count."""
    if lm_score not in LM_SCORES:
        raise ValueError(f"lm_score must be one of {LM_SCORES}, got {lm_score!r}")
    contexts, continuations, where = document_passes(datastore, rows, [e.query for e in examples],
                                                     [e.continuation for e in examples], doc_template)
    sums, counts = cache.score(contexts, continuations)
    scores = np.zeros(rows.shape, np.float32)
    for (i, j), total, n in zip(where, sums, counts):
        scores[i, j] = total / n if lm_score == "mean" else total
    return scores


def train_lsr(encoder, lm, datastore, examples, workdir: str, settings: LSRSettings, initial_index=None,
              mesh=None, progress: bool = True) -> dict:
    """Train the retriever; returns {"params", "index_version", "steps", "stats"}.

    `initial_index`: a DenseIndex of the datastore under the initial parameters (index version 0),
    so the first retrieval need not re-embed the corpus.
    """
    s = settings
    if not examples:
        raise ValueError("LSR needs training examples")
    mesh = mesh or encoder.mesh
    lead = jax.process_index() == 0
    optimizer = train_step_lib.make_optimizer(s.learning_rate, s.steps, s.warmup_fraction, s.clip_norm)
    state = train_step_lib.init_train_state(jax.device_get(encoder.params), optimizer, mesh=mesh)
    checkpoints = Checkpointer(os.path.join(workdir, "checkpoints"), max_to_keep=s.keep_checkpoints)
    restored = checkpoints.restore(jax.eval_shape(lambda: state))
    start, index_version = 0, 0
    refresher = IndexRefresher(encoder, datastore, metric=s.metric, factory=s.index_factory,
                               workdir=os.path.join(workdir, "indexes"), swap_after=s.swap_after,
                               keep=s.index_versions_to_keep(), embedding_dtype=s.embedding_dtype)
    data_position = 0  # examples consumed so far (the batch of step t starts there, modulo the dataset)
    if restored is not None:
        start, state, meta = restored
        state = train_step_lib.place_state(state, mesh)  # the step's compiled sharding: no second compile
        index_version, data_position = meta["index_version"], meta["data_position"]
        refresher.load_version(index_version)
        logging.info("resumed from step %d (index version %d, example %d)", start, index_version, data_position)
    else:
        if initial_index is not None:
            refresher.adopt(initial_index, version=0)
        else:
            refresher.request(state["params"], step=0, version=0, wait=True)
    step_fn = train_step_lib.make_train_step(encoder.config, optimizer, mesh, gamma=s.gamma, beta=s.beta,
                                             direction=s.direction, normalize=s.metric == "cosine", dtype=encoder.dtype)
    cache = LMScoreCache(os.path.join(workdir, "lm_cache.sqlite"), lm, key_fields={"doc_template": s.doc_template})
    logger = MetricsLogger(workdir, resume_step=start, enabled=lead)
    pending_checkpoint = False
    say = console.phases(progress and lead)
    say(f"LSR training: steps {start + 1}-{s.steps}, batch {s.batch_size}, k {s.k}, refresh every {s.refresh_every} "
        f"steps (index v{refresher.version})")
    try:
        for step in tqdm(range(start + 1, s.steps + 1), initial=start, total=s.steps, disable=not (progress and lead),
                         desc="LSR", unit="step"):
            started = time.perf_counter()
            swap = refresher.maybe_swap(step)
            batch_examples = [examples[(data_position + i) % len(examples)] for i in range(s.batch_size)]
            data_position += s.batch_size
            queries = encoder.embed([e.query for e in batch_examples], params=state["params"])
            exclude = excluded_rows(datastore, [[e.doc_id] for e in batch_examples], len(batch_examples))
            scores, rows = refresher.current.search(queries, s.k, exclude=exclude)
            lm_scores = supervise(cache, datastore, batch_examples, rows, lm_score=s.lm_score,
                                  doc_template=s.doc_template)
            batch = make_batch(encoder, datastore, batch_examples, rows, lm_scores, query_max_tokens=s.query_max_tokens,
                               doc_max_tokens=s.doc_max_tokens)
            state, metrics = step_fn(state, batch)
            if step % s.refresh_every == 0 and step < s.steps:
                refresher.request(state["params"], step=step, version=refresher.version + 1)
                if s.swap_after == 0:  # synchronous: serve it now, so no refresh is pending at the checkpoint
                    swap = refresher.maybe_swap(step) or swap
            metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
            metrics.update(index_version=refresher.version, step_seconds=time.perf_counter() - started,
                           mean_retrieval_score=float(np.mean(scores[rows >= 0])), **cache.stats())
            if swap:
                say(f"refresh: index v{swap['version']} {'swapped in' if swap['ok'] else 'FAILED, old index kept'} at "
                    f"step {step} (built in {swap['build_seconds']:.1f}s, training waited {swap['waited_seconds']:.1f}s)")
                metrics.update(refresh_swapped=True, refresh_ok=swap["ok"], refresh_seconds=swap.get("build_seconds"),
                               refresh_wait_seconds=swap.get("waited_seconds"))
            if step % s.log_every == 0 or swap:
                logger.log(step, metrics)
            pending_checkpoint |= step % s.checkpoint_every == 0 or step == s.steps
            if pending_checkpoint and not refresher.pending:
                checkpoints.save(step, state, {"step": step, "index_version": refresher.version,
                                               "data_position": data_position})
                pending_checkpoint = False
        final_params = jax.device_get(state["params"])
        if lead and os.path.isfile(logger.path):
            plot_loss(workdir)
        return {"params": final_params, "index_version": refresher.version, "steps": s.steps,
                "stats": {**cache.stats(), "refreshes": refresher.version}}
    finally:
        logger.close()
        refresher.close()
        cache.close()
