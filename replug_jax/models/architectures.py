"""Model shapes without their weights: what the TPU plan compiles for (replug_jax/plan/).

    lm_config("meta-llama/Llama-2-7b-hf")   # a CausalLMConfig, nothing downloaded
    encoder_config("contriever")            # (BertConfig, the longest input the encoder takes)
    param_shapes(config, jnp.bfloat16)      # the LM's parameter tree as ShapeDtypeStructs, never allocated

Names resolve as the jobs resolve them (`registry`): the packaged models (their config.json or GGUF metadata, no
tensor read), a local Hugging Face directory or .gguf file, the paper-scale LMs and retrievers below (their Hugging
Face config.json values, so that a 70B plan needs no network), and any other hub id by its config.json alone, where
a network is.
"""
from __future__ import annotations

import functools
import json
import os

import jax
import jax.numpy as jnp

from replug_jax.models import causal_lm, gguf_loader, registry, split_gguf
from replug_jax.models.causal_lm import CausalLMConfig
from replug_jax.models.encoder import BertConfig

# Hugging Face config.json values (the fields CausalLMConfig.from_hf reads) of the paper-scale LMs
LLAMA2 = dict(model_type="llama", vocab_size=32000, max_position_embeddings=4096, rms_norm_eps=1e-5)
QWEN25 = dict(model_type="qwen2", vocab_size=152064, max_position_embeddings=131072, rms_norm_eps=1e-6,
              rope_theta=1e6, tie_word_embeddings=False)
GPT2 = dict(model_type="gpt2", vocab_size=50257, n_positions=1024)
KNOWN_LMS = {
    "meta-llama/Llama-2-7b-hf": dict(LLAMA2, hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                                     num_key_value_heads=32, intermediate_size=11008),
    "meta-llama/Llama-2-13b-hf": dict(LLAMA2, hidden_size=5120, num_hidden_layers=40, num_attention_heads=40,
                                      num_key_value_heads=40, intermediate_size=13824),
    "meta-llama/Llama-2-70b-hf": dict(LLAMA2, hidden_size=8192, num_hidden_layers=80, num_attention_heads=64,
                                      num_key_value_heads=8, intermediate_size=28672),
    "Qwen/Qwen2.5-7B": dict(QWEN25, hidden_size=3584, num_hidden_layers=28, num_attention_heads=28,
                            num_key_value_heads=4, intermediate_size=18944),
    "Qwen/Qwen2.5-14B": dict(QWEN25, hidden_size=5120, num_hidden_layers=48, num_attention_heads=40,
                             num_key_value_heads=8, intermediate_size=13824),
    "mistralai/Mistral-7B-v0.1": dict(model_type="mistral", vocab_size=32000, hidden_size=4096,
                                      num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                                      intermediate_size=14336, sliding_window=4096, max_position_embeddings=32768,
                                      rms_norm_eps=1e-5),
    "openai-community/gpt2": dict(GPT2, n_embd=768, n_layer=12, n_head=12),
    "openai-community/gpt2-medium": dict(GPT2, n_embd=1024, n_layer=24, n_head=16),
    "openai-community/gpt2-large": dict(GPT2, n_embd=1280, n_layer=36, n_head=20),
    "openai-community/gpt2-xl": dict(GPT2, n_embd=1600, n_layer=48, n_head=25),
}
LM_ALIASES = {"llama-2-7b": "meta-llama/Llama-2-7b-hf", "llama-2-13b": "meta-llama/Llama-2-13b-hf",
              "llama-2-70b": "meta-llama/Llama-2-70b-hf", "qwen2.5-7b": "Qwen/Qwen2.5-7B",
              "qwen2.5-14b": "Qwen/Qwen2.5-14B", "mistral-7b": "mistralai/Mistral-7B-v0.1"}
BERT_BASE = dict(model_type="bert", vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                 intermediate_size=3072, max_position_embeddings=512)
KNOWN_ENCODERS = {"facebook/contriever": BERT_BASE, "facebook/contriever-msmarco": BERT_BASE}


def hub_id(name: str) -> str:
    """The hub id a short name stands for (the registry's and the plan's aliases), else the name."""
    return LM_ALIASES.get(name.lower(), registry.HUB_ALIASES.get(name, name))


def lm_config(name: str) -> CausalLMConfig:
    """The causal LM `name`'s config (module docstring); ModelNotFound for a name none of the ways resolves."""
    if name in registry.PACKAGED or name in split_gguf.READERS:
        source = registry.resolve(name)  # a packaged GGUF (the readers' parts assembled on first use)
        if source.kind == "gguf":
            return gguf_loader.config_of_file(source.path)
        return CausalLMConfig.from_hf(_read_json(os.path.join(source.path, "config.json")))
    local = _local(name)
    if local is not None:
        if local.endswith(".gguf"):
            return gguf_loader.config_of_file(local)
        return CausalLMConfig.from_hf(_read_json(os.path.join(local, "config.json")))
    repo = hub_id(name)
    if repo in KNOWN_LMS:
        return CausalLMConfig.from_hf(KNOWN_LMS[repo])
    return CausalLMConfig.from_hf(_hub_config(repo, "LMs", KNOWN_LMS))


def encoder_config(name: str) -> tuple[BertConfig, int]:
    """(the BERT-family encoder `name`'s config, the longest input it takes: its sentence-transformers
    max_seq_length where it has one, else its positions) without its weights."""
    if name in registry.PACKAGED:
        folder = registry.resolve(name).path
    else:
        folder = _local(name)
    if folder is not None:
        config = BertConfig.from_hf(_read_json(os.path.join(folder, "config.json")))
        sentence = os.path.join(folder, "sentence_bert_config.json")
        longest = _read_json(sentence).get("max_seq_length") if os.path.isfile(sentence) else None
        return config, int(longest or config.max_position)
    repo = hub_id(name)
    values = KNOWN_ENCODERS.get(repo) or _hub_config(repo, "encoders", KNOWN_ENCODERS)
    config = BertConfig.from_hf(values)
    return config, config.max_position


@functools.lru_cache(maxsize=16)
def param_shapes(config: CausalLMConfig, dtype=jnp.bfloat16):
    """The LM's parameter tree as ShapeDtypeStructs in `dtype` (traced, never allocated)."""
    ids = jax.ShapeDtypeStruct((1, 8), jnp.int32)
    shapes = jax.eval_shape(lambda i: causal_lm.CausalLM(config).init(jax.random.PRNGKey(0), i, jnp.ones_like(i)), ids)
    return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, jnp.dtype(dtype)), shapes["params"])


def _local(name: str) -> str | None:
    path = os.path.expanduser(name)
    if os.path.isfile(path) and path.endswith(".gguf"):
        return path
    if os.path.isdir(path):
        ggufs = sorted(f for f in os.listdir(path) if f.endswith(".gguf"))
        if not os.path.isfile(os.path.join(path, "config.json")) and len(ggufs) == 1:
            return os.path.join(path, ggufs[0])
        return path
    return None


def _read_json(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _hub_config(repo: str, role: str, known: dict) -> dict:
    """A hub repository's config.json (the one small file), or ModelNotFound naming the shapes known offline."""
    try:
        from huggingface_hub import hf_hub_download

        return _read_json(hf_hub_download(repo, "config.json"))
    except Exception as e:
        raise registry.ModelNotFound(
            f"{repo!r}: its config.json could not be read from the hub ({type(e).__name__}); {role} known offline: "
            f"{', '.join(known)}, the packaged models, or a local directory with a config.json") from e
