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
