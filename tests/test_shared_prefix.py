"""Rows that share a long prefix (a few-shot block) read it from one key/value cache: the groups are the right
ones, and the scores equal scoring every row in full, on tiny models of each family, on a model-parallel mesh,
and on the real SmolLM2 weights with MMLU-style prompts."""
import jax
import numpy as np
import pytest

import replug_jax as rj
from replug_jax.parallel import sharding
from replug_jax.data.records import MCExample
from replug_jax.evaluate import mmlu
from replug_jax.lm.local import LocalLM
from replug_jax.lm.shared_prefix import prefix_groups
from tests import hf_tiny


def test_groups_are_the_rows_sharing_a_long_enough_prefix():
    a = [1, 2, 3, 4, 5, 6]
    rows = [a + [7, 8], [9, 9, 9, 9, 9], a + [8], a[:5] + [0, 1], [9, 9, 9, 9, 1], a + [7, 9]]
    first = [len(r) - 1 for r in rows]
    groups, alone = prefix_groups(rows, first, min_length=4, min_saved=0)
    assert sorted(sorted(m) for _, m in groups) == [[0, 2, 3, 5], [1, 4]]
    assert dict((tuple(sorted(m)), c) for c, m in groups) == {(0, 2, 3, 5): 5, (1, 4): 4} and alone == []
    # the prefix never reaches a position that must predict (row 2 reads position 3's next-token distribution)
    groups, _ = prefix_groups(rows, [7, 4, 3, 6, 4, 7], min_length=3, min_saved=0)
    assert dict((tuple(sorted(m)), c) for c, m in groups)[(0, 2, 3, 5)] == 3
    # too short a shared prefix, a lone row, and grouping turned off
    groups, alone = prefix_groups(rows, first, min_length=6, min_saved=0)
    assert [sorted(m) for _, m in groups] == [[0, 2, 5]] and alone == [1, 3, 4]
    # a group must save enough: rows 1 and 4 share 4 tokens (4 saved), the others 5 each (15 saved)
    groups, alone = prefix_groups(rows, first, min_length=4, min_saved=5)
    assert [sorted(m) for _, m in groups] == [[0, 2, 3, 5]] and alone == [1, 4]
    assert prefix_groups(rows, first, min_length=4)[0] == []  # by default 4 × min_length = 16 tokens
    assert prefix_groups(rows, first, min_length=0) == ([], list(range(6)))


# tiny models have a 64-token window and a byte tokenizer: a 30-token shared block, rows of up to ~56 tokens
SHOTS = "Q: why?\nA: so\n\n" * 2
CONTEXTS = [SHOTS + f"K{i} " + "w" * (i % 5) + "\nA:" for i in range(10)]
CONTINUATIONS = [" A", " B", " C", " D", " lead", " a long answer", " B", " x y", " iron", " C"]


def largest_group(lm, contexts, continuations, min_length: int) -> int:
    """Rows in the largest group that `lm` scores after a shared prefix (as LocalLM forms its rows)."""
    rows = lm._rows([lm.pair_tokens(c, y) for c, y in zip(contexts, continuations)])
    groups, _ = prefix_groups([r.ids for r in rows], [r.predict_from[0] for r in rows], min_length)
    return max((len(m) for _, m in groups), default=0)


def _no_prefix_cache(lm) -> LocalLM:
    return LocalLM(lm.config, jax.device_get(lm.params), lm.tokenizer, batch_size=8, max_length=lm.max_length,
                   mesh=lm.mesh, min_shared_prefix=0)


@pytest.mark.parametrize("family", ["gpt2", "llama", "mistral", "qwen2"])
def test_scores_after_a_shared_prefix_equal_full_rows(family, tmp_path):
    path = str(tmp_path)
    {"gpt2": lambda: hf_tiny.tiny_gpt2(path, positions=128), "llama": lambda: hf_tiny.tiny_llama(path),
     "mistral": lambda: hf_tiny.tiny_mistral(path, window=8), "qwen2": lambda: hf_tiny.tiny_qwen2(path)}[family]()
    cached = rj.load_lm(path, batch_size=8)
    cached.min_shared_prefix = 16
    full = _no_prefix_cache(cached)
    assert largest_group(cached, CONTEXTS, CONTINUATIONS, 16) >= 6  # the path under test is taken
    got, want = cached.score(CONTEXTS, CONTINUATIONS), full.score(CONTEXTS, CONTINUATIONS)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, atol=2e-5)


def test_model_parallel_prefix_cache_equals_one_device(tmp_path):
    hf_tiny.tiny_qwen2(str(tmp_path))
    one = rj.load_lm(str(tmp_path), batch_size=8, mesh=sharding.data_mesh(jax.devices()[:1]))
    one.min_shared_prefix = 0
    split = rj.load_lm(str(tmp_path), batch_size=8, model_parallel=2)
    split.min_shared_prefix = 16
    for g, w in zip(split.score(CONTEXTS, CONTINUATIONS), one.score(CONTEXTS, CONTINUATIONS)):
        np.testing.assert_allclose(g, w, atol=2e-5)


@pytest.mark.slow  # real weights where the tiny models above are checked
def test_real_weights_mmlu_option_scores_equal_full_rows(smollm2):
    """SmolLM2's option log-probs of 2-shot, 3-passage MMLU-style prompts: computed with the shots' tokens read
    once per subject equal the full rows (the issue's 1e-4)."""
    shots = [MCExample(f"s{i}", f"Which planet is number {i} from the sun?", ["Mercury", "Venus", "Earth", "Mars"], i % 4,
                       "astronomy") for i in range(2)]
    passages = [f"Passage {j}: the planets orbit the sun at different distances, " * 3 for j in range(3)]
    prefix = mmlu.shots_block(shots, passages[:2])
    questions = [MCExample(name, f"What colour is planet {name}?", ["red", "blue", "white", "grey"], 0, "astronomy")
                 for name in ("Mars", "Neptune")]
    prompts = mmlu.method_prompts("replug", questions, [passages] * 2, {"astronomy": prefix})
    contexts = [p for q in prompts for p in q for _ in "ABCD"]
    letters = [f" {x}" for q in prompts for _ in q for x in "ABCD"]
    # 2 questions × 3 passes, each pass's 4 letters in one row, all 6 rows after the shots read once
    assert largest_group(smollm2, contexts, letters, smollm2.min_shared_prefix) == 6
    got = mmlu.option_logprobs(smollm2, prompts)
    full = _no_prefix_cache(smollm2)
    want = mmlu.option_logprobs(full, prompts)
    np.testing.assert_allclose(got, want, atol=1e-4)
