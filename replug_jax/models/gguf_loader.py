"""Llama-family and Qwen2 GGUF files (llama.cpp's format) into a CausalLMConfig, params and tokenizer.

Quantised tensors are dequantised to float32 with the `gguf` package. llama.cpp's converter permutes
the Q and K rows of its `llama` architecture for interleaved RoPE; we un-permute them to the Hugging
Face rotate-half layout that `causal_lm.rotary` uses. Its `qwen2` architecture runs NeoX-style
(rotate-half) RoPE and is stored unpermuted: checked against transformers' GGUF loading and llama.cpp
on the real Qwen2.5 files (tests/test_readers.py).
"""
from __future__ import annotations

import os

import numpy as np

from replug_jax.models import streamed
from replug_jax.models.causal_lm import CausalLMConfig
from replug_jax.models.tokenizer import TextTokenizer, from_gguf_metadata
from replug_jax.models.weights import WeightsError, llama_params


def read_gguf(path: str):
    """A `gguf.GGUFReader`, or a clear error for a missing, truncated or foreign file."""
    import gguf

    if not os.path.isfile(path):
        raise WeightsError(f"{path}: no such GGUF file")
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise WeightsError(f"{path}: not a GGUF file (bad magic bytes)")
    try:
        reader = gguf.GGUFReader(path)
    except Exception as e:  # the reader raises assorted errors on short files
        raise WeightsError(f"{path}: corrupt or truncated GGUF file ({type(e).__name__}: {e})") from e
    return reader


def metadata(reader) -> dict:
    """GGUF key/value metadata as plain Python values."""
    out = {}
    for key, field in reader.fields.items():
        try:
            out[key] = field.contents()
        except Exception:  # fields of exotic types we never read
            continue
    return out


GGUF_ARCHITECTURES = ("llama", "qwen2")
PERMUTED_ROPE_ARCHITECTURES = ("llama",)  # llama.cpp's converter permutes Q/K rows for these only


def config_from_metadata(meta: dict, tensor_shapes: dict[str, tuple[int, ...]]) -> CausalLMConfig:
    """The model config from GGUF metadata; `tensor_shapes` {name: HF-order shape} for what metadata may omit."""
    arch = meta.get("general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise WeightsError(f"GGUF architecture {arch!r} is not supported (supported: {', '.join(GGUF_ARCHITECTURES)})")
    g = lambda k, default=None: meta.get(f"{arch}.{k}", default)
    hidden = int(g("embedding_length"))
    heads = int(g("attention.head_count"))
    return CausalLMConfig(
        arch=arch,
        vocab_size=int(tensor_shapes["token_embd.weight"][0]),  # rows of the embedding (may exceed the tokens)
        hidden_size=hidden,
        num_layers=int(g("block_count")),
        num_heads=heads,
        num_kv_heads=int(g("attention.head_count_kv", heads)),
        intermediate_size=int(g("feed_forward_length")),
        max_position=int(g("context_length", 2048)),
        norm_eps=float(g("attention.layer_norm_rms_epsilon", 1e-5)),
        hidden_act="silu",
        tie_embeddings="output.weight" not in tensor_shapes,
        rope_theta=float(g("rope.freq_base", 10000.0)),
        head_dim=int(g("attention.key_length", hidden // heads)),
        qkv_bias="blk.0.attn_q.bias" in tensor_shapes,
        sliding_window=int(g("attention.sliding_window")) if g("attention.sliding_window") else None,  # Mistral
    )


def config_of_file(path: str) -> CausalLMConfig:
    """The model config of a GGUF file, from its metadata and tensor shapes alone (no tensor is read)."""
    reader = read_gguf(path)
    return config_from_metadata(metadata(reader), {t.name: _hf_shape(t) for t in reader.tensors})


def unpermute_rope_rows(w: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation: w [out, in] -> Hugging Face row order."""
    return w.reshape(num_heads, w.shape[0] // num_heads // 2, 2, -1).swapaxes(1, 2).reshape(w.shape)


_GGUF_TO_HF = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}


def _hf_shape(t) -> tuple[int, ...]:
    return tuple(reversed([int(d) for d in t.shape]))  # GGUF lists dimensions innermost first


def hf_state_dict(reader, config: CausalLMConfig) -> dict[str, np.ndarray]:
    """Dequantised tensors under Hugging Face Llama / Qwen2 names (torch layout: Linear weight [out, in])."""
    import gguf

    permuted = config.arch in PERMUTED_ROPE_ARCHITECTURES
    state = {}
    for t in reader.tensors:
        w = np.ascontiguousarray(gguf.quants.dequantize(t.data, t.tensor_type).reshape(_hf_shape(t)), dtype=np.float32)
        name = t.name
        if name.startswith("blk."):
            _, layer, kind, suffix = name.split(".", 3)  # blk.3.attn_q.weight
            if kind not in _GGUF_TO_HF:
                continue  # e.g. rope_freqs: not used by plain RoPE
            if permuted and kind in ("attn_q", "attn_k"):
                w = unpermute_rope_rows(w, config.num_heads if kind == "attn_q" else config.num_kv_heads)
            name = f"model.layers.{layer}.{_GGUF_TO_HF[kind]}.{suffix}"
        else:
            name = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                    "output.weight": "lm_head.weight"}.get(name, name)
        state[name] = w
    return state


def load_gguf(path: str, materialize: bool = True) -> tuple[CausalLMConfig, dict, TextTokenizer]:
    """(config, params, tokenizer) of a Llama-family (Mistral) or Qwen2 GGUF file; params as float32 numpy, or
    with `materialize=False` the blocks' weights left as `streamed.Stacked` (for `streamed.place`)."""
    reader = read_gguf(path)
    meta = metadata(reader)
    config = config_from_metadata(meta, {t.name: _hf_shape(t) for t in reader.tensors})
    try:
        state = hf_state_dict(reader, config)
    except (ValueError, IndexError) as e:
        raise WeightsError(f"{path}: corrupt or truncated GGUF tensor data ({e})") from e
    params = llama_params(state, config)
    return config, streamed.materialize(params) if materialize else params, from_gguf_metadata(meta)
