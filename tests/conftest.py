"""Test setup: 8 fake CPU devices (set before jax is imported) and shared model fixtures."""
import os

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One persistent XLA compilation cache for the session and every process it launches, for programs of any compile
# time: tests build the same tiny models again and again (new instances, same programs), modules recompile what
# earlier modules compiled (caches are cleared between modules, below), and the multi-process tests launch the
# same jobs many times. XLA's flags and the devices are part of each entry's key. Removed at exit.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    import atexit
    import shutil
    import tempfile

    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="replug_jax_test_xla_cache_")
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"  # default 1 s: no tiny-model program qualified
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
    atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_platforms", "cpu")


@pytest.fixture(scope="session")
def smollm2():
    """The packaged SmolLM2-135M GGUF, loaded once: a LocalLM over all 8 devices as a (2, 4) data × model mesh, so
    that the 8 fake devices (host memory) hold 2 copies of its weights, not 8, and every test using it also runs
    the model-parallel path."""
    import replug_jax as rj

    return rj.load_lm("smollm2", batch_size=8, model_parallel=4)


@pytest.fixture(scope="session")
def minilm():
    import replug_jax as rj

    return rj.load_encoder("minilm", batch_size=8)


@pytest.fixture(scope="module", autouse=True)
def _free_compiled_programs():
    """After each test module: drop JAX's compiled programs and collect garbage, so the suite's memory does not
    grow with every shape every module compiled (session fixtures recompile what they need)."""
    yield
    import gc

    jax.clear_caches()
    gc.collect()
