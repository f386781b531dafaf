"""Generated token ids -> text as it grows, whole characters only: each token's share of the decoded text.

Byte-level BPE (GPT-2, SmolLM2, Qwen2) splits a character beyond ASCII over several tokens: "中" is two tokens, an
emoji up to four, and one token alone decodes to U+FFFD. Joining each token's own decode garbles such text
("中��"); decoding the sequence as it grows and holding back the bytes of an unfinished character does not. This is
the incremental detokenizer of vLLM and of `tokenizers`' decode streams: the text of ids[prefix:] less the text of
ids[prefix:read] is the new text, emitted only when it does not end inside a character (U+FFFD), so each token's
share is "" while its character is unfinished and the whole character on the token that completes it. The shares
join to the text of the whole sequence, and a stop string matched on them is matched on that text. A sequence that
ends inside a character (decoding cut by its token budget) ends before it: its bytes are never emitted, as in vLLM,
so a text holds no U+FFFD of an unfinished character (`whole_characters`), on every path alike.

Used by the scoring server (its `text`, `tokens` and stop strings), the local backend's decoding and the HTTP client
(the answer's text from the ids a server returns). Pure Python: the HTTP client imports it without JAX.
"""
from __future__ import annotations

from typing import Sequence

UNFINISHED = "\ufffd"  # what a tokenizer decodes the bytes of an unfinished character to


def whole_characters(text: str) -> str:
    """A decoded sequence's text without the U+FFFD of a character left unfinished at its end."""
    return text.rstrip(UNFINISHED)


class IncrementalText:
    """The text of a growing id sequence, one token at a time (module docstring); `tokenizer.decode(ids)` only."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.text = ""  # the whole characters emitted so far
        self._prefix = self._read = 0  # ids[prefix:read] decode to the last emitted share's context
        self._context = ""  # the text of ids[prefix:read]

    def share(self, token: int) -> str:
        """The text `token` would add after the ids so far ("" while its character is unfinished); nothing kept."""
        new = self.tokenizer.decode(self.ids[self._prefix:] + [int(token)])
        if len(new) > len(self._context) and not new.endswith(UNFINISHED):
            return new[len(self._context):]
        return ""

    def push(self, token: int) -> str:
        """Append `token`; its share of the text."""
        delta = self.share(token)
        self.ids.append(int(token))
        if delta:
            self._prefix, self._read = self._read, len(self.ids)
            self._context = self.tokenizer.decode(self.ids[self._prefix:self._read])
            self.text += delta
        return delta

    def finish(self) -> str:
        """The text still held back at the end of the sequence, less a character left unfinished there; then
        `text` is `whole_characters` of the whole sequence's decode."""
        held = self.tokenizer.decode(self.ids[self._prefix:])[len(self._context):] if self._read < len(self.ids) else ""
        rest = whole_characters(held)
        self.text += rest
        self._prefix = self._read = len(self.ids)
        self._context = ""
        return rest


def token_shares(tokenizer, ids: Sequence[int]) -> list[str]:
    """Each token's share of the text of `ids` (module docstring); they join to `whole_characters` of its decode."""
    stream = IncrementalText(tokenizer)
    shares = [stream.push(t) for t in ids]
    if shares:
        shares[-1] += stream.finish()
    return shares
