"""The host store's client (the protocol: host_store.py): one connection per thread, values of any size.

A value longer than one request line (MAX_LINE bytes, JSON-escaped) is sent in pieces; replies have no limit.
"""
from __future__ import annotations

import json
import socket
import threading
import time

MAX_LINE = 1 << 20  # bytes of a request line after the first
BUSY_RETRY_S = 120.0  # how long a client retries a store that refuses new connections as busy


class HostStoreRequestError(ValueError):
    """A request the store refuses (bad secret, type, size or timeout)."""


def _set_lines(key: str, value: str) -> list[str]:
    """The set request(s) for key = value: one line, or pieces (all but the last with "more") that each fit
    MAX_LINE once JSON escapes them (a character takes 1 to 12 bytes)."""
    lines, start, size = [], 0, max(len(value), 1)
    while True:
        piece = value[start : start + size]
        last = start + len(piece) == len(value)
        line = json.dumps({"op": "set", "key": key, "value": piece, "more": not last})
        if len(line) >= MAX_LINE:  # ASCII: one byte a character
            if size == 1:
                raise ValueError(f"host store key too long: {len(key)} characters")
            size = (size + 1) // 2
            continue
        lines.append(line)
        start += len(piece)
        if last:
            return lines


def _closed_by_peer(sock: socket.socket) -> bool:
    """Whether the store closed this idle connection (a peek that does not wait)."""
    try:
        sock.setblocking(False)
        return sock.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


class HostStoreClient:
    """A process's connection to the store (one socket per thread: calls from several threads never mix), opened
    with a hello that carries the secret, reopened when the store closed it while idle. A call that fails or times
    out closes its socket, so a late reply is never read as the next call's."""

    def __init__(self, host: str, port: int, secret: str):
        self.address, self._secret = (host, port), secret
        self._local = threading.local()

    def _connect(self) -> None:
        """A connection that the store accepted (hello), retried while the store is busy."""
        local = self._local
        if getattr(local, "socket", None) is not None and not _closed_by_peer(local.socket):
            return
        self._drop()
        deadline = time.monotonic() + BUSY_RETRY_S
        while True:
            local.socket = socket.create_connection(self.address, timeout=60)
            local.file = local.socket.makefile("rwb")
            try:
                self._exchange([json.dumps({"op": "hello", "secret": self._secret})], 0)
                return
            except (HostStoreRequestError, ConnectionError) as e:  # a busy store may reset before its refusal is read
                passing = not isinstance(e, HostStoreRequestError) or "busy" in str(e) or "no request line" in str(e)
                if not passing or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def _exchange(self, lines: list[str], timeout_s: float | None) -> dict:
        """Each line sent and its reply read, up to an error (raised, the socket dropped); the last reply."""
        local = self._local
        try:
            local.socket.settimeout(None if timeout_s is None else timeout_s + 60)
            for line in lines:
                local.file.write(line.encode() + b"\n")
                local.file.flush()
                reply = json.loads(local.file.readline() or b'{"error": "the host store closed the connection"}')
                if "error" in reply:
                    break
        except BaseException:
            self._drop()
            raise
        if "error" in reply:
            self._drop()
            error = reply["error"]
            raise (HostStoreRequestError if error.startswith("refused") else TimeoutError if error.startswith("no value")
                   else ConnectionError)(error)
        return reply

    def _drop(self) -> None:
        local = self._local
        if getattr(local, "socket", None) is not None:
            local.socket.close()
        local.socket = local.file = None

    def set(self, key: str, value: str) -> None:
        """key = value, for every process's gathers (a value of any length: sent in pieces past MAX_LINE)."""
        self._connect()
        self._exchange(_set_lines(key, value), None)

    def gather(self, key: str, count: int, timeout_s: float) -> list[str]:
        """The values of key/0 ... key/(count-1), once all are set (TimeoutError after `timeout_s`)."""
        self._connect()
        request = {"op": "gather", "key": key, "count": count, "timeout_s": timeout_s}
        return self._exchange([json.dumps(request)], timeout_s)["values"]
