"""What a job shows a person: one line per phase and the progress bars on the console, the rest in a log file.

    log_path = console.setup(workdir, verbosity=-1)   # main.py does this
    console.phase("datastore: 3,862 passages (reused)")

Library logging (absl, JAX's backend probe, FAISS's loader, orbax) goes to `WORKDIR/log.txt` at INFO;
the console shows warnings and errors only, or everything from `--verbosity=0` (INFO) up. The traceback of a
job that fails goes to the log file only (`log_failure`); the console gets one line (command_line.py).
"""
from __future__ import annotations

import logging
import os
import sys
import time

LOG_FILE = "log.txt"
_state = {"start": time.monotonic(), "enabled": True, "handler": None, "path": None}


def setup(workdir: str, verbosity: int = -1, enabled: bool = True) -> str:
    """Send every log record at INFO and above to WORKDIR/log.txt; keep the console at WARNING unless
    `verbosity` >= 0 (absl's scale: 0 = INFO, 1 = DEBUG). `enabled=False` silences `phase` (other processes)."""
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, LOG_FILE)
    close()  # a second job in this process logs to its own workdir only
    root = logging.getLogger()
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.setLevel(logging.DEBUG if verbosity >= 1 else logging.INFO)
    for other in root.handlers:  # absl's stderr handler, or basicConfig's
        other.setLevel(logging.DEBUG if verbosity >= 1 else logging.INFO if verbosity == 0 else logging.WARNING)
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbosity >= 1 else logging.INFO)
    from absl import logging as absl_logging

    absl_logging.set_verbosity(max(verbosity, 0))  # absl's own messages reach the file at INFO
    _state.update(start=time.monotonic(), enabled=enabled, handler=handler, path=path)
    return path


def log_path() -> str | None:
    """The log file `setup` opened (None before it, or after `close`)."""
    return _state["path"]


def log_failure(error: BaseException) -> None:
    """`error` with its traceback in the log file only (nothing when no log file is open)."""
    handler = _state["handler"]
    if handler is not None:
        handler.handle(logging.LogRecord("replug_jax", logging.ERROR, __file__, 0, "the job failed:", None,
                                         (type(error), error, error.__traceback__)))


def close() -> None:
    """Stop writing to the log file `setup` opened."""
    handler = _state["handler"]
    if handler is not None:
        logging.getLogger().removeHandler(handler)
        handler.close()
    _state.update(handler=None, path=None)


def phase(message: str) -> None:
    """One line on stdout (with the time since setup) and in the log file."""
    logging.getLogger("replug_jax").info(message)
    if _state["enabled"]:
        print(f"[{time.monotonic() - _state['start']:7.1f}s] {message}", file=sys.stdout, flush=True)


def phases(enabled: bool):
    """`phase` when `enabled` (e.g. progress on, process 0), else a function that prints nothing."""
    return phase if enabled else (lambda message: None)
