"""replug_jax: REPLUG (Shi et al., 2023) in JAX/Flax: retrieval-augmented black-box language models.

Public API for notebooks:
    import replug_jax as rj
    enc = rj.load_encoder("minilm"); E = enc.embed(["a text"])          # [N, D] float32
    lm = rj.load_lm("smollm2"); lps = lm.score(["a context"], [" more"])  # list of [T_i] log-probs
"""
from replug_jax.api import load_encoder, load_lm, load_tokenizer
from replug_jax.lm.blackbox import BlackBoxLM
from replug_jax.lm.local import LocalLM
from replug_jax.models.registry import ModelNotFound
from replug_jax.models.weights import WeightsError
from replug_jax.retrieval.dense import DenseEncoder

__all__ = ["load_encoder", "load_lm", "load_tokenizer", "BlackBoxLM", "LocalLM", "DenseEncoder", "ModelNotFound", "WeightsError"]
__version__ = "0.1.0"
