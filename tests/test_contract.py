"""One black-box contract: the same (context, continuation) pairs, split anywhere, score identically on
the local backend and over HTTP (our server, token-id prompts), on the real SmolLM2 weights."""
import numpy as np
import pytest
import tokenizers

from replug_jax.lm.http.client import HTTPLM, BlackBoxServerError
from replug_jax.models.tokenizer import TextTokenizer
from replug_jax.serve import BackgroundServer
from tests import hf_tiny

UNICODE_TAIL = " Zürich's café served a naïve e\u0301lan — 東京都の人 👩\u200d👩\u200d👧 waved, and left."


@pytest.fixture(scope="module")
def heldout_text():
    """A held-out-style paragraph of real Wikipedia text, with non-ASCII characters appended."""
    from replug_jax.data.wiki import load_wiki_articles

    article = load_wiki_articles()[-1]
    body = " ".join(article.text.split()[:90])
    return body + UNICODE_TAIL


def split_points(text: str) -> dict[str, int]:
    """Character positions to split at, one of each kind the contract must survive."""
    word = max(text.split()[:60], key=len)
    at_word = text.index(word) + len(word) // 2
    space = text.index(" ", 40)
    return {"mid-word": at_word, "before a space": space, "after a space": space + 1,
            "between a letter and its combining accent": text.index("\u0301"),
            "inside a zero-width-joiner emoji": text.index("\u200d") + 1,
            "inside CJK text": text.index("京"), "mid-word in the accents": text.index("ïve") + 1}


@pytest.fixture(scope="module")
def served_smollm2(smollm2):
    with BackgroundServer(smollm2) as server:
        yield server


def test_any_split_scores_identically_on_local_and_http(smollm2, served_smollm2, heldout_text):
    points = split_points(heldout_text)
    contexts = [heldout_text[:n] for n in points.values()] + [""]
    continuations = [heldout_text[n : n + 120] for n in points.values()] + [heldout_text[:50]]
    local = smollm2.score(contexts, continuations)
    remote = HTTPLM(served_smollm2.url, tokenizer=smollm2.tokenizer)
    assert remote.stats()["prompt_format"].startswith("token ids")
    got = remote.score(contexts, continuations)
    for name, a, b in zip(list(points) + ["empty context"], got, local):
        assert a.shape == b.shape, name
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=0, err_msg=name)
    # the text fallback scores the server's tokens of the joined text: mid-word splits differ, and say so
    text_mode = HTTPLM(served_smollm2.url, tokenizer=smollm2.tokenizer, token_prompts=False)
    assert text_mode.stats()["prompt_format"].startswith("text (token_prompts=False)")
    mid = list(points).index("mid-word")
    (joined,) = text_mode.score([contexts[mid]], [continuations[mid]])
    differs = joined.shape != local[mid].shape or np.abs(joined - local[mid]).max() > 0.1
    assert differs, "a mid-word split should tokenise differently as joined text"


def test_http_cuts_long_contexts_like_local(tmp_path):
    import replug_jax as rj

    hf_tiny.tiny_gpt2(str(tmp_path), positions=256)
    lm = rj.load_lm(str(tmp_path), batch_size=8, max_length=48)
    contexts = ["word " * 40, "x" * 100 + " the end", "short"]
    continuations = [" and more words", " tail", " y"]
    with BackgroundServer(lm) as server:
        remote = HTTPLM(server.url, tokenizer=lm.tokenizer)
        assert remote.max_length == 48  # learned from /models
        got = remote.score(contexts, continuations)
        for a, b in zip(got, lm.score(contexts, continuations)):
            np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
        before = remote.stats()["requests"]
        with pytest.raises(ValueError, match="does not fit the LM's 48-token window"):
            remote.score(["a", "b"], [" ok", "z" * 60])
        assert remote.stats()["requests"] == before  # refused before any request


def test_a_tokenizer_that_is_not_the_servers_is_refused(tmp_path):
    import replug_jax as rj

    hf_tiny.tiny_gpt2(str(tmp_path), positions=256)
    lm = rj.load_lm(str(tmp_path), batch_size=8)
    vocab = lm.tokenizer.backend.get_vocab()
    reordered = {token: (len(vocab) - 1 - i) for token, i in vocab.items()}  # the same tokens, other ids
    backend = tokenizers.Tokenizer(tokenizers.models.BPE(vocab=reordered, merges=[], unk_token=None))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = tokenizers.decoders.ByteLevel()
    wrong = TextTokenizer(backend)
    with BackgroundServer(lm) as server:
        with pytest.raises(BlackBoxServerError, match="not the server's"):
            HTTPLM(server.url, tokenizer=wrong)
