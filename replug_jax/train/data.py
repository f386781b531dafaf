"""REPLUG LSR training queries (§5.2): sequences of query + continuation tokens from training documents.

Each example is a window of `query_tokens + continuation_tokens` LM tokens of a training
document: the first part is the query x (what is retrieved for), the second the
continuation y (what the LM scores). Training documents must be disjoint from the
datastore's, or retrieval becomes trivial (the passage that contains y is retrieved).
"""
from __future__ import annotations

import dataclasses
import hashlib

import numpy as np

from replug_jax.models.tokenizer import TextTokenizer, token_starts


@dataclasses.dataclass(frozen=True)
class TrainExample:
    doc_id: str
    query: str  # x: query_tokens tokens
    continuation: str  # y: the next continuation_tokens tokens


def training_examples(documents, tokenizer: TextTokenizer, *, query_tokens: int = 128, continuation_tokens: int = 128,
                      seed: int = 0, max_examples: int | None = None) -> list[TrainExample]:
    """Non-overlapping (x, y) windows of every document, shuffled with `seed` (deterministic)."""
    span = query_tokens + continuation_tokens
    examples = []
    for doc in documents:
        starts = token_starts(tokenizer, doc.text)
        n = len(starts) - 1
        for a in range(0, n - span + 1, span):
            x = doc.text[starts[a] : starts[a + query_tokens]]
            y = doc.text[starts[a + query_tokens] : starts[a + span]]
            if x.strip() and y.strip():
                examples.append(TrainExample(doc.id, x, y))
    if not examples:
        raise ValueError(f"no training example of {span} tokens: documents are too short "
                         "(lower train_query_tokens / train_continuation_tokens)")
    order = np.random.default_rng(seed).permutation(len(examples))
    examples = [examples[i] for i in order]
    return examples[:max_examples] if max_examples else examples


def check_disjoint(train_documents, datastore) -> None:
    """Refuse training documents that are also datastore documents (by id or by identical chunk text)."""
    shared = sorted({d.id for d in train_documents} & set(datastore.sources))
    if shared:
        raise ValueError(f"{len(shared)} training documents are also in the datastore (e.g. {shared[:3]}): "
                         "training queries must come from documents disjoint from the retrieval corpus")
    digest = lambda text: hashlib.sha1(text.strip().encode()).hexdigest()
    chunk_hashes = {digest(t) for t in datastore.texts if len(t.strip()) > 64}
    overlapping = [d.id for d in train_documents if any(digest(p) in chunk_hashes for p in d.text.split("\n\n") if len(p.strip()) > 64)]
    if overlapping:
        raise ValueError(f"training documents {overlapping[:3]} contain passages identical to datastore chunks")
