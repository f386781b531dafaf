"""BERT-family dense encoder with mean pooling (Contriever, all-MiniLM-L6-v2).

Public boundary: `embed(params, config, input_ids, attention_mask, normalize)`, a pure
function of a parameter pytree. The linen modules inside mirror Hugging Face's BertModel
so that `weights.bert_params_from_hf` is a plain renaming.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from replug_jax.models import layers, precision


@dataclasses.dataclass(frozen=True)
class BertConfig:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_position: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"
    pad_token_id: int = 0

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> "BertConfig":
        """From a Hugging Face `config.json` dict of a BERT-family model."""
        if cfg.get("model_type") not in ("bert", None):
            raise ValueError(f"encoder expects a BERT-family config, got model_type={cfg.get('model_type')!r}")
        if cfg.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError("only absolute position embeddings are supported")
        return cls(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=cfg["num_attention_heads"],
            intermediate_size=cfg["intermediate_size"],
            max_position=cfg.get("max_position_embeddings", 512),
            type_vocab_size=cfg.get("type_vocab_size", 2),
            layer_norm_eps=cfg.get("layer_norm_eps", 1e-12),
            hidden_act=cfg.get("hidden_act", "gelu"),
            pad_token_id=cfg.get("pad_token_id", 0) or 0,
        )


class BertLayer(nn.Module):
    config: BertConfig
    dtype: jnp.dtype

    @nn.compact
    def __call__(self, x, bias):  # x: [B, L, D]
        c = self.config
        head_dim = c.hidden_size // c.num_heads
        dense = lambda n, name: layers.dense(n, self.dtype, name)
        split = lambda t: t.reshape(t.shape[:2] + (c.num_heads, head_dim))  # [B, L, H, Dh]
        q, k, v = (split(dense(c.hidden_size, n)(x)) for n in ("query", "key", "value"))
        attn = layers.dot_product_attention(q, k, v, bias).reshape(x.shape)
        x = layers.layer_norm(c.layer_norm_eps, self.dtype, "attention_norm")(x + dense(c.hidden_size, "attention_out")(attn))
        h = layers.activation(c.hidden_act)(dense(c.intermediate_size, "intermediate")(x))
        return layers.layer_norm(c.layer_norm_eps, self.dtype, "output_norm")(x + dense(c.hidden_size, "output")(h))


class BertEncoder(nn.Module):
    """Token states of a BERT model: [B, L] ids -> [B, L, D]. With `recompute`, a gradient keeps only each layer's
    input and recomputes the layer's activations for the backward pass (jax.checkpoint)."""

    config: BertConfig
    dtype: jnp.dtype = jnp.float32
    recompute: bool = False

    @nn.compact
    def __call__(self, input_ids, attention_mask):
        c = self.config
        embed = lambda n, name: nn.Embed(n, c.hidden_size, dtype=self.dtype, param_dtype=jnp.float32, name=name)
        positions = jnp.arange(input_ids.shape[1])[None, :]  # BERT counts from the start: right-pad only
        x = (
            embed(c.vocab_size, "word_embeddings")(input_ids)
            + embed(c.max_position, "position_embeddings")(positions)
            + embed(c.type_vocab_size, "token_type_embeddings")(jnp.zeros_like(input_ids))
        )
        x = layers.layer_norm(c.layer_norm_eps, self.dtype, "embeddings_norm")(x)
        bias = layers.padding_bias(attention_mask)
        layer = nn.remat(BertLayer) if self.recompute else BertLayer  # the same parameters either way
        for i in range(c.num_layers):
            x = layer(c, self.dtype, name=f"layer_{i}")(x, bias)
        return x


def mean_pool(states, attention_mask):
    """Average of token states over real tokens: [B, L, D], [B, L] -> [B, D] float32."""
    mask = attention_mask.astype(jnp.float32)[..., None]
    summed = jnp.sum(states.astype(jnp.float32) * mask, axis=1)
    return summed / jnp.maximum(jnp.sum(mask, axis=1), 1e-9)


def l2_normalize(x, eps: float = 1e-12):
    """Rows scaled to unit length (as torch.nn.functional.normalize); finite gradient at the zero row."""
    return x * jax.lax.rsqrt(jnp.maximum(jnp.sum(x * x, axis=-1, keepdims=True), eps * eps))


def embed(params, config: BertConfig, input_ids, attention_mask, normalize: bool = False, dtype=jnp.float32,
          recompute: bool = False):
    """Mean-pooled embeddings: input_ids, attention_mask [B, L] (right-padded) -> [B, D] float32.

    With `normalize`, rows have unit L2 norm, so inner products are cosine similarities. `recompute`: a gradient
    through it recomputes each layer's activations instead of keeping them (the same values, less memory).
    """
    with precision.matmuls(dtype):
        states = BertEncoder(config, dtype, recompute).apply({"params": params}, input_ids, attention_mask)
    pooled = mean_pool(states, attention_mask)
    return l2_normalize(pooled) if normalize else pooled


def init_params(config: BertConfig, seed: int = 0):
    """Random parameters (for tests and shape checks)."""
    ids = jnp.zeros((1, 8), jnp.int32)
    return BertEncoder(config).init(jax.random.PRNGKey(seed), ids, jnp.ones_like(ids))["params"]
