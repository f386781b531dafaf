"""The first minutes of a user at the command line: mistakes get one line and exit 2 before any model loads,
--help lists the configs and a config's keys, --debug shows the traceback."""
import json
import os
import re
import subprocess
import sys
import time

import pytest

from replug_jax.jobs import input_checks
from replug_jax.jobs.config_files import sibling_config
from replug_jax.jobs.input_checks import unused_settings

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
    (["--config.lm=smolm2"], "error: --config.lm='smolm2': unknown LM; LMs: smollm2, qwen2.5-coder-0.5b"),
    (["--config.lm=minilm"], "error: --config.lm='minilm' is an encoder, not an LM; LMs: smollm2,"),
    (["--config.encoder=smollm2"], "error: --config.encoder='smollm2' is an LM, not an encoder; encoders: minilm,"),
    (["--config.job=train"], "error: --config.job='train': must be one of 'lm_eval', 'lsr', 'qa', 'mmlu' — the job this config runs"),
    (["--config.methods=replug,bm52"], "error: --config.methods='replug,bm52': unknown method 'bm52'; the lm_eval job"),
    (["--workdir", "README.md"], "error: --workdir='README.md' is a file, not a folder"),  # was a traceback, exit 1
    (["--workdir", "/dev/null/run"], "error: --workdir='/dev/null/run' cannot be made: Not a directory"),
])
def test_mistakes_get_one_line_and_exit_2_before_any_model_loads(args, message, tmp_path):
    done, seconds = run_main("--config", DEMO, "--workdir", str(tmp_path / "w"), *args)
    assert done.returncode == 2, done.stderr[-2000:]
    assert message in done.stderr and "Traceback" not in done.stderr
    assert len([line for line in done.stderr.splitlines() if line.startswith("error:")]) == 1
    assert done.stderr.startswith("error:"), done.stderr[:500]  # no library logging before it (FAISS's loader was)
    assert "models:" not in done.stdout and seconds < 60  # refused before the encoder or the LM loaded


def _own_data(tmp_path) -> dict[str, str]:
    """A newcomer's files: a corpus, questions with and without answers, an empty corpus, a malformed line."""
    files = {"corpus.jsonl": '{"text": "Velmora is a town. Its mayor is Tobias Grint.", "title": "Velmora"}\n',
             "questions.jsonl": '{"question": "Who is the mayor of Velmora?", "answers": ["Tobias Grint"]}\n',
             "no_answers.jsonl": '{"question": "Who is the mayor of Velmora?"}\n',
             "empty.jsonl": "\n",
             "malformed.jsonl": '{"text": "fine"}\n{"text": "a\tb"}\n'}
    files["table.csv"] = "id,text\n1,Velmora is a town.\n"
    files["array.json"] = '[{"question": "Who is the mayor of Velmora?", "answers": ["Tobias Grint"]}]\n'
    files["shared_ids.jsonl"] = '{"id": "a", "text": "One."}\n{"id": "b", "text": "Two."}\n{"id": "a", "text": "Three."}\n'
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "latin1.jsonl").write_bytes('{"text": "Caf\u00e9 au lait."}\n'.encode("latin-1"))  # not UTF-8
    (tmp_path / "no_txt").mkdir()
    (tmp_path / "no_txt" / "notes.md").write_text("Not a .txt file.")
    return {name.split(".")[0]: str(tmp_path / name) for name in [*files, "latin1.jsonl", "no_txt"]}


@pytest.mark.parametrize("config, args, message", [
    ("experiments/configs/qa_.py", [], "error: --config=experiments/configs/qa_.py: no such config file; did you mean "
                                      "experiments/configs/qa.py?"),
    ("experiments/configs/qa.py", ["--config.questions={no_answers}"], 'no_answers.jsonl, line 1: needs "answers"'),
    ("experiments/configs/qa.py", ["--config.corpus={empty}"], "error: --config.corpus='{empty}' is empty: no document"),
    ("experiments/configs/qa.py", ["--config.corpus={malformed}"],
     "error: {malformed}, line 2, column 12: not valid JSON (Invalid control character)"),
    ("experiments/configs/lm_eval.py", ["--config.eval_data={malformed}"],
     "error: {malformed}, line 2, column 12: not valid JSON (Invalid control character)"),
    ("experiments/configs/lm_eval.py", ["--config.eval_data={empty}"], "error: --config.eval_data='{empty}' is empty"),
    ("experiments/configs/qa.py", ["--config.corpus={latin1}"], "error: {latin1}: not UTF-8 text"),  # was exit 1
    ("experiments/configs/lm_eval.py", ["--config.eval_data={latin1}"], "error: {latin1}: not UTF-8 text"),
    ("experiments/configs/qa.py", ["--config.corpus={shared_ids}"],  # was exit 2 after the models loaded
     "error: --config.corpus='{shared_ids}': two documents share the id 'a'"),
    ("experiments/configs/lm_eval.py", ["--config.corpus={no_txt}"],  # was exit 2 after the models loaded
     "error: --config.corpus='{no_txt}': a folder without .txt files"),
    ("experiments/configs/qa.py", ["--config.corpus={table}"],  # was "not valid JSON" after the models loaded
     "error: --config.corpus='{table}' is a CSV file, which the job does not read: give JSON Lines"),
    ("experiments/configs/qa.py", ["--config.questions={array}"],
     "error: --config.questions='{array}' is a JSON array file, which the job does not read: give JSON Lines"),
])
def test_a_newcomers_mistakes_on_their_own_data_get_one_line_and_exit_2(config, args, message, tmp_path):
    """Issue 51's error contract: a misspelt config file, a question file without answers, an empty corpus and a
    malformed JSONL line (its line and column) each exit 2 with one line, before any model loads."""
    files = _own_data(tmp_path)
    own = [f"--config.corpus={files['corpus']}", "--config.k=1"] + (
        [f"--config.questions={files['questions']}", "--config.shots=0"] if config.endswith("qa.py") else
        [f"--config.eval_data={files['corpus']}", "--config.k_sweep=1"])
    done, seconds = run_main("--config", config, "--workdir", str(tmp_path / "w"), *own,
                             *(a.format(**files) for a in args))
    assert done.returncode == 2, done.stderr[-2000:]
    assert message.format(**files) in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert len([line for line in done.stderr.splitlines() if line.startswith("error:")]) == 1
    assert "models:" not in done.stdout and seconds < 60


def test_help_and_a_second_config_name_a_misspelt_file_in_one_line():
    for args in (["--help", "--config", "experiments/configs/qaa.py"],
                 ["--config", "experiments/configs/qaa.py", "--config", "experiments/configs/qa.py", "--workdir", "w"]):
        done, _ = run_main(*args)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
        assert done.stderr.startswith("error: --config=experiments/configs/qaa.py: no such config file; did you mean "
                                      "experiments/configs/qa.py?")
    done, _ = run_main("--help", "--config", "experiments/configs/qa.py:unused")  # ml_collections' FILE:ARGS form
    assert done.returncode == 0 and "keys of experiments/configs/qa.py:unused" in done.stdout


def test_debug_shows_the_traceback(tmp_path):
    done, _ = run_main("--config", DEMO, "--workdir", str(tmp_path / "w"), "--config.eval_data=/no/such.jsonl",
                       "--debug")
    assert done.returncode != 0 and "Traceback" in done.stderr and "InputError" in done.stderr


@pytest.fixture
def main_in_process(monkeypatch):
    """`python -m replug_jax.main --config demo.py ARGS` run in this process: returns (exit code, stderr, the
    workdir's log.txt). The flags, the log file and the logging levels are put back afterwards."""
    import logging

    from absl import logging as absl_logging
    from absl.testing import flagsaver

    from replug_jax.base import console
    from replug_jax import main as entry

    monkeypatch.delenv("REPLUG_JAX_DEBUG", raising=False)
    root = logging.getLogger()
    levels = (root.level, [(h, h.level) for h in root.handlers], absl_logging.get_verbosity())

    def run(workdir, *args, capsys):
        argv = ["replug_jax.main", "--config", os.path.join(ROOT, DEMO), "--workdir", str(workdir), *args]
        monkeypatch.setattr(sys, "argv", argv)  # where ml_collections finds the --config.KEY overrides
        with pytest.raises(SystemExit) as exit_info:
            entry.main(entry.parse_flags(argv))
        log = open(os.path.join(workdir, "log.txt"), encoding="utf-8").read()
        return exit_info.value.code, capsys.readouterr().err, log

    with flagsaver.flagsaver():
        yield run
    console.close()
    root.setLevel(levels[0])
    for handler, level in levels[1]:
        handler.setLevel(level)
    absl_logging.set_verbosity(levels[2])


def test_a_fault_inside_a_job_says_where_its_traceback_is_and_exits_1(main_in_process, monkeypatch, tmp_path, capsys):
    """A ValueError that is no user's mistake (deep in a job) is not passed off as one: its type and message, the
    log file holding its traceback, exit 1."""
    from replug_jax.jobs import prepare

    def shape_check(*args, **kwargs):
        raise ValueError("shape mismatch")

    monkeypatch.setattr(prepare, "demo_split", shape_check)  # under run_lm_eval -> prepare -> data_paths
    code, err, log = main_in_process(tmp_path / "w", capsys=capsys)
    assert code == 1 and "Traceback" not in err
    assert "error: ValueError: shape mismatch" in err and f"the traceback is in {tmp_path / 'w' / 'log.txt'}" in err
    assert "Traceback (most recent call last)" in log and "in data_paths" in log and "ValueError: shape mismatch" in log


def test_a_user_error_inside_a_job_is_one_line_and_its_traceback_is_logged(main_in_process, tmp_path, capsys):
    code, err, log = main_in_process(tmp_path / "w", "--config.k=0", capsys=capsys)
    assert code == 2 and "Traceback" not in err
    assert [line for line in err.splitlines() if line.startswith("error:")] == [
        "error: --config.k=0: must be a whole number, at least 1 — passages retrieved per input (LSR: per training "
        "query; eval_k at evaluation)"]
    assert "Traceback (most recent call last)" in log and "InputError: --config.k=0" in log


def test_help_lists_the_configs_or_a_configs_keys():
    done, _ = run_main("--help")
    assert done.returncode == 0 and "demo.py" in done.stdout and "qa_lsr.py" in done.stdout
    # each config's first sentence whole (not its first line, which may stop mid-sentence), also across "Dec. 2018"
    assert "SmolLM2-135M." in done.stdout.split("demo.py", 1)[1].splitlines()[0]
    assert "from Wikipedia Dec. 2018" in done.stdout.split("  nq.py", 1)[1].splitlines()[0]
    done, _ = run_main("--help", "--config", DEMO)
    assert done.returncode == 0 and "keys of" in done.stdout
    assert "qa_lsr.py" not in done.stdout  # the keys alone, not the whole list of configs before them
    keys = done.stdout.split("keys of", 1)[1]
    assert "  temperature = 1.0  # the paper's τ on cosine similarity\n      τ of REPLUG's weights" in keys  # base's
    assert "  k = 4  # the reported REPLUG result\n      passages retrieved per input" in keys  # comment (lm_eval.py)
    assert "[a whole number, at least 1]" in keys.split("  k = 4", 1)[1].splitlines()[1]  # the range, from the schema
    assert len(re.findall(r"^  \w+ = ", keys, flags=re.MULTILINE)) == len(sibling_config(os.path.join(ROOT, DEMO), "demo.py"))  # each once
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


def test_settings_no_chosen_method_reads_are_named():
    """posterior_alpha / rerank_depth away from their defaults without replug_posterior among the methods: one
    warning naming each (a run that would look re-ranked but is plain REPLUG); none where replug_posterior runs."""
    assert unused_settings(_config("sciq.py", lm="smollm2")) == []  # α 0.5, 16 → 4 for its posterior
    assert unused_settings(_config("qa.py")) == []  # the defaults: nothing set
    # the values the QA configs ship are nobody's setting, listed methods or not (issue 85: they were warned about)
    assert unused_settings(_config("sciq.py", lm="smollm2", methods=("none", "replug"))) == []
    (both,) = unused_settings(_config("sciq.py", lm="smollm2", methods=("none", "replug"), posterior_alpha=0.3,
                                      rerank_depth=8))
    assert "--config.posterior_alpha=0.3 and --config.rerank_depth=8 unused" in both
    assert "--config.methods=none,replug does not run it" in both
    (depth,) = unused_settings(_config("lm_eval.py", rerank_depth=8))
    assert depth.startswith("--config.rerank_depth=8 unused: only replug_posterior reads it")


def test_a_precision_the_server_ignores_is_named():
    """--config.dtype / param_dtype with a server URL as the LM set the encoder alone: one warning naming them and
    the server, in every job's input warnings (console and results.json); none for a local LM or "auto"."""
    url = "http://127.0.0.1:8000"
    for name in ("qa.py", "lm_eval.py", "mmlu.py", "lsr.py"):
        assert input_checks.precision_a_server_ignores(_config(name, lm=url)) == []  # auto
        assert input_checks.precision_a_server_ignores(_config(name, dtype="bfloat16")) == []  # a local LM: both
        (said,) = input_checks.input_warnings(_config(name, lm=url, dtype="bfloat16"))
        assert said.startswith("--config.dtype='bfloat16' sets the encoder's precision only: the LM at " + url)
    (both,) = input_checks.precision_a_server_ignores(_config("qa.py", lm=url, dtype="bfloat16",
                                                              param_dtype="float32"))
    assert both.startswith("--config.dtype='bfloat16' and --config.param_dtype='float32' set the encoder's")


def test_a_local_lms_split_is_refused_for_a_server():
    """lm_model_parallel with a server URL as the LM would be ignored (the server runs on its own devices): refused,
    naming it; 1 passes."""
    url = "http://127.0.0.1:8000"
    input_checks._check_lm_model_parallel(_config("qa.py", lm=url))
    input_checks._check_lm_model_parallel(_config("qa.py", lm_model_parallel=2))  # a local LM: split
    with pytest.raises(input_checks.InputError, match=r"--config.lm_model_parallel=2 splits a local LM .* is a server"):
        input_checks.check_job_inputs(_config("qa.py", lm=url, lm_model_parallel=2))


def _config(name: str, **overrides):
    config = sibling_config(os.path.join(ROOT, "experiments", "configs", name), name)
    config.update(overrides)
    return config


def test_every_config_takes_a_server_url_as_its_lm_with_lm_tokenizer():
    """--config.lm=http://... with --config.lm_tokenizer: a key of every config ("": the server's /tokenize, or a
    model name whose tokenizer is loaded locally), checked in the first second."""
    configs = sorted(f for f in os.listdir(os.path.join(ROOT, "experiments", "configs")) if f.endswith(".py"))
    assert all("lm_tokenizer" in _config(name) for name in configs)
    for name in ("demo.py", "sciq.py", "qa_lsr.py"):
        for tokenizer in ("", "smollm2"):
            input_checks.check_job_inputs(_config(name, lm="http://127.0.0.1:8000/v1", lm_tokenizer=tokenizer))
        with pytest.raises(input_checks.InputError, match="--config.lm_tokenizer='smolm2': unknown LM"):
            input_checks.check_job_inputs(_config(name, lm="http://127.0.0.1:8000/v1", lm_tokenizer="smolm2"))
        with pytest.raises(input_checks.InputError, match="--config.lm_tokenizer='gpt2' is for an LM behind a server"):
            input_checks.check_job_inputs(_config(name, lm="smollm2", lm_tokenizer="gpt2"))


@pytest.mark.parametrize("name", ["lm_eval.py", "lsr.py", "sciq.py", "sciq_mc.py", "olmes.py"])
def test_every_job_reads_methods_lists_alike(name, tmp_path):
    """`--config.methods=none,replug` arrives as ("none,replug",): each job reads it, tuples, spaces and repeats as
    ("none", "replug") through one parser, and refuses an unknown name before any work, naming what it knows."""
    from replug_jax.jobs.downstream import run_downstream
    from replug_jax.jobs.lm_eval import run_lm_eval
    from replug_jax.jobs.lsr import run_lsr

    config = _config(name)
    for given in (("none,replug",), ("none", " replug "), ("none, replug", "replug")):
        config.methods = given
        assert input_checks.job_methods(config) == ("none", "replug")
    with config.ignore_type():
        config.methods = "none , replug"  # a config file or script may hold the string itself
    assert input_checks.read_methods(config) == ("none", "replug") == config.methods
    known = input_checks.known_methods(config.job)
    config.methods = ("replug,bm52",)
    with pytest.raises(input_checks.InputError, match=rf"^--config.methods='replug,bm52': unknown method 'bm52'; "
                                                      rf"the {config.job} job knows {', '.join(known)} "):
        input_checks.job_methods(config)
    job = {"lm_eval": run_lm_eval, "lsr": run_lsr, "qa": run_downstream, "mmlu": run_downstream}[config.job]
    config.update(lm="/no/such/lm", encoder="/no/such/encoder")  # reaching them would raise another error
    with pytest.raises(input_checks.InputError, match="unknown method 'bm52'"):
        job(config, str(tmp_path / "w"))  # refused before any model or data loads
    config.methods = (" ",)
    with pytest.raises(input_checks.InputError, match="names no method"):
        input_checks.job_methods(config)


def test_k_and_temperatures_are_refused_in_the_first_second(tmp_path):
    corpus = tmp_path / "corpus.jsonl"  # three short documents: one passage each
    corpus.write_text("".join(f'{{"text": "Document {i} is short."}}\n' for i in range(3)))
    qa = dict(corpus=str(corpus), lm="smollm2", k=3, rerank_depth=0)  # sciq.py's posterior re-ranks 16: too deep
    lm_eval = dict(corpus=str(corpus), eval_data=str(corpus), k=2, k_sweep=(1, 2))
    cases = [("sciq.py", dict(qa, k=0), r"--config.k=0: must be a whole number, at least 1 — passages retrieved"),
             ("sciq.py", dict(qa, temperature=0.0), r"--config.temperature=0.0: must be a number, above 0 — τ of"),
             ("sciq.py", dict(qa, temperature=-1.0), r"--config.temperature=-1.0: must be a number, above 0"),
             ("sciq.py", dict(qa, k=4), r"--config.k=4 is larger than the datastore \(3 passages at most from "
                                        rf"--config.corpus='{corpus}'\)"),
             ("lm_eval.py", dict(lm_eval, k_sweep=(1, 0)), r"--config.k_sweep=\(1, 0\): must be a tuple, each item a whole number, at least 1"),
             ("lm_eval.py", dict(lm_eval, k_sweep=(1, 2, 8)), r"--config.k_sweep holds 8, larger than the datastore"),
             ("lm_eval.py", dict(lm_eval, temperature_sweep=(0.1, 0.0)), r"--config.temperature_sweep=\(0.1, 0.0\): must be a tuple, each item a number, above 0"),
             ("lm_eval.py", dict(lm_eval, bm25_temperature=-0.5), r"--config.bm25_temperature=-0.5: must be a number, above 0"),
             ("lsr.py", dict(lm_eval, train_data=str(corpus), eval_k=0, k=4), r"--config.k=4 is larger than the"),
             ("lsr.py", dict(lm_eval, train_data=str(corpus), eval_k=-1, k=2), r"--config.eval_k=-1: must be a whole number, at least 0"),
             ("lsr.py", dict(lm_eval, train_data=str(corpus), gamma=0.0), r"--config.gamma=0.0: must be a number, above 0 — LSR: γ"),
             ("lsr.py", dict(lm_eval, train_data=str(corpus), beta=-1.0), r"--config.beta=-1.0: must be a number, above 0"),
             ("qa_lsr.py", dict(qa, direction="kl"), r"--config.direction='kl': must be one of 'pr_q', 'q_pr'"),
             ("sciq.py", dict(qa, methods=("replug", "replug_posterior"), posterior_alpha=-1.0),
              r"--config.posterior_alpha=-1.0: must be a number, at least 0"),
             ("sciq.py", dict(qa, methods=("replug_posterior",), k=2, rerank_depth=1),
              r"--config.k=2 is above --config.rerank_depth=1 \(replug_posterior scores the top rerank_depth"),
             ("sciq.py", dict(qa, methods=("replug_posterior",), rerank_depth=-1), r"--config.rerank_depth=-1: must be a whole number, at least 0"),
             ("sciq.py", dict(qa, methods=("replug_posterior",), k=8, rerank_depth=4),  # k beyond the corpus first
              r"--config.k=8 is larger than the datastore \(3 passages at most"),
             ("sciq_mc.py", dict(qa, methods=("replug_posterior",), scoring="letters"),
              r"set --config.scoring=options"),
             ("sciq.py", dict(qa, shots=-1), r"--config.shots=-1: must be a whole number, at least 0"),  # was 1-shot, silently
             ("qa.py", dict(qa, max_questions=-2), r"--config.max_questions=-2: must be a whole number, at least 0"),
             ("qa.py", dict(qa, question_offset=-1), r"--config.question_offset=-1: must be a whole number, at least 0"),
             ("lm_eval.py", dict(lm_eval, stride_tokens=0), r"--config.stride_tokens=0: must be a whole number, at least 1"),
             ("lm_eval.py", dict(lm_eval, doc_tokens=-5), r"--config.doc_tokens=-5: must be a whole number, at least 1"),
             ("qa.py", dict(qa, doc_tokens=0), r"--config.doc_tokens=0: must be a whole number, at least 1")]
    started = time.time()
    for name, overrides, message in cases:
        with pytest.raises(input_checks.InputError, match=message):
            input_checks.check_job_inputs(_config(name, **overrides))
    input_checks.check_job_inputs(_config("sciq.py", **qa))  # k = 3 fits three one-passage documents
    input_checks.check_job_inputs(_config("sciq.py", **dict(qa, rerank_depth=16)))  # re-ranks the whole datastore
    input_checks.check_job_inputs(_config("lm_eval.py", **lm_eval))
    assert time.time() - started < 5


def test_k_above_the_passages_is_refused_before_the_lm_loads_where_the_byte_bound_cannot_tell(tmp_path, monkeypatch):
    """Issue 69, item 3: three documents of ~40 tokens (over 128 bytes) make three passages of 128 tokens, but their
    bytes bound the count at 6: k=5 is refused by the exact count, cut by the LM's tokenizer alone (no model loaded), naming 3
    passages; k=3 passes without cutting (three documents with text give three passages or more)."""
    import replug_jax.loading as loading

    corpus = tmp_path / "corpus.jsonl"
    sentence = "the river runs north past the old mill, the bridge and the three farms of the valley"
    corpus.write_text("".join(json.dumps({"text": f"Document {i} says that {sentence}, and that {sentence}."}) + "\n"
                              for i in range(3)))
    config = _config("qa.py", corpus=str(corpus), questions="demo", lm="smollm2", k=5, rerank_depth=0)
    assert input_checks.passages_at_most(config) == 6
    monkeypatch.setattr(loading, "load_lm", lambda *a, **k: pytest.fail("an LM loaded"))
    with pytest.raises(input_checks.InputError, match=rf"--config.k=5 is larger than the datastore \(3 passages from "
                                                      rf"--config.corpus='{corpus}'\)"):
        input_checks.check_job_inputs(config)
    monkeypatch.setattr(loading, "load_tokenizer", lambda *a, **k: pytest.fail("cut to count"))
    input_checks.check_job_inputs(_config("qa.py", corpus=str(corpus), questions="demo", lm="smollm2", k=3,
                                          rerank_depth=0))


@pytest.mark.parametrize("script", sorted(f for f in os.listdir(os.path.join(ROOT, "experiments")) if f.endswith(".py")))
def test_experiment_scripts_import_and_explain_themselves(script):
    done = subprocess.run([sys.executable, os.path.join("experiments", script), "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "usage:" in done.stdout, done.stderr[-2000:]


def test_the_tpu_pages_commands_name_configs_and_keys_that_exist():
    """Every `replug_jax.main` and `replug_jax.plan` command of the TPU page (docs/tpu.md, linked from the README)
    names an existing config and its keys."""
    import re

    assert "(docs/tpu.md)" in open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    section = open(os.path.join(ROOT, "docs", "tpu.md"), encoding="utf-8").read()
    commands = re.findall(r"replug_jax\.main (.*?)(?:'|\n```)", section.replace("\\\n", " "), flags=re.S)
    plans = re.findall(r"replug_jax\.plan (--config .*?)(?:\n```|`)", section.replace("\\\n", " "), flags=re.S)
    assert len(commands) == 2 and len(plans) >= 1
    for command in commands + plans:
        config_path = re.search(r"--config (\S+\.py)", command)[1]
        config = sibling_config(os.path.join(ROOT, config_path), os.path.basename(config_path))
        keys = re.findall(r"--config\.([a-z_]+)=", command)
        assert keys and all(k in config for k in keys), (config_path, [k for k in keys if k not in config])


def test_a_question_file_without_answers_is_an_input_error(tmp_path):
    """A QA job's question file whose rows have no (or malformed) "answers" is the user's input: one line naming
    the file and line, exit 2 (not a fault's exit 1)."""
    from replug_jax.data import question_sets

    questions = tmp_path / "questions.jsonl"
    for row in ('{"question": "Who?", "answers": 3}', '{"question": "Who?"}'):
        questions.write_text(row + "\n")
        with pytest.raises(input_checks.InputError, match="line 1: needs \"answers\""):
            question_sets.read_qa_jsonl(str(questions))
    done, _ = run_main("--config", os.path.join("experiments", "configs", "demo_qa.py"), "--workdir",
                       str(tmp_path / "w"), f"--config.questions={questions}")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert [line for line in done.stderr.splitlines() if line.startswith("error:")] == [
        f'error: {questions}, line 1: needs "answers": a non-empty list of non-empty strings']


def test_documents_without_text_are_refused_naming_them_or_left_out_with_a_warning(tmp_path):
    """Issue 69, item 2: a document with no text (none, or whitespace) would vanish from the datastore or the held-out
    windows; it is refused in the first second naming how many and which, and --config.drop_empty_documents leaves
    them out with a warning naming them. Passages of a few tokens are warned about."""
    corpus = tmp_path / "corpus.jsonl"
    rows = [{"id": "a", "text": "Velmora is a town."}, {"id": "b", "text": ""}, {"id": "c", "text": " \n "}]
    rows += [{"id": f"e{i}", "text": ""} for i in range(5)]
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows))
    questions = tmp_path / "questions.jsonl"
    questions.write_text('{"question": "Who?", "answers": ["Tobias"]}\n')
    qa = dict(corpus=str(corpus), questions=str(questions), k=1, shots=0, methods=("none", "replug", "replug_posterior"))
    lm_eval = dict(corpus=str(tmp_path / "fine.jsonl"), eval_data=str(corpus), k=1, k_sweep=(1,))
    (tmp_path / "fine.jsonl").write_text('{"text": "Velmora is a town."}\n')
    for name, overrides, key in (("qa.py", qa, "corpus"), ("lm_eval.py", lm_eval, "eval_data")):
        with pytest.raises(input_checks.InputError, match=rf"--config.{key}='{corpus}' has 7 documents without text "
                           r"\(id 'b', 'c', 'e0', 'e1', 'e2' and 2 more\): give them text, or set "
                           r"--config.drop_empty_documents=True"):
            input_checks.check_job_inputs(_config(name, **overrides))
        config = _config(name, **overrides, drop_empty_documents=True)
        input_checks.check_job_inputs(config)
        assert input_checks.input_warnings(config) == [
            f"--config.{key}: left out 7 documents without text (id 'b', 'c', 'e0', 'e1', 'e2' and 2 more) "
            "(--config.drop_empty_documents)"]
    assert input_checks.input_warnings(_config("qa.py", **qa, doc_tokens=16)) == []
    (short,) = input_checks.input_warnings(_config("qa.py", **qa, doc_tokens=3))
    assert short.startswith("--config.doc_tokens=3: passages of 3 tokens hold a few words each")


def test_a_document_without_text_in_a_folder_is_refused_by_the_job_in_one_line(tmp_path):
    """Issue 85, item 7: the first-second check reads small JSONL and .txt files; a folder of .txt files (like a JSONL
    over 16 MiB, DPR's tsv, the REPLUG object and the harness) is read as it is chunked, by the same rule: a document
    without text refused in one line naming it (it was dropped without a word), or left out with a warning."""
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "velmora.txt").write_text("Velmora is a town on the coast. Its lighthouse is old. " * 4)
    (folder / "blank.txt").write_text(" \n ")
    held_out = tmp_path / "held_out.jsonl"
    held_out.write_text(json.dumps({"text": "Velmora has a harbour and a lighthouse on the coast. " * 8}) + "\n")
    args = ["--config", os.path.join("experiments", "configs", "lm_eval.py"), "--workdir", str(tmp_path / "run"),
            f"--config.corpus={folder}", f"--config.eval_data={held_out}", "--config.k=1", "--config.k_sweep=1",
            "--config.methods=replug"]
    done, _ = run_main(*args)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2 and len(errors) == 1, done.stderr[-3000:]
    assert "1 document without text (id 'blank')" in errors[0] and "drop_empty_documents" in errors[0], errors
    done, _ = run_main(*args, "--config.drop_empty_documents=True")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "left out 1 document without text (id 'blank')" in done.stdout + done.stderr
