"""Tokenizers: a thin wrapper over a Rust `tokenizers.Tokenizer`, from a Hugging Face
directory (tokenizer.json, or whatever transformers can convert) or from GGUF metadata.
"""
from __future__ import annotations

import dataclasses
import itertools
import operator
import os
import re

import tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers


@dataclasses.dataclass
class TextTokenizer:
    """Encode/decode text; `bos_id`/`eos_id`/`pad_id` may be None when the vocabulary has none. `chat_template`: the
    model's Jinja chat template (a GGUF's `tokenizer.chat_template`, a tokenizer_config.json's), None without one."""

    backend: tokenizers.Tokenizer
    bos_id: int | None = None
    eos_id: int | None = None
    pad_id: int | None = None
    chat_template: str | None = None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_batch(self, texts: list[str], add_special_tokens: bool = False) -> list[list[int]]:
        return [e.ids for e in self.backend.encode_batch(list(texts), add_special_tokens=add_special_tokens)]

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids and their (start, end) character spans in `text` (no special tokens)."""
        e = self.backend.encode(text, add_special_tokens=False)
        return e.ids, e.offsets

    def offsets_batch(self, texts: list[str]) -> list[list[tuple[int, int]]]:
        """Each text's token (start, end) character spans, as `encode_with_offsets` gives them, encoded as one batch
        (the tokenizers library's own, in Rust on every core)."""
        return [e.offsets for e in self.backend.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: list[int]) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=False)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)


def tokenizer_fingerprint(tokenizer: TextTokenizer | None) -> str:
    """A short hash of everything that maps text to ids (vocabulary, merges, pre-tokenizer, special ids); a
    server's tokenizer (`lm/http/tokenization.py`) says its own."""
    import hashlib

    if tokenizer is None:
        return "none"
    if not isinstance(tokenizer, TextTokenizer):
        return tokenizer.fingerprint()
    text = tokenizer.backend.to_str() + repr((tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def token_starts(tokenizer: TextTokenizer, text: str) -> list[int]:
    """Character offset where each token starts, plus len(text) at the end: [n + 1]. A tokenizer without
    character offsets (a server's /tokenize: `encode` only) gets them piece by piece (`piece_token_starts`)."""
    if not hasattr(tokenizer, "encode_with_offsets"):
        return piece_token_starts(tokenizer, text)
    return starts_from_offsets(tokenizer.encode_with_offsets(text)[1], len(text))


def token_starts_batch(tokenizer: TextTokenizer, texts: list[str]) -> list[list[int]]:
    """`token_starts` of each text, from one batch encoding where the tokenizer has one (`offsets_batch`)."""
    if not hasattr(tokenizer, "offsets_batch"):
        return [token_starts(tokenizer, text) for text in texts]
    return [starts_from_offsets(offsets, len(text)) for offsets, text in zip(tokenizer.offsets_batch(texts), texts)]


def starts_from_offsets(offsets: list[tuple[int, int]], length: int) -> list[int]:
    """`token_starts` from a text's token spans and its length: [n + 1]."""
    starts = [start for start, _ in offsets]
    if any(map(operator.gt, starts, starts[1:])):  # never backwards (a byte-level token inside a character
        starts = list(itertools.accumulate(starts, max))  # repeats its start); checked first: 4x faster mostly
    if starts:  # leading whitespace belongs to the first token
        starts[0] = 0
    return starts + [length]


def token_pieces(tokenizer: TextTokenizer, text: str) -> tuple[list[int], list[str]]:
    """(ids, each token's piece of `text`): the text cut at `token_starts`, so the pieces spell it exactly and a
    client that adds up their lengths gets this tokenizer's own starts (a server's `/tokenize` "with_pieces")."""
    ids = tokenizer.encode(text)
    starts = token_starts(tokenizer, text)  # [n + 1]
    return ids, [text[a:b] for a, b in zip(starts[:-1], starts[1:])]


_PIECE = re.compile(r"\s*\S+|\s+")  # a word with the whitespace before it; whitespace that ends the text alone


def piece_token_starts(tokenizer, text: str) -> list[int]:
    """`token_starts` from `encode` alone: `text` is cut into pieces, each word with the whitespace before it, and
    each piece is encoded by itself (a server's tokenizer asks once per distinct piece); a piece's first token
    starts where the piece starts, its other tokens evenly over its characters. Token counts and the starts at
    piece boundaries are the text's own wherever the tokenizer never merges a word with the whitespace-led word
    after it (byte-level BPE pre-tokenizers: GPT-2, SmolLM, Llama 3, Qwen2); starts inside a piece of several
    tokens are estimates. Whatever the tokenizer, text cut at these starts is an exact substring."""
    starts: list[int] = []
    for match in _PIECE.finditer(text):
        a, b = match.span()
        n = len(tokenizer.encode(match.group()))
        starts += [a + (b - a) * i // n for i in range(n)]
    if starts:
        starts[0] = 0  # leading whitespace belongs to the first token
    return starts + [len(text)]


DOCUMENT_START_TOKENS = ("<|endoftext|>", "<s>", "<|begin_of_text|>")


def document_start_id(tokenizer: TextTokenizer) -> int | None:
    """The token put before an empty context so the first continuation token is predicted: the first of
    DOCUMENT_START_TOKENS the tokenizer has, else its BOS, else its EOS id (None when it has none)."""
    for token in DOCUMENT_START_TOKENS:
        tid = tokenizer.backend.token_to_id(token)
        if tid is not None:
            return tid
    return tokenizer.bos_id if tokenizer.bos_id is not None else tokenizer.eos_id


def document_start_text(tokenizer: TextTokenizer | None) -> str | None:
    """The text of the tokenizer's document-start token (LocalLM's choice), if it encodes back to that one token."""
    if tokenizer is None:
        return None
    tid = document_start_id(tokenizer)
    text = tokenizer.backend.id_to_token(tid) if tid is not None else None
    return text if text and tokenizer.encode(text) == [tid] else None


def from_hf_dir(model_dir: str) -> TextTokenizer:
    """The tokenizer of a Hugging Face directory (tokenizer.json preferred; no torch needed)."""
    path = os.path.join(model_dir, "tokenizer.json")
    if os.path.isfile(path):
        backend = tokenizers.Tokenizer.from_file(path)
    else:  # vocab.txt / merges.txt only: let transformers build the fast tokenizer
        from transformers import AutoTokenizer

        backend = AutoTokenizer.from_pretrained(model_dir).backend_tokenizer
    backend.no_truncation()
    backend.no_padding()
    ids = _special_ids(model_dir, backend)
    return TextTokenizer(backend, **ids, chat_template=_chat_template(model_dir))


def _chat_template(model_dir: str) -> str | None:
    """A Hugging Face directory's chat template: chat_template.jinja, else tokenizer_config.json's (its "default"
    where it names several)."""
    import json

    path = os.path.join(model_dir, "chat_template.jinja")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            return f.read()
    path = os.path.join(model_dir, "tokenizer_config.json")
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        template = json.load(f).get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    return template if isinstance(template, str) else None


def _special_ids(model_dir: str, backend: tokenizers.Tokenizer) -> dict:
    """bos/eos/pad ids from config.json / tokenizer_config.json / special_tokens_map.json."""
    import json

    found: dict = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        path = os.path.join(model_dir, name)
        if os.path.isfile(path):
            with open(path) as f:
                cfg = json.load(f)
            for key in ("bos", "eos", "pad"):
                tok = cfg.get(f"{key}_token")
                tok = tok.get("content") if isinstance(tok, dict) else tok
                if tok is not None and backend.token_to_id(tok) is not None:
                    found.setdefault(f"{key}_id", backend.token_to_id(tok))
    config_path = os.path.join(model_dir, "config.json")
    if os.path.isfile(config_path):
        with open(config_path) as f:
            cfg = json.load(f)
        for key in ("bos", "eos", "pad"):
            value = cfg.get(f"{key}_token_id")
            if isinstance(value, list):
                value = value[0] if value else None
            if isinstance(value, int) and 0 <= value < backend.get_vocab_size(with_added_tokens=True):
                found.setdefault(f"{key}_id", value)
    return found


QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# llama.cpp pre-tokenizer names -> Hugging Face pre-tokenizers doing the same splitting.
_GPT2_STYLE = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
GGUF_PRE_TOKENIZERS = {
    "gpt2": lambda: _GPT2_STYLE,
    "default": lambda: _GPT2_STYLE,
    # SmolLM: digits split one by one, then the GPT-2 regex (llama.cpp LLAMA_VOCAB_PRE_TYPE_SMOLLM).
    "smollm": lambda: pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _GPT2_STYLE]),
    # Qwen2: its own split regex (digits one by one, case-insensitive contractions), then byte-level without regex.
    "qwen2": lambda: pre_tokenizers.Sequence([
        pre_tokenizers.Split(tokenizers.Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
}
GGUF_NORMALIZERS = {"qwen2": normalizers.NFC}  # as the Hugging Face Qwen2 tokenizer
GGUF_CONTROL_TOKEN_TYPES = (3, 4)  # CONTROL, USER_DEFINED: matched whole, never split


def from_gguf_metadata(fields: dict) -> TextTokenizer:
    """A byte-level BPE tokenizer from GGUF `tokenizer.ggml.*` metadata (model "gpt2")."""
    model = fields.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise ValueError(f"GGUF tokenizer model {model!r} is not supported (only byte-level BPE, 'gpt2')")
    pre = fields.get("tokenizer.ggml.pre", "default")
    if pre not in GGUF_PRE_TOKENIZERS:
        raise ValueError(f"GGUF pre-tokenizer {pre!r} is not supported; known: {sorted(GGUF_PRE_TOKENIZERS)}")
    tokens = fields["tokenizer.ggml.tokens"]
    merges = [tuple(m.split(" ", 1)) for m in fields.get("tokenizer.ggml.merges") or []]
    backend = tokenizers.Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False))
    backend.pre_tokenizer = GGUF_PRE_TOKENIZERS[pre]()
    if pre in GGUF_NORMALIZERS:
        backend.normalizer = GGUF_NORMALIZERS[pre]()
    backend.decoder = decoders.ByteLevel()
    types = fields.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    specials = [tokenizers.AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, types) if k in GGUF_CONTROL_TOKEN_TYPES]
    backend.add_special_tokens(specials)
    return TextTokenizer(
        backend,
        bos_id=fields.get("tokenizer.ggml.bos_token_id"),
        eos_id=fields.get("tokenizer.ggml.eos_token_id"),
        pad_id=fields.get("tokenizer.ggml.padding_token_id"),
        chat_template=fields.get("tokenizer.chat_template"),
    )
