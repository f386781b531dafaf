"""A job's plan on a TPU slice: its phases' programs compiled by the TPU compiler, what each holds per chip, how long
each is estimated to take, and the whole job's time and chip-hours.

    plan = plan_job(config, "v5e-8")     # a dict: programs, phases, totals (report.py prints and writes it)

Every program the job runs is compiled at its full depth (its memory: facts); its costs come from costs.py
(estimates). A job whose program does not fit a chip is refused (`DoesNotFit`) in one line naming the program, the
bytes it needs per chip, and the smallest `lm_model_parallel` (or batch) with which every program fits.
"""
from __future__ import annotations

import dataclasses
import math
import time

import jax.numpy as jnp

from replug_jax.base.errors import InputError
from replug_jax.lm import local
from replug_jax.models import architectures
from replug_jax.parallel import sharding, tpu
from replug_jax.plan import costs, workload

GIB = 2**30
ESTIMATED = ("est_seconds_per_call", "phase_seconds", "mfu", "units_per_second_per_chip", "hbm_roofline_fraction",
             "collective_share")  # what the JSON marks as estimates (the rest: the compiler's facts or our counts)


class DoesNotFit(InputError):
    """A job with a program that does not fit a chip's memory: one line, exit 2."""


@dataclasses.dataclass
class Target:
    slice_: tpu.TpuSlice
    devices: list

    @property
    def name(self) -> str:
        return f"{self.slice_.topology_name} {self.slice_.chip.kind}"

    def host_devices(self) -> list:
        first = min(d.process_index for d in self.devices)
        return [d for d in self.devices if d.process_index == first]


def meshes_for(target: Target, model_parallel: int) -> workload.Meshes:
    """The job's meshes on the slice (`sharding.job_lm_mesh`'s rule: one host's chips unless the model axis needs
    more than a host has)."""
    local = target.host_devices()
    spanning = model_parallel > len(local)
    lm_devices = target.devices if spanning else local
    if len(lm_devices) % model_parallel:
        raise InputError(f"--config.lm_model_parallel={model_parallel} does not divide the {len(lm_devices)} chips "
                         f"{'of the slice' if spanning else 'of a host'} ({target.slice_.describe()})")
    return workload.Meshes(sharding.lm_mesh(model_parallel, lm_devices), sharding.data_mesh(local), target.slice_,
                           target.slice_.hosts if not spanning else 1, target.devices)


def served(config) -> bool:
    """Whether the job's LM is a server: its programs run there, not on the slice."""
    return str(config.lm).startswith(("http://", "https://"))


def job_phases(config, target: Target, model_parallel: int, counts: workload.Counts, sizes: workload.TextSizes):
    lm = None if served(config) else architectures.lm_config(config.lm)
    encoder, encoder_length = architectures.encoder_config(config.encoder)
    encoder_length = min(encoder_length, int(config.get("encoder_max_length") or encoder_length))
    meshes = meshes_for(target, model_parallel)
    job = config.job
    if job not in workload.JOB_PHASES:
        raise InputError(f"the plan knows the jobs {', '.join(workload.JOB_PHASES)}, not {job!r}")
    return lm, encoder, meshes, workload.JOB_PHASES[job](config, lm, encoder, encoder_length, meshes, counts, sizes)


ALL_CHIPS_ONLY = "should include all slice devices"  # the compiler of a v5e slice of several hosts, on one host's


def _memory(program, target: Target, seen: dict) -> costs.Figures:
    key = program.name + program.kind
    if key not in seen:
        try:
            seen[key] = costs.compile_figures(program.lower(), target.name)
        except Exception as e:
            if ALL_CHIPS_ONLY not in str(e):
                raise
            chip = target.slice_.chip
            raise InputError(f"{program.name} runs on each host's own {program.chips} chips, and the TPU compiler takes "
                             f"only programs over all {len(target.devices)} chips of a {chip.kind} slice of several "
                             f"hosts ('device assignment {ALL_CHIPS_ONLY}'): the job cannot run on "
                             f"{target.slice_.name}; plan one host ({chip.kind}-8) or a v4 or v5p slice") from None
    return seen[key]


def _costs(program, target: Target, seen: dict) -> costs.Figures:
    key = "costs " + program.name + program.kind
    if key not in seen:
        if program.layers is None:
            seen[key] = _memory(program, target, seen)
        else:
            seen[key] = costs.extrapolated(program.lower, program.layers, target.name)
    return seen[key]


def fits(figures: costs.Figures, chip) -> bool:
    """Whether the compiler took the program and its bytes per chip fit what it gives a program (its own limit is on
    the temporaries alone; arguments, outputs and code share the HBM with them when it runs)."""
    return figures.fits and figures.total_bytes <= chip.usable_hbm_bytes


def program_row(program, memory: costs.Figures, cost: costs.Figures | None, chip) -> dict:
    """One program's figures per chip: memory (the compiler's), model FLOPs (ours), estimated time and what follows
    from it."""
    row = {"program": program.name, "kind": program.kind, "role": program.role, "chips": program.chips,
           "fits": fits(memory, chip), "memory": memory.to_json(), "hbm_bytes": chip.usable_hbm_bytes,
           "model_flops_per_chip": program.model_flops / program.chips}
    if cost is not None and cost.fits:
        floor = max(cost.flops / chip.peak_flops, cost.bytes_accessed / chip.hbm_bandwidth)  # peak flops, full HBM
        compute = cost.est_seconds
        if compute < floor:  # the cost model left an op uncosted (its -1 s "unknown"): never a time below the floor
            compute = floor
            row["estimate"] = (f"roofline floor: the cost model's {cost.est_seconds:.3g} s is below the program's "
                               "flops at peak and bytes at the HBM bandwidth")
        seconds = compute + costs.collective_seconds(cost, chip, program.participants)
        row.update(compiler_flops_per_chip=cost.flops, bytes_accessed_per_chip=cost.bytes_accessed,
                   compiler_est_seconds=cost.est_seconds, costs_from_layers=cost.layers_from,
                   collectives=cost.collectives, collective_seconds=seconds - compute,
                   est_seconds_per_call=seconds, float64=cost.float64, host_callbacks=cost.host_callbacks,
                   collective_share=(seconds - compute) / seconds if seconds else 0.0)
        if seconds > 0:
            row["mfu"] = row["model_flops_per_chip"] / (seconds * chip.peak_flops)
            row["units_per_second_per_chip"] = program.units / program.chips / seconds
            row["unit"] = program.unit
            if program.kind == "decode":  # every step streams the weights and the cache from HBM
                row["hbm_roofline_fraction"] = memory.argument_bytes / chip.hbm_bandwidth / seconds
    return row


def plan_job(config, tpu_name: str, counts: workload.Counts | None = None, sizes: dict | None = None,
             progress=print) -> dict:
    """The plan of `config`'s job on the slice `tpu_name` (module docstring); `progress(line)` hears each compile."""
    started = time.time()
    slice_ = tpu.tpu_slice(tpu_name)
    if slice_.chip.kind == "v6e" and slice_.hosts > 1:  # the compiler aborts the process (SIGABRT), nothing to catch
        raise InputError(f"{tpu_name}: v6e slices of several hosts are not planned: libtpu "
                         f"{tpu.libtpu_version()}'s compiler aborts on their programs here (tried v6e:4x4); plan v6e-8")
    target = Target(slice_, tpu.topology_devices(slice_))
    chip = slice_.chip
    counts = counts or workload.Counts()
    text_sizes = workload.sizes_for(config, sizes or {})
    model_parallel = int(config.get("lm_model_parallel", 1))
    lm, encoder, meshes, phases = job_phases(config, target, model_parallel, counts, text_sizes)
    seen: dict = {}
    about = "served: its programs run on its server" if lm is None else f"{lm.num_layers} layers, {lm.hidden_size} wide"
    progress(f"plan: {config.job} job, LM {config.lm} ({about}), encoder {config.encoder}, on {slice_.describe()}; "
             f"LM mesh data {sharding.data_size(meshes.lm)} x model {model_parallel}")
    refused = _first_refused(phases, target, seen, chip, progress)
    if refused is not None:
        raise DoesNotFit(_refusal(config, refused, target, counts, text_sizes, chip, seen))
    rows, phase_rows = {}, []
    for phase in phases:
        for program in [phase.program] + [p for p, _ in phase.parts]:
            if program.name not in rows:
                progress(f"  costs of {program.name}")
                memory = _memory(program, target, seen)
                cost = None if phase.parts and program is phase.program else _costs(program, target, seen)
                rows[program.name] = program_row(program, memory, cost, chip)
        per_call = (sum(rows[p.name]["est_seconds_per_call"] * n for p, n in phase.parts) if phase.parts
                    else rows[phase.program.name]["est_seconds_per_call"])
        seconds = per_call * phase.calls
        chips = phase.program.chips if not phase.per_host else phase.program.chips * meshes.hosts
        phase_rows.append({"phase": phase.name, "program": phase.program.name, "calls": phase.calls,
                           "per_host": phase.per_host, "est_seconds_per_call": per_call, "phase_seconds": seconds,
                           "units": phase.units, "unit": phase.unit, "chips": chips,
                           "units_per_second_per_chip": phase.units / seconds / chips if seconds else 0.0,
                           "bytes_per_chip": rows[phase.program.name]["memory"]["total_bytes"],
                           "parts": [[p.name, n] for p, n in phase.parts]})
    total = sum(p["phase_seconds"] for p in phase_rows)
    return {"job": config.job, "tpu": tpu_name, "topology": slice_.topology_name, "chips": slice_.chips,
            "hosts": slice_.hosts, "chip": dataclasses.asdict(chip), "lm": config.lm, "encoder": config.encoder,
            "lm_mesh": sharding.mesh_shape(meshes.lm), "lm_layers": lm.num_layers if lm else None,
            "dtype": jnp.dtype(workload.lm_dtype(config)).name,
            "counts": dataclasses.asdict(counts), "sizes": dataclasses.asdict(text_sizes),
            "programs": list(rows.values()), "phases": phase_rows, "total_seconds": total,
            "chip_hours": total * slice_.chips / 3600, "libtpu": tpu.libtpu_version(), "estimates": list(ESTIMATED),
            "plan_seconds": time.time() - started}


def _first_refused(phases, target, seen, chip, progress):
    """The first job program that does not fit a chip (compiled at full depth), else None."""
    for phase in phases:
        progress(f"  compiling {phase.program.name}")
        memory = _memory(phase.program, target, seen)
        if not fits(memory, chip):
            return phase.program, memory
    return None


def _refusal(config, refused, target, counts, sizes, chip, seen) -> str:
    """The one line of a job that does not fit: the program, its bytes per chip, and the smallest lm_model_parallel
    (then the most lm_generation_questions) with which every LM program fits."""
    program, memory = refused
    needed = memory.needed_bytes or memory.total_bytes
    line = (f"{program.name} needs {needed / GIB:.2f} GiB per chip, more than the {chip.usable_hbm_bytes / GIB:.2f} "
            f"GiB a {chip.kind} chip gives a program ({target.slice_.name})")
    if program.kind == "train":
        return f"{line}: {_train_step_fix(config, target, counts, sizes, chip, seen)}"
    if program.config is None:
        return f"{line}: lower --config.encoder_batch_size (now {config.get('encoder_batch_size')})"
    current = int(config.get("lm_model_parallel", 1))
    most = int(config.get("lm_generation_questions") or local.GENERATION_QUESTIONS)
    generates = any(p.program.kind == "generation" for p in job_phases(config, target, current, counts, sizes)[3])
    for model_parallel in _powers_of_two(current, len(target.devices)):
        for questions in _halvings(most) if generates else [most]:
            if (model_parallel, questions) == (current, most):
                continue
            tried = _with(config, lm_model_parallel=model_parallel, lm_generation_questions=questions)
            try:
                phases = job_phases(tried, target, model_parallel, counts, sizes)[3]
            except InputError:
                break
            if all(fits(_memory(p.program, target, seen), chip) for p in phases if p.program.config is not None):
                change = [f"--config.lm_model_parallel={model_parallel}"] if model_parallel != current else []
                change += [f"--config.lm_generation_questions={questions}"] if questions != most else []
                return f"{line}: {' '.join(change)} fits"
    return (f"{line}, and no lm_model_parallel up to {len(target.devices)} fits"
            f"{' with any lm_generation_questions' if generates else ''}: a larger chip or a smaller LM")


def _train_step_fix(config, target, counts, sizes, chip, seen) -> str:
    """What makes the LSR train step fit: recomputing the encoder's activations in the backward pass where that
    alone fits, else a smaller batch."""
    batch = int(config.batch_size)
    if not config.get("recompute_activations", False):
        tried = _with(config, recompute_activations=True)
        phases = job_phases(tried, target, int(config.get("lm_model_parallel", 1)), counts, sizes)[3]
        step = next(p.program for p in phases if p.program.kind == "train")
        if fits(_memory(step, target, seen), chip):
            return "--config.recompute_activations=True fits (the backward pass recomputes each layer's activations)"
    return f"lower --config.batch_size (now {batch}, a multiple of the {len(target.devices)} chips)"


def _with(config, **values):
    """A copy of `config` with `values` set (keys it lacks added)."""
    copy = config.copy_and_resolve_references()
    with copy.unlocked():
        for key, value in values.items():
            copy[key] = value
    return copy


def _halvings(n: int):
    while n >= 1:
        yield n
        n //= 2


def _powers_of_two(start: int, most: int):
    n = 1 << max(0, math.ceil(math.log2(max(start, 1))))
    while n <= most:
        yield n
        n *= 2
