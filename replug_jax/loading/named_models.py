"""Models by name: a packaged name, a local Hugging Face directory, a .gguf file, a hub id or (an LM) a server URL
in, a ready encoder, LM or tokenizer out (the loading layer's one module; replug_jax/loading/__init__.py says where
it sits).

    enc = load_encoder("minilm")    # packaged default, a local HF dir, or a hub id
    lm = load_lm("smollm2")         # packaged default, a local HF dir, a .gguf path, or a hub id
"""
from __future__ import annotations

import json
import os

from replug_jax.lm.http.client import HTTPLM
from replug_jax.lm.local import LocalLM
from replug_jax.models import gguf_loader, partition, precision, registry, streamed, tokenizer, weights
from replug_jax.parallel import sharding
from replug_jax.retrieval.dense import DenseEncoder


def _sentence_transformers_max_length(model_dir: str) -> int | None:
    path = os.path.join(model_dir, "sentence_bert_config.json")
    if os.path.isfile(path):
        with open(path) as f:
            return json.load(f).get("max_seq_length")
    return None


def load_encoder(name: str = "minilm", *, normalize: bool = True, max_length: int | None = None,
                 batch_size: int = 32, dtype=None, param_dtype=None, revision: str | None = None,
                 mesh=None) -> DenseEncoder:
    """A BERT-family dense encoder with mean pooling (cosine similarity when `normalize`). dtype / param_dtype:
    compute and weight dtypes (None: bf16 on accelerators, fp32 on CPU; weights as the compute dtype)."""
    source = registry.resolve(name, revision)
    if source.kind != "hf_dir":
        raise ValueError(f"{name}: an encoder must be a Hugging Face BERT directory, got a {source.kind} file")
    config, params = weights.load_bert_dir(source.path)
    max_length = max_length or _sentence_transformers_max_length(source.path) or config.max_position
    return DenseEncoder(config, params, tokenizer.from_hf_dir(source.path), name=name, max_length=max_length,
                        normalize=normalize, batch_size=batch_size, dtype=dtype, param_dtype=param_dtype, mesh=mesh)


def load_lm(name: str = "smollm2", *, max_length: int | None = None, batch_size: int = 4, dtype=None,
            param_dtype=None, revision: str | None = None, mesh=None, model_parallel: int = 1,
            generation_questions: int | None = None, **http_options):
    """A causal LM behind the black-box `score(contexts, continuations)` contract.

    An http(s) URL gives an `HTTPLM` for that OpenAI-compatible server; `http_options` (e.g.
    tokenizer="smollm2", a name or a TextTokenizer, concurrency=8) go to it, with `max_length` (the
    server's window, when /models does not say it); a precision or a mesh is refused there (the server computes
    in its own: `python -m replug_jax.serve --dtype`), batch_size ignored. A local model's weights are split over
    `model_parallel` devices (the "model" axis of `sharding.lm_mesh`; models/partition.py says how), batches over
    the rest; dtype / param_dtype as for `load_encoder`; `generation_questions`: LocalLM's (the questions one
    generate call decodes together)."""
    if name.startswith(("http://", "https://")):
        local = {"dtype": precision.weights_option(dtype) is not None,  # None / "auto": the server's own
                 "param_dtype": precision.weights_option(param_dtype) is not None,
                 "mesh": mesh is not None, "model_parallel": model_parallel != 1,
                 "generation_questions": generation_questions is not None}
        if any(local.values()):
            raise TypeError(f"{sorted(k for k, given in local.items() if given)}: options for a local model, but "
                            f"{name!r} is a server, which computes in the precision and on the devices it was "
                            "started with (python -m replug_jax.serve --dtype)")
        if isinstance(http_options.get("tokenizer"), str):  # a model name: the tokenizer alone is loaded
            http_options["tokenizer"] = load_tokenizer(http_options["tokenizer"], revision)
        return HTTPLM(name, max_length=max_length, **http_options)
    if http_options:
        raise TypeError(f"{sorted(http_options)}: options for an http(s) LM, but {name!r} is a local model")
    source = registry.resolve(name, revision)
    mesh = mesh or sharding.lm_mesh(model_parallel)
    if source.kind == "gguf":  # dequantised on the host, then placed slice by slice
        config, lazy, tok = gguf_loader.load_gguf(source.path, materialize=False)
    else:  # streamed: each device's slices read from the safetensors files
        config, lazy = weights.lazy_causal_lm_dir(source.path)
        tok = tokenizer.from_hf_dir(source.path)
    params = streamed.place(lazy, partition.param_shardings(lazy, mesh, config), precision.weight_dtype(dtype, param_dtype))
    more = {} if generation_questions is None else {"generation_questions": generation_questions}
    return LocalLM(config, params, tok, name=name, max_length=max_length, batch_size=batch_size, dtype=dtype,
                   param_dtype=param_dtype, mesh=mesh, **more)  # the mesh above: model_parallel is in it


def load_tokenizer(name: str, revision: str | None = None) -> tokenizer.TextTokenizer:
    """Only the tokenizer of a model (as load_lm takes names): for cutting passages when the LM is remote."""
    source = registry.resolve(name, revision)
    if source.kind == "gguf":
        return tokenizer.from_gguf_metadata(gguf_loader.metadata(gguf_loader.read_gguf(source.path)))
    return tokenizer.from_hf_dir(source.path)
