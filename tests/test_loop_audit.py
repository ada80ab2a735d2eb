"""Regression tests from an audit of the I2D2 loop: the repeated-list-item rule, exact near-duplicate cuts, model.dtype
in the loop's fingerprints, and i2d2.generate's out_dir shards and argument checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from i2d2.config import CONF_DIR, setup_run

ANNOTATIONS = Path(__file__).resolve().parent.parent / "i2d2" / "data" / "annotations"


def make_cfg(run_dir, *extra, name="train"):
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose(name, overrides=["experiment=smoke", f"run_dir={run_dir}", *extra])
    setup_run(cfg)
    return cfg


# ----------------------------------------------------------------------------- filter

@pytest.mark.parametrize("text", ["Generally, a saw is used to cut wood, wood, etc.",
                                  "Generally, dogs eat meat, fish, meat.",
                                  "Generally, a vacuum cleaner can be used to remove dust, dirt, dust, etc.",
                                  "Generally, zookeepers may be called zoo keepers or zoo keepers."])
def test_a_list_that_repeats_its_first_item_is_caught(text):
    from i2d2.filtering import repeats_list_item

    assert repeats_list_item(text)


@pytest.mark.parametrize("text", ["Generally, chairs are made of wood, metal, plastic.",
                                  "Birds fly, walk, or swim, and some can walk and swim.",
                                  "In order to cook, cook food in a pan.",
                                  "Generally, dogs are loyal, very loyal."])
def test_lists_without_a_repeat_are_kept(text):
    from i2d2.filtering import repeats_list_item

    assert not repeats_list_item(text)


def test_every_labelled_statement_the_rule_drops_is_garbled():
    from i2d2.filtering import repeats_list_item

    rows = [json.loads(line) for line in (ANNOTATIONS / "generics_gemma.jsonl").read_text().splitlines() if line.strip()]
    flagged = [r for r in rows if repeats_list_item(r["statement"])]
    assert len(flagged) == 44 and {r["label"] for r in flagged} == {"garbled"}


def test_near_duplicate_ratio_is_cut_exactly_not_after_rounding():
    from rapidfuzz import fuzz

    from i2d2.filtering import dedupe_key, near_duplicates

    a, b = "Generally, dogs like to chase balls in the park.", "Generally, dogs like to chase cats in the park."
    r = fuzz.ratio(dedupe_key(a), dedupe_key(b))
    assert 94.5 <= r < 95
    assert near_duplicates([a, b], ["dog", "dog"], threshold=95).tolist() == [0, 1]  # distinct: both kept
    assert near_duplicates([a, b], ["dog", "dog"], threshold=94.5).tolist() == [0, 0]
    long_a, long_b = "x" * 200 + "ab", "x" * 200 + "ba"  # ratio 99.5: not an exact duplicate
    assert near_duplicates([long_a, long_b], threshold=100).tolist() == [0, 1]
    assert near_duplicates([long_a, long_a], threshold=100).tolist() == [0, 0]


# ----------------------------------------------------------------------------- fingerprints

class _LM:
    def __init__(self, name):
        self.name = name


def _fps(monkeypatch, cfg, generator: str) -> dict:
    from i2d2.recipes import generics

    got = {}
    monkeypatch.setattr(generics, "stage", lambda ranks, out, fp, fn, name, **kw: got.setdefault(name, fp) and {})
    it_dir, lm, key = Path(cfg.run_dir) / "iter_1", _LM(generator), generics._model_id(generator)
    generics.generation_stage(cfg, it_dir, it_dir / "prompts" / "prompts.jsonl", key, lm, None, generics.Ranks())
    generics.critic_stage(cfg, 1, it_dir, key, lm, None, generics.Ranks())
    generics.heldout_stage(cfg, 1, it_dir, key, lm, None, generics.Ranks())
    generics.finetune_stage(cfg, 1, it_dir, key, lm, None, generics.Ranks())
    return got


def test_model_dtype_is_in_the_fingerprints_of_the_stages_that_run_the_lm(tmp_path, monkeypatch):
    model = tmp_path / "run" / "iter_0" / "model"  # P_1: a local folder, loaded in model.dtype
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    f32 = _fps(monkeypatch, make_cfg(tmp_path / "run"), str(model))
    bf16 = _fps(monkeypatch, make_cfg(tmp_path / "run", "model.dtype=bfloat16"), str(model))
    assert set(f32) == {"generation", "critic", "heldout", "finetune"}
    assert all(f32[s] != bf16[s] for s in f32)
    # the default adds nothing (old runs keep their fingerprints); tiny:* models ignore dtype
    from i2d2.recipes.generics import _dtype_part

    assert _dtype_part(make_cfg(tmp_path / "run"), str(model)) == []
    assert _dtype_part(make_cfg(tmp_path / "run", "model.dtype=bfloat16"), "tiny:gpt2") == []


def test_a_critic_trained_on_another_lm_is_trained_again(tmp_path, monkeypatch):
    """The critic stage reports P_k's perplexity as its baseline ranker: a run folder continued with another
    model.name must not keep the first model's ap_perplexity."""
    cfg = make_cfg(tmp_path / "run", "task.critic.refresh=always")
    a, b = _fps(monkeypatch, cfg, "tiny:gpt2")["critic"], _fps(monkeypatch, cfg, "tiny:llama")["critic"]
    assert a != b
    assert _fps(monkeypatch, cfg, "tiny:gpt2")["critic"] == a


def test_trainer_settings_that_change_the_critic_fit_are_in_its_fingerprint(tmp_path, monkeypatch):
    """The critic trains under the trainer config (accumulate_grad_batches, gradient_clip_val, precision): a rerun
    with one of them changed reused the critic trained with the old ones (the fine-tuning stage was redone)."""
    fp = _fps(monkeypatch, make_cfg(tmp_path / "run"), "tiny:gpt2")["critic"]
    for changed in ("trainer.accumulate_grad_batches=2", "trainer.gradient_clip_val=0.5"):
        assert _fps(monkeypatch, make_cfg(tmp_path / "run", changed), "tiny:gpt2")["critic"] != fp, changed
    assert _fps(monkeypatch, make_cfg(tmp_path / "run", "trainer.log_every_n_steps=1"), "tiny:gpt2")["critic"] == fp


def test_trainer_settings_the_critic_fit_replaces_are_not_in_its_fingerprint(tmp_path, monkeypatch):
    """The critic's fit sets max_epochs from critic.max_epochs: trainer.max_epochs (which it never reads) retrained
    the critic of every iteration and kept a later one from reusing an earlier one's."""
    fp = _fps(monkeypatch, make_cfg(tmp_path / "run"), "tiny:gpt2")["critic"]
    assert _fps(monkeypatch, make_cfg(tmp_path / "run", "trainer.max_epochs=3"), "tiny:gpt2")["critic"] == fp


@pytest.mark.parametrize("marker", ["\x00{not json", "[]", '{"summary": null}'])
def test_a_damaged_critic_marker_of_an_earlier_iteration_trains_a_new_critic(tmp_path, monkeypatch, caplog, marker):
    """Iteration k looks at iteration k-1's critic marker to reuse its critic; a damaged one (a disk error, an
    editor) stopped ``iteration=k`` with a bare JSONDecodeError (or AttributeError) traceback naming no file."""
    from i2d2.recipes import generics

    cfg = make_cfg(tmp_path / "run", "iteration=1")
    done = tmp_path / "run" / "iter_0" / "critic" / "_DONE.json"
    done.parent.mkdir(parents=True)
    done.write_text(marker)
    got = {}
    monkeypatch.setattr(generics, "stage", lambda ranks, out, fp, fn, name, **kw: got.update(kw) or {})
    it_dir = tmp_path / "run" / "iter_1"
    with caplog.at_level("WARNING"):
        generics.critic_stage(cfg, 1, it_dir, "tiny:gpt2", _LM("tiny:gpt2"), None, generics.Ranks())
    assert got == {"all_ranks": True}  # a critic is trained (every rank joins its fit), none reused
    assert str(done) in caplog.text and "cannot be reused" in caplog.text


# ----------------------------------------------------------------------------- i2d2.generate

def test_generation_shards_of_another_model_key_are_decoded_again(tmp_path, tiny_gpt2):
    from i2d2.generation import generate_stage

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt_id": "p0", "prompt": "Generally, dogs",
                                   "constraints": {"clauses": [], "dynamic": []}}) + "\n")
    dec = dict(beam_size=2, num_return=2, max_new_tokens=3, min_new_tokens=1, batch_size=2)
    out = tmp_path / "gen"
    assert generate_stage(*tiny_gpt2, prompts, out, dec, shard_size=1, model_key="a")["shards_decoded"] == 1
    assert generate_stage(*tiny_gpt2, prompts, out, dec, shard_size=1, model_key="a")["shards_decoded"] == 0
    assert generate_stage(*tiny_gpt2, prompts, out, dec, shard_size=1, model_key="b")["shards_decoded"] == 1


def test_generate_keys_its_shards_by_the_weights_not_the_path(tmp_path, monkeypatch, tiny_gpt2):
    """A model trained again into the same folder (iter_k/model) must not reuse generate.out_dir's shards."""
    import i2d2.generation
    from i2d2 import generate as gen

    model_dir, critic = tmp_path / "model", tmp_path / "critic"
    critic.mkdir()
    (critic / "critic_meta.json").write_text("{}")
    keys = []

    class Stop(Exception):
        pass

    def fake_stage(*a, model_key=None, **k):
        keys.append(json.dumps(model_key))
        raise Stop

    monkeypatch.setattr(i2d2.generation, "generate_stage", fake_stage)
    model, tok = tiny_gpt2
    for bias in (0.0, 1.0):
        import copy

        import torch

        m = copy.deepcopy(model)  # the session's model is shared: changed only in a copy
        with torch.no_grad():
            next(m.parameters()).add_(bias)
        m.save_pretrained(model_dir)
        tok.save_pretrained(model_dir)
        cfg = make_cfg(tmp_path / "run", "generate.concepts=[violin]", "generate.relations=measured",
                       f"generate.model={model_dir}", f"generate.critic={critic}",
                       f"generate.out_dir={tmp_path / 'out'}", name="generate")
        with pytest.raises(Stop):
            gen.generate(cfg)
    assert len(keys) == 2 and keys[0] != keys[1]


@pytest.mark.parametrize("override, match", [("generate.top_k=-2", "generate.top_k: must be an integer >= 1"),
                                             ("generate.prompts_per_concept=0", "generate.prompts_per_concept"),
                                             ("generate.delta=high", "generate.delta: must be null"),
                                             ("generate.only_accepted=maybe", "generate.only_accepted")])
def test_generate_refuses_bad_arguments_naming_the_key(tmp_path, override, match):
    from i2d2.generate import GenerateError, generate

    cfg = make_cfg(tmp_path / "run", "generate.concepts=[violin]", override, name="generate")
    with pytest.raises(GenerateError, match=match):
        generate(cfg)


def test_a_damaged_critic_marker_is_passed_over_as_a_missing_one_and_the_warning_says_no_more(tmp_path, monkeypatch,
                                                                                               caplog):
    """Past a damaged marker of iteration k-1 the search goes on to k-2's critic, as past a missing one, and may reuse
    it; the warning said "training one for iteration k" whatever followed."""
    from i2d2.io import write_json
    from i2d2.recipes import generics

    run = tmp_path / "run"
    cfg = make_cfg(run, "iteration=2", "task.critic.refresh=never")
    (run / "iter_1" / "critic").mkdir(parents=True)
    (run / "iter_1" / "critic" / "_DONE.json").write_text("\x00{not json")
    (run / "iter_0" / "critic" / "model").mkdir(parents=True)
    write_json(run / "iter_0" / "critic" / "_DONE.json", {"summary": {"model_dir": "iter_0/critic/model",
                                                                      "labels_fingerprint": "x", "reused_from": None}})
    got = {}
    monkeypatch.setattr(generics, "stage", lambda ranks, out, fp, fn, name, **kw: got.update(kw) or {})
    with caplog.at_level("WARNING"):
        generics.critic_stage(cfg, 2, run / "iter_2", "tiny:gpt2", _LM("tiny:gpt2"), None, generics.Ranks())
    assert got == {"all_ranks": False}  # iteration 0's critic is reused, none trained
    assert "iter_1" in caplog.text and "cannot be reused" in caplog.text and "training one" not in caplog.text
