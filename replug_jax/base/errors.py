"""The errors a user's input causes, as opposed to a fault in the code or the machine.

`python -m replug_jax.main` prints these as one line (`error: <message>`) and exits 2; any other exception during a
job prints `error: <Type>: <message>` and where its traceback is (WORKDIR/log.txt), and exits 1. Every failure's
traceback goes to the log file. Raise `InputError` where a job refuses a config value, a file the user named or
its contents, on purpose and with a message that names it; a ValueError raised anywhere else is a fault.
"""
from __future__ import annotations


class InputError(ValueError):
    """A user's input the job cannot run with (reported as one line): a config value, a file or its contents."""


class MissingInput(InputError, FileNotFoundError):
    """A file or an installed data package the user's input needs that is not there (also a FileNotFoundError)."""


def invalid_json(where: str, error) -> InputError:
    """A JSONL line that does not parse (`error`: its json.JSONDecodeError), named by `where` ("FILE, line N") and
    the column where the parser stopped."""
    reason = error.msg[: -len(" at")] if error.msg.endswith(" at") else error.msg  # "Invalid control character at"
    return InputError(f"{where}, column {error.colno}: not valid JSON ({reason})")
