"""replug_jax: REPLUG (Shi et al., 2023) in JAX/Flax: retrieval-augmented black-box language models.

Public API for notebooks:
    import replug_jax as rj
    rag = rj.REPLUG.from_documents(["a document", ...], lm="smollm2", k=4)  # retriever + black-box LM
    rag.score("a context", " more"); rag.generate("a prompt"); rag.answer("a question?")
    rag.kept_passages("a context")  # each mixed passage: id, title, text, score, log p(x | d), weight λ
    demos = rj.read_questions("demos.jsonl"); rag.answer("a question?", demos=demos)  # the jobs' file formats
    enc = rj.load_encoder("minilm"); E = enc.embed(["a text"])          # [N, D] float32
    lm = rj.load_lm("smollm2"); lps = lm.score(["a context"], [" more"])  # list of [T_i] log-probs

Names are imported on first use, so `import replug_jax.lm.http` (the HTTP client) does not
import JAX.
"""
import importlib

from replug_jax.base import platforms

platforms.settle()  # before any module here imports JAX: no TPU runtime started on a machine without TPUs
# before any bar: a notebook without ipywidgets gets text bars, unwarned
from replug_jax.base import progress  # noqa: E402,F401
from replug_jax.base.version import VERSION as __version__  # noqa: E402,F401

_EXPORTS = {
    "load_encoder": "replug_jax.loading",
    "load_lm": "replug_jax.loading",
    "load_tokenizer": "replug_jax.loading",
    "read_documents": "replug_jax.api",
    "read_questions": "replug_jax.api",
    "REPLUG": "replug_jax.replug",
    "KeptPassage": "replug_jax.replug",
    "BlackBoxLM": "replug_jax.lm.blackbox",
    "LocalLM": "replug_jax.lm.local",
    "HTTPLM": "replug_jax.lm.http.client",
    "DenseEncoder": "replug_jax.retrieval.dense",
    "Datastore": "replug_jax.retrieval.datastore",
    "DenseIndex": "replug_jax.retrieval.index",
    "ModelNotFound": "replug_jax.models.registry",
    "WeightsError": "replug_jax.models.weights",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'replug_jax' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
