"""What the probe finds about scoring requests themselves (after `http_probe.probe`): how many prompts one
request may carry, and whether echoed log-probabilities need `logprobs` >= 1.

Both keep a value given to HTTPLM's constructor as it is. `logprobs=0` is OpenAI's "the chosen tokens' log-probs,
no alternatives": a server that answers it with the same numbers is asked 0, so it computes and sends no top
alternatives per echoed token (our own server computes them in a second pass; over a 3x cost measured here).
"""
from __future__ import annotations

import numpy as np

from replug_jax.lm.http_probe import PROBE_TEXT
from replug_jax.lm.http_transport import BlackBoxServerError, Refused

BATCH_PROMPTS = 16  # prompts per completions request where the probe finds the server answers lists exactly


def probe_batching(client, given: int | None) -> tuple[int, str]:
    """(prompts per request, the finding): `BATCH_PROMPTS` where the server answers a list of two probe pairs
    with each pair's own numbers (1e-4), else 1; a size `given` to the client's constructor is kept as it is."""
    if given is not None:
        return given, f"{given} (as given)"
    try:
        pairs = [client.prepare_prompt(PROBE_TEXT[:24], PROBE_TEXT[24:40]),
                 client.prepare_prompt(PROBE_TEXT[:12], PROBE_TEXT[12:30])]
    except ValueError:  # a window too small for the probe pairs
        return 1, "1: not probed (the server's window is too small for the probe pairs)"
    alone = [client.score_chunk([pair], probing=True)[0] for pair in pairs]
    try:
        together = client.score_chunk(pairs, probing=True)
    except (Refused, BlackBoxServerError) as e:
        return 1, f"1: the server refused a list of prompts ({str(e)[:120]})"
    if not all(a.shape == b.shape and np.allclose(a, b, atol=1e-4) for a, b in zip(alone, together)):
        return 1, "1: the server answered a list of prompts with other numbers than one prompt at a time"
    return BATCH_PROMPTS, f"{BATCH_PROMPTS}: the server answers a list of prompts with each prompt's own numbers"


def probe_logprobs(client, given: int | None) -> tuple[int, str]:
    """(the `logprobs` of scoring requests, the finding): 0 where the server answers an echoed probe pair with the
    same log-probs (1e-4) at 0 as at 1, else 1; a value `given` to the client's constructor is kept."""
    if given is not None:
        return given, f"{given} (as given)"
    try:
        pair = client.prepare_prompt(PROBE_TEXT[:24], PROBE_TEXT[24:40])
    except ValueError:  # a window too small for the probe pair
        return 1, "1: not probed (the server's window is too small for the probe pair)"
    client.logprobs = 1
    with_top = client.score_chunk([pair], probing=True)[0]
    client.logprobs = 0
    try:
        without = client.score_chunk([pair], probing=True)[0]
    except (Refused, BlackBoxServerError) as e:
        return 1, f"1: the server refused logprobs=0 ({str(e)[:120]})"
    finally:
        client.logprobs = 1
    if with_top.shape != without.shape or not np.allclose(with_top, without, atol=1e-4):
        return 1, "1: the server's echoed log-probs differ at logprobs=0"
    return 0, "0: the server echoes the prompt's log-probs without alternatives"
