"""Results on disk: results.json, a Markdown table (also printed), and a plot of perplexity against k."""
from __future__ import annotations

import os

from replug_jax.jobs import results_file

METHOD_ORDER = ("none", "replug", "replug_posterior", "replug_lsr", "random", "concat", "bm25")


KL_NAMES = {"pr_q": "KL(P_R ‖ Q)", "q_pr": "KL(Q ‖ P_R)"}  # LSR's directions (method/lsr_loss.py)


def method_label(method: str, results: dict) -> str:
    """A method's name in a table: replug_lsr with the KL direction its retriever was trained with, when known."""
    direction = (results.get("lsr") or {}).get("direction") or results.get("lsr_direction")
    if method == "replug_lsr" and direction:
        return f"replug_lsr ({KL_NAMES.get(direction, direction)})"
    return method


def _ordered(methods):
    known = [m for m in METHOD_ORDER if m in methods]
    return known + sorted(m for m in methods if m not in METHOD_ORDER)


def markdown_table(results: dict) -> str:
    """Perplexity and bits per byte per method, with the change against no retrieval."""
    ppl, bpb = results["perplexity"], results["bits_per_byte"]
    lines = [f"Held-out LM evaluation: {results['tokens']} tokens, {results['bytes']} bytes, "
             f"{results['windows']} windows ({results['windows_with_retrieval']} with retrieval), k = {results['k']}", "",
             "| method | perplexity | bits per byte | vs none |", "|---|---:|---:|---:|"]
    for m in _ordered(ppl):
        change = 100.0 * (ppl[m] / ppl["none"] - 1.0)
        lines.append(f"| {method_label(m, results)} | {ppl[m]:.3f} | {bpb[m]:.4f} | {change:+.2f}% |")
    sweep = results.get("k_sweep") or {}
    if sweep:
        ks = sorted({int(k) for by_k in sweep.values() for k in by_k})
        lines += ["", "Perplexity against the number of ensembled documents k:", "",
                  "| method | " + " | ".join(f"k={k}" for k in ks) + " |", "|---|" + "---:|" * len(ks)]
        for m in _ordered(sweep):
            cells = [f"{sweep[m][str(k)]['perplexity']:.3f}" if str(k) in sweep[m] else "" for k in ks]
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
    taus = results.get("temperature_sweep") or {}
    if taus:
        values = sorted({float(t) for by_t in taus.values() for t in by_t})
        lines += ["", f"Perplexity against the ensemble temperature τ (λ = softmax(s / τ), k = {results['k']}):", "",
                  "| method | " + " | ".join(f"τ={t:g}" for t in values) + " |", "|---|" + "---:|" * len(values)]
        constant = []
        for m in _ordered(taus):
            by_value = {float(t): x for t, x in taus[m].items()}
            cells = [f"{by_value[t]['perplexity']:.3f}" if t in by_value else "" for t in values]
            if len(values) > 1 and len(set(cells)) == 1:  # τ cannot move it (a retriever whose scores are all equal)
                constant.append(f"{m} ({cells[0]})")
                continue
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
        if constant:
            lines += ["", f"The same at every τ, so left out: {', '.join(constant)} (its scores are all equal)."]
    lines += [f"\nWarning: {w}" for w in results.get("warnings", ())]
    return "\n".join(lines) + "\n"


def for_console(table: str, warnings) -> str:
    """results.md's text for the console, whose warnings each job has already said as a phase line when it found them:
    one line pointing to them instead of each again."""
    for w in warnings:
        table = table.replace(f"\nWarning: {w}\n", "\n").replace(f"\nWarning: {w}", "")
    count = len(warnings)
    return table.rstrip("\n") + (f"\n\n{count} warning{'s' * (count > 1)} said above, also under the table in "
                                  "results.md" if count else "") + "\n"


def plot_k_sweep(results: dict, path: str) -> str | None:
    """Perplexity against k for each retrieval method, with no retrieval as a line; returns the path."""
    sweep = results.get("k_sweep") or {}
    if not sweep:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.8), dpi=120)
    for m in _ordered(sweep):
        ks = sorted(int(k) for k in sweep[m])
        ax.plot(ks, [sweep[m][str(k)]["perplexity"] for k in ks], marker="o", label=m)
    ax.axhline(results["perplexity"]["none"], color="gray", linestyle="--", label="none")
    ax.set_xticks(sorted({int(k) for by_k in sweep.values() for k in by_k}))
    ax.set_xlabel("documents ensembled (k)")
    ax.set_ylabel("perplexity")
    ax.set_title("Held-out perplexity against k")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def write_results(results: dict, workdir: str) -> str:
    """results.json (and its copy under history/), results.md and perplexity_vs_k.png in `workdir`; returns the table."""
    results_file.save(results, workdir)  # results.json, and the run's copy under history/
    table = markdown_table(results)
    with open(os.path.join(workdir, "results.md"), "w") as f:
        f.write(table)
    plot_k_sweep(results, os.path.join(workdir, "perplexity_vs_k.png"))
    return table
