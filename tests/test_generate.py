"""REPLUG's ensembled greedy decoding on the local backend: the KV-cache decode loop equals a reference that
recomputes every pass in full and mixes with `mixture.mixed_logprobs_jax`."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import replug_jax as rj
from replug_jax.method import logit_average, mixture
from replug_jax.parallel import sharding
from replug_jax.lm.local import LocalLM
from replug_jax.models import causal_lm
from replug_jax.models.detokenize import whole_characters
from replug_jax.models.stop_strings import StopMasks
from tests import hf_tiny
from tests.hf_tiny import compiled_programs


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def tiny_lm(request, tmp_path_factory):
    path = str(tmp_path_factory.mktemp(request.param))
    if request.param == "gpt2":
        hf_tiny.tiny_gpt2(path, positions=128)
    else:
        hf_tiny.tiny_llama(path)
    lm = rj.load_lm(path, batch_size=8)
    # sharpen the random model (scaled embeddings) so that greedy decoding moves between tokens
    params = jax.tree_util.tree_map_with_path(
        lambda p, x: x * 4.0 if "embed_tokens" in jax.tree_util.keystr(p) else x, jax.device_get(lm.params))
    return LocalLM(lm.config, params, lm.tokenizer, name=request.param, batch_size=8)


def reference(lm, contexts, log_weights, max_new, prefix="", average_logits=False):
    """Greedy mixture decoding without a cache: every step re-runs each pass in full (average_logits: FlashRAG's
    logit average, its numpy form, instead of REPLUG's mixture)."""
    tok = lm.tokenizer
    full = jax.jit(lambda ids, mask: causal_lm.logits(lm.params, lm.config, ids, mask))  # one shape: [1, 64]
    out = []
    for ctx, lw in zip(contexts, log_weights):
        rows = [(tok.encode(prefix) if prefix else []) + tok.encode(c) for c in ctx]
        tokens, lps = [], []
        for _ in range(max_new):
            per_pass = []
            for r in rows:
                ids, mask = sharding.pad_rows([r + tokens], 64, 0, 1)  # right padding: the last real position
                per_pass.append((full(ids, mask)[0, len(r + tokens) - 1]))
            w = jnp.asarray(lw, jnp.float32)[None]
            if average_logits:
                mix = logit_average.logit_average(lw, np.stack(per_pass))
            else:
                per_pass = [jax.nn.log_softmax(z) for z in per_pass]
                mix = mixture.mixed_logprobs_jax(jnp.stack(per_pass)[None], w, w > -jnp.inf, 1.0)[0]
            tokens.append(int(np.argmax(mix)))
            lps.append(float(mix[tokens[-1]]))
        out.append((tokens, lps))
    return out


CONTEXTS = [["the river ", "stars shine ", "bread rises in the "], ["a b c d"],
            ["violin plays", "snow covers the mountain"], ["x", "yy", "zzz", "wwww"]]
WEIGHTS = [np.log([0.5, 0.3, 0.2]), [0.0], np.log([0.9, 0.1]), np.log([0.1, 0.2, 0.3, 0.4])]


@pytest.mark.parametrize("prefix", ["", "Shared block.\n"])
def test_mixture_decode_equals_full_recomputation(tiny_lm, prefix):
    """k = 1..4 in one batch (missing passes masked), with and without a shared prefix."""
    gens = tiny_lm.generate(CONTEXTS, WEIGHTS, max_new_tokens=8, stop=(), shared_prefix=prefix)
    for gen, (tokens, lps) in zip(gens, reference(tiny_lm, CONTEXTS, WEIGHTS, 8, prefix)):
        assert gen.token_ids == tokens
        np.testing.assert_allclose(gen.logprobs, lps, atol=1e-4)
        # a character the budget cut is left out (its U+FFFD), as the server and vLLM leave it
        assert gen.finish_reason == "length" and gen.text == whole_characters(tiny_lm.tokenizer.decode(tokens))
    assert len({t for g in gens for t in g.token_ids}) > 3  # the decoder really moves between tokens


def test_flashrag_logit_average_decodes_as_full_recomputation(tiny_lm):
    """mixing="logits": FlashRAG's average of the passes' logits with weights s/Σs (method/logit_average.py), in the
    same program as REPLUG's mixture; it decodes as the numpy reference recomputing every pass, and not as REPLUG."""
    scores = [np.array([0.5, 0.3, 0.2]), np.array([0.7]), np.array([0.9, 0.1]), np.array([0.1, 0.2, 0.3, 0.4])]
    weights = [logit_average.sum_normalised_log_weights(s, np.ones(len(s), bool)) for s in scores]
    gens = tiny_lm.generate(CONTEXTS, weights, max_new_tokens=8, stop=(), mixing="logits")
    expected = reference(tiny_lm, CONTEXTS, weights, 8, average_logits=True)
    for gen, (tokens, lps) in zip(gens, expected):
        assert gen.token_ids == tokens
        np.testing.assert_allclose(gen.logprobs, lps, atol=1e-4)
    replug = tiny_lm.generate(CONTEXTS, weights, max_new_tokens=8, stop=())
    assert [g.logprobs for g in replug] != [g.logprobs for g in gens]  # the other mixing, really
    with pytest.raises(ValueError, match="mixing='averaged'"):
        tiny_lm.generate(CONTEXTS, weights, max_new_tokens=8, mixing="averaged")


def test_stop_strings_end_generation_and_are_cut(tiny_lm):
    free = tiny_lm.generate(CONTEXTS, WEIGHTS, max_new_tokens=12, stop=())
    piece = tiny_lm.tokenizer.decode(free[0].token_ids[3:4])
    stopped = tiny_lm.generate(CONTEXTS, WEIGHTS, max_new_tokens=12, stop=(piece,))
    first = next(i for i, t in enumerate(free[0].token_ids) if piece in tiny_lm.tokenizer.decode([t]))
    assert stopped[0].token_ids == free[0].token_ids[: first + 1] and stopped[0].finish_reason == "stop"
    assert piece not in stopped[0].text and free[0].text.startswith(stopped[0].text)


def test_stop_masks_are_each_tokens_text_decoded_once_and_bounded(tiny_lm):
    class CountingTokenizer:  # the real tiny tokenizer, counting its decodes
        def __init__(self, tokenizer):
            self.tokenizer, self.decodes = tokenizer, 0
            self.vocab_size, self.eos_id = tokenizer.vocab_size, tokenizer.eos_id

        def decode(self, ids):
            self.decodes += 1
            return self.tokenizer.decode(ids)

    tokenizer, size = CountingTokenizer(tiny_lm.tokenizer), tiny_lm.config.vocab_size
    masks = StopMasks(tokenizer, size, capacity=2)
    texts = [tiny_lm.tokenizer.decode([i]) for i in range(min(tokenizer.vocab_size, size))]
    for stop in [("\n",), (texts[7], "zz"), (), (texts[7], "zz")]:
        want = np.zeros(size, bool)
        want[: len(texts)] = [any(s in t for s in stop) for t in texts]
        if tokenizer.eos_id is not None:
            want[tokenizer.eos_id] = True
        np.testing.assert_array_equal(masks(stop), want)
    assert masks((texts[7],))[7]  # a stop string's own token ends a decode
    assert tokenizer.decodes == len(texts)  # every token's text decoded once, whatever the number of stop tuples
    assert len(masks._masks) == 2  # only the latest `capacity` tuples' masks kept


def test_compiles_once_per_bucket_and_sharded_equals_one_device(tiny_lm):
    one = LocalLM(tiny_lm.config, jax.device_get(tiny_lm.params), tiny_lm.tokenizer, batch_size=8,
                  mesh=sharding.data_mesh(jax.devices()[:1]))
    many = tiny_lm.generate(CONTEXTS, WEIGHTS, max_new_tokens=5, stop=())
    single = one.generate(CONTEXTS, WEIGHTS, max_new_tokens=5, stop=())
    for a, b in zip(many, single):
        assert a.token_ids == b.token_ids
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
    before = sum(compiled_programs(f) for f in tiny_lm._generator._jitted.values())
    tiny_lm.generate([["other", "text of twenty chars!", "k", "passes"]] * 3, [np.log([0.25] * 4)] * 3, max_new_tokens=7, stop=())
    assert sum(compiled_programs(f) for f in tiny_lm._generator._jitted.values()) == before  # same buckets: no new compilation


def test_generate_rejects_bad_input(tiny_lm):
    with pytest.raises(ValueError, match="passes but"):
        tiny_lm.generate([["a", "b"]], [[0.0]], max_new_tokens=2)
    with pytest.raises(ValueError, match="max_new_tokens"):
        tiny_lm.generate([["a"]], [[0.0]], max_new_tokens=0)
    with pytest.raises(TypeError, match="list of lists"):
        tiny_lm.generate(["a"], [[0.0]], max_new_tokens=2)
    with pytest.raises(ValueError, match="log-probabilities"):
        tiny_lm.generate([["a"]], [[1.0]], max_new_tokens=2)
    with pytest.raises(ValueError, match="leave no room"):
        tiny_lm.generate([["a"]], [[0.0]], max_new_tokens=2, shared_prefix="word " * 200)


def test_prefill_posterior_weights_are_posterior_kept_passes(tiny_lm):
    """The weights fixed at the prefill (in the jit) equal `posterior.kept_passes` of the given log λ and the prefill's
    own log p(x | d) (posterior.py's re-ranking rule, ties included: two equal passes), -inf where dropped."""
    from replug_jax.method import posterior
    from replug_jax.method.posterior import PrefillPosterior

    contexts = [[f"{p} Q: what is it?" for p in ("first passage.", "second one", "second one")],
                [f"{p} Q: why" for p in ("only", "two passes")]]
    weights = [np.log([0.5, 0.25, 0.25]), np.log([0.5, 0.5])]
    inner = posterior.kept_passes
    gens = tiny_lm.generate(contexts, weights, max_new_tokens=3, stop=(),
                            posterior=PrefillPosterior([" Q: what is it?", " Q: why"], alpha=0.7, keep=2))
    base = np.full((2, 3), -np.inf, np.float32)
    for b, w in enumerate(weights):
        base[b, : len(w)] = w
    order, kept = inner(base, [g.query_logliks for g in gens], 1.0, 0.7, 2)
    for b, g in enumerate(gens):
        want, pos = np.full(len(contexts[b]), -np.inf, np.float32), order[b][order[b] >= 0]
        want[pos] = kept[b][: len(pos)]
        assert list(np.isfinite(g.log_weights)) == list(np.isfinite(want))
        np.testing.assert_allclose(g.log_weights, want, atol=1e-5)  # ℓ summed by XLA twice: float32 rounding
