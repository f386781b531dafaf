"""MMLU with REPLUG (§6.2, Table 4): 5-shot prompts with retrieved knowledge, option probabilities ensembled.

The prompt of pass i for a test question (the paper's Table 4):

    <5 shots from the subject's dev split, each "Knowledge: <its own top-1 passage>\\nQuestion: ...\\n
     A. .. B. .. C. .. D. ..\\nAnswer: B\\n\\n">
    Knowledge: <passage i>
    Question: <question>
    A. <choice> B. <choice> C. <choice> D. <choice>
    Answer:

Each pass scores the four option letters (" A" .. " D", one token each for BPE LMs: checked) with
`lm.score`; the answer is the argmax over options of the REPLUG mixture Σ_i λ_i p_i(option),
λ = softmax(s/τ) (`mixture.mixed_logprobs_jax`), not a vote. Accuracy is reported per subject, per
category (the standard 57-subject map) and overall, as the macro-average over subjects (what the
paper's Table 2 compares to) and the micro-average over questions, labelled.
"""
from __future__ import annotations

import collections
from typing import Sequence

import numpy as np

from replug_jax.base.progress import progress_keyword
from replug_jax.data.question_sets import MMLU_CATEGORIES
from replug_jax.method import mixture
from replug_jax.method.passages import knowledge, knowledge_line

LETTERS = ("A", "B", "C", "D", "E", "F")
# what the mmlu job's --config.methods may name; "replug_posterior" needs scoring="options" (option_text.py)
METHODS = ("none", "replug", "concat", "replug_lsr", "replug_posterior")


def lettered_block(example, passage: str | None, with_answer: bool = False) -> str:
    """One Table 4 block; the test question's ends at "Answer:"."""
    options = " ".join(f"{LETTERS[i]}. {c}" for i, c in enumerate(example.choices))
    end = f" {LETTERS[example.answer]}\n\n" if with_answer else ""
    return f"{knowledge(passage)}Question: {example.question}\n{options}\nAnswer:{end}"


def shots_block(shots, shot_passages: Sequence[str | None], block=lettered_block) -> str:
    """The few-shot prefix: each shot as `block` builds it, with its passage and its answer."""
    return "".join(block(s, p, with_answer=True) for s, p in zip(shots, shot_passages))


def shots_by_subject(dev) -> dict[str, list]:
    """The dev examples grouped by subject, in their order (each subject's few-shot candidates)."""
    out: dict[str, list] = {}
    for ex in dev:
        out.setdefault(ex.subject, []).append(ex)
    return out


def method_prompts(method: str, questions, passages: list[list[str]], prefixes: dict[str, str],
                   block=lettered_block) -> list[list[str]]:
    """Per question its prompts, after its subject's few-shot prefix: one without a passage ("none"), one with the
    passages joined best last ("concat"), else one per retrieved passage (REPLUG's passes). `block`: the
    question's prompt (`lettered_block`: lettered options; `option_text.cloze_block`: the question alone)."""
    head = lambda q: prefixes.get(q.subject, "")
    if method == "none":
        return [[head(q) + block(q, None)] for q in questions]
    if method == "concat":
        return [[head(q) + block(q, knowledge_line(p))] for q, p in zip(questions, passages)]
    return [[head(q) + block(q, p) for p in ps] for q, ps in zip(questions, passages)]


def retrieval_query(example, with_options: bool) -> str:
    """The test question as the query; with its options (as the official code) when asked."""
    if not with_options:
        return example.question
    return example.question + " " + " ".join(f"{LETTERS[i]}. {c}" for i, c in enumerate(example.choices))


def check_option_tokens(lm, n: int = 4) -> None:
    """The option letters must be single tokens after "Answer:" (else their probabilities are not comparable)."""
    if n > len(LETTERS):
        raise ValueError(f"{n} choices: at most {len(LETTERS)} options (letters {LETTERS}) are supported")
    if hasattr(lm, "count_tokens"):
        long = [f" {x}" for x in LETTERS[:n] if lm.count_tokens(f" {x}") != 1]
        if long:
            raise ValueError(f"option letters {long} are not single tokens for this LM's tokenizer")


def letter_continuations(n_options: int) -> list[str]:
    """The continuations the letter prompt scores: " A", " B", ... (single tokens, `check_option_tokens`)."""
    return [f" {x}" for x in LETTERS[:n_options]]


def option_logprobs(lm, prompts: list[list[str]], n_options: int = 4, progress: bool = False) -> np.ndarray:
    """log p(" A") .. log p(" D") after each pass prompt: [Q, K, n] (-inf where a question has fewer passes).
    `progress`: the LM's progress bar (the project's LMs; a user's black box is called without it)."""
    k = max(len(p) for p in prompts)
    contexts, conts, where = [], [], []
    for q, passes in enumerate(prompts):
        for i, prompt in enumerate(passes):
            for o, letter in enumerate(letter_continuations(n_options)):
                contexts.append(prompt), conts.append(letter), where.append((q, i, o))
    out = np.full((len(prompts), k, n_options), -np.inf, np.float32)
    for (q, i, o), lps in zip(where, lm.score(contexts, conts, **progress_keyword(lm.score, progress))):
        out[q, i, o] = float(np.sum(lps))
    return out


def mixture_predictions(option_lps: np.ndarray, scores: np.ndarray, temperature: float,
                        num_choices: Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(predicted option [Q], mixed log-probs [Q, n]): argmax of log Σ_i λ_i p_i(option) over each question's
    own `num_choices` options (default: all n)."""
    valid = np.isfinite(option_lps).all(-1)  # [Q, K]
    mixed = np.asarray(mixture.mixed_logprobs_jax(np.where(valid[..., None], option_lps, 0.0), scores, valid, temperature))
    if num_choices is not None:
        mixed = np.where(np.arange(mixed.shape[1])[None, :] < np.asarray(num_choices)[:, None], mixed, -np.inf)
    return mixed.argmax(-1), mixed


def accuracy(examples, predicted: Sequence[int]) -> dict:
    """Accuracy (%) per subject, per category and overall: "macro" averages subjects, "micro" questions."""
    by_subject: dict[str, list[bool]] = collections.defaultdict(list)
    for ex, p in zip(examples, predicted):
        by_subject[ex.subject].append(int(p) == ex.answer)
    per_subject = {s: 100.0 * float(np.mean(v)) for s, v in sorted(by_subject.items())}
    per_category = {}
    for cat in sorted(set(MMLU_CATEGORIES.get(s, "Other") for s in by_subject)):
        subjects = [s for s in by_subject if MMLU_CATEGORIES.get(s, "Other") == cat]
        flat = [x for s in subjects for x in by_subject[s]]
        per_category[cat] = {"macro": float(np.mean([per_subject[s] for s in subjects])),
                             "micro": 100.0 * float(np.mean(flat)), "subjects": len(subjects), "questions": len(flat)}
    flat = [x for v in by_subject.values() for x in v]
    return {"macro": float(np.mean(list(per_subject.values()))) if per_subject else 0.0,
            "micro": 100.0 * float(np.mean(flat)) if flat else 0.0, "questions": len(flat),
            "per_category": per_category, "per_subject": per_subject}
