"""Ensembled generation through an OpenAI-compatible server (the contract's `generate`, lm/blackbox.py).

Per-token mixture (a question with K > 1 passes): at every step each pass's top-n next-token log-probs
(`logprobs=top_n`, no echo; n is what the probe found the server gives: 20, or 5 from a server capped as
OpenAI's API is) are mixed over the union of the returned tokens:  log p(t) = logsumexp_i(log λ_i +
log p_i(t)), the chosen (argmax) token appended to every pass. Each pass is asked for its own greedy
continuation in one request (`max_tokens` = the tokens left, the stop strings sent), which gives its top-n at
every later step for as long as the mixture keeps choosing that pass's own tokens; a pass whose token was not
chosen is asked again from the extended prompt. Passes mostly agree, so a question costs about one request per
pass, not one per pass and token. **Missing mass:** a token outside pass i's top-n counts p_i(t) = 0 there, so each mixed
value is a lower bound on the true mixture, exact for a token in every pass's top-n; the greedy choice
can differ from the local backend's only when a token missing from some pass's top-n would have won.
tests/test_generate_http.py measures it against the local backend on SmolLM2.

Sequence level (a question with one pass): the server decodes the whole answer in one request
(`max_tokens = max_new_tokens`): what the "vote" ensemble of `evaluate/qa.py` uses.

End of sequence: a question stops at the served model's end token (`client.end_ids`: the local tokenizer's, the
server's /models card's, or learned here), and its text leaves the token out, as the local backend's does. A server
that names no end token (vLLM) shows it in a completion it ends itself: finish_reason "stop", no stop string in its
tokens, and its own text leaving the last token (named by id) out; that token is learned from then on.

Prompts follow the contract: token ids (prefix ids + context ids, generated ids appended) when the
client sends token prompts, else text. No JAX is imported here.
"""
from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor, as_completed

import numpy as np

from replug_jax.lm.blackbox import (
    Generation,
    check_generation_inputs,
    generation_prompt_ids,
)
from replug_jax.lm.http.transport import BlackBoxServerError
from replug_jax.lm.http.context_room import generation_window
from replug_jax.method import mixture
from replug_jax.models.detokenize import UNFINISHED, IncrementalText
from replug_jax.models.stop_strings import cut_at_stop, tokens_through_stop


def http_generate(client, contexts, log_weights, *, max_new_tokens: int, stop=("\n",), shared_prefix: str = "",
                  top_n: int = 5, on_answer=None, progress: bool = False) -> list[Generation]:
    """One Generation per question (module docstring); `client` is an HTTPLM. on_answer(question, Generation): called
    as each question's answer completes (a one-pass question's with its request, a mixed one's at its last step)."""
    from replug_jax.base.progress import tqdm

    weights = check_generation_inputs(contexts, log_weights, max_new_tokens)  # [B, K]
    prompts = [[pass_prompt(client, shared_prefix, c, max_new_tokens) for c in ctx] for ctx in contexts]
    out: dict[int, Generation] = {}
    bar = tqdm(total=len(prompts), disable=not progress, desc="http generate", unit="question")

    def answered(b: int, generation: Generation) -> None:
        out[b] = generation
        bar.update(1)
        if on_answer is not None:
            on_answer(b, generation)

    with bar, ThreadPoolExecutor(max(1, client.concurrency)) as pool:
        single = {pool.submit(_sequence, client, prompts[b][0], max_new_tokens, stop): b
                  for b, p in enumerate(prompts) if len(p) == 1}
        for done in as_completed(single):
            answered(single[done], done.result())
        multi = [b for b in range(len(prompts)) if b not in out]
        state = {b: {"text": _text_stream(client), "tokens": [], "ids": [], "lps": [], "done": False} for b in multi}
        ahead: dict[tuple[int, int], list] = {}  # (question, pass) -> its own next steps: [(greedy token, top-n)]
        for step in range(max_new_tokens):
            live = [b for b in multi if not state[b]["done"]]
            if not live:
                break
            asked = [(b, i) for b in live for i in range(len(prompts[b])) if not ahead.get((b, i))]
            left = max_new_tokens - step
            ahead.update(zip(asked, pool.map(lambda bi, left=left: _steps_ahead(
                client, prompts[bi[0]][bi[1]], top_n, left, stop), asked)))
            for b in live:
                passes = range(len(prompts[b]))
                token, lp = _mixture_argmax([ahead[(b, i)][0][1] for i in passes], weights[b])
                s = state[b]
                ids = _token_ids(client, token)
                if label_id(token) is None and not _whole(token):
                    _refuse_split_character(client, token, len(prompts[b]))
                s["lps"].append(lp), s["ids"].extend(ids)
                s["tokens"].append(_token_text(s["text"], token, ids))
                prompts[b] = [p + (ids if isinstance(p, list) else token) for p in prompts[b]]
                for i in passes:  # a pass's later steps hold while its own greedy token is the one chosen
                    own = ahead[(b, i)]
                    ahead[(b, i)] = own[1:] if own[0][0] == token and _one_token(client, token, ids) else []
                s["done"] = cut_at_stop(_joined(s), stop)[1] or _is_eos(client, ids)
                if s["done"]:
                    answered(b, _mixed_answer(client, s, stop))
        for b in multi:
            if b not in out:  # its token budget spent
                answered(b, _mixed_answer(client, state[b], stop))
    return [out[b] for b in range(len(prompts))]


def _mixed_answer(client, s: dict, stop) -> Generation:
    """A mixed question's Generation from its decoding state (text cut before a stop string, without EOS's text)."""
    eos = _is_eos(client, s["ids"][-1:])
    text = cut_at_stop(_joined(s, finished=True, eos=eos), stop)[0]
    return Generation(text, s["ids"], s["lps"], "stop" if s["done"] else "length")


def pass_prompt(client, prefix: str, context: str, max_new: int):
    """The pass prompt: token ids by the contract's rule (`generation_prompt_ids`, the prefix kept whole and the
    context cut from the left, as the local backend does), or text."""
    if not client.token_prompts:
        return prefix + context
    prefix_ids, context_ids = generation_prompt_ids(client.tokenizer, prefix, context, generation_window(client),
                                                    max_new, client.start_id)
    return prefix_ids + context_ids


def completion_body(client, prompt, max_tokens: int, top: int, stop=(), token_ids: bool | None = None) -> dict:
    """A generation request's body; `token_ids` (None: the client's probed setting) asks for tokens by id."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "logprobs": top, "echo": False}
    if stop:  # the server stops there too (OpenAI's `stop`, at most 4); the text is cut here either way
        body["stop"] = list(stop)[:4]
    token_ids = getattr(client, "token_ids", False) if token_ids is None else token_ids
    if token_ids:  # tokens named by id (vLLM's field): a character's bytes never lost
        body["return_tokens_as_token_ids"] = True
    return {**body, "model": client.model} if client.model else body


def _choice_logprobs(client, prompt, max_tokens: int, top: int, stop=()) -> tuple[dict, dict]:
    body = completion_body(client, prompt, max_tokens, top, stop)
    reply = client.transport.post(client.base_url + "/completions", body)
    try:
        choice = reply["choices"][0]
        lp = choice["logprobs"]
        if not lp or lp.get("token_logprobs") is None:
            raise KeyError("logprobs")
        return choice, lp
    except (KeyError, IndexError, TypeError):
        client.transport.count("failures")
        raise BlackBoxServerError(f"{client.base_url}: returned no log-probabilities for generated tokens") from None


def _steps_ahead(client, prompt, top_n: int, steps: int, stop) -> list[tuple[str, dict[str, float]]]:
    """The pass's own greedy continuation: per step (its token, {token text: log p} the server's top-n with that
    token included). Step j's top-n is the next-token distribution after the prompt and the pass's own first j
    tokens, so it is the per-token mixture's input at step j for as long as the mixture chose those tokens. One
    step only where the probe did not find a server's later steps to agree with a request for the next token
    (`client.lookahead`), or where a server that stops at a stop string left its stop token out."""
    steps = steps if client.lookahead else 1
    out = continuation_tops(client, prompt, top_n, steps, [s for s in stop if s] if steps > 1 else [])
    if not out and steps > 1:  # the continuation began with its stop string, left out of the tokens: ask for one
        out = continuation_tops(client, prompt, top_n, 1, [])
    if not out:
        raise BlackBoxServerError(f"{client.base_url}: returned no top log-probabilities for the next token")
    return out


def continuation_tops(client, prompt, top_n: int, steps: int, stop: list[str]) -> list[tuple[str, dict]]:
    """[(token, {token text: log p})] per generated step of one greedy completions request."""
    choice, lp = _choice_logprobs(client, prompt, steps, top_n, stop)
    labelled = [label_id(t) for t in lp.get("tokens") or []]
    if labelled and all(i is not None for i in labelled):
        note_end_token(client, choice, labelled, stop)
    out = []
    for token, value, top in zip(lp.get("tokens") or [], lp.get("token_logprobs") or [], lp.get("top_logprobs") or []):
        entries = {t: float(v) for t, v in (top or {}).items() if isinstance(v, (int, float))}
        if isinstance(value, (int, float)):
            entries.setdefault(token, float(value))
        if not entries:
            break
        out.append((token, entries))
    return out


def _one_token(client, token: str, ids: list[int]) -> bool:
    """Whether the chosen token is surely the one the server's own continuation generated: a token named by id
    ("token_id:N"), or whole characters (no replacement mark of a byte fragment) that re-encode to one token (where
    the client has a tokenizer). Then the prompt the next step extends is the one that continuation extended;
    otherwise the pass is asked again from the prompt with the chosen token appended, as its first step was."""
    if label_id(token) is not None:
        return True
    return _whole(token) and (client.tokenizer is None or len(ids) == 1)


def _whole(token: str) -> bool:
    """Whether a token's text is whole characters: not "" (a server that drops a character's bytes, llama.cpp) nor
    holding U+FFFD (one that decodes each token alone)."""
    return bool(token) and UNFINISHED not in token


def _refuse_split_character(client, token: str, passes: int) -> None:
    """A mixture's chosen token that is part of a character, from a server naming tokens by text only: its bytes are
    lost ("" from llama.cpp, U+FFFD elsewhere), so the passes cannot be extended with it, and an answer that went on
    would be garbled (a Ukrainian answer came back ' 1. 2. 3.', a Japanese one ' '); refused, counted in
    stats()["split_characters"]. One pass decodes whole on the server (`_sequence`) and is not concerned."""
    client.transport.count("split_characters")
    raise BlackBoxServerError(
        f"{client.base_url}: the mixture of {passes} passes chose part of a character beyond ASCII ({token!r}), and "
        "this server names generated tokens by their text only, so the passes cannot be extended with it: serve the "
        "LM where generated tokens come by id (return_tokens_as_token_ids: vLLM, python -m replug_jax.serve), or "
        "decode each pass whole on the server (the method vote)")


def _mixture_argmax(tops: list[dict[str, float]], log_weights: np.ndarray) -> tuple[str, float]:
    """The union's best token under Σ_i λ_i p_i(t), p_i = 0 outside pass i's top-n (`mixture.mixed_logprobs`);
    (token, log p), the first in sorted order among equals."""
    tokens = sorted(set().union(*tops))  # [N]
    per_pass = [[top.get(t, -math.inf) for t in tokens] for top in tops]  # [K, N]; -inf: not offered by that pass
    mixed = mixture.mixed_logprobs(np.asarray(log_weights)[: len(tops)], per_pass)  # [N]; weights past the passes: padding
    best = int(np.argmax(mixed))
    return (tokens[best], float(mixed[best])) if mixed[best] > -math.inf else (None, -math.inf)


def _sequence(client, prompt, max_new: int, stop) -> Generation:
    """The server's own greedy decoding of one pass, in one request: its whole `text` (per-token texts may split a
    character), and its tokens' ids where the server names them, else the ids of that text."""
    choice, lp = _choice_logprobs(client, prompt, max_new, 1, [s for s in stop if s])
    tokens = lp.get("tokens") or []
    values = [float(v) for v in lp.get("token_logprobs") or []]
    labelled = [label_id(t) for t in tokens]
    if tokens and all(i is not None for i in labelled):  # ids: the text decoded here, as the local backend does
        note_end_token(client, choice, labelled, stop)
        stream = _text_stream(client)
        shares = [stream.push(i) for i in labelled]
        keep = tokens_through_stop(len(shares), lambda n: "".join(shares[:n]), stop)
        ids = labelled[:keep]
        if keep == len(shares):
            shares[-1] += stream.finish()
        eos = _is_eos(client, ids[-1:])
        text, stopped = cut_at_stop("".join(shares[: keep - 1] if eos else shares[:keep]), stop)
        values = values[:keep]
    else:
        keep = tokens_through_stop(len(tokens), lambda n: "".join(tokens[:n]), stop)
        values = values[:keep]
        text, stopped = cut_at_stop(choice.get("text") or "".join(tokens[:keep]), stop)
        ids = client.tokenizer.encode(text) if client.tokenizer is not None else []
    finished = stopped or choice.get("finish_reason") == "stop"
    return Generation(text, ids, values, "stop" if finished else "length")


TOKEN_ID_LABEL = "token_id:"  # how a server names a token by id (vLLM's `return_tokens_as_token_ids`, ours)


def label_id(token) -> int | None:
    """N of a "token_id:N" label, else None."""
    if isinstance(token, str) and token.startswith(TOKEN_ID_LABEL) and token[len(TOKEN_ID_LABEL):].isdigit():
        return int(token[len(TOKEN_ID_LABEL):])
    return None


def _token_ids(client, token: str) -> list[int]:
    """The ids of a returned token: its label's id, else its text's re-encoding (the token's own id for a token
    that decodes to whole characters; a byte fragment of a character may re-encode differently)."""
    labelled = label_id(token)
    if labelled is not None:
        return [labelled]
    return client.tokenizer.encode(token) if client.tokenizer is not None else []


def _text_stream(client) -> IncrementalText | None:
    """The answer's text as its ids grow, where tokens come as ids (decoded by the client's tokenizer)."""
    return IncrementalText(client.tokenizer) if getattr(client, "token_ids", False) else None


def _token_text(stream: IncrementalText | None, token: str, ids: list[int]) -> str:
    """A chosen token's share of the answer's text: from its id where tokens come as ids, else its text."""
    return "".join(stream.push(i) for i in ids) if stream is not None else token


def _joined(state: dict, finished: bool = False, eos: bool = False) -> str:
    """A question's answer text so far (`finished`: with any held-back bytes; `eos`: without EOS's text)."""
    shares = list(state["tokens"])
    if finished and state["text"] is not None and shares:
        shares[-1] += state["text"].finish()
    return "".join(shares[:-1] if eos else shares)


def _is_eos(client, ids: list[int]) -> bool:
    """Whether `ids` is one end-of-sequence token of the served model (module docstring)."""
    return len(ids) == 1 and ids[0] in client.end_ids


def note_end_token(client, choice: dict, ids: list[int], stop) -> None:
    """Learn the last of a completion's tokens (named by id) as an end token where the server ended the completion
    itself there: finish_reason "stop" (vLLM's `stop_reason` None: not a stop string or token the request named),
    no stop string in the tokens' text, and the server's own text the tokens' less the last one's, which is not
    empty (an end token's text, e.g. "<|im_end|>", that the server leaves out)."""
    if choice.get("finish_reason") != "stop" or choice.get("stop_reason") is not None or not ids:
        return
    if ids[-1] in client.end_ids or client.tokenizer is None or not isinstance(choice.get("text"), str):
        return
    whole, before = client.tokenizer.decode(ids), client.tokenizer.decode(ids[:-1])
    if whole != before and choice["text"] == before and not cut_at_stop(whole, [s for s in stop if s])[1]:
        client.learn_end_token(ids[-1])
