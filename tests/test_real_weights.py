"""The packaged real weights (all-MiniLM-L6-v2, SmolLM2-135M GGUF) against transformers in PyTorch."""

import os

import numpy as np
import pytest
import torch

from replug_jax.models import registry

TEXTS = [
    "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "In 1969, Apollo 11 landed the first humans on the Moon: Neil Armstrong and Buzz Aldrin.",
    "short",
    "Ünïcödé text, numbers 3.14159 and symbols #@!$ should tokenize too.",
]

PARAGRAPH = (
    "Anarchism is a political philosophy and movement that is skeptical of all justifications for authority "
    "and seeks to abolish the institutions it claims maintain unnecessary coercion and hierarchy, typically "
    "including the state and capitalism. Anarchism advocates for the replacement of the state with stateless "
    "societies and voluntary free associations. As a historically left-wing movement, this reading of anarchism "
    "is placed on the farthest left of the political spectrum, usually described as the libertarian wing of the "
    "socialist movement."
)


def test_minilm_matches_sentence_transformers_pooling(minilm):
    from transformers import AutoModel, AutoTokenizer

    path = registry.packaged_path("minilm")
    model, tok = AutoModel.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)
    batch = tok(TEXTS, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.no_grad():
        states = model(**batch).last_hidden_state
    mask = batch["attention_mask"][..., None].float()
    ref = torch.nn.functional.normalize((states * mask).sum(1) / mask.sum(1), dim=-1).numpy()
    ours = minilm.embed(TEXTS)
    cos = (ours * ref).sum(-1)
    assert cos.min() >= 0.9999, cos
    assert np.abs(ours - ref).max() < 1e-4


def test_smollm2_tokenizer_matches_transformers_gguf_tokenizer(smollm2, torch_smollm2):
    _, ref_tok = torch_smollm2
    for text in TEXTS + [PARAGRAPH, "<|im_start|>user\nhi<|im_end|>", "  leading spaces and 12345 digits"]:
        assert smollm2.tokenizer.encode(text) == ref_tok(text, add_special_tokens=False).input_ids, text


def test_smollm2_gguf_logprobs_and_perplexity_match_torch(smollm2, torch_smollm2):
    model, _ = torch_smollm2
    ids = [smollm2.start_id] + smollm2.tokenizer.encode(PARAGRAPH)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    ref = torch.log_softmax(logits[:-1], -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0].numpy()
    ours = smollm2.score([""], [PARAGRAPH])[0]
    assert ours.shape == ref.shape
    assert np.abs(ours - ref).max() <= 2e-3
    ppl_ours, ppl_ref = np.exp(-ours.mean()), np.exp(-ref.mean())
    assert abs(ppl_ours / ppl_ref - 1) <= 0.005, (ppl_ours, ppl_ref)
    assert 3 < ppl_ours < 60  # a real LM on real English, not noise


@pytest.mark.slow  # a fresh GGUF load (~30 s): the core suite's checks above compare against the saved copy
def test_the_saved_torch_reference_is_transformers_own_gguf_load(torch_smollm2):
    """`torch_smollm2` (tests/conftest.py: transformers' load of the GGUF, saved once per machine and read back) has
    a fresh load's every weight bit for bit and its tokenizer's ids, special tokens included, in several scripts."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = os.path.split(registry.packaged_path("smollm2"))
    fresh = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    fresh_tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model, tok = torch_smollm2
    saved, want = model.state_dict(), fresh.state_dict()
    assert saved.keys() == want.keys() and all(torch.equal(saved[key], want[key]) for key in want)
    for text in TEXTS + [PARAGRAPH, "<|im_start|>user\nhi<|im_end|>", "Søren Østergård, Київ, 東京, 🐱🎉"]:
        assert tok(text).input_ids == fresh_tok(text).input_ids, text
    assert (tok.bos_token, tok.eos_token, tok.unk_token) == (fresh_tok.bos_token, fresh_tok.eos_token,
                                                             fresh_tok.unk_token)


def test_smollm2_uses_context(smollm2):
    """A prepended document that states a made-up fact raises its probability: the premise of REPLUG."""
    doc = "Velmora is a small town whose mayor is Tobias Grint."
    with_doc, without = smollm2.score([doc + " The mayor of Velmora is", "The mayor of Velmora is"], [" Tobias Grint"] * 2)
    assert with_doc.sum() > without.sum() + 5.0, (with_doc.sum(), without.sum())


def test_smollm2_generate_with_one_pass_equals_transformers_greedy(smollm2, torch_smollm2):
    """k = 1, weight 1: the ensembled decoder with its KV cache is plain greedy decoding (transformers `generate`)."""
    model, _ = torch_smollm2
    prompts = ["The capital of France is", "Question: What is the largest planet in the Solar System?\nAnswer:"]
    gens = smollm2.generate([[p] for p in prompts], [[0.0]] * len(prompts), max_new_tokens=20, stop=())
    for prompt, gen in zip(prompts, gens):
        ids = smollm2.tokenizer.encode(prompt)
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 max_new_tokens=20, do_sample=False, pad_token_id=0)
        ref = out[0, len(ids):].tolist()
        eos = smollm2.tokenizer.eos_id
        ref = ref[: ref.index(eos) + 1] if eos in ref else ref
        assert gen.token_ids == ref, (prompt, smollm2.tokenizer.decode(gen.token_ids), smollm2.tokenizer.decode(ref))


@pytest.mark.slow  # every mesh on tiny models: test_lm_mesh.py
def test_smollm2_split_over_a_data_and_model_mesh_equals_one_device(smollm2):
    """The suite's SmolLM2 (conftest.py) runs on one device; the same weights split over a (2, 4) data x model mesh of
    the 8 fake devices score and decode as it does (the sharded path on real weights; tiny models on every mesh:
    tests/test_lm_mesh.py)."""
    import replug_jax as rj

    split = rj.load_lm("smollm2", batch_size=8, model_parallel=4)
    assert dict(split.mesh.shape) == {"data": 2, "model": 4} and smollm2.mesh.devices.size == 1
    contexts, continuations = [""] + TEXTS[:3], [PARAGRAPH, " and more.", " It is important.", " They returned safely."]
    for got, want in zip(split.score(contexts, continuations), smollm2.score(contexts, continuations)):
        np.testing.assert_allclose(got, want, atol=2e-4)
    passes = [["Knowledge: " + t + "\nQuestion: What is this about?\nAnswer:" for t in TEXTS[:3]],
              ["The capital of France is"]]
    weights = [np.log([0.5, 0.3, 0.2]), [0.0]]
    got, want = (lm.generate(passes, weights, max_new_tokens=8, stop=("\n",)) for lm in (split, smollm2))
    for a, b in zip(got, want):
        assert a.token_ids == b.token_ids and len(a.token_ids) > 1
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=2e-4)


def test_bfloat16_weights_and_compute_stay_close_to_float32(smollm2, minilm):
    """SmolLM2 and MiniLM with bf16 weights and activations (the default on accelerators): log-probs of real
    text within 0.1 nats on average (measured 0.043, max 0.42) and perplexity within 3%; embeddings (float32
    out) at cosine >= 0.999 (measured 0.99994) of the float32 model's."""
    import jax
    import replug_jax as rj

    lm16 = rj.load_lm("smollm2", batch_size=8, dtype="bfloat16", model_parallel=8)
    assert {x.dtype for x in jax.tree.leaves(lm16.params)} == {np.dtype("bfloat16")} and lm16.dtype == np.dtype("bfloat16")
    contexts, continuations = [""] + TEXTS[:3], [PARAGRAPH, " and more.", " It is important.", " They returned safely."]
    full, half = smollm2.score(contexts, continuations), lm16.score(contexts, continuations)
    assert all(h.dtype == np.float32 for h in half)
    diff = np.abs(np.concatenate([a - b for a, b in zip(full, half)]))
    assert 0 < diff.mean() <= 0.1 and diff.max() <= 1.0, (diff.mean(), diff.max())
    assert abs(np.exp(half[0].mean() - full[0].mean()) - 1) <= 0.03
    enc16 = rj.load_encoder("minilm", dtype="bfloat16", batch_size=8)
    full_e, half_e = minilm.embed(TEXTS + [PARAGRAPH]), enc16.embed(TEXTS + [PARAGRAPH])
    assert half_e.dtype == np.float32 and 0.999 <= (full_e * half_e).sum(-1).min() < 1.0
