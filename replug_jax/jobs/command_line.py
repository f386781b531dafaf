"""What a person at the command line sees: one-line errors for their mistakes, a fault's type and message with
where its traceback is, `--help` that lists the configs and a config's keys with their defaults, ranges and
meanings (base/settings.py)."""
from __future__ import annotations

import contextlib
import glob
import os
import sys

DEBUG_ENV = "REPLUG_JAX_DEBUG"


def user_errors() -> tuple:
    """What a user's input causes (replug_jax/base/errors.py): a value, file or data set a job refuses on purpose
    (`InputError`), an unknown model, an index built for something else. Any other exception is a fault. The
    model and index errors are looked up only where their modules are loaded (an error of a class never imported
    cannot have been raised): importing FAISS here would print its loader's lines before a first-second mistake's
    one line, ahead of the job's log file."""
    from replug_jax.base.errors import InputError

    kinds = [InputError]
    for module, name in (("replug_jax.models.registry", "ModelNotFound"),
                         ("replug_jax.retrieval.index", "IndexRefused")):
        if module in sys.modules:
            kinds.append(getattr(sys.modules[module], name))
    return tuple(kinds)


def debug_requested() -> bool:
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


def one_line(error: BaseException) -> str:
    """The error's message on one line (ml_collections wraps its hints in quotes and newlines)."""
    text = str(error)
    if len(text) > 1 and text[0] == text[-1] and text[0] in "'\"":
        text = text[1:-1]
    text = text.replace("\\n", " ").replace("\\'", "'").replace("\n", " ")
    return " ".join(text.split())


@contextlib.contextmanager
def user_errors_as_one_line(debug: bool = False, usage: str = "", also: tuple = ()):
    """Inside (flag parsing, before a workdir exists): a user error (`user_errors()`, plus `also`) prints
    `error: <message>` (and `usage`) on stderr and exits 2, unless `debug` or $REPLUG_JAX_DEBUG is set (then it
    propagates with its traceback)."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 (sorted below: only a user's mistake becomes one line)
        if debug or debug_requested() or not isinstance(e, user_errors() + tuple(also)):
            raise
        print(f"error: {one_line(e)}", file=sys.stderr)
        print(usage or f"(--debug or {DEBUG_ENV}=1 shows the traceback)", file=sys.stderr)
        sys.exit(2)


def script_entry(main) -> None:
    """An experiments script's `main()`, a user's mistake in its settings said in one line with exit 2."""
    with user_errors_as_one_line(usage=f"({DEBUG_ENV}=1 shows the traceback)"):
        main()


@contextlib.contextmanager
def job_failures_reported(debug: bool = False):
    """Inside (a job, whose log file `console.setup` opened and which logs every failure's traceback there, see
    `console.log_failure`): a user error prints `error: <message>` and exits 2; any other exception prints
    `error: <Type>: <message>` and where its traceback is, and exits 1. With `debug` or $REPLUG_JAX_DEBUG, or
    before the log file exists, the exception propagates with its traceback (a user error before it: one line)."""
    from replug_jax.base import console

    try:
        yield
    except Exception as e:  # noqa: BLE001 (reported below, the traceback kept in the log file)
        log = console.log_path()
        if debug or debug_requested():
            raise
        if isinstance(e, user_errors()):
            print(f"error: {one_line(e)}", file=sys.stderr)
            print(f"(--debug or {DEBUG_ENV}=1 shows the traceback{f'; it is also in {log}' if log else ''})",
                  file=sys.stderr)
            sys.exit(2)
        if log is None:
            raise
        print(f"error: {type(e).__name__}: {one_line(e)}", file=sys.stderr)
        print(f"the traceback is in {log} (--debug or {DEBUG_ENV}=1 shows it here)", file=sys.stderr)
        sys.exit(1)


def config_dir() -> str:
    """experiments/configs of the working directory, else of the repository the package was installed from."""
    here = os.path.join("experiments", "configs")
    if os.path.isdir(here):
        return here
    return os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "experiments",
                        "configs")  # replug_jax/jobs/ -> the checkout


def config_argument(argv: list[str]) -> str | None:
    """The value of the last `--config FILE` / `--config=FILE` in `argv` (the one absl keeps), or None."""
    return (config_arguments(argv) or [None])[-1]


def config_arguments(argv: list[str]) -> list[str]:
    """Every `--config FILE` / `--config=FILE` value in `argv`, in order (absl loads each one it meets)."""
    return [arg.split("=", 1)[1] if arg.startswith("--config=") else argv[i + 1] for i, arg in enumerate(argv)
            if arg.startswith("--config=") or arg == "--config" and i + 1 < len(argv)]


def config_path(argument: str) -> str:
    """The file of a --config argument: ml_collections' `FILE:ARGS` form cut at its first colon."""
    return argument if os.path.isfile(argument) else argument.split(":", 1)[0]


def check_config_file(path: str) -> None:
    """Refuse a config file that is not there, naming the closest config (ValueError: one line at the command
    line). ml_collections' `FILE:ARGS` form is allowed."""
    import difflib

    if os.path.isfile(config_path(path)):
        return
    folder = os.path.dirname(path) or "."
    names = sorted(os.path.basename(p) for p in glob.glob(os.path.join(folder if os.path.isdir(folder)
                                                                      else config_dir(), "*.py")))
    close = difflib.get_close_matches(os.path.basename(path), names, n=1)
    hint = (f"did you mean {os.path.join(folder if os.path.isdir(folder) else config_dir(), close[0])}? "
            if close else "")
    raise ValueError(f"--config={path}: no such config file; {hint}(python -m replug_jax.main --help lists the "
                     "configs)")


def help_text(argv: list[str], usage: str) -> str:
    """The usage line and either, with --config, that config's keys in the schema's order with their defaults, the
    comments the config files give them, and their meanings and ranges (base/settings.py), or the configs (file and
    the first sentence of its docstring)."""
    import ast

    from replug_jax.base import settings

    lines = [usage]
    chosen = config_argument(argv)
    if chosen:
        check_config_file(chosen)
        from replug_jax.jobs.config_files import sibling_config

        path = os.path.abspath(config_path(chosen))
        config = sibling_config(path, os.path.basename(path))
        comments = key_comments(path)
        lines += ["", f"keys of {chosen} (override with --config.KEY=VALUE), each with its range and meaning "
                  "(replug_jax/base/settings.py) and the config file's own comment:"]
        for key in sorted(config.keys(), key=settings.declared_order):
            lines.append(f"  {key} = {config[key]!r}" + (f"  # {comments[key]}" if key in comments else ""))
            lines.append(f"      {settings.describe(key) if key in settings.SETTINGS else 'not a declared setting'}")
        lines += ["", "--help alone lists the configs"]
    else:
        lines += ["", f"configs ({config_dir()}):"]
        for path in sorted(glob.glob(os.path.join(config_dir(), "*.py"))):
            doc = ast.get_docstring(ast.parse(open(path, encoding="utf-8").read())) or ""
            lines.append(f"  {os.path.basename(path):22s} {first_sentence(doc)}")
        lines += ["", "--help --config CONFIG.py lists that config's keys, defaults, ranges and meanings"]
    lines += ["", "other flags: --workdir DIR (required), --debug (tracebacks), --verbosity=0 (library log here)"]
    return "\n".join(lines)


def first_sentence(doc: str) -> str:
    """A docstring's first sentence, joined across its lines (its first paragraph when no sentence ends there)."""
    paragraph, depth = " ".join(doc.split("\n\n", 1)[0].split()), 0
    for i, ch in enumerate(paragraph):
        depth += (ch == "(") - (ch == ")")
        ends = paragraph[i + 1 : i + 2] in (" ", "") and not paragraph[i + 2 : i + 3].isdigit()  # not "Dec. 2018"
        if ch == "." and depth == 0 and ends:
            return paragraph[: i + 1]
    return paragraph


def key_comments(path: str) -> dict[str, str]:
    """{key: the comment of its `c.KEY = ...  # comment` line}, from the config file and the files it builds on
    (`sibling_config(__file__, "NAME.py")`); the file's own comment wins over its base's."""
    import re

    text = open(path, encoding="utf-8").read()
    comments: dict[str, str] = {}
    for base in re.findall(r"sibling_config\(__file__, \"([\w.]+\.py)\"\)", text):
        comments.update(key_comments(os.path.join(os.path.dirname(path), base)))
    for key, comment in re.findall(r"^\s*c\.(\w+) = .*?  # (.+)$", text, flags=re.MULTILINE):
        comments[key] = comment.strip()
    return comments


def check_workdir(path: str) -> None:
    """A local --workdir is a folder or can be made one: an existing file, or a path under a file or where nothing
    may be written, is the user's input, said in one line before any log file exists."""
    from replug_jax.base.errors import InputError

    if os.path.exists(path) and not os.path.isdir(path):
        raise InputError(f"--workdir={path!r} is a file, not a folder: give a folder (it is made if it is missing)")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise InputError(f"--workdir={path!r} cannot be made: {e.strerror or e}") from None
