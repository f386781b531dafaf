"""What lm-eval's is_greedy costs the harness on a multiple-choice task (issue 85, item 3: at most 1.1x is_greedy=false).

    python benchmarks/bench_is_greedy.py [--questions 24 --k 4 --shots 1] [--lm http://127.0.0.1:8000/v1]

The offline SciQ multiple-choice task (harness/offline_tasks.py: 4 options a question, their support paragraphs as
the corpus) through `lm_eval.simple_evaluate` with the `replug` model at k passages, three ways on one loaded model:
  * is_greedy=false: the scoring alone;
  * is_greedy=true: read from the scoring pass's own top tokens (method/greedy_match.py), decoding only the open ones;
  * decoded: every request also decoded greedily, as the harness did before (the reference values).
Each is run once small to compile, then timed in turn (`--rounds`, the best of each). Reports the seconds, the
ratios to is_greedy=false, how many is_greedy values the scoring pass decided, and whether they equal the decoded
ones; a row per way goes to benchmarks/results.jsonl. `--lm`: the LM as the harness's `lm=` takes it, e.g. our server's
URL (`python -m replug_jax.serve --lm smollm2`, started beforehand), whose scoring requests give the top tokens too.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import print_table, write_rows  # noqa: E402

import lm_eval  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

from replug_jax.harness import offline_tasks  # noqa: E402
from replug_jax.harness.model import REPLUGHarnessLM  # noqa: E402

TASK = "replug_sciq_mc"


class DecodedGreedy(REPLUGHarnessLM):
    """The harness as it was: every request's is_greedy by decoding it (the reference values and cost)."""

    def logliks_and_greedy(self, contexts, continuations, queries):
        return self.continuation_logliks(contexts, continuations, queries), self.greedy(contexts, continuations,
                                                                                         queries)


def run(model, manager, limit: int, shots: int) -> tuple[float, list[bool]]:
    """(seconds, is_greedy of every request in order) of one evaluation."""
    start = time.perf_counter()
    out = lm_eval.simple_evaluate(model=model, tasks=[TASK], task_manager=manager, limit=limit, num_fewshot=shots,
                                  log_samples=True, random_seed=0, numpy_random_seed=0, torch_random_seed=0)
    seconds = time.perf_counter() - start
    return seconds, [bool(r[0][1]) for s in out["samples"][TASK] for r in s["resps"]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--questions", type=int, default=24)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--shots", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--lm", default="smollm2", help="the harness's lm= (a packaged name, a path or a server's URL)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results.jsonl"))
    args = ap.parse_args()
    folder = offline_tasks.write_tasks(tempfile.mkdtemp(prefix="bench_is_greedy_"), limit=args.questions)
    manager = TaskManager(include_path=folder, include_defaults=False)
    common = dict(corpus=os.path.join(folder, offline_tasks.CORPUS_FILE), include_path=folder, k=args.k)
    scoring = REPLUGHarnessLM(lm=args.lm, **common)
    models = {"is_greedy=false": scoring, "is_greedy=true": scoring,
              "decoded": DecodedGreedy(lm=scoring.lm, encoder=scoring.rag.retriever.encoder, **common)}
    flags = {"is_greedy=false": False, "is_greedy=true": True, "decoded": True}
    for name, model in models.items():  # compile every program each way uses
        model.is_greedy = flags[name]
        run(model, manager, 2, args.shots)
    best, values = {}, {}
    for _ in range(args.rounds):
        for name, model in models.items():
            model.is_greedy = flags[name]
            if name == "is_greedy=true":
                scoring.greedy_counts = {"from scoring": 0, "decoded": 0}
            seconds, values[name] = run(model, manager, args.questions, args.shots)
            best[name] = min(best.get(name, float("inf")), seconds)
    counts = scoring.greedy_counts
    same = values["is_greedy=true"] == values["decoded"]
    rows = [dict(benchmark="is_greedy", lm=args.lm, way=name, questions=args.questions, k=args.k, shots=args.shots,
                 seconds=round(best[name], 2), ratio=round(best[name] / best["is_greedy=false"], 3),
                 **({"from_scoring": counts["from scoring"], "decoded_requests": counts["decoded"],
                     "same_is_greedy_as_decoded": same} if name == "is_greedy=true" else {}))
            for name in models]
    print_table(rows, ["way", "seconds", "ratio", "from_scoring", "decoded_requests", "same_is_greedy_as_decoded"])
    print(f"is_greedy values equal to decoding's: {same} ({sum(values['decoded'])} of {len(values['decoded'])} "
          "requests greedy)")
    write_rows(rows, args.out)


if __name__ == "__main__":
    main()
