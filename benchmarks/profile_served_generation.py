"""Where the scoring server's time goes in the QA job's REPLUG generation (issue 85, item 5).

    python benchmarks/profile_served_generation.py --workdir /tmp/profile_served [--questions 24 --shots 2 --k 2]

1. The offline QA demo (gensim's Wikipedia articles, SmolLM2-135M, method replug, no answer NLL, no LM cache) runs
   through our server in this process (`BackgroundServer`), the client's generation requests recorded: per mixture
   step (the tokens a request asks for: all that are left), how many requests, the tokens they decoded and the
   step's wall seconds.
2. The first step's requests (every pass asked for its whole continuation) are replayed on a fresh engine, as many
   at a time as the client sends (`lm_concurrency`), twice (the second on compiled programs and an emptied prefix
   cache), each of the decoding batch's jitted programs timed, blocked until ready: seconds and calls per program,
   the prefix cache's counts, and the shapes prefilled and resumed.
Steps 1 and 2 share the cores with nothing else of this script's; run it with nothing else on the machine.
"""
from __future__ import annotations

import collections
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from bench_server_qa import demo_job_arguments  # benchmarks/: the script's own folder

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMED = ("_chunk", "_prefill", "_insert", "_insert_first", "_start", "_resume", "_take_row", "_repack")


def recorded_job(args) -> list[dict]:
    """The QA job through a server in this process: [{"prompt", "steps", "decoded", "start", "end"}] per request."""
    import replug_jax as rj
    from replug_jax.base import console
    from replug_jax.jobs.config_files import sibling_config
    from replug_jax.lm.http import generation
    from replug_jax.main import run_job
    from replug_jax.serve import BackgroundServer

    requests, lock, ask = [], threading.Lock(), generation._steps_ahead

    def recorded(client, prompt, top_n, steps, stop):
        start = time.time()
        out = ask(client, prompt, top_n, steps, stop)
        with lock:
            requests.append({"prompt": prompt, "steps": steps, "decoded": len(out), "start": start, "end": time.time()})
        return out

    generation._steps_ahead = recorded
    config = sibling_config(os.path.join(ROOT, "experiments", "configs", "demo_qa.py"), "demo_qa.py")
    with BackgroundServer(rj.load_lm("smollm2", batch_size=8)) as server:
        config.update(dict(max_questions=args.questions, shots=args.shots, k=args.k, methods=("replug",), lm_cache="",
                           answer_nll=False, cache_dir=os.path.join(args.workdir, "shared"), lm=server.url,
                           lm_tokenizer="smollm2"))
        workdir = os.path.join(args.workdir, "job")
        console.setup(workdir, -1)
        run_job(config, workdir)
    generation._steps_ahead = ask
    print("\nmixture steps through the server (tokens asked: all that are left)\n")
    print("| tokens asked | requests | tokens decoded | wall (s) |\n|---:|---:|---:|---:|")
    for steps in sorted({r["steps"] for r in requests}, reverse=True):
        rows = [r for r in requests if r["steps"] == steps]
        wall = max(r["end"] for r in rows) - min(r["start"] for r in rows)
        print(f"| {steps} | {len(rows)} | {sum(r['decoded'] for r in rows)} | {wall:.1f} |")
    return requests


def replay(prompts: list[list[int]], steps: int, concurrency: int) -> None:
    """The prompts generated on a fresh engine, `concurrency` at a time, twice; the decoding batch's programs timed."""
    import jax

    from replug_jax.loading import load_lm
    from replug_jax.server.engine import ScoringEngine

    engine = ScoringEngine(load_lm("smollm2", batch_size=8))
    batch = engine._decoding
    seconds, calls, shapes = collections.Counter(), collections.Counter(), collections.defaultdict(list)

    def timed(name, program):
        def run(*a, **k):
            if name in ("_prefill", "_resume"):
                shapes[name].append(tuple(a[1 if name == "_prefill" else 2].shape))  # ids [rows, tokens]
            start = time.perf_counter()
            out = jax.block_until_ready(program(*a, **k))
            seconds[name] += time.perf_counter() - start
            calls[name] += 1
            return out
        return run

    for name in TIMED:
        setattr(batch, name, timed(name, getattr(batch, name)))
    try:
        for round_ in ("first (compiling)", "second (compiled)"):
            seconds.clear(), calls.clear(), shapes.clear()
            batch.prefixes.__init__(batch.prefixes.budget_bytes)  # emptied: both rounds start without kept rows
            start = time.time()
            with ThreadPoolExecutor(concurrency) as pool:
                out = list(pool.map(lambda p: engine.generate(p, steps, 20, ("\n",)).result(), prompts))
            print(f"\nreplay, {round_} round: {len(prompts)} requests, {sum(map(len, out))} tokens, "
                  f"{time.time() - start:.1f} s\n")
            print("| program | seconds | calls |\n|---|---:|---:|")
            for name, s in seconds.most_common():
                print(f"| {name} | {s:.2f} | {calls[name]} |")
            print(f"\nprefix cache: {engine.prefix_cache}\nshapes [rows, tokens]: {dict(shapes)}")
    finally:
        engine.close()


def main() -> None:
    ap = demo_job_arguments(__doc__.split("\n")[0])
    ap.add_argument("--concurrency", type=int, default=8, help="requests in flight (the QA config's lm_concurrency)")
    args = ap.parse_args()
    sys.path.insert(0, ROOT)
    requests = recorded_job(args)
    first = max(r["steps"] for r in requests)
    replay([r["prompt"] for r in requests if r["steps"] == first], first, args.concurrency)


if __name__ == "__main__":
    main()
