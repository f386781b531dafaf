"""The server's window as `HTTPLM` fills it: how many tokens a scoring prompt or a generation pass may hold, and
the context room each keeps (the contract's optional `scoring_room` and `generation_room`, lm/blackbox.py).

With token-id prompts the rooms are exact: the client cuts every prompt by the contract's rule. With text prompts
the server cuts or refuses by its own rule, so no room is known (None).
"""
from __future__ import annotations

from replug_jax.lm import blackbox
from replug_jax.models.tokenizer import token_starts


def score_window(client) -> int | None:
    """Tokens a scoring prompt may hold: the window less the entries that are not the prompt's own (the start token
    the server echoes before it, the tokens a request must generate); None where the window is not known."""
    return client.max_length - client.leading - client.score_max_tokens if client.max_length else None


def generation_window(client) -> int | None:
    """The window less the entries the server echoes before a token-id prompt (None: not known)."""
    return client.max_length - client.leading if client.max_length else None


def scoring_room(client, continuation: str) -> int | None:
    """Context tokens a scored pair keeps before `continuation` with token-id prompts; None with text prompts."""
    if not client.token_prompts:
        return None
    return blackbox.scoring_room(client.tokenizer, continuation, score_window(client))


def generation_room(client, prefix: str, max_new: int) -> int | None:
    """Context tokens a generation pass keeps after `prefix` with token-id prompts; None with text prompts."""
    if not client.token_prompts:
        return None
    return blackbox.generation_room(client.tokenizer, prefix, generation_window(client), max_new)


def cut_text_context(tokenizer, context: str, continuation: str, window: int) -> str:
    """A text prompt's context cut by the local tokenizer's tokens so that it and `continuation` fit `window`,
    one token spare for the split (the server may join the two differently)."""
    cont_tokens = len(tokenizer.encode(continuation))
    if cont_tokens + 1 >= window:
        raise ValueError(f"continuation of {cont_tokens} tokens does not fit the server's {window}-token window")
    starts = token_starts(tokenizer, context) if context else [0]
    return context[starts[max(0, len(starts) - 1 - (window - cont_tokens - 1))]:]
