"""The TPU plan (replug_jax/plan/, issue 82): every program a job runs compiles for a TPU topology with the real TPU
compiler on this CPU (libtpu, a test dependency), holds no float64 and no host callback; the LM's all-reduces per
layer are the ones models/partition.py states; costs are counted through the layers; a config that does not fit is
refused in one line; and a CPU run beside libtpu prints none of its warnings. Tiny shapes only: the 7B plans are a
benchmark (benchmarks/tpu_plan.py), not a test."""
import dataclasses
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from replug_jax.models import partition
from replug_jax.models.causal_lm import CausalLMConfig
from replug_jax.models.encoder import BertConfig
from replug_jax.parallel import sharding, tpu
from replug_jax.plan import costs, programs

LM = CausalLMConfig(arch="llama", vocab_size=512, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=4,
                    intermediate_size=128, max_position=256, norm_eps=1e-5, hidden_act="silu", tie_embeddings=False)
ENCODER = BertConfig(vocab_size=512, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, max_position=128)
TARGET = "v5e:2x4 v5e (tests)"
LIBTPU_NOISE = ("could not determine TPU", "TPU_WORKER_HOSTNAMES", "InitGoogle", "TPU accelerator type", "libtpu_init")


@pytest.fixture(scope="module")
def v5e():
    """The 8 compile-only chips of a v5e-8 (2x4), as the plan loads them."""
    return tpu.topology_devices(tpu.tpu_slice("v5e-8"))


@pytest.fixture(autouse=True)
def plan_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("REPLUG_JAX_PLAN_CACHE", str(tmp_path / "plan-cache"))  # every test compiles for real


def every_program(devices):
    """One of each program kind the jobs run, at tiny shapes, on the meshes the jobs use there."""
    lm_mesh, retriever_mesh = sharding.lm_mesh(4, devices), sharding.data_mesh(devices)
    shape = programs.GenerationShape(questions=2, passes=4, prefix=32, width=32, query=16, steps=16, keep=2)
    bf16 = jnp.bfloat16
    return [programs.scoring(LM, bf16, lm_mesh, 4, 64, 32), programs.prefix_cache(LM, bf16, lm_mesh, 32),
            programs.after_prefix(LM, bf16, lm_mesh, 32, 4, 32, 32), programs.generation(LM, bf16, lm_mesh, shape),
            programs.prefill(LM, bf16, lm_mesh, shape), programs.decode_step(LM, bf16, lm_mesh, shape),
            programs.embedding(ENCODER, bf16, retriever_mesh, 16, 32),
            programs.train_step(ENCODER, bf16, retriever_mesh, batch=8, k=2, query_tokens=16, doc_tokens=32,
                                query_side=False),
            programs.train_step(ENCODER, bf16, retriever_mesh, batch=8, k=2, query_tokens=16, doc_tokens=32,
                                query_side=True),
            programs.search(retriever_mesh, 8, 100, 32, 4, jnp.float32)]


def test_every_program_a_job_runs_compiles_for_a_tpu_with_no_float64_and_no_host_callback(v5e):
    for program in every_program(v5e):
        figures = costs.compile_figures(program.lower(), TARGET)
        assert figures.fits and 0 < figures.total_bytes < tpu.CHIPS["v5e"].hbm_bytes, program.name
        assert figures.flops > 0 and figures.est_seconds > 0, (program.name, figures)
        assert not figures.float64 and not figures.host_callbacks, (program.name, figures)
        if program.config is not None:  # the LM's programs on a model axis of 4: its collectives are there
            assert "all-reduce" in figures.collectives, program.name


def test_the_checks_find_a_float64_and_a_host_callback_where_one_is(v5e):
    """The detectors the test above relies on, on programs that hold what they look for."""
    mesh = sharding.data_mesh(v5e[:1])
    x = jax.ShapeDtypeStruct((8,), jnp.float32, sharding=sharding.replicated(mesh))
    with jax.enable_x64(True):  # a float64 sum the TPU compiler emulates: its compiled text names no f64
        wide = jax.jit(lambda v: jnp.cumsum(v.astype(jnp.float64)).astype(jnp.float32)).lower(x)
        assert costs.compile_figures(wide, TARGET).float64
    called = jax.jit(lambda v: jax.pure_callback(np.sin, jax.ShapeDtypeStruct((8,), jnp.float32), v)).lower(x)
    assert costs.host_callbacks(called.as_text()), called.as_text()[:2000]
    assert not costs.holds_float64(jax.jit(lambda v: v * 2).lower(x).as_text())


def all_reduces(devices, config, depth: int) -> int:
    program = programs.scoring(config, jnp.bfloat16, sharding.lm_mesh(4, devices), 4, 64, 32)
    return costs.compile_figures(program.lower(depth), TARGET).collectives.get("all-reduce", {"count": 0})["count"]


def test_the_lm_all_reduces_once_per_attention_block_and_once_per_mlp_block_on_a_model_parallel_mesh(v5e):
    """models/partition.py: q/k/v/gate/up split their output columns, o/down their input rows, so each block sums
    its partial outputs once; a replicated MLP kernel, or a split that XLA must reshard, changes the count."""
    per_layer = all_reduces(v5e, LM, 3) - all_reduces(v5e, LM, 2)
    assert per_layer == 2, per_layer


def test_costs_are_counted_through_the_layers_not_once_per_loop(v5e):
    """XLA's cost analysis counts a scan's body once: the plan reads costs off the blocks unrolled at 4 and 6 layers
    and extrapolates, which equals the whole unrolled stack's flops; the job's own (scanned) program counts less."""
    deep = dataclasses.replace(LM, num_layers=9, hidden_size=256, intermediate_size=1024)  # matmuls dominate
    program = programs.scoring(deep, jnp.bfloat16, sharding.lm_mesh(4, v5e), 4, 64, 32)
    whole = costs.compile_figures(program.lower(9), TARGET)
    planned = costs.extrapolated(program.lower, 9, TARGET)
    scanned = costs.compile_figures(program.lower(), TARGET)
    assert planned.layers_from == list(costs.COST_DEPTHS)
    np.testing.assert_allclose(planned.flops, whole.flops, rtol=0.01)
    assert scanned.flops < 0.5 * whole.flops  # the trap the extrapolation avoids
    np.testing.assert_allclose(planned.collectives["all-reduce"]["count"], whole.collectives["all-reduce"]["count"])
    model = program.model_flops / program.chips  # our count of the model's matmuls, against the compiler's
    assert 0.8 < model / whole.flops < 1.25, (model, whole.flops)


def tiny_model_dirs(tmp_path, hidden: int = 64, layers: int = 2, intermediate: int = 128, encoder_layers: int = 2,
                    encoder_heads: int = 4, encoder_positions: int = 128):
    """A causal LM and a BERT encoder as config.json folders (the plan reads shapes, never weights)."""
    lm_dir, encoder_dir = tmp_path / "lm", tmp_path / "encoder"
    lm_dir.mkdir(), encoder_dir.mkdir()
    (lm_dir / "config.json").write_text(json.dumps(dict(
        model_type="llama", vocab_size=512, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=4, intermediate_size=intermediate, max_position_embeddings=1024)))
    (encoder_dir / "config.json").write_text(json.dumps(dict(
        model_type="bert", vocab_size=512, hidden_size=32, num_hidden_layers=encoder_layers,
        num_attention_heads=encoder_heads, intermediate_size=64, max_position_embeddings=encoder_positions)))
    return str(lm_dir), str(encoder_dir)


def plan_command(*args, tmp_path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
    env["REPLUG_JAX_PLAN_CACHE"] = str(tmp_path / "plan-cache")
    return subprocess.run([sys.executable, "-m", "replug_jax.plan", *args], capture_output=True, text=True, env=env,
                          timeout=900)


def test_the_plan_command_gives_each_phase_its_program_memory_and_time_and_the_job_its_chip_hours(tmp_path):
    lm_dir, encoder_dir = tiny_model_dirs(tmp_path)
    out = tmp_path / "plan"
    done = plan_command("--config", "experiments/configs/qa.py", "--tpu", "v5e-8", f"--config.lm={lm_dir}",
                        f"--config.encoder={encoder_dir}", "--config.methods=none,replug,replug_posterior",
                        "--passages", "20000", "--questions", "100", "--out", str(out), tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    plan = json.loads((out / "plan.json").read_text())
    phases = {p["phase"]: p for p in plan["phases"]}
    assert {"corpus embedding", "query embedding", "none: generation", "replug: generation",
            "replug_posterior: generation", "replug: answer NLL"} <= set(phases)
    assert phases["corpus embedding"]["calls"] == -(-20000 // 32)  # 32 passages a call (encoder_batch_size)
    assert all(p["phase_seconds"] > 0 for p in plan["phases"]) and plan["chip_hours"] > 0
    generation = phases["replug_posterior: generation"]
    assert [n for _, n in generation["parts"]] == [1, 7]  # its prefill once, 6 answer tokens and the stop
    kinds = {r["kind"] for r in plan["programs"]}
    assert {"embedding", "generation", "prefill", "decode", "scoring"} <= kinds
    assert all(r["fits"] and r["memory"]["total_bytes"] > 0 for r in plan["programs"])
    table = (out / "plan.md").read_text()
    assert "Whole job (est.)" in table and "chip-hours" in table and table in done.stdout
    assert not any(noise in done.stdout + done.stderr for noise in LIBTPU_NOISE), done.stderr[-2000:]


def test_the_plan_refuses_a_config_that_does_not_fit_naming_the_program_and_the_split_that_fits(tmp_path):
    """An LM of 16.4 GiB in bf16 on a v5e chip, which gives a program 15.75 GiB: refused in one line, with the model
    split that fits."""
    lm_dir, encoder_dir = tiny_model_dirs(tmp_path, hidden=8192, layers=9, intermediate=28672)
    done = plan_command("--config", "experiments/configs/lm_eval.py", "--tpu", "v5e-8", f"--config.lm={lm_dir}",
                        f"--config.encoder={encoder_dir}", "--config.methods=replug", "--passages", "1000",
                        "--windows", "100", tmp_path=tmp_path)
    assert done.returncode == 2, (done.stdout[-2000:], done.stderr[-3000:])
    error = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1, done.stderr[-3000:]
    assert "replug: window scoring" in error[0] and "GiB per chip" in error[0], error
    assert "--config.lm_model_parallel=2 fits" in error[0], error
    assert not any(noise in done.stderr for noise in LIBTPU_NOISE), done.stderr[-2000:]


@pytest.mark.slow  # a refusal's naming of the fix is the core suite's (test_the_plan_refuses_a_config_that_does_not_fit_...)
def test_an_lsr_step_that_does_not_fit_is_refused_naming_the_recompute_that_makes_it_fit(tmp_path):
    """Both sides trained, 8 queries x 20 documents of 512 tokens a v5e chip through 4 layers of 32 attention heads:
    the attention probabilities the backward pass keeps exceed a chip; recomputing them fits, and the refusal says
    so. With recompute_activations set the same plan runs, its step named as recomputed."""
    lm_dir, encoder_dir = tiny_model_dirs(tmp_path, encoder_layers=4, encoder_heads=32, encoder_positions=512)
    common = ("--config", "experiments/configs/qa_lsr.py", "--tpu", "v5e-8", f"--config.lm={lm_dir}",
              f"--config.encoder={encoder_dir}", "--passages", "2000", "--config.steps=10",
              "--config.train_documents=True", "--config.batch_size=64", "--config.k=20")
    refused = plan_command(*common, tmp_path=tmp_path)
    assert refused.returncode == 2, (refused.stdout[-2000:], refused.stderr[-3000:])
    error = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "LSR train step" in error[0], refused.stderr[-3000:]
    assert "--config.recompute_activations=True fits" in error[0], error
    out = tmp_path / "plan"
    done = plan_command(*common, "--config.recompute_activations=True", "--out", str(out), tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    step = next(p for p in json.loads((out / "plan.json").read_text())["phases"] if p["phase"] == "LSR train step")
    assert "recomputed" in step["program"], step


def test_a_cpu_run_beside_libtpu_prints_none_of_its_warnings(tmp_path):
    """libtpu is installed here (the plan's compiler): `import replug_jax` keeps a CPU machine's JAX off the TPU
    runtime (base/platforms.py), so a user's CPU run prints none of its start-up warnings."""
    import importlib.util

    assert importlib.util.find_spec("libtpu") is not None  # the test dependency, else this test guards nothing
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
    code = "import replug_jax, jax; print(jax.devices()[0].platform)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "cpu", done.stderr[-2000:]
    assert not any(noise in done.stderr for noise in LIBTPU_NOISE), done.stderr[-2000:]


def test_tpu_slices_are_named_as_rented_and_refused_in_one_line_otherwise():
    assert (tpu.tpu_slice("v5e-8").chips, tpu.tpu_slice("v4-8").chips, tpu.tpu_slice("v5p-8").chips) == (8, 4, 4)
    assert tpu.tpu_slice("v5e-256").hosts == 32 and tpu.tpu_slice("v4-32").hosts == 4
    assert tpu.tpu_slice("v5litepod-16").topology_name == "v5e:4x4"
    for bad in ("v7-8", "v5e-7", "h100"):
        with pytest.raises(tpu.UnknownSlice):
            tpu.tpu_slice(bad)


def test_partition_keeps_the_mlp_split_that_the_all_reduce_count_relies_on():
    """The rules the all-reduce test reads through: gate/up by output columns, down by input rows."""
    assert partition.rule("layers/gate_proj/kernel")[0] == jax.sharding.PartitionSpec(None, "model")
    assert partition.rule("layers/down_proj/kernel")[0] == jax.sharding.PartitionSpec("model", None)


def test_the_chips_usable_memory_is_what_the_compiler_gives_a_program(v5e):
    assert tpu.compiler_hbm(v5e) == tpu.CHIPS["v5e"].usable_hbm_bytes


def test_a_plan_on_a_slice_of_several_hosts_splits_each_hosts_share_and_compiles_the_step_over_every_chip(tmp_path):
    """LSR on a v4-32 (4 hosts of 4 chips): embedding and the LM's scoring are each host's share (a quarter of the
    calls), the train step one program over all 16 chips, whose gradient all-reduce the plan counts and times. On a
    v5e-32 the compiler takes no program over one host's chips: refused in one line."""
    lm_dir, encoder_dir = tiny_model_dirs(tmp_path)
    out = tmp_path / "plan"
    common = ("--config", "experiments/configs/qa_lsr.py", f"--config.lm={lm_dir}", f"--config.encoder={encoder_dir}",
              "--passages", "20000", "--config.steps=40")
    refused = plan_command(*common, "--tpu", "v4-32", tmp_path=tmp_path)  # qa_lsr's batch of 8 on 16 chips
    assert refused.returncode == 2 and "batch_size=8 is not a multiple of the 16 chips" in refused.stderr
    done = plan_command(*common, "--tpu", "v4-32", "--config.batch_size=32", "--out", str(out), tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    plan = json.loads((out / "plan.json").read_text())
    assert (plan["chips"], plan["hosts"]) == (16, 4)
    phases = {p["phase"]: p for p in plan["phases"]}
    assert phases["corpus embedding"]["calls"] == -(-20000 // 32 // 4) and phases["corpus embedding"]["per_host"]
    # steps x batch x k rows, lm_batch_size 4 a call on a host's 4 chips, a quarter of them a host
    assert phases["LM supervision"]["per_host"] and phases["LM supervision"]["calls"] == -(-40 * 32 * 8 // 4 // 4)
    step = phases["LSR train step"]
    assert not step["per_host"] and step["calls"] == 40 and step["chips"] == 16
    program = next(r for r in plan["programs"] if r["program"] == step["program"])
    assert program["chips"] == 16 and program["collectives"]["all-reduce"]["bytes"] > 0
    assert 0 < program["collective_share"] < 1
    v5e = plan_command(*common, "--tpu", "v5e-32", "--config.batch_size=32", tmp_path=tmp_path)
    assert v5e.returncode == 2 and "only programs over all 32 chips" in v5e.stderr, v5e.stderr[-2000:]


def test_a_time_below_the_roofline_floor_is_never_given_and_is_said():
    """The posterior's prefill once came out at -517 ms a call (an uncosted op counts -1 s): a program's time is never
    below its flops at the chip's peak and its bytes at the HBM bandwidth, and the row says where the floor was used."""
    from replug_jax.plan import planner

    chip = tpu.CHIPS["v5e"]
    program = programs.Program("prefill [tests]", "prefill", None, None, chips=8, units=1024, unit="tokens",
                               model_flops=8 * 1e12)
    memory = costs.Figures(argument_bytes=2**30)
    plain = dict(flops=1e12, bytes_accessed=8.19e9)  # 5.1 ms at peak, 10 ms at the HBM bandwidth
    row = planner.program_row(program, memory, costs.Figures(est_seconds=-0.5, **plain), chip)
    assert row["est_seconds_per_call"] == pytest.approx(0.01) and "roofline floor" in row["estimate"]
    assert 0 < row["mfu"] < 1
    row = planner.program_row(program, memory, costs.Figures(est_seconds=0.02, **plain), chip)
    assert row["est_seconds_per_call"] == pytest.approx(0.02) and "estimate" not in row
    assert any("ZeroCrop" in call for call in costs.SENTINEL_CALLS)  # the posterior's query positions hold one
