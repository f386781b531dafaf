"""Several jobs, one after the other, in one launch of several processes (a child of `replug_jax.launch` in
tests/test_multiprocess.py), so that the jobs of one mesh layout share the processes' start-up:

    python tests/jobs_multiprocess_run.py CONFIG.py WORKDIR [CONFIG.py WORKDIR ...]

Each config file runs as `python -m replug_jax.main --config CONFIG.py --workdir WORKDIR` runs it: the same input
checks and job, the console on process 0, the processes leaving each job together, a failure ending them all.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from replug_jax.base import console  # noqa: E402
from replug_jax.parallel import distributed
from replug_jax.jobs.config_files import sibling_config  # noqa: E402
from replug_jax.main import run_job  # noqa: E402

assert distributed.initialize(), "not started by replug_jax.launch"


def run_all(pairs):
    for config_path, workdir in pairs:
        config = sibling_config(config_path, os.path.basename(config_path))
        console.setup(workdir, -1, enabled=distributed.is_lead())
        run_job(config, workdir)
        distributed.barrier(f"{config.job} job done")


if __name__ == "__main__":
    args = sys.argv[1:]
    assert args and len(args) % 2 == 0, __doc__
    distributed.fail_fast(run_all, list(zip(args[::2], args[1::2])))
