"""The LSR train step on a tiny random BERT over 8 fake devices: learning, gradients, compilation, donation."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from replug_jax.method import lsr_loss
from replug_jax.models import encoder
from replug_jax.models.weights import load_bert_dir
from replug_jax.parallel.sharding import data_mesh
from replug_jax.train import step as ts
from tests import hf_tiny
from tests.hf_tiny import compiled_programs

B, K, LQ, LD = 8, 3, 6, 10
GAMMA, BETA = 0.1, 0.5


def make_batch(seed, garbage=True):
    """A random TrainBatch; with `garbage`, invalid slots hold out-of-range ids, no tokens and NaN ℓ."""
    rng = np.random.default_rng(seed)
    q_len = rng.integers(1, LQ + 1, size=B)
    d_len = rng.integers(1, LD + 1, size=(B, K))
    batch = {
        "query_ids": rng.integers(1, hf_tiny.VOCAB, size=(B, LQ)).astype(np.int32),
        "query_mask": (np.arange(LQ) < q_len[:, None]).astype(np.int32),
        "doc_ids": rng.integers(1, hf_tiny.VOCAB, size=(B, K, LD)).astype(np.int32),
        "doc_mask_tokens": (np.arange(LD) < d_len[..., None]).astype(np.int32),
        "doc_valid": np.ones((B, K), bool),
        "lm_scores": rng.uniform(-40, -20, size=(B, K)).astype(np.float32),
    }
    batch["doc_valid"][1, 2] = batch["doc_valid"][5, 1:] = False
    if garbage:
        for b, k in zip(*np.nonzero(~batch["doc_valid"])):
            batch["doc_ids"][b, k] = 10**6
            batch["doc_mask_tokens"][b, k] = 0
            batch["lm_scores"][b, k] = np.nan
    return batch


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("tiny_bert"))
    hf_tiny.tiny_bert(path)
    return load_bert_dir(path)  # (config, numpy params)


@pytest.fixture(scope="module")
def setup(bert):
    config, params = bert
    mesh = data_mesh()
    assert mesh.devices.size == 8
    optimizer = ts.make_optimizer(1e-3, total_steps=20, warmup_fraction=0.1)  # warmup over 2 steps
    train_step = ts.make_train_step(config, optimizer, mesh, gamma=GAMMA, beta=BETA)
    return config, params, mesh, optimizer, train_step


def test_learns_and_compiles_once(setup):
    config, params, mesh, optimizer, train_step = setup
    state = ts.init_train_state(params, optimizer, mesh=mesh)
    batch = make_batch(0)
    losses, lrs = [], []
    for _ in range(6):  # a fixed batch: the loss must go down
        state, metrics = train_step(state, batch)
        assert all(np.isfinite(float(v)) for v in metrics.values()), metrics
        losses.append(float(metrics["loss"]))
        lrs.append(float(metrics["learning_rate"]))
    assert losses[-1] < 0.8 * losses[0], losses
    assert losses[1] == pytest.approx(losses[0], rel=1e-6)  # lr(0) = 0: the first step changes nothing
    np.testing.assert_allclose(lrs, [0, 5e-4, 1e-3, 1e-3 * 17 / 18, 1e-3 * 16 / 18, 1e-3 * 15 / 18], rtol=1e-5)
    for seed in (1, 2, 3):  # new values, same shapes: no recompilation
        state, metrics = train_step(state, make_batch(seed))
    assert int(state["step"]) == 9
    assert compiled_programs(train_step.jitted) == 1
    assert set(metrics) == {"loss", "entropy_pr", "entropy_q", "top1_agreement", "grad_norm", "learning_rate"}
    assert 0 <= float(metrics["top1_agreement"]) <= 1
    assert 0 < float(metrics["entropy_q"]) <= np.log(K) + 1e-6


def test_donation(setup):
    config, params, mesh, optimizer, train_step = setup
    state = ts.init_train_state(params, optimizer, mesh=mesh)
    leaf = state["params"]["word_embeddings"]["embedding"]
    opt_leaf = jax.tree.leaves(state["opt_state"])[-1]
    new_state, _ = train_step(state, make_batch(4))
    assert leaf.is_deleted() and opt_leaf.is_deleted() and state["step"].is_deleted()
    with pytest.raises(RuntimeError, match="donated"):
        train_step(state, make_batch(4))  # the old state is gone (jaxlib itself would segfault here)
    assert not new_state["params"]["word_embeddings"]["embedding"].is_deleted()
    assert isinstance(params["word_embeddings"]["embedding"], np.ndarray)  # the caller's params were copied
    assert compiled_programs(train_step.jitted) == 1


def grad_capture() -> optax.GradientTransformation:
    """An 'optimiser' that leaves params alone and keeps the last gradient as its state."""
    return optax.GradientTransformation(lambda p: jax.tree.map(jnp.zeros_like, p),
                                        lambda g, s, p=None: (jax.tree.map(jnp.zeros_like, g), g))


def test_gradient_matches_single_device(bert):
    config, params = bert
    mesh = data_mesh()
    batch = make_batch(5)
    step = ts.make_train_step(config, grad_capture(), mesh, gamma=GAMMA, beta=BETA, direction="q_pr")
    state, metrics = step(ts.init_train_state(params, grad_capture(), mesh=mesh), batch)
    sharded_grads = jax.device_get(state["opt_state"])

    loss_fn = ts.make_loss_fn(config, gamma=GAMMA, beta=BETA, direction="q_pr")
    one = jax.devices()[0]
    plain = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))  # one device, no sharding
    (loss, _), ref = plain(jax.device_put(params, one), jax.device_put(batch, one))
    assert float(metrics["loss"]) == pytest.approx(float(loss), rel=1e-5)
    assert float(metrics["grad_norm"]) == pytest.approx(float(optax.tree.norm(ref)), rel=1e-5)
    assert np.isnan(float(metrics["learning_rate"]))  # not an optimiser from make_optimizer
    flat_ref = jax.tree.leaves(ref)
    scale = max(float(np.max(np.abs(g))) for g in flat_ref)
    for got, want in zip(jax.tree.leaves(sharded_grads), flat_ref):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * scale)
    assert all(np.all(np.isfinite(g)) for g in flat_ref)


def test_recomputed_activations_give_the_same_step(bert):
    """recompute_activations: the step's loss, gradient norm and new parameters as without it, and its gradient is
    taken through a checkpointed (recomputed) layer stack, on both sides."""
    config, params = bert
    mesh, batch = data_mesh(), make_batch(8)
    optimizer = ts.make_optimizer(1e-3, total_steps=20)
    results = []
    for recompute in (False, True):
        step = ts.make_train_step(config, optimizer, mesh, gamma=GAMMA, beta=BETA, recompute=recompute)
        results.append(step(ts.init_train_state(params, optimizer, mesh=mesh), batch))
    (plain, plain_metrics), (recomputed, metrics) = results
    for key in ("loss", "grad_norm"):
        assert float(metrics[key]) == pytest.approx(float(plain_metrics[key]), rel=1e-6), key
    for a, b_ in zip(jax.tree.leaves(plain["params"]), jax.tree.leaves(recomputed["params"])):
        np.testing.assert_allclose(a, b_, rtol=1e-6, atol=1e-7)
    loss_fn = ts.make_loss_fn(config, gamma=GAMMA, beta=BETA, recompute=True)
    plain_fn = ts.make_loss_fn(config, gamma=GAMMA, beta=BETA)
    checkpoints = [len(re.findall(r"\b(?:checkpoint|remat2?)\[", str(jax.make_jaxpr(jax.grad(
        lambda p, fn=fn: fn(p, batch)[0]))(params)))) for fn in (loss_fn, plain_fn)]
    assert checkpoints == [2 * config.num_layers, 0], checkpoints  # each layer, on the query and document sides


def test_gradient_reaches_both_sides(bert):
    """The plain loss against an independent one with separate query-side and document-side params."""
    config, params = bert
    batch = make_batch(6, garbage=False)

    def two_sided(p_query, p_docs):
        q = encoder.embed(p_query, config, batch["query_ids"], batch["query_mask"], normalize=True)  # [B, D]
        d = encoder.embed(p_docs, config, batch["doc_ids"].reshape(B * K, LD),
                          batch["doc_mask_tokens"].reshape(B * K, LD), normalize=True).reshape(B, K, -1)
        scores = jnp.sum(d * q[:, None, :], -1)  # [B, K]
        return lsr_loss.lsr_loss(scores, batch["lm_scores"], batch["doc_valid"], GAMMA, BETA)[0]

    g_query, g_docs = jax.jit(jax.grad(two_sided, argnums=(0, 1)))(params, params)
    loss_fn = ts.make_loss_fn(config, gamma=GAMMA, beta=BETA)
    g = jax.jit(jax.grad(lambda p: loss_fn(p, batch)[0]))(params)
    scale = max(float(np.max(np.abs(x))) for x in jax.tree.leaves(g))
    for a, b_, total in zip(jax.tree.leaves(g_query), jax.tree.leaves(g_docs), jax.tree.leaves(g)):
        np.testing.assert_allclose(a + b_, total, rtol=1e-4, atol=1e-4 * scale)
    assert float(optax.tree.norm(g_query)) > 1e-4 and float(optax.tree.norm(g_docs)) > 1e-4


def test_invalid_slots_are_harmless(bert):
    """Garbage in padding slots (out-of-range ids, no tokens, NaN ℓ) changes neither loss nor gradient."""
    config, params = bert
    loss_fn = jax.jit(jax.value_and_grad(ts.make_loss_fn(config, gamma=GAMMA, beta=BETA), has_aux=True))
    clean = make_batch(7, garbage=False)
    dirty = make_batch(7, garbage=True)
    dirty["query_mask"][3] = 0  # a row without a query: no loss at all
    clean["doc_valid"][3] = False
    (l1, m1), g1 = loss_fn(params, clean)
    (l2, m2), g2 = loss_fn(params, dirty)
    assert np.isfinite(float(l2))
    assert float(l1) == pytest.approx(float(l2), rel=1e-6)
    for a, b_ in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
        assert np.all(np.isfinite(b_))
        np.testing.assert_allclose(a, b_, rtol=1e-5, atol=1e-9)


def test_schedule():
    s = ts.make_schedule(2e-5, total_steps=100, warmup_fraction=0.1)
    np.testing.assert_allclose([float(s(i)) for i in (0, 1, 5, 10, 55, 100)], [0, 2e-6, 1e-5, 2e-5, 1e-5, 0],
                               rtol=1e-5, atol=1e-12)
    c = ts.make_schedule(2e-5, total_steps=100, decay="constant")
    np.testing.assert_allclose([float(c(i)) for i in (0, 5, 10, 99)], [0, 1e-5, 2e-5, 2e-5], rtol=1e-5)
    with pytest.raises(ValueError):
        ts.make_schedule(1e-5, total_steps=0)
    # the optimiser reports the rate each update used
    opt = ts.make_optimizer(2e-5, total_steps=100)
    p = {"w": jnp.ones(3)}
    st = opt.init(p)
    for i in range(12):
        _, st = opt.update(p, st, p)
        assert float(ts.current_learning_rate(st)) == pytest.approx(float(s(i)), abs=1e-12)


def test_clipping_bounds_the_update():
    p = {"a": jnp.zeros(4), "b": jnp.zeros((2, 3))}
    huge = {"a": jnp.full(4, 300.0), "b": jnp.full((2, 3), -400.0)}
    for clip, want_mu in ((0.5, 0.1 * 0.5), (None, 0.1 * float(optax.tree.norm(huge)))):
        opt = ts.make_optimizer(1e-3, total_steps=10, warmup_fraction=0.0, clip_norm=clip)
        updates, st = opt.update(huge, opt.init(p), p)
        mu = optax.tree_utils.tree_get(st, "mu")  # Adam's first moment = (1 - b1) · the gradient it was given
        assert float(optax.tree.norm(mu)) == pytest.approx(want_mu, rel=1e-5)
        assert float(jnp.max(jnp.abs(jnp.concatenate([u.ravel() for u in jax.tree.leaves(updates)])))) <= 1e-3 * 1.001


def test_state_holds_only_the_retriever(bert):
    config, params = bert
    state = ts.init_train_state(params, ts.make_optimizer(1e-5, 10))
    assert set(state) == {"params", "opt_state", "step"}
    assert jax.tree.structure(state["params"]) == jax.tree.structure(jax.tree.map(np.asarray, params))
    bert_shapes = jax.eval_shape(lambda: encoder.init_params(config))
    assert jax.tree.structure(state["params"]) == jax.tree.structure(bert_shapes)
    n_params = sum(x.size for x in jax.tree.leaves(params))
    # optimiser state: Adam's two moments of exactly these parameters, plus scalars
    assert sum(x.size for x in jax.tree.leaves(state["opt_state"]) if x.ndim) == 2 * n_params
    assert state["step"].dtype == jnp.int32 and int(state["step"]) == 0
    assert all(not getattr(x, "weak_type", False) for x in jax.tree.leaves(state))
