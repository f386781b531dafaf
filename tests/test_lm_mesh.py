"""The LM on a ("data", "model") mesh of the 8 fake CPU devices: every weight split as the partition table says,
and scores and ensembled generation equal to the one-device run."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import replug_jax as rj
from replug_jax.parallel import sharding
from replug_jax.method.posterior import PrefillPosterior
from replug_jax.lm.local import LocalLM
from replug_jax.models import causal_lm, partition

from tests import hf_tiny

# (data, model) shapes; (8, 1), the data axis alone, is the one every job's tiny runs use, and (2, 4) splits both
# axes, so (8, 1) and (1, 8), the model axis alone, are second checks: slow
MESHES = [pytest.param((8, 1), marks=pytest.mark.slow), (2, 4), pytest.param((1, 8), marks=pytest.mark.slow)]
CONTEXTS = [f"context number {i} about something" * (1 + i % 2) for i in range(9)]
CONTINUATIONS = [f" continuation {i}" * (1 + i % 3) for i in range(9)]
GEN_CONTEXTS = [["first passage. Q: what", "second one. Q: what"], ["only one pass here. Q:"], ["a", "b c", "d e f"]]
GEN_WEIGHTS = [[-0.2, -1.7], [0.0], [-1.0, -1.1, -1.3]]
# the posterior read in the prefill: every pass ends with its question's query, the 2 best of 3 kept
POSTERIOR_CONTEXTS = [[f"{p} Q: what is it?" for p in ("first passage.", "second one", "a third")],
                      [f"{p} Q: why" for p in ("only", "two passes")], [f"{p} Q: and" for p in ("a", "b c", "d e f")]]
POSTERIOR_WEIGHTS = [[-0.2, -1.7, -2.0], [-0.1, -2.4], [-1.0, -1.1, -1.3]]
POSTERIOR = PrefillPosterior([" Q: what is it?", " Q: why", " Q: and"], alpha=0.7, keep=2)


def generations(lm):
    """REPLUG's generation, and the posterior's (weights fixed at the prefill)."""
    return (lm.generate(GEN_CONTEXTS, GEN_WEIGHTS, max_new_tokens=6, stop=()),
            lm.generate(POSTERIOR_CONTEXTS, POSTERIOR_WEIGHTS, max_new_tokens=6, stop=(), posterior=POSTERIOR))


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen2")
    hf_tiny.tiny_qwen2(str(path))  # q/k/v biases too
    return str(path)


@pytest.fixture(scope="module")
def reference(tiny_dir):
    """The one-device run: scores and generations."""
    lm = rj.load_lm(tiny_dir, batch_size=8, mesh=sharding.data_mesh(jax.devices()[:1]))
    return lm.score(CONTEXTS, CONTINUATIONS), generations(lm)


def odd_config() -> causal_lm.CausalLMConfig:
    """A tiny Llama whose vocabulary (262), KV heads (3) and MLP width (100) the 8-way model axis does not divide."""
    return causal_lm.CausalLMConfig(arch="llama", vocab_size=262, hidden_size=48, num_layers=2, num_heads=6,
                                    num_kv_heads=3, intermediate_size=100, max_position=64, norm_eps=1e-5,
                                    hidden_act="silu", tie_embeddings=False)


def test_lm_mesh_shape_and_errors():
    mesh = sharding.lm_mesh(4)
    assert mesh.axis_names == ("data", "model") and sharding.mesh_shape(mesh) == {"data": 2, "model": 4}
    assert sharding.mesh_shape(sharding.data_mesh()) == {"data": 8, "model": 1}
    with pytest.raises(ValueError, match="lm_model_parallel=3 does not divide the 8 devices"):
        sharding.lm_mesh(3)


@pytest.mark.parametrize("model", [2, 4, 8])
def test_every_weight_is_split_as_the_table_says(model):
    """On a (8/M, M) mesh: the spec and the per-device shard shape of every parameter of a tiny Llama whose
    vocabulary, heads, KV heads and MLP width do not all divide the model axis (those dimensions stay whole).
    Attention splits by whole heads: 6 query heads over 2 shards, but not over 4 or 8 (48 columns would divide,
    cutting heads in half); 3 KV heads never (their 24 columns divide by 2, 4 and 8)."""
    config = odd_config()
    params = causal_lm.init_params(config)
    mesh = sharding.lm_mesh(model)
    lm = LocalLM(config, params, _byte_tokenizer(), batch_size=8, mesh=mesh)
    m = "model"
    mlp = 100 % model == 0  # 100 is split over 2 and 4, not over 8
    q = 6 % model == 0  # whole query heads per shard: over 2 only
    vocab = 262 % model == 0
    expected = {  # path -> (spec, shard shape); the blocks' weights are stacked [2 layers, ...], the layer axis
        # never split
        "embed_tokens/embedding": (P(m if vocab else None, None), (262 // model if vocab else 262, 48)),
        "layers/q_proj/kernel": (P(None, None, m if q else None), (2, 48, 48 // model if q else 48)),
        "layers/k_proj/kernel": (P(None, None, None), (2, 48, 24)),
        "layers/v_proj/kernel": (P(None, None, None), (2, 48, 24)),
        "layers/o_proj/kernel": (P(None, m if q else None, None), (2, 48 // model if q else 48, 48)),
        "layers/gate_proj/kernel": (P(None, None, m if mlp else None), (2, 48, 100 // model if mlp else 100)),
        "layers/up_proj/kernel": (P(None, None, m if mlp else None), (2, 48, 100 // model if mlp else 100)),
        "layers/down_proj/kernel": (P(None, m if mlp else None, None), (2, 100 // model if mlp else 100, 48)),
        "layers/input_norm/scale": (P(None, None), (2, 48)),
        "final_norm/scale": (P(None), (48,)),
        "lm_head/kernel": (P(None, m if vocab else None), (48, 262 // model if vocab else 262)),
    }
    got = {partition.param_path(path): x for path, x in jax.tree_util.tree_flatten_with_path(lm.params)[0]}
    assert set(got) >= set(expected)
    for path, (spec, shard) in expected.items():
        x = got[path]
        assert x.sharding.spec == spec, path
        assert {s.data.shape for s in x.addressable_shards} == {shard}, path
    # a vocabulary the axis divides is split: the 260-token Qwen2 with 2 KV heads
    assert partition.param_specs({"embed_tokens": {"embedding": jnp.zeros((260, 48))}}, sharding.lm_mesh(4),
                                 config) == \
        {"embed_tokens": {"embedding": P(m, None)}}
    rows = "data" if model < 8 else None  # a 1-way axis is left out of the spec
    assert partition.kv_cache_spec(3, mesh) == P(None, rows, None, None, None)  # 3 heads: not split
    assert partition.kv_cache_spec(2, sharding.lm_mesh(2)) == P(None, "data", None, m, None)


def test_qwen2_biases_and_vocabulary_split_over_four():
    config = dataclasses.replace(odd_config(), arch="qwen2", qkv_bias=True, vocab_size=264, num_heads=8,
                                 num_kv_heads=4, intermediate_size=96)
    specs = partition.param_specs(causal_lm.init_params(config), sharding.lm_mesh(4), config)
    assert specs["layers"]["q_proj"]["bias"] == P(None, "model") and specs["layers"]["k_proj"]["bias"] == P(None, "model")
    assert specs["embed_tokens"]["embedding"] == P("model", None) and specs["lm_head"]["kernel"] == P(None, "model")
    assert specs["layers"]["down_proj"]["kernel"] == P(None, "model", None)


@pytest.mark.parametrize("shape", MESHES)
def test_scores_and_generation_equal_the_one_device_run(tiny_dir, reference, shape):
    data, model = shape
    lm = rj.load_lm(tiny_dir, batch_size=8, model_parallel=model)
    assert sharding.mesh_shape(lm.mesh) == {"data": data, "model": model}
    assert lm._batch_fn.batch_size % data == 0
    scores, gens = reference
    for got, want in zip(lm.score(CONTEXTS, CONTINUATIONS), scores):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for out, want in zip(generations(lm), gens):
        assert [g.token_ids for g in out] == [g.token_ids for g in want]
        for a, b in zip(out, want):
            np.testing.assert_allclose(a.logprobs, b.logprobs, rtol=1e-5, atol=1e-6)
            if b.log_weights is not None:  # the posterior's weights and log p(x | d), 2 of each question's kept
                np.testing.assert_allclose(a.log_weights, b.log_weights, rtol=1e-5, atol=1e-5)
                np.testing.assert_allclose(a.query_logliks, b.query_logliks, rtol=1e-5, atol=1e-5)
                assert np.isfinite(b.log_weights).sum() == 2
    if model > 1:  # the weights really are split: the MLP's columns, and q's by whole heads where they divide
        up = lm.params["layers"]["up_proj"]["kernel"]  # [layers, D, F]
        assert up.addressable_shards[0].data.shape == (up.shape[0], up.shape[1], up.shape[2] // model)
        q = lm.params["layers"]["q_proj"]["kernel"]  # [layers, D, H·Dh]
        split = lm.config.num_heads % model == 0
        assert q.addressable_shards[0].data.shape[2] == q.shape[2] // (model if split else 1)


def test_odd_model_on_every_mesh_scores_as_on_one_device():
    """The tiny Llama whose dimensions do not divide the axis: scores on (2, 4) and (1, 8) equal one device's."""
    config, tok = odd_config(), _byte_tokenizer()
    params = causal_lm.init_params(config, seed=1)
    one = LocalLM(config, params, tok, batch_size=8, mesh=sharding.data_mesh(jax.devices()[:1])).score(CONTEXTS, CONTINUATIONS)
    for model in (4, 8):
        got = LocalLM(config, params, tok, batch_size=8, model_parallel=model).score(CONTEXTS, CONTINUATIONS)
        for a, b in zip(got, one):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_fingerprint_of_split_weights_equals_the_replicated_ones(tiny_dir):
    """The LM-score cache key does not depend on how the weights are laid out (and never copies them whole)."""
    one = rj.load_lm(tiny_dir, batch_size=8, mesh=sharding.data_mesh(jax.devices()[:1]))
    split = rj.load_lm(tiny_dir, batch_size=8, model_parallel=4)
    assert split.fingerprint() == one.fingerprint()


def _byte_tokenizer():
    import tempfile

    from replug_jax.models import tokenizer

    with tempfile.TemporaryDirectory() as d:
        hf_tiny.save_tiny_tokenizer(d)
        return tokenizer.from_hf_dir(d)


def test_streamed_loading_reads_each_devices_slice_once_and_never_a_split_tensor_whole(tmp_path):
    """A tiny Llama saved in several safetensors shards, placed on a (2, 4) mesh from lazy tensors: values equal
    the whole-file load; a split tensor is read as 4 quarter slices (never whole, though 8 devices hold it), a
    replicated one once."""
    from replug_jax.models import streamed, weights

    hf_tiny.tiny_llama(str(tmp_path), shard=True)
    assert len(weights.safetensors_files(str(tmp_path))) > 1
    _, whole = weights.load_causal_lm_dir(str(tmp_path))
    reads = []
    config, lazy = weights.lazy_causal_lm_dir(str(tmp_path), reads)
    assert reads == []  # nothing read before placing
    mesh = sharding.lm_mesh(4)
    specs = partition.param_specs(lazy, mesh, config)
    placed = streamed.place(lazy, partition.param_shardings(lazy, mesh, config), np.float32)
    flat_whole = dict((partition.param_path(p), x) for p, x in jax.tree_util.tree_flatten_with_path(whole)[0])
    flat_placed = dict((partition.param_path(p), x) for p, x in jax.tree_util.tree_flatten_with_path(placed)[0])
    flat_specs = dict((partition.param_path(p), x) for p, x in
                      jax.tree_util.tree_flatten_with_path(specs, is_leaf=lambda x: isinstance(x, P))[0])
    flat_lazy = dict((partition.param_path(p), x) for p, x in jax.tree_util.tree_flatten_with_path(
        lazy, is_leaf=lambda x: isinstance(x, streamed.LazyTensor))[0])
    assert set(flat_placed) == set(flat_whole)
    for path, x in flat_placed.items():
        np.testing.assert_array_equal(np.asarray(x), flat_whole[path], err_msg=path)
        assert x.sharding.spec == flat_specs[path]
        tensor = flat_lazy[path]  # one file tensor, or the stacked layers' tensors (one per layer)
        parts = tensor.parts if isinstance(tensor, streamed.Stacked) else (tensor,)
        split = any(axis is not None for axis in flat_specs[path])
        for part in parts:
            mine = [r for r in reads if r[0] == part.name]
            assert len(mine) == (4 if split else 1), (path, part.name)
            sizes = {int(np.prod([b - a for a, b in r[1]])) for r in mine}
            assert sizes == {int(np.prod(part.shape)) // (4 if split else 1)}, path
    assert any(any(a is not None for a in s) for s in flat_specs.values())  # the test split something
    # the loader the API uses: the same scores as the whole load on one device
    lm = rj.load_lm(str(tmp_path), batch_size=8, model_parallel=4)
    one = LocalLM(config, whole, lm.tokenizer, batch_size=8, mesh=sharding.data_mesh(jax.devices()[:1]))
    for a, b in zip(lm.score(CONTEXTS[:3], CONTINUATIONS[:3]), one.score(CONTEXTS[:3], CONTINUATIONS[:3])):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_lazy_tensor_reads_bfloat16_slices_and_transposes(tmp_path):
    import torch
    from safetensors.torch import save_file

    from replug_jax.models import streamed

    ref = torch.randn(6, 10).to(torch.bfloat16)
    save_file({"w": ref}, str(tmp_path / "w.safetensors"))
    lazy = streamed.lazy_state_dict([str(tmp_path / "w.safetensors")])["w"]
    full = ref.float().numpy()
    assert lazy.shape == (6, 10) and lazy.T.shape == (10, 6)
    np.testing.assert_array_equal(lazy.read((slice(2, 4),)), full[2:4])
    np.testing.assert_array_equal(lazy.T.read((slice(None), slice(1, 3))), full.T[:, 1:3])
    np.testing.assert_array_equal(np.asarray(lazy), full)


# slow: a model axis over processes; the same meshes within one process are checked above (core)
@pytest.mark.slow
@pytest.mark.parametrize("model_parallel", [4, 2])
def test_model_axis_spanning_two_processes_scores_as_one_device(tiny_dir, reference, tmp_path, model_parallel):
    """2 processes × 2 devices on one global LM mesh, every process scoring the same pairs in lockstep: (1, 4), the
    model axis spans both processes (a 2-host slice); (2, 2), each process one data row (the data axis spans the
    processes). Scores and ensembled generations equal one device's."""
    import json
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = tmp_path / "scores.json"
    command = [sys.executable, "-m", "replug_jax.launch", "--processes", "2", "--devices", "2", "--", sys.executable,
               os.path.join(root, "tests", "lm_mesh_child.py"), tiny_dir, str(out), str(model_parallel)]
    done = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    got = json.load(open(out))
    assert got["mesh"] == {"data": 4 // model_parallel, "model": model_parallel}
    for a, b in zip(got["scores"], reference[0]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert [g["ids"] for g in got["generations"]] == [g.token_ids for g in reference[1][0]]
    for a, b in zip(got["generations"], reference[1][0]):
        np.testing.assert_allclose(a["logprobs"], b.logprobs, rtol=1e-5, atol=1e-6)


def _collectives(config, model: int, monkeypatch=None, heads=None) -> dict:
    """Collective ops in the compiled scoring program of a tiny `config` LM on a (8/M, M) mesh; `heads` overrides
    the head counts partitioning sees (e.g. one "head" per column: splits by columns alone, as before heads)."""
    import re

    if heads is not None:
        real = partition.param_specs
        monkeypatch.setattr(partition, "param_specs", lambda params, mesh, _: real(params, mesh, heads))
    lm = LocalLM(config, causal_lm.init_params(config), _byte_tokenizer(), batch_size=8, mesh=sharding.lm_mesh(model))
    ids, where = np.zeros((8, 32), np.int32), np.zeros((8, 32), np.int32)
    args = jax.device_put((ids, ids, where, where), sharding.batch_sharding(lm.mesh))
    text = lm._batch_fn.jitted.lower(lm.params, *args).compile().as_text()
    return {op: len(re.findall(rf"= \S+ {op}(-start)?\(", text))
            for op in ("all-reduce", "all-gather", "all-to-all", "collective-permute")}


def test_attention_split_by_heads_needs_no_resharding(monkeypatch):
    """6 heads and 3 KV heads (8 wide) on 2 model shards: q and o split by heads, k and v whole. The compiled
    scoring program then gathers less than one whose k/v columns are cut in the middle of a head (24 columns
    over 2 shards: 1.5 heads each), and never permutes or exchanges all-to-all."""
    config = odd_config()
    by_heads = _collectives(config, 2)
    by_columns = _collectives(config, 2, monkeypatch, heads=dataclasses.replace(config, num_heads=48, num_kv_heads=24))
    assert by_heads["all-to-all"] == by_heads["collective-permute"] == 0
    assert by_heads["all-gather"] < by_columns["all-gather"], (by_heads, by_columns)
    assert by_heads["all-reduce"] >= 2  # the attention and MLP outputs of the (scanned) block
