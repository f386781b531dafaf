"""Hugging Face checkpoints (safetensors only) into our parameter pytrees.

A state dict is a flat `{hf_name: np.ndarray}`; the converters below rename and transpose
it into the nested dicts that `encoder.BertEncoder` and `causal_lm.CausalLM` expect.
Pickled checkpoints (`pytorch_model.bin`) are refused: we never unpickle.
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Callable

import jax
import numpy as np
from safetensors import safe_open

from replug_jax.base.atomic_files import temporary_path
from replug_jax.models import streamed
from replug_jax.models.causal_lm import STACKED_LAYERS, CausalLMConfig
from replug_jax.models.encoder import BertConfig

StateDict = dict[str, np.ndarray]


class WeightsError(ValueError):
    """A checkpoint that cannot be loaded, with the reason."""


def read_config(model_dir: str) -> dict:
    path = os.path.join(model_dir, "config.json")
    if not os.path.isfile(path):
        raise WeightsError(f"{model_dir}: no config.json (expected a Hugging Face model directory)")
    with open(path) as f:
        return json.load(f)


def safetensors_files(model_dir: str) -> list[str]:
    """The safetensors shards of a model directory, following `model.safetensors.index.json`."""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        missing = [s for s in shards if not os.path.isfile(os.path.join(model_dir, s))]
        if missing:
            raise WeightsError(f"{model_dir}: index names missing shards {missing}")
        return [os.path.join(model_dir, s) for s in shards]
    files = sorted(f for f in os.listdir(model_dir) if f.endswith(".safetensors"))
    if not files:
        pickled = [f for f in os.listdir(model_dir) if f.endswith((".bin", ".pt", ".pth", ".ckpt"))]
        hint = f" (found pickled {pickled}: convert them to safetensors; replug_jax never unpickles)" if pickled else ""
        raise WeightsError(f"{model_dir}: no *.safetensors weights{hint}")
    return [os.path.join(model_dir, f) for f in files]


def read_state_dict(model_dir: str) -> StateDict:
    """All tensors of a (possibly sharded) safetensors checkpoint as float32 numpy arrays."""
    return {name: np.asarray(t) for name, t in streamed.lazy_state_dict(safetensors_files(model_dir)).items()}


def _strip_prefix(state: StateDict, prefixes: tuple[str, ...]) -> StateDict:
    for prefix in prefixes:
        if any(k.startswith(prefix) for k in state):
            return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    return state


def _take(state: StateDict, name: str) -> np.ndarray:
    if name not in state:
        raise WeightsError(f"checkpoint is missing tensor {name!r}")
    return state[name]


def _dense(state, name, transpose=True, bias=True):
    """A torch Linear (weight [out, in]) as a flax Dense (kernel [in, out])."""
    w = _take(state, f"{name}.weight")
    out = {"kernel": w.T if transpose else w}
    if bias:
        out["bias"] = _take(state, f"{name}.bias")
    return out


def _norm(state, name, bias=True):
    out = {"scale": _take(state, f"{name}.weight")}
    if bias:
        out["bias"] = _take(state, f"{name}.bias")
    return out


def bert_params(state: StateDict, config: BertConfig) -> dict:
    """BertModel tensors (with or without a `bert.` prefix) -> BertEncoder params."""
    s = _strip_prefix(state, ("bert.", "model.", "encoder_q."))
    embed = lambda n: {"embedding": _take(s, f"embeddings.{n}.weight")}
    params = {
        "word_embeddings": embed("word_embeddings"),
        "position_embeddings": embed("position_embeddings"),
        "token_type_embeddings": embed("token_type_embeddings"),
        "embeddings_norm": _norm(s, "embeddings.LayerNorm"),
    }
    for i in range(config.num_layers):
        p = f"encoder.layer.{i}"
        params[f"layer_{i}"] = {
            "query": _dense(s, f"{p}.attention.self.query"),
            "key": _dense(s, f"{p}.attention.self.key"),
            "value": _dense(s, f"{p}.attention.self.value"),
            "attention_out": _dense(s, f"{p}.attention.output.dense"),
            "attention_norm": _norm(s, f"{p}.attention.output.LayerNorm"),
            "intermediate": _dense(s, f"{p}.intermediate.dense"),
            "output": _dense(s, f"{p}.output.dense"),
            "output_norm": _norm(s, f"{p}.output.LayerNorm"),
        }
    return params


def gpt2_params(state: StateDict, config: CausalLMConfig) -> dict:
    """GPT2Model / GPT2LMHeadModel tensors -> CausalLM params (GPT-2 Conv1D is already [in, out]); the blocks'
    weights as `streamed.Stacked` [layers, ...] (read with `streamed.materialize` or placed with `streamed.place`)."""
    s = _strip_prefix(state, ("transformer.",))
    params = {
        "embed_tokens": {"embedding": _take(s, "wte.weight")},
        "embed_positions": {"embedding": _take(s, "wpe.weight")},
        "final_norm": _norm(s, "ln_f"),
    }
    layers = []
    for i in range(config.num_layers):
        p = f"h.{i}"
        layers.append({
            "ln_1": _norm(s, f"{p}.ln_1"),
            "c_attn": _dense(s, f"{p}.attn.c_attn", transpose=False),
            "c_proj": _dense(s, f"{p}.attn.c_proj", transpose=False),
            "ln_2": _norm(s, f"{p}.ln_2"),
            "c_fc": _dense(s, f"{p}.mlp.c_fc", transpose=False),
            "mlp_proj": _dense(s, f"{p}.mlp.c_proj", transpose=False),
        })
    params[STACKED_LAYERS] = streamed.stack_layers(layers)
    return params


def llama_params(state: StateDict, config: CausalLMConfig) -> dict:
    """LlamaForCausalLM / Qwen2ForCausalLM / MistralForCausalLM tensors -> CausalLM params (Qwen2: q/k/v biases
    too); the blocks' weights as `streamed.Stacked` [layers, ...], as in gpt2_params."""
    s = {k.removeprefix("model."): v for k, v in state.items()}
    params = {"embed_tokens": {"embedding": _take(s, "embed_tokens.weight")}, "final_norm": _norm(s, "norm", bias=False)}
    if not config.tie_embeddings:
        params["lm_head"] = _dense(s, "lm_head", bias=False)
    layers = []
    for i in range(config.num_layers):
        p = f"layers.{i}"
        linear = lambda n, bias=False: _dense(s, f"{p}.{n}", bias=bias)
        layers.append({
            "input_norm": _norm(s, f"{p}.input_layernorm", bias=False),
            "q_proj": linear("self_attn.q_proj", config.qkv_bias),
            "k_proj": linear("self_attn.k_proj", config.qkv_bias),
            "v_proj": linear("self_attn.v_proj", config.qkv_bias),
            "o_proj": linear("self_attn.o_proj"),
            "post_attention_norm": _norm(s, f"{p}.post_attention_layernorm", bias=False),
            "gate_proj": linear("mlp.gate_proj"),
            "up_proj": linear("mlp.up_proj"),
            "down_proj": linear("mlp.down_proj"),
        })
    params[STACKED_LAYERS] = streamed.stack_layers(layers)
    return params


CAUSAL_CONVERTERS: dict[str, Callable[[StateDict, CausalLMConfig], dict]] = {
    "gpt2": gpt2_params, "llama": llama_params, "qwen2": llama_params}


def load_bert_dir(model_dir: str) -> tuple[BertConfig, dict]:
    """(config, params) of a BERT-family Hugging Face directory."""
    config = BertConfig.from_hf(read_config(model_dir))
    return config, bert_params(read_state_dict(model_dir), config)


def load_causal_lm_dir(model_dir: str) -> tuple[CausalLMConfig, dict]:
    """(config, params as float32 numpy) of a GPT-2, Llama-family (Mistral) or Qwen2 Hugging Face directory."""
    config, lazy = lazy_causal_lm_dir(model_dir)
    return config, streamed.materialize(lazy)


def lazy_causal_lm_dir(model_dir: str, reads: list | None = None) -> tuple[CausalLMConfig, dict]:
    """(config, params as `streamed.LazyTensor`s, nothing read yet): for `streamed.place`, which reads each device's
    slices only. `reads` (a list) records every slice read."""
    config = CausalLMConfig.from_hf(read_config(model_dir))
    state = streamed.lazy_state_dict(safetensors_files(model_dir), reads)
    return config, CAUSAL_CONVERTERS[config.arch](state, config)


FINGERPRINT_SAMPLES = 256  # about this many values of each leaf go into a fingerprint


def weights_fingerprint(params, settings) -> str:
    """A short hash of a parameter tree (a strided sample of every leaf) and JSON-able `settings`.

    The samples are gathered where the leaves live (device arrays, sharded or not) and only they come to the
    host: a large or model-sharded LM is never copied whole."""
    h = hashlib.sha256(json.dumps(settings, default=str).encode())
    leaves = jax.tree_util.tree_leaves(params)
    for leaf, sample in zip(leaves, jax.device_get([_strided_sample(x) for x in leaves])):
        h.update(f"{np.dtype(leaf.dtype)}{tuple(leaf.shape)}".encode())
        h.update(np.asarray(sample).tobytes())
    return h.hexdigest()[:16]


def _strided_sample(leaf):
    """Every (size // 256)-th element of the flattened leaf, in order: [n]; for a jax.Array a small array on its
    devices, for anything else numpy."""
    size = int(np.prod(leaf.shape))
    flat = np.arange(0, size, max(1, size // FINGERPRINT_SAMPLES))
    if not isinstance(leaf, jax.Array):
        return np.asarray(leaf).reshape(-1)[flat]
    sample = leaf[np.unravel_index(flat, leaf.shape)]  # a gather on the leaf's devices
    if not sample.is_fully_addressable:  # split over processes: replicate the small sample, take this one's copy
        replicated = jax.sharding.NamedSharding(leaf.sharding.mesh, jax.sharding.PartitionSpec())
        sample = jax.jit(lambda x: x, out_shardings=replicated)(sample).addressable_data(0)
    return sample


def save_params(params, path: str, meta: dict | None = None) -> None:
    """A parameter pytree as one safetensors file (keys are the tree paths), atomically; `meta` as strings."""
    from safetensors.numpy import save_file

    flat = {jax.tree_util.keystr(p): np.ascontiguousarray(np.asarray(x))
            for p, x in jax.tree_util.tree_flatten_with_path(params)[0]}
    tmp = temporary_path(path, "save")
    save_file(flat, tmp, metadata={k: json.dumps(v) for k, v in (meta or {}).items()})
    os.replace(tmp, path)


def load_params(path: str, like) -> tuple[dict, dict]:
    """(params shaped as the pytree `like`, meta) from `save_params`; a missing or mismatched leaf is an error."""
    with safe_open(path, framework="numpy") as f:
        keys, meta = set(f.keys()), {k: json.loads(v) for k, v in (f.metadata() or {}).items()}
        leaves = []
        for p, x in jax.tree_util.tree_flatten_with_path(like)[0]:
            key = jax.tree_util.keystr(p)
            if key not in keys:
                raise WeightsError(f"{path}: no tensor {key} (saved for another model?)")
            value = f.get_tensor(key)
            if value.shape != np.shape(x):
                raise WeightsError(f"{path}: {key} has shape {value.shape}, expected {np.shape(x)}")
            leaves.append(value)
    return jax.tree.unflatten(jax.tree.structure(like), leaves), meta
