"""The server's own tokenizer, through its `/tokenize` endpoint (vLLM, llama.cpp and our server have one).

`HTTPLM` uses it when no local tokenizer is given, so that token-id prompts (the contract's exact rule,
`context ids + continuation ids`) are the default even then; only a server with neither token-id prompts
nor `/tokenize` falls back to text prompts (said in `stats()["tokenizer"]`). No JAX is imported here.
"""
from __future__ import annotations

import functools
import hashlib

from replug_jax.lm.http_transport import BlackBoxServerError, Refused


class ServerTokenizer:
    """`encode(text) -> ids` by the server (no start token added), cached per text. Only what token-id prompts
    need: no decode; `bos_id` is the start token the server's tokenizer adds when asked to (else None)."""

    bos_id = eos_id = pad_id = None

    def __init__(self, client):
        self.client = client  # an HTTPLM: its transport and (once probed) model name
        self.encode = functools.lru_cache(maxsize=65536)(self._encode)

    @classmethod
    def connect(cls, client) -> "ServerTokenizer | None":
        """The server's tokenizer, or None when it has no usable /tokenize."""
        tok = cls(client)
        try:
            ids = tok.encode("Hello world")
            special = tok._encode("Hello world", special=True)
        except (Refused, BlackBoxServerError):
            return None
        if len(special) == len(ids) + 1 and special[1:] == ids:  # the start token the server's tokenizer adds
            tok.bos_id = special[0]
        return tok if ids else None

    def _encode(self, text: str, special: bool = False) -> list[int]:
        if not text:
            return []
        c = self.client
        body = {"prompt": text, "content": text, "add_special_tokens": special, "add_special": special,  # vLLM, llama.cpp
                **({"model": c.model} if c.model else {})}
        reply = c.transport.post(c.transport.root_url + "/tokenize", body, optional=True)
        ids = reply.get("tokens") if isinstance(reply, dict) else None
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise BlackBoxServerError(f"{c.transport.root_url}/tokenize: expected {{'tokens': [int, ...]}}, got "
                                      f"{str(reply)[:200]}")
        return ids

    def fingerprint(self) -> str:
        """Which server's tokenizer (its ids for a fixed text stand in for the vocabulary)."""
        probe = self.encode("The quick brown fox jumps over the lazy dog. 1234 éàü")
        key = [self.client.transport.root_url, self.client.model, probe]
        return "server-" + hashlib.sha256(repr(key).encode()).hexdigest()[:12]
