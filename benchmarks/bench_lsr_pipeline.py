"""REPLUG LSR training throughput: the serial loop against the pipelined one (issue 10, item 4).

    python benchmarks/bench_lsr_pipeline.py --steps 6 --batch 8 --k 4 --workdir runs/bench_lsr_pipeline \
        [--cache_dir runs/lsr_grid/shared_t30]

On the offline demo data (demo_lsr.py's related split, SmolLM2 as the LM, MiniLM as the retriever) the same
training is run twice, serial and `pipeline=True`, each with a fresh LM-score cache so that every step asks the
LM (a cache would hide the LM time the pipeline is for). Reports steps/s after the first step (compilation),
and per step the seconds spent asking the LM and the seconds the loop waited for its batch. Serial, the wait
is the whole preparation; pipelined, it is what the overlap with the train step did not hide. Retrieval of the
pipelined loop is one step stale, so its batches (and LM calls) differ slightly from the serial loop's.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--workdir", default="runs/bench_lsr_pipeline")
    ap.add_argument("--cache_dir", default="", help="a demo_lsr run's cache_dir to reuse (its split and index)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results.jsonl"))
    args = ap.parse_args()

    import dataclasses

    from replug_jax.jobs.config_files import sibling_config
    from replug_jax.jobs import prepare
    from replug_jax.train.queries import training_examples
    from replug_jax.train.loop import LSRSettings, train_lsr
    from replug_jax.train.metrics import read_metrics

    config = sibling_config(os.path.join("experiments", "configs", "demo_lsr.py"), "demo_lsr.py")
    config.cache_dir = args.cache_dir or os.path.join(args.workdir, "shared")
    config.lm_cache = ""  # the loop's own fresh cache in each run: every step asks the LM
    setup = prepare.prepare(config, args.workdir)
    examples = training_examples(prepare.read_documents(setup.paths["train"]), setup.tokenizer,
                                 query_tokens=config.train_query_tokens,
                                 continuation_tokens=config.train_continuation_tokens, seed=config.seed)
    base = dataclasses.replace(LSRSettings.from_mapping(config), steps=args.steps, batch_size=args.batch, k=args.k,
                               checkpoint_every=args.steps, refresh_every=args.steps + 1, swap_after=0)
    rows = []
    for pipeline in (False, True):
        name = "pipelined" if pipeline else "serial"
        workdir = os.path.join(args.workdir, name)
        shutil.rmtree(workdir, ignore_errors=True)
        train_lsr(setup.encoder, setup.lm, setup.store, examples, workdir,
                  dataclasses.replace(base, pipeline=pipeline), initial_index=setup.index)
        metrics = read_metrics(workdir)[1:]  # the first step compiles
        seconds = sum(m["step_seconds"] for m in metrics)
        rows.append({"benchmark": "lsr_pipeline", "impl": name, "steps_per_s": len(metrics) / seconds,
                     "step_seconds": seconds / len(metrics),
                     "lm_seconds": float(np.mean([m["lm_seconds"] for m in metrics])),
                     "wait_seconds": float(np.mean([m["wait_seconds"] for m in metrics])),
                     "wait_fraction": sum(m["wait_seconds"] for m in metrics) / seconds,
                     "lm_calls": metrics[-1]["cache_misses"], "steps": args.steps, "batch": args.batch, "k": args.k,
                     "command": " ".join([os.path.basename(sys.executable), *sys.argv])})
    rows[1]["vs_serial"] = rows[1]["steps_per_s"] / rows[0]["steps_per_s"]
    rows[0]["vs_serial"] = 1.0
    common.print_table(rows, ["impl", "steps_per_s", "vs_serial", "step_seconds", "lm_seconds", "wait_seconds",
                              "wait_fraction", "lm_calls"])
    common.write_rows(rows, args.out)
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
