"""What decides reuse: an encoder's fingerprint sees its compute dtype, a trained copy keeps the weights' dtype, a
datastore is re-cut for another tokenizer of the same vocabulary size, and rewriting an unchanged corpus file
keeps what was built from it."""
import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

import replug_jax as rj
from replug_jax.jobs import prepare
from replug_jax.data import wiki
from replug_jax.models.tokenizer import TextTokenizer
from replug_jax.retrieval.datastore import Document

from tests import hf_tiny


@pytest.fixture(scope="module")
def tiny_bert_dir(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("bert"))
    hf_tiny.tiny_bert(path)
    return path


def test_encoder_fingerprint_sees_the_compute_dtype_and_with_params_keeps_the_weights_dtype(tiny_bert_dir):
    f32 = rj.load_encoder(tiny_bert_dir, dtype="float32")
    bf16_compute = rj.load_encoder(tiny_bert_dir, dtype="bfloat16", param_dtype="float32")
    assert f32.fingerprint() != bf16_compute.fingerprint()  # same weights, other numbers: another index
    assert f32.fingerprint() == rj.load_encoder(tiny_bert_dir, dtype="float32").fingerprint()
    half_weights = rj.load_encoder(tiny_bert_dir, dtype="float32", param_dtype="bfloat16")
    trained = half_weights.with_params(f32.params, name="trained")  # float32 weights, as LSR returns them
    assert {x.dtype for x in __import__("jax").tree.leaves(trained.params)} == {jnp.dtype(jnp.bfloat16)}
    assert trained.dtype == half_weights.dtype


def word_tokenizer(split_chars: bool) -> TextTokenizer:
    """A word-level tokenizer of 40 entries: whole words, or single characters (same vocabulary size)."""
    words = ["alpha", "beta", "gamma", "delta", "[UNK]"]
    chars = sorted(set("".join(words[:4])))
    vocab = words + chars if split_chars else words + [f"w{i}" for i in range(len(chars))]
    vocab += [f"pad{i}" for i in range(40 - len(vocab))]
    backend = Tokenizer(models.WordLevel({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
    backend.pre_tokenizer = (pre_tokenizers.Split("", "isolated") if split_chars else pre_tokenizers.Whitespace())
    return TextTokenizer(backend)


def test_datastore_is_recut_for_another_tokenizer_of_the_same_size(tmp_path):
    words, chars = word_tokenizer(False), word_tokenizer(True)
    assert words.vocab_size == chars.vocab_size == 40
    corpus = tmp_path / "corpus.jsonl"
    wiki.write_jsonl([Document("d0", "", "alpha beta gamma delta " * 6)], str(corpus))
    by_words = prepare.build_datastore(str(corpus), words, 8, str(tmp_path))
    by_chars = prepare.build_datastore(str(corpus), chars, 8, str(tmp_path))
    assert len(by_chars) > len(by_words)  # cut again by characters, not the word-cut file reused
    assert len(prepare.build_datastore(str(corpus), chars, 8, str(tmp_path))) == len(by_chars)


def test_an_unchanged_corpus_file_is_not_rewritten(tmp_path):
    path = str(tmp_path / "data" / "corpus.jsonl")
    docs = [Document("a", "A", "first text"), Document("b", "", "second")]
    assert wiki.write_jsonl(docs, path) == 2
    os.utime(path, ns=(1, 1))
    assert wiki.write_jsonl(docs, path) == 2 and os.stat(path).st_mtime_ns == 1  # kept: builds from it are reused
    wiki.write_jsonl(docs[:1], path)
    assert os.stat(path).st_mtime_ns != 1 and [json.loads(l)["id"] for l in open(path)] == ["a"]
    assert not [f for f in os.listdir(tmp_path / "data") if f.endswith(".tmp")]
