"""Paper-scale LMs on single-host TPU slices, compiled by the TPU compiler on this CPU (libtpu; nothing runs):
what fits, the bytes per chip, and the estimated MFU of REPLUG's scoring and decoding, with Contriever's embedding
and the LSR train step. The compiled successor of the shape arithmetic that was benchmarks/memory_plan.py.

    python benchmarks/tpu_plan.py [--models Llama-2-7B,...] [--tpus v5e-8,...] [--out benchmarks/tpu_plan.json]

For each model and slice, the smallest model axis M (1, 2, 4, ...) at which the scoring pass and a REPLUG generation
call (nq.py's: 8 questions of 10 passes after 16 shots, each pass 160 cache slots of its own after the shots' 2,624)
both fit, then at that M:
  * scoring: the programs LocalLM runs for a REPLUG pass, 8 rows of 512 tokens a data shard, 32 scored positions
    (also at the smallest M at which scoring alone fits: a job that only scores, as MMLU's or an LM evaluation);
  * decoding: one step of the generation loop (`local_generate.decode_step`) for that call, and its HBM roofline;
  * embedding: Contriever-base, 32 passages of 152 tokens a chip's call (the QA jobs' corpus embedding);
  * the LSR step: pile_lsr.py's (batch 64, top 20, 512-token queries and documents, both sides) on every chip, as
    it is and recomputing the encoder's activations in the backward pass (recompute_activations).
Memory and "fits" are the compiler's facts; seconds and MFU are its cost model's estimates (replug_jax/plan/costs.py).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax.numpy as jnp  # noqa: E402

from replug_jax.lm import local  # noqa: E402
from replug_jax.models import architectures  # noqa: E402
from replug_jax.parallel import sharding, tpu  # noqa: E402
from replug_jax.plan import costs, planner, programs  # noqa: E402

MODELS = {"Llama-2-7B": "meta-llama/Llama-2-7b-hf", "Llama-2-13B": "meta-llama/Llama-2-13b-hf",
          "Llama-2-70B": "meta-llama/Llama-2-70b-hf", "Qwen2.5-7B": "Qwen/Qwen2.5-7B",
          "Qwen2.5-14B": "Qwen/Qwen2.5-14B", "Mistral-7B": "mistralai/Mistral-7B-v0.1"}
TPUS = ("v4-8", "v5e-8", "v5p-8", "v6e-8")
ROWS, LENGTH, SCORED = 8, 512, 32  # a scoring call per data shard
GENERATION = dict(passes=10, prefix=2624, width=144, query=0, steps=16)  # nq.py: 16 shots, top-10, one question


def generation_shape(mesh) -> programs.GenerationShape:
    """nq.py's generation call: lm_generation_questions (8) questions, at least one a data shard."""
    questions = sharding.round_up(local.GENERATION_QUESTIONS, sharding.data_size(mesh))
    return programs.GenerationShape(questions=questions, keep=GENERATION["passes"], **GENERATION)


def lm_row(name: str, tpu_name: str, target: planner.Target) -> dict:
    config = architectures.lm_config(MODELS.get(name, name))  # a paper-scale LM, or any name the jobs take
    chip, bf16 = target.slice_.chip, jnp.bfloat16
    row = {"model": name, "tpu": tpu_name, "chips": len(target.devices),
           "usable_hbm_gib": chip.usable_hbm_bytes / 2**30}
    for model_parallel in planner._powers_of_two(1, len(target.devices)):
        mesh = sharding.lm_mesh(model_parallel, target.devices)
        data = sharding.data_size(mesh)
        score = programs.scoring(config, bf16, mesh, ROWS * data, LENGTH, SCORED)
        shape = generation_shape(mesh)
        whole = programs.generation(config, bf16, mesh, shape)
        memory = {p.kind: costs.compile_figures(p.lower(), target.name) for p in (score, whole)}
        row.update(model_parallel=model_parallel,
                   scoring_gib=(memory["scoring"].total_bytes or memory["scoring"].needed_bytes) / 2**30,
                   generation_gib=(memory["generation"].total_bytes or memory["generation"].needed_bytes) / 2**30)
        if all(planner.fits(m, chip) for m in memory.values()):
            break
    else:
        row["fits"] = False
        return row
    row["fits"] = True
    alone = _scoring_alone(config, target)  # scoring at the smallest split it fits alone (no generation beside it)
    if alone is not None:
        row.update(scoring_alone_model_parallel=alone[0], scoring_alone_mfu=alone[1])
    step = programs.decode_step(config, bf16, mesh, shape)
    for label, program in (("scoring", score), ("decode", step)):
        cost = costs.extrapolated(program.lower, config.num_layers, target.name)
        memory = costs.compile_figures(program.lower(), target.name)
        figures = planner.program_row(program, memory, cost, chip)
        row[f"{label}_ms"] = figures["est_seconds_per_call"] * 1e3
        row[f"{label}_mfu"] = figures["mfu"]
        row[f"{label}_collective_share"] = figures["collective_share"]
        row[f"{label}_tokens_per_s_per_chip"] = figures["units_per_second_per_chip"]
        if label == "decode":
            row["decode_hbm_roofline"] = figures["hbm_roofline_fraction"]
    return row


def _scoring_alone(config, target: planner.Target):
    """(M, estimated MFU) of the scoring program at the smallest model axis at which it fits alone, or None."""
    for model_parallel in planner._powers_of_two(1, len(target.devices)):
        mesh = sharding.lm_mesh(model_parallel, target.devices)
        score = programs.scoring(config, jnp.bfloat16, mesh, ROWS * sharding.data_size(mesh), LENGTH, SCORED)
        memory = costs.compile_figures(score.lower(), target.name)
        if planner.fits(memory, target.slice_.chip):
            cost = costs.extrapolated(score.lower, config.num_layers, target.name)
            return model_parallel, planner.program_row(score, memory, cost, target.slice_.chip)["mfu"]
    return None


def retriever_row(tpu_name: str, target: planner.Target, encoder_name: str = "contriever",
                  lsr_batch: int = 64) -> dict:
    encoder, _ = architectures.encoder_config(encoder_name)
    chip, bf16 = target.slice_.chip, jnp.bfloat16
    mesh = sharding.data_mesh(target.devices)
    embed = programs.embedding(encoder, bf16, mesh, 32 * len(target.devices), 152)
    step = lambda recompute: programs.train_step(encoder, bf16, mesh, batch=lsr_batch, k=20, query_tokens=512,
                                                 doc_tokens=512, query_side=False, recompute=recompute)
    row = {"tpu": tpu_name}
    plans = (("embedding", embed), ("lsr_step", step(False)), ("lsr_step_recomputed", step(True)))
    for label, program in plans:
        figures = costs.compile_figures(program.lower(), target.name)
        r = planner.program_row(program, figures, figures, chip)
        row.update({f"{label}_gib": (figures.total_bytes or figures.needed_bytes) / 2**30, f"{label}_fits": r["fits"]})
        if r["fits"]:
            row.update({f"{label}_ms": r["est_seconds_per_call"] * 1e3, f"{label}_mfu": r["mfu"]})
        if label == "embedding" and r["fits"]:
            row["passages_per_s_per_chip"] = r["units_per_second_per_chip"]
    return row


def table(rows: list[dict], retriever: list[dict]) -> str:
    lines = ["| model | TPU | fits at | GiB per chip: scoring / generation | scoring MFU (est.) | scoring alone: M, MFU "
             "(est.) | decode step (est.) | decode HBM roofline (est.) |", "|---|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        if not r["fits"]:
            scoring = f"{r['scoring_gib']:.1f}" if r["scoring_gib"] else "refused"  # a refusal naming no bytes
            lines.append(f"| {r['model']} | {r['tpu']} | **does not fit** (M={r['model_parallel']}: "
                         f"{scoring} / {r['generation_gib']:.1f} GiB) | | | | | |")
            continue
        lines.append(f"| {r['model']} | {r['tpu']} | M={r['model_parallel']} | {r['scoring_gib']:.1f} / "
                     f"{r['generation_gib']:.1f} | {100 * r['scoring_mfu']:.0f}% | "
                     f"M={r.get('scoring_alone_model_parallel')}, {100 * r.get('scoring_alone_mfu', 0):.0f}% | "
                     f"{r['decode_ms']:.1f} ms | "
                     f"{100 * r['decode_hbm_roofline']:.0f}% |")
    lines += ["", "| TPU | Contriever embedding (est.) | its MFU | LSR step: GiB per chip, time, MFU (est.) | "
              "recomputing activations: GiB per chip, time, MFU (est.) |", "|---|---:|---:|---:|---:|"]
    for r in retriever:
        steps = []
        for label in ("lsr_step", "lsr_step_recomputed"):
            figures = (f"{r[f'{label}_ms']:.0f} ms, {100 * r[f'{label}_mfu']:.0f}%" if r[f"{label}_fits"]
                       else "**does not fit**")
            steps.append(f"{r[f'{label}_gib']:.1f} GiB, {figures}")
        lines.append(f"| {r['tpu']} | {r['passages_per_s_per_chip']:,.0f} passages/s a chip | "
                     f"{100 * r['embedding_mfu']:.0f}% | {' | '.join(steps)} |")
    return "\n".join(lines)


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--tpus", default=",".join(TPUS))
    parser.add_argument("--encoder", default="contriever", help="the retriever whose embedding and LSR step are planned")
    parser.add_argument("--lsr-batch", type=int, default=64, help="the LSR step's batch (pile_lsr.py's: 64)")
    parser.add_argument("--out", default="", help="write the rows as JSON here")
    args = parser.parse_args(argv)
    started, rows, retriever = time.time(), [], []
    for tpu_name in args.tpus.split(","):
        slice_ = tpu.tpu_slice(tpu_name)
        target = planner.Target(slice_, tpu.topology_devices(slice_))
        retriever.append(retriever_row(tpu_name, target, args.encoder, args.lsr_batch))
        for name in args.models.split(","):
            rows.append(lm_row(name, tpu_name, target))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(table(rows, retriever))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"command": "python benchmarks/tpu_plan.py " + " ".join(argv or sys.argv[1:]),
                       "libtpu": tpu.libtpu_version(), "seconds": time.time() - started, "rows": rows,
                       "retriever": retriever}, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
