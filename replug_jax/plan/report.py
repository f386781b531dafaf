"""A plan as people read it: a table of the phases and one of the programs, and the JSON beside them.

Marks: memory per chip and "fits" are the TPU compiler's facts; seconds, MFU, throughput and the job's hours are
estimates (the compiler's cost model, with our count of the loops and our ring model of the collectives:
costs.py); model FLOPs are our count of the model's matmuls.
"""
from __future__ import annotations

import json
import os

GIB = 2**30


def duration(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _percent(value) -> str:
    return f"{100 * value:.0f}%" if value is not None else "-"


def tables(plan: dict) -> str:
    """The phases and the programs as markdown tables, with the totals and what is estimated."""
    chip = plan["chip"]
    lines = [f"# {plan['job']} job on {plan['tpu']} ({plan['chips']} {chip['kind']} chips, {plan['hosts']} "
             f"host{'s' if plan['hosts'] > 1 else ''}): LM {plan['lm']} ({plan['lm_layers']} layers, {plan['dtype']}), "
             f"mesh data {plan['lm_mesh']['data']} x model {plan['lm_mesh']['model']}", "",
             "| phase | program | calls | per call (est.) | phase (est.) | throughput per chip (est.) | GiB per chip |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for p in plan["phases"]:
        calls = f"{p['calls']:,.0f}" + ("" if not p["per_host"] or plan["hosts"] == 1 else " a host")
        lines.append(f"| {p['phase']} | {p['program']} | {calls} | {duration(p['est_seconds_per_call'])} | "
                     f"{duration(p['phase_seconds'])} | {_rate(p['units_per_second_per_chip'])} {p['unit']}/s | "
                     f"{p['bytes_per_chip'] / GIB:.2f} |")
    lines += ["", f"**Whole job (est.): {duration(plan['total_seconds'])}, {plan['chip_hours']:,.1f} chip-hours.** "
              f"Counts: {_counts(plan)}.", "",
              "| program | fits | GiB per chip (args + temps + out + code) | of HBM | est. per call | MFU (est.) | "
              "HBM roofline (decode) | collectives | share (est.) |", "|---|---|---:|---:|---:|---:|---:|---|---:|"]
    for r in plan["programs"]:
        m = r["memory"]
        parts = f"{m['argument_bytes'] / GIB:.2f} + {m['temp_bytes'] / GIB:.2f} + " \
                f"{max(0, m['output_bytes'] - m['alias_bytes']) / GIB:.2f} + {m['code_bytes'] / GIB:.3f}"
        coll = ", ".join(f"{c['count']:.0f} {kind} ({c['bytes'] / 2**20:,.0f} MiB)"
                         for kind, c in sorted(r.get("collectives", {}).items())) or "none"
        est = duration(r["est_seconds_per_call"]) if "est_seconds_per_call" in r else "(its parts)"
        est += " (floor)" if "estimate" in r else ""  # the cost model's own time fell below the roofline floor
        lines.append(f"| {r['program']} | {'yes' if r['fits'] else '**no**'} | {m['total_bytes'] / GIB:.2f} "
                     f"({parts}) | {_percent(m['total_bytes'] / r['hbm_bytes'])} | {est} | "
                     f"{_percent(r.get('mfu'))} | {_percent(r.get('hbm_roofline_fraction'))} | {coll} | "
                     f"{_percent(r.get('collective_share'))} |")
    lines += ["", "Facts of the TPU compiler (libtpu " + str(plan["libtpu"]) + "): whether each program compiles and "
              "fits, and its bytes per chip. Estimates: every time, MFU and throughput (the compiler's cost model, "
              "loops counted by us, collectives by our ring model over the chip's ICI links); model FLOPs are our "
              "count of the model's matmuls at the program's shapes, padding included. docs/tpu.md says how far to "
              "trust them."]
    floors = [r["program"] for r in plan["programs"] if "estimate" in r]
    if floors:
        lines += ["", f"(floor): the cost model's own time for {', '.join(floors)} fell below its flops at the chip's "
                  "peak and its bytes at the HBM bandwidth (an op it could not cost counts -1 s); the floor is given "
                  "instead, a lower bound."]
    return "\n".join(lines)


def _rate(per_second: float) -> str:
    """A throughput to three figures below 100 (0.166 steps/s, 1.95 questions/s), whole above."""
    return f"{per_second:.3g}" if per_second < 100 else f"{per_second:,.0f}"


def _counts(plan: dict) -> str:
    c = plan["counts"]
    said = [f"{c['passages']:,} passages"] if c.get("passages") else []
    said += [f"{c['questions']:,} questions"] if c.get("questions") and plan["job"] in ("qa", "mmlu") else []
    said += [f"{c['windows']:,} windows"] if c.get("windows") else []
    return ", ".join(said) + "; text sizes " + ", ".join(f"{k} {v}" for k, v in plan["sizes"].items())


def write(plan: dict, folder: str) -> tuple[str, str]:
    """plan.json and plan.md in `folder` (made if missing); returns their paths."""
    os.makedirs(folder, exist_ok=True)
    json_path, md_path = os.path.join(folder, "plan.json"), os.path.join(folder, "plan.md")
    with open(json_path, "w", encoding="utf-8") as f:
        json.dump(plan, f, indent=1, default=str)
    with open(md_path, "w", encoding="utf-8") as f:
        f.write(tables(plan) + "\n")
    return json_path, md_path
