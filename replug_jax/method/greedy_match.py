"""Whether a continuation is the greedy one under REPLUG's mixture, decided from the scoring pass's own top tokens.

lm-eval's `is_greedy`: would greedy decoding from the context give exactly the continuation's tokens? REPLUG's
decoding takes, at every step, the argmax of the mixture m(u) = Σ_j λ_j p_j(u) over the passes j (lm/blackbox.py).
Scoring a pass gives, at each continuation position, the continuation token's log-prob and the pass's n most probable
next tokens (`LocalLM.score_top`). For a token u outside pass j's top n, p_j(u) is at most that pass's n-th value
p_j^(n), so every token's mixture value is bounded:

    lower(u) = Σ_{j: u in top_j} λ_j p_j(u)        upper(u) = lower(u) + Σ_{j: u not in top_j} λ_j p_j^(n)

and the continuation token y's value m(y) is known exactly. At one position:
  * some u ≠ y has lower(u) > m(y): y is not the argmax (False);
  * m(y) > upper(u) for every listed u ≠ y, and m(y) > Σ_j λ_j p_j^(n) (a token in no list): y is the argmax (True);
  * else it is left open (None).
The continuation is greedy iff y is the argmax at every position: False as soon as one position is False, True when
all are True, else None, where the caller decodes as before. A margin of `MARGIN` (relative) leaves near-ties open,
so that float rounding between the scoring program and the decoding one never decides a value decoding would not
give (decoding breaks exact ties by token id).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

TOP = 8  # next tokens asked of each pass at each continuation position: decides nearly every position
MARGIN = 1e-4  # relative: m(y) must beat every bound, or lose to a lower bound, by this much to be decided


def position_is_argmax(y: int, logprob_y: np.ndarray, top_logprobs: np.ndarray, top_ids: np.ndarray,
                       weights: np.ndarray) -> bool | None:
    """One position: is y the mixture's argmax? logprob_y [K] (each pass's log p(y)), top_logprobs / top_ids [K, n]
    (best first), weights λ [K] (0: a pass left out). True / False where the bounds decide it, else None."""
    p_top = np.exp(top_logprobs.astype(np.float64))  # [K, n]
    m_y = float(np.sum(weights * np.exp(logprob_y.astype(np.float64))))
    floor = weights * p_top[:, -1]  # [K]: λ_j p_j^(n), the most a token outside pass j's list can hold
    others = np.unique(top_ids[top_ids != y])  # [C]
    if others.size:
        match = top_ids[None] == others[:, None, None]  # [C, K, n]
        listed = match.any(-1)  # [C, K]
        lower = np.sum(weights * np.sum(match * p_top[None], -1), -1)  # [C]
        upper = lower + np.sum(np.where(listed, 0.0, floor[None]), -1)  # [C]
        if np.any(lower > m_y * (1 + MARGIN)):
            return False
        best_other = max(float(upper.max()), float(floor.sum()))
    else:
        best_other = float(floor.sum())
    return True if m_y > best_other * (1 + MARGIN) else None


def mixture_is_greedy(passes: Sequence, log_weights) -> bool | None:
    """Whether the continuation scored in `passes` (one `TopScores` per pass, lm/local.py: the same continuation
    tokens after each passage) is REPLUG's greedy decoding under the mixture with weights exp(log_weights) [K]:
    True / False where the passes' top tokens decide it (module docstring), None where they leave it open."""
    weights = np.exp(np.asarray(log_weights, np.float64))  # [K]; -inf -> 0
    tokens = passes[0].token_ids
    if any(list(p.token_ids) != list(tokens) for p in passes):
        raise ValueError("the passes scored different continuation tokens")
    logprobs = np.stack([p.logprobs for p in passes])  # [K, T]
    top_lps = np.stack([p.top_logprobs for p in passes])  # [K, T, n]
    top_ids = np.stack([p.top_ids for p in passes])  # [K, T, n]
    decided = True
    for t, y in enumerate(tokens):
        at = position_is_argmax(int(y), logprobs[:, t], top_lps[:, t], top_ids[:, t], weights)
        if at is False:
            return False
        if at is None:
            decided = None
    return decided
