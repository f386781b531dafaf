"""The README as a newcomer runs it: its own-data commands run as written on the files it names (the jobs finish,
write what the README says they write), and its Python blocks print the weights the README shows."""
import json
import math
import os
import re
import shlex
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()


def section(title: str) -> str:
    start = README.index(f"## {title}")
    return README[start : README.index("\n## ", start + 1)]


def code_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def readme_commands() -> list[list[str]]:
    """The own-data section's commands as argv lists, its `D=...` variable put in and `python` this interpreter."""
    block = code_blocks(section("Your own data"), "bash")[0].replace("\\\n", " ")
    variables: dict[str, str] = {}
    commands = []
    for line in block.splitlines():
        for part in (p.strip() for p in line.split(";")):
            if re.fullmatch(r"\w+=\S+", part):
                name, value = part.split("=", 1)
                variables[name] = value
            elif part.startswith("python "):
                for name, value in variables.items():
                    part = part.replace(f"${name}", value)
                commands.append([sys.executable] + shlex.split(part)[1:])
    return commands


def run_python(code: str) -> str:
    """What `python -c code` prints, run from the repository as a newcomer runs it: a fresh process on the machine's
    own devices (one CPU device, not the test process's 8 fake ones)."""
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


OWN_DATA_ASKED = 2  # own-data questions the REPLUG object answers (each posterior answer re-ranks 12 passages)
BETWEEN = "\x1eblock\x1e"  # printed between the parts of `readme_python`'s one session


@pytest.fixture(scope="module")
def readme_python():
    """One fresh process, as a notebook session: the README's two Python blocks, then the REPLUG object given
    examples/own_data's corpus alone answering its first questions with the own-data QA command's demos (one
    interpreter start and model load for both tests). (blocks, what each block printed and the second's answer,
    {question: the object's answer}, the command's shots)."""
    blocks = code_blocks(section("In Python: answers, and the weights behind them"), "python")
    shots = int(re.search(r"--config\.shots=(\d+)", section("Your own data")).group(1))
    questions = [json.loads(line)["question"] for line in
                 open(os.path.join(ROOT, "examples/own_data/questions.jsonl"), encoding="utf-8")][:OWN_DATA_ASKED]
    printed = run_python(
        f"{blocks[0]}\nprint({BETWEEN!r})\n{blocks[1]}\nprint({BETWEEN!r}, answer)\n"
        "import json\n"
        "rag = rj.REPLUG.from_documents('examples/own_data/corpus.jsonl')\n"
        f"demos = rj.read_questions('examples/own_data/demos.jsonl')[:{shots}]\n"
        f"print({BETWEEN!r}, json.dumps([rag.answer(q, demos=demos) for q in {questions!r}]))").split(BETWEEN)
    assert len(printed) == 4, printed
    return blocks, printed[:3], dict(zip(questions, json.loads(printed[3]))), shots


def test_the_readmes_own_data_commands_run_as_written(tmp_path, readme_python):
    """Each command of "Your own data" exits 0 on examples/own_data; results.json records the code that ran; QA's
    predictions name the passages each method mixed by datastore id; the small held-out set is warned about."""
    commands = readme_commands()
    assert [c[c.index("--config") + 1] for c in commands] == ["experiments/configs/qa.py",
                                                               "experiments/configs/lm_eval.py"]
    workdirs, outputs = [], []
    for argv in commands:
        at = argv.index("--workdir") + 1
        argv[at] = str(tmp_path / os.path.basename(argv[at]))
        workdirs.append(argv[at])
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600,
                              env={**os.environ, "JAX_PLATFORMS": "cpu"})
        assert done.returncode == 0, done.stderr[-3000:]
        assert "| method |" in done.stdout
        console = done.stdout + done.stderr  # every warning said once, as a phase line (never absl's raw "W1128 ...")
        said = re.findall(r"warning: (.+)", done.stdout)
        assert all(console.count(w) == 1 for w in said) and not re.search(r"^W\d{4} ", console, re.M)
        outputs.append(said)
    qa, lm = (json.load(open(os.path.join(w, "results.json"), encoding="utf-8")) for w in workdirs)
    import replug_jax

    for results in (qa, lm):
        assert results["software"]["replug_jax"] == replug_jax.__version__
        assert results["software"]["jax"] and results["software"]["flax"] and results["lm_backend"]["kind"] == "LocalLM"
        assert results["compute_dtypes"] == {"encoder": "float32", "lm": "float32"}  # bf16 on CPU only when asked
        if os.path.isdir(os.path.join(ROOT, ".git")):
            assert re.fullmatch(r"[0-9a-f]{40}", results["software"]["git_commit"])
    corpus_ids = {json.loads(line).get("id", str(i)) for i, line in
                  enumerate(open(os.path.join(ROOT, "examples/own_data/corpus.jsonl"), encoding="utf-8"), start=1)}
    rows = [json.loads(line) for line in open(os.path.join(workdirs[0], "predictions.jsonl"), encoding="utf-8")]
    for row in rows:
        assert "passage_ids" not in row["none"]
        for method in ("replug", "concat"):
            ids = row[method]["passage_ids"]
            assert len(ids) == 4 and {i.split("#")[0] for i in ids} <= corpus_ids
    assert qa["shots"] == 2 and lm["k"] == 4
    # one default (issue 69, item 5): the REPLUG object given the corpus alone answers each question as the QA job's
    # replug_posterior did, with the job's demos (it gave other answers at τ 1 with the paper's weights)
    answers, shots = readme_python[2], readme_python[3]
    asked = [r for r in rows if r["question"] in answers]
    assert len(asked) == OWN_DATA_ASKED and shots == qa["shots"]
    assert [answers[r["question"]] for r in asked] == [r["replug_posterior"]["prediction"] for r in asked]
    assert any("bytes of held-out text are scored" in w for w in lm["warnings"])
    assert any("bytes of held-out text are scored" in w for w in outputs[1])
    # each held-out window's evidence: its passages and λ per method, summing to the table's perplexities
    windows = [json.loads(line) for line in open(os.path.join(workdirs[1], "windows.jsonl"), encoding="utf-8")]
    assert [w["window"] for w in windows] == list(range(lm["windows"]))
    assert sum(w["tokens"] for w in windows) == lm["tokens"]
    for method, ppl in lm["perplexity"].items():
        logprob = sum(w["logprob"].get(method, w["logprob"]["none"]) for w in windows)
        assert math.exp(-logprob / lm["tokens"]) == pytest.approx(ppl, rel=1e-9), method
    retrieved = [w for w in windows if "replug" in w]
    assert len(retrieved) == lm["windows_with_retrieval"]
    for w in retrieved:
        assert len(w["replug"]["passage_ids"]) == 4 and not any(i.split("#")[0] == w["document"]
                                                                 for i in w["replug"]["passage_ids"])  # excluded
        assert sum(math.exp(x) for x in w["replug"]["log_weights"]) == pytest.approx(1, abs=1e-5)


def test_the_readmes_python_prints_the_weights_it_shows(readme_python):
    """The README's Python blocks run as written; the answer and every weight line they show in comments are what
    they print: the default (the QA job's posterior, with log p(x | d)) and the paper's weights."""
    blocks, printed = readme_python[0], readme_python[1]
    assert len(blocks) == 2
    said = re.search(r"print\(answer\)\s+# (.+)", blocks[0]).group(1)
    assert printed[2].strip() == said  # the second block's answer is the first's
    for i, block in enumerate(blocks):
        shown = [line[2:] for line in block.splitlines() if line.startswith("# ")]
        assert printed[i].strip("\n").splitlines() == ([said] if i == 0 else []) + shown, (printed[i], shown)

@pytest.mark.slow  # two QA runs; the read-back equality itself is the core suite's (tests/test_given_retrieval.py)
def test_the_readmes_given_retrieval_command_prints_the_own_data_commands_numbers(tmp_path):
    """"Retrieval you already have": its command on examples/own_data/retrieval.json (the own-data QA command's own
    retrieval) gives that command's numbers, read from the retrieval file alone (no corpus, no encoder)."""
    given = [sys.executable] + shlex.split(code_blocks(README[README.index("### Retrieval you already have"):],
                                                       "bash")[0].replace("\\\n", " "))[1:]
    own = readme_commands()[0]
    results = []
    for argv in (own, given):
        at = argv.index("--workdir") + 1
        argv[at] = str(tmp_path / os.path.basename(argv[at]))
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=900,
                              env={**os.environ, "JAX_PLATFORMS": "cpu"})
        assert done.returncode == 0, done.stderr[-3000:]
        results.append(json.load(open(os.path.join(argv[at], "results.json"), encoding="utf-8")))
    for key in ("exact_match", "answer_nll", "answer_recall"):
        assert results[1][key] == results[0][key], key
    assert results[1]["encoder"] is None and results[1]["retrieval_given"]["files"] == [
        "examples/own_data/retrieval.json"]
