"""The server's own tokenizer, through its `/tokenize` endpoint (vLLM, llama.cpp and our server have one).

`HTTPLM` uses it when no local tokenizer is given, so that token-id prompts (the contract's exact rule,
`context ids + continuation ids`) are the default even then; only a server with neither token-id prompts
nor `/tokenize` falls back to text prompts (said in `stats()["tokenizer"]`). No JAX is imported here.

Where the server also says each token's text (llama.cpp's and our server's `/tokenize` with `"with_pieces": true`:
`{"tokens": [{"id": 9, "piece": " the"}, ...]}`, a piece being a string or its UTF-8 bytes), the tokenizer has
character offsets too (`ServerTokenizerWithOffsets`), so windows, passages and the posterior's query tokens are cut
at the server's exact token starts, as with a local tokenizer. Without pieces they are estimated
(`models.tokenizer.piece_token_starts`), and `offsets_note` says so for the run's warnings.
"""
from __future__ import annotations

import functools
import hashlib

from replug_jax.lm.http.transport import BlackBoxServerError, Refused
from replug_jax.models.tokenizer import piece_token_starts


class ServerTokenizer:
    """`encode(text) -> ids` by the server (no start token added), cached per text; `decode(ids) -> text` by its
    `/detokenize` (vLLM's, llama.cpp's and ours), cached per id tuple, for generated tokens named by id. `bos_id` is
    the start token the server's tokenizer adds when asked to (else None)."""

    bos_id = eos_id = pad_id = None

    def __init__(self, client):
        self.client = client  # an HTTPLM: its transport and (once probed) model name
        self.encode = functools.lru_cache(maxsize=65536)(self._encode)
        self._decode = functools.lru_cache(maxsize=65536)(self._detokenize)

    def decode(self, ids) -> str:
        return self._decode(tuple(int(i) for i in ids))

    def _detokenize(self, ids: tuple[int, ...]) -> str:
        if not ids:
            return ""
        c = self.client
        reply = c.transport.post(c.transport.root_url + "/detokenize",
                                 {"tokens": list(ids), **({"model": c.model} if c.model else {})}, optional=True)
        text = reply.get("prompt", reply.get("content")) if isinstance(reply, dict) else None  # vLLM, llama.cpp
        if not isinstance(text, str):
            raise BlackBoxServerError(f"{c.transport.root_url}/detokenize: expected {{'prompt': str}}, got "
                                      f"{str(reply)[:200]}")
        return text

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
        if not ids:
            return None
        with_offsets = ServerTokenizerWithOffsets(client)
        with_offsets.bos_id = tok.bos_id
        try:
            if with_offsets.encode_with_offsets("Hello world")[0] == ids:
                return with_offsets
        except (Refused, BlackBoxServerError, ValueError):
            pass
        return tok

    def _encode(self, text: str, special: bool = False) -> list[int]:
        if not text:
            return []
        reply = self._post({"prompt": text, "content": text, "add_special_tokens": special,
                            "add_special": special})  # vLLM, llama.cpp
        ids = reply.get("tokens") if isinstance(reply, dict) else None
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise BlackBoxServerError(f"{self.client.transport.root_url}/tokenize: expected {{'tokens': [int, ...]}}, "
                                      f"got {str(reply)[:200]}")
        return ids

    offsets_note: str | None = (
        "the server's /tokenize gives no token pieces, so windows, passages and the posterior's query tokens are cut "
        "at estimated token starts (models.tokenizer.piece_token_starts): perplexities may differ from a local "
        "tokenizer's run; give --config.lm_tokenizer for exact cuts")

    def _post(self, body: dict):
        c = self.client
        body = {**body, **({"model": c.model} if c.model else {})}
        return c.transport.post(c.transport.root_url + "/tokenize", body, optional=True)

    def fingerprint(self) -> str:
        """Which server's tokenizer (its ids for a fixed text stand in for the vocabulary), and whether its token starts
        are exact (pieces) or estimated: a datastore cut by one is not the other's."""
        probe = self.encode("The quick brown fox jumps over the lazy dog. 1234 éàü")
        pieces = ["pieces"] if self.offsets_note is None else []
        key = [self.client.transport.root_url, self.client.model, probe] + pieces
        return "server-" + hashlib.sha256(repr(key).encode()).hexdigest()[:12]


class ServerTokenizerWithOffsets(ServerTokenizer):
    """A server tokenizer whose `/tokenize` also returns each token's piece: exact character offsets."""

    offsets_note = None

    def __init__(self, client):
        super().__init__(client)
        self.encode_with_offsets = functools.lru_cache(maxsize=4096)(self._encode_with_offsets)

    def _encode(self, text: str, special: bool = False) -> list[int]:
        """The ids of the pieces' request (one request, one cache entry per text); with the start token: /tokenize's."""
        return super()._encode(text, special) if special else list(self.encode_with_offsets(text)[0])

    def _encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """(ids, (start, end) character spans), the spans from the pieces' UTF-8 lengths; a piece that starts inside
        a character starts at that character. Pieces that do not spell `text` (a normaliser's work) give estimated
        spans (`piece_token_starts`), and `offsets_note` then says so for the run's warnings."""
        if not text:
            return [], []
        reply = self._post({"prompt": text, "content": text, "add_special_tokens": False, "add_special": False,
                            "with_pieces": True})
        rows = reply.get("tokens") if isinstance(reply, dict) else None
        if not isinstance(rows, list) or not all(isinstance(r, dict) and "id" in r and "piece" in r for r in rows):
            raise ValueError("the server's /tokenize gives no pieces")
        ids = [int(r["id"]) for r in rows]
        pieces = [r["piece"].encode("utf-8") if isinstance(r["piece"], str) else bytes(r["piece"]) for r in rows]
        data = text.encode("utf-8")
        if b"".join(pieces) != data:
            self.offsets_note = ServerTokenizer.offsets_note.replace("gives no token pieces", "gave token pieces "
                                                                     "that do not spell some texts")
            starts = piece_token_starts(ServerTokenizer(self.client), text)[:-1]  # ids-only requests
            if len(starts) != len(ids):
                starts = [len(text) * i // len(ids) for i in range(len(ids))]
            return ids, list(zip(starts, starts[1:] + [len(text)]))
        char_at = [0] * (len(data) + 1)  # byte offset -> index of the character it falls in
        at = 0
        for i, ch in enumerate(text):
            width = len(ch.encode("utf-8"))
            char_at[at : at + width] = [i] * width
            at += width
        char_at[len(data)] = len(text)
        starts, at = [], 0
        for p in pieces:
            starts.append(char_at[at])
            at += len(p)
        ends = starts[1:] + [len(text)]
        return ids, list(zip(starts, ends))
