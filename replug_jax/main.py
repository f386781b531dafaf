"""Entry point: python -m replug_jax.main --config experiments/configs/demo.py --workdir runs/demo

Single values are overridden on the command line (`--config.k=4`). The config's `job`
names what runs; the work itself lives in importable modules. The console shows one line per
phase, progress bars and the results; library logging goes to WORKDIR/log.txt (`--verbosity=0`
shows it on the console too).
"""
from __future__ import annotations

from absl import app, flags, logging
from ml_collections import config_flags

from replug_jax import console, distributed
from replug_jax.dispatch import run_job as run_named_job

_CONFIG = config_flags.DEFINE_config_file("config", None, "experiment config file (a get_config() module)")
_WORKDIR = flags.DEFINE_string("workdir", None, "directory for datastore, embeddings, index and results")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    del argv
    distributed.fail_fast(run_job, _CONFIG.value)


def run_job(config):
    lead = True
    # several processes (TPU VM hosts with multihost=True, or replug_jax.launch): only process 0 prints and writes
    if distributed.initialize(config.get("multihost", False)):
        lead = distributed.is_lead()
    verbosity = flags.FLAGS.verbosity if flags.FLAGS["verbosity"].present else -1
    log_path = console.setup(_WORKDIR.value, verbosity, enabled=lead)
    console.phase(f"{config.job} job, workdir {_WORKDIR.value} (library log: {log_path}; --verbosity=0 shows it here)")
    logging.info("config:\n%s", config)
    run_named_job(config, _WORKDIR.value)
    distributed.barrier(f"{config.job} job done")  # several processes leave together


if __name__ == "__main__":
    app.run(main)
