"""A tiny key-value store over TCP for host-side agreement between the processes of one job.

Process 0 serves it (a thread); every process sets keys and waits for keys with a timeout. Barriers and
small gathers (`distributed.barrier`, `distributed.allgather_json`) go through it, not device collectives,
so a background thread (the index refresher) can agree with its peers without racing the training loop's
jitted collectives. JAX's own coordination service has such a store, but only behind private names.

Protocol: one JSON line per request, one JSON line back: {"op": "set", "key", "value"} -> {"ok": true};
{"op": "get", "key", "timeout_s"} -> {"value"} or {"error"}.
"""
from __future__ import annotations

import json
import socket
import socketserver
import threading


class HostStore:
    """The server (process 0): a dict under a condition variable, served on `port` (0: a free one)."""

    def __init__(self, host: str = "0.0.0.0", port: int = 0):
        values: dict[str, str] = {}
        changed = threading.Condition()

        class Handler(socketserver.StreamRequestHandler):
            def handle(self):
                for line in self.rfile:
                    request = json.loads(line)
                    if request["op"] == "set":
                        with changed:
                            values[request["key"]] = request["value"]
                            changed.notify_all()
                        reply = {"ok": True}
                    else:
                        with changed:
                            found = changed.wait_for(lambda: request["key"] in values, request["timeout_s"])
                            reply = {"value": values[request["key"]]} if found else \
                                {"error": f"no value for {request['key']!r} within {request['timeout_s']} s"}
                    self.wfile.write((json.dumps(reply) + "\n").encode())
                    self.wfile.flush()

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads, allow_reuse_address = True, True

        self._server = Server((host, port), Handler)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, name="replug-host-store", daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class HostStoreClient:
    """A process's connection to the store (one socket per thread: calls from several threads never mix)."""

    def __init__(self, host: str, port: int):
        self.address = (host, port)
        self._local = threading.local()

    def _call(self, request: dict, timeout_s: float | None) -> dict:
        if getattr(self._local, "socket", None) is None:
            self._local.socket = socket.create_connection(self.address, timeout=60)
            self._local.file = self._local.socket.makefile("rwb")
        self._local.socket.settimeout(None if timeout_s is None else timeout_s + 60)
        self._local.file.write((json.dumps(request) + "\n").encode())
        self._local.file.flush()
        reply = json.loads(self._local.file.readline() or b'{"error": "the host store closed the connection"}')
        if "error" in reply:
            raise TimeoutError(reply["error"])
        return reply

    def key_value_set(self, key: str, value: str) -> None:
        self._call({"op": "set", "key": key, "value": value}, None)

    def blocking_key_value_get(self, key: str, timeout_ms: int) -> str:
        return self._call({"op": "get", "key": key, "timeout_s": timeout_ms / 1000}, timeout_ms / 1000)["value"]
