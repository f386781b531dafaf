"""Run one command as N local JAX processes: the multi-process route of TPU VMs, on one machine.

    python -m replug_jax.launch --processes 2 [--devices 4] [--port 0] -- python -m replug_jax.main ...

Each child gets, in its environment, the coordinator address (127.0.0.1 and a free port), the process
count and its own id (read by `replug_jax.parallel.distributed.initialize`), and with `--devices D` D fake CPU
devices (XLA_FLAGS). Its output (stdout and stderr) comes back line by line prefixed "[process i] ".
When a child fails the others are stopped and the launcher exits with the failing child's code; it
exits 0 only when every child did. On TPU VMs the same command runs on every host without a launcher.
"""
from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

from replug_jax.parallel.distributed import ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID

_DEVICE_FLAG = re.compile(r"--xla_force_host_platform_device_count=\S+")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(index: int, processes: int, port: int, devices: int | None, base: dict | None = None) -> dict:
    """The environment of child `index`: the caller's plus the coordinator, count, id (and device count)."""
    env = dict(os.environ if base is None else base)
    env.update({ENV_COORDINATOR: f"127.0.0.1:{port}", ENV_NUM_PROCESSES: str(processes), ENV_PROCESS_ID: str(index),
                "PYTHONUNBUFFERED": "1"})
    if devices:
        flags = _DEVICE_FLAG.sub("", env.get("XLA_FLAGS", "")).strip()
        env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={devices}".strip()
    return env


def _forward(index: int, stream, out, lock: threading.Lock) -> None:
    for line in iter(stream.readline, ""):
        with lock:
            out.write(f"[process {index}] {line}" if line.endswith("\n") else f"[process {index}] {line}\n")
            out.flush()
    stream.close()


def run(command: list[str], processes: int, devices: int | None = None, port: int = 0, out=None,
        poll_seconds: float = 0.1) -> int:
    """Start `processes` copies of `command`; returns 0 when all succeed, else the first failure's exit code."""
    if processes < 1:
        raise ValueError(f"--processes must be at least 1, got {processes}")
    if not command:
        raise ValueError("no command to launch (put it after --)")
    out = out or sys.stdout
    port = port or free_port()
    lock = threading.Lock()
    children = [subprocess.Popen(command, env=child_env(i, processes, port, devices), stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, errors="replace") for i in range(processes)]
    readers = [threading.Thread(target=_forward, args=(i, c.stdout, out, lock), daemon=True)
               for i, c in enumerate(children)]
    for reader in readers:
        reader.start()
    failed = None
    try:
        while True:
            codes = [c.poll() for c in children]  # every child, every time (any() would stop at the first)
            failed = next(((i, code) for i, code in enumerate(codes) if code not in (None, 0)), None)
            if failed is not None or all(code is not None for code in codes):
                break
            time.sleep(poll_seconds)
    finally:
        for c in children:  # a failed child (or Ctrl-C) stops the others: they would wait for it forever
            if c.poll() is None:
                c.send_signal(signal.SIGTERM)
        for c in children:
            try:
                c.wait(timeout=10)
            except subprocess.TimeoutExpired:
                c.kill()
                c.wait()
        for reader in readers:
            reader.join(timeout=5)
    if failed is not None:
        with lock:
            out.write(f"[launch] process {failed[0]} failed with exit code {failed[1]}; the others were stopped\n")
            out.flush()
        return failed[1] if failed[1] > 0 else 1
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    usage = "usage: python -m replug_jax.launch --processes N [--devices D] [--port P] -- COMMAND ..."
    if "--" not in argv and ({"-h", "--help"} & set(argv)):
        print(usage)  # asked for: exit 0
        return 0
    if "--" not in argv:
        sys.exit(usage)
    split = argv.index("--")
    ap = argparse.ArgumentParser(prog="python -m replug_jax.launch", description=__doc__.split("\n")[0])
    ap.add_argument("--processes", type=int, required=True, help="how many processes to start")
    ap.add_argument("--devices", type=int, default=None, help="fake CPU devices per process (XLA_FLAGS)")
    ap.add_argument("--port", type=int, default=0, help="coordinator port on 127.0.0.1 (0: a free one)")
    args = ap.parse_args(argv[:split])
    return run(argv[split + 1:], args.processes, args.devices, args.port)


if __name__ == "__main__":
    sys.exit(main())
