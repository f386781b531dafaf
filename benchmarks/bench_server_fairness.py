"""A generation's latency on our server beside a scoring load that keeps its queue full (issue 85, item 5).

    python benchmarks/bench_server_fairness.py [--lm smollm2] [--tokens 30] [--clients 3] [--prompts 16]

Times one `--tokens`-token greedy generation alone, then beside `--clients` threads each sending `--prompts`
scoring prompts at a time without pause (48 in flight by default: more than a batch's 32 rows, so the queue never
empties), in the same run, and prints the ratio. Goal: at most 3x.
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time

from replug_jax.loading import load_lm
from replug_jax.server.engine import ScoringEngine

TEXT = "The history of the lighthouse on the northern cape begins with a fire on the cliff"


def generation_seconds(engine: ScoringEngine, prompt: list[int], tokens: int) -> float:
    started = time.perf_counter()
    out = engine.generate(prompt, tokens, 0).result(timeout=600)
    assert len(out) == tokens, len(out)
    return time.perf_counter() - started


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lm", default="smollm2")
    parser.add_argument("--tokens", type=int, default=30)
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=16)
    args = parser.parse_args(argv)
    lm = load_lm(args.lm, batch_size=8)
    engine = ScoringEngine(lm)
    prompt = lm.tokenizer.encode("Once upon a time")
    load = [lm.tokenizer.encode(f"{TEXT} {i}.") for i in range(args.prompts)]
    engine.score(load).result(timeout=600)  # every program compiled before anything is timed
    generation_seconds(engine, prompt, args.tokens)
    alone = generation_seconds(engine, prompt, args.tokens)
    stop, batches = threading.Event(), [0]

    def client():
        while not stop.is_set():
            engine.score(load).result(timeout=600)
            batches[0] += 1

    threads = [threading.Thread(target=client) for _ in range(args.clients)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    beside = generation_seconds(engine, prompt, args.tokens)
    stop.set()
    for t in threads:
        t.join()
    engine.close()
    row = {"command": "python benchmarks/bench_server_fairness.py " + " ".join(argv or sys.argv[1:]),
           "alone_s": alone, "beside_load_s": beside, "ratio": beside / alone, "scoring_batches": batches[0],
           "in_flight": args.clients * args.prompts}
    print(json.dumps(row))
    return row


if __name__ == "__main__":
    main()
