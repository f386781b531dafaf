"""One schema for every setting (replug_jax/base/settings.py): every config key declared with its range and meaning,
each range refusing what it should, and every entry point (the command line, the experiments scripts, the REPLUG
object, LSRSettings) refusing a value out of range through it before any model loads."""
import glob
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from replug_jax.base import settings
from replug_jax.base.errors import InputError
from replug_jax.jobs import input_checks
from replug_jax.jobs.config_files import sibling_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = sorted(glob.glob(os.path.join(ROOT, "experiments", "configs", "*.py")))


def _config(name: str):
    return sibling_config(os.path.join(ROOT, "experiments", "configs", name), name)


def test_every_key_of_every_config_is_declared_with_a_range_and_a_meaning():
    used = set()
    for path in CONFIGS:
        config = sibling_config(path, os.path.basename(path))
        undeclared = sorted(set(config.keys()) - set(settings.SETTINGS))
        assert not undeclared, f"{os.path.basename(path)}: keys without a declared range: {undeclared}"
        settings.check_settings(config)  # every shipped default is in its own range
        used |= set(config.keys())
    assert not set(settings.SETTINGS) - used, "declared settings no config has"
    for key, setting in settings.SETTINGS.items():
        assert isinstance(setting.range, settings.Range.__args__) and setting.range.says(), key
        assert setting.meaning.strip(), key


def test_every_config_names_methods_its_job_knows():
    """As shipped, each config's methods are ones its job runs (qa_lsr.py inherited sciq.py's "vote", which the
    LSR job refused in its first second)."""
    for path in CONFIGS:
        config = sibling_config(path, os.path.basename(path))
        input_checks.job_methods(config)


def test_each_range_refuses_what_it_should():
    whole, positive = settings.Whole(1), settings.Number(above=0)
    assert whole.problem(np.int64(2)) is None and positive.problem(np.float32(0.5)) is None  # numpy's numbers too
    for bad in (0, -3, True, 1.5, "3", None):
        assert whole.problem(bad), bad
    for bad in (0, -0.1, float("nan"), float("inf"), True, "1", None):
        assert positive.problem(bad), bad
    assert settings.Whole(0, none="all").problem(None) is None and settings.Number(above=0, none="off").problem(None) is None
    bounded = settings.Number(least=0, below=1)
    assert bounded.problem(0) is None and bounded.problem(1.0) and bounded.problem(-0.01)
    assert settings.Whole(1, most=4).problem(5) and settings.Whole(1, most=4).problem(4) is None
    choice = settings.Choice(("a", "b"))
    assert choice.problem("a") is None and choice.problem("c") and choice.problem(None)
    assert settings.Flag().problem(True) is None and settings.Flag().problem(1) and settings.Flag().problem("True")
    assert settings.Text("x").problem("") is None and settings.Text("x").problem(3)
    several = settings.Several(settings.Whole(1))
    assert several.problem(()) is None and several.problem([1, 2]) is None
    assert several.problem((1, 0)) and several.problem(3) and several.problem("1,2")
    names = settings.Names("methods")
    assert names.problem("none,replug") is None and names.problem(("none",)) is None and names.problem((1,))


def test_the_schemas_choices_are_those_the_code_branches_on():
    from replug_jax.evaluate import demo_passages, option_text, qa
    from replug_jax.jobs import JOBS, prepare
    from replug_jax.method import lsr_loss, posterior
    from replug_jax.retrieval import build
    from replug_jax.train import batch

    owned = {"job": JOBS, "direction": lsr_loss.DIRECTIONS, "lm_score": batch.LM_SCORES,
             "lsr_target": batch.LSR_TARGETS, "posterior_evidence": posterior.EVIDENCES, "scoring": option_text.SCORINGS,
             "option_metric": ("",) + option_text.OPTION_METRICS, "ensemble": qa.ENSEMBLES,
             "demo_passages": demo_passages.DEMO_PASSAGES, "wiki_split": prepare.WIKI_SPLITS,
             "index_backend": build.INDEX_BACKENDS}
    for key, choices in owned.items():
        assert set(settings.SETTINGS[key].range.choices) == set(choices), key


def test_a_config_file_with_an_undeclared_key_is_refused(tmp_path):
    config = _config("demo.py")
    config.temprature = 2.0  # a user's own config file, misspelt: no job would read it
    with pytest.raises(InputError, match=r"^--config.temprature: not a setting of any job"):
        input_checks.check_job_inputs(config)


def test_the_command_line_and_an_experiments_script_refuse_through_the_schema_in_seconds(tmp_path):
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    commands = {  # a key the old per-key checks never looked at, and a script's flag that becomes a config key
        "main": ([sys.executable, "-m", "replug_jax.main", "--config", "experiments/configs/demo_qa.py", "--workdir",
                  str(tmp_path / "w"), "--config.encoder_batch_size=0"],
                 "error: --config.encoder_batch_size=0: must be a whole number, at least 1 — texts per encoder"),
        "script": ([sys.executable, "experiments/posterior_qa.py", "--questions", "-3", "--workdir", str(tmp_path / "p"),
                    "--runs", "concat", "--baseline", "concat:concat"],
                   "error: --config.max_questions=-3: must be a whole number, at least 0 — questions evaluated"),
    }
    for name, (command, message) in commands.items():
        started = time.time()
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
        assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr, (name, done.stderr)
        assert time.time() - started < 30, name  # no model was loaded (a model takes longer on these 2 cores)


def test_the_replug_object_and_lsr_settings_refuse_through_the_schema():
    import replug_jax as rj
    from replug_jax.train.loop import LSRSettings

    with pytest.raises(InputError, match=r"^posterior_alpha=nan: must be a number, at least 0"):
        rj.REPLUG.from_documents(["Velmora is a town."], lm="/no/such/lm", weights="replug_posterior",
                                 posterior_alpha=float("nan"))
    with pytest.raises(InputError, match=r"^rerank_depth=2.5: must be a whole number"):
        rj.REPLUG.from_documents(["Velmora is a town."], lm="/no/such/lm", weights="replug_posterior", rerank_depth=2.5)
    with pytest.raises(InputError, match=r"^LSRSettings: warmup_fraction=1.0: must be a number, at least 0 and below 1"):
        LSRSettings(warmup_fraction=1.0)
    with pytest.raises(InputError, match=r"^LSRSettings: clip_norm=0.0: must be a number, above 0 \(or None"):
        LSRSettings(clip_norm=0.0)
    assert LSRSettings(clip_norm=None, k=np.int64(4)).k == 4  # None: no clipping; numpy's integers are whole numbers


def test_the_replug_object_and_the_qa_job_take_one_default():
    """Issue 69, item 5: the REPLUG object given nothing and experiments/configs/qa.py mix alike: the object's
    weights, k, τ, α, re-ranking depth and passage length are the QA config's (QA_DEFAULTS, declared once), and
    posterior settings given with the paper's weights are refused rather than ignored."""
    import inspect

    import replug_jax as rj
    from replug_jax.retrieval.datastore import Datastore

    qa = sibling_config(os.path.join(ROOT, "experiments", "configs", "qa.py"), "qa.py")
    store = Datastore(ids=[f"p{i}" for i in range(20)], titles=[""] * 20, texts=["text"] * 20, sources=["d"] * 20)
    retriever = type("Retriever", (), {"retrieve": lambda self, queries, k: None})()
    lm = type("LM", (), {"score": lambda self, contexts, continuations: None})()
    rag = rj.REPLUG(lm, retriever, store)
    assert rag.weights in qa.methods and rag.weights == settings.QA_WEIGHTS == "replug_posterior"
    assert (rag.k, rag.temperature, rag.posterior_alpha, rag.depth) == (qa.k, qa.temperature, qa.posterior_alpha,
                                                                        max(qa.k, qa.rerank_depth))
    given = inspect.signature(rj.REPLUG.from_documents).parameters
    assert (given["k"].default, given["temperature"].default, given["doc_tokens"].default) == (
        qa.k, qa.temperature, qa.doc_tokens)
    assert rj.REPLUG(lm, retriever, store, k=18).depth == 18  # the default depth never below k
    paper = rj.REPLUG(lm, retriever, store, weights="replug", temperature=1.0)
    assert (paper.weights, paper.depth) == ("replug", qa.k)
    with pytest.raises(ValueError, match="posterior_alpha=0.5 would be ignored"):
        rj.REPLUG(lm, retriever, store, weights="replug", posterior_alpha=0.5)
