"""`python -m replug_jax.harness [lm-eval's own flags]`: lm-eval's command line with the "replug" model registered
and the offline tasks (offline_tasks.py) on its include path.

    python -m replug_jax.harness --model replug --model_args lm=smollm2,corpus=sciq_support,k=4 \\
        --tasks replug_sciq_mc --limit 100

lm-eval 0.4.13 finds models only in its registry (it reads no entry points), so `lm_eval --model replug` alone cannot
know this package's model: this command imports it first. The offline tasks are written on first use to
`offline_tasks.default_folder()` and put on lm-eval's include path, unless a user gives their own `--include_path`
(lm-eval takes one); the model reads the same path to find each task's doc_to_text (harness/queries.py).
"""
from __future__ import annotations

import inspect
import itertools
import os
import sys

from replug_jax.base.errors import InputError


def main(argv: list[str]) -> None:
    from lm_eval.__main__ import cli_evaluate

    from replug_jax.harness import model, offline_tasks

    folder = offline_tasks.default_folder()
    if not os.path.isfile(os.path.join(folder, offline_tasks.QUESTIONS_FILE)):
        offline_tasks.write_tasks(folder)
    argv = list(argv)
    given = flag(argv, "--include_path")  # lm-eval 0.4.13 takes one --include_path: a user's own replaces ours
    if given is None:
        argv += ["--include_path", folder]
    else:
        print(f"replug_jax.harness: --include_path {given} replaces the offline tasks' folder {folder} on lm-eval's "
              "path (it takes one); copy their YAMLs beside yours to run both", file=sys.stderr)
    os.environ[model.INCLUDE_ENV] = os.pathsep.join([given] if given else [folder])
    sys.argv = ["lm-eval", *argv]
    try:
        check_replug_arguments(argv)  # a mistake in the first seconds, before lm-eval indexes its tasks
        name_runs_after_the_lm()
        try:
            cli_evaluate()
        except ValueError as e:
            if not str(e).startswith("Tasks not found:"):
                raise
            raise InputError(unknown_tasks(str(e), given or folder)) from None
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


def unknown_tasks(message: str, include_path: str) -> str:
    """lm-eval's 'Tasks not found: a, b' (after a 19-line traceback, before) as one line with the closest names."""
    import difflib

    from lm_eval.tasks import TaskManager

    missing = [name.strip() for name in message.split(":", 1)[1].split(",") if name.strip()]
    known = TaskManager(include_path=include_path).all_tasks
    close = {name: difflib.get_close_matches(name, known, n=3) for name in missing}
    said = "; ".join(f"{name!r}" + (f" (close: {', '.join(close[name])})" if close[name] else "") for name in missing)
    return f"--tasks: unknown task{'s' if len(missing) > 1 else ''} {said}; `lm-eval ls tasks` lists them"


def name_runs_after_the_lm() -> None:
    """lm-eval names a run's output folder after --model_args' pretrained=, model=, path= or engine= (else a random
    id, 'i82qcls7'); the replug model's LM is lm=, so its runs are named after it ('replug-smollm2'). lm-eval has no
    hook for this: its name lookup is wrapped."""
    from lm_eval.loggers.evaluation_tracker import GeneralConfigTracker

    original = GeneralConfigTracker._get_model_name
    if getattr(original, "replug", False):
        return

    def named(model_args):
        found = original(model_args)
        if found is not None:
            return found
        from lm_eval.utils import simple_parse_args_string

        given = simple_parse_args_string(model_args) if isinstance(model_args, str) else model_args or {}
        lm = given.get("lm")
        return f"replug-{lm}" if lm else None

    named.replug = True
    GeneralConfigTracker._get_model_name = staticmethod(named)


def check_replug_arguments(argv: list[str]) -> None:
    """`model.check_arguments` of `--model_args` when `--model replug` is asked for."""
    from replug_jax.harness import model

    if flag(argv, "--model") != "replug":
        return
    args = model_args(argv)
    if any(arg == "--apply_chat_template" or arg.startswith("--apply_chat_template=") for arg in argv):
        model.check_chat_template(args.get("lm", "smollm2"), args.get("tokenizer"))
    known = set(inspect.signature(model.REPLUGHarnessLM.__init__).parameters) - {"self", "unknown"}
    checked = {"k", "weights", "corpus", "temperature", "posterior_alpha", "rerank_depth", "stride_tokens",
               "query_tokens", "context_tokens", "lm", "tokenizer", "doc_tokens", "passages"}
    model.check_arguments(unknown={key: v for key, v in args.items() if key not in known},
                          **{key: v for key, v in args.items() if key in checked})


def model_args(argv: list[str]) -> dict:
    """--model_args as lm-eval 0.4.13's parser reads them: its words `key=value,...` each, or a first word that is one
    JSON object (the form for a value holding `{` or a newline, `doc_template` for one: lm-eval refuses a first word
    holding `{` that is not JSON)."""
    import json

    from lm_eval.utils import simple_parse_args_string

    words = model_args_words(argv)
    if not words:
        return {}
    try:
        first = json.loads(words[0])
    except json.JSONDecodeError:
        if "{" in words[0]:
            raise InputError(f"--model_args {words[0]!r}: lm-eval reads words holding {{ as JSON, and this is not "
                             "JSON; give a value holding { or a newline in the JSON form, for example "
                             "--model_args '{\"lm\": \"smollm2\", \"doc_template\": \"{title}\\n{text}\"}'") from None
        first = None
    if isinstance(first, dict):
        return first
    out: dict = {}
    for word in words:
        out.update(simple_parse_args_string(word))
    return out


def model_args_words(argv: list[str]) -> list[str]:
    """The words given to --model_args (or -a): "--model_args=w", or every word after it up to the next flag."""
    for i, arg in enumerate(argv):
        if arg.startswith("--model_args="):
            return [arg.split("=", 1)[1]]
        if arg in ("--model_args", "-a"):
            return list(itertools.takewhile(lambda word: not word.startswith("-"), argv[i + 1:]))
    return []


def flag(argv: list[str], name: str) -> str | None:
    """The value of `name` in `argv` ("--name value" or "--name=value"; the last one given), or None."""
    value = None
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(name + "="):
            value = arg.split("=", 1)[1]
    return value


if __name__ == "__main__":
    main(sys.argv[1:])
