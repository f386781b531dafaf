"""Ensembled generation over HTTP (our server, SmolLM2) against the local backend: the sequence-level path
equals local greedy decoding; the per-token mixture over each pass's top-20 tokens picks the same tokens,
and its log-probs are lower bounds of the local mixture's (the missing mass, stated in lm/http/generation.py)."""
import numpy as np
import pytest

from replug_jax.lm.http.client import HTTPLM
from replug_jax.lm.http.transport import BlackBoxServerError
from replug_jax.serve import BackgroundServer

DOCS = ["Paris is the capital and largest city of France.", "The Eiffel Tower stands in Paris.",
        "Berlin is the capital of Germany."]
QUESTION = "\nQuestion: What is the capital of France?\nAnswer:"


@pytest.fixture(scope="module")
def remote(smollm2):
    with BackgroundServer(smollm2) as server:
        yield HTTPLM(server.url, tokenizer=smollm2.tokenizer)


def test_one_pass_is_the_servers_own_greedy_decoding(smollm2, remote):
    contexts = [["The capital of France is"], ["Knowledge: " + DOCS[2] + QUESTION.replace("France", "Germany")]]
    local = smollm2.generate(contexts, [[0.0], [0.0]], max_new_tokens=8, stop=("\n",))
    got = remote.generate(contexts, [[0.0], [0.0]], max_new_tokens=8, stop=("\n",))
    for a, b in zip(got, local):
        assert a.text == b.text and a.token_ids == b.token_ids
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)


def test_per_token_mixture_matches_local_with_lower_bound_logprobs(smollm2, remote):
    contexts = [["Knowledge: " + d + QUESTION for d in DOCS], ["Knowledge: " + d + QUESTION for d in DOCS[1:]]]
    weights = [np.log([0.5, 0.3, 0.2]), np.log([0.6, 0.4])]
    local = smollm2.generate(contexts, weights, max_new_tokens=6, stop=("\n",), shared_prefix="Answer briefly.\n")
    before = remote.stats()["requests"]
    got = remote.generate(contexts, weights, max_new_tokens=6, stop=("\n",), shared_prefix="Answer briefly.\n")
    for a, b in zip(got, local):
        assert a.text == b.text and a.token_ids == b.token_ids, (a.text, b.text)
        gap = np.asarray(b.logprobs) - np.asarray(a.logprobs)  # missing mass: HTTP <= local
        assert (gap >= -1e-4).all() and gap.max() < 0.05, gap
    # each pass's own continuation in one request, asked again only where the mixture chose another token: fewer
    # requests than one per pass per step (here 8, against 22)
    asked, per_step = remote.stats()["requests"] - before, sum(len(c) * len(g.token_ids) for c, g in zip(contexts, got))
    assert sum(map(len, contexts)) <= asked < per_step, (asked, per_step)
    assert remote.stats()["generation"].startswith("each pass's own continuation in one request")  # the probe's


@pytest.mark.slow  # the per-token mixture over HTTP: test_per_token_mixture_matches_local_...; here at 5
def test_mixture_against_a_server_capping_top_logprobs_at_five(smollm2, remote):
    """OpenAI's API refuses logprobs > 5: the probe finds the cap and generation asks for no more."""
    assert remote.top_logprobs == 20
    contexts = [["Knowledge: " + d + QUESTION for d in DOCS]]
    weights = [np.log([0.5, 0.3, 0.2])]
    local = smollm2.generate(contexts, weights, max_new_tokens=6, stop=("\n",))
    with BackgroundServer(smollm2, max_top_logprobs=5) as server:
        capped = HTTPLM(server.url, tokenizer=smollm2.tokenizer)
        assert capped.top_logprobs == 5 and capped.stats()["top_logprobs"] == 5
        with pytest.raises(BlackBoxServerError, match="between 0 and 5"):
            capped.transport.post(capped.base_url + "/completions", {"prompt": "Hi", "max_tokens": 1, "logprobs": 20})
        got = capped.generate(contexts, weights, max_new_tokens=6, stop=("\n",), top_n=20)
    assert got[0].text == local[0].text and got[0].token_ids == local[0].token_ids


def test_a_stop_string_spanning_tokens_ends_generation_on_both_backends(smollm2, remote):
    """' 8,' is two tokens (' 8', ','): the kept tokens end with the one completing it, locally and over HTTP."""
    decode = smollm2.tokenizer.decode
    stop = " 8,"
    assert not any(stop in decode([t]) for t in smollm2.tokenizer.encode(" 7, 8, 9,"))  # no single token holds it
    contexts, weights = [["Count: 1, 2, 3, 4, 5, 6,", "Numbers: 1, 2, 3, 4, 5, 6,"]], [np.log([0.6, 0.4])]
    for contexts, weights in ((contexts, weights), ([contexts[0][:1]], [[0.0]])):  # mixture, then one pass
        local = smollm2.generate(contexts, weights, max_new_tokens=12, stop=(stop,))[0]
        http = remote.generate(contexts, weights, max_new_tokens=12, stop=(stop,))[0]
        assert decode(local.token_ids) == local.text + stop and stop not in decode(local.token_ids[:-1])
        assert len(local.logprobs) == len(local.token_ids) and local.finish_reason == "stop"
        assert http.token_ids == local.token_ids and http.text == local.text == " 7,"


def test_an_over_long_prompt_keeps_the_prefix_whole_and_cuts_the_context_from_the_left(smollm2):
    """The rule every backend sends a generation pass by (`generation_prompt_ids`), on SmolLM2's tokenizer: the
    few-shot prefix whole, the context's last tokens up to the window less max_new_tokens; mistakes named."""
    from replug_jax.lm.blackbox import generation_prompt_ids

    tok = smollm2.tokenizer
    prefix = "Answer with the name of a city.\nQuestion: Where is the Louvre?\nAnswer: Paris\n"
    context = " ".join(DOCS * 8) + QUESTION
    prefix_ids, ids = generation_prompt_ids(tok, prefix, context, 96, 6, smollm2.start_id)
    assert prefix_ids == tok.encode(prefix) and len(tok.encode(context)) > 96
    assert ids == tok.encode(context)[-(96 - len(prefix_ids) - 6):]
    assert generation_prompt_ids(tok, prefix, QUESTION, 96, 6, None) == (prefix_ids, tok.encode(QUESTION))  # fits
    with pytest.raises(ValueError, match="leave no room in the LM's 96-token window"):
        generation_prompt_ids(tok, prefix * 8, context, 96, 6, None)
    with pytest.raises(ValueError, match="a pass context is empty after the shared prefix"):
        generation_prompt_ids(tok, prefix, "", 96, 6, None)


@pytest.mark.slow  # the cut itself: the test above; here both backends' generations under it
def test_an_over_long_prompt_is_cut_the_same_way_on_both_backends(smollm2):
    """A 96-token window: the few-shot prefix is kept whole and the context cut from the left, by both."""
    from replug_jax.lm.local import LocalLM

    small = LocalLM(smollm2.config, smollm2.params, smollm2.tokenizer, name="smollm2-96", max_length=96)
    prefix = "Answer with the name of a city.\nQuestion: Where is the Louvre?\nAnswer: Paris\n"
    context = " ".join(DOCS * 8) + QUESTION  # ~150 tokens: the prompt does not fit
    assert len(small.tokenizer.encode(prefix + context)) > 96
    local = small.generate([[context]], [[0.0]], max_new_tokens=6, stop=("\n",), shared_prefix=prefix)[0]
    with BackgroundServer(small) as server:
        http = HTTPLM(server.url, tokenizer=small.tokenizer).generate(
            [[context]], [[0.0]], max_new_tokens=6, stop=("\n",), shared_prefix=prefix)[0]
    assert http.token_ids == local.token_ids
    np.testing.assert_allclose(http.logprobs, local.logprobs, atol=1e-4)
    # the prompt both sent: the prefix whole, then the context's last tokens (checked against the full model)
    room = 96 - len(small.tokenizer.encode(prefix)) - 6
    kept = small.tokenizer.encode(context)[-room:]
    full = smollm2.generate([[small.tokenizer.decode(kept)]], [[0.0]], max_new_tokens=6, stop=("\n",),
                            shared_prefix=prefix)[0]
    np.testing.assert_allclose(full.logprobs[:1], local.logprobs[:1], atol=1e-3)


CHAT = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n"
        "<|im_start|>assistant\n")  # SmolLM2-Instruct's chat format: its answer ends with its end token, <|im_end|>


@pytest.mark.parametrize("path", ["local_tokenizer", "server_tokenize", "server_tokenize_ids_unannounced"])
def test_a_generation_the_model_ends_stops_at_its_end_token_on_every_http_path(smollm2, path):
    """An answer the LM ends itself ends there, without the end token's text, on every path (issue 85): with the
    local tokenizer (its eos_id), with the server's /tokenize (the end token from its /models card), and against a
    server that names no end token and tokenizes to ids only (vLLM's form: learned from a completion the server
    ended itself, its text leaving the last token out). The mixture comes first on a fresh client, so nothing
    learned from one pass helps it."""
    question = "Name the capital of France in one word."
    contexts = [[CHAT.format(question), "Knowledge: Paris is the capital of France.\n" + CHAT.format(question)]]
    weights = [np.log([0.6, 0.4])]
    one = [[CHAT.format("What colour is the sky? One word.")]]
    local_mixed = smollm2.generate(contexts, weights, max_new_tokens=24, stop=())[0]
    local_one = smollm2.generate(one, [[0.0]], max_new_tokens=24, stop=())[0]
    eos = smollm2.tokenizer.eos_id
    assert local_mixed.token_ids[-1] == eos and local_one.token_ids[-1] == eos, (local_mixed, local_one)
    options = {"server_tokenize_ids_unannounced": dict(with_pieces=False, announce_end_tokens=False)}.get(path, {})
    with BackgroundServer(smollm2, **options) as server:
        client = HTTPLM(server.url, tokenizer=smollm2.tokenizer if path == "local_tokenizer" else None)
        mixed = client.generate(contexts, weights, max_new_tokens=24, stop=())[0]
        single = client.generate(one, [[0.0]], max_new_tokens=24, stop=())[0]
    learned = client.stats()["end_tokens_learned"]
    assert learned == (path == "server_tokenize_ids_unannounced") and client.end_ids == {eos}, client.stats()
    for got, local in ((mixed, local_mixed), (single, local_one)):
        assert got.text == local.text and "<|im_end|>" not in got.text, (got.text, local.text)
        assert got.token_ids == local.token_ids and got.finish_reason == local.finish_reason == "stop"
