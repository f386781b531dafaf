"""The REPLUG LSR diagnosis grid (issue 10): which settings make LSR beat REPLUG on the offline demo.

    python experiments/lsr_grid.py run [CELL ...]   # train + evaluate the cells (all by default), skipping done ones
    python experiments/lsr_grid.py table            # the table of experiments/README.md from runs/lsr_grid/*/
    python experiments/lsr_grid.py run qs_sum_b0.1_96x3 --root /tmp/grid --set steps=2 --set max_eval_docs=1
                                                    # elsewhere, with settings over every cell's (a smoke run)

Every cell is `python -m replug_jax.main --config experiments/configs/demo_lsr.py` with the overrides below,
in runs/lsr_grid/CELL. The cells share the data split, datastore and index (--config.cache_dir) and one LM
score cache (--config.lm_cache), so a pass any cell scored is never scored again: the grid costs about one
run's LM calls plus what each cell retrieves differently.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.join("runs", "lsr_grid")
# every cell: the related split (the datastore holds the opening half of each held-out article), 75 held-out
# windows, k = 4, encoder lengths as retrieval's, 128-token training queries; cells differ in what follows
COMMON = dict(wiki_split="related", eval_fraction=0.1, max_eval_docs=12, max_windows_per_doc=8, k_sweep=(4,),
              query_max_tokens=0,
              doc_max_tokens=0, train_query_tokens=128, batch_size=8, gamma=0.1, learning_rate=1e-4, direction="pr_q",
              lm_cache="{root}/lm_cache.sqlite")  # {root}: --root (ROOT)
T10 = dict(cache_dir="{root}/shared_t10", train_fraction=0.1, train_continuation_tokens=64)  # 10 articles
T30 = dict(cache_dir="{root}/shared_t30", train_fraction=0.3, train_continuation_tokens=32)  # 30 (~600)
QUERY_SIDE = dict(train_documents=False, refresh_every=1000, swap_after=0)
FULL = dict(train_documents=True, refresh_every=20, swap_after=5)

# name -> (what it tests, overrides of demo_lsr.py on top of COMMON)
CELLS = {
    "qs_sum_b0.1_96x3": ("the paper's ℓ sum / β = 0.1, 96 examples × 3 epochs, query side",
                         dict(T10, **QUERY_SIDE, steps=36, max_train_examples=96, lm_score="sum", beta=0.1,
                              checkpoint_every=12)),
    "qs_mean_b0.1_t30": ("ℓ per-token mean, β = 0.1, one pass over 320 examples, query side",
                         dict(T30, **QUERY_SIDE, steps=40, lm_score="mean", beta=0.1, checkpoint_every=20)),
    "qs_mean_b0.02_t30": ("ℓ mean, β = 0.02 (a sharper Q), query side",
                          dict(T30, **QUERY_SIDE, steps=40, lm_score="mean", beta=0.02, checkpoint_every=20)),
    "full_mean_b0.02_t30": ("ℓ mean, β = 0.02, both encoders trained, index refreshed every 20 steps",
                            dict(T30, **FULL, steps=40, lm_score="mean", beta=0.02, checkpoint_every=20)),
    "qs_mean_b0.02_t30_q_pr": ("KL(Q ‖ P_R) (Atlas, the official stub), ℓ mean, β = 0.02, query side",
                               dict(T30, **QUERY_SIDE, steps=40, lm_score="mean", beta=0.02, direction="q_pr",
                                    checkpoint_every=20)),
}


def cell_settings(name: str, root: str = ROOT, extra: dict | None = None) -> dict:
    """The grid's and the cell's overrides of demo_lsr.py, its files under `root`, then `extra` (--set)."""
    settings = {key: value.format(root=root) if isinstance(value, str) else value
                for key, value in {**COMMON, **CELLS[name][1]}.items()}
    return {**settings, **(extra or {})}


def command(name: str, root: str = ROOT, extra: dict | None = None) -> list[str]:
    overrides = [f"--config.{key}={value}" for key, value in cell_settings(name, root, extra).items()]
    return [sys.executable, "-m", "replug_jax.main", "--config", "experiments/configs/demo_lsr.py",
            "--workdir", os.path.join(root, name), *overrides]


def cell_config(name: str, root: str = ROOT, extra: dict | None = None):
    """The config `command(name)` runs: demo_lsr.py with the grid's and the cell's settings."""
    from replug_jax.jobs.config_files import set_from_text, sibling_config

    config = sibling_config(os.path.join("experiments", "configs", "demo_lsr.py"), "demo_lsr.py")
    config.update(cell_settings(name, root))
    for key, value in (extra or {}).items():
        set_from_text(config, f"{key}={value}")
    return config


def run(names: list[str], root: str = ROOT, extra: dict | None = None) -> None:
    from replug_jax.jobs.results_file import finished_run

    for name in names or list(CELLS):
        if name not in CELLS:
            sys.exit(f"unknown cell {name!r}: the cells are {', '.join(CELLS)}")
        if finished_run(os.path.join(root, name), cell_config(name, root, extra)):  # another config's: refused
            print(f"{name}: done, skipped")
            continue
        print(" ".join(command(name, root, extra)), flush=True)
        subprocess.run(command(name, root, extra), check=True)


def training_summary(workdir: str) -> dict:
    """Means over the first and the last quarter of the training steps."""
    path = os.path.join(workdir, "lsr", "metrics.jsonl")
    rows = [json.loads(line) for line in open(path)] if os.path.isfile(path) else []
    if not rows:
        return {}
    quarter = max(1, len(rows) // 4)
    mean = lambda key, part: sum(r[key] for r in part) / len(part)  # noqa: E731
    return {f"{key}_{when}": mean(key, part) for key in ("loss", "top1_agreement", "entropy_q", "grad_norm")
            for when, part in (("first", rows[:quarter]), ("last", rows[-quarter:]))}


def table(root: str = ROOT) -> str:
    lines = ["| cell | what it tests | none | REPLUG τ=1 | REPLUG τ=γ | LSR τ=1 | LSR τ=γ | LSR vs REPLUG (τ=1 / τ=γ) "
             "| top-1 agreement, first → last quarter | KL loss, first → last | entropy Q (nats) | grad norm |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        path = os.path.join(root, name, "results.json")
        if not os.path.isfile(path):
            continue
        r = json.load(open(path))
        if "lsr" not in r:
            continue
        gamma = str(r["lsr"]["gamma"])
        sweep = r["temperature_sweep"]
        ppl = lambda method, tau: sweep[method][tau]["perplexity"]  # noqa: E731
        change = lambda tau: 100 * (ppl("replug_lsr", tau) / ppl("replug", tau) - 1)  # noqa: E731
        t = training_summary(os.path.join(root, name))
        what = CELLS.get(name, ("",))[0]
        lines.append(f"| {name} | {what} | {r['perplexity']['none']:.3f} | {ppl('replug', '1.0'):.3f} | "
                     f"{ppl('replug', gamma):.3f} | {ppl('replug_lsr', '1.0'):.3f} | {ppl('replug_lsr', gamma):.3f} | "
                     f"{change('1.0'):+.2f}% / {change(gamma):+.2f}% | {t.get('top1_agreement_first', 0):.2f} → "
                     f"{t.get('top1_agreement_last', 0):.2f} | {t.get('loss_first', 0):.3g} → {t.get('loss_last', 0):.3g} | "
                     f"{t.get('entropy_q_last', 0):.3f} | "
                     f"{t.get('grad_norm_last', 0):.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], usage="%(prog)s run [CELL ...] | table")
    ap.add_argument("action", choices=("run", "table"))
    ap.add_argument("cells", nargs="*", help=f"run: the cells (default all: {', '.join(CELLS)})")
    ap.add_argument("--root", default=ROOT, help="the cells' folder")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a demo_lsr.py setting over every cell's (a smoke run: steps=2, max_eval_docs=1)")
    args = ap.parse_args()
    extra = dict(item.split("=", 1) for item in args.set)
    if args.action == "run":
        run(args.cells, args.root, extra)
    else:
        print(table(args.root))
