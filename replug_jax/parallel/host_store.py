"""A tiny key-value store over TCP for host-side agreement between the processes of one job.

Process 0 serves it (a thread); every process sets keys and gathers them with a timeout. Barriers and
gathers (`distributed.barrier`, `distributed.allgather_json`) go through it, not device collectives, so a
background thread (the index refresher) can agree with its peers without racing the training loop's jitted
collectives. JAX's own coordination service has such a store, but only behind private names.

Protocol: JSON lines (UTF-8), one reply line per request line. A connection's first line must carry the job's
random `secret` (broadcast with the address at start-up, compared in constant time), be at most FIRST_LINE bytes
and arrive within `first_line_timeout_s` of connecting; later lines (at most MAX_LINE bytes) need no secret:
  {"op": "hello", "secret"} -> {"ok": true}  (or any request below, with the secret)
  {"op": "set", "key", "value", "more": false} -> {"ok": true}
     "more": true appends a piece of the value, set with its last piece (the client cuts values that exceed a
     line; an unfinished value dies with its connection)
  {"op": "gather", "key", "count", "timeout_s"} -> {"values": [value of key/0, ..., key/(count-1)]}
     waits until all `count` keys exist; once all `readers` processes have gathered them, they are deleted.
Replies have no size limit. Anything else (a missing or wrong secret, a line too long or not JSON, a bad type,
a timeout that is not a positive number of at most MAX_TIMEOUT_S, no first line in time) gets one line
{"error": "refused: ..."} and the connection is closed; nothing is printed. An authenticated connection idle for
IDLE_TIMEOUT_S is closed (the client reconnects); beyond `max_connections` at once a new connection is refused
as busy (the client retries for BUSY_RETRY_S).
"""
from __future__ import annotations

import hmac
import json
import math
import secrets
import socket
import socketserver
import threading
import time

from replug_jax.parallel.host_store_client import MAX_LINE, HostStoreClient, HostStoreRequestError  # noqa: F401 (the client, here too)

FIRST_LINE = 4096  # bytes of a connection's first line, sent before it is known to come from the job
FIRST_LINE_TIMEOUT_S = 5.0
IDLE_TIMEOUT_S = 3600.0
MAX_TIMEOUT_S = 7 * 24 * 3600.0


def new_secret() -> str:
    return secrets.token_hex(16)


def _parsed(line: bytes):
    try:
        return json.loads(line.decode("utf-8"))
    except (ValueError, RecursionError):  # not UTF-8, not JSON, nested too deep
        raise HostStoreRequestError("a request is one line of JSON (UTF-8)") from None


def _checked(request, secret: str | None) -> dict:
    """The request if it is well formed (and carries `secret`, unless None); HostStoreRequestError naming what is wrong."""
    if not isinstance(request, dict):
        raise HostStoreRequestError("a request is a JSON object")
    given = request.get("secret")
    if secret is not None and (not isinstance(given, str)
                               or not hmac.compare_digest(given.encode("utf-8", "surrogatepass"), secret.encode())):
        raise HostStoreRequestError("wrong or missing secret")
    if request.get("op") == "hello":
        return request
    if request.get("op") not in ("set", "gather") or not isinstance(request.get("key"), str):
        raise HostStoreRequestError("op must be 'hello', 'set' or 'gather', key a string")
    if request["op"] == "set" and not isinstance(request.get("value"), str):
        raise HostStoreRequestError("set: value must be a string")
    if request["op"] == "set" and not isinstance(request.get("more", False), bool):
        raise HostStoreRequestError("set: more must be true or false")
    if request["op"] == "gather":
        count, timeout = request.get("count"), request.get("timeout_s")
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= 1 << 16:
            raise HostStoreRequestError("gather: count must be an integer from 1 to 65536")
        if (not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not math.isfinite(timeout)
                or not 0 < timeout <= MAX_TIMEOUT_S):
            raise HostStoreRequestError(f"gather: timeout_s must be a number in (0, {MAX_TIMEOUT_S:.0f}]")
    return request


class _Lines:
    """The lines a socket receives, each whole within a deadline (a slow drip gains nothing) and of bounded size."""

    def __init__(self, sock: socket.socket):
        self.sock, self.buffer = sock, bytearray()

    def next(self, limit: int, deadline: float) -> bytes | None:
        """The next line, b"\\n" included; None at the end of the stream; HostStoreRequestError past `limit` bytes;
        TimeoutError past `deadline` (time.monotonic())."""
        start = 0
        while (end := self.buffer.find(b"\n", start)) < 0:
            if len(self.buffer) > limit:
                raise HostStoreRequestError(f"request line longer than {limit} bytes")
            if (left := deadline - time.monotonic()) <= 0:
                raise TimeoutError
            self.sock.settimeout(left)
            start, chunk = len(self.buffer), self.sock.recv(1 << 16)
            if not chunk:
                return None
            self.buffer += chunk
        if end >= limit:
            raise HostStoreRequestError(f"request line longer than {limit} bytes")
        line = bytes(self.buffer[: end + 1])
        del self.buffer[: end + 1]
        return line


def _send(sock: socket.socket, reply: dict, timeout_s: float) -> None:
    sock.settimeout(timeout_s)
    sock.sendall((json.dumps(reply) + "\n").encode())


def _refuse(sock: socket.socket, reason: str, linger_s: float = 1.0) -> None:
    """One refusal line, then a short drain of what the peer still sends (closing on unread data would reset the
    connection, and the peer could lose the refusal)."""
    try:
        _send(sock, {"error": f"refused: {reason}"}, 1.0)
        sock.shutdown(socket.SHUT_WR)
        deadline, drained = time.monotonic() + linger_s, 0
        while drained < 4 * MAX_LINE and (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            if not (chunk := sock.recv(1 << 16)):
                break
            drained += len(chunk)
    except OSError:
        pass


class HostStore:
    """The server (process 0): a dict under a condition variable, served on `host`:`port` (0: a free one) to
    clients that know `secret`; a gathered key is deleted once `readers` processes have gathered it. At most
    `max_connections` (default 64 + 8 per reader) connections at once, each a thread."""

    def __init__(self, host: str, port: int = 0, *, secret: str, readers: int = 1,
                 first_line_timeout_s: float = FIRST_LINE_TIMEOUT_S, max_connections: int | None = None):
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

        def serve(sock: socket.socket) -> None:
            lines, pieces = _Lines(sock), {}  # pieces: key -> the parts of a value set in pieces so far
            limit, deadline, expected = FIRST_LINE, time.monotonic() + first_line_timeout_s, secret
            try:
                while (line := lines.next(limit, deadline)) is not None:
                    request = _checked(_parsed(line), expected)
                    limit, expected = MAX_LINE, None  # authenticated: later lines need no secret
                    if request["op"] == "set" and request.get("more"):
                        pieces.setdefault(request["key"], []).append(request["value"])
                    elif request["op"] == "set":
                        value = "".join(pieces.pop(request["key"], []) + [request["value"]])
                        with changed:
                            values[request["key"]] = value
                            changed.notify_all()
                    _send(sock, gather(request) if request["op"] == "gather" else {"ok": True}, IDLE_TIMEOUT_S)
                    deadline = time.monotonic() + IDLE_TIMEOUT_S
            except TimeoutError:  # no first line in time (refused); idle or stuck later (closed: the client reconnects)
                if expected is not None:
                    _refuse(sock, f"no request line within {first_line_timeout_s:g} s", linger_s=0)
            except HostStoreRequestError as e:
                _refuse(sock, str(e))
            except OSError:
                pass  # the connection broke
            except Exception as e:  # noqa: BLE001 (whatever a request does, the store refuses it in one line)
                _refuse(sock, f"malformed request ({type(e).__name__})")

        class Handler(socketserver.BaseRequestHandler):
            def handle(self):
                serve(self.request)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads, allow_reuse_address = True, True
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
            cap, live, lock = 64 + 8 * readers if max_connections is None else max_connections, 0, threading.Lock()

            def process_request(self, request, client_address):
                with self.lock:
                    busy = self.live >= self.cap
                    self.live += not busy
                if busy:
                    try:
                        _send(request, {"error": "refused: busy (too many connections)"}, 0.5)
                    except OSError:
                        pass
                    return self.shutdown_request(request)
                try:
                    super().process_request(request, client_address)  # a thread
                except BaseException:
                    self.ended()
                    raise

            def process_request_thread(self, request, client_address):
                try:
                    super().process_request_thread(request, client_address)
                finally:
                    self.ended()

            def ended(self):
                with self.lock:
                    self.live -= 1

            def handle_error(self, request, client_address):
                pass  # a connection that broke: nothing to print (and its request may carry the secret)

        self._values = values
        self._server = Server((host, port), Handler)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, name="replug-host-store", daemon=True).start()

    def key_count(self) -> int:
        """Keys held now (gathered keys are freed once every reader has them)."""
        return len(self._values)

    def connection_count(self) -> int:
        """Connections open now (each a thread)."""
        return self._server.live

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
