"""bf16 on a CPU only when asked (issue 72): the encoder and the LM load and compute in float32 by default, and
asked for bfloat16 their matmuls take bf16 operands and accumulate into float32 (the form XLA's CPU programs run on
AMX-BF16; a bf16 -> bf16 dot falls to a kernel slower than float32: benchmarks/README.md "bf16 on CPU")."""
import glob
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import replug_jax as rj
from replug_jax.jobs.config_files import sibling_config
from replug_jax.models import causal_lm, encoder, precision
from tests import hf_tiny

CONFIGS = sorted(glob.glob(os.path.join(os.path.dirname(os.path.dirname(__file__)), "experiments", "configs", "*.py")))

pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu", reason="the CPU's default and its bf16 form")


def dots(lowered_text: str) -> list[tuple[str, str, str]]:
    """(lhs, rhs, result) element types of every dot_general in a lowered program's StableHLO."""
    tensor = r"tensor<(?:\d+x)*(\w+)>"  # tensor<2x16x384xf32>: the element type
    types = re.findall(rf"stablehlo\.dot_general[^\n]*: \({tensor}, {tensor}\) -> {tensor}", lowered_text)
    assert types, "no dot_general found: the pattern no longer reads the program"
    return types


def encoder_program(enc, dtype) -> str:
    ids, mask = enc.padded(["Ein Text auf Deutsch.", "短い文"], 16)
    return jax.jit(lambda p, i, m: encoder.embed(p, enc.config, i, m, normalize=True, dtype=dtype)).lower(
        enc.params, ids, mask).as_text()


def lm_program(lm, dtype) -> str:
    ids, mask = np.ones((2, 16), np.int32), np.ones((2, 16), np.int32)
    return jax.jit(lambda p, i, m: causal_lm.logits(p, lm.config, i, m, dtype)).lower(lm.params, ids, mask).as_text()


@pytest.fixture(scope="module")
def tiny_lm_path(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("tiny_llama"))
    hf_tiny.tiny_llama(path)
    return path


def test_the_default_is_float32_weights_and_compute(tiny_lm_path):
    for path in CONFIGS:  # every shipped config that sets them leaves them to the host (pile_bpb's docstring asks)
        config = sibling_config(path, os.path.basename(path))
        for key in ("dtype", "param_dtype"):
            assert precision.resolve(config.get(key, "auto")) == np.float32, (os.path.basename(path), key)
    assert precision.resolve(None) == np.float32
    enc, lm = rj.load_encoder("minilm"), rj.load_lm(tiny_lm_path)
    for model, program in ((enc, encoder_program(enc, enc.dtype)), (lm, lm_program(lm, lm.dtype))):
        assert model.dtype == np.float32
        assert {leaf.dtype for leaf in jax.tree.leaves(model.params)} == {np.dtype("float32")}
        assert "bf16" not in program and set(dots(program)) == {("f32", "f32", "f32")}


def test_bfloat16_when_asked_multiplies_bf16_into_float32(tiny_lm_path):
    enc = rj.load_encoder("minilm", dtype="bfloat16")
    lm = rj.load_lm(tiny_lm_path, dtype="bfloat16")
    for model, program in ((enc, encoder_program(enc, enc.dtype)), (lm, lm_program(lm, lm.dtype))):
        assert model.dtype == jnp.bfloat16
        assert {leaf.dtype for leaf in jax.tree.leaves(model.params)} == {np.dtype("bfloat16")}
        assert set(dots(program)) == {("bf16", "bf16", "f32")}  # every dot: projections and attention alike
