"""Regressions: recipe inputs that did not reach a stage fingerprint, and config values that crashed mid-run."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf


def compose(*overrides: str):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from i2d2.config import CONF_DIR

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return hydra_compose("train", overrides=["model=tiny_gpt2", "critic=tiny", "logger=none", *overrides])


# ----------------------------------------------------------------------------- NeuroComparatives

@pytest.mark.parametrize("template,pattern", [
    ("Compared to {entity1}, {entity_2}", r"data\.template: must hold \{entity1\} and \{entity2\}"),
    ("Compared to {entity1}", r"data\.template: must hold"),
    ("{entity2} compared to {entity1}", r"data\.template: must end with \{entity2\}"),
    ("Compared to {entity1, {entity2}", r"data\.template: "),
])
def test_comparatives_bad_template_refused_at_start_up(template, pattern):
    from i2d2.config import ConfigError
    from i2d2.recipes.comparatives import _check_template

    with pytest.raises(ConfigError, match=pattern):
        _check_template(template)


def test_comparatives_other_template_exports_qa():
    """A template other than 'Compared to ...' used to fail in the QA export, after generation and critic training."""
    from i2d2.comparatives.qa import export_qa
    from i2d2.recipes.comparatives import _check_template

    _check_template("Unlike {entity1}, {entity2}")
    _check_template("Compared to {entity1}, {entity2}")
    rows = [{"statement": "Unlike cars, bikes are cheaper.", "prompt": "Unlike cars, bikes",
             "plural1": "cars", "plural2": "bikes"}]
    (q,) = export_qa(rows, balance=False)
    assert q["question"] == "Which of the following are cheaper?" and q["options"] == {"A": "cars", "B": "bikes"}
    assert q["answer"] == "B"


def test_comparatives_critic_fingerprint_sees_the_perplexity_baseline(tmp_path):
    """perplexity_baseline=true on a finished run reused the critic stage, so ap_perplexity stayed null."""
    from i2d2.recipes.comparatives import annotation_paths, critic_cfg, critic_fingerprint

    cfg = compose("task=comparatives", f"run_dir={tmp_path}")
    ccfg, paths = critic_cfg(cfg), annotation_paths(cfg)
    off = critic_fingerprint(cfg, ccfg, paths, False, "tiny:gpt2")
    assert off == critic_fingerprint(cfg, ccfg, paths, False, "other")  # off: the LM is no input
    on = critic_fingerprint(cfg, ccfg, paths, True, "tiny:gpt2")
    assert on != off
    assert on != critic_fingerprint(cfg, ccfg, paths, True, "tiny:llama")  # a different baseline LM


# ----------------------------------------------------------------------------- CMP

@pytest.mark.parametrize("value", [0, -1])
def test_cmp_segment_sentences_checked(value):
    from i2d2.config import ConfigError
    from i2d2.recipes.cmp import check_config

    with pytest.raises(ConfigError, match=r"task\.segment_sentences: must be an integer >= 1"):
        check_config(compose("task=cmp", f"task.segment_sentences={value}"))


def test_cmp_segment_sentences_in_pretrain_fingerprint():
    """The documents pre-training reads are cut to task.segment_sentences: changing it must redo pre-training."""
    from i2d2.recipes.cmp import pretrain_fingerprint

    default = compose("task=cmp")
    fp = pretrain_fingerprint(default, "x", {})
    assert fp == pretrain_fingerprint(compose("task=cmp", "task.segment_sentences=10"), "x", {})
    assert fp != pretrain_fingerprint(compose("task=cmp", "task.segment_sentences=2"), "x", {})


# ----------------------------------------------------------------------------- NegVerse

@pytest.mark.parametrize("task", ["cmp", "negverse"])
def test_trainer_settings_that_change_a_fit_are_in_its_fingerprint(task):
    """A rerun with trainer.accumulate_grad_batches / gradient_clip_val / precision changed reused CMP pre-training and
    NegVerse prompt tuning trained with the old ones (their fingerprints had no trainer part; the I2D2 fine-tuning's
    and the comparatives critic's have one). How progress is shown changes nothing."""
    if task == "cmp":
        from i2d2.recipes.cmp import pretrain_fingerprint as fp_of
    else:
        from i2d2.recipes.negverse import train_fingerprint as fp_of

    fp = fp_of(compose(f"task={task}"), "x") if task == "negverse" else fp_of(compose(f"task={task}"), "x", {})

    def other(*overrides):
        cfg = compose(f"task={task}", *overrides)
        return fp_of(cfg, "x") if task == "negverse" else fp_of(cfg, "x", {})

    for changed in ("trainer.accumulate_grad_batches=2", "trainer.gradient_clip_val=0.5", "trainer.precision=bf16-mixed"):
        assert other(changed) != fp, changed
    assert other("trainer.log_every_n_steps=1", "+trainer.enable_progress_bar=false",
                 "+trainer.enable_model_summary=false") == fp


@pytest.mark.parametrize("task", ["cmp", "negverse"])
def test_trainer_settings_the_fit_replaces_are_not_in_its_fingerprint(task):
    """The fit passes max_steps / max_epochs (from task.train / task.pretrain) to build_trainer, replacing the trainer
    config's: trainer.max_epochs=3 changed nothing the fit learns, yet redid prompt tuning / pre-training."""
    if task == "cmp":
        from i2d2.recipes.cmp import pretrain_fingerprint

        def fp_of(*overrides):
            return pretrain_fingerprint(compose(f"task={task}", *overrides), "x", {})
    else:
        from i2d2.recipes.negverse import train_fingerprint

        def fp_of(*overrides):
            return train_fingerprint(compose(f"task={task}", *overrides), "x")

    assert fp_of("trainer.max_epochs=3", "+trainer.max_steps=7") == fp_of()
    assert fp_of("trainer.accumulate_grad_batches=2") != fp_of()


def test_negverse_spacy_pipeline_fingerprinted(tmp_path):
    """task.spacy parses the training pairs and the evaluation: another pipeline used to reuse every stage."""
    from i2d2.models import load_spacy
    from i2d2.recipes.negverse import _spacy_fingerprint

    import spacy

    shared = load_spacy("packaged:spacy-sm")  # cached for every test: changed only through a copy
    assert _spacy_fingerprint("packaged:spacy-sm", shared) == []  # old runs keep their fingerprints
    shared.to_disk(tmp_path / "copy")
    nlp = spacy.load(tmp_path / "copy")
    nlp.remove_pipe("lemmatizer")
    nlp.to_disk(tmp_path / "nolemma")
    a = _spacy_fingerprint(str(tmp_path / "nolemma"), load_spacy(str(tmp_path / "nolemma")))
    assert a and "lemmatizer" not in a[0]["pipes"] and "lemmatizer" in load_spacy("packaged:spacy-sm").pipe_names
    nlp.remove_pipe("ner")
    nlp.to_disk(tmp_path / "nolemma")  # the same folder, another pipeline
    assert _spacy_fingerprint(str(tmp_path / "nolemma"), load_spacy(str(tmp_path / "nolemma"))) != a
