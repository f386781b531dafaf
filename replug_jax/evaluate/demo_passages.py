"""The few-shot block of the downstream prompts: each demo with one retrieved passage (the official REPLUG code's
choice: the demo's own top-1), or the best-ranked passage that holds its gold answer (`choose="answer"`)."""
from __future__ import annotations

from replug_jax.evaluate import qa_metrics
from replug_jax.method.passages import passages_of

DEMO_PASSAGES = ("top1", "answer")
ANSWER_DEPTH = 20  # "answer": the passages a demo's answer-holding passage is looked for in


def few_shot_prefix(retriever, store, demos, with_knowledge: bool, block, choose: str = "top1",
                    depth: int = ANSWER_DEPTH) -> str:
    """The shared few-shot block: each demo with one retrieved passage (none for closed book).

    choose "top1": the demo's own top-1 passage. "answer" (QA): the best-ranked of its top-`depth` passages that
    contains one of the demo's gold answers (the top-1 when none does), so that the demos show the LM a passage
    worth reading; it uses the demos' labels only, never the evaluated questions'."""
    if not with_knowledge:
        return block(demos, [None] * len(demos))
    if choose not in DEMO_PASSAGES:
        raise ValueError(f"demo_passages must be one of {DEMO_PASSAGES}, got {choose!r}")
    _, rows = retriever.retrieve([d.question for d in demos], 1 if choose == "top1" else min(depth, len(store)))
    chosen = []
    for demo, passages in zip(demos, passages_of(store, rows)):
        if choose == "answer":
            passages = [p for p in passages if qa_metrics.answer_recall(demo.answers, p)] or passages
        chosen.append(passages[0] if passages else None)
    return block(demos, chosen)
