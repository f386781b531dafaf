"""Where the time of LocalLM's jitted scoring goes on this CPU: one call traced, summed per XLA op.

    python benchmarks/profile_scoring.py --passes 16 --batch-size 4

REPLUG's passes as bench_scoring.py cuts them (a 128-token passage, 192 tokens of context, 128 scored), here all of
one length (448 tokens: one compiled program), are scored once to compile and once under `jax.profiler.trace`. Each
XLA op's time is summed by what it computes (the op name JAX gave it: "layers/up_proj/dot_general", ...) and printed
per call of the program, beside the time one op and two ops ran at once (the cores' use). Thread-seconds: ops that
run side by side both count. The rows go to --out as JSON lines.
"""
from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402


def op_names(hlo_text: str) -> dict[str, str]:
    """{instruction name: what it computes} from a compiled HLO module's text (its metadata op_name, shortened)."""
    names = {}
    for name, op_name in re.findall(r'^\s*%?([\w.-]+) = .*?op_name="([^"]+)"', hlo_text, re.M):
        names[name] = re.sub(r"^jit\([^)]*\)/(CausalLM/)?(while/body/(closed_call/|eval_jaxpr/)?)?", "", op_name)
    return names


def op_events(trace_dir: str) -> list[dict]:
    """The XLA op events (hlo_op in their args) of the perfetto trace written under `trace_dir`, less the scan's
    loop op itself ("while.N": its body's ops are events of their own)."""
    path = glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True)[0]
    trace = json.load(gzip.open(path))
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    return [e for e in events if e.get("ph") == "X" and "hlo_op" in e.get("args", {}) and not e["args"]["hlo_op"].startswith("while")]


def concurrency(events: list[dict]) -> dict[int, float]:
    """{number of ops running at once: seconds} over the events' span."""
    edges = sorted([(e["ts"], 1) for e in events] + [(e["ts"] + e["dur"], -1) for e in events])
    spans, running, last = collections.Counter(), 0, edges[0][0]
    for at, step in edges:
        spans[running] += (at - last) / 1e6
        running, last = running + step, at
    return dict(sorted(spans.items()))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--passes", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--lm", default="smollm2")
    p.add_argument("--top", type=int, default=25, help="rows of the table")
    p.add_argument("--out", default="benchmarks/results.jsonl")
    args = p.parse_args(argv)

    import jax
    import replug_jax as rj
    from bench_scoring import workload

    lm = rj.load_lm(args.lm, batch_size=args.batch_size)
    pairs = [(context[:320], continuation[:128]) for context, continuation in workload(lm.tokenizer, args.passes,
                                                                                       128, 200, 128)]
    batch_fn, calls = lm._batch_fn, []
    jitted = batch_fn.jitted
    batch_fn.jitted = lambda *a: calls.append(a) or jitted(*a)  # the arguments of each call, to compile its text
    lm.score_token_pairs(pairs)
    names = op_names(jitted.lower(*calls[0]).compile().as_text())
    with tempfile.TemporaryDirectory() as trace_dir:
        with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
            lm.score_token_pairs(pairs)
        events = op_events(trace_dir)
    program_calls = len({e["args"].get("run_id") for e in events})
    by_op = collections.Counter()
    for e in events:
        by_op[names.get(e["args"]["hlo_op"], e["args"]["hlo_op"])] += e["dur"] / 1e6 / program_calls
    total = sum(by_op.values())
    running = {k: v / program_calls for k, v in concurrency(events).items()}
    command = "python benchmarks/profile_scoring.py " + " ".join(sys.argv[1:] if argv is None else argv)
    rows = [{"benchmark": "scoring_profile", "op": op, "ms_per_call": seconds * 1e3, "share": seconds / total,
             "lm": args.lm, "batch_size": args.batch_size, "command": command.strip()}
            for op, seconds in by_op.most_common()]
    print(f"{program_calls} calls of the scoring program ([{args.batch_size}, 448] tokens); per call: "
          f"{total * 1e3:.0f} thread-ms of XLA ops; wall ms with 0/1/2/more ops running: "
          + ", ".join(f"{k}: {v * 1e3:.0f}" for k, v in running.items()))
    common.print_table(rows[: args.top], ["op", "ms_per_call", "share"])
    common.write_rows(rows, args.out)
    return rows


if __name__ == "__main__":
    main()
