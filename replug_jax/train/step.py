"""The REPLUG LSR train step (§4.3): one jitted, sharded, donated update of the retriever.

The state is a plain pytree of the *retriever's* parameters and optimiser state only: the
LM is a black box that reaches the step as numbers (`lm_scores`), never as parameters.
Inside the step the query and its K retrieved documents are re-encoded with the current
parameters by one shared encoder, so the gradient of the loss reaches it through both
sides of the score s(d, x) = <E(d), E(x)> (cosine with `normalize=True`):

    state, metrics = train_step(state, batch)

`train_step.jitted = jax.jit(step, donate_argnums=(0,), in_shardings=(replicated, batch
over "data"), out_shardings=(replicated, replicated))`: parameters are replicated, the batch
axis is split over the 1-D device mesh, and the gradient all-reduce is inserted by XLA.
All batch arrays have fixed shapes, so the step compiles once (tests count `train_step.jitted`'s executables). The old
state's buffers are donated: do not touch a state after passing it to the step (copy
what a background thread needs to host first, e.g. with `jax.device_get`); `train_step`
checks for a donated state and raises, since jaxlib 0.10.2 segfaults on one with several
devices. Pass states placed by `init_train_state` / `place_state` (replicated on the
mesh): a state with another sharding is accepted but adds a compilation.

Multi-host: every process passes its own rows of the batch; `train_step` calls `shard_batch`, which builds the
global arrays from process-local data (on one host it is a plain `device_put`).
"""
from __future__ import annotations

from typing import Callable, TypedDict

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh

from replug_jax.method import lsr_loss
from replug_jax.models import encoder
from replug_jax.models.encoder import BertConfig
from replug_jax.parallel.sharding import batch_sharding, global_mesh, replicated

__all__ = ["TrainBatch", "BATCH_KEYS", "QUERY_SIDE_KEYS", "make_schedule", "make_optimizer", "current_learning_rate", "init_train_state",
           "place_state", "shard_batch", "retrieval_scores", "make_loss_fn", "make_train_step"]


class TrainBatch(TypedDict):
    """One fixed-shape training batch (a plain dict at run time). B queries, K documents each.

    query_ids [B, Lq] int32, query_mask [B, Lq] (1 = token), doc_ids [B, K, Ld] int32,
    doc_mask_tokens [B, K, Ld], doc_valid [B, K] bool (False: a padding slot, whose ids
    may be anything), lm_scores [B, K] float32: ℓ = log P_LM(y | d ∘ x), summed over the
    continuation's tokens or their mean (the caller's choice; see `replug_jax.method.lsr_loss`).
    B must be a multiple of the number of devices in the mesh. A query or document with
    no tokens is treated as invalid (a row without a query has no loss).
    """

    query_ids: np.ndarray
    query_mask: np.ndarray
    doc_ids: np.ndarray
    doc_mask_tokens: np.ndarray
    doc_valid: np.ndarray
    lm_scores: np.ndarray


BATCH_KEYS = tuple(TrainBatch.__annotations__)
# query-side-only training (document encoder frozen): the documents arrive as their index embeddings
QUERY_SIDE_KEYS = ("query_ids", "query_mask", "doc_embeddings", "doc_valid", "lm_scores")  # doc_embeddings [B, K, D]


# the similarities in true float32 whatever the accelerator would do by default (TF32 on GPU: ~1e-3 in a cosine,
# 1e-2 in a score over γ = 0.1); a [B, K, D] product, cheap
EXACT = jax.lax.Precision.HIGHEST

def make_schedule(learning_rate: float, total_steps: int, warmup_fraction: float = 0.1,
                  decay: str = "linear") -> optax.Schedule:
    """Learning rate per step: linear warmup from 0 over the first `warmup_fraction` of
    `total_steps`, then "linear" decay to 0 at `total_steps` (the usual companion of a
    warmup ratio, as in Hugging Face's linear schedule) or "constant".

    lr(0) = 0, lr(w) = learning_rate with w = max(1, round(warmup_fraction * total_steps)).
    """
    if total_steps < 1 or not 0 <= warmup_fraction < 1:
        raise ValueError(f"need total_steps >= 1 and 0 <= warmup_fraction < 1, got {total_steps}, {warmup_fraction}")
    if decay not in ("linear", "constant"):
        raise ValueError(f"decay must be 'linear' or 'constant', got {decay!r}")
    warmup = max(1, round(warmup_fraction * total_steps)) if warmup_fraction > 0 else 0
    after = (optax.linear_schedule(learning_rate, 0.0, max(1, total_steps - warmup)) if decay == "linear"
             else optax.constant_schedule(learning_rate))
    if warmup == 0:
        return after
    return optax.join_schedules([optax.linear_schedule(0.0, learning_rate, warmup), after], [warmup])


def make_optimizer(learning_rate: float, total_steps: int, warmup_fraction: float = 0.1, clip_norm: float | None = 1.0,
                   *, decay: str = "linear") -> optax.GradientTransformation:
    """Adam (the paper: lr 2e-5, warmup ratio 0.1) on gradients clipped to global norm `clip_norm`.

    The schedule is `make_schedule(...)`; its current value is kept in the optimiser state
    (`optax.inject_hyperparams`) and read back by `current_learning_rate`. `clip_norm=None`
    disables clipping.
    """
    schedule = make_schedule(learning_rate, total_steps, warmup_fraction, decay)
    adam = optax.inject_hyperparams(optax.adam)(learning_rate=schedule)
    return adam if clip_norm is None else optax.chain(optax.clip_by_global_norm(clip_norm), adam)


def current_learning_rate(opt_state) -> jax.Array:
    """The learning rate of the last update (of an optimiser from `make_optimizer`; NaN for others)."""
    arrays_only = lambda path, value: isinstance(value, jax.Array)  # noqa: E731 (skips the schedule's own state)
    return jnp.asarray(optax.tree_utils.tree_get(opt_state, "learning_rate", default=jnp.nan, filtering=arrays_only),
                       jnp.float32)


def place_state(state, mesh: Mesh):
    """The state replicated over `mesh`, as the step expects it (no recompilation, donation works)."""
    return jax.device_put(state, replicated(mesh))


def init_train_state(params, optimizer: optax.GradientTransformation, mesh: Mesh | None = None) -> dict:
    """{"params", "opt_state", "step": int32 []}, replicated over
    `mesh` (default: every device of every process, `global_mesh()`). `params` (numpy or jax) are copied, so
    the caller's arrays survive the step's donation.
    """
    params = jax.tree.map(lambda x: jnp.array(x, copy=True), params)
    state = {"params": params, "opt_state": optimizer.init(params), "step": jnp.zeros((), jnp.int32)}
    # strong types everywhere: a weakly typed leaf would change after one step and recompile
    state = jax.tree.map(lambda x: jnp.asarray(x, jnp.result_type(x)) if getattr(x, "weak_type", False) else x, state)
    return place_state(state, mesh if mesh is not None else global_mesh())


def shard_batch(batch: dict, mesh: Mesh) -> dict:
    """Process-local batch rows as global arrays split over the mesh's "data" axis (a full or a
    query-side batch, by whether it has "doc_embeddings")."""
    sharding = batch_sharding(mesh)
    keys = QUERY_SIDE_KEYS if "doc_embeddings" in batch else BATCH_KEYS
    return {k: jax.make_array_from_process_local_data(sharding, np.asarray(batch[k])) for k in keys}


def _with_a_token(mask, has_tokens):
    """mask [N, L] with the first position switched on in rows without tokens (defined embeddings)."""
    first = jnp.arange(mask.shape[-1]) == 0  # [L]
    return jnp.where(has_tokens[:, None] | ~first[None, :], mask, 1).astype(mask.dtype)


def retrieval_scores(params, config: BertConfig, batch, normalize: bool = True, dtype=jnp.float32,
                     recompute: bool = False):
    """Re-encode the queries and documents with `params`: -> (scores [B, K] float32, valid [B, K] bool).

    One shared encoder on both sides; s = <E(d), E(x)>. A batch with "doc_embeddings" [B, K, D]
    (query-side-only training) encodes only the queries and takes the documents' vectors as
    constants. `recompute`: the gradient recomputes the encoder's layer activations (`encoder.embed`). Invalid slots
    (doc_valid False, no tokens, or a query without tokens) are
    encoded as a one-token padding document, so their
    embeddings are finite (NaN there would leak into the gradient through the query side,
    and a zero vector has a NaN gradient under L2 normalisation); their scores are not used.
    """
    q_mask = jnp.asarray(batch["query_mask"])  # [B, Lq]
    q_has = jnp.any(q_mask > 0, axis=-1)  # [B]
    q_ids = jnp.where(q_has[:, None], batch["query_ids"], config.pad_token_id)
    q = encoder.embed(params, config, q_ids, _with_a_token(q_mask, q_has), normalize, dtype, recompute)  # [B, D]
    if "doc_embeddings" in batch:  # query-side only: the documents are the index's (frozen) vectors
        valid = jnp.asarray(batch["doc_valid"], bool) & q_has[:, None]  # [B, K]
        d = jnp.where(valid[..., None], jnp.asarray(batch["doc_embeddings"], jnp.float32), 0.0)  # [B, K, D]
        return jnp.einsum("bkd,bd->bk", d, q.astype(jnp.float32), precision=EXACT), valid
    b, k, ld = batch["doc_ids"].shape
    d_ids = jnp.asarray(batch["doc_ids"]).reshape(b * k, ld)  # [B*K, Ld]
    d_mask = jnp.asarray(batch["doc_mask_tokens"]).reshape(b * k, ld)  # [B*K, Ld]
    valid = (jnp.asarray(batch["doc_valid"], bool) & q_has[:, None]).reshape(b * k) & jnp.any(d_mask > 0, axis=-1)
    d_ids = jnp.where(valid[:, None], d_ids, config.pad_token_id)
    d_mask = _with_a_token(jnp.where(valid[:, None], d_mask, 0), valid)
    d = encoder.embed(params, config, d_ids, d_mask, normalize, dtype, recompute).reshape(b, k, -1)  # [B, K, D]
    scores = jnp.einsum("bkd,bd->bk", d, q, preferred_element_type=jnp.float32, precision=EXACT)  # [B, K]
    return scores, valid.reshape(b, k)


def make_loss_fn(config: BertConfig, *, gamma: float, beta: float, direction: str = "pr_q", normalize: bool = True,
                 dtype=jnp.float32, recompute: bool = False) -> Callable:
    """loss_fn(params, batch) -> (loss, metrics): the LSR loss of freshly encoded scores (no jit, no sharding)."""
    if direction not in lsr_loss.DIRECTIONS:
        raise ValueError(f"direction must be one of {lsr_loss.DIRECTIONS}, got {direction!r}")

    def loss_fn(params, batch):
        scores, valid = retrieval_scores(params, config, batch, normalize, dtype, recompute)  # [B, K]
        return lsr_loss.lsr_loss(scores, batch["lm_scores"], valid, gamma, beta, direction)

    return loss_fn


def make_train_step(config: BertConfig, optimizer: optax.GradientTransformation, mesh: Mesh, *, gamma: float,
                    beta: float, direction: str = "pr_q", normalize: bool = True, dtype=jnp.float32,
                    recompute: bool = False) -> Callable:
    """train_step(state, batch) -> (state, metrics), jitted with donated state; see the module doc.

    metrics (scalars, replicated): loss, entropy_pr, entropy_q, top1_agreement, grad_norm
    (global norm before clipping) and learning_rate (the one this step used).
    """
    loss_fn = make_loss_fn(config, gamma=gamma, beta=beta, direction=direction, normalize=normalize, dtype=dtype,
                           recompute=recompute)

    def step(state, batch):
        params = state["params"]
        (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch)
        updates, opt_state = optimizer.update(grads, state["opt_state"], params)
        new_state = {"params": optax.apply_updates(params, updates), "opt_state": opt_state,
                     "step": state["step"] + 1}
        metrics = dict(metrics, loss=loss, grad_norm=optax.tree.norm(grads),
                       learning_rate=current_learning_rate(opt_state))
        return new_state, metrics

    rep = replicated(mesh)
    jitted = jax.jit(step, donate_argnums=(0,), in_shardings=(rep, batch_sharding(mesh)), out_shardings=(rep, rep))

    def train_step(state, batch):
        # jaxlib 0.10.2 segfaults (instead of raising) when a donated multi-device buffer is passed again
        if any(isinstance(x, jax.Array) and x.is_deleted() for x in jax.tree.leaves(state)):
            raise RuntimeError("this train state was donated to an earlier step: pass the state that step returned")
        return jitted(state, shard_batch(batch, mesh))

    train_step.jitted = jitted  # the jax.jit object itself (`.lower`; tests count its executables)
    return train_step
