"""The scoring server's generation (issue 60, item 4): prefill once into a key/value cache, one token per step,
concurrent prompts decoded together, stopped at the request's stop strings; a request whose client has gone is
dropped before the model works on it. Checked against a full forward pass per generated token (what the server
did before), over real HTTP on 127.0.0.1."""
import http.client
import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import jax
import numpy as np
import pytest

import replug_jax as rj
from replug_jax.models import causal_lm
from replug_jax.models.detokenize import IncrementalText, token_shares
from replug_jax.parallel import sharding
from replug_jax.serve import BackgroundServer
from replug_jax.server import decoding_batch
from tests import hf_tiny

PROMPTS = ["The capital of France is", "Once", "a b c d e f g h i j k l m n o p", "Numbers: 1 2 3"]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("tiny_gpt2"))
    hf_tiny.tiny_gpt2(path, positions=256)
    lm = rj.load_lm(path, batch_size=8)
    server = BackgroundServer(lm)
    yield lm, server
    server.stop()


def post(url: str, body: dict, timeout: float = 60) -> dict:
    request = urllib.request.Request(url + "/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        return json.load(reply)


def full_forward_greedy(lm, ids: list[int], steps: int) -> tuple[list[int], list[float], list[dict]]:
    """Greedy tokens, their log-probs and each step's top 3 {id: log p}, each from a forward pass over the whole
    sequence so far (no cache; right-padded, never attended)."""
    tokens, values, tops = [], [], []
    sequence = list(ids)
    width = len(ids) + steps  # one padded shape: one compilation for every step
    for _ in range(steps):
        row, mask = np.zeros((1, width), np.int32), np.zeros((1, width), np.int32)
        row[0, : len(sequence)], mask[0, : len(sequence)] = sequence, 1
        logits = causal_lm.logits(lm.params, lm.config, row, mask, lm.dtype)[0, len(sequence) - 1]
        logp = np.asarray(jax.nn.log_softmax(logits.astype(np.float32)))
        best = int(np.argmax(logp))
        tokens.append(best), values.append(float(logp[best]))
        tops.append({int(i): float(logp[i]) for i in np.argsort(-logp)[:3]})
        if best == lm.tokenizer.eos_id:
            break
        sequence.append(best)
    return tokens, values, tops


def check_choice(lm, choice: dict, want: tuple) -> None:
    """Tokens as each one's share of the text decoded as it grows (whole characters: the tiny model emits lone
    bytes), log-probs, and each step's top 3 keyed by the share it would have added (of equal keys the best kept)."""
    tokens, values, tops = want
    got = choice["logprobs"]
    shares = token_shares(lm.tokenizer, tokens)
    assert got["tokens"] == shares and choice["text"] == "".join(shares[:-1] if tokens[-1] == lm.tokenizer.eos_id
                                                                 else shares)
    np.testing.assert_allclose(got["token_logprobs"], values, atol=1e-4, rtol=0)
    stream = IncrementalText(lm.tokenizer)
    for step, best, token in zip(got["top_logprobs"], tops, tokens):
        keyed: dict = {}
        for i, v in sorted(best.items(), key=lambda item: -item[1]):
            keyed.setdefault(stream.share(i), v)
        stream.push(token)
        assert sorted(step) == sorted(keyed)
        np.testing.assert_allclose([step[t] for t in sorted(step)], [keyed[t] for t in sorted(keyed)], atol=1e-4)


def test_the_server_decodes_through_its_cache_as_a_forward_pass_per_token_would(served):
    """Prompts of different lengths, in one request (decoded together) and one request each (in flight at once):
    each token, its log-prob and its step's top 3 as a full forward pass over the sequence gives them."""
    lm, server = served
    ids = [lm.tokenizer.encode(p) for p in PROMPTS]
    want = [full_forward_greedy(lm, p, 12) for p in ids]
    together = post(server.url, {"prompt": ids, "max_tokens": 12, "temperature": 0, "logprobs": 3})
    for choice, w in zip(together["choices"], want):
        check_choice(lm, choice, w)
        assert choice["finish_reason"] == ("length" if len(w[0]) == 12 else "stop")
    alone: dict = {}
    threads = [threading.Thread(target=lambda i=i: alone.__setitem__(i, post(server.url, {
        "prompt": ids[i], "max_tokens": 12, "temperature": 0, "logprobs": 3}))) for i in range(len(ids))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, w in enumerate(want):
        check_choice(lm, alone[i]["choices"][0], w)


def test_a_bad_stop_is_refused_naming_it(served):
    """More stop strings than OpenAI's 4 are refused with 400 naming `stop` (the stops themselves, on real text in
    several scripts: tests/test_text_beyond_ascii.py)."""
    lm, server = served
    with pytest.raises(urllib.error.HTTPError) as refused:
        post(server.url, {"prompt": lm.tokenizer.encode(PROMPTS[0]), "max_tokens": 3,
                          "stop": ["a", "b", "c", "d", "e"]})
    assert refused.value.code == 400 and "'stop'" in json.load(refused.value)["error"]["message"]


def test_a_request_whose_client_has_gone_is_dropped_unworked(served):
    """While the model is busy (its lock held) a client of a 4-prompt request gives up and closes its connection:
    the server cancels every prompt of it (issue 69: it cancelled only the awaited one), so the model never works on
    them, and the next client is answered at once."""
    lm, server = served
    engine = server.app.state.engine
    before = engine.abandoned
    address = urllib.parse.urlsplit(server.url)
    body = json.dumps({"prompt": PROMPTS, "max_tokens": 200, "temperature": 0})
    with engine.working:
        connection = http.client.HTTPConnection(address.hostname, address.port, timeout=0.5)
        connection.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        with pytest.raises(TimeoutError):
            connection.getresponse()  # the client's own timeout
        connection.close()
        time.sleep(1.0)  # the server notices the closed connection (it polls every 0.25 s)
    deadline = time.time() + 10
    while engine.abandoned < before + len(PROMPTS) and time.time() < deadline:
        time.sleep(0.05)
    assert engine.abandoned == before + len(PROMPTS)
    started = time.time()
    assert post(server.url, {"prompt": PROMPTS[1], "max_tokens": 2, "temperature": 0})["choices"][0]["text"]
    assert time.time() - started < 5


def test_prompts_sharing_a_long_prefix_score_as_whole_rows(served):
    """Echo scoring of prompts that share a 150-token prefix (a passage and question under several gold answers):
    the prefix is scored once and each prompt's rest after it, and every token's log-prob is the whole row's."""
    lm, server = served
    prefix = lm.tokenizer.encode(" ".join(f"w{i}" for i in range(60)))[:150]
    assert len(prefix) == 150
    prompts = [prefix + lm.tokenizer.encode(end) for end in (" one", " two three", " four", " five six seven", "!")]
    reply = post(server.url, {"prompt": prompts + [prompts[0][:1]], "max_tokens": 0, "echo": True, "logprobs": 0})
    for prompt, choice in zip(prompts, reply["choices"]):
        want = lm.score_token_pairs([(prompt[:1], prompt[1:])])[0]  # the whole row, alone
        got = choice["logprobs"]["token_logprobs"]
        assert got[0] is None and len(got) == len(prompt)
        np.testing.assert_allclose(got[1:], want, atol=1e-5, rtol=0)
    assert reply["choices"][-1]["logprobs"]["token_logprobs"] == [None]  # one token: nothing precedes it


def test_echo_from_computes_the_log_probs_asked_for_as_the_local_backend_scores_a_continuation(served):
    """`echo_from` (this server's extension, docs/http.md): null log-probs before each prompt's start, and from it on
    the numbers of LocalLM.score_token_pairs, the local backend's scoring of a continuation after its context; a
    start of 0 echoes every token as before; a malformed value is refused."""
    lm, server = served
    prompts = [lm.tokenizer.encode(text) for text in PROMPTS]
    starts = [1, 0, 9, len(prompts[3]) - 1]
    reply = post(server.url, {"prompt": prompts, "max_tokens": 0, "echo": True, "logprobs": 0, "echo_from": starts})
    whole = post(server.url, {"prompt": prompts, "max_tokens": 0, "echo": True, "logprobs": 0})
    for prompt, start, choice, full in zip(prompts, starts, reply["choices"], whole["choices"]):
        got, every = choice["logprobs"]["token_logprobs"], full["logprobs"]["token_logprobs"]
        assert len(got) == len(prompt) and got[:max(start, 1)] == [None] * max(start, 1)
        if start:
            assert got[start:] == [float(v) for v in lm.score_token_pairs([(prompt[:start], prompt[start:])])[0]]
        np.testing.assert_allclose(got[max(start, 1):], every[max(start, 1):], atol=1e-5, rtol=0)
    for bad in (-1, [1, 2], "3", True):
        request = urllib.request.Request(server.url + "/completions", json.dumps(
            {"prompt": prompts, "max_tokens": 0, "echo": True, "logprobs": 0, "echo_from": bad}).encode(),
            {"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=60)
        assert refused.value.code == 400 and "echo_from" in refused.value.read().decode()


def teacher_forced(lm, prompt: list[int], generated: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Each generated token's position: (argmax id, its log-prob of the generated token), from one forward pass."""
    row = np.array([prompt + generated], np.int32)
    logits = causal_lm.logits(lm.params, lm.config, row, np.ones_like(row), lm.dtype)[0]
    logp = np.asarray(jax.nn.log_softmax(np.asarray(logits, np.float32), axis=-1))[len(prompt) - 1: -1]
    return logp.argmax(-1), logp[np.arange(len(generated)), generated]


def test_a_short_request_leaves_the_decoding_batch_while_a_long_one_decodes_on(served):
    """Issue 69: the decoding batch refills as rows finish (continuous batching). A 1-token request arriving while a
    250-token one decodes is answered before the long one ends (before, it waited for the whole batch), and both
    come out as decoded alone: the long one's rows were repacked on the way (the short one's row added and removed,
    its slots compacted and grown past 256)."""
    lm, server = served
    engine = server.app.state.engine
    long_prompt, short_prompt = lm.tokenizer.encode("Once"), lm.tokenizer.encode(PROMPTS[0])
    for _ in range(2):  # the second round runs on shapes compiled in the first
        long = engine.generate(long_prompt, 250, 0)
        deadline = time.time() + 60
        while engine.decoding_rows == 0 and not long.done() and time.time() < deadline:
            time.sleep(0.001)
        with engine.working:  # the model thread waits between two chunks: the short request joins the next one
            short = engine.generate(short_prompt, 1, 0)
        short_tokens = short.result(timeout=60)
        long_was_running = not long.done()
        long_tokens = long.result(timeout=120)
    assert long_was_running and len(short_tokens) == 1 and len(long_tokens) == 250
    ids = [t for t, _, _ in long_tokens]
    best, values = teacher_forced(lm, long_prompt, ids)
    assert list(best) == ids
    np.testing.assert_allclose([v for _, v, _ in long_tokens], values, atol=1e-4, rtol=0)
    alone = engine.generate(short_prompt, 1, 0).result(timeout=60)
    assert short_tokens[0][0] == alone[0][0] and abs(short_tokens[0][1] - alone[0][1]) < 1e-4


def test_a_row_stops_where_its_stop_string_spanning_tokens_completes(served):
    """Issue 69: a stop string that spans two tokens ends its row within a chunk of steps, the answer kept through
    the token that completes it (before, the row decoded on to its budget and the caller cut the text)."""
    lm, server = served
    engine = server.app.state.engine
    prompt = lm.tokenizer.encode(PROMPTS[2])
    free = engine.generate(prompt, 40, 0).result(timeout=60)
    shares = token_shares(lm.tokenizer, [t for t, _, _ in free])
    text = "".join(shares)
    joins = [j for j in range(1, len(shares)) if shares[j - 1] and shares[j]  # one token's last character and the
             and not any(shares[j - 1][-1] + shares[j][0] in s for s in [*shares, "".join(shares[:j])])]  # next's first
    assert joins, text
    j = joins[0]
    stop = shares[j - 1][-1] + shares[j][0]  # in no single token's text; first completed by token j
    stopped = engine.generate(prompt, 200, 0, (stop,)).result(timeout=60)
    assert [t for t, _, _ in stopped] == [t for t, _, _ in free[: j + 1]]
    reply = post(server.url, {"prompt": prompt, "max_tokens": 200, "temperature": 0, "stop": [stop]})
    assert reply["choices"][0]["text"] == text[: text.index(stop)] and reply["choices"][0]["finish_reason"] == "stop"
    assert reply["usage"]["completion_tokens"] == j + 1


def test_a_row_whose_client_has_gone_leaves_the_decoding_batch(served):
    """A prompt cancelled while it decodes (its client gone) is dropped at the next chunk, not decoded on."""
    lm, server = served
    engine = server.app.state.engine
    before = engine.abandoned
    future = engine.generate(lm.tokenizer.encode("1, 2, 3, 4, 5, 6,"), 250, 0)  # counts on: no early end of text
    deadline = time.time() + 60
    while True:  # seen decoding and cancelled under the engine's lock: between two chunks, its row still there
        with engine.working:
            if engine.decoding_rows == 1:
                assert future.cancel()
                break
        assert not future.done(), "the row ended before the test could cancel it"
        assert time.time() < deadline, "the row never started decoding"
        time.sleep(0.001)
    deadline = time.time() + 10
    while engine.decoding_rows and time.time() < deadline:
        time.sleep(0.01)
    assert engine.decoding_rows == 0 and engine.abandoned == before + 1


def test_rows_finishing_before_a_row_below_them_repack_without_losing_it(served):
    """A short prompt admitted in a row before a long one: when it finishes the batch shrinks (the long row moved
    to row 0) and the long row decodes on in its new place, as it would alone (the chunk once read the rows by
    their places before the repack: IndexError)."""
    lm, server = served
    engine = server.app.state.engine
    prompts = [lm.tokenizer.encode(p) for p in PROMPTS]
    budgets = [1, 30, 2, 30]
    with engine.working:  # admitted together, in this order: rows 0..3
        futures = [engine.generate(p, n, 0) for p, n in zip(prompts, budgets)]
    together = [f.result(timeout=120) for f in futures]
    for prompt, n, got in zip(prompts, budgets, together):
        alone = engine.generate(prompt, n, 0).result(timeout=120)
        assert [t for t, _, _ in got] == [t for t, _, _ in alone] and len(got) == n
        np.testing.assert_allclose([v for _, v, _ in got], [v for _, v, _ in alone], atol=1e-4, rtol=0)


def test_a_prompt_joining_decoding_rows_takes_slots_ending_where_theirs_end(served):
    """Issue 85, item 5: a prompt admitted while a row decodes is written into the slots that end where the written
    ones end, so no row's slots move on and the cache every decoding step reads stays as wide as its longest row
    (each admitted prompt once widened it by its own width, a few hundred slots for each of REPLUG's passes). Both
    come out as decoded alone."""
    lm, server = served
    engine = server.app.state.engine
    batch = engine._decoding
    long_prompt, short_prompt = lm.tokenizer.encode("Once"), lm.tokenizer.encode(PROMPTS[0])
    written = []  # (slots written before a prompt's admission, after it)
    admit = batch._admit

    def observed_admit():
        before, waiting = batch._length, bool(batch.waiting)
        admit()
        if waiting:
            written.append((before, batch._length))

    batch._admit = observed_admit
    try:
        long = engine.generate(long_prompt, 120, 0)
        deadline = time.time() + 60
        while True:  # under the engine's lock: between two chunks, the long row past the short prompt's width
            with engine.working:
                if written and engine.decoding_rows == 1 and batch._length >= 64:  # the long row admitted, decoding
                    short = engine.generate(short_prompt, 5, 0)
                    break
            assert not long.done(), "the long row ended before the short prompt could join it"
            assert time.time() < deadline
            time.sleep(0.001)
        short_tokens, long_tokens = short.result(timeout=60), long.result(timeout=120)
    finally:
        batch._admit = admit
    assert len(written) == 2 and written[1][0] >= 64, written  # the long prompt's, then the short one's beside it
    assert written[1][1] <= written[1][0], written  # no wider (a repack to 2 rows may compact the long row's slots)
    for prompt, n, got in [(long_prompt, 120, long_tokens), (short_prompt, 5, short_tokens)]:
        alone = engine.generate(prompt, n, 0).result(timeout=120)
        assert [t for t, _, _ in got] == [t for t, _, _ in alone]
        np.testing.assert_allclose([v for _, v, _ in got], [v for _, v, _ in alone], atol=1e-4, rtol=0)


def test_resumed_prompts_pad_their_own_tokens_to_the_length_bucket(served):
    """A prompt resumed from a kept row computes its own tokens padded to their length bucket (150: 160), not to the
    power of two (256): prefill is compute-bound on a CPU, so every padded token costs as a real one."""
    lm, _ = served
    plan = decoding_batch._Resumed.plan([(list(range(200)), 50)], lm)
    assert plan.width == sharding.length_bucket(150, lm.length_multiple, lm.max_length) < 256
    assert plan.inserted >= 200 and plan.slots >= 50 + plan.width


def test_a_generation_finishes_while_scoring_keeps_the_queue_full(served):
    """Issue 85: 3 clients of 16 scoring prompts each (48 in flight, more than a batch's 32 rows) keep the queue from
    ever emptying; a generation beside them finishes while they go on (it waited for the queue to empty: 42.8 s
    against 1.9 s alone), a chunk of its steps between two scoring batches."""
    lm, server = served
    engine = server.app.state.engine
    prompts = [lm.tokenizer.encode(f"{p} and more words here") for p in PROMPTS * 4]  # 16 prompts
    stop, answered = threading.Event(), []

    def client():
        started = time.time()
        while not stop.is_set() and time.time() - started < 120:
            engine.score(prompts).result(timeout=120)
            answered.append(time.time())

    threads = [threading.Thread(target=client) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        deadline = time.time() + 60
        while len(answered) < 3 and time.time() < deadline:  # the load runs (and its programs are compiled)
            time.sleep(0.01)
        generated = engine.generate(lm.tokenizer.encode("Once"), 30, 0).result(timeout=120)
        load_running = not stop.is_set() and all(t.is_alive() for t in threads)
        scored_meanwhile = len(answered)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=120)
    assert len(generated) == 30 and load_running and scored_meanwhile > 3


def prefix_counts(server) -> dict:
    with urllib.request.urlopen(server.url.removesuffix("/v1") + "/health", timeout=10) as reply:
        return json.load(reply)["prefix_cache"]


def test_a_prompt_beginning_as_a_finished_one_starts_from_its_kept_cache(served):
    """Issue 85, item 5: REPLUG's mixture asks a pass again from its prompt, its first tokens and another pass's
    token. That prompt, and one sharing only the first 20 tokens of the earlier one, start from the finished
    generation's kept cache row (GET /health counts the hit and the tokens taken from it) and decode as a full forward
    pass per token does: the kept row's later tokens are forgotten, its positions go on."""
    lm, server = served
    prompt = lm.tokenizer.encode(PROMPTS[2])
    first = [t for t, _, _ in server.app.state.engine.generate(prompt, 12, 3).result(timeout=60)]
    other = next(t for t in range(lm.config.vocab_size) if t != first[5] and t != lm.tokenizer.eos_id)
    asked_again = prompt + first[:5] + [other]
    branching = prompt[:20] + lm.tokenizer.encode(" and then 7 8 9")
    for ids, shared in [(asked_again, len(prompt) + 5), (branching, 20)]:
        before = prefix_counts(server)
        reply = post(server.url, {"prompt": ids, "max_tokens": 12, "temperature": 0, "logprobs": 3})
        after = prefix_counts(server)
        assert after["hits"] == before["hits"] + 1 and after["reused_tokens"] - before["reused_tokens"] >= shared
        check_choice(lm, reply["choices"][0], full_forward_greedy(lm, ids, 12))


def test_the_prefix_cache_keeps_what_its_budget_holds():
    """A budget of one row keeps one row (the least recently used evicted: its prompt asked again is prefilled
    whole); a budget of 0 keeps none."""
    import tempfile

    from replug_jax.server.engine import ScoringEngine

    path = tempfile.mkdtemp()
    hf_tiny.tiny_gpt2(path, positions=256)
    lm = rj.load_lm(path, batch_size=8)
    a, b = lm.tokenizer.encode(PROMPTS[2]), lm.tokenizer.encode(PROMPTS[2].upper())
    sizing = ScoringEngine(lm)
    sizing.generate(a, 4, 0).result(timeout=60)
    one_row = sizing.prefix_cache["bytes"]
    sizing.close()
    for budget, kept in [(one_row, 1), (0, 0)]:
        engine = ScoringEngine(lm, prefix_cache_bytes=budget)
        for ids in (a, b, a + [5]):
            engine.generate(ids, 4, 0).result(timeout=60)
        counts = engine.prefix_cache
        engine.close()
        assert counts["rows"] == kept and counts["bytes"] <= budget and counts["hits"] == 0
        assert counts["evicted"] == (2 if kept else 0)
