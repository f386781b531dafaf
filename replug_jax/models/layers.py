"""Building blocks shared by the encoder and the causal LMs.

Everything here is a pure function or a small linen module; softmax, norms and
log-probabilities are computed in float32 whatever the compute dtype, so bf16 on an
accelerator changes matmul precision only.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

# A large finite negative number for masked attention logits: a fully masked row (a left
# pad position) then gives a finite, ignorable output instead of NaN.
MASK_VALUE = -1e30

ACTIVATIONS = {
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),  # BERT ("gelu" is the erf form)
    "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),  # GPT-2 (tanh form)
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
}


def dense(features: int, dtype, name: str, use_bias: bool = True) -> nn.Dense:
    """A linear layer computing in `dtype` with float32 weights as loaded (`precision.weight_dtype` casts them).

    On CPU with a compute dtype below float32 its matmul accumulates into float32 and rounds the result to
    `dtype` once (`dot_rounded_once`): XLA's CPU programs hand a bf16 x bf16 -> float32 dot to YNNPACK, which uses
    AMX-BF16 where the CPU has it (~4x its float32 GEMM), and leave a bf16 -> bf16 dot to a kernel slower than
    float32 (benchmarks/README.md "bf16 on CPU"). Accelerators accumulate bf16 matmuls in float32 anyway and keep
    flax's dot; float32 compute is unchanged everywhere."""
    return nn.Dense(features, use_bias=use_bias, dtype=dtype, param_dtype=jnp.float32, name=name,
                    dot_general=dot_rounded_once if low_precision_on_cpu(dtype) else None)


def low_precision_on_cpu(dtype) -> bool:
    """Whether matmuls in `dtype` should accumulate into float32 explicitly (`dense`): below float32, on CPU."""
    return jnp.dtype(dtype) != jnp.float32 and jax.default_backend() == "cpu"


def dot_rounded_once(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, **options):
    """`lax.dot_general` accumulated and returned in float32, then rounded to the operands' dtype."""
    out = jax.lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                              preferred_element_type=jnp.float32, **options)
    return out.astype(preferred_element_type or lhs.dtype)


def activation(name: str):
    """The activation function a Hugging Face config names, or a clear error."""
    if name not in ACTIVATIONS:
        raise ValueError(f"unsupported activation {name!r}; known: {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]


def dot_product_attention(q, k, v, bias):
    """Multi-head attention with grouped K/V heads (jax.nn's XLA kernel: GQA without copying K/V).

    q: [B, L, H, Dh]; k, v: [B, S, Hkv, Dh] with H a multiple of Hkv;
    bias: [B, 1, L, S] additive (0 or MASK_VALUE). Returns [B, L, H, Dh].
    """
    if low_precision_on_cpu(q.dtype):  # jax.nn's probs x V product is a bf16 -> bf16 dot: `dense` says why not
        qh, kh, vh = to_head_major(q, k, v)
        return from_head_major(head_major_attention(qh, kh, vh, bias), q.shape)
    return jax.nn.dot_product_attention(q, k, v, bias=bias.astype(q.dtype))


def prefixed_attention(q, k, v, bias, prefix_k, prefix_v, prefix_bias):
    """Attention over a shared prefix's keys and values, read once for every row, and each row's own, in one softmax
    (cascade attention: the prefix is never copied to the rows, kv_cache.after_prefix). Logits and softmax in float32,
    probabilities times V in V's dtype, as `head_major_attention`.
    q [B, L, H, Dh]; k, v [B, S, Hkv, Dh]; bias [B, 1, L, S]; prefix_k, prefix_v [P, Hkv, Dh]; prefix_bias
    [B, 1, L, P] (additive: 0 or MASK_VALUE). Returns [B, L, H, Dh]."""
    (b, length, heads, dh), kv_heads = q.shape, k.shape[2]
    grouped = q.reshape(b, length, kv_heads, heads // kv_heads, dh)  # query heads beside their K/V head
    scale = dh ** -0.5
    own = jnp.einsum("blkgd,bskd->bkgls", grouped, k, preferred_element_type=jnp.float32) * scale
    own = own + bias[:, :, None].astype(jnp.float32)  # [B, Hkv, G, L, S]
    shared = jnp.einsum("blkgd,pkd->bkglp", grouped, prefix_k, preferred_element_type=jnp.float32) * scale
    shared = shared + prefix_bias[:, :, None].astype(jnp.float32)  # [B, Hkv, G, L, P]
    top = jnp.maximum(own.max(-1), shared.max(-1))[..., None]
    own, shared = jnp.exp(own - top), jnp.exp(shared - top)
    total = own.sum(-1, keepdims=True) + shared.sum(-1, keepdims=True)
    out = (jnp.einsum("bkgls,bskd->blkgd", (own / total).astype(v.dtype), v, preferred_element_type=jnp.float32)
           + jnp.einsum("bkglp,pkd->blkgd", (shared / total).astype(v.dtype), prefix_v,
                        preferred_element_type=jnp.float32))
    return out.astype(v.dtype).reshape(q.shape)


# Query rows per block of `causal_attention`: 128 measured fastest for SmolLM2 on 512-token passes
# (benchmarks/README.md "CPU speed"); 64 and 256 were slower.
CAUSAL_BLOCK = 128


def causal_attention(q, k, v, bias, block: int | None = None):
    """`dot_product_attention` for a causal bias over the same L tokens (no cache), skipping the keys
    after each block of queries: they are masked for every query of the block, so the result is the
    same while about half the scores are never computed (10/16 of them at L = 4 blocks).

    Computed head-major: q, k and v are transposed once and the output once back, and the blocks slice
    the head-major arrays (blocks of [B, L, H, Dh] made XLA transpose K and V again for every block:
    7% of SmolLM2's scoring on CPU, benchmarks/README.md "CPU scoring").
    q: [B, L, H, Dh]; k, v: [B, L, Hkv, Dh]; bias: [B, 1, L, L] causal (`causal_bias`). Returns [B, L, H, Dh].
    """
    length, block = q.shape[1], block or CAUSAL_BLOCK
    qh, kh, vh = to_head_major(q, k, v)
    outs = [head_major_attention(qh[:, :, :, start : start + block], kh[:, :, : start + block],
                                 vh[:, :, : start + block], bias[:, :, start : start + block, : start + block])
            for start in range(0, length, block)]  # block i: queries [s, s + block), keys [0, s + block)
    return from_head_major(outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=3), q.shape)


def to_head_major(q, k, v):
    """q [B, L, H, Dh], k and v [B, S, Hkv, Dh] -> q [B, Hkv, G, L, Dh] (grouped query heads beside their K/V head),
    k and v [B, Hkv, S, Dh]."""
    (b, length, heads, dh), kv_heads = q.shape, k.shape[2]
    qh = q.reshape(b, length, kv_heads, heads // kv_heads, dh).transpose(0, 2, 3, 1, 4)
    return qh, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)


def from_head_major(out, shape):
    """[B, Hkv, G, L, Dh] -> `shape` [B, L, H, Dh]."""
    return out.transpose(0, 3, 1, 2, 4).reshape(shape)


def head_major_attention(q, k, v, bias):
    """jax.nn.dot_product_attention's XLA computation (float32 logits, scaled by 1/sqrt(Dh), the additive
    bias, softmax in float32) over head-major arrays, grouped query heads beside their K/V head:
    q [B, Hkv, G, Lq, Dh]; k, v [B, Hkv, S, Dh]; bias [B, 1, Lq, S] -> [B, Hkv, G, Lq, Dh]."""
    logits = jnp.einsum("bkgqd,bksd->bkgqs", q, k, preferred_element_type=jnp.float32)
    logits = logits * (q.shape[-1] ** -0.5) + bias[:, :, None].astype(jnp.float32)
    probs = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
    accumulate = jnp.float32 if low_precision_on_cpu(v.dtype) else None  # `dense` says why
    return jnp.einsum("bkgqs,bksd->bkgqd", probs, v, preferred_element_type=accumulate).astype(v.dtype)


def padding_bias(attention_mask):
    """Bidirectional bias from a key mask: [B, S] -> [B, 1, 1, S]."""
    return jnp.where(attention_mask[:, None, None, :] > 0, 0.0, MASK_VALUE).astype(jnp.float32)


def causal_bias(attention_mask, window: int | None = None):
    """Causal bias that also hides padded keys: [B, L] -> [B, 1, L, L]. With `window` (Mistral's sliding
    window), a query also sees only the keys fewer than `window` real tokens before it (itself included)."""
    length = attention_mask.shape[1]
    causal = jnp.tril(jnp.ones((length, length), dtype=bool))
    visible = causal[None, :, :] & (attention_mask[:, None, :] > 0)
    if window is not None:
        positions = positions_from_mask(attention_mask)
        visible &= within_window(positions, positions, window)
    return jnp.where(visible[:, None], 0.0, MASK_VALUE).astype(jnp.float32)


def within_window(query_positions, key_positions, window: int):
    """[B, L] and [B, S] positions (real tokens counted) -> [B, L, S]: the key is fewer than `window` tokens
    before the query (transformers' sliding-window rule, kv > q - window, over real-token positions)."""
    return key_positions[:, None, :] > query_positions[:, :, None] - window


def positions_from_mask(attention_mask):
    """Position of each token counted over real tokens only, so left padding is harmless: [B, L]."""
    return jnp.maximum(jnp.cumsum(attention_mask, axis=-1) - 1, 0).astype(jnp.int32)


class RMSNorm(nn.Module):
    """Llama RMSNorm, computed in float32 as the reference does."""

    eps: float
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x):
        scale = self.param("scale", nn.initializers.ones, (x.shape[-1],), jnp.float32)
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (normed * scale).astype(self.dtype)


def layer_norm(eps: float, dtype, name: str):
    """LayerNorm with float32 statistics."""
    return nn.LayerNorm(epsilon=eps, dtype=dtype, param_dtype=jnp.float32, name=name)


def gather_logprobs(logits, targets):
    """log softmax(logits)[target] in float32: logits [..., V], targets [...] -> [...]."""
    logits = logits.astype(jnp.float32)
    target_logits = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return target_logits - jax.nn.logsumexp(logits, axis=-1)


def token_logprobs_from_logits(logits, input_ids, attention_mask):
    """log p(token_t | tokens_<t) for every position.

    logits: [B, L, V] (position t predicts token t+1); input_ids, attention_mask: [B, L].
    Returns [B, L] float32 with 0 at position 0, at padding, and at the first real token
    of a left-padded row (nothing before it to condition on).
    """
    lps = gather_logprobs(logits[:, :-1], input_ids[:, 1:])  # [B, L-1]
    valid = (attention_mask[:, 1:] > 0) & (attention_mask[:, :-1] > 0)
    lps = jnp.where(valid, lps, 0.0)
    return jnp.concatenate([jnp.zeros_like(lps[:, :1]), lps], axis=1)
