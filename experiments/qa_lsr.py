"""REPLUG LSR against REPLUG on held-out SciQ questions: train the retriever on QA pairs, evaluate, tabulate.

    python experiments/qa_lsr.py --lm smollm2 --questions 200 --workdir runs/qa_lsr/smollm2
    python experiments/qa_lsr.py --lm qwen2.5-coder-0.5b --questions 200 --workdir runs/qa_lsr/qwen05b
    # transfer: the retriever trained with SmolLM2's scores, evaluated with the 0.5B reader
    python experiments/qa_lsr.py --lm qwen2.5-coder-0.5b --questions 200 --workdir runs/qa_lsr/qwen05b_from_smollm2 \
        --trained runs/qa_lsr/smollm2/lsr

1. Training (skipped with --trained, or when WORKDIR/lsr/retriever.safetensors exists): the LSR job of
   experiments/configs/qa_lsr.py on SciQ rows from 300 on (`train_offset`), supervised by --lm.
2. The QA job of experiments/configs/sciq.py on the first --questions held-out questions (after the demos),
   at τ = 1 (none, REPLUG, concat, REPLUG LSR) and at τ = γ (REPLUG, REPLUG LSR): a gain that a sharper λ
   alone gives is not an LSR gain. Both runs share one LM-score cache, so the answer likelihoods of the
   second cost no LM call.
3. WORKDIR/table.json and table.md: exact match, answer NLL (nats per answer), answer recall@k per method and
   τ, with training steps, LM passes and minutes.
"""
from __future__ import annotations

import argparse
import json
import os
import time

from replug_jax.base import console
from replug_jax.jobs import results_file
from replug_jax.jobs.config_files import set_from_text, sibling_config
from replug_jax.main import run_job

CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")


def config_for(name: str, args, workdir: str):
    config = sibling_config(os.path.join(CONFIGS, name), name)
    config.lm = args.lm
    config.cache_dir = args.cache_dir or os.path.join(args.workdir, "shared")  # datastore, embeddings, index
    config.lm_cache = args.lm_cache or os.path.join(args.workdir, "lm_cache.sqlite")
    return config


def run_once(config, workdir: str) -> dict:
    """results.json of a job run in `workdir`, running it when absent (a finished run of another config is refused:
    `results_file.finished_run`)."""
    results = results_file.finished_run(workdir, config)
    if results is None:
        console.setup(workdir, -1)
        run_job(config, workdir)
        results = results_file.finished_run(workdir, config)  # as written (JSON's keys and lists)
    return results


def evaluate(args, trained: str, temperature: float, methods: tuple) -> dict:
    """The QA job at τ = `temperature`; with --baseline, only replug_lsr runs and the other methods' results
    come from the baseline workdir's run at the same τ (same questions, demos, LM and datastore)."""
    config = config_for("sciq.py", args, "")
    config.max_questions = args.questions
    config.methods = ("replug_lsr",) if args.baseline else methods
    config.retriever_workdir = trained
    config.temperature = temperature
    results = run_once(config, os.path.join(args.workdir, f"qa_tau{temperature:g}"))
    if args.baseline:
        with open(os.path.join(args.baseline, f"qa_tau{temperature:g}", "results.json")) as f:
            base = json.load(f)
        if (base["count"], base["lm"], base["k"], base["shots"]) != (results["count"], results["lm"], results["k"],
                                                                     results["shots"]):
            raise ValueError(f"--baseline {args.baseline} evaluated another setting")
        for key in ("exact_match", "answer_nll", "answer_recall"):
            results[key] = {**{m: base[key][m] for m in methods if m != "replug_lsr"}, **results[key]}
        results["methods"] = list(methods)
    return results


def table(train: dict | None, runs: dict[float, dict]) -> tuple[list[dict], str]:
    rows = []
    for tau, res in runs.items():
        for method in res["methods"]:
            if method == "none" and tau != 1.0:
                continue
            rows.append({"method": method, "tau": tau if method in ("replug", "replug_lsr") else None,
                         "exact_match": res["exact_match"][method], "answer_nll": res["answer_nll"].get(method),
                         "answer_recall": res["answer_recall"][method], "questions": res["count"],
                         "minutes": res["seconds"] / 60})
    lines = ["| method | τ | EM % | answer NLL (nats) | answer recall@k % |", "|---|---|---|---|---|"]
    for r in rows:
        recall = "" if r["answer_recall"] is None else f"{r['answer_recall']:.1f}"
        lines.append(f"| {r['method']} | {'' if r['tau'] is None else r['tau']} | {r['exact_match']:.1f} | "
                     f"{r['answer_nll']:.3f} | {recall} |")
    if train:
        lsr = train["lsr"]
        lines.append(f"\nLSR: {lsr['steps']} steps × batch {lsr['batch_size']} × k {lsr['k']} "
                     f"({train['training_questions']} training questions), {lsr.get('cache_misses', 0)} LM passes, "
                     f"{train['seconds'] / 60:.1f} min; γ {lsr['gamma']}, β {lsr['beta']}, {lsr['direction']}, "
                     f"ℓ {lsr['lm_score']}, train_documents {lsr['train_documents']}")
    lines.append(f"Evaluation: {next(iter(runs.values()))['count']} held-out questions; minutes per run: "
                 + ", ".join(f"τ={t:g} {r['seconds'] / 60:.1f}" for t, r in runs.items()))
    return rows, "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lm", default="smollm2")
    ap.add_argument("--questions", type=int, default=200)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--trained", default="", help="an LSR workdir to evaluate instead of training with --lm")
    ap.add_argument("--cache_dir", default="", help="datastore, embeddings and index (default WORKDIR/shared); "
                    "runs with LMs of one tokenizer can share it")
    ap.add_argument("--lm_cache", default="", help="the LM-score cache file (default WORKDIR/lm_cache.sqlite); "
                    "runs with one LM can share it")
    ap.add_argument("--baseline", default="", help="an earlier WORKDIR of this script (same LM and questions): "
                    "reuse its none / REPLUG / concat results, evaluate only REPLUG LSR")
    ap.add_argument("--taus", default="1,gamma", help="the temperatures evaluated, in this order: 1 (none, REPLUG, "
                    "concat, REPLUG LSR) and gamma (REPLUG and REPLUG LSR at τ = γ); a finished one is reused")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a qa_lsr.py training key (e.g. --set steps=80); values are Python literals")
    args = ap.parse_args()
    if not args.taus or set(args.taus.split(",")) - {"1", "gamma"}:
        raise ValueError(f"--taus {args.taus!r}: give 1, gamma or both (comma-separated)")
    started = time.time()
    train = None
    trained = args.trained
    if not trained:
        config = config_for("qa_lsr.py", args, "")
        for item in args.set:
            set_from_text(config, item)
        trained = os.path.join(args.workdir, "lsr")
        train = run_once(config, trained)
    gamma = json.load(open(os.path.join(trained, "results.json")))["lsr"]["gamma"]
    methods = {"1": (1.0, ("none", "replug", "concat", "replug_lsr")), "gamma": (gamma, ("replug", "replug_lsr"))}
    runs = {tau: evaluate(args, trained, tau, which) for tau, which in map(methods.get, args.taus.split(","))}
    rows, text = table(train, runs)
    text = f"SciQ, LM {args.lm}, retriever trained in {trained}\n\n{text}\nTotal {(time.time() - started) / 60:.1f} min"
    with open(os.path.join(args.workdir, "table.json"), "w") as f:
        json.dump({"lm": args.lm, "trained": trained, "rows": rows, "training": train}, f, indent=1)
    with open(os.path.join(args.workdir, "table.md"), "w") as f:
        f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    from replug_jax.jobs.command_line import script_entry

    script_entry(main)  # a mistake in a setting: one line, exit 2
