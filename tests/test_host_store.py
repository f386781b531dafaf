"""The host store (replug_jax/parallel/host_store.py) on 127.0.0.1, without JAX: gathers of megabytes between two real
processes, and a store that refuses, times out and caps connections from peers without the job's secret,
printing nothing (the secret least of all)."""
import json
import os
import socket
import subprocess
import sys
import threading
import time
import traceback

import pytest

from replug_jax.parallel import distributed
from replug_jax.parallel.host_store import HostStore, HostStoreClient, new_secret

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SET = b'{"op": "set", "key": "k/0", "value": "v", "secret": "s3cret"}\n'


def _replies(port: int, *lines: bytes) -> list[dict]:
    """Each line's reply on one connection, up to the first refusal (after which the store closes it)."""
    out = []
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        replies = sock.makefile("rb")
        for line in lines:
            sock.sendall(line)
            out.append(json.loads(replies.readline()))
            if "error" in out[-1]:
                break
    return out


def test_a_gather_of_megabytes_over_two_processes():
    """The QA job's gather of prediction rows (TriviaQA's are 8.4 MB) and a lockstep cache's miss lists, over two
    processes: values beyond one request line's limit travel in pieces and arrive exact; nothing is left."""
    secret = new_secret()
    store = HostStore("127.0.0.1", secret=secret, readers=2)
    try:
        started = time.time()
        procs = [subprocess.Popen([sys.executable, os.path.join(ROOT, "tests", "host_store_child.py"), str(store.port),
                                   str(i)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  env={**os.environ, "HOST_STORE_SECRET": secret}) for i in range(2)]
        outputs = [p.communicate(timeout=60)[0] for p in procs]
        assert [p.returncode for p in procs] == [0, 0], outputs
        assert int(outputs[0].split()[-2]) > 5_000_000 and outputs[0] == outputs[1]
        assert store.key_count() == 0 and time.time() - started < 30
    finally:
        store.close()


@pytest.mark.parametrize("lines, refusal", [
    ([b"\xff\xfe\n"], "one line of JSON"),  # not UTF-8
    ([b"[" * 200_000], "longer than"),  # no secret: a first line is short
    ([SET, b"[" * 200_000 + b"\n"], "one line of JSON"),  # deeper than the parser's recursion limit
    ([SET, b'"\xff"\n'], "one line of JSON"),
    ([SET, b'{"op": "set", "key": "k/1", "value": "v", "more": 1}\n'], "more must be"),
    ([b'{"op": "hello", "secret": "\\ud800"}\n'], "wrong or missing secret"),  # a lone surrogate
], ids=["not-utf8", "long-first-line", "deep-nesting", "not-utf8-later", "bad-more", "surrogate-secret"])
def test_malformed_requests_are_refused_without_a_traceback(lines, refusal, capfd):
    store = HostStore("127.0.0.1", secret="s3cret")
    try:
        replies = _replies(store.port, *lines)
        assert len(replies) == len(lines) and all(reply == {"ok": True} for reply in replies[:-1])
        assert replies[-1]["error"].startswith("refused") and refusal in replies[-1]["error"]
        client = HostStoreClient("127.0.0.1", store.port, "s3cret")  # the store goes on serving
        client.set("x/0", "y")
        assert client.gather("x", 1, 5) == ["y"]
    finally:
        store.close()
    assert "Traceback" not in capfd.readouterr().err


def _wait_for(condition, seconds: float = 5) -> bool:
    deadline = time.time() + seconds
    while not condition() and time.time() < deadline:
        time.sleep(0.05)
    return condition()


def test_connections_without_a_request_time_out_and_are_capped():
    """Connections that send no line (or drip one) are refused after the first line's timeout; beyond the cap new
    ones are refused as busy, which a client rides out (it retries) instead of failing; no handler is left."""
    store = HostStore("127.0.0.1", secret="s3cret", first_line_timeout_s=1.0, max_connections=6)
    try:
        idle = [socket.create_connection(("127.0.0.1", store.port), timeout=10) for _ in range(6)]
        assert _wait_for(lambda: store.connection_count() == 6)
        assert "busy" in _replies(store.port, SET)[0]["error"]

        def drip(sock=idle[-1]):  # one byte every 0.25 s: activity does not extend the first line's deadline
            try:
                for _ in range(20):
                    sock.send(b" ")
                    time.sleep(0.25)
            except OSError:
                pass

        dripping = threading.Thread(target=drip)
        dripping.start()
        started = time.time()
        client = HostStoreClient("127.0.0.1", store.port, "s3cret")
        client.set("k/0", "v")  # waits until the idle connections are dropped
        assert 0.3 < time.time() - started < 5 and client.gather("k", 1, 5) == ["v"]
        for sock in idle:
            assert "no request line within 1 s" in json.loads(sock.makefile("rb").readline())["error"]
            sock.close()
        dripping.join()
        assert _wait_for(lambda: store.connection_count() == 1)  # the client's: no other handler thread is left
    finally:
        store.close()


def test_an_idle_client_reconnects(monkeypatch):
    """The store closes an authenticated connection idle for IDLE_TIMEOUT_S; the client's next call reconnects."""
    from replug_jax.parallel import host_store

    monkeypatch.setattr(host_store, "IDLE_TIMEOUT_S", 0.3)
    store = HostStore("127.0.0.1", secret="s3cret")
    try:
        client = HostStoreClient("127.0.0.1", store.port, "s3cret")
        client.set("k/0", "v")
        first = client._local.socket
        time.sleep(0.8)
        assert client.gather("k", 1, 5) == ["v"] and client._local.socket is not first
    finally:
        store.close()


def test_the_secret_never_appears_in_errors_or_output(capfd):
    """Failure paths (a wrong secret, a timeout, refused requests that carry the secret, a closed store, an
    address record too long to broadcast) name what went wrong, never the secret."""
    secret = new_secret()
    store = HostStore("127.0.0.1", secret=secret)
    texts = []

    def fails(call):
        try:
            call()
        except Exception as e:  # noqa: BLE001
            texts.append(f"{e!r} {e} {traceback.format_exc()}")
        else:
            raise AssertionError("no error")

    fails(lambda: HostStoreClient("127.0.0.1", store.port, "wrong").set("k/0", "v"))
    fails(lambda: HostStoreClient("127.0.0.1", store.port, secret).gather("absent", 1, 0.1))
    fails(lambda: distributed.encode_address({"host": "h" * 100, "port": 1, "secret": secret}))
    quoted = json.dumps(secret).encode()
    for line in (b'{"op": "drop", "secret": ' + quoted + b"}\n", b'{"secret": ' + quoted + b", " + b"x" * 5000 + b"\n",
                 b'{"op": "set", "key": "k/0", "value": 1, "secret": ' + quoted + b"}\n", quoted + b"\xff\n"):
        texts.append(json.dumps(_replies(store.port, line)))
    port = store.port
    store.close()
    fails(lambda: HostStoreClient("127.0.0.1", port, secret).set("k/0", "v"))
    captured = capfd.readouterr()
    assert len(texts) == 8 and all(secret not in text for text in texts + [captured.out, captured.err]), texts
