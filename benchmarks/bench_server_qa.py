"""The QA job through our scoring server against the same job on the local backend (issue 60, item 4: within 1.5×).

    python benchmarks/bench_server_qa.py --workdir /tmp/bench_server_qa [--questions 24 --shots 2 --k 2]

Runs `python -m replug_jax.main` twice on the offline QA demo (gensim's Wikipedia articles, SmolLM2-135M, no LM
cache): once with the LM in the job's process, once with `--config.lm=http://127.0.0.1:PORT/v1` against
`python -m replug_jax.serve --lm smollm2` started here (each process free to use every core; nothing else should
run). The index is built once, before either timed run. Reports each method's seconds (results.json's
`method_seconds`, the answer NLL's scoring included), the ratio, and whether both runs gave the same numbers.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job(workdir: str, common: list[str], *extra: str) -> dict:
    subprocess.run([sys.executable, "-m", "replug_jax.main", "--config", "experiments/configs/demo_qa.py",
                    "--workdir", workdir, *common, *extra], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(workdir, "results.json")) as f:
        return json.load(f)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--questions", type=int, default=24)
    ap.add_argument("--shots", type=int, default=2)
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--methods", default="none,replug,concat")
    args = ap.parse_args()
    common = [f"--config.max_questions={args.questions}", f"--config.shots={args.shots}", f"--config.k={args.k}",
              f"--config.methods={args.methods}", "--config.lm_cache=",
              f"--config.cache_dir={os.path.join(args.workdir, 'shared')}"]
    job(os.path.join(args.workdir, "warm"), common, "--config.methods=none", "--config.max_questions=1")
    local = job(os.path.join(args.workdir, "local"), common)
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "replug_jax.serve", "--lm", "smollm2", "--port", str(port)],
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 300
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                if time.time() > deadline or server.poll() is not None:
                    raise SystemExit("the server did not start")
                time.sleep(1)
        remote = job(os.path.join(args.workdir, "server"), common, f"--config.lm=http://127.0.0.1:{port}/v1",
                     "--config.lm_tokenizer=smollm2")
    finally:
        server.terminate()
        server.wait(timeout=60)
    print(f"QA job, offline demo data, {local['count']} questions, {args.shots}-shot, k = {args.k}, SmolLM2-135M; "
          f"seconds per method (answer NLL included)\n")
    print("| method | local (s) | through the server (s) | ratio | same EM | answer NLL local / server |")
    print("|---|---:|---:|---:|---|---|")
    for method in args.methods.split(","):
        a, b = local["method_seconds"][method], remote["method_seconds"][method]
        same = local["exact_match"][method] == remote["exact_match"][method]
        nll = f"{local['answer_nll'][method]:.4f} / {remote['answer_nll'][method]:.4f}"
        print(f"| {method} | {a:.1f} | {b:.1f} | {b / a:.2f}× | {same} | {nll} |")
    total = sum(local["method_seconds"].values()), sum(remote["method_seconds"].values())
    print(f"| all | {total[0]:.1f} | {total[1]:.1f} | {total[1] / total[0]:.2f}× | | |")
    print(f"\nserver requests: {remote.get('lm_requests', {}).get('requests')}")


if __name__ == "__main__":
    main()
