"""Per-program XLA options on CPU (replug_jax.parallel.xla_cpu): the encoder compiles with XLA's defaults (YNNPACK
fusions: issue 72 measured them faster on both hosts, and a bf16 encoder needs them), its embeddings are those of
XLA's own dots to float32 rounding, and an option this jaxlib does not know is dropped, not fatal."""
import platform

import numpy as np
import pytest

import replug_jax as rj
from replug_jax.parallel import sharding, xla_cpu

X86 = platform.machine().lower() in ("x86_64", "amd64")


@pytest.mark.skipif(not X86, reason="the options are chosen (and measured) for x86-64 CPUs only")
def test_encoder_compiles_with_ynnpack_fusions_and_embeds_as_without(monkeypatch):
    texts = ["The Eiffel Tower is in Paris.", "Photosynthesis makes sugar from light.", "A short one."]
    assert xla_cpu.ENCODER == {}
    defaults = rj.load_encoder("minilm")
    with monkeypatch.context() as patch:
        patch.setattr(xla_cpu, "ENCODER", xla_cpu.NO_YNNPACK)
        without = rj.load_encoder("minilm")
    np.testing.assert_allclose(defaults.embed(texts), without.embed(texts), atol=2e-6)
    ids, mask = defaults.padded(texts, 16)

    def program(e):
        fn = e._batch_fn
        return fn.jitted.lower(fn.params, *(np.repeat(a, fn.batch_size // 3 + 1, 0)[: fn.batch_size]
                                            for a in (ids, mask))).compile().as_text()

    assert "ynn_fusion" in program(defaults)
    assert "ynn_fusion" not in program(without)  # so the check above could fail


def test_unknown_options_are_dropped_and_defaults_stay_elsewhere():
    mesh = sharding.data_mesh()
    assert xla_cpu.options({"xla_cpu_no_such_option": "1"}, mesh) is None
    assert xla_cpu.options({}, mesh) is None
    expected = xla_cpu.NO_YNNPACK if X86 else None
    assert xla_cpu.options(xla_cpu.NO_YNNPACK, mesh) == expected
