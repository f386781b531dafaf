"""Models by name (`named_models`): a packaged name, a local Hugging Face directory, a .gguf file, a hub id or (an
LM) a server URL in, a ready encoder, LM or tokenizer out. The jobs, the REPLUG object and the server all load
through it; `rj.load_*` (replug_jax.api) are these functions.

Layer: imports `lm`, `retrieval`, `models`, `parallel` and `base`; below `data` and the jobs, which load through it.
"""
from replug_jax.loading.named_models import load_encoder, load_lm, load_tokenizer

__all__ = ["load_encoder", "load_lm", "load_tokenizer"]
