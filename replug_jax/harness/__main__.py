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
        cli_evaluate()
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


def check_replug_arguments(argv: list[str]) -> None:
    """`model.check_arguments` of `--model_args` when `--model replug` is asked for."""
    from lm_eval.utils import simple_parse_args_string

    from replug_jax.harness import model

    if flag(argv, "--model") != "replug":
        return
    args = simple_parse_args_string(flag(argv, "--model_args") or "")
    known = set(inspect.signature(model.REPLUGHarnessLM.__init__).parameters) - {"self", "unknown"}
    checked = {"k", "weights", "corpus", "temperature", "posterior_alpha", "rerank_depth", "stride_tokens",
               "query_tokens", "context_tokens", "lm", "tokenizer", "doc_tokens"}
    model.check_arguments(unknown={key: v for key, v in args.items() if key not in known},
                          **{key: v for key, v in args.items() if key in checked})


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
