"""Test setup: 8 fake CPU devices in the test processes, the user's own in the commands they launch, and shared model
fixtures."""
import atexit
import os
import shutil
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Python's compiled modules, shared by the session and every process it launches: with PYTHONDONTWRITEBYTECODE set
# (as on the CI machines) and `make install`'s --no-compile, every process compiled each module it imported from
# source (torch, transformers, jax, lm-eval: 8-9 s of a job's start on 2 cores, 3 s with them compiled), and the suite
# launches over a hundred. They go to a folder of the session (PYTHONPYCACHEPREFIX), removed at exit, so the wish
# behind the variable (no .pyc files in the tree or the venv) still holds.
if os.environ.pop("PYTHONDONTWRITEBYTECODE", None):
    os.environ["PYTHONPYCACHEPREFIX"] = tempfile.mkdtemp(prefix="replug_jax_test_pycache_")
    sys.dont_write_bytecode, sys.pycache_prefix = False, os.environ["PYTHONPYCACHEPREFIX"]  # this process too
    atexit.register(shutil.rmtree, os.environ["PYTHONPYCACHEPREFIX"], ignore_errors=True)
# exact search's timed path choices (retrieval/exact_search.py) go to a file of the session, not the user's home
if "REPLUG_JAX_SEARCH_CHOICES" not in os.environ:
    handle, os.environ["REPLUG_JAX_SEARCH_CHOICES"] = tempfile.mkstemp(prefix="replug_jax_test_search_choices_")
    os.close(handle)
    atexit.register(lambda path: os.path.exists(path) and os.remove(path), os.environ["REPLUG_JAX_SEARCH_CHOICES"])
# One persistent XLA compilation cache for the suite's runs on this machine and every process they launch, for
# programs of any compile time: tests build the same tiny models again and again (new instances, same programs),
# modules recompile what earlier modules compiled (caches are cleared between modules, below), the multi-process
# tests launch the same jobs many times, and a later run of the suite (another clone, another venv of the same jax)
# compiles only what changed. JAX keys each entry by the program, jaxlib's version, XLA's flags, the compile options
# and the devices; not by the CPU's instructions, so the folder is one per CPU kind (`suite_xla_cache_dir`). Entries
# written over 14 days ago are removed as a session starts (`prune_old_entries`; ~50 MB a full run): JAX's own size cap
# (least recently used eviction) locks and stamps the folder at every read, and took 97 s against 79 for two files.
# An existing JAX_COMPILATION_CACHE_DIR is used instead.
def suite_xla_cache_dir() -> str:
    """$REPLUG_JAX_TEST_XLA_CACHE, else ~/.cache/replug_jax/test-xla-cache/<hash of the CPU's model and flags>."""
    import hashlib
    import platform

    if os.environ.get("REPLUG_JAX_TEST_XLA_CACHE"):
        return os.environ["REPLUG_JAX_TEST_XLA_CACHE"]
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = [line for line in f if line.startswith(("model name", "flags"))][:2]
    except OSError:
        cpu = [platform.processor()]
    kind = hashlib.sha256(("".join(cpu) + platform.machine()).encode()).hexdigest()[:16]
    return os.path.join(os.path.expanduser("~"), ".cache", "replug_jax", "test-xla-cache", kind)


def prune_old_entries(folder: str, days: float = 14) -> None:
    """Remove the entries of `folder`, files and folders, written more than `days` ago (an XLA program not compiled
    since, a PyTorch reference of older versions or a killed save's part, are likely gone)."""
    import shutil
    import time

    written_before = time.time() - days * 86400
    for entry in os.scandir(folder) if os.path.isdir(folder) else ():
        if entry.stat().st_mtime < written_before:
            shutil.rmtree(entry.path) if entry.is_dir() else os.remove(entry.path)


if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = suite_xla_cache_dir()
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"  # default 1 s: no tiny-model program qualified
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
    prune_old_entries(os.environ["JAX_COMPILATION_CACHE_DIR"])  # the session's first process: workers inherit the dir
# `make test` runs 2 pytest-xdist workers: one lock file for the session, which every test holds shared and a test
# marked `exclusive` (the 1.5B reader LM: up to ~15 GB) holds alone. Set here, before the workers start, so they inherit it.
if "REPLUG_JAX_TEST_LOCK" not in os.environ:
    handle, os.environ["REPLUG_JAX_TEST_LOCK"] = tempfile.mkstemp(prefix="replug_jax_test_lock_")
    os.close(handle)
    atexit.register(os.remove, os.environ["REPLUG_JAX_TEST_LOCK"])

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_platforms", "cpu")
# 8 fake CPU devices for this process's sharded functions (checked against their one-device versions), set by JAX's
# config rather than XLA_FLAGS: the commands a test launches (`python -m replug_jax.main`, a server, the harness) then
# run on the devices a user's would, one CPU device, instead of inheriting 8 fake ones on 2 cores (a job's scoring
# 1.8x and its decoding 3.6x as long: the README's QA command 129 s against 70 s). A test about several devices or
# processes says how many (replug_jax.launch --devices, or XLA_FLAGS in the command's environment).
jax.config.update("jax_num_cpu_devices", 8)


@pytest.fixture(scope="session")
def smollm2():
    """The packaged SmolLM2-135M GGUF, loaded once, on one device: split over the 8 fake devices (a (2, 4) data ×
    model mesh) its scoring took 1.8× and its decoding 3.6× as long on 2 cores, in every test that uses it. The
    split path is checked against this one in test_real_weights.py (real weights) and test_lm_mesh.py (every mesh)."""
    import replug_jax as rj
    from replug_jax.parallel import sharding

    return rj.load_lm("smollm2", batch_size=8, mesh=sharding.lm_mesh(1, jax.devices()[:1]))


def torch_reference_dir(gguf_path: str) -> str:
    """Where transformers' own load of a GGUF is kept for the suite's later processes and runs:
    ~/.cache/replug_jax/test-torch-reference/<hash of the file's bytes and transformers' and torch's versions>
    ($REPLUG_JAX_TEST_TORCH_REFERENCE instead of ~/.cache/replug_jax/test-torch-reference)."""
    import hashlib

    import torch
    import transformers

    digest = hashlib.sha256()
    with open(gguf_path, "rb") as gguf:
        for block in iter(lambda: gguf.read(1 << 24), b""):
            digest.update(block)
    digest.update(f"{transformers.__version__} {torch.__version__}".encode())
    root = os.environ.get("REPLUG_JAX_TEST_TORCH_REFERENCE") or os.path.join(
        os.path.expanduser("~"), ".cache", "replug_jax", "test-torch-reference")
    return os.path.join(root, digest.hexdigest()[:16])


def load_torch_reference(gguf_path: str):
    """(transformers' float32 PyTorch model of the GGUF, its tokenizer). transformers reads a GGUF's metadata with
    gguf-py four times per model and tokenizer (~25-35 s on 2 cores, in each process that needs it), so the first
    process saves what it loaded (safetensors, tokenizer.json) under `torch_reference_dir`, whole or not at all, and
    later ones read that (under a second); test_real_weights.py checks the saved copy against a fresh load (`slow`),
    test_suite_workers.py that a saved copy is what loads."""
    import shutil

    import safetensors.torch
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = torch_reference_dir(gguf_path)
    if os.path.isdir(folder):
        return (AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval(),
                AutoTokenizer.from_pretrained(folder))
    gguf_folder, name = os.path.split(gguf_path)
    model = AutoModelForCausalLM.from_pretrained(gguf_folder, gguf_file=name, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(gguf_folder, gguf_file=name)
    partial = f"{folder}.partial-{os.getpid()}"
    os.makedirs(partial)
    model.config.save_pretrained(partial)  # (save_pretrained refuses a model loaded from a GGUF: its weights alone)
    model.generation_config.save_pretrained(partial)
    safetensors.torch.save_model(model, os.path.join(partial, "model.safetensors"))  # tied weights once
    tokenizer.save_pretrained(partial)
    try:
        os.rename(partial, folder)  # whole or absent: another process may have saved it first
    except OSError:
        shutil.rmtree(partial, ignore_errors=True)
    prune_old_entries(os.path.dirname(folder))  # older versions' copies, a killed save's part
    return model, tokenizer


@pytest.fixture(scope="session")
def torch_smollm2():
    """(transformers' PyTorch model of the same GGUF, its tokenizer): the reference, loaded once per process."""
    from replug_jax.models import registry

    return load_torch_reference(registry.packaged_path("smollm2"))


@pytest.fixture(scope="session")
def minilm():
    import replug_jax as rj

    return rj.load_encoder("minilm", batch_size=8)


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist: its files in LONGEST_FIRST's order (below)
        config.option.loadscopereorder = False
    config.addinivalue_line("markers", "exclusive: runs while no other pytest-xdist worker runs a test (memory)")
    config.addinivalue_line("markers", "slow: a second check of a path the core suite covers once (another process "
                            "layout, real weights where tiny ones are checked, a script's smoke run); `make test` "
                            "leaves these out, `make test-all` and a plain `pytest tests` run them")


# The longest files first, so that the last file a worker takes is a short one: `make test`'s seconds per file
# (summed over its tests, 2 workers, Intel Xeon, 2026-11-29), the files of 40 s or more; the rest follow in
# alphabetical order. pytest-xdist hands files (--dist loadfile) to workers in collection order only without its own
# reordering by test count (`pytest_configure` turns it off): with it, test_readme.py (2 tests, 274 s), test_harness.py
# (8, 301 s) and test_text_beyond_ascii.py (6, 202 s) came last and one worker ran them while the other was idle.
LONGEST_FIRST = ("test_harness.py", "test_readme.py", "test_path_equivalence.py", "test_text_beyond_ascii.py",
                 "test_http.py", "test_downstream.py", "test_lsr_loop.py", "test_readers.py", "test_command_line.py",
                 "test_models.py", "test_real_weights.py", "test_launch.py", "test_retrieval.py", "test_lm_mesh.py",
                 "test_posterior.py", "test_pipeline.py", "test_qa_lsr.py", "test_train_step.py",
                 "test_generate_http.py", "test_generate.py", "test_multiprocess.py", "test_server_decoding.py",
                 "test_contract.py")


def pytest_collection_modifyitems(items):
    rank = lambda item: (LONGEST_FIRST.index(item.path.name) if item.path.name in LONGEST_FIRST
                         else len(LONGEST_FIRST))
    items.sort(key=rank)  # stable: files keep their order after these, tests their order within a file


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Under pytest-xdist, a test marked `exclusive` waits until no other worker is in a test and keeps them out
    while it runs, its set-up and tear-down included (so the module and session fixtures it builds, a reader LM of
    ~15 GB, are built and freed alone too); every other test runs beside any unmarked one. Without xdist, no lock."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        yield
        return
    import fcntl

    alone = _runs_alone(item)
    if alone:
        free_compiled_programs()  # this worker's own share of the memory, before the big model loads
    with open(os.environ["REPLUG_JAX_TEST_LOCK"]) as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        yield  # closing the file releases the lock


def _runs_alone(item) -> bool:
    """Marked `exclusive` and not skipped by a `skipif` of a plain true condition (a reader LM not installed): pytest
    reads skipif marks in the test's set-up, inside the lock, where waiting to be alone would idle this worker
    (and, as flock lets shared holders in ahead of a waiting exclusive one, for as long as the other stays busy)."""
    skipped = any(mark.args and all(isinstance(a, bool) and a for a in mark.args)
                  for mark in item.iter_markers("skipif"))
    return item.get_closest_marker("exclusive") is not None and not skipped


# A worker keeps the programs JAX traced and compiled (the session models' scoring and decoding, read by most modules)
# until it holds a quarter of the machine's memory: clearing them after every module made each module trace and
# lower the session models' programs again (the persistent cache skips only XLA's compile). With the test changes of
# the same day the suite's CPU fell 1,967 -> 1,713 s; the workers ended at 5-8 GB on a 24 GB machine
# (benchmarks/README.md, "The test suite's time on an Intel host").
KEEP_PROGRAMS_BELOW = int(os.environ.get("REPLUG_JAX_TEST_KEEP_PROGRAMS_BELOW",  # bytes resident per process
                                         os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4))


def resident_bytes() -> int:
    """This process's resident memory (Linux /proc; 0 where there is none, so nothing is freed)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def free_compiled_programs() -> None:
    """Drop JAX's traced and compiled programs and collect garbage (session fixtures recompile what they need)."""
    import gc

    jax.clear_caches()
    gc.collect()


@pytest.fixture(scope="module", autouse=True)
def _free_compiled_programs():
    """After each test module: drop the compiled programs once this process holds KEEP_PROGRAMS_BELOW or more, so
    the suite's memory does not grow with every shape every module compiled."""
    yield
    if resident_bytes() >= KEEP_PROGRAMS_BELOW:
        free_compiled_programs()
