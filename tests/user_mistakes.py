"""Every command-line mistake tried as a new user would (issues 51 and 60), run for real: its exit status, seconds
and the one line it prints. tests/README.md's table is this script's output:

    python tests/user_mistakes.py > /tmp/mistakes.md

Each row runs `python -m replug_jax.main` in a subprocess on a newcomer's small files (made in a temporary
folder); the core suite asserts the same refusals (tests/test_command_line.py)."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QA, LM_EVAL, DEMO = "experiments/configs/qa.py", "experiments/configs/lm_eval.py", "experiments/configs/demo.py"

RIVER = "the river runs north past the old mill, the bridge and the three farms of the valley"
FILES = {
    "corpus.jsonl": '{"text": "Velmora is a town. Its mayor is Tobias Grint.", "title": "Velmora"}\n',
    "questions.jsonl": '{"question": "Who is the mayor of Velmora?", "answers": ["Tobias Grint"]}\n',
    "no_answers.jsonl": '{"question": "Who is the mayor of Velmora?"}\n',
    "empty.jsonl": "\n",
    "array.json": '[{"text": "a list, not JSON lines"}]\n',
    "table.csv": "id,text\n1,Velmora is a town.\n",
    "some_empty.jsonl": '{"id": "v", "text": "Velmora is a town."}\n{"id": "w", "text": ""}\n',
    "two_answers.jsonl": '{"question": "Who is the mayor of Velmora?", "answers": ["Tobias Grint"], "answer": "Tobias"}\n',
    "malformed.jsonl": '{"text": "fine"}\n{"text": "a\tb"}\n',
    "long_docs.jsonl": "".join('{"text": "Document %d says that %s, and that %s."}\n' % (i, RIVER, RIVER) for i in range(3)),
    "shared_ids.jsonl": '{"id": "a", "text": "One."}\n{"id": "b", "text": "Two."}\n{"id": "a", "text": "Three."}\n',
}

QA_OWN = ["--config.corpus={corpus}", "--config.questions={questions}", "--config.shots=0", "--config.k=1"]
LM_OWN = ["--config.corpus={corpus}", "--config.eval_data={corpus}", "--config.k=1", "--config.k_sweep=1"]

# (what the user did, config, arguments after the config and workdir)
MISTAKES = [
    ("a misspelt config file", "experiments/configs/qa_.py", QA_OWN),
    ("a misspelt config key", DEMO, ["--config.temprature=2"]),
    ("a key of another job", QA, QA_OWN + ["--config.k_sweep=1,2"]),
    ("an unknown LM", DEMO, ["--config.lm=smolm2"]),
    ("an encoder given as the LM", DEMO, ["--config.lm=minilm"]),
    ("an unknown method", DEMO, ["--config.methods=replug,bm52"]),
    ("an unknown job", DEMO, ["--config.job=train"]),
    ("k beyond the corpus", QA, QA_OWN + ["--config.k=8"]),
    ("k above the posterior's re-ranking depth", QA, QA_OWN + ["--config.corpus=gensim_wiki", "--config.k=40"]),
    ("a letter in k_sweep", LM_EVAL, LM_OWN + ["--config.k_sweep=1,x"]),
    ("a missing file", DEMO, ["--config.eval_data=/no/such.jsonl"]),
    ("a JSON array, not JSON lines", QA, QA_OWN + ["--config.corpus={array}"]),
    ("a CSV corpus", QA, QA_OWN + ["--config.corpus={table}"]),
    ("a document without text", QA, QA_OWN + ["--config.corpus={some_empty}"]),
    ("\"answers\" and \"answer\" that differ", QA, QA_OWN + ["--config.questions={two_answers}"]),
    ("k beyond the corpus and above the re-ranking depth", QA, QA_OWN + ["--config.k=8", "--config.rerank_depth=4"]),
    ("k beyond the passages where the bytes cannot tell (3 documents of ~250 bytes)", QA,
     QA_OWN + ["--config.corpus={long_docs}", "--config.k=5"]),
    ("the questions file given as the corpus", QA, QA_OWN + ["--config.corpus={questions}"]),
    ("an empty corpus", QA, QA_OWN + ["--config.corpus={empty}"]),
    ("an empty held-out file", LM_EVAL, LM_OWN + ["--config.eval_data={empty}"]),
    ("a malformed JSONL line", QA, QA_OWN + ["--config.corpus={malformed}"]),
    ("questions without answers", QA, QA_OWN + ["--config.questions={no_answers}"]),
    ("a corpus that is not UTF-8", QA, QA_OWN + ["--config.corpus={latin1}"]),
    ("documents sharing an id", QA, QA_OWN + ["--config.corpus={shared_ids}"]),
    ("a corpus folder without .txt files", LM_EVAL, LM_OWN + ["--config.corpus={no_txt}"]),
    ("a workdir that is a file", DEMO, ["--workdir", "README.md"]),
    ("a workdir that cannot be made", DEMO, ["--workdir", "/dev/null/run"]),
    ("negative shots", QA, QA_OWN + ["--config.shots=-1"]),
    ("negative max_questions", QA, QA_OWN + ["--config.max_questions=-3"]),
    ("negative question_offset", QA, QA_OWN + ["--config.question_offset=-1"]),
    ("a stride of 0 tokens", LM_EVAL, LM_OWN + ["--config.stride_tokens=0"]),
    ("passages of 0 tokens", QA, QA_OWN + ["--config.doc_tokens=0"]),
    ("passages of -5 tokens", QA, QA_OWN + ["--config.doc_tokens=-5"]),
    ("a temperature of 0", QA, QA_OWN + ["--config.temperature=0"]),
    ("an HTTP timeout of 0 s", QA, QA_OWN + ["--config.lm=http://127.0.0.1:9/v1", "--config.lm_timeout=0"]),
    ("no requests in flight", QA, QA_OWN + ["--config.lm=http://127.0.0.1:9/v1", "--config.lm_concurrency=0"]),
    ("an HTTP client setting for a local LM", QA, QA_OWN + ["--config.lm_retries=9"]),
    ("a local LM's split for a server", QA, QA_OWN + ["--config.lm=http://127.0.0.1:9/v1", "--config.lm_model_parallel=2"]),
    ("a server that is not there", QA, QA_OWN + ["--config.lm=http://127.0.0.1:9/v1"]),
    # checked by the settings schema (replug_jax/base/settings.py) alone: no per-key check was written for these
    ("a dtype misspelt", QA, QA_OWN + ["--config.dtype=bf16"]),
    ("an LM batch of 0", QA, QA_OWN + ["--config.lm_batch_size=0"]),
    ("α not a number", QA, QA_OWN + ["--config.posterior_alpha=nan"]),
    ("a corpus held out whole", DEMO, ["--config.eval_fraction=0.95"]),
    ("a learning rate of 0", "experiments/configs/demo_lsr.py", ["--config.learning_rate=0"]),
]


def made_files(folder: str) -> dict[str, str]:
    for name, text in FILES.items():
        with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
            f.write(text)
    with open(os.path.join(folder, "latin1.jsonl"), "wb") as f:
        f.write('{"text": "Caf\u00e9 au lait."}\n'.encode("latin-1"))
    os.makedirs(os.path.join(folder, "no_txt"), exist_ok=True)
    with open(os.path.join(folder, "no_txt", "notes.md"), "w") as f:
        f.write("Not a .txt file.")
    return {name.split(".")[0]: os.path.join(folder, name) for name in [*FILES, "latin1.jsonl", "no_txt"]}


def run(config: str, args: list[str], files: dict, workdir: str) -> tuple[int, float, str]:
    args = [a.format(**files) for a in args]
    if "--workdir" not in args:
        args = ["--workdir", workdir, *args]
    started = time.time()
    done = subprocess.run([sys.executable, "-m", "replug_jax.main", "--config", config, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    lines = [line for line in done.stderr.splitlines() if line.startswith("error:")] or done.stderr.splitlines()[-1:]
    line = lines[0] if lines else "(nothing printed)"
    return done.returncode, time.time() - started, line.replace(os.path.dirname(files["corpus"]), "DIR")


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        files = made_files(folder)
        print("| mistake | arguments | exit | seconds | what it prints |\n|---|---|---:|---:|---|")
        for what, config, args in MISTAKES:
            code, seconds, line = run(config, args, files, os.path.join(folder, "w"))
            shown = " ".join(a.format(**{k: os.path.basename(v) for k, v in files.items()}) for a in args
                             if a not in QA_OWN and a not in LM_OWN)
            print(f"| {what} | `{os.path.basename(config)}` {shown} | {code} | {seconds:.1f} | "
                  f"{line.replace('|', '/')} |", flush=True)


if __name__ == "__main__":
    main()
