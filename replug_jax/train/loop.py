"""The REPLUG LSR training loop (§4, §5.2): retrieve, ask the black-box LM, update the retriever.

Each step: embed the batch's queries with the current retriever, search the current index
(top-k, a text window's own document excluded), get ℓ(x, d, y) (with `lsr_target="question"`:
ℓ(x, d) = log p(x | d)) for every (query, document) pair from the LM through the persistent cache,
and run the jitted train step, which re-encodes queries and documents with the current parameters and
minimises KL(P_R ‖ Q). Every
`refresh_every` steps the refresher re-embeds the datastore on a background thread and
swaps the new index in `swap_after` steps later (a refresh is requested only when that swap falls
within the run). Checkpoints are taken only when no refresh is pending (the final step's always),
so a killed run resumes exactly: same index version, same data
position, same parameters and losses as an uninterrupted run.

Pipelined (`pipeline=True`): LM scoring dominates a step (and with an API LM it is network
time), so step t+1's retrieval, LM scores and arrays are prepared on a thread while step t
runs on the devices. Step t+1 then retrieves with the parameters *before* step t (one step
stale; the train step itself always re-encodes with the current ones). The schedule is fixed,
so a pipelined run is deterministic: its checkpoints keep the next step's retrieved rows
("next_rows"), and a killed run resumes to the same losses. Metrics: lm_seconds (asking the
LM for this step's batch) and wait_seconds (the loop blocked on the batch: all of the
preparation when serial, what the overlap did not hide when pipelined).

Several processes: each retrieves for, LM-scores and encodes only its own contiguous share of the
global batch (`distributed.share`); the step joins the shares into global arrays and XLA reduces the
gradient over every device of every process; process 0 logs. Each process keeps its own LM-score
cache (`lm_cache.p{i}.sqlite`: SQLite is unsafe when several hosts write one file on a shared file
system); all write the orbax checkpoints together; "next_rows" holds the whole global batch's rows. A refresh re-embeds the datastore split over
the processes on each one's background thread (`build_dense_index`), and process 0 builds the index.
"""
from __future__ import annotations

import dataclasses
import os
import time
from concurrent.futures import ThreadPoolExecutor

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from replug_jax.base import console, settings
from replug_jax.base.progress import tqdm
from replug_jax.method.passages import DOC_TEMPLATE
from replug_jax.models import precision
from replug_jax.parallel import distributed, sharding
from replug_jax.retrieval.refresh import IndexRefresher
from replug_jax.retrieval.retriever import excluded_rows
from replug_jax.train import step as train_step_lib
from replug_jax.train.batch import FrozenDocumentVectors, make_batch, supervise
from replug_jax.train.checkpoint import Checkpointer
from replug_jax.train.lm_cache import LMScoreCache
from replug_jax.train.metrics import MetricsLogger, plot_loss


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
    lsr_target: str = "answer"  # what ℓ scores after d: y (the paper); "question": x itself, Σ_t log p(x_t | d, x_<t)
    train_documents: bool = True  # False: query-side only (document encoder and index frozen, no refresh)
    recompute_activations: bool = False  # the train step recomputes the encoder's activations in its backward pass
    pipeline: bool = False  # retrieve and LM-score step t+1 on a thread while step t runs (queries one step stale)
    refresh_every: int = 3_000
    swap_after: int = 1  # steps between a refresh request and its swap (0: synchronous)
    query_max_tokens: int = 0  # encoder tokens of a query x (fixed shape); 0: the encoder's own, as retrieval
    doc_max_tokens: int = 0  # encoder tokens of a document (fixed shape); 0: the encoder's own, as the index
    checkpoint_every: int = 500
    keep_checkpoints: int = 3
    log_every: int = 1
    metric: str = "cosine"
    index_factory: str = "Flat"
    embedding_dtype: str = "float32"  # of the refreshed corpus embeddings on disk
    doc_template: str = DOC_TEMPLATE

    def __post_init__(self):
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name in settings.SETTINGS}
        settings.check_settings(values, prefix="LSRSettings: ")  # each value's range (base/settings.py)
        if not 0 <= self.swap_after < self.refresh_every:
            raise ValueError(f"LSRSettings: need 0 <= swap_after < refresh_every (one refresh at a time), got "
                             f"swap_after={self.swap_after}, refresh_every={self.refresh_every}")
        if "{text}" not in self.doc_template and "{passage}" not in self.doc_template:
            raise ValueError("LSRSettings: doc_template must contain {text} or {passage}")

    @classmethod
    def from_mapping(cls, values) -> "LSRSettings":
        """The settings a config (or dict) names; the others keep their defaults."""
        return cls(**{f.name: values[f.name] for f in dataclasses.fields(cls) if f.name in values})

    def index_versions_to_keep(self) -> int:
        """Saved index versions to keep so that every kept checkpoint finds the index it names.

        The kept checkpoints and the present span at most keep_checkpoints * (checkpoint_every + the
        deferral of a checkpoint past a pending refresh, max(swap_after, 1) steps); an index version is
        swapped in every refresh_every steps; one more for a build saved before its swap."""
        span = self.keep_checkpoints * (self.checkpoint_every + max(self.swap_after, 1))
        return -(-span // self.refresh_every) + 2


@dataclasses.dataclass
class Prepared:
    """A step's input: its retrieved rows [B, K] (scores [B, K]: None when the rows came from a checkpoint), the
    step's arrays, and the seconds spent asking the LM and preparing in all."""

    rows: np.ndarray
    scores: np.ndarray | None
    batch: dict
    lm_seconds: float
    seconds: float


def train_lsr(encoder, lm, datastore, examples, workdir: str, settings: LSRSettings, initial_index=None,
              mesh=None, progress: bool = True, on_checkpoint=None) -> dict:
    """Train the retriever; returns {"params", "index_version", "steps", "stats"}.

    `initial_index`: a DenseIndex of the datastore under the initial parameters (index version 0),
    so the first retrieval need not re-embed the corpus. `on_checkpoint()`: called after each checkpoint is saved
    (the LSR job pushes a bucket workdir to its bucket then, not only at the end).
    """
    s = settings
    if not examples:
        raise ValueError("LSR needs training examples")
    mesh = mesh or sharding.global_mesh()
    lead = distributed.is_lead()
    if s.batch_size % mesh.devices.size:
        raise ValueError(f"batch_size {s.batch_size} is not a multiple of the {mesh.devices.size} devices")
    mine = distributed.share(s.batch_size)  # this process's rows of every global batch
    optimizer = train_step_lib.make_optimizer(s.learning_rate, s.steps, s.warmup_fraction, s.clip_norm)
    weights = precision.cast_floating(jax.device_get(encoder.params), jnp.float32)  # trained in float32 whatever it serves in
    state = train_step_lib.init_train_state(weights, optimizer, mesh=mesh)
    checkpoints = Checkpointer(os.path.join(workdir, "checkpoints"), max_to_keep=s.keep_checkpoints)
    restored = checkpoints.restore(jax.eval_shape(lambda: state))
    start, index_version = 0, 0
    refresher = IndexRefresher(encoder, datastore, metric=s.metric, factory=s.index_factory,
                               workdir=os.path.join(workdir, "indexes"), swap_after=s.swap_after,
                               keep=s.index_versions_to_keep(), embedding_dtype=s.embedding_dtype)
    data_position = 0  # examples consumed so far (the batch of step t starts there, modulo the dataset)
    resume_rows, next_swap = None, None
    if restored is not None:
        start, state, meta = restored
        state = train_step_lib.place_state(state, mesh)  # the step's compiled sharding: no second compile
        index_version, data_position = meta["index_version"], meta["data_position"]
        if s.pipeline and meta.get("next_rows") is not None:  # the prefetched batch of the step after the checkpoint
            resume_rows = np.asarray(meta["next_rows"], np.int64)[mine.start : mine.stop]
        refresher.load_version(index_version)
        logging.info("resumed from step %d (index version %d, example %d)", start, index_version, data_position)
    else:
        if initial_index is not None:
            refresher.adopt(initial_index, version=0)
        else:
            refresher.request(state["params"], step=0, version=0, wait=True)
    step_fn = train_step_lib.make_train_step(encoder.config, optimizer, mesh, gamma=s.gamma, beta=s.beta,
                                             direction=s.direction, normalize=s.metric == "cosine", dtype=encoder.dtype,
                                             recompute=s.recompute_activations)
    cache = LMScoreCache(distributed.per_process_path(os.path.join(workdir, "lm_cache.sqlite")), lm)
    doc_vectors = None if s.train_documents else FrozenDocumentVectors(refresher.current)  # no refresh: the index stays version 0
    logger = MetricsLogger(workdir, resume_step=start, enabled=lead)
    pending_checkpoint = False
    say = console.phases(progress and lead)
    refreshing = (f"refresh every {s.refresh_every} steps" if s.train_documents
                  else "query side only: document encoder and index frozen")
    say(f"LSR training: steps {start + 1}-{s.steps}, batch {s.batch_size}, k {s.k}, {refreshing} "
        f"(index v{refresher.version}{', pipelined' if s.pipeline else ''})")

    def prepare(position: int, params, rows=None) -> Prepared:
        """A step's batch: its examples (from `position`), their top-k under `params` (or the given rows),
        LM scores, and the step's arrays. Runs on the prefetch thread when pipelined."""
        started = time.perf_counter()
        batch_examples = [examples[(position + i) % len(examples)] for i in mine]
        scores = None
        if rows is None:
            queries = encoder.embed([e.query for e in batch_examples], params=params)
            exclude = excluded_rows(datastore, [e.excluded_sources for e in batch_examples], len(batch_examples))
            scores, rows = refresher.current.search(queries, s.k, exclude=exclude)
        lm_started = time.perf_counter()
        lm_scores = supervise(cache, datastore, batch_examples, rows, lm_score=s.lm_score, doc_template=s.doc_template,
                              target=s.lsr_target)
        lm_seconds = time.perf_counter() - lm_started
        batch = make_batch(encoder, datastore, batch_examples, rows, lm_scores, query_max_tokens=s.query_max_tokens,
                           doc_max_tokens=s.doc_max_tokens, doc_vectors=doc_vectors)
        return Prepared(np.asarray(rows), scores, batch, lm_seconds, time.perf_counter() - started)

    distributed.barrier("LSR training starts")  # the first step's collective is set up within seconds on all
    prefetch = ThreadPoolExecutor(1, thread_name_prefix="lsr-prefetch") if s.pipeline else None
    upcoming = None  # pipelined: the next step's batch (a Future), prepared while this step runs
    try:
        for step in tqdm(range(start + 1, s.steps + 1), initial=start, total=s.steps, disable=not (progress and lead),
                         desc="LSR", unit="step"):
            started = time.perf_counter()
            if upcoming is None:  # serial, or the first pipelined step (rows saved by the checkpoint on resume)
                swap = refresher.maybe_swap(step)
                prepared = prepare(data_position, state["params"], rows=resume_rows)
                resume_rows, waited = None, prepared.seconds
            else:  # pipelined: this step's index was swapped in before its batch was prefetched
                swap = next_swap
                waited_from = time.perf_counter()
                prepared = upcoming.result()
                waited = time.perf_counter() - waited_from
            data_position += s.batch_size
            previous_params = jax.tree.map(jnp.copy, state["params"]) if s.pipeline else None  # before the donation
            state, metrics = step_fn(state, prepared.batch)  # dispatched: runs on the devices while we go on
            if s.train_documents and step % s.refresh_every == 0 and step + max(s.swap_after, 1) <= s.steps:
                # only a refresh that swaps in before the end: a later one would be wasted and block the last checkpoint
                refresher.request(state["params"], step=step, version=refresher.version + 1)
                if s.swap_after == 0:  # synchronous: serve it now, so no refresh is pending at the checkpoint
                    swap = refresher.maybe_swap(step) or swap
            version = refresher.version
            upcoming = None
            if s.pipeline and step < s.steps:  # step + 1 retrieves with the parameters before this step
                next_swap = refresher.maybe_swap(step + 1)
                upcoming = prefetch.submit(prepare, data_position, previous_params)
            metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
            retrieved = prepared.scores[prepared.rows >= 0] if prepared.scores is not None else np.zeros(0)
            metrics.update(index_version=version, step_seconds=time.perf_counter() - started,
                           lm_seconds=prepared.lm_seconds, wait_seconds=waited,
                           mean_retrieval_score=float(retrieved.mean()) if retrieved.size else 0.0, **cache.stats())
            if swap:
                say(f"refresh: index v{swap['version']} {'swapped in' if swap['ok'] else 'FAILED, old index kept'} at "
                    f"step {step} (built in {swap['build_seconds']:.1f}s, training waited {swap['waited_seconds']:.1f}s)")
                metrics.update(refresh_swapped=True, refresh_ok=swap["ok"], refresh_seconds=swap.get("build_seconds"),
                               refresh_wait_seconds=swap.get("waited_seconds"))
            if step % s.log_every == 0 or swap:
                logger.log(step, metrics)
            pending_checkpoint |= step % s.checkpoint_every == 0 or step == s.steps
            if pending_checkpoint and (not refresher.pending or step == s.steps):  # the final one always
                meta = {"step": step, "index_version": refresher.version, "data_position": data_position}
                if upcoming is not None:  # the next step's rows came from this step's input parameters: keep them
                    meta["next_rows"] = sum(distributed.allgather_json(upcoming.result().rows.tolist()), [])
                checkpoints.save(step, state, meta)
                if on_checkpoint is not None:
                    on_checkpoint()
                pending_checkpoint = False
        final_params = jax.device_get(state["params"])
        if lead and os.path.isfile(logger.path):
            plot_loss(workdir)
        distributed.barrier("LSR training done")  # processes leave together (jax.distributed's shutdown waits 5 min)
        return {"params": final_params, "index_version": refresher.version, "steps": s.steps,
                "stats": {**cache.stats(), "refreshes": refresher.version}}
    finally:
        if prefetch is not None:
            prefetch.shutdown(wait=True, cancel_futures=True)
        logger.close()
        refresher.close()
        cache.close()
