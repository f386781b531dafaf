"""Decoder-only LMs: the GPT-2 family and the Llama family (RoPE, RMSNorm, SwiGLU, GQA; Qwen2 adds q/k/v biases,
Mistral a sliding attention window).

Public boundary: `logits(params, config, input_ids, attention_mask)` and
`token_logprobs(params, config, input_ids, attention_mask)`, pure functions of a parameter
pytree; for generation, models/kv_cache.py (`init_cache`, `extend`: append tokens to a key/value cache, whose
attention `CausalLM` computes). Positions are counted over real tokens only and padded keys are masked, so a
left- or right-padded batch gives the same values as each sequence scored alone.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from replug_jax.models import layers, precision

STACKED_LAYERS = "layers"  # the params key of the blocks' stacked weights: {"layers": {"q_proj": {"kernel": [L, D, HDh]}}}
_UNROLLED = contextvars.ContextVar("layers_unrolled", default=False)


@contextlib.contextmanager
def layers_unrolled():
    """Trace the block stack unrolled, one copy of the block per layer and no loop (the same numbers): for cost
    models that count a loop's body once (XLA's `cost_analysis`: replug_jax/plan/costs.py)."""
    token = _UNROLLED.set(True)
    try:
        yield
    finally:
        _UNROLLED.reset(token)


@dataclasses.dataclass(frozen=True)
class CausalLMConfig:
    arch: str  # "gpt2", "llama" or "qwen2" (Llama blocks with q/k/v biases)
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    max_position: int
    norm_eps: float
    hidden_act: str
    tie_embeddings: bool = True
    rope_theta: float = 10000.0
    head_dim: int | None = None
    qkv_bias: bool = False  # Qwen2: biases on the q, k and v projections (not on o)
    sliding_window: int | None = None  # Mistral: a token attends to the `sliding_window` tokens up to itself

    @property
    def dims_per_head(self) -> int:
        return self.head_dim or self.hidden_size // self.num_heads

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> "CausalLMConfig":
        """From a Hugging Face `config.json` dict (model_type gpt2, llama, mistral or qwen2)."""
        model_type = cfg.get("model_type")
        if model_type == "gpt2":
            hidden = cfg["n_embd"]
            return cls(
                arch="gpt2", vocab_size=cfg["vocab_size"], hidden_size=hidden, num_layers=cfg["n_layer"],
                num_heads=cfg["n_head"], num_kv_heads=cfg["n_head"], intermediate_size=cfg.get("n_inner") or 4 * hidden,
                max_position=cfg["n_positions"], norm_eps=cfg.get("layer_norm_epsilon", 1e-5),
                hidden_act=cfg.get("activation_function", "gelu_new"), tie_embeddings=True,
            )
        if model_type in ("llama", "mistral", "qwen2"):
            params = cfg.get("rope_parameters") or {}
            scaling = cfg.get("rope_scaling") or params
            if scaling.get("rope_type", scaling.get("type", "default")) != "default":
                raise ValueError(f"unsupported rope_scaling {scaling!r}: only plain RoPE is implemented")
            if cfg.get("attention_bias") or cfg.get("mlp_bias"):
                raise ValueError("Llama variants with attention or MLP biases are not supported")
            if model_type == "qwen2" and cfg.get("use_sliding_window"):
                raise ValueError("Qwen2 with use_sliding_window=true is not supported (only full attention)")
            window = cfg.get("sliding_window") if model_type == "mistral" else None
            return cls(
                arch="qwen2" if model_type == "qwen2" else "llama", vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
                num_layers=cfg["num_hidden_layers"], num_heads=cfg["num_attention_heads"],
                num_kv_heads=cfg.get("num_key_value_heads") or cfg["num_attention_heads"],
                intermediate_size=cfg["intermediate_size"], max_position=cfg.get("max_position_embeddings", 2048),
                norm_eps=cfg.get("rms_norm_eps", 1e-6), hidden_act=cfg.get("hidden_act", "silu"),
                tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                rope_theta=float(params.get("rope_theta", cfg.get("rope_theta", 10000.0))),
                head_dim=cfg.get("head_dim"), qkv_bias=model_type == "qwen2",
                sliding_window=int(window) if window else None,
            )
        raise ValueError(f"unsupported causal LM model_type {model_type!r}; supported: gpt2, llama, mistral, qwen2")


def rotary(x, positions, theta: float):
    """Rotary position embedding in the Hugging Face (rotate-half) layout.

    x: [B, L, H, Dh]; positions: [B, L]. Angles in float32.
    """
    half = x.shape[-1] // 2
    inv_freq = 1.0 / (theta ** (jnp.arange(0, half, dtype=jnp.float32) * 2.0 / x.shape[-1]))  # [Dh/2]
    angles = positions[..., None].astype(jnp.float32) * inv_freq  # [B, L, Dh/2]
    cos = jnp.cos(angles)[:, :, None, :]
    sin = jnp.sin(angles)[:, :, None, :]
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def _through_cache(k, v, caches, layer, slot):
    """Without a cache: (k, v, None). With caches = (k_all, v_all [layers, B, S, Hkv, Dh]): the new keys and values
    written into layer `layer`'s slots from `slot` on, in place (the caches are the block stack's loop carry, so no
    layer copies the cache), and that layer's whole cache returned to attend over."""
    if caches is None:
        return k, v, None
    k_all, v_all = caches
    k_all = jax.lax.dynamic_update_slice(k_all, k[None].astype(k_all.dtype), (layer, 0, slot, 0, 0))
    v_all = jax.lax.dynamic_update_slice(v_all, v[None].astype(v_all.dtype), (layer, 0, slot, 0, 0))
    return k_all[layer].astype(k.dtype), v_all[layer].astype(v.dtype), (k_all, v_all)


def _attend(q, k, v, bias, caches, prefix_kv, prefix_bias):
    """Without a cache the bias is causal over the block's own tokens: attend block by block, skipping the masked
    future keys; through a cache, over every slot; after a shared prefix (`kv_cache.after_prefix`), over the
    prefix's keys, read once for all rows, and the row's own slots, in one softmax."""
    if caches is None:
        return layers.causal_attention(q, k, v, bias)
    if prefix_kv is None:
        return layers.dot_product_attention(q, k, v, bias)
    return layers.prefixed_attention(q, k, v, bias, prefix_kv[0][0], prefix_kv[1][0], prefix_bias)


class GPT2Block(nn.Module):
    config: CausalLMConfig
    dtype: jnp.dtype

    @nn.compact
    def __call__(self, carry, layer, prefix_kv, bias, prefix_bias, positions, slot):  # see `CausalLM`
        c = self.config
        x, caches = carry  # x [B, L, D]
        h = layers.layer_norm(c.norm_eps, self.dtype, "ln_1")(x)
        qkv = layers.dense(3 * c.hidden_size, self.dtype, "c_attn", True)(h)
        q, k, v = (t.reshape(t.shape[:2] + (c.num_heads, c.dims_per_head)) for t in jnp.split(qkv, 3, axis=-1))
        no_cache = caches is None
        k, v, caches = _through_cache(k, v, caches, layer, slot)
        attn = _attend(q, k, v, bias, None if no_cache else caches, prefix_kv, prefix_bias).reshape(x.shape)
        x = x + layers.dense(c.hidden_size, self.dtype, "c_proj", True)(attn)
        h = layers.layer_norm(c.norm_eps, self.dtype, "ln_2")(x)
        h = layers.activation(c.hidden_act)(layers.dense(c.intermediate_size, self.dtype, "c_fc", True)(h))
        return (x + layers.dense(c.hidden_size, self.dtype, "mlp_proj", True)(h), caches), None


class LlamaBlock(nn.Module):
    config: CausalLMConfig
    dtype: jnp.dtype

    @nn.compact
    def __call__(self, carry, layer, prefix_kv, bias, prefix_bias, positions, slot):  # see `CausalLM`
        c = self.config
        x, caches = carry  # x [B, L, D]
        dh = c.dims_per_head
        h = layers.RMSNorm(c.norm_eps, self.dtype, name="input_norm")(x)
        q = layers.dense(c.num_heads * dh, self.dtype, "q_proj", c.qkv_bias)(h).reshape(x.shape[:2] + (c.num_heads, dh))
        k = layers.dense(c.num_kv_heads * dh, self.dtype, "k_proj", c.qkv_bias)(h).reshape(x.shape[:2] + (c.num_kv_heads, dh))
        v = layers.dense(c.num_kv_heads * dh, self.dtype, "v_proj", c.qkv_bias)(h).reshape(x.shape[:2] + (c.num_kv_heads, dh))
        q, k = rotary(q, positions, c.rope_theta), rotary(k, positions, c.rope_theta)
        no_cache = caches is None
        k, v, caches = _through_cache(k, v, caches, layer, slot)
        attn = _attend(q, k, v, bias, None if no_cache else caches, prefix_kv, prefix_bias)
        attn = attn.reshape(x.shape[:2] + (c.num_heads * dh,))
        x = x + layers.dense(c.hidden_size, self.dtype, "o_proj", False)(attn)
        h = layers.RMSNorm(c.norm_eps, self.dtype, name="post_attention_norm")(x)
        gate = layers.activation(c.hidden_act)(layers.dense(c.intermediate_size, self.dtype, "gate_proj", False)(h))
        up = layers.dense(c.intermediate_size, self.dtype, "up_proj", False)(h)
        return (x + layers.dense(c.hidden_size, self.dtype, "down_proj", False)(gate * up), caches), None


class CausalLM(nn.Module):
    """[B, L] token ids -> [B, L, V] next-token logits (float32)."""

    config: CausalLMConfig
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, input_ids, attention_mask, positions_to_predict=None, cache=None):
        """positions_to_predict [B, T] (optional): compute logits only at these positions -> [B, T, V].

        cache (optional, see `kv_cache.init_cache`): the tokens extend the cached ones; returns (logits, new cache)."""
        c = self.config
        prefix = None if cache is None else cache.get("prefix")  # a shared prefix's one-row cache (after_prefix)
        prefix_kv = prefix_bias = None
        if cache is None:
            positions = layers.positions_from_mask(attention_mask)  # [B, L]
            bias = layers.causal_bias(attention_mask, c.sliding_window)
        else:
            positions, bias, key_mask = _cached_positions_and_bias(cache, attention_mask, c.sliding_window)
            if prefix is not None:
                prefix_kv = (prefix["k"], prefix["v"])  # [layers, 1, P, Hkv, Dh] each, read by every row
                prefix_bias = _prefix_bias(prefix["key_mask"], positions, c.sliding_window)  # [B, 1, L, P]
        wte = nn.Embed(c.vocab_size, c.hidden_size, dtype=self.dtype, param_dtype=jnp.float32, name="embed_tokens")
        x = wte(input_ids)
        if c.arch == "gpt2":
            x = x + nn.Embed(c.max_position, c.hidden_size, dtype=self.dtype, param_dtype=jnp.float32, name="embed_positions")(positions)
        # the blocks: one scan over their stacked weights ("layers", leading axis = layer), so that compile
        # time does not grow with depth; the cache's keys and values [layers, B, S, Hkv, Dh] ride in the loop's
        # carry, each layer writing its new tokens' slots in place (as the scan's per-layer output, the whole cache
        # was written anew at every call: twice its bytes in memory, and a decoding step's traffic twice over)
        blocks = nn.scan(GPT2Block if c.arch == "gpt2" else LlamaBlock, variable_axes={"params": 0},
                         split_rngs={"params": True},
                         in_axes=(0, 0, nn.broadcast, nn.broadcast, nn.broadcast, nn.broadcast),
                         length=c.num_layers, unroll=c.num_layers if _UNROLLED.get() else 1)
        caches = None if cache is None else (cache["k"], cache["v"])  # [layers, B, S, Hkv, Dh] each
        (x, caches), _ = blocks(c, self.dtype, name=STACKED_LAYERS)(
            (x, caches), jnp.arange(c.num_layers, dtype=jnp.int32), prefix_kv, bias, prefix_bias, positions,
            None if cache is None else cache["length"])
        if c.arch == "gpt2":
            x = layers.layer_norm(c.norm_eps, self.dtype, "final_norm")(x)
        else:
            x = layers.RMSNorm(c.norm_eps, self.dtype, name="final_norm")(x)
        if positions_to_predict is not None:  # skip the LM head where no prediction is wanted
            x = jnp.take_along_axis(x, positions_to_predict[..., None], axis=1)  # [B, T, D]
        if c.tie_embeddings:
            out = wte.attend(x).astype(jnp.float32)
        else:
            out = layers.dense(c.vocab_size, self.dtype, "lm_head", False)(x).astype(jnp.float32)
        if cache is None:
            return out
        count = cache["count"] + attention_mask.sum(-1).astype(jnp.int32)
        length = cache["length"] + input_ids.shape[1]
        new_cache = {"k": caches[0], "v": caches[1], "key_mask": key_mask, "count": count, "length": length}
        return out, {**new_cache, "prefix": prefix} if prefix is not None else new_cache


def _cached_positions_and_bias(cache, attention_mask, window=None):
    """For L new tokens written at slots [length, length + L) of a cache of S slots: their positions
    (real tokens before them, pads skipped) [B, L], the attention bias [B, 1, L, S] (causal over slots,
    padded slots hidden, and with `window` the keys `window` or more tokens back) and the updated key mask [B, S]."""
    mask = attention_mask.astype(jnp.int32)
    positions = jnp.maximum(cache["count"][:, None] + jnp.cumsum(mask, axis=-1) - 1, 0)  # [B, L]
    key_mask = jax.lax.dynamic_update_slice(cache["key_mask"], mask, (0, cache["length"]))  # [B, S]
    slots = jnp.arange(key_mask.shape[1])  # [S]
    query_slots = cache["length"] + jnp.arange(mask.shape[1])  # [L]
    visible = (slots[None, :] <= query_slots[:, None])[None] & (key_mask[:, None, :] > 0)  # [B, L, S]
    if window is not None:  # the keys' positions count a shared prefix's real tokens before them (after_prefix)
        before = cache["prefix"]["key_mask"].sum() if "prefix" in cache else 0
        visible &= layers.within_window(positions, layers.positions_from_mask(key_mask) + before, window)
    return positions, jnp.where(visible[:, None], 0.0, layers.MASK_VALUE).astype(jnp.float32), key_mask


def _prefix_bias(prefix_mask, positions, window=None):
    """The bias [B, 1, L, P] of L new tokens at `positions` [B, L] over a shared prefix's P slots (its key mask
    [1, P]): every real prefix token precedes them; with `window`, only the last `window` tokens are seen."""
    visible = jnp.broadcast_to(prefix_mask[:, None, :] > 0, positions.shape + prefix_mask.shape[1:])  # [B, L, P]
    if window is not None:
        prefix_positions = jnp.broadcast_to(layers.positions_from_mask(prefix_mask), (positions.shape[0],)
                                            + prefix_mask.shape[1:])
        visible &= layers.within_window(positions, prefix_positions, window)
    return jnp.where(visible[:, None], 0.0, layers.MASK_VALUE).astype(jnp.float32)


def logits(params, config: CausalLMConfig, input_ids, attention_mask, dtype=jnp.float32):
    """Next-token logits [B, L, V] float32 for ids and mask [B, L] (left or right padding)."""
    with precision.matmuls(dtype):
        return CausalLM(config, dtype).apply({"params": params}, input_ids, attention_mask)


def token_logprobs(params, config: CausalLMConfig, input_ids, attention_mask, dtype=jnp.float32):
    """log p(token_t | tokens_<t): [B, L] float32, 0 where nothing precedes the token or it is padding."""
    return layers.token_logprobs_from_logits(logits(params, config, input_ids, attention_mask, dtype), input_ids, attention_mask)


def logprobs_at(params, config: CausalLMConfig, input_ids, attention_mask, target_positions, predict_from=None,
                dtype=jnp.float32, cache=None, top: int = 0):
    """log p(token at position p | tokens before p) for chosen positions p.

    input_ids, attention_mask: [B, L]; target_positions: [B, T] int, where 0 marks an empty
    slot (nothing precedes position 0). Returns [B, T] float32, 0 at empty slots. The LM
    head runs only at the T positions, not over the whole context.
    predict_from [B, T] (default target_positions - 1): the position whose next-token distribution
    scores each target. Several one-token continuations of one context are scored in one row this
    way: ids = context + [a, b, ...], targets at L, L+1, ..., all predicted from L - 1 (causal
    attention keeps the later tokens out of position L - 1).
    cache (optional, `kv_cache.init_cache`/`extend`): the rows continue the cached tokens (a shared prefix read once);
    positions then count within `input_ids` only; position 0 can predict (it follows the cache) but cannot be
    a target (0 marks an empty slot; the cache keeps no logits for its own last token).
    top (static) > 0: also each position's `top` most probable next tokens, packed into one array [B, T, 1 + 2·top]
    float32: [..., 0] the target's log-prob, [..., 1 : 1 + top] the top log-probs (best first), [..., 1 + top :] their
    token ids (exact as float32 below 2^24); `unpack_top` splits it.
    """
    scored = target_positions > 0  # [B, T]
    if predict_from is None:
        predict_from = target_positions - 1
    predict_from = jnp.maximum(predict_from, 0)
    with precision.matmuls(dtype):
        logits_ = CausalLM(config, dtype).apply({"params": params}, input_ids, attention_mask, predict_from, cache)
    if cache is not None:
        logits_ = logits_[0]  # (logits, the extended cache): the cache is not kept
    targets = jnp.take_along_axis(input_ids, target_positions, axis=1)  # [B, T]
    target_lps = jnp.where(scored, layers.gather_logprobs(logits_, targets), 0.0)  # [B, T]
    if not top:
        return target_lps
    logits_ = logits_.astype(jnp.float32)
    best, ids = jax.lax.top_k(logits_, top)  # [B, T, top]
    best_lps = best - jax.nn.logsumexp(logits_, axis=-1, keepdims=True)
    return jnp.concatenate([target_lps[..., None], best_lps, ids.astype(jnp.float32)], axis=-1)  # [B, T, 1 + 2·top]


def unpack_top(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`logprobs_at(..., top=n)`'s packed [..., 1 + 2n] -> (log-probs [...], top log-probs [..., n], top ids [..., n])."""
    n = (packed.shape[-1] - 1) // 2
    return packed[..., 0], packed[..., 1 : 1 + n], packed[..., 1 + n :].astype(np.int64)


def init_params(config: CausalLMConfig, seed: int = 0):
    """Random parameters (for tests and shape checks)."""
    ids = jnp.zeros((1, 8), jnp.int32)
    return CausalLM(config).init(jax.random.PRNGKey(seed), ids, jnp.ones_like(ids))["params"]
