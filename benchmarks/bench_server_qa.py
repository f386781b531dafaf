"""The QA job through our scoring server against the same job on the local backend (issue 60, item 4: within 1.5×; issue 85: 1.25×).

    python benchmarks/bench_server_qa.py --workdir /tmp/bench_server_qa [--questions 24 --shots 2 --k 2]

Runs `python -m replug_jax.main` twice on the offline QA demo (gensim's Wikipedia articles, SmolLM2-135M, no LM
cache): once with the LM in the job's process, once with `--config.lm=http://127.0.0.1:PORT/v1` against
`python -m replug_jax.serve --lm smollm2` started here (each process free to use every core; nothing else should
run). The index is built once, before either timed run. The served job runs once per `--prefix-cache-mb` value
(default: the server's prefix cache of 1 GiB, then none: server/prefix_cache.py). Reports each method's seconds
(results.json's `method_seconds`, the answer NLL's scoring included), the ratios, whether every run gave the same
exact match, and what the server's prefix cache did (GET /health).
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


def demo_job_arguments(description: str) -> argparse.ArgumentParser:
    """The parser of the offline QA demo job's size (--workdir, --questions, --shots, --k), as this benchmark and
    profile_served_generation.py run it."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--questions", type=int, default=24)
    ap.add_argument("--shots", type=int, default=2)
    ap.add_argument("--k", type=int, default=2)
    return ap


def main() -> None:
    ap = demo_job_arguments(__doc__.split("\n")[0])
    ap.add_argument("--methods", default="none,replug,concat")
    ap.add_argument("--prefix-cache-mb", default="1024,0",
                    help="a server run per value (python -m replug_jax.serve --prefix-cache-mb; 0: no prefix cache)")
    args = ap.parse_args()
    common = [f"--config.max_questions={args.questions}", f"--config.shots={args.shots}", f"--config.k={args.k}",
              f"--config.methods={args.methods}", "--config.lm_cache=",
              f"--config.cache_dir={os.path.join(args.workdir, 'shared')}"]
    job(os.path.join(args.workdir, "warm"), common, "--config.methods=none", "--config.max_questions=1")
    local = job(os.path.join(args.workdir, "local"), common)
    served = {mb: served_job(args, common, mb) for mb in args.prefix_cache_mb.split(",")}
    print(f"QA job, offline demo data, {local['count']} questions, {args.shots}-shot, k = {args.k}, SmolLM2-135M; "
          f"seconds per method (answer NLL included); server runs by --prefix-cache-mb\n")
    names = [f"server, prefix cache {mb} MiB" for mb in served]
    print("| method | local (s) | " + " | ".join(f"{n} (s) | ratio" for n in names) + " | same EM | answer NLL local / server |")
    print("|---|---:|" + "---:|---:|" * len(names) + "---|---|")
    runs = [remote for remote, _ in served.values()]
    for method in args.methods.split(","):
        a = local["method_seconds"][method]
        cells = " | ".join(f"{r['method_seconds'][method]:.1f} | {r['method_seconds'][method] / a:.2f}×" for r in runs)
        same = all(local["exact_match"][method] == r["exact_match"][method] for r in runs)
        nll = f"{local['answer_nll'][method]:.4f} / " + " / ".join(f"{r['answer_nll'][method]:.4f}" for r in runs)
        print(f"| {method} | {a:.1f} | {cells} | {same} | {nll} |")
    total = sum(local["method_seconds"].values())
    cells = " | ".join(f"{sum(r['method_seconds'].values()):.1f} | {sum(r['method_seconds'].values()) / total:.2f}×"
                       for r in runs)
    print(f"| all | {total:.1f} | {cells} | | |")
    for mb, (remote, health) in served.items():
        print(f"\nprefix cache {mb} MiB: requests {remote.get('lm_requests', {}).get('requests')}, "
              f"server's prefix cache {health.get('prefix_cache')}")


def served_job(args, common: list[str], prefix_cache_mb: str) -> tuple[dict, dict]:
    """The job through `python -m replug_jax.serve --prefix-cache-mb N` started here: (results.json, /health at the
    end)."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "replug_jax.serve", "--lm", "smollm2", "--port", str(port),
                               "--prefix-cache-mb", prefix_cache_mb], cwd=ROOT, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    health = f"http://127.0.0.1:{port}/health"
    try:
        deadline = time.time() + 300
        while True:
            try:
                urllib.request.urlopen(health, timeout=2)
                break
            except OSError:
                if time.time() > deadline or server.poll() is not None:
                    raise SystemExit("the server did not start")
                time.sleep(1)
        remote = job(os.path.join(args.workdir, f"server_{prefix_cache_mb}"), common,
                     f"--config.lm=http://127.0.0.1:{port}/v1", "--config.lm_tokenizer=smollm2")
        with urllib.request.urlopen(health, timeout=10) as reply:
            return remote, json.load(reply)
    finally:
        server.terminate()
        server.wait(timeout=60)

if __name__ == "__main__":
    main()
