"""Our Flax models against the transformers PyTorch models built from the same tiny random configs."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import replug_jax as rj
from replug_jax.parallel import sharding
from replug_jax.models import causal_lm, kv_cache, encoder, weights

from tests import hf_tiny
from tests.hf_tiny import compiled_programs

RNG = np.random.default_rng(0)


def random_ids(length, vocab=hf_tiny.VOCAB):
    return [int(t) for t in RNG.integers(1, vocab, size=length)]


@pytest.mark.parametrize("shard", [False, True])
def test_bert_matches_torch(tmp_path, shard):
    ref = hf_tiny.tiny_bert(str(tmp_path), shard=shard)
    if shard:
        assert (tmp_path / "model.safetensors.index.json").exists()
    config, params = weights.load_bert_dir(str(tmp_path))
    ids = np.array([random_ids(12), random_ids(9) + [0, 0, 0]])
    mask = np.array([[1] * 12, [1] * 9 + [0] * 3])
    with torch.no_grad():
        states = ref(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).last_hidden_state.numpy()
    ours = np.asarray(encoder.BertEncoder(config).apply({"params": params}, ids, mask))
    assert np.abs(ours - states)[mask > 0].max() <= 1e-4
    pooled = (states * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
    pooled /= np.linalg.norm(pooled, axis=-1, keepdims=True)
    emb = np.asarray(encoder.embed(params, config, ids, mask, normalize=True))
    assert np.abs(emb - pooled).max() <= 1e-5


@pytest.mark.parametrize("builder", ["gpt2", "llama_untied", "llama_tied", "llama_sharded", "qwen2_untied",
                                     "qwen2_tied", "mistral_untied", "mistral_sharded"])
def test_causal_lm_logits_match_torch(tmp_path, builder):
    if builder == "gpt2":
        ref = hf_tiny.tiny_gpt2(str(tmp_path))
    else:
        family, variant = builder.split("_")
        ref = getattr(hf_tiny, f"tiny_{family}")(str(tmp_path), tie=variant == "tied", shard=variant == "sharded")
    config, params = weights.load_causal_lm_dir(str(tmp_path))
    assert config.tie_embeddings == (builder in ("gpt2", "llama_tied", "qwen2_tied"))
    assert config.qkv_bias == builder.startswith("qwen2")
    assert config.sliding_window == (8 if builder.startswith("mistral") else None)
    ids = random_ids(40)  # 5 times Mistral's window
    with torch.no_grad():
        expected = ref(torch.tensor([ids])).logits[0].numpy()
    ours = np.asarray(causal_lm.logits(params, config, jnp.array([ids]), jnp.ones((1, 40), jnp.int32)))[0]
    assert np.abs(ours - expected).max() <= 1e-4
    lps = np.asarray(causal_lm.token_logprobs(params, config, jnp.array([ids]), jnp.ones((1, 40), jnp.int32)))[0]
    np.testing.assert_allclose(lps[1:], hf_tiny.torch_logprobs(ref, ids), atol=1e-5)
    assert lps[0] == 0.0


@pytest.mark.parametrize("tie", [False, True])
def test_qwen2_gguf_matches_torch(tmp_path, tie):
    """A tiny random Qwen2 written as GGUF the way llama.cpp lays out qwen2 (HF row order, biases as
    blk.N.attn_q.bias, no output.weight when tied) loads to the torch model's log-probs."""
    from replug_jax.models import gguf_loader

    ref = hf_tiny.tiny_qwen2(str(tmp_path), tie=tie)
    hf_tiny.save_gguf(ref, str(tmp_path / "tiny.gguf"), "qwen2")
    config, params, tokenizer = gguf_loader.load_gguf(str(tmp_path / "tiny.gguf"))
    assert (config.arch, config.qkv_bias, config.tie_embeddings, config.rope_theta) == ("qwen2", True, tie, 250.0)
    assert tokenizer.encode("ab 1") == [tokenizer.backend.token_to_id(c) for c in "abĠ1"]
    ids = random_ids(30)
    lps = np.asarray(causal_lm.token_logprobs(params, config, jnp.array([ids]), jnp.ones((1, 30), jnp.int32)))[0]
    np.testing.assert_allclose(lps[1:], hf_tiny.torch_logprobs(ref, ids), atol=1e-5)


def test_qwen2_refuses_sliding_window():
    cfg = {"model_type": "qwen2", "vocab_size": 8, "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
           "intermediate_size": 8, "use_sliding_window": True}
    with pytest.raises(ValueError, match="use_sliding_window"):
        causal_lm.CausalLMConfig.from_hf(cfg)


def test_mistral_gguf_matches_torch_and_its_window_matters(tmp_path):
    """A tiny Mistral as llama.cpp writes it (architecture llama, Q/K rows permuted, the window as
    llama.attention.sliding_window) loads to the torch model's log-probs over 5 windows; the same weights
    without the window give other log-probs (so the window is what the test checks)."""
    import dataclasses

    from replug_jax.models import gguf_loader

    ref = hf_tiny.tiny_mistral(str(tmp_path), window=8)
    hf_tiny.save_gguf(ref, str(tmp_path / "tiny.gguf"), "llama")
    config, params, _ = gguf_loader.load_gguf(str(tmp_path / "tiny.gguf"))
    assert (config.arch, config.sliding_window, config.rope_theta) == ("llama", 8, 300.0)
    ids = random_ids(40)
    score = lambda cfg: np.asarray(causal_lm.token_logprobs(params, cfg, jnp.array([ids]), jnp.ones((1, 40), jnp.int32)))[0]
    expected = hf_tiny.torch_logprobs(ref, ids)
    np.testing.assert_allclose(score(config)[1:], expected, atol=1e-5)
    unwindowed = score(dataclasses.replace(config, sliding_window=None))[1:]
    np.testing.assert_allclose(unwindowed[:8], expected[:8], atol=1e-5)  # inside the first window: no difference
    assert np.abs(unwindowed[8:] - expected[8:]).max() > 1e-2


def test_mistral_window_through_the_cache(tmp_path):
    """Decoding through the key/value cache (a prefix, then pads and tokens one by one) keeps the window: the
    next-token logits after every token equal transformers' full forward pass."""
    ref = hf_tiny.tiny_mistral(str(tmp_path), window=6)
    config, params = weights.load_causal_lm_dir(str(tmp_path))
    ids = random_ids(20)
    with torch.no_grad():
        expected = ref(torch.tensor([ids])).logits[0].numpy()  # [20, V]
    cache = kv_cache.init_cache(config, 1, 32)
    logits, cache = kv_cache.extend(params, config, cache, jnp.array([[0] + ids[:9]]), jnp.array([[0] + [1] * 9]))
    np.testing.assert_allclose(np.asarray(logits)[0], expected[8], atol=1e-4)
    for t in range(9, 20):
        logits, cache = kv_cache.extend(params, config, cache, jnp.array([[ids[t], 0]]), jnp.array([[1, 0]]))
        np.testing.assert_allclose(np.asarray(logits)[0], expected[t], atol=1e-4, err_msg=f"token {t}")


def test_mistral_window_through_a_shared_prefix_read_by_several_rows(tmp_path):
    """Rows after a shared prefix that they read and never copy (`kv_cache.after_prefix`: REPLUG's passes after their
    few-shot block): a padded prefix, then each row's own tokens, then tokens one by one; every row's next-token
    logits equal transformers' full forward pass of prefix + row, the sliding window reaching into the prefix."""
    ref = hf_tiny.tiny_mistral(str(tmp_path), window=6)
    config, params = weights.load_causal_lm_dir(str(tmp_path))
    prefix, rows = random_ids(7), [random_ids(5), random_ids(3)]
    prefix_cache = kv_cache.init_cache(config, 1, 8)
    _, prefix_cache = kv_cache.extend(params, config, prefix_cache, jnp.array([[0] + prefix]), jnp.array([[0] + [1] * 7]))
    cache = kv_cache.after_prefix(prefix_cache, 2, 12)
    assert cache["k"].shape[2] == 12 and cache["prefix"]["k"].shape[1] == 1  # the prefix kept once, not per row
    ids = np.zeros((2, 5), np.int32)
    mask = np.zeros((2, 5), np.int32)
    for r, row in enumerate(rows):  # right-padded rows of their own
        ids[r, : len(row)], mask[r, : len(row)] = row, 1
    logits, cache = kv_cache.extend(params, config, cache, jnp.array(ids), jnp.array(mask))
    more = [random_ids(3), random_ids(3)]
    for r, row in enumerate(rows):
        with torch.no_grad():
            expected = ref(torch.tensor([prefix + row + more[r]])).logits[0].numpy()
        np.testing.assert_allclose(np.asarray(logits)[r], expected[len(prefix) + len(row) - 1], atol=1e-4)
    for t in range(3):
        logits, cache = kv_cache.extend(params, config, cache, jnp.array([[more[0][t]], [more[1][t]]]),
                                        jnp.ones((2, 1), jnp.int32))
        for r, row in enumerate(rows):
            with torch.no_grad():
                expected = ref(torch.tensor([prefix + row + more[r]])).logits[0].numpy()
            np.testing.assert_allclose(np.asarray(logits)[r], expected[len(prefix) + len(row) + t], atol=1e-4,
                                       err_msg=f"row {r}, token {t}")


def test_attention_after_a_shared_prefix_equals_attention_over_the_prefix_copied_to_each_row():
    """`layers.prefixed_attention` (one softmax over the prefix's keys, read once, and each row's own) equals the
    attention over each row's own copy of the prefix before its keys: grouped K/V heads, masked prefix slots and
    a padded row."""
    from replug_jax.models import layers

    rng = np.random.default_rng(2)
    b, length, heads, kv_heads, dh, p, s = 3, 4, 6, 2, 8, 9, 5
    q = jnp.asarray(rng.standard_normal((b, length, heads, dh)), jnp.float32)
    k, v = (jnp.asarray(rng.standard_normal((b, s, kv_heads, dh)), jnp.float32) for _ in range(2))
    pk, pv = (jnp.asarray(rng.standard_normal((p, kv_heads, dh)), jnp.float32) for _ in range(2))
    own_mask, prefix_mask = np.ones((b, length, s), bool), np.ones((b, length, p), bool)
    own_mask[1, :, 3:], prefix_mask[:, :, :2] = False, False  # a row's last slots, the prefix's padding
    bias = jnp.where(jnp.asarray(own_mask)[:, None], 0.0, layers.MASK_VALUE)
    prefix_bias = jnp.where(jnp.asarray(prefix_mask)[:, None], 0.0, layers.MASK_VALUE)
    got = layers.prefixed_attention(q, k, v, bias, pk, pv, prefix_bias)
    copied_k = jnp.concatenate([jnp.broadcast_to(pk, (b,) + pk.shape), k], axis=1)
    copied_v = jnp.concatenate([jnp.broadcast_to(pv, (b,) + pv.shape), v], axis=1)
    want = layers.dot_product_attention(q, copied_k, copied_v, jnp.concatenate([prefix_bias, bias], axis=-1))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("window", [None, 7])
def test_causal_attention_by_blocks_equals_full_attention(window):
    """Query blocks that skip the keys after them (a ragged last block, grouped K/V heads, left and right
    padding, a sliding window) give the full masked attention's outputs at every real token."""
    from replug_jax.models import layers

    rng = np.random.default_rng(1)
    b, length, heads, kv_heads, dh = 3, 45, 6, 2, 8
    q = jnp.asarray(rng.standard_normal((b, length, heads, dh)), jnp.float32)
    k, v = (jnp.asarray(rng.standard_normal((b, length, kv_heads, dh)), jnp.float32) for _ in range(2))
    mask = np.ones((b, length), np.int32)
    mask[1, :13], mask[2, 30:] = 0, 0  # left-padded, right-padded
    bias = layers.causal_bias(jnp.asarray(mask), window)
    full = np.asarray(layers.dot_product_attention(q, k, v, bias))
    for block in (16, 44, 45):
        got = np.asarray(layers.causal_attention(q, k, v, bias, block=block))
        np.testing.assert_allclose(got[mask > 0], full[mask > 0], rtol=1e-6, atol=1e-6, err_msg=f"block {block}")


@pytest.mark.parametrize("builder", ["gpt2", "llama_untied", "mistral_untied"])
def test_causal_lm_by_attention_blocks_matches_torch(tmp_path, builder, monkeypatch):
    """The models' no-cache attention in blocks of 16 queries (40 tokens: 3 blocks, the last ragged)
    still gives transformers' logits and log-probs."""
    from replug_jax.models import layers

    monkeypatch.setattr(layers, "CAUSAL_BLOCK", 16)
    query_lengths, attend = [], layers.head_major_attention  # q: [B, Hkv, G, Lq, Dh]
    monkeypatch.setattr(layers, "head_major_attention", lambda q, *a: query_lengths.append(q.shape[3]) or attend(q, *a))
    family = builder.split("_")[0]
    ref = getattr(hf_tiny, f"tiny_{family}")(str(tmp_path), **({} if family == "gpt2" else {"tie": False}))
    config, params = weights.load_causal_lm_dir(str(tmp_path))
    ids = random_ids(40)
    with torch.no_grad():
        expected = ref(torch.tensor([ids])).logits[0].numpy()
    ours = np.asarray(causal_lm.logits(params, config, jnp.array([ids]), jnp.ones((1, 40), jnp.int32)))[0]
    assert np.abs(ours - expected).max() <= 1e-4
    assert sorted(set(query_lengths)) == [8, 16]  # the blocks ran: 16, 16, then the ragged 8


# slow: gpt2 (learned positions, ~20 s); the rotary architectures stay in the core suite
@pytest.mark.parametrize("builder", [pytest.param("gpt2", marks=pytest.mark.slow), "llama", "qwen2", "mistral"])
def test_padding_does_not_change_logprobs(tmp_path, builder):
    getattr(hf_tiny, f"tiny_{builder}")(str(tmp_path))
    config, params = weights.load_causal_lm_dir(str(tmp_path))
    seqs = [random_ids(n) for n in (17, 30, 5)]
    alone = [np.asarray(causal_lm.token_logprobs(params, config, jnp.array([s]), jnp.ones((1, len(s)), jnp.int32)))[0] for s in seqs]
    width = 32
    for side in ("left", "right"):
        ids = np.zeros((3, width), np.int32)
        mask = np.zeros((3, width), np.int32)
        for i, s in enumerate(seqs):
            sl = slice(width - len(s), width) if side == "left" else slice(0, len(s))
            ids[i, sl], mask[i, sl] = s, 1
        batch = np.asarray(causal_lm.token_logprobs(params, config, ids, mask))
        assert np.isfinite(batch).all()
        for i, s in enumerate(seqs):
            got = batch[i][mask[i] > 0]
            np.testing.assert_allclose(got, alone[i], atol=2e-5, err_msg=f"{side} padding, row {i}")


def test_length_buckets_grow_with_the_length():
    """LocalLM's buckets (`per_octave`): steps of `multiple` for short rows, 1/8 of the length's power of two
    beyond, so at most 1/8 padding and 8 buckets per doubling; the cap holds; the flat rule is unchanged."""

    bucket = lambda n, cap=4096: sharding.length_bucket(n, 32, cap, per_octave=8)
    lengths = (1, 31, 33, 255, 256, 450, 511, 512, 513, 700, 1025, 1500)
    assert [bucket(n) for n in lengths] == [32, 32, 64, 256, 256, 480, 512, 512, 576, 704, 1152, 1536]
    assert max((bucket(n) - n) / n for n in range(256, 4097)) <= 1 / 8
    assert len({bucket(n) for n in range(513, 1025)}) == 8 and len({bucket(n) for n in range(1025, 2049)}) == 8
    assert bucket(450, cap=460) == 460 and sharding.length_bucket(450, 64, 4096) == 512
    with pytest.raises(ValueError, match="exceeds the maximum length"):
        bucket(5000)


def test_local_lm_end_to_end_matches_torch_and_compiles_once(tmp_path):
    ref = hf_tiny.tiny_llama(str(tmp_path))
    lm = rj.load_lm(str(tmp_path), batch_size=8, max_length=64)
    contexts = ["hello there", "a", "", "the quick brown fox"]
    conts = [" world", " bc", "start", " jumps over"]
    scores = lm.score(contexts, conts)
    for ctx, cont, got in zip(contexts, conts, scores):
        ctx_ids, cont_ids = lm.pair_tokens(ctx, cont)
        assert len(got) == len(cont_ids) == len(lm.tokenizer.encode(cont))
        expected = hf_tiny.torch_logprobs(ref, ctx_ids + cont_ids)[len(ctx_ids) - 1:]
        np.testing.assert_allclose(got, expected, atol=1e-5)
    # everything above fit one length bucket: one compilation, reused by a second call
    assert compiled_programs(lm._batch_fn.jitted) == 1
    lm.score(["other text of another length"], [" yes"])
    assert compiled_programs(lm._batch_fn.jitted) == 1


def test_one_token_continuations_of_one_context_share_a_forward_row(tmp_path):
    """MMLU's option letters: several one-token continuations of one context are scored from one row (context +
    [a, b, ...], all predicted from the context's last position) and equal the torch reference of each pair alone;
    multi-token continuations keep their own rows; near the window's end a shared row is split, never truncated."""
    ref = hf_tiny.tiny_llama(str(tmp_path))
    lm = rj.load_lm(str(tmp_path), batch_size=8, max_length=64)
    context, other = random_ids(20), random_ids(33)
    letters = [[t] for t in random_ids(4)]
    pairs = [(context, y) for y in letters] + [(other, letters[0]), (context, random_ids(3)), (other, letters[2])]
    rows = lm._rows(pairs)
    assert len(rows) == 3  # context + 4 letters, other + 2 letters, the 3-token continuation
    assert sorted(len(r.ids) for r in rows) == [23, 24, 35]
    got = lm.score_token_pairs(pairs)
    for (ctx, cont), lps in zip(pairs, got):
        assert len(lps) == len(cont)
        np.testing.assert_allclose(lps, hf_tiny.torch_logprobs(ref, ctx + cont)[len(ctx) - 1:], atol=1e-5)
    full = random_ids(62)  # 62 + 4 letters exceed the 64-token window: rows of 2, 2 (never a truncated context)
    near_end = [(full, y) for y in letters]
    assert [len(r.ids) for r in lm._rows(near_end)] == [64, 64]
    for (ctx, cont), lps in zip(near_end, lm.score_token_pairs(near_end)):
        np.testing.assert_allclose(lps, hf_tiny.torch_logprobs(ref, ctx + cont)[len(ctx) - 1:], atol=1e-5)


def test_encoder_batches_compile_once_per_bucket(tmp_path):
    hf_tiny.tiny_bert(str(tmp_path))
    enc = rj.load_encoder(str(tmp_path), batch_size=8)
    texts = ["short", "a bit longer text", "x" * 20, "y" * 40] * 5  # 20 texts: full and partial batches
    E = enc.embed(texts)
    assert E.shape == (20, 32)
    np.testing.assert_allclose(np.linalg.norm(E, axis=-1), 1.0, atol=1e-5)
    buckets = {enc.padded_length(len(r)) for r in enc.tokenize(texts)}  # texts of up to 32 tokens share one
    assert len(buckets) == 2 and compiled_programs(enc._batch_fn.jitted) == 2  # a batch never mixes buckets
    # order and batching do not change an embedding, to the bit
    assert np.array_equal(enc.embed(texts[:1])[0], E[0]) and np.array_equal(enc.embed(texts[::-1])[::-1], E)
    assert compiled_programs(enc._batch_fn.jitted) == 2


def test_sharded_scoring_equals_single_device(tmp_path):

    hf_tiny.tiny_gpt2(str(tmp_path))
    assert len(jax.devices()) == 8
    many = rj.load_lm(str(tmp_path), batch_size=8)
    one = rj.load_lm(str(tmp_path), batch_size=8, mesh=sharding.data_mesh(jax.devices()[:1]))
    contexts = [f"context number {i}" for i in range(11)]
    conts = [f" continuation {i}" * (1 + i % 3) for i in range(11)]
    for a, b in zip(many.score(contexts, conts), one.score(contexts, conts)):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_extend_takes_the_last_real_token_wherever_pads_sit(tmp_path):
    """`extend` returns the next-token logits after each row's last real token, for left, right and inner
    padding alike (it used to take position mask.sum() - 1: right padding only)."""
    ref = hf_tiny.tiny_llama(str(tmp_path))
    config, params = weights.load_causal_lm_dir(str(tmp_path))
    a, b, c = random_ids(3)
    with torch.no_grad():
        expected = ref(torch.tensor([[a, b, c]])).logits[0, -1].numpy()
    ids = np.array([[a, b, c, 0], [0, a, b, c], [a, 0, b, c]], np.int32)
    mask = np.array([[1, 1, 1, 0], [0, 1, 1, 1], [1, 0, 1, 1]], np.int32)
    cache = kv_cache.init_cache(config, 3, 8)
    logits, cache = kv_cache.extend(params, config, cache, jnp.array(ids), jnp.array(mask))
    for row in np.asarray(logits):
        np.testing.assert_allclose(row, expected, atol=1e-4)
    assert np.asarray(cache["count"]).tolist() == [3, 3, 3]


def test_lm_fingerprint_covers_tokenizer_and_config(tmp_path):
    """The LM-score cache key changes with the tokenizer or the model config, not only with the weights."""
    import dataclasses

    from replug_jax.lm.local import LocalLM
    from replug_jax.models.tokenizer import TextTokenizer

    hf_tiny.tiny_llama(str(tmp_path))
    lm = rj.load_lm(str(tmp_path), batch_size=1)
    base = lm.fingerprint()
    assert rj.load_lm(str(tmp_path), batch_size=1).fingerprint() == base  # stable
    other_config = dataclasses.replace(lm.config, rope_theta=lm.config.rope_theta * 2)
    assert LocalLM(other_config, lm.params, lm.tokenizer, name=lm.name).fingerprint() != base
    backend = lm.tokenizer.backend.from_str(lm.tokenizer.backend.to_str())
    backend.add_special_tokens(["<|extra|>"])
    other_tokenizer = TextTokenizer(backend, lm.tokenizer.bos_id, lm.tokenizer.eos_id, lm.tokenizer.pad_id)
    assert LocalLM(lm.config, lm.params, other_tokenizer, name=lm.name).fingerprint() != base


def _dot_precisions(fn, *args) -> set[str]:
    """The precision of every dot in fn's lowered program ("DEFAULT", "HIGHEST")."""
    import re

    text = jax.jit(fn).lower(*args).as_text()
    return set(re.findall(r"dot_general.*precision = \[(\w+), \w+\]", text)) | (
        {"DEFAULT"} if re.search(r"dot_general(?!.*precision =)", text) else set())


@pytest.mark.parametrize("model", ["llama", "bert"])
def test_float32_compute_asks_for_true_float32_matmuls(model):
    """Accelerators cut float32 matmuls short unless asked (TF32 on GPU, bf16 passes on TPU; on an H100 SmolLM2's
    shape gave |Δ log p| 2.3e-3 against PyTorch float32, 3e-6 once asked): float32 compute lowers every dot of
    the model with precision HIGHEST, bf16 compute leaves them at the default, on any backend."""
    ids, mask = jnp.ones((2, 8), jnp.int32), jnp.ones((2, 8), jnp.int32)
    if model == "llama":
        config = causal_lm.CausalLMConfig(arch="llama", vocab_size=64, hidden_size=16, num_layers=2, num_heads=2,
                                          num_kv_heads=1, intermediate_size=32, max_position=32, norm_eps=1e-5,
                                          hidden_act="silu")
        params = causal_lm.init_params(config)
        run = lambda dtype: lambda p, i, m: causal_lm.token_logprobs(p, config, i, m, dtype)
    else:
        config = encoder.BertConfig(vocab_size=64, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32)
        params = encoder.init_params(config)
        run = lambda dtype: lambda p, i, m: encoder.embed(p, config, i, m, True, dtype)
    assert _dot_precisions(run(jnp.float32), params, ids, mask) == {"HIGHEST"}
    assert _dot_precisions(run(jnp.bfloat16), params, ids, mask) == {"DEFAULT"}
