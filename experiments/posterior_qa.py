"""REPLUG weighted by the LM's posterior over passages against REPLUG and concatenation, SciQ open QA (issue 37).

    python experiments/posterior_qa.py --lm smollm2 --questions 200 --workdir runs/posterior_qa/smollm2
    python experiments/posterior_qa.py --lm qwen2.5-coder-0.5b --questions 200 --workdir runs/posterior_qa/qwen05b

The QA job of experiments/configs/sciq.py (4 demos, k = 4, the held-out questions after the demos) in four runs
that share one LM-score cache and one datastore:
  * τ = 1: none, REPLUG, concat;
  * τ = 0.1: REPLUG, replug_posterior α = 1;
  * τ = 0.1: replug_posterior α = 0.5;
  * τ = 0.1: replug_posterior α = 1 re-ranking the top 16 to 4.
`--runs tau0.1,concat` runs fewer (ensembled generation with the 0.5B reader is slow on 2 cores: the minutes of
each run are in its table); `--runs dev,concat` runs the dev split's choice (sciq.py's defaults: τ 0.03, α 0.5,
re-rank 16 → 4) for REPLUG and the posterior, `--baseline concat:concat` measures the intervals against concat;
`--runs lsr_answer,lsr_question --baseline lsr_answer:replug --lsr_retrievers DIR` runs REPLUG LSR at τ = 0.1 with
each target's retriever (DIR/answer, DIR/question: qa_lsr_pools.py's --save_retriever), REPLUG beside the first.
WORKDIR/table.md and table.json: exact match, answer NLL (nats per answer, the QA job's per-token mixture, zero-shot
passes), and the 95% bootstrap interval of the per-question difference against the baseline (REPLUG τ = 0.1 unless
`--baseline`), and answer recall@k (a gold answer in the passages mixed: the kept ones when re-ranking). A finished
run of the same config is reused (another config's is refused); a killed one resumes from the LM cache, which keeps
scores and generated answers (every 512 pairs, every 32 questions).
"""
from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from replug_jax.base import console
from replug_jax.jobs import results_file
from replug_jax.jobs.config_files import sibling_config
from replug_jax.main import run_job

CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")
RUNS = {  # name: (τ, methods, α, rerank depth[, LSR target: the retriever --lsr_retrievers/TARGET])
    "tau1": (1.0, ("none", "replug", "concat"), 1.0, 0),
    "tau0.1": (0.1, ("replug", "replug_posterior"), 1.0, 0),
    "alpha0.5": (0.1, ("replug_posterior",), 0.5, 0),
    "rerank16": (0.1, ("replug_posterior",), 1.0, 16),
    "concat": (0.1, ("concat",), 1.0, 0),  # concat alone (τ unused), for a shorter --runs selection
    "dev": (0.03, ("replug", "replug_posterior"), 0.5, 16),  # the dev split's choice, sciq.py's defaults
    "dev_posterior": (0.03, ("replug_posterior",), 0.5, 16),  # the same posterior alone (a slow LM's shorter run)
    "lsr_answer": (0.1, ("replug", "replug_lsr"), 1.0, 0, "answer"),  # REPLUG beside LSR: the intervals' baseline
    "lsr_question": (0.1, ("replug_lsr",), 1.0, 0, "question"),
}
DEFAULT_RUNS = "tau1,tau0.1,alpha0.5,rerank16"
ROWS = [("none", "tau1", "none"), ("concat", "tau1", "concat"), ("REPLUG τ 1", "tau1", "replug"),
        ("REPLUG τ 0.1", "tau0.1", "replug"), ("posterior α 1, τ 0.1", "tau0.1", "replug_posterior"),
        ("posterior α 0.5, τ 0.1", "alpha0.5", "replug_posterior"),
        ("posterior α 1, τ 0.1, re-rank 16 → 4", "rerank16", "replug_posterior"), ("concat", "concat", "concat"),
        ("REPLUG τ 0.03", "dev", "replug"), ("posterior α 0.5, τ 0.03, re-rank 16 → 4", "dev", "replug_posterior"),
        ("posterior α 0.5, τ 0.03, re-rank 16 → 4", "dev_posterior", "replug_posterior"),
        ("REPLUG τ 0.1", "lsr_answer", "replug"), ("LSR, answer target, τ 0.1", "lsr_answer", "replug_lsr"),
        ("LSR, question target, τ 0.1", "lsr_question", "replug_lsr")]
BASELINE = "tau0.1:replug"


def run_config(args, name: str):
    """The sciq.py config of one run."""
    tau, methods, alpha, depth, *lsr_target = RUNS[name]
    config = sibling_config(os.path.join(CONFIGS, "sciq.py"), "sciq.py")
    config.update(dict(lm=args.lm, max_questions=args.questions, methods=methods, temperature=tau,
                       posterior_alpha=alpha, rerank_depth=depth,
                       cache_dir=args.cache_dir or os.path.join(args.workdir, "shared"),
                       lm_cache=args.lm_cache or os.path.join(args.workdir, "lm_cache.sqlite")))
    if lsr_target:
        config.retriever_workdir = os.path.join(args.lsr_retrievers, lsr_target[0])
    return config


def run(args, name: str) -> tuple[dict, list[dict]]:
    """(results.json, predictions rows) of one run, running it when absent; a finished run of another config is
    refused (`results_file.finished_run`: the whole config compared)."""
    workdir, config = os.path.join(args.workdir, name), run_config(args, name)
    results = results_file.finished_run(workdir, config)
    if results is None:
        console.setup(workdir, -1)
        run_job(config, workdir)
        results = results_file.finished_run(workdir, config)  # as written (JSON's keys and lists)
    with open(os.path.join(workdir, "predictions.jsonl")) as f:
        return results, [json.loads(line) for line in f if line.strip()]


def bootstrap(diff: np.ndarray, draws: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% percentile interval of the mean of `diff` over questions resampled with replacement."""
    rng = np.random.default_rng(seed)
    means = diff[rng.integers(0, len(diff), (draws, len(diff)))].mean(axis=1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lm", default="smollm2")
    ap.add_argument("--questions", type=int, default=200)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--runs", default=DEFAULT_RUNS, help=f"comma list of {', '.join(RUNS)} (\"concat\": concat "
                    "alone, where tau1's none and REPLUG τ 1 are not wanted; \"dev\": the dev split's τ 0.03, α 0.5, "
                    "re-rank 16 → 4)")
    ap.add_argument("--baseline", default=BASELINE, help="RUN:METHOD whose per-question differences the intervals "
                    "are of (its run must be among --runs)")
    ap.add_argument("--cache_dir", default="", help="the datastore's folder (default WORKDIR/shared)")
    ap.add_argument("--lm_cache", default="", help="the LM-score cache (default WORKDIR/lm_cache.sqlite)")
    ap.add_argument("--lsr_retrievers", default="", help="for the lsr_* runs: qa_lsr_pools.py's --save_retriever "
                    "folder, holding answer/ and question/")
    args = ap.parse_args(argv)
    chosen = args.runs.split(",")
    if any(name.startswith("lsr_") for name in chosen) and not args.lsr_retrievers:
        raise SystemExit("--runs lsr_answer / lsr_question need --lsr_retrievers (qa_lsr_pools.py's --save_retriever)")
    base_run, _, base_method = args.baseline.partition(":")
    if base_run not in chosen or not set(chosen) <= set(RUNS) or base_method not in RUNS[base_run][1]:
        raise SystemExit(f"--runs {args.runs!r} --baseline {args.baseline!r}: runs from {', '.join(RUNS)}, the "
                         "baseline's run among them and its method one of that run's")
    base_label = next(label for label, name, method in ROWS if (name, method) == (base_run, base_method))
    started = time.time()
    runs = {name: run(args, name) for name in chosen}
    base = runs[base_run][1]
    base_nll = np.array([r[base_method]["answer_nll"] for r in base])
    base_em = np.array([r[base_method]["exact_match"] for r in base], float)
    rows, lines = [], [f"| method | EM % | answer NLL | vs {base_label} (95% CI) | EM diff (95% CI) | "
                       "recall@k % | minutes |", "|---|---:|---:|---:|---:|---:|---:|"]
    for label, name, method in (row for row in ROWS if row[1] in runs):
        results, preds = runs[name]
        nll = np.array([r[method]["answer_nll"] for r in preds])
        em = np.array([r[method]["exact_match"] for r in preds], float)
        lo, hi = bootstrap(nll - base_nll)
        elo, ehi = bootstrap(100 * (em - base_em))
        rel = 100 * (nll.mean() / base_nll.mean() - 1)
        recall = results["answer_recall"].get(method)  # % of questions with a gold answer in the mixed passages
        rows.append({"method": label, "run": name, "baseline": base_label, "exact_match": 100 * em.mean(),
                     "answer_nll": nll.mean(), "nll_vs_baseline_percent": rel, "nll_diff_ci": [lo, hi], "em_diff_ci": [elo, ehi],
                     "answer_recall": recall, "minutes": results["seconds"] / 60, "questions": len(preds)})
        lines.append(f"| {label} | {100 * em.mean():.1f} | {nll.mean():.3f} | {rel:+.1f}% ({lo:+.3f}, {hi:+.3f}) | "
                     f"{100 * (em.mean() - base_em.mean()):+.1f} ({elo:+.1f}, {ehi:+.1f}) | "
                     f"{'—' if recall is None else f'{recall:.1f}'} | {results['seconds'] / 60:.1f} |")
    text = (f"SciQ open QA, LM {args.lm}, {len(base)} held-out questions, 4 demos, k = 4 (minutes: the run that "
            f"row comes from)\n\n" + "\n".join(lines) + f"\n\nTotal {(time.time() - started) / 60:.1f} min")
    with open(os.path.join(args.workdir, "table.json"), "w") as f:
        json.dump({"lm": args.lm, "rows": rows}, f, indent=1)
    with open(os.path.join(args.workdir, "table.md"), "w") as f:
        f.write(text + "\n")
    print(text)
    return rows


if __name__ == "__main__":
    from replug_jax.jobs.command_line import script_entry

    script_entry(main)  # a mistake in a setting: one line, exit 2
