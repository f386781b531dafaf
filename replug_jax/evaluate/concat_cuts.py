"""What a window-cut "concat" prompt still holds, so that its records name only what the LM read.

"concat" puts every passage in one Knowledge line, joined best last (`passages.knowledge_line`), and the LM's window
cuts a prompt from the left: the worst passages go first. A QA generation pass keeps `lm.generation_room(demos,
max_new_tokens)` context tokens after the demos; a multiple-choice pair keeps `lm.scoring_room(option)` before each
option, so the longest option leaves the least and decides (MMLU's letters are one token each; OLMES's and the
cloze prompts' options differ). A backend that cannot say (a server given text prompts cuts by its own rule) keeps
every passage listed.

Records: a QA prediction's "passage_ids" keep the passages still in its prompt, at least in part, best first, and
"passages_cut" counts the others; a multiple-choice row's "concat_passage_ids" and "concat_passages_cut" likewise.
`warning` says how many questions were cut.
"""
from __future__ import annotations

from typing import Sequence

from replug_jax.method.passages import knowledge_line, question_block
from replug_jax.models.tokenizer import token_starts


def passages_kept(lm, context: str, passages: Sequence[str], room: int | None) -> int:
    """How many of `passages` (best first) the last `room` tokens of `context` hold, at least in part; `context`
    holds their Knowledge line (its last occurrence). All where nothing is cut or room is None. A tokenizer with
    character offsets gives the whole context's token starts: exact. Otherwise (a server's /tokenize with ids alone,
    a user's black box) each passage's suffix is counted apart, exact where no token merges across a passage's end
    (byte-level BPE pre-tokenizers split there) and within a passage of it elsewhere."""
    if room is None:
        return len(passages)
    tokenizer = getattr(lm, "tokenizer", None)
    starts = token_starts(tokenizer, context) if hasattr(tokenizer, "encode_with_offsets") else None  # [tokens + 1]
    if (len(starts) - 1 if starts is not None else lm.count_tokens(context)) <= room:
        return len(passages)
    start = context.rindex(knowledge_line(passages))
    ends = [start + len(knowledge_line(passages[i:])) for i in range(len(passages))]  # where passage i ends [n]
    if starts is not None:  # the context encoded once, with its offsets
        first_kept = starts[len(starts) - 1 - room]  # the first character the last `room` tokens hold
        return next((i for i, end in enumerate(ends) if end <= first_kept), len(passages))
    kept = 0  # passage i is kept in part while what follows it takes fewer than `room` tokens
    while kept < len(passages) and lm.count_tokens(context[ends[kept]:]) < room:
        kept += 1
    return kept


def kept_in_generation(lm, question: str, passages: Sequence[str], demo_prefix: str, max_new_tokens: int) -> int:
    """How many of `passages` the QA "concat" generation prompt (`qa.method_passes`) holds after the demos."""
    room = getattr(lm, "generation_room", lambda *_: None)(demo_prefix, max_new_tokens)
    return passages_kept(lm, question_block(question, knowledge_line(passages)), passages, room)


def kept_in_scoring(lm, context: str, passages: Sequence[str], continuations: Sequence[str]) -> int:
    """How many of `passages` a multiple-choice "concat" prompt `context` holds before every one of its options."""
    rooms = [getattr(lm, "scoring_room", lambda _: None)(c) for c in continuations]
    return passages_kept(lm, context, passages, None if None in rooms else min(rooms))


def mark_generations(lm, questions, passages: list[list[str]], predictions: list[dict], demo_prefix: str,
                     max_new_tokens: int) -> None:
    """QA "concat" predictions whose prompt the window cut: "passage_ids" keep the passages still in it and
    "passages_cut" counts the others."""
    for q, ps, p in zip(questions, passages, predictions):
        _mark(p, "passage_ids", "passages_cut", kept_in_generation(lm, q.question, ps, demo_prefix, max_new_tokens),
              len(ps))


def mark_options(lm, rows: list[dict], prompts: list[list[str]], passages: list[list[str]],
                 continuations: list[Sequence[str]]) -> None:
    """Multiple-choice rows (MMLU, OLMES) whose "concat" prompt (prompts[q]: its one pass) the window cut before
    some option (continuations[q]): "concat_passage_ids" keep the passages still in it, "concat_passages_cut"."""
    for row, (context,), ps, conts in zip(rows, prompts, passages, continuations):
        _mark(row, "concat_passage_ids", "concat_passages_cut", kept_in_scoring(lm, context, ps, conts), len(ps))


def _mark(record: dict, ids_key: str, cut_key: str, kept: int, found: int) -> None:
    if kept < found:
        record[ids_key], record[cut_key] = record[ids_key][:kept], found - kept


def warning(rows: list[dict]) -> str | None:
    """Said when the LM's window cut "concat" prompts (the marks above; rows of any process)."""
    cut = [_cut(row) for row in rows]
    cut = [n for n in cut if n]
    if not cut:
        return None
    return (f"concat: the LM's window cut the prompt of {len(cut)} of {len(rows)} questions, {sum(cut)} passage(s) in "
            "all, the worst first (their passage_ids list the rest): raise --config.lm_max_length or lower --config.k")


def _cut(row: dict) -> int:
    """Passages cut from a row's "concat" prompt: a QA prediction dict's "passages_cut", or a multiple-choice
    row's "concat_passages_cut"."""
    concat = row.get("concat")
    return concat.get("passages_cut", 0) if isinstance(concat, dict) else row.get("concat_passages_cut", 0)
