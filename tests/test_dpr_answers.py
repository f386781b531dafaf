"""DPR's has_answer (evaluate/dpr_answers.py) against DPR's own rules on hand-made passages in several scripts, and
its top-k accuracy against a plain count."""
import unicodedata

import numpy as np
import pytest

from replug_jax.evaluate.dpr_answers import has_answer, tokens, top_k_accuracy


@pytest.mark.parametrize("answers, passage, want", [
    (["Paris"], "The capital of France is Paris.", True),
    (["paris"], "PARIS, the capital", True),  # uncased
    (["art"], "a party", False),  # whole tokens only
    (["U.S."], "the U.S. army", True),  # punctuation is its own token: u . s .
    (["U.S."], "the US army", False),  # ... so "US" is not "U . S ."
    (["café"], "Le cafe\u0301 est ouvert", True),  # NFD on both sides: the precomposed é matches e + combining accent
    (["Київ"], "Столиця України — Київ.", True),
    (["Ньютон"], "закони ньютона", False),  # a longer word is another token
    (["東京"], "日本の首都は東京です", False),  # CJK without spaces is one run of letters, as in DPR
    (["東京"], "首都: 東京 (Tokyo)", True),
    (["👩‍👩‍👧"], "family 👩‍👩‍👧 emoji", True),  # each non-space symbol its own token
    (["1,000"], "about 1,000 people", True),
    (["two words"], "the two\nwords here", True),  # any whitespace between tokens
    (["none", "Paris"], "in Paris", True),  # any of the answers
    (["   "], "anything at all", True),  # no tokens: matches every passage, as DPR's loop does
])
def test_has_answer_follows_dprs_tokenizer(answers, passage, want):
    assert has_answer(answers, passage) is want


def test_tokens_are_dprs_simple_tokenizer():
    assert tokens("Hello, World! It's 3.5") == ["hello", ",", "world", "!", "it", "'", "s", "3", ".", "5"]
    assert tokens("e\u0301") == tokens(unicodedata.normalize("NFC", "e\u0301"))  # combining marks stay in the word


def test_top_k_accuracy_is_the_share_with_an_answer_among_the_first_k():
    flags = [[False, True, False], [False, False, False], [True, False, False], [False, False, True]]
    got = top_k_accuracy(flags, [1, 2, 3])
    for k in (1, 2, 3):
        assert got[k] == pytest.approx(100 * np.mean([any(row[:k]) for row in flags]))
