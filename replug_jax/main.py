"""Entry point: python -m replug_jax.main --config experiments/configs/demo.py --workdir runs/demo

Single values are overridden on the command line (`--config.k=4`). The config's `job`
names what runs; the work itself lives in importable modules. The console shows one line per
phase, progress bars and the results; library logging goes to WORKDIR/log.txt (`--verbosity=0`
shows it on the console too). `--help` lists the configs (with `--config`, that config's keys).
A user error (a bad flag or key, a missing file, an unknown name: replug_jax/base/errors.py) prints one line and
exits 2; any other failure prints `error: <Type>: <message>` and exits 1. Every failure's traceback is in
WORKDIR/log.txt; `--debug` (or REPLUG_JAX_DEBUG=1) shows it on the console too.
"""
from __future__ import annotations

import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from replug_jax.base import console
from replug_jax.base.errors import InputError
from replug_jax.jobs import JOBS, bucket_workdirs, command_line
from replug_jax.parallel import distributed

_CONFIG = config_flags.DEFINE_config_file("config", None, "experiment config file (a get_config() module)")
_WORKDIR = flags.DEFINE_string("workdir", None, "directory for datastore, embeddings, index and results")
flags.DEFINE_bool("debug", False, "show the traceback of a failure here too (or set REPLUG_JAX_DEBUG=1)")
USAGE = "usage: python -m replug_jax.main --config CONFIG.py --workdir DIR [--config.KEY=VALUE ...] [--debug]"


def main(argv):
    del argv
    with command_line.job_failures_reported(debug=flags.FLAGS.debug):
        distributed.fail_fast(run_from_flags, _CONFIG.value)


def run_from_flags(config):
    """The job the --config flag names, in the --workdir flag's folder (staged first where it is a bucket)."""
    lead = True
    # several processes (TPU VM hosts with multihost=True, or replug_jax.launch): only process 0 prints and writes
    if distributed.initialize(config.get("multihost", False)):
        lead = distributed.is_lead()
    verbosity = flags.FLAGS.verbosity if flags.FLAGS["verbosity"].present else -1
    try:
        staging = bucket_workdirs.staged(_WORKDIR.value)  # a bucket workdir: checked and pulled before any work
    except ValueError as e:  # the --workdir flag refused, before any log file exists: one line, as a flag error
        raise InputError(str(e)) from e
    workdir = staging.local if staging else _WORKDIR.value
    if lead and not staging:
        command_line.check_workdir(workdir)  # a file, or a folder that cannot be made: one line, exit 2
    try:
        log_path = console.setup(workdir, verbosity, enabled=lead)
        staged = f", staged in {workdir}" if staging else ""
        console.phase(f"{config.job} job, workdir {_WORKDIR.value}{staged} (library log: {log_path}; "
                      "--verbosity=0 shows it here)")
        logging.info("config:\n%s", config)
        run_job(config, workdir)
        distributed.barrier(f"{config.job} job done")  # several processes leave together
    except BaseException as e:
        if not isinstance(e, SystemExit):
            console.log_failure(e)  # every failure's traceback in WORKDIR/log.txt (before a bucket workdir's push)
        raise
    finally:
        bucket_workdirs.finish(staging)  # pushed back to the bucket, failed or not


def run_job(config, workdir: str, **options) -> dict:
    """Run the job `config.job` names in `workdir` (what this entry point and the experiment scripts call); options
    go to the job (the downstream jobs take `lm`). The jobs are imported once the inputs are checked, so a mistake
    is refused before JAX and the models load."""
    from replug_jax.jobs.input_checks import check_job_inputs

    check_job_inputs(config)  # in the first second: nothing loaded or embedded yet
    from replug_jax.jobs.input_checks import read_methods
    from replug_jax.jobs.results_file import keep_earlier_run

    read_methods(config)  # as the jobs read it (a tuple), as results.json records it
    if distributed.is_lead():
        earlier = keep_earlier_run(workdir, config)  # said before this run writes over it
        if earlier:
            console.phase(f"warning: {earlier}")
    if config.job == "lm_eval":
        from replug_jax.jobs.lm_eval import run_lm_eval as job
    elif config.job == "lsr":
        from replug_jax.jobs.lsr import run_lsr as job
    elif config.job in ("qa", "mmlu"):
        from replug_jax.jobs.downstream import run_downstream as job
    else:
        raise ValueError(f"unknown job {config.job!r} (known: {', '.join(JOBS)})")  # (check_job_inputs says so first)
    return job(config, workdir, **options)


def parse_flags(argv: list[str]) -> list[str]:
    """absl's flag parsing, with `--help` listing the configs (and a config's keys) and a bad flag or config key
    reported in one line (exit 2)."""
    debug = "--debug" in argv or command_line.debug_requested()
    with command_line.user_errors_as_one_line(debug=debug, usage=USAGE, also=(  # no workdir yet: all one line
            flags.Error, AttributeError, KeyError, TypeError, ValueError, FileNotFoundError, NotADirectoryError,
            SyntaxError)):  # SyntaxError: the user's own config file
        if any(a in ("-h", "--help", "--helpshort") for a in argv[1:]):
            print(command_line.help_text(argv, USAGE))
            sys.exit(0)
        for given in command_line.config_arguments(argv):  # before absl: a misspelt file would surface as a
            command_line.check_config_file(given)  # traceback at its first use
        config_file = command_line.config_argument(argv)
        try:
            rest = flags.FLAGS(argv)
        except AttributeError as e:  # ml_collections: an override of a key the config does not have
            raise ValueError(f"unknown config key {command_line.one_line(e)}") from e
        missing = [f"--{name}" for name in ("config", "workdir") if flags.FLAGS[name].value is None]
        if missing:
            raise ValueError(f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} required")
        try:
            _CONFIG.value.get("job")  # loaded here (a failed load raises at its first read): one line too
        except OSError as e:
            raise ValueError(f"--config={config_file}: could not be loaded ({command_line.one_line(e)[-300:]})") from e
        return rest


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    app.run(main, flags_parser=parse_flags)
