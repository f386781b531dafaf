"""REPLUG weighted by the LM's posterior on the demo's held-out Wikipedia windows: perplexity and bits per byte
(issue 37, item 5, the LM-evaluation table).

    python experiments/posterior_windows.py --workdir runs/posterior_windows

The LM-evaluation job of experiments/configs/demo.py (MiniLM over 78 Wikipedia articles, SmolLM2-135M, k = 4; x is
the window's LM context after each document, never the scored continuation) in runs that share one datastore and
one LM-score cache, so a later run re-reads the passes an earlier one scored:
  * τ = 1: none, REPLUG (and REPLUG τ = 0.1, the same passes re-weighted), concat, replug_posterior α = 1;
  * τ = 0.1: replug_posterior α = 1, then α = 0.5;
  * τ = 0.1: replug_posterior α = 1 re-ranking the top 16 to 4.
`--eval_docs` held-out articles (the demo scores 6; all 10 by default here), 5 windows each. WORKDIR/table.md and
table.json; a finished run is reused.
"""
from __future__ import annotations

import argparse
import json
import os
import time

from replug_jax.base import console
from replug_jax.jobs import results_file
from replug_jax.jobs.config_files import sibling_config
from replug_jax.main import run_job

CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")
RUNS = {  # name: (τ, methods, α, rerank depth)
    "tau1": (1.0, ("replug", "concat", "replug_posterior"), 1.0, 0),
    "tau0.1": (0.1, ("replug", "replug_posterior"), 1.0, 0),
    "alpha0.5": (0.1, ("replug", "replug_posterior"), 0.5, 0),
    "rerank16": (0.1, ("replug", "replug_posterior"), 1.0, 16),
}
ROWS = [("none", "tau1", "none"), ("REPLUG τ 1", "tau1", "replug"), ("REPLUG τ 0.1", "tau0.1", "replug"),
        ("concat", "tau1", "concat"), ("posterior α 1, τ 1", "tau1", "replug_posterior"),
        ("posterior α 1, τ 0.1", "tau0.1", "replug_posterior"), ("posterior α 0.5, τ 0.1", "alpha0.5", "replug_posterior"),
        ("posterior α 1, τ 0.1, re-rank 16 → 4", "rerank16", "replug_posterior")]


def run(args, name: str) -> dict:
    """results.json of one run, running it when absent (a finished run of another config is refused:
    `results_file.finished_run`)."""
    tau, methods, alpha, depth = RUNS[name]
    workdir = os.path.join(args.workdir, name)
    config = sibling_config(os.path.join(CONFIGS, "demo.py"), "demo.py")
    config.update(dict(methods=methods, temperature=tau, posterior_alpha=alpha, rerank_depth=depth, k_sweep=(4,),
                       max_eval_docs=args.eval_docs, cache_dir=os.path.join(args.workdir, "shared"),
                       lm_cache=os.path.join(args.workdir, "lm_cache.sqlite")))
    if args.windows_per_doc:
        config.max_windows_per_doc = args.windows_per_doc
    results = results_file.finished_run(workdir, config)
    if results is None:
        console.setup(workdir, -1)
        run_job(config, workdir)
        results = results_file.finished_run(workdir, config)  # as written (JSON's keys and lists)
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--eval_docs", type=int, default=10, help="held-out articles scored (the demo: 6 of 10)")
    ap.add_argument("--windows_per_doc", type=int, default=0, help="windows scored per article (0: demo.py's 5)")
    args = ap.parse_args()
    started = time.time()
    runs = {name: run(args, name) for name in RUNS}
    first = runs["tau1"]
    rows, lines = [], ["| method | perplexity | bits per byte | vs REPLUG τ 1 | minutes |", "|---|---:|---:|---:|---:|"]
    base = first["perplexity"]["replug"]
    for label, name, method in ROWS:
        results = runs[name]
        ppl, bpb = results["perplexity"][method], results["bits_per_byte"][method]
        rows.append({"method": label, "run": name, "perplexity": ppl, "bits_per_byte": bpb,
                     "minutes": results["seconds"] / 60})
        lines.append(f"| {label} | {ppl:.3f} | {bpb:.4f} | {100 * (ppl / base - 1):+.2f}% | "
                     f"{results['seconds'] / 60:.1f} |")
    text = (f"Held-out Wikipedia windows of the demo: {first['windows']} windows ({first['windows_with_retrieval']} "
            f"with retrieval), {first['tokens']} tokens, LM {first['lm']}, k = {first['k']} (minutes: the run that "
            f"row comes from)\n\n" + "\n".join(lines) + f"\n\nTotal {(time.time() - started) / 60:.1f} min")
    with open(os.path.join(args.workdir, "table.json"), "w") as f:
        json.dump({"rows": rows, "windows": first["windows"], "tokens": first["tokens"]}, f, indent=1)
    with open(os.path.join(args.workdir, "table.md"), "w") as f:
        f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    from replug_jax.jobs.command_line import script_entry

    script_entry(main)  # a mistake in a setting: one line, exit 2
