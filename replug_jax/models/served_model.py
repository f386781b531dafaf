"""What the scoring server needs of a local LM, declared: `ServedModel`.

The server (server/) batches requests into a model held in this process and decodes on it itself, so it reads more
than the black-box contract (lm/blackbox.py): the Flax parameters and config for its own jitted programs, the
padding and length rules its batches follow, and the two scoring entry points it batches into. `lm.local.LocalLM`
is one; the server checks any model it is given against this protocol before it starts, so a missing part is named
at once rather than met mid-request. Both `lm` and `server` import it; neither imports the other.
"""
from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable

import numpy as np

from replug_jax.models.tokenizer import TextTokenizer


@runtime_checkable
class ServedModel(Protocol):
    """A local causal LM the scoring server can serve (attributes as `LocalLM` has them)."""

    name: str
    tokenizer: TextTokenizer
    config: Any  # models.causal_lm.CausalLMConfig: vocabulary size and the architecture the server's programs run
    dtype: Any  # the compute dtype of those programs
    max_length: int  # tokens a row may hold
    length_multiple: int  # rows are padded to a multiple of this (shape buckets)
    pad_id: int
    start_id: int | None  # the document-start token (None: the tokenizer has none)

    @property
    def params(self) -> Any:
        """The Flax parameters (placed on the model's devices)."""

    def score_prompts(self, prompts: list[list[int]], lead: int = 1) -> list[np.ndarray]:
        """Each prompt's token log-probs from position `lead` on: [len(prompt) - lead] float32 per prompt."""

    def score_token_pairs(self, pairs: Sequence[tuple[list[int], list[int]]],
                          progress: bool = False) -> list[np.ndarray]:
        """Each (context ids, continuation ids) pair's continuation log-probs [T] float32."""


def check_served(lm) -> None:
    """Refuse a model the server cannot serve, naming what it lacks."""
    members = [*ServedModel.__annotations__, "params", "score_prompts", "score_token_pairs"]
    missing = [name for name in members if not hasattr(lm, name)]
    if missing:
        raise TypeError(f"{type(lm).__name__} cannot be served: it lacks {', '.join(missing)} (models/served_model.py "
                        "declares what the server reads; lm.local.LocalLM has it all)")
