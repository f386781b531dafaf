"""Multiple-choice scoring with the few-shot prefix read once: seconds per question, before and after.

    python benchmarks/bench_mc_prefix.py --lms smollm2,qwen2.5-coder-0.5b --questions 8

Workload: the prompts as the mmlu job builds them (`evaluate/mmlu.py`) for sciq_mc (4 shots) and MMLU (5 shots,
the paper's Table 4), each shot with a passage, then per question k = 4 passes "Knowledge: <passage>\\n
Question: ..\\nA. .. D. ..\\nAnswer:" (REPLUG), one closed-book prompt ("none") and one with the passages joined
("concat"). Passages are cut to 128 LM tokens: for SciQ its support paragraphs (the question's own and three
others, as a retriever's top 4 would hold), for MMLU Wikipedia text.
Each method's option log-probs (" A" .. " D") are computed by the same LocalLM twice, timed interleaved:
  full    every row scored whole (`min_shared_prefix=0`, what the project did before);
  prefix  rows sharing the few-shot block read it from one key/value cache (lm/shared_prefix.py).
Reports seconds per question per method, the speed-up, and the largest |Δ log p| between the two.
"""
from __future__ import annotations

import argparse
import os
import sys

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402


def mc_prompts(lm, task: str, questions: int, shots: int, k: int, doc_tokens: int = 128, seed: int = 0) -> dict:
    """{method: prompts [Q][passes]}: sciq_mc's first `questions` questions after `shots` demos, with SciQ support
    paragraphs as passages; or MMLU's (high_school_biology test, its dev split's shots) with Wikipedia cuts."""
    from replug_jax.evaluate import mmlu

    rng = np.random.default_rng(seed)
    cut = lambda text: lm.tokenizer.decode(lm.tokenizer.encode(text)[:doc_tokens])
    if task == "sciq_mc":
        from replug_jax.data.sciq import load_sciq_mc, sciq_support_documents

        examples, docs = load_sciq_mc(), sciq_support_documents()
        passages = [cut(d.text) for d in docs[: shots + questions + 64]]  # support paragraph i is example i's
        demos, asked = examples[:shots], examples[shots : shots + questions]
        per_question = [[passages[shots + q]] + [passages[int(j)] for j in rng.choice(len(passages), k - 1, replace=False)]
                        for q in range(len(asked))]
        shot_passages = passages[:shots]
    elif task == "mmlu":
        from replug_jax.data.question_sets import load_mmlu
        from replug_jax.data.wiki import load_wiki_articles

        demos = load_mmlu("dev", ["high_school_biology"])[:shots]
        asked = load_mmlu("test", ["high_school_biology"])[:questions]
        texts = [a.text for a in load_wiki_articles()[:40]]
        pool = [cut(t[i : i + 2000]) for t in texts for i in range(0, min(len(t), 8000), 2000)]
        per_question = [[pool[int(j)] for j in rng.choice(len(pool), k, replace=False)] for _ in asked]
        shot_passages = [pool[int(j)] for j in rng.choice(len(pool), shots, replace=False)]
    else:
        raise ValueError(f"task must be sciq_mc or mmlu, got {task!r}")
    subject = asked[0].subject
    prompts = {}
    for method in ("none", "replug", "concat"):
        prefix = mmlu.shots_block(demos, shot_passages if method != "none" else [None] * shots)
        prompts[method] = mmlu.method_prompts(method, asked, per_question, {subject: prefix})
    return prompts


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lms", default="smollm2,qwen2.5-coder-0.5b")
    p.add_argument("--tasks", default="sciq_mc,mmlu")
    p.add_argument("--questions", type=int, default=8)
    p.add_argument("--shots", default="sciq_mc=4,mmlu=5", help="demos per task (sciq.py's 4; the paper's 5 for MMLU)")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--batch_size", type=int, default=4, help="the LM's batch (sciq.py's lm_batch_size)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results.jsonl"))
    args = p.parse_args(argv)

    import replug_jax as rj
    from replug_jax.evaluate import mmlu
    from replug_jax.lm.local import LocalLM

    shots = {t: int(n) for t, n in (x.split("=") for x in args.shots.split(","))}
    rows = []
    for name in args.lms.split(","):
        prefix_lm = rj.load_lm(name, batch_size=args.batch_size)
        full_lm = LocalLM(prefix_lm.config, prefix_lm.params, prefix_lm.tokenizer, name=name, max_length=prefix_lm.max_length,
                          batch_size=args.batch_size, mesh=prefix_lm.mesh, min_shared_prefix=0)
        for task, method, prompts in ((t, m, p) for t in args.tasks.split(",")
                                      for m, p in mc_prompts(prefix_lm, t, args.questions, shots[t], args.k).items()):
            runs = {"full": lambda: mmlu.option_logprobs(full_lm, prompts),
                    "prefix": lambda: mmlu.option_logprobs(prefix_lm, prompts)}
            values = {n: fn() for n, fn in runs.items()}  # warm-up: compiles every shape
            best = common.interleaved_best(runs, args.rounds)
            tokens = [prefix_lm.count_tokens(p) for q in prompts for p in q]
            rows.append({"benchmark": "mc_prefix_cache", "lm": name, "task": task, "method": method,
                         "questions": args.questions, "shots": shots[task], "k": args.k, "batch_size": args.batch_size,
                         "mean_prompt_tokens": float(np.mean(tokens)),
                         "s_per_question_full": best["full"] / args.questions,
                         "s_per_question_prefix": best["prefix"] / args.questions,
                         "speedup": best["full"] / best["prefix"],
                         "max_abs_diff_logprob": float(np.max(np.abs(values["full"] - values["prefix"]))),
                         "jax": jax.__version__, "device": jax.devices()[0].device_kind,
                         "command": "python " + " ".join(sys.argv)})
            print(rows[-1], flush=True)
    common.print_table(rows, ["lm", "task", "method", "mean_prompt_tokens", "s_per_question_full", "s_per_question_prefix",
                              "speedup", "max_abs_diff_logprob"])
    common.write_rows(rows, args.out)
    return rows


if __name__ == "__main__":
    main()
