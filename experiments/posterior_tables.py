"""One accuracy table from finished multiple-choice runs (sciq_mc, OLMES): each row a method of a run, with the
95% bootstrap interval of the per-question difference against a baseline row (issue 37, item 5).

    python experiments/posterior_tables.py --title "sciq_mc, SmolLM2" --out runs/posterior_mc/sciq_mc/table.md \
        --baseline "REPLUG τ 0.1" \
        --row "none=runs/posterior_mc/sciq_mc/tau0.1:none" --row "REPLUG τ 1=runs/posterior_mc/sciq_mc/tau1:replug" \
        --row "REPLUG τ 0.1=runs/posterior_mc/sciq_mc/tau0.1:replug" ...

A row is LABEL=WORKDIR:METHOD; the run's predictions.jsonl gives, per question, the predicted option (the job's
metric) and the gold one, and its results.json the settings that ran: τ, α and the re-ranking depth are columns of
the table, and a label that names another value ("α 1" of a run whose config had posterior_alpha 0.5) is refused.
Every row must cover the same questions and come from the same LM (refused otherwise), and the caption names that LM
as the runs recorded it. Writes the markdown table to --out and its numbers beside it (.json).
"""
from __future__ import annotations

import argparse
import json
import os
import re

import numpy as np

from posterior_qa import bootstrap


def correct(workdir: str, method: str) -> dict[str, float]:
    """question id -> 1.0 where `method` picked the gold option of that run's predictions.jsonl."""
    with open(os.path.join(workdir, "predictions.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    missing = [r["id"] for r in rows if method not in r]
    if missing:
        raise SystemExit(f"{workdir}: method {method!r} did not run (e.g. question {missing[0]})")
    return {r["id"]: float(r[method] == r["answer"]) for r in rows}


def settings(workdir: str, method: str) -> dict:
    """What `method` ran with in that run (its results.json config): τ for the weighted ensembles; α and the
    re-ranking depth for replug_posterior (depth 0: k); for replug_lsr, the LSR target its retriever was trained
    with (the retriever's own results.json)."""
    path = os.path.join(workdir, "results.json")
    if not os.path.isfile(path):
        raise SystemExit(f"{workdir}: no results.json, so the settings that ran are unknown")
    with open(path) as f:
        config = json.load(f)["config"]
    out = {"lm": config["lm"], "k": config["k"]}
    if method in ("replug", "replug_lsr", "replug_posterior"):
        out["temperature"] = config["temperature"]
    if method == "replug_posterior":
        out["alpha"] = config["posterior_alpha"]
        out["depth"] = config.get("rerank_depth") or config["k"]
    if method == "replug_lsr":
        out["target"] = lsr_target(config.get("retriever_workdir") or "")
    return out


def lsr_target(retriever_workdir: str) -> str:
    """The `lsr_target` an LSR run trained its retriever with ("answer" when the run predates the setting)."""
    path = os.path.join(retriever_workdir, "results.json")
    if not os.path.isfile(path):
        raise SystemExit(f"{retriever_workdir!r}: no results.json, so the retriever's LSR target is unknown")
    with open(path) as f:
        return json.load(f).get("lsr", {}).get("lsr_target", "answer")


LABEL_VALUES = {"temperature": r"τ ([0-9.]+)", "alpha": r"α ([0-9.]+)", "depth": r"re-rank (\d+)",
                "target": r"(answer|question) target"}


def check_label(label: str, workdir: str, ran: dict) -> None:
    """Refuse a label naming a τ, α, depth or LSR target other than the run's (or one the method does not have)."""
    same = lambda said, value: said == value if isinstance(value, str) else float(said) == float(value)
    for key, pattern in LABEL_VALUES.items():
        said = re.search(pattern, label)
        if said and (key not in ran or not same(said.group(1), ran[key])):
            raise SystemExit(f"row {label!r} says {said.group(0)} but {workdir} ran "
                             f"{key}={ran.get(key, 'none (not a setting of this method)')}")


def table(rows: list[tuple[str, str, str]], baseline: str) -> tuple[list[dict], list[str]]:
    """(numbers per row, markdown lines): accuracy % and the per-question difference against `baseline`."""
    scored = {label: correct(workdir, method) for label, workdir, method in rows}
    if baseline not in scored:
        raise SystemExit(f"--baseline {baseline!r} is not a row label ({', '.join(scored)})")
    ids = sorted(scored[baseline])
    for label, by_id in scored.items():
        if sorted(by_id) != ids:
            raise SystemExit(f"row {label!r} covers other questions than the baseline {baseline!r}")
    ran_by_label = {label: settings(workdir, method) for label, workdir, method in rows}  # each results.json read once
    if len({ran["lm"] for ran in ran_by_label.values()}) > 1:
        raise SystemExit("rows from different LMs in one table: "
                         + ", ".join(f"{label!r}: {ran['lm']}" for label, ran in ran_by_label.items()))
    base = np.array([scored[baseline][i] for i in ids])
    numbers, lines = [], [f"| method | τ | α | depth → k | accuracy % | vs {baseline} (95% CI) |",
                          "|---|---:|---:|---:|---:|---:|"]
    for label, workdir, method in rows:
        ran = ran_by_label[label]
        check_label(label, workdir, ran)
        acc = np.array([scored[label][i] for i in ids])
        lo, hi = bootstrap(100 * (acc - base))
        numbers.append({"method": label, "run": workdir, "key": method, "settings": ran, "accuracy": 100 * acc.mean(),
                        "diff_ci": [lo, hi], "questions": len(ids)})
        depth = f"{ran['depth']} → {ran['k']}" if "depth" in ran else ""
        lines.append(f"| {label} | {ran.get('temperature', '')} | {ran.get('alpha', '')} | {depth} | "
                     f"{100 * acc.mean():.1f} | {100 * (acc.mean() - base.mean()):+.1f} ({lo:+.1f}, {hi:+.1f}) |")
    return numbers, lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--row", action="append", required=True, help="LABEL=WORKDIR:METHOD (repeat, in table order)")
    ap.add_argument("--baseline", required=True, help="the row label the differences are taken against")
    ap.add_argument("--title", default="")
    ap.add_argument("--out", required=True, help="the markdown file (numbers: the same name, .json)")
    args = ap.parse_args(argv)
    rows = []
    for spec in args.row:
        label, _, where = spec.partition("=")
        workdir, _, method = where.rpartition(":")
        if not label or not workdir or not method:
            raise SystemExit(f"--row {spec!r}: use LABEL=WORKDIR:METHOD")
        rows.append((label, workdir, method))
    numbers, lines = table(rows, args.baseline)
    caption = f"{args.title}, " if args.title else ""
    text = (f"{caption}{numbers[0]['questions']} questions, LM {numbers[0]['settings']['lm']} (the runs' "
            "results.json)\n\n" + "\n".join(lines))
    with open(args.out, "w") as f:
        f.write(text + "\n")
    with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
        json.dump({"title": args.title, "baseline": args.baseline, "rows": numbers}, f, indent=1)
    print(text)
    return numbers


if __name__ == "__main__":
    main()
