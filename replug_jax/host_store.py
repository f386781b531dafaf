"""A tiny key-value store over TCP for host-side agreement between the processes of one job.

Process 0 serves it (a thread); every process sets keys and gathers them with a timeout. Barriers and small
gathers (`distributed.barrier`, `distributed.allgather_json`) go through it, not device collectives, so a
background thread (the index refresher) can agree with its peers without racing the training loop's jitted
collectives. JAX's own coordination service has such a store, but only behind private names.

Protocol: one JSON line per request (at most MAX_LINE bytes), one JSON line back; every request carries the
job's random `secret` (broadcast with the address at start-up, compared in constant time):
  {"op": "set", "key", "value", "secret"} -> {"ok": true}
  {"op": "gather", "key", "count", "timeout_s", "secret"} -> {"values": [value of key/0, ..., key/(count-1)]}
     waits until all `count` keys exist; once all `readers` processes have gathered them, they are deleted.
Anything else (a missing or wrong secret, an over-long line, a bad type, a timeout that is not a positive
number of at most MAX_TIMEOUT_S) gets {"error": ...} and the connection is closed.
"""
from __future__ import annotations

import hmac
import json
import math
import secrets
import socket
import socketserver
import threading

MAX_LINE = 1 << 20  # bytes of one request line
MAX_TIMEOUT_S = 7 * 24 * 3600.0


class RequestError(ValueError):
    """A request the store refuses (bad secret, type, size or timeout)."""


def new_secret() -> str:
    return secrets.token_hex(16)


def _checked(request, secret: str) -> dict:
    """The request if it is well formed and carries the secret; RequestError naming what is wrong otherwise."""
    if not isinstance(request, dict):
        raise RequestError("a request is a JSON object")
    given = request.get("secret")
    if not isinstance(given, str) or not hmac.compare_digest(given.encode(), secret.encode()):
        raise RequestError("wrong or missing secret")
    if request.get("op") not in ("set", "gather") or not isinstance(request.get("key"), str):
        raise RequestError("op must be 'set' or 'gather', key a string")
    if request["op"] == "set" and not isinstance(request.get("value"), str):
        raise RequestError("set: value must be a string")
    if request["op"] == "gather":
        count, timeout = request.get("count"), request.get("timeout_s")
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= 1 << 16:
            raise RequestError("gather: count must be an integer from 1 to 65536")
        if (not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not math.isfinite(timeout)
                or not 0 < timeout <= MAX_TIMEOUT_S):
            raise RequestError(f"gather: timeout_s must be a number in (0, {MAX_TIMEOUT_S:.0f}]")
    return request


class HostStore:
    """The server (process 0): a dict under a condition variable, served on `host`:`port` (0: a free one) to
    clients that know `secret`; a gathered key is deleted once `readers` processes have gathered it."""

    def __init__(self, host: str, port: int = 0, *, secret: str, readers: int = 1):
        values: dict[str, str] = {}
        gathered: dict[str, int] = {}  # key prefix -> processes that have gathered it
        changed = threading.Condition()

        def gather(request) -> dict:
            keys = [f"{request['key']}/{i}" for i in range(request["count"])]
            with changed:
                if not changed.wait_for(lambda: all(k in values for k in keys), request["timeout_s"]):
                    missing = [k for k in keys if k not in values]
                    return {"error": f"no value for {missing[0]!r} within {request['timeout_s']} s"}
                out = [values[k] for k in keys]
                gathered[request["key"]] = gathered.get(request["key"], 0) + 1
                if gathered[request["key"]] >= readers:  # every process has them: free the keys
                    del gathered[request["key"]]
                    for k in keys:
                        del values[k]
                return {"values": out}

        class Handler(socketserver.StreamRequestHandler):
            def handle(self):
                while line := self.rfile.readline(MAX_LINE + 1):
                    try:
                        if len(line) > MAX_LINE or not line.endswith(b"\n"):
                            raise RequestError(f"request line longer than {MAX_LINE} bytes")
                        try:
                            request = _checked(json.loads(line), secret)
                        except json.JSONDecodeError:
                            raise RequestError("a request is one line of JSON") from None
                    except RequestError as e:
                        self._reply({"error": f"refused: {e}"})
                        return  # close the connection
                    if request["op"] == "set":
                        with changed:
                            values[request["key"]] = request["value"]
                            changed.notify_all()
                        self._reply({"ok": True})
                    else:
                        self._reply(gather(request))

            def _reply(self, reply):
                self.wfile.write((json.dumps(reply) + "\n").encode())
                self.wfile.flush()

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads, allow_reuse_address = True, True
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

        self._values = values
        self._server = Server((host, port), Handler)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, name="replug-host-store", daemon=True).start()

    def key_count(self) -> int:
        """Keys held now (gathered keys are freed once every reader has them)."""
        return len(self._values)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class HostStoreClient:
    """A process's connection to the store (one socket per thread: calls from several threads never mix). A
    call that fails or times out closes its socket, so a late reply is never read as the next call's."""

    def __init__(self, host: str, port: int, secret: str):
        self.address, self.secret = (host, port), secret
        self._local = threading.local()

    def _call(self, request: dict, timeout_s: float | None) -> dict:
        local = self._local
        if getattr(local, "socket", None) is None:
            local.socket = socket.create_connection(self.address, timeout=60)
            local.file = local.socket.makefile("rwb")
        try:
            local.socket.settimeout(None if timeout_s is None else timeout_s + 60)
            local.file.write((json.dumps({**request, "secret": self.secret}) + "\n").encode())
            local.file.flush()
            reply = json.loads(local.file.readline() or b'{"error": "the host store closed the connection"}')
        except BaseException:
            self._drop()
            raise
        if "error" in reply:
            self._drop()
            raise (RequestError if reply["error"].startswith("refused") else TimeoutError)(reply["error"])
        return reply

    def _drop(self) -> None:
        local = self._local
        if getattr(local, "socket", None) is not None:
            local.socket.close()
        local.socket = local.file = None

    def set(self, key: str, value: str) -> None:
        self._call({"op": "set", "key": key, "value": value}, None)

    def gather(self, key: str, count: int, timeout_s: float) -> list[str]:
        """The values of key/0 ... key/(count-1), once all are set (TimeoutError after `timeout_s`)."""
        return self._call({"op": "gather", "key": key, "count": count, "timeout_s": timeout_s}, timeout_s)["values"]
