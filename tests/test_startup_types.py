"""Regression tests from an audit of values accepted at start-up that failed late or were misread: decoding's
``lookahead`` / ``candidates_per_beam`` (0 read as unset, -1 a RuntimeError in the decoder's topk mid-generation),
and a scalar given for a key whose default is a list (``data.constraints.function_words=7``, a TypeError in the
prompts stage)."""

import pytest

from i2d2.config import CONF_DIR, ConfigError


def _cfg(*overrides):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return compose("train", overrides=["model=tiny_gpt2", "critic=tiny", "logger=none", *overrides])


# ----------------------------------------------------------------------------- decoding


@pytest.mark.parametrize("key, default", [("lookahead", "beam_size"), ("candidates_per_beam", "2 \\* beam_size")])
@pytest.mark.parametrize("value", [0, -1])
def test_decoding_counts_must_be_null_or_at_least_one(key, default, value):
    from i2d2.schemas import DecodingConfig

    DecodingConfig(**{key: None})  # null: the default
    DecodingConfig(**{key: 1})
    with pytest.raises(ValueError, match=rf"^{key}: must be null \(the default: {default}\) or an integer >= 1, "
                                         rf"got {value}$"):
        DecodingConfig(**{key: value})


@pytest.mark.parametrize("task, module", [("i2d2", "i2d2.recipes.generics"),
                                          ("comparatives", "i2d2.recipes.comparatives")])
@pytest.mark.parametrize("override, message", [
    ("decoding.lookahead=-1", r"^decoding\.lookahead: must be null \(the default: beam_size\) or an integer >= 1, "
                              r"got -1$"),
    ("decoding.lookahead=0", r"^decoding\.lookahead: must be null .* got 0$"),
    ("decoding.candidates_per_beam=0", r"^decoding\.candidates_per_beam: must be null \(the default: 2 \* beam_size\) "
                                       r"or an integer >= 1, got 0$"),
    # one message named all three keys ('decoding.DecodingConfig: min_new_tokens, sat_tolerance, ...'), whichever
    # was wrong
    ("decoding.min_new_tokens=-1", r"^decoding\.min_new_tokens: must be an integer >= 0, got -1$"),
    ("decoding.sat_tolerance=-2", r"^decoding\.sat_tolerance: must be an integer >= 0, got -2$"),
    ("decoding.no_repeat_ngram_size=-3", r"^decoding\.no_repeat_ngram_size: must be an integer >= 0, got -3$"),
])
def test_recipes_refuse_bad_decoding_counts_at_start_up(tmp_path, task, module, override, message):
    import importlib

    check_config = importlib.import_module(module).check_config
    check_config(_cfg(f"task={task}", f"run_dir={tmp_path}", "decoding.lookahead=2", "decoding.candidates_per_beam=3"))
    with pytest.raises(ConfigError, match=message):
        check_config(_cfg(f"task={task}", f"run_dir={tmp_path}", override))


def test_decoder_refuses_a_negative_lookahead_before_generating():
    # was a RuntimeError from torch's topk ("k not in range") once generation reached the lookahead
    from i2d2.decoding import NeuroLogicDecoder
    from i2d2.models import tiny_model

    model, tok = tiny_model("gpt2")
    with pytest.raises(ValueError, match=r"^lookahead: must be null"):
        NeuroLogicDecoder(model, tok, {"lookahead": -1})


# ----------------------------------------------------------------------------- a scalar where a list belongs


@pytest.mark.parametrize("overrides, message", [
    # a TypeError ('int' object is not iterable) in the prompts stage, after start-up
    (["data.constraints.function_words=7"],
     r"data\.constraints\.function_words=7 \(expected a list, like its default \[in, on, of, \.\.\.\]\)"),
    # a string is iterated letter by letter: the held-out concepts 'u', 'm', 'b', ...
    (["task.heldout.nouns=umbrella"], r"task\.heldout\.nouns='umbrella' \(expected a list"),
    (["task=comparatives", "data.wikidata.roots=artefact"], r"data\.wikidata\.roots='artefact' \(expected a list"),
    (["task=comparatives", "task.constraints.negatives=punctuation"],
     r"task\.constraints\.negatives='punctuation' \(expected a list, like its default \[punctuation, pronouns, "
     r"connectives\]\)"),
    (["task=cmp", "task.downstream.shots=0"], r"task\.downstream\.shots=0 \(expected a list, like its default \[0\]\)"),
])
def test_a_scalar_for_a_list_key_is_refused_at_start_up(overrides, message):
    from i2d2.config import ConfigTypeError, check_keys

    with pytest.raises(ConfigTypeError, match=r"^config value\(s\) of the wrong type: .*" + message):
        check_keys(_cfg(*overrides))


def test_a_scalar_for_a_list_key_is_refused_by_i2d2_generate():
    from hydra import compose, initialize_config_dir

    from i2d2.config import ConfigTypeError, check_keys

    def cfg(*overrides):
        with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
            return compose("generate", overrides=list(overrides))

    check_keys(cfg("generate.concepts=[violins]"))
    with pytest.raises(ConfigTypeError, match=r"generate\.concepts='violins' \(expected a list, like its default \[\]\)"):
        check_keys(cfg("generate.concepts=violins"))


@pytest.mark.parametrize("overrides", [
    ["task=comparatives", "task.constraints.negatives=null"],  # a list key taking null (every negative set)
    ["task=comparatives", "task.filters.contradiction.label_indices=[0,1,2]"],  # null default: any value
    ["task=comparatives", "task.filters.contradiction.label_indices=null"],
    ["data.goal_prefixes=[]", "task.heldout.goals=null"],
    ["task=cmp", "task.downstream.datasets=[]", "task.pretrain.val_max_per_task=null"],
    ["task.heldout.nouns=${data.adverbs}"],  # an interpolation is the referenced value's business
])
def test_nulls_lists_and_interpolations_for_list_keys_still_pass(overrides):
    from i2d2.config import check_keys

    check_keys(_cfg(*overrides))


@pytest.mark.parametrize("overrides", [[f"task={t}", *p] for t in ("i2d2", "comparatives", "negverse", "cmp")
                                       for p in ([], ["experiment=smoke"])]
                         + [[f"experiment=paper_{t}"] for t in ("i2d2", "comparatives", "negverse", "cmp")])
def test_every_task_and_preset_passes_the_type_check(overrides):
    from i2d2.config import check_keys

    check_keys(_cfg(*overrides))


# ----------------------------------------------------------------------------- trainer values


@pytest.mark.parametrize("override, message", [
    # accepted and ignored under a max_steps limit (NegVerse, CMP), a TypeError inside Lightning elsewhere
    ("trainer.max_epochs=abc", r"trainer\.max_epochs='abc' \(expected a number, like its default 1\)"),
    ("trainer.gradient_clip_val=abc", r"trainer\.gradient_clip_val='abc' \(expected a number"),
    ("trainer.enable_checkpointing=maybe", r"trainer\.enable_checkpointing='maybe' \(expected true or false\)"),
    ("+trainer.enable_progress_bar=1", r"trainer\.enable_progress_bar=1 \(expected true or false\)"),
])
def test_a_wrong_typed_trainer_value_is_refused_at_start_up(override, message):
    from i2d2.config import ConfigTypeError, check_keys

    with pytest.raises(ConfigTypeError, match=r"^config value\(s\) of the wrong type: " + message):
        check_keys(_cfg(override))
    # what Lightning takes stays allowed: any Trainer argument, nulls, -1, another kind of device count
    check_keys(_cfg("trainer.max_epochs=-1", "trainer.gradient_clip_val=null", "trainer.devices=auto",
                    "+trainer.limit_train_batches=0.5", "+trainer.val_check_interval=3"))


def test_entry_point_refuses_a_wrong_typed_trainer_value_before_writing_to_run_dir(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root), "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"}
    run = tmp_path / "run"
    p = subprocess.run([sys.executable, "-m", "i2d2.train", "experiment=smoke", "task=negverse", f"run_dir={run}",
                        "trainer.max_epochs=abc"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr[-2000:]
    assert p.stderr.strip().startswith("error: config value(s) of the wrong type: trainer.max_epochs='abc'")
    assert not run.exists()
