"""The held-out-window evaluation that the LM-evaluation and LSR jobs both end with (not a job itself):
score every method on the held-out windows, write results.json, results.md and the plot."""
from __future__ import annotations

import json
import os
import resource
import time

import jax
from absl import logging

from replug_jax.base import console
from replug_jax.base.atomic_files import atomic_open
from replug_jax.evaluate import perplexity as lm_perplexity
from replug_jax.evaluate.windows import retrieval_shortfall, small_evaluation
from replug_jax.jobs import prepare, report, results_file
from replug_jax.jobs.input_checks import input_warnings
from replug_jax.parallel import distributed
from replug_jax.retrieval.datastore import with_passage_fields

SWEEPING = ("replug", "replug_lsr", "random")  # the methods a k sweep re-mixes (evaluate_lm's sweep_retrievers)


WINDOWS_FILE = "windows.jsonl"  # one row per held-out window: its passages and λ per method (`evaluate_lm`'s evidence)


def evaluate_and_report(config, workdir: str, prepared: prepare.Workspace, retrievers: dict,
                        extra: dict | None = None, temperatures: dict | None = None, temperature_sweep=()) -> dict:
    """Score every method on the held-out windows; write results.json, results.md and the plot.

    temperatures: per-retriever τ overriding config.temperature (bm25: config.bm25_temperature);
    temperature_sweep: τ values reported besides config.temperature_sweep."""
    windows = prepare.make_windows(prepared.paths["eval"], prepared.tokenizer, config)
    logging.info("datastore %d chunks; %d evaluation windows", len(prepared.store), len(windows))
    said = [w for w in (retrieval_shortfall(windows), small_evaluation(windows)) if w]
    said += prepare.cut_warnings(prepared) + input_warnings(config)
    for warning in said if distributed.is_lead() else ():
        console.phase(f"warning: {warning}")  # the console and WORKDIR/log.txt; under the table in results.md
    warnings = said + [w for w in (sweep_depth(config),) if w]  # said before the models loaded (`warn_early`)
    evidence = [] if config.get("windows_file", True) else None  # each window's passages and λ per method
    run_id = results_file.new_run_id()

    def method_finished(metrics: dict) -> None:
        """results.json with the methods finished so far, marked incomplete (a run that fails later keeps them)."""
        if distributed.is_lead():
            results_file.save({"complete": False, "methods_finished": sorted(metrics["perplexity"]),
                               "run_id": run_id, "lm": config.lm, "config": results_file.config_record(config),
                               **metrics}, workdir)

    results = lm_perplexity.evaluate_lm(
        prepared.lm, windows, prepared.store, retrievers, k=config.get("eval_k") or config.k,
        k_sweep=tuple(config.k_sweep), sweep_retrievers=SWEEPING,
        concat_retriever="replug" if "concat" in config.methods else None, temperature=config.temperature,
        temperatures={"bm25": config.bm25_temperature, **(temperatures or {})},
        temperature_sweep=tuple(sorted({*config.get("temperature_sweep", ()), *temperature_sweep})),
        posterior_alpha=config.get("posterior_alpha", 1.0) if lm_perplexity.POSTERIOR in config.methods else None,
        rerank_depth=config.get("rerank_depth", 0), evidence=evidence, method_finished=method_finished)
    results.update({"encoder": config.encoder, "lm": config.lm, "lm_mesh": prepare.lm_mesh_record(prepared.lm),
                    "lm_backend": results_file.lm_backend(prepared.lm),
                    "compute_dtypes": results_file.compute_dtypes(prepared.encoder, prepared.lm),
                    "datastore_chunks": len(prepared.store),
                    "doc_tokens": config.doc_tokens, "query_tokens": config.query_tokens,
                    "context_tokens": config.context_tokens, "stride_tokens": config.stride_tokens,
                    "metric": config.metric, "warnings": warnings, "seconds": time.time() - prepared.started,
                    "config": results_file.config_record(config),
                    "processes": jax.process_count(),
                    "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, **(extra or {}),
                    "complete": True, "methods_finished": sorted(results["perplexity"]), "run_id": run_id})
    if hasattr(prepared.lm, "stats"):  # several processes: one entry per process, each for its own share
        stats = distributed.allgather_json(prepared.lm.stats())
        results["lm_requests"] = stats[0] if len(stats) == 1 else stats
    if distributed.is_lead():  # several processes: one writer
        if evidence is not None:
            with atomic_open(os.path.join(workdir, WINDOWS_FILE)) as f:
                f.writelines(json.dumps(row, ensure_ascii=False) + "\n"
                             for row in with_passage_fields(evidence, prepared.store))
        print(report.for_console(report.write_results(results, workdir), warnings))
        print(f"results in {os.path.join(workdir, 'results.json')}")
    return results


def warn_early(config) -> None:
    """What the config alone says is costly, logged as a job starts (before its models load); results.json's
    "warnings" repeat it (`evaluate_and_report`)."""
    said = sweep_depth(config)
    if said and distributed.is_lead():
        console.phase(f"warning: {said}")


def sweep_depth(config) -> str | None:
    """A warning when the k sweep reaches beyond the evaluated k: the sweeping methods then score that many passages
    per window (the k sweep reuses the passes of its largest k), which lowering k alone does not save."""
    k, deepest = config.get("eval_k") or config.k, max(config.k_sweep, default=0)
    if deepest <= k:
        return None
    sweeping = [m for m in SWEEPING if m in config.methods or m == "replug"]  # replug always runs
    kept = ",".join(str(x) for x in config.k_sweep if x <= k) or str(k)
    return (f"--config.k_sweep reaches {deepest} > k={k}: {' and '.join(sweeping)} score their top {deepest} "
            f"passages per window ({deepest / k:.1f}x the passes of k={k}) for the sweep's columns; "
            f"--config.k_sweep={kept} scores only the top {k}")

