"""The TPU plan of a job, on any machine: python -m replug_jax.plan --config CONFIG.py --tpu v5e-8 [--config.KEY=V]

Every device program the job would run on that slice is compiled by the TPU compiler here (libtpu; no TPU needed,
nothing runs), at the job's shapes and shardings, and the plan prints what each holds per chip, its estimated time,
MFU and throughput, and the whole job's time and chip-hours; `--out DIR` writes plan.json and plan.md there. A job
whose program does not fit is refused in one line naming the program, its bytes per chip and the smallest
`lm_model_parallel` that fits (exit 2). docs/tpu.md says how to read it.

    python -m replug_jax.plan --config experiments/configs/nq.py --tpu v5e-8 --config.lm=llama-2-7b
    python -m replug_jax.plan --config experiments/configs/pile_lsr.py --tpu v4-32 --passages 36000000

Counts the config does not give (a corpus file's passages, the windows of an LM evaluation) are flags; token
counts of the texts can be set with --sizes question=20,answer=8 (workload.TextSizes).
"""
from __future__ import annotations

import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the plan's JAX runs on the CPU; the TPU is only compiled for

from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from replug_jax.jobs import command_line  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "experiment config file (a get_config() module)")
_TPU = flags.DEFINE_string("tpu", None, "the TPU slice: v5e-8, v6e-8, v4-8, v5p-8, v4-32, v5e-256, or a topology")
_OUT = flags.DEFINE_string("out", "", "write plan.json and plan.md in this folder")
_PASSAGES = flags.DEFINE_integer("passages", 0, "passages in the datastore (default: what the config names)")
_QUESTIONS = flags.DEFINE_integer("questions", 0, "questions evaluated (default: the config's question set)")
_WINDOWS = flags.DEFINE_integer("windows", 0, "held-out windows an LM evaluation scores")
_SIZES = flags.DEFINE_string("sizes", "", "token counts of the texts, NAME=N,...: " + ", ".join(
    ("question", "answer", "answers_per_question", "passage", "passage_encoder", "mc_question", "mc_shot")))
flags.DEFINE_bool("debug", False, "show the traceback of a failure")
USAGE = "usage: python -m replug_jax.plan --config CONFIG.py --tpu v5e-8 [--config.KEY=VALUE ...] [--out DIR]"


def parse_sizes(text: str) -> dict:
    import dataclasses

    from replug_jax.base.errors import InputError
    from replug_jax.plan.workload import TextSizes

    known = {f.name: f.type for f in dataclasses.fields(TextSizes)}
    out = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = item.partition("=")
        if name not in known:
            raise InputError(f"--sizes: unknown size {name!r}; known: {', '.join(known)}")
        try:
            out[name] = float(value) if name == "answers_per_question" else int(value)
        except ValueError:
            raise InputError(f"--sizes: {name}={value!r} is not a number") from None
    return out


def main(argv):
    del argv
    debug = flags.FLAGS.debug
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # the libraries' INFO lines (FAISS's loader, ...) stay quiet
    with command_line.user_errors_as_one_line(debug=debug, usage=USAGE):
        from replug_jax.base import settings
        from replug_jax.parallel.tpu import UnknownSlice
        from replug_jax.plan import planner, report, workload

        from replug_jax.jobs.input_checks import read_methods

        config = _CONFIG.value
        settings.check_settings({k: v for k, v in config.items()})
        read_methods(config)  # "a,b" from the command line as the jobs read it
        counts = workload.counts_for(config, {"passages": _PASSAGES.value, "questions": _QUESTIONS.value,
                                              "windows": _WINDOWS.value})
        try:
            plan = planner.plan_job(config, _TPU.value, counts, parse_sizes(_SIZES.value),
                                    progress=lambda line: print(line, file=sys.stderr, flush=True))
        except UnknownSlice as e:
            raise planner.InputError(str(e)) from e
        plan["command"] = "python -m replug_jax.plan " + " ".join(sys.argv[1:])
        print(report.tables(plan))
        if _OUT.value:
            paths = report.write(plan, _OUT.value)
            print(f"\nwritten: {', '.join(paths)}")


def parse_flags(argv: list[str]) -> list[str]:
    debug = "--debug" in argv or command_line.debug_requested()
    with command_line.user_errors_as_one_line(debug=debug, usage=USAGE, also=(
            flags.Error, AttributeError, KeyError, TypeError, ValueError, FileNotFoundError, SyntaxError)):
        if any(a in ("-h", "--help", "--helpshort") for a in argv[1:]):
            print(__doc__)
            sys.exit(0)
        for given in command_line.config_arguments(argv):
            command_line.check_config_file(given)
        try:
            rest = flags.FLAGS(argv)
        except AttributeError as e:
            raise ValueError(f"unknown config key {command_line.one_line(e)}") from e
        missing = [f"--{name}" for name in ("config", "tpu") if flags.FLAGS[name].value is None]
        if missing:
            raise ValueError(f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} required")
        return rest


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
