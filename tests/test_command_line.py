"""The first minutes of a user at the command line: mistakes get one line and exit 2 before any model loads,
--help lists the configs and a config's keys, --debug shows the traceback."""
import os
import subprocess
import sys
import time

import pytest

from replug_jax import input_checks
from replug_jax.config_files import sibling_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join("experiments", "configs", "demo.py")


def run_main(*args, env=None):
    started = time.time()
    done = subprocess.run([sys.executable, "-m", "replug_jax.main", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "JAX_PLATFORMS": "cpu", **(env or {})})
    return done, time.time() - started


@pytest.mark.parametrize("args, message", [
    (["--config.temprature=2"], 'error: unknown config key \'temprature\' Did you mean "temperature"'),
    (["--config.eval_data=/no/such.jsonl"], "error: --config.eval_data='/no/such.jsonl': no such file or directory"),
    (["--config.lm=smolm2"], "error: --config.lm='smolm2': unknown model; use one of"),
    (["--config.job=train"], "error: --config.job='train': unknown job; use one of lm_eval, lsr, qa, mmlu"),
])
def test_mistakes_get_one_line_and_exit_2_before_any_model_loads(args, message, tmp_path):
    done, seconds = run_main("--config", DEMO, "--workdir", str(tmp_path / "w"), *args)
    assert done.returncode == 2, done.stderr[-2000:]
    assert message in done.stderr and "Traceback" not in done.stderr
    assert len([line for line in done.stderr.splitlines() if line.startswith("error:")]) == 1
    assert "models:" not in done.stdout and seconds < 60  # refused before the encoder or the LM loaded


def test_debug_shows_the_traceback(tmp_path):
    done, _ = run_main("--config", DEMO, "--workdir", str(tmp_path / "w"), "--config.eval_data=/no/such.jsonl",
                       "--debug")
    assert done.returncode != 0 and "Traceback" in done.stderr and "InputError" in done.stderr


def test_help_lists_the_configs_and_a_configs_keys():
    done, _ = run_main("--help")
    assert done.returncode == 0 and "demo.py" in done.stdout and "qa_lsr.py" in done.stdout
    done, _ = run_main("--help", "--config", DEMO)
    assert done.returncode == 0 and "keys of" in done.stdout and "  temperature = 1.0" in done.stdout
    done, _ = run_main("--config", DEMO)
    assert done.returncode == 2 and "error: --workdir is required" in done.stderr


def test_input_checks_cover_every_job(tmp_path):
    configs = os.path.join(ROOT, "experiments", "configs")
    qa = sibling_config(os.path.join(configs, "sciq.py"), "sciq.py")
    qa.lm = "smollm2"
    input_checks.check_job_inputs(qa)  # packaged names pass
    qa.methods = ("replug", "replug_lsr")
    qa.retriever_workdir = str(tmp_path)
    with pytest.raises(input_checks.InputError, match="retriever.safetensors does not exist"):
        input_checks.check_job_inputs(qa)
    mmlu = sibling_config(os.path.join(configs, "mmlu.py"), "mmlu.py")  # DPR's passages are not here
    with pytest.raises(input_checks.InputError, match="corpus='psgs_w100.tsv': no such file"):
        input_checks.check_job_inputs(mmlu)
    lsr = sibling_config(os.path.join(configs, "qa_lsr.py"), "qa_lsr.py")
    input_checks.check_job_inputs(lsr)
    lsr.train_data = str(tmp_path / "missing.jsonl")
    with pytest.raises(input_checks.InputError, match="train_data"):
        input_checks.check_job_inputs(lsr)


@pytest.mark.parametrize("script", sorted(f for f in os.listdir(os.path.join(ROOT, "experiments")) if f.endswith(".py")))
def test_experiment_scripts_import_and_explain_themselves(script):
    done = subprocess.run([sys.executable, os.path.join("experiments", script), "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "usage:" in done.stdout, done.stderr[-2000:]


def test_the_readmes_tpu_commands_name_configs_and_keys_that_exist():
    """Every `replug_jax.main` command in the README's TPU section names an existing config and its keys."""
    import re

    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    section = text[text.index("## On TPU VMs"):text.index("## The demo:")]
    commands = re.findall(r"replug_jax\.main (.*?)(?:'|\n```)", section.replace("\\\n", " "), flags=re.S)
    assert len(commands) == 2
    for command in commands:
        config_path = re.search(r"--config (\S+\.py)", command)[1]
        config = sibling_config(os.path.join(ROOT, config_path), os.path.basename(config_path))
        keys = re.findall(r"--config\.([a-z_]+)=", command)
        assert keys and all(k in config for k in keys), (config_path, [k for k in keys if k not in config])
