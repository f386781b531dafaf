"""The LM as a black box over real HTTP (127.0.0.1 only): our server + HTTPLM agree with the local backend;
faults are retried or refused with a clear error; llama-cpp-python's shifted echo log-probs are detected."""
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

import replug_jax as rj
from replug_jax.lm.http import echo, transport
from replug_jax.lm.http.client import BlackBoxServerError, HTTPLM
from replug_jax.serve import BackgroundServer
from tests import hf_tiny

PAIRS = [("The capital of France is", " Paris."), ("", "Once upon a time"), ("Hello", " world, again!"),
         ("a b c", " d e f"), ("Numbers: 1 2 3", " 4 5")]
KEY = "sk-test-not-a-real-key-0123456789"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("tiny_gpt2"))
    hf_tiny.tiny_gpt2(path, positions=256)
    return path, rj.load_lm(path, batch_size=8)


@pytest.fixture(scope="module")
def tiny_server(tiny):
    server = BackgroundServer(tiny[1])
    yield server
    server.stop()


def local_scores(lm, pairs):
    return lm.score([c for c, _ in pairs], [y for _, y in pairs])


def assert_close(got, want, atol=1e-5):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == np.float32
        np.testing.assert_allclose(g, w, atol=atol, rtol=0)


def test_our_server_matches_local_backend(tiny, tiny_server):
    lm = tiny[1]
    want = local_scores(lm, PAIRS)
    for options in ({}, {"prompt_logprobs": True}, {"prompts_per_request": 3}):
        remote = HTTPLM(tiny_server.url, tokenizer=lm.tokenizer, concurrency=4, **options)
        assert_close(remote.score([c for c, _ in PAIRS], [y for _, y in PAIRS]), want)
        stats = remote.stats()
        assert stats["failures"] == 0 and stats["retries"] == 0 and stats["prompts"] == len(PAIRS)
        assert stats["alignment"].startswith("verified") and "start_text" in stats["start"]
    assert remote.count_tokens("Hello world") == lm.count_tokens("Hello world")
    assert HTTPLM(tiny_server.url).count_tokens("Hello world") == 11  # the server's /tokenize


def test_score_with_query_over_http_equals_local(tiny, tiny_server, proxy):
    """log p(query | context) and the continuation's log-probs from one echoed prompt per triple, as LocalLM's;
    a server scored with text prompts is refused with the fallback named."""
    lm = tiny[1]
    contexts, queries = [c or "" for c, _ in PAIRS], ["Question: where?", " and then", "?", " x y", " 3"]
    continuations = [y for _, y in PAIRS[:-1]] + [""]
    want = lm.score_with_query(contexts, queries, continuations)
    for options in ({}, {"prompt_logprobs": True, "prompts_per_request": 2}):
        remote = HTTPLM(tiny_server.url, tokenizer=lm.tokenizer, **options)
        got = remote.score_with_query(contexts, queries, continuations)
        assert remote.stats()["prompts"] == len(PAIRS)  # one prompt per triple
        for (gq, gc), (wq, wc) in zip(got, want):
            assert_close([gq, gc], [wq, wc])
    proxy.mode = "no_ids"
    with pytest.raises(BlackBoxServerError, match="use the method replug"):
        HTTPLM(proxy.url, tokenizer=lm.tokenizer).score_with_query(contexts[:1], queries[:1], continuations[:1])


def test_posterior_generation_over_http_weighs_as_the_local_prefill(tiny, tiny_server):
    """posterior.generate through a server: x scored in each pass's own prompt tokens (demos, passage, x) by one
    echoed prompt per pass, then generation with the kept passes; the weights and log p(x | demos ∘ d) are the
    local LM's, read in its generation prefill."""
    from replug_jax.method import posterior

    lm = tiny[1]
    x = "Question: who is the mayor?\nAnswer:"
    contexts = [[f"Knowledge: {p}\n{x}" for p in ("Velmora's mayor is Tobias Grint.", "Karsk has a river.",
                                                  "Glass is made in Karsk.")]]
    retrieval = [np.log(np.array([0.5, 0.3, 0.2]))]
    demos = "Knowledge: Karsk.\nQuestion: where?\nAnswer: Karsk\n\n"
    local = posterior.generate(lm, contexts, [x], retrieval, alpha=1.0, keep=2, max_new_tokens=3, shared_prefix=demos)
    remote = HTTPLM(tiny_server.url, tokenizer=lm.tokenizer)
    got = posterior.generate(remote, contexts, [x], retrieval, alpha=1.0, keep=2, max_new_tokens=3,
                             shared_prefix=demos)
    assert remote.stats()["prompts"] == 3  # one echoed prompt per pass (generation's requests are not counted)
    np.testing.assert_allclose(got[0].query_logliks, local[0].query_logliks, atol=1e-4)
    np.testing.assert_allclose(got[0].log_weights, local[0].log_weights, atol=1e-4)
    assert np.isfinite(got[0].log_weights).sum() == 2
    # the same through the HTTP client in a process of its own (the server's /tokenize): it never imports JAX, and
    # its weights (numpy, float64) are the local prefill's
    code = ("import json, sys\nfrom replug_jax.lm.http.client import HTTPLM\nfrom replug_jax.method import posterior\n"
            f"args = json.loads({json.dumps(json.dumps([tiny_server.url, contexts, x, retrieval[0].tolist(), demos]))})\n"
            "url, contexts, x, retrieval, demos = args\n"
            "got = posterior.generate(HTTPLM(url), contexts, [x], [retrieval], alpha=1.0, keep=2, max_new_tokens=3, "
            "shared_prefix=demos)\n"
            "assert 'jax' not in sys.modules, 'jax imported'\nprint(json.dumps(got[0].log_weights))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.returncode == 0, done.stderr[-2000:]
    np.testing.assert_allclose(json.loads(done.stdout.splitlines()[-1]), local[0].log_weights, atol=1e-4)


def test_server_that_adds_a_start_token(tiny):
    """A server conditioning every prompt on the start token: empty contexts are sent alone."""
    lm = tiny[1]
    with BackgroundServer(lm, add_start_token=True) as server:
        remote = HTTPLM(server.url)  # no tokenizer, no start_text: the server's own start token is used
        assert remote.stats()["start"].startswith("the server conditions")
        got = remote.score([c for c, _ in PAIRS], [y for _, y in PAIRS])
    want = lm.score_token_pairs([([lm.start_id] + lm.tokenizer.encode(c), lm.tokenizer.encode(y)) for c, y in PAIRS])
    assert_close(got, want)
    assert_close(got[1:2], local_scores(lm, PAIRS[1:2]))  # empty context: LocalLM's own convention


@pytest.mark.slow  # test_contract.py scores SmolLM2 over our server against local on every kind of split (core)
def test_smollm2_over_http_matches_local(smollm2):
    pairs = [("The capital of France is", " Paris, on the Seine."), ("", "Wikipedia is a free online encyclopedia."),
             ("In 1905 Albert Einstein published", " four papers."), ("Water boils at 100", " degrees Celsius.")]
    want = local_scores(smollm2, pairs)
    with BackgroundServer(smollm2) as server:
        remote = rj.load_lm(server.url, tokenizer=smollm2.tokenizer)
        assert isinstance(remote, HTTPLM) and remote.max_length == smollm2.max_length
        assert_close(remote.score([c for c, _ in pairs], [y for _, y in pairs]), want)
        assert remote.stats()["alignment"].startswith("verified")


def test_load_lm_options_only_for_urls():
    with pytest.raises(TypeError, match="http"):
        rj.load_lm("smollm2", tokenizer="smollm2")
    with pytest.raises(ValueError, match="not an http"):
        HTTPLM("ftp://127.0.0.1/v1")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args: list[str], log_path, **kw) -> subprocess.Popen:
    """A server subprocess with its output in a file (a pipe nobody reads would fill and block it)."""
    with open(log_path, "w") as log:
        return subprocess.Popen([sys.executable, *args], stdout=log, stderr=subprocess.STDOUT, **kw)


def wait_for(url: str, proc: subprocess.Popen, seconds: float, log_path) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: {open(log_path).read()[-2000:]}")
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"{url} did not answer in {seconds}s")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def test_serve_command_line(tiny, tmp_path):
    port, log = free_port(), tmp_path / "serve.log"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
    proc = start(["-m", "replug_jax.serve", "--lm", tiny[0], "--port", str(port), "--batch-size", "2"], log, env=env)
    try:
        wait_for(f"http://127.0.0.1:{port}/health", proc, 60, log)
        remote = rj.load_lm(f"http://127.0.0.1:{port}/v1", tokenizer=tiny[1].tokenizer)
        assert_close(remote.score(["Hello", ""], [" world", "Hi"]), tiny[1].score(["Hello", ""], [" world", "Hi"]))
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as r:
            assert json.load(r)["data"][0]["id"] == tiny[0]
    finally:
        stop(proc)


def test_serve_refuses_a_port_in_use_in_one_line_before_loading_the_model(tiny):
    """A port another program holds: refused at once naming it, before "serving" (uvicorn's "address already in
    use" after the model had loaded and "serving" had been printed, issue 85)."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "replug_jax.serve", "--lm", tiny[0], "--port", str(port)],
                              capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "serving" not in done.stdout, (done.stdout, done.stderr[-2000:])
    error = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(error) == 1 and f"--port {port}" in error[0] and "in use" in error[0], done.stderr[-2000:]


# ---- fault injection: a deliberately faulty proxy in front of our server -------------------------------------


class FaultyProxy:
    """http.server forwarding to `upstream`; completions requests get `script` faults first, then `mode`."""

    def __init__(self, upstream: str):
        self.upstream, self.script, self.mode, self.auth = upstream.rsplit("/v1", 1)[0], [], "ok", []
        self.in_flight = self.most_in_flight = 0  # completions requests being answered at once
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                self.forward(None)

            def do_POST(self):
                self.forward(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))

            def reply(self, status, payload, headers=()):
                data = json.dumps(payload).encode()
                self.send_response(status)
                for k, v in headers:
                    self.send_header(k, v)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def forward(self, body):
                proxy.auth.append(self.headers.get("Authorization"))
                fault, completions = "ok", self.path.endswith("/completions")
                with proxy.lock:
                    if completions:
                        fault = proxy.script.pop(0) if proxy.script else proxy.mode
                        proxy.in_flight += 1
                        proxy.most_in_flight = max(proxy.most_in_flight, proxy.in_flight)
                try:
                    proxy.apply(self, fault, body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout fault)
                finally:
                    with proxy.lock:
                        proxy.in_flight -= completions

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def apply(self, handler, fault, body):
        if fault.isdigit():
            return handler.reply(int(fault), {"error": {"message": f"injected {fault}; saw {handler.headers.get('Authorization')}"}})
        if fault.startswith("429"):
            return handler.reply(429, {"error": {"message": "slow down"}}, [("Retry-After", fault[4:] or "0")])
        if fault == "timeout":
            time.sleep(1.0)
        if fault == "slow":  # a remote server's round trip
            time.sleep(0.2)
        prompt = (body or {}).get("prompt")
        texts = isinstance(prompt, str) or all(isinstance(p, str) for p in prompt or [])
        if fault == "no_lists" and isinstance(prompt, list) and len(prompt) > 1 and isinstance(prompt[0], (str, list)):
            return handler.reply(500, {"error": {"message": "list prompts are not supported"}})  # llama-cpp-python's
        if fault == "no_ids" and not texts:
            return handler.reply(400, {"error": {"message": "'prompt' must be a string or a list of strings"}})
        if fault == "refuse0" and body.get("max_tokens") == 0:
            return handler.reply(400, {"error": {"message": "max_tokens must be at least 1"}})
        if fault == "gen0" and body.get("max_tokens") == 0:
            body = {**body, "max_tokens": 2}
        if fault == "refuse_echo_from" and "echo_from" in body:  # as OpenAI's API refuses a field it does not know
            return handler.reply(400, {"error": {"message": "Unrecognized request argument supplied: echo_from"}})
        if fault == "ignore_echo_from" and body:  # a server without the extension: every prompt token's log-prob
            body = {k: v for k, v in body.items() if k != "echo_from"}
        request = urllib.request.Request(self.upstream + handler.path, data=None if body is None else json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as r:
            payload = json.load(r)
        for choice in payload.get("choices", []) if body and body.get("echo") else []:
            lp = choice["logprobs"]
            if fault == "drop":
                choice["logprobs"] = None
            elif fault == "null":
                lp["token_logprobs"] = [None] * len(lp["token_logprobs"])
            elif fault == "shift":  # entry i holds the value of token i + 1
                lp["token_logprobs"] = [None] + lp["token_logprobs"][2:] + [-0.5]
            elif fault == "needs_top" and body.get("logprobs") == 0:  # a server that echoes nothing at logprobs=0
                choice["logprobs"] = None
        handler.reply(200, payload)

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def proxy(tiny_server):
    p = FaultyProxy(tiny_server.url)
    yield p
    p.stop()


def client(proxy, tiny, **kw):
    remote = HTTPLM(proxy.url, tokenizer=tiny[1].tokenizer, backoff=0.02, **{"prompts_per_request": 1, **kw})
    remote.score([c for c, _ in PAIRS], [y for _, y in PAIRS])  # warm: every shape compiled upstream
    remote.timeout = kw.get("timeout", 0.5)
    return remote, remote.stats()


def test_prompts_go_in_batches_where_the_server_answers_lists_exactly(tiny, tiny_server, proxy):
    """The probe sends two pairs alone and as one list: our server answers the list with the same numbers, so
    scoring sends BATCH_PROMPTS prompts a request; a server answering a list with HTTP 500 (as llama-cpp-python's
    does) gets one prompt a request, found in one try (no retries, no failures). Same scores either way."""
    from replug_jax.lm.http.client import BATCH_PROMPTS

    pairs = PAIRS * 7  # more than one batch
    want = local_scores(tiny[1], pairs)
    batched = HTTPLM(tiny_server.url, tokenizer=tiny[1].tokenizer)
    assert batched.prompts_per_request == BATCH_PROMPTS and batched.stats()["prompts_per_request"].startswith("16:")
    before = batched.stats()["requests"]
    assert_close(batched.score([c for c, _ in pairs], [y for _, y in pairs]), want)
    assert batched.stats()["requests"] - before == -(-len(pairs) // BATCH_PROMPTS)
    proxy.mode = "no_lists"
    single = HTTPLM(proxy.url, tokenizer=tiny[1].tokenizer, backoff=0.02)
    stats = single.stats()
    assert single.prompts_per_request == 1 and "refused a list" in stats["prompts_per_request"]
    assert stats["retries"] == 0 and stats["failures"] == 0 and stats["prompts"] == 0  # the probe's prompts uncounted
    before = stats["requests"]
    assert_close(single.score([c for c, _ in pairs], [y for _, y in pairs]), want)
    assert single.stats()["requests"] - before == len(pairs)
    assert HTTPLM(proxy.url, tokenizer=tiny[1].tokenizer, prompts_per_request=3).stats()["prompts_per_request"] == \
        "3 (as given)"
    with pytest.raises(ValueError, match="prompts_per_request"):
        HTTPLM(tiny_server.url, tokenizer=tiny[1].tokenizer, prompts_per_request=0)
    from ml_collections import config_dict

    from replug_jax.jobs import prepare

    config = config_dict.ConfigDict({"lm": tiny_server.url, "lm_batch_size": 4, "lm_max_length": 0,
                                     "lm_prompts_per_request": 3})
    assert prepare.load_job_lm(config, None).prompts_per_request == 3  # the config key reaches the client


def test_retries_then_success(proxy, tiny):
    remote, before = client(proxy, tiny, concurrency=2)
    proxy.script = ["500", "429", "timeout", "502"]
    assert_close(remote.score([c for c, _ in PAIRS], [y for _, y in PAIRS]), local_scores(tiny[1], PAIRS))
    after = remote.stats()
    assert after["retries"] - before["retries"] == 4 and after["failures"] == 0
    assert after["requests"] - before["requests"] == len(PAIRS) + 4


def test_retry_after_is_honoured(proxy, tiny):
    remote, _ = client(proxy, tiny)
    proxy.script = ["429:1"]
    start = time.time()
    remote.score(["Hello"], [" world"])
    assert time.time() - start >= 0.95 and remote.stats()["retries"] == 1


def test_persistent_500_is_a_clear_error_and_the_key_stays_secret(proxy, tiny, monkeypatch, caplog):
    monkeypatch.setenv("REPLUG_TEST_KEY", KEY)
    remote, before = client(proxy, tiny, api_key_env="REPLUG_TEST_KEY", max_retries=2, concurrency=2)
    assert proxy.auth[-1] == f"Bearer {KEY}"
    proxy.mode = "500"
    with pytest.raises(BlackBoxServerError, match="failed after 2 retries; last error: HTTP 500") as info:
        remote.score([c for c, _ in PAIRS], [y for _, y in PAIRS])
    after = remote.stats()
    assert after["failures"] >= 1 and after["retries"] - before["retries"] >= 2
    assert KEY not in str(info.value) and "***" in str(info.value)  # the server echoed it: redacted
    assert KEY not in caplog.text and KEY not in repr(remote)


def test_client_errors_are_not_retried(proxy, tiny):
    remote, _ = client(proxy, tiny)
    proxy.mode = "400"
    with pytest.raises(BlackBoxServerError, match="HTTP 400 \\(not retried\\)"):
        remote.score(["Hello"], [" world"])
    assert remote.stats()["retries"] == 0


def test_connection_refused_after_retries():
    remote = HTTPLM(f"http://127.0.0.1:{free_port()}/v1", max_retries=1, backoff=0.01, probe=False)
    with pytest.raises(BlackBoxServerError, match="failed after 1 retries"):  # a server gone after first contact
        remote.score(["Hello"], [" world"])


def test_a_dead_address_fails_in_seconds_naming_it():
    """Nothing listening (connection refused): refused after 3 tries over 0.75 s, not after the probe's retries
    with backoff (52 s before), by HTTPLM and by the REPLUG object (before its encoder loads)."""
    url = f"http://127.0.0.1:{free_port()}/v1"
    for build in (lambda: HTTPLM(url), lambda: rj.REPLUG.from_documents(["a document"], lm=url)):
        started = time.time()
        with pytest.raises(BlackBoxServerError, match=f"nothing is listening at 127.0.0.1:{url.split(':')[2][:-3]}"):
            build()
        assert time.time() - started < 10


def test_a_server_url_is_an_lm_for_the_replug_object(tiny, tiny_server, minilm):
    """REPLUG.from_documents(lm=URL): passages cut with the server's /tokenize (which has no character offsets),
    or with tokenizer=, are the local LM's; the LM's and the REPLUG scores are the local LM's (an empty context:
    the document-start token the probe found, through the server's /tokenize)."""
    from replug_jax.retrieval.datastore import Document, chunk_documents

    docs = ["Velmora is a town in the hills. Its mayor is Tobias Grint, elected in 2019.",
            "The river Oster flows through Karsk.", "Karsk is known for its bridges and its annual fish market."]
    want = chunk_documents([Document(f"doc{i}", "", d) for i, d in enumerate(docs)], tiny[1].tokenizer,
                           chunk_tokens=24)
    assert len(want) > len(docs)  # several passages per document
    for tokenizer in (None, tiny[1].tokenizer):
        remote = rj.REPLUG.from_documents(docs, lm=tiny_server.url, encoder=minilm, k=2, doc_tokens=24,
                                          tokenizer=tokenizer)
        assert remote.lm.stats()["tokenizer"] == ("the server's /tokenize" if tokenizer is None else "local")
        assert remote.datastore.texts == want.texts and remote.datastore.ids == want.ids
        assert_close(local_scores(remote.lm, PAIRS), local_scores(tiny[1], PAIRS))  # an empty context too
    local = rj.REPLUG(tiny[1], remote.retriever, remote.datastore, k=2)
    assert_close([remote.score("The mayor of Velmora is", " Tobias Grint")],
                 [local.score("The mayor of Velmora is", " Tobias Grint")])
    with pytest.raises(TypeError, match="server URL"):
        rj.REPLUG.from_documents(docs, lm=tiny[1], encoder=minilm, tokenizer=tiny[1].tokenizer)


def test_dropped_logprobs_are_refused_at_probe_and_later(proxy, tiny):
    proxy.mode = "drop"
    with pytest.raises(BlackBoxServerError, match="returned no prompt log-probabilities"):
        HTTPLM(proxy.url, tokenizer=tiny[1].tokenizer)
    proxy.mode = "null"
    with pytest.raises(BlackBoxServerError, match="returned no prompt log-probabilities"):
        HTTPLM(proxy.url, tokenizer=tiny[1].tokenizer)
    proxy.mode = "ok"
    remote, _ = client(proxy, tiny)
    for mode, message in (("drop", "returned no prompt log-probabilities"), ("null", "no log-probability for")):
        proxy.mode = mode
        with pytest.raises(BlackBoxServerError, match=message):
            remote.score([c for c, _ in PAIRS], [y for _, y in PAIRS])
    assert remote.stats()["failures"] >= 2


def test_shifted_server_is_refused(proxy, tiny):
    proxy.mode = "shift"
    with pytest.raises(BlackBoxServerError, match="shifted by one position"):
        HTTPLM(proxy.url, tokenizer=tiny[1].tokenizer)


@pytest.mark.parametrize("mode", ["refuse0", "gen0"])
def test_max_tokens_zero_fallback(proxy, tiny, mode):
    proxy.mode = mode
    remote = HTTPLM(proxy.url, tokenizer=tiny[1].tokenizer)
    assert remote.stats()["max_tokens"].startswith("max_tokens=1")
    assert_close(remote.score([c for c, _ in PAIRS], [y for _, y in PAIRS]), local_scores(tiny[1], PAIRS))


def test_the_probe_sends_requests_that_wait_on_no_answer_side_by_side(tiny, tiny_server, proxy):
    """Each request costs a server far away a round trip: the probe's independent requests go out together (the
    top log-probs, max_tokens and next-token requests; then how to ask for scores and generations: 9 at once) and
    find what one request at a time finds."""
    lm = tiny[1]
    proxy.mode = "slow"
    remote = HTTPLM(proxy.url, tokenizer=lm.tokenizer)
    direct = HTTPLM(tiny_server.url, tokenizer=lm.tokenizer)
    assert proxy.most_in_flight >= 6, proxy.most_in_flight
    assert {k: v for k, v in remote.stats().items() if k != "requests"} == \
        {k: v for k, v in direct.stats().items() if k != "requests"}
    assert_close(remote.score([c for c, _ in PAIRS], [y for _, y in PAIRS]), local_scores(lm, PAIRS))


def test_a_server_answering_429_to_the_probes_requests_at_once_is_waited_out(tiny, tiny_server):
    """A server that takes one request at a time answers the others 429 (Retry-After: 1): the probe's one-try
    requests wait it out instead of reading it as a feature refused, and find what one at a time finds."""
    with BackgroundServer(tiny[1], max_concurrent=1) as one_at_a_time:
        remote = HTTPLM(one_at_a_time.url, tokenizer=tiny[1].tokenizer)
    direct = HTTPLM(tiny_server.url, tokenizer=tiny[1].tokenizer)
    assert remote.stats()["retries"] > 0  # it was told to wait
    assert {k: v for k, v in remote.stats().items() if k not in ("requests", "retries")} == \
        {k: v for k, v in direct.stats().items() if k not in ("requests", "retries")}


def test_scoring_asks_logprobs_0_where_the_server_allows_it(tiny, tiny_server, proxy):
    """Echoed log-probs need no alternatives: logprobs=0 where the server answers it with the same numbers (our
    server then computes no top-k per echoed token), 1 where it does not, as given when given; the same scores."""
    lm = tiny[1]
    want = local_scores(lm, PAIRS)
    for url, options, chosen in ((tiny_server.url, {}, "0:"), (tiny_server.url, {"logprobs": 1}, "1 (as given)"),
                                 (proxy.url, {}, "1: the server")):
        proxy.mode = "needs_top"
        remote = HTTPLM(url, tokenizer=lm.tokenizer, **options)
        assert remote.stats()["logprobs"].startswith(chosen) and remote.logprobs == int(chosen[0])
        assert_close(remote.score([c for c, _ in PAIRS], [y for _, y in PAIRS]), want)


def test_scoring_sends_echo_from_only_where_the_server_honours_it(tiny, tiny_server, proxy):
    """Our server computes a prompt's log-probs from its continuation on (`echo_from`, docs/http.md): the client
    sends it there, and never to a server that ignores the field or refuses it (as OpenAI's API refuses a field it
    does not know); the same scores every way."""
    lm = tiny[1]
    want = local_scores(lm, PAIRS)
    for mode, finding in (("ok", "sent:"), ("ignore_echo_from", "not sent: the server ignores it"),
                          ("refuse_echo_from", "not sent: the server refused it")):
        proxy.mode = mode
        remote = HTTPLM(proxy.url, tokenizer=lm.tokenizer)
        assert remote.stats()["echo_from"].startswith(finding) and remote.echo_from == (mode == "ok")
        assert_close(remote.score([c for c, _ in PAIRS], [y for _, y in PAIRS]), want)
        assert remote.stats()["failures"] == 0


def test_server_refusing_token_prompts_gets_text_and_says_so(proxy, tiny):
    proxy.mode = "no_ids"
    remote = HTTPLM(proxy.url, tokenizer=tiny[1].tokenizer)
    assert remote.stats()["prompt_format"].startswith("text (the server refused token-id prompts")
    assert_close(remote.score([c for c, _ in PAIRS], [y for _, y in PAIRS]), local_scores(tiny[1], PAIRS))
    with pytest.raises(BlackBoxServerError, match="token_prompts=True but the server refused"):
        HTTPLM(proxy.url, tokenizer=tiny[1].tokenizer, token_prompts=True)


def test_vllm_prompt_logprobs_with_a_start_token():
    choice = {"prompt_logprobs": [None, {"9": {"logprob": -1.5, "decoded_token": "Hello"}},
                                  {"7": {"logprob": -0.25, "decoded_token": " world"}}]}
    parsed = echo.parse_prompt_logprobs(choice, "Hello world")
    assert parsed.starts == [0, 0, 5] and parsed.ends == [0, 5, 11] and parsed.logprobs == [None, -1.5, -0.25]
    assert transport.retry_after_seconds("2") == 2.0 and transport.retry_after_seconds(None) is None



def test_a_vllm_entrys_value_is_its_first_option_whatever_the_ranks():
    """vLLM lists the prompt token first, then the top ones: the first option's value is taken, not a rank's."""
    entry = {"5": {"logprob": -3.0, "rank": 12, "decoded_token": "a"}, "8": {"logprob": -0.5, "rank": 1},
             "2": {"logprob": -1.0, "rank": 2}}
    last = {"4": {"logprob": -2.0, "rank": None}, "1": {"logprob": -0.1, "rank": 1}}  # no rank: past the top
    choice = {"prompt_logprobs": [None, entry, last]}
    assert echo.id_prompt_values(choice, 3, 0, 0, True) == [None, -3.0, -2.0]

# ---- a real third-party server: llama-cpp-python ----------------------------------------------------------------


@pytest.fixture(scope="module")
def llama_cpp_server(tmp_path_factory):
    """llama-cpp-python's OpenAI-compatible server on the packaged SmolLM2 GGUF: its /v1 URL."""
    pytest.importorskip("llama_cpp.server.app", reason="pip install 'llama-cpp-python[server]==0.3.36'")
    from replug_jax.models.registry import packaged_path

    port, log = free_port(), tmp_path_factory.mktemp("llama_cpp") / "llama.log"
    proc = start(["-m", "llama_cpp.server", "--model", packaged_path("smollm2"), "--host", "127.0.0.1",
                  "--port", str(port), "--n_ctx", "512", "--n_threads", "2"], log)
    try:
        wait_for(f"http://127.0.0.1:{port}/v1/models", proc, 60, log)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        stop(proc)


def test_llama_cpp_python_server_shift_is_detected(llama_cpp_server):
    with pytest.raises(BlackBoxServerError, match="shifted by one position"):
        HTTPLM(llama_cpp_server)


def test_server_api_key(tiny, monkeypatch):
    monkeypatch.setenv("REPLUG_TEST_KEY", KEY)
    with BackgroundServer(tiny[1], api_key=KEY) as server:
        remote = HTTPLM(server.url, api_key_env="REPLUG_TEST_KEY")
        assert_close(remote.score(["Hello"], [" world"]), tiny[1].score(["Hello"], [" world"]))
        with pytest.raises(BlackBoxServerError, match="HTTP 401 \\(not retried\\)") as info:
            HTTPLM(server.url, api_key_env="REPLUG_NO_SUCH_VARIABLE")
        assert KEY not in str(info.value)


def test_no_local_tokenizer_scores_exactly_through_the_servers_tokenize(smollm2):
    """Without tokenizer= the server's /tokenize builds token-id prompts: a split inside a word scores as LocalLM
    does (text prompts would re-tokenise the joined word, off by nats)."""
    pairs = [("The capital of Fra", "nce is Paris."), ("Photosynth", "esis makes sugar."), ("Hello", " world")]
    want = local_scores(smollm2, pairs)
    with BackgroundServer(smollm2) as server:
        remote = HTTPLM(server.url)
        assert remote.stats()["tokenizer"] == "the server's /tokenize"
        assert remote.stats()["prompt_format"].startswith("token ids")
        got = remote.score([c for c, _ in pairs], [y for _, y in pairs])
        text = HTTPLM(server.url, token_prompts=False).score([c for c, _ in pairs], [y for _, y in pairs])
    assert_close(got, want)
    assert [len(g) for g in got] == [len(smollm2.tokenizer.encode(y)) for _, y in pairs]
    assert max(abs(float(np.sum(t)) - float(np.sum(w))) for t, w in zip(text, want)) > 0.5  # what text prompts cost


@pytest.mark.parametrize("server_start", ["every prompt", "text prompts only"])
def test_servers_adding_a_start_token_either_way_score_by_the_contract(tiny, server_start):
    """llama.cpp conditions every prompt on its start token; vLLM (we believe) adds it to text prompts only and takes
    token-id prompts as they are. With the model's tokenizer both are accepted; with token ids taken as they are,
    every pair (an empty context included: the document-start token, as the contract says) equals LocalLM."""
    lm = tiny[1]
    options = {"add_start_token": True} if server_start == "every prompt" else {"start_token_on_text": True}
    with BackgroundServer(lm, **options) as server:
        remote = HTTPLM(server.url, tokenizer=lm.tokenizer)
        assert remote.stats()["prompt_format"].startswith("token ids")
        got = remote.score([c for c, _ in PAIRS], [y for _, y in PAIRS])
    if server_start == "every prompt":  # the server's own start token precedes every context
        want = lm.score_token_pairs([([lm.start_id] + lm.tokenizer.encode(c), lm.tokenizer.encode(y)) for c, y in PAIRS])
    else:
        want = local_scores(lm, PAIRS)
    assert_close(got, want)
    assert_close(got[1:2], local_scores(lm, PAIRS[1:2]))  # empty context: LocalLM's own convention either way


def test_llama_cpp_python_server_decodes_a_mid_word_split_as_local(llama_cpp_server, smollm2):
    """The third-party server (its echo is refused above, so no probe; it takes text prompts only): contexts ending
    inside a word, decoded by llama.cpp through the client's generation path, give LocalLM's greedy tokens and
    log-probs (its own quantised kernels: within 0.3 nats), and the per-token mixture over two passes the local mixture's tokens.
    A generation prompt is one text tokenised alone, so text and token ids agree here (unlike a scored split)."""
    contexts = [["The capital of Fra"], ["Photosynth"]]  # mid-word: text prompts would re-tokenise the word
    mixed = [["Paris is the capital of Fra", "The Eiffel Tower is in the capital of Fra"]]
    remote = HTTPLM(llama_cpp_server, tokenizer=smollm2.tokenizer, probe=False, token_prompts=False)
    got = remote.generate(contexts, [[0.0], [0.0]], max_new_tokens=6, stop=("\n",))
    got_mixed = remote.generate(mixed, [np.log([0.7, 0.3])], max_new_tokens=6, stop=("\n",), top_n=5)
    local = smollm2.generate(contexts, [[0.0], [0.0]], max_new_tokens=6, stop=("\n",))
    # llama.cpp's kernels are not ours: greedy paths may part at a near-tie after a few tokens, so the first three
    for g, w in zip(got, local):
        assert g.token_ids[:3] == w.token_ids[:3], (g.text, w.text)
        np.testing.assert_allclose(g.logprobs[:3], w.logprobs[:3], atol=0.3)  # measured up to 0.23
    assert not got[0].text.startswith(" ") and not got[1].text.startswith(" ")  # the split words are completed
    local_mixed = smollm2.generate(mixed, [np.log([0.7, 0.3])], max_new_tokens=6, stop=("\n",))[0]
    assert got_mixed[0].token_ids[:3] == local_mixed.token_ids[:3], (got_mixed[0].text, local_mixed.text)


BEYOND_ASCII = [(["Knowledge: Київ — столиця України.\nQuestion: Яка столиця України?\nAnswer:",
                  "Knowledge: Львів — місто на заході України.\nQuestion: Яка столиця України?\nAnswer:"], [0.6, 0.4]),
                (["Knowledge: 東京は日本の首都です。\nQuestion: 日本の首都は?\nAnswer:",
                  "Knowledge: Tokyo (東京) is the capital of Japan.\nQuestion: 日本の首都は?\nAnswer:"], [0.5, 0.5])]


def test_llama_cpp_python_server_mixtures_beyond_ascii_are_whole_or_refused(llama_cpp_server, smollm2):
    """llama.cpp names generated tokens by their text, a split character's bytes dropped: a two-pass mixture over
    Cyrillic and Japanese prompts gives whole characters, or is refused at the split character naming the fix; never
    a garbled answer (issue 85: ' 1. 2. 3.' for a Ukrainian answer, ' ' for a Japanese one came back)."""
    from replug_jax.models.detokenize import UNFINISHED

    remote = HTTPLM(llama_cpp_server, tokenizer=smollm2.tokenizer, probe=False, token_prompts=False)
    refused = []
    for contexts, weights in BEYOND_ASCII:
        try:
            got = remote.generate([contexts], [np.log(weights)], max_new_tokens=6, stop=("\n",), top_n=5)[0]
        except BlackBoxServerError as e:
            assert "part of a character" in str(e) and "vote" in str(e), e
            refused.append(contexts[0][-30:])
            continue
        assert UNFINISHED not in got.text and got.text.strip(), got.text
    assert refused and remote.stats()["split_characters"] == len(refused), refused


def _raw_http(port: int, head: str, body: bytes = b"", timeout: float = 10) -> tuple[int, dict]:
    """(status, JSON body) of one raw HTTP/1.1 request on loopback (the body may be cut short of its length)."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(head.encode() + body)
        reply = sock.makefile("rb").read()
    status = int(reply.split(b" ", 2)[1])
    return status, json.loads(reply.split(b"\r\n\r\n", 1)[1] or b"{}")


def test_server_refuses_huge_bodies_and_too_many_prompts_while_health_answers(tiny):
    """A 50 MB body is refused with 413 at once (before it is read) while /health answers, a chunked body that grows
    past the limit gets 413 too, too many prompts get 400, and the server still scores."""
    import threading
    import time

    with BackgroundServer(tiny[1], max_body_bytes=1 << 20, max_prompts=4) as server:
        port = int(server.url.rsplit(":", 1)[1].split("/")[0])
        head = ("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {50 << 20}\r\nConnection: close\r\n\r\n")
        health = {}
        checker = threading.Thread(target=lambda: health.update(
            status=_raw_http(port, "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")))
        started = time.time()
        checker.start()
        status, body = _raw_http(port, head)  # the length is declared; the body never needs to be sent
        checker.join()
        assert status == 413 and "larger than 1048576 bytes" in body["error"]["message"]
        code, answer = health["status"]
        assert time.time() - started < 5 and code == 200 and answer["status"] == "ok"
        chunked = ("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")  # no length declared: it grows
        piece = b"4" * (256 << 10)
        status, body = _raw_http(port, chunked, b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for _ in range(5))
                                 + b"0\r\n\r\n")
        assert status == 413 and "larger than 1048576 bytes" in body["error"]["message"]
        request = urllib.request.Request(server.url + "/completions", method="POST",
                                         data=json.dumps({"prompt": ["a"] * 5, "max_tokens": 0}).encode())
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(request, timeout=10)
        assert info.value.code == 400 and "5 prompts in one request: at most 4" in info.value.read().decode()
        remote = rj.load_lm(server.url, tokenizer=tiny[1].tokenizer)
        assert_close(remote.score(["Hello"], [" world"]), tiny[1].score(["Hello"], [" world"]))


def test_serve_refuses_a_public_address_without_a_key(tiny, capsys):
    from replug_jax import serve

    assert serve.is_loopback("127.0.0.1") and serve.is_loopback("::1") and serve.is_loopback("localhost")
    assert not serve.is_loopback("0.0.0.0") and not serve.is_loopback("10.0.0.2")
    with pytest.raises(SystemExit):
        serve.main(["--lm", tiny[0], "--host", "0.0.0.0"])
    assert "require a key with --api-key-env" in capsys.readouterr().err


def test_http_fingerprint_is_the_cache_key_of_what_changes_a_score(tiny, tiny_server, tmp_path):
    """HTTPLM's fingerprint (the LM-score cache key): stable for the same server, model and tokenizer; different
    for another server URL, window or tokenizer; a CachedLM over it answers a second run from disk."""
    from replug_jax.lm.cache import CachedLM

    same = [rj.load_lm(tiny_server.url, tokenizer=tiny[1].tokenizer) for _ in range(2)]
    assert same[0].fingerprint() == same[1].fingerprint()
    other_window = rj.load_lm(tiny_server.url, tokenizer=tiny[1].tokenizer, max_length=64)
    assert other_window.fingerprint() != same[0].fingerprint()
    with BackgroundServer(tiny[1]) as second:
        assert rj.load_lm(second.url, tokenizer=tiny[1].tokenizer).fingerprint() != same[0].fingerprint()
    text_prompts = rj.load_lm(tiny_server.url)  # no local tokenizer: the server's /tokenize builds the prompts
    assert text_prompts.fingerprint() != same[0].fingerprint()
    path = str(tmp_path / "cache.sqlite")
    first = CachedLM(same[0], path)
    want = first.score(["Hello"], [" world"])
    first.close()
    again = CachedLM(same[1], path)
    assert_close(again.score(["Hello"], [" world"]), want)
    assert (again.hits, again.misses) == (1, 0)
    again.close()


def _post(url: str, body, method: str = "POST") -> tuple[int, dict, dict]:
    """(status, JSON body, headers) of one request to our server; `body` a dict or raw bytes."""
    data = body if isinstance(body, bytes) else None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, json.load(r), r.headers
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read()), e.headers


def test_server_refusals_are_openai_json_errors(tiny_server):
    """An unknown model is OpenAI's 404 model_not_found; sampling (temperature > 0) is refused, since the server
    decodes greedily; a deeply nested body is a 400, not a 500; an unknown path (chat) a JSON 404."""
    url = tiny_server.url
    served = _post(url + "/models", None, "GET")[1]["data"][0]["id"]
    assert _post(url + "/completions", {"prompt": "Hi", "max_tokens": 1, "model": served})[0] == 200
    status, body, _ = _post(url + "/completions", {"prompt": "Hi", "model": "gpt-4o"})
    assert status == 404 and body["error"]["code"] == "model_not_found" and "gpt-4o" in body["error"]["message"]
    status, body, _ = _post(url + "/completions", {"prompt": "Hi", "max_tokens": 2, "temperature": 0.9})
    assert status == 400 and "decodes greedily" in body["error"]["message"]
    assert body["error"]["param"] == "temperature"
    assert _post(url + "/completions", {"prompt": "Hi", "max_tokens": 0, "temperature": 0.9})[0] == 200
    status, body, _ = _post(url + "/completions", b"[" * 100_000 + b"]" * 100_000)
    assert status == 400 and "nested too deeply" in body["error"]["message"]
    status, body, _ = _post(url + "/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]})
    assert status == 404 and "/v1/completions" in body["error"]["message"]
    assert _post(url + "/completions", None, "GET")[0] == 405
    assert _post(url + "/tokenize", {"prompt": "Hi", "model": "other"})[0] == 404


def test_server_caps_prompt_tokens_responses_and_concurrent_requests(tiny):
    """Too many prompt tokens in one request (ids or text) and a too large response get 400; a request beyond the
    concurrency limit gets 429 with Retry-After while the one in flight is answered."""
    with BackgroundServer(tiny[1], max_prompt_tokens=50, max_response_bytes=4000, max_concurrent=1) as server:
        url = server.url + "/completions"
        status, body, _ = _post(url, {"prompt": [[5] * 30, [6] * 30], "max_tokens": 0})
        assert status == 400 and "60 prompt tokens in one request: at most 50" in body["error"]["message"]
        assert _post(url, {"prompt": "word " * 60, "max_tokens": 0})[0] == 400
        status, body, _ = _post(url, {"prompt": [7] * 40, "max_tokens": 0, "echo": True, "logprobs": 20})
        assert status == 400 and "over this server's limit of 4000" in body["error"]["message"]
        assert _post(url, {"prompt": [7] * 40, "max_tokens": 0, "echo": True, "logprobs": 0})[0] == 200
        port = int(server.url.rsplit(":", 1)[1].split("/")[0])
        payload = json.dumps({"prompt": "Hi", "max_tokens": 0}).encode()
        with socket.create_connection(("127.0.0.1", port), timeout=30) as first:
            first.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n").encode() + payload[:3])
            deadline = time.time() + 10
            while (answer := _post(url, {"prompt": "Hi", "max_tokens": 0}))[0] != 429 and time.time() < deadline:
                time.sleep(0.05)  # until the server has taken the first request in
            status, body, headers = answer
            assert status == 429 and headers.get("Retry-After") == "1" and body["error"]["type"] == "rate_limit_error"
            first.sendall(payload[3:])
            assert first.makefile("rb").readline().split()[1] == b"200"
        assert _post(url, {"prompt": "Hi", "max_tokens": 0})[0] == 200


def test_echoed_tokens_get_their_positions_real_top_logprobs(tiny, tiny_server):
    """Echoed prompt tokens carry the top-`logprobs` of their position, as generated tokens do: the entry after the
    prompt equals the generated token's; vLLM's prompt_logprobs: k lists the token and the top k with ranks."""
    lm, url = tiny[1], tiny_server.url + "/completions"
    ids = lm.tokenizer.encode("The capital of France is")
    generated = _post(url, {"prompt": ids, "max_tokens": 1, "logprobs": 3})[1]["choices"][0]["logprobs"]
    status, body, _ = _post(url, {"prompt": ids + [lm.tokenizer.encode(generated["tokens"][0])[0]], "max_tokens": 0,
                                  "echo": True, "logprobs": 3})
    echoed = body["choices"][0]["logprobs"]
    assert status == 200 and echoed["top_logprobs"][0] is None and len(echoed["top_logprobs"]) == len(ids) + 1
    last, want = echoed["top_logprobs"][-1], generated["top_logprobs"][0]
    assert list(last) == list(want) and np.allclose(list(last.values()), list(want.values()), atol=1e-4)
    for token, value, top in zip(echoed["tokens"][1:], echoed["token_logprobs"][1:], echoed["top_logprobs"][1:]):
        values = list(top.values())
        # tokens decoding to the same text (byte pieces: "\ufffd") share a key, as in OpenAI's format
        assert 1 <= len(top) <= 3 and values == sorted(values, reverse=True) and values[0] >= value - 1e-4
        assert token not in top or abs(top[token] - value) < 1e-4
    entries = _post(url, {"prompt": ids, "max_tokens": 1, "prompt_logprobs": 2})[1]["choices"][0]["prompt_logprobs"]
    assert entries[0] is None and all(2 <= len(e) <= 3 for e in entries[1:])
    ranked = sorted((v["rank"], v["logprob"]) for e in entries[1:] for v in e.values() if v["rank"] in (1, 2))
    assert len(ranked) == 2 * (len(ids) - 1)


def test_a_public_address_needs_a_key_in_the_library_too(tiny, tiny_server):
    """BackgroundServer refuses a non-loopback host without a key; make_app's app answers a request that reached
    it on a non-loopback address with 403 when it has no key (however it is served)."""
    import asyncio

    with pytest.raises(ValueError, match="require a key"):
        BackgroundServer(tiny[1], host="0.0.0.0")
    sent = []

    async def call(server):
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
                 "path": "/v1/models", "raw_path": b"/v1/models", "query_string": b"", "headers": [],
                 "server": server, "client": ("10.0.0.9", 40000), "scheme": "http", "root_path": ""}
        messages = [{"type": "http.request", "body": b"", "more_body": False}]

        async def receive():
            return messages.pop(0) if messages else {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)

        await tiny_server.app(scope, receive, send)
        return sent.pop(0)["status"], json.loads(b"".join(m.get("body", b"") for m in sent))

    status, body = asyncio.run(call(("10.0.0.2", 8000)))
    assert status == 403 and "loopback" in body["error"]["message"]
    sent.clear()
    assert asyncio.run(call(("127.0.0.1", 8000)))[0] == 200


def test_a_response_over_the_cap_is_refused_before_the_model_runs(tiny, monkeypatch):
    """The response cap is checked from the request (prompt and generated tokens × log-probs asked) before any
    scoring or decoding: no work reaches the engine for a refused request; one under the cap is answered."""
    with BackgroundServer(tiny[1], max_response_bytes=4000) as server:
        url, engine, jobs = server.url + "/completions", server.app.state.engine, []
        submit = engine._submit
        monkeypatch.setattr(engine, "_submit", lambda kind, payload: jobs.append(kind) or submit(kind, payload))
        for body in ({"prompt": [7] * 40, "max_tokens": 0, "echo": True, "logprobs": 20},
                     {"prompt": [7] * 40, "max_tokens": 0, "prompt_logprobs": 20},
                     {"prompt": [[7] * 2, [8] * 2], "max_tokens": 16, "logprobs": 20}):
            status, answer, _ = _post(url, body)
            assert status == 400 and "over this server's limit of 4000" in answer["error"]["message"], answer
            assert jobs == [], body
        assert _post(url, {"prompt": [7] * 40, "max_tokens": 0, "echo": True, "logprobs": 0})[0] == 200 and jobs


def test_the_server_serves_what_declares_its_needs_and_names_what_another_lacks(tiny):
    """Issue 70: the server's needs of a local LM are declared (models/served_model.py); LocalLM meets them, and a
    model without them is refused at once, naming what it lacks."""
    from replug_jax.models.served_model import ServedModel

    assert isinstance(tiny[1], ServedModel)

    class Scorer:  # a black box that scores but holds no parameters of its own
        name, tokenizer = "remote", tiny[1].tokenizer

        def score(self, contexts, continuations):
            return []

    with pytest.raises(TypeError, match=r"Scorer cannot be served: it lacks config, dtype, max_length, "
                                        r"length_multiple, pad_id, start_id, params, score_prompts, score_token_pairs"):
        BackgroundServer(Scorer())
