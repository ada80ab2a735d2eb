"""Regression tests from an audit of prompt construction, prompt perplexity and the generation stage (each failed
before its fix)."""

import json
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from i2d2 import config  # noqa: F401  (resolvers)

ROOT = Path(__file__).resolve().parent.parent


def compose(*overrides: str):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from i2d2.config import CONF_DIR

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return hydra_compose("train", overrides=["model=tiny_gpt2", "critic=tiny", "logger=none", "task=i2d2",
                                                 *overrides])


# ----------------------------------------------------------------------------- prompt construction

@pytest.mark.parametrize("noun,prompt,form", [("scissors", "Generally, scissors can", "adverb+bare_plural"),
                                               ("pliers", "Generally, pliers can", "adverb+bare_plural"),
                                               ("sheep", "Generally, a sheep can", "adverb+indefinite"),
                                               ("fish", "Generally, a fish can", "adverb+indefinite"),
                                               ("honey", "Generally, honey can", "adverb+bare_singular"),
                                               ("orange juice", "Generally, orange juice can", "adverb+bare_singular"),
                                               # inflect singularises these to "jean" / "glass": the lexicon knows
                                               ("jeans", "Generally, jeans can", "adverb+bare_plural"),
                                               ("reading glasses", "Generally, reading glasses can",
                                                "adverb+bare_plural"),
                                               ("homework", "Generally, homework can", "adverb+bare_singular")])
def test_invariant_and_mass_nouns_before_a_modal_get_a_grammatical_prompt(noun, prompt, form):
    """"Sheep can" is also the bare plural (the plural variant was dropped as a duplicate of the singular one);
    a plural-only noun never takes a/an ("Generally, a scissors can"), nor a mass noun ("Generally, a honey can",
    or "The honey can" when the forms had no bare singular)."""
    from i2d2.concepts import Concept
    from i2d2.prompts import noun_variants, select_by_form

    cfg = OmegaConf.load(ROOT / "conf/data/generics.yaml")
    group = noun_variants(Concept(noun), "can", cfg)
    (chosen,), _ = select_by_form([group], list(cfg.prompt_forms))
    assert chosen.text == prompt and chosen.form == form
    assert len({v.text for v in group}) == len(group)
    if noun not in ("sheep", "fish"):
        assert not any(v.article in ("a", "an") for v in group)
    # number agreement: a mass noun takes no plural phrase, a plural-only noun no singular one
    mass, plural_only = ("honey", "orange juice", "homework"), ("scissors", "pliers", "jeans", "reading glasses")
    assert (noun_variants(Concept(noun), "are", cfg) == []) == (noun in mass)
    assert (noun_variants(Concept(noun), "is", cfg) == []) == (noun in plural_only)
    assert not any(v.surface in ("jean", "reading glass", "homeworks") for v in group)
    from i2d2.prompts import candidate_groups

    # such a pair is no group at all (the form selection read g[0] of an empty one)
    groups = candidate_groups([Concept(noun)], OmegaConf.merge(cfg, {"relations": {"general": str(
        ROOT / "i2d2/data/generics/relations/general.txt")}}))
    assert groups and all(groups)


def test_heldout_concepts_are_normalised_and_checked():
    from i2d2.prompts import heldout_concepts, heldout_keys

    # normalised as the loaders normalise data.sources' concepts: "Board  Games" keeps "board games" out of the loop
    assert heldout_keys({"nouns": ["Board  Games"], "goals": [" plant a tree"]}) == {"board games", "plant a tree"}
    with pytest.raises(ValueError, match=r"task\.heldout\.nouns\[1\]"):
        heldout_concepts({"nouns": ["ladder", ""]})  # was inflect's TypeCheckError in the held-out stage


# ----------------------------------------------------------------------------- start-up checks

@pytest.mark.parametrize("override, key", [
    ("data.prompt_selection=bogus", "data.prompt_selection"),
    ("data.prompt_forms=[bogus]", "data.prompt_forms"),
    ("data.related_prompts=bogus", "data.related_prompts"),
    ("data.perplexity.per=words", "data.perplexity.per"),
    ("data.relations.measured=missing.txt", "data.relations.measured"),
    ("+data.sources.kb={path: noun_phrases.txt, format: genericskb, options: {min_statments: 3}}",
     "data.sources.kb.options"),
    ("data.generation.shard_size=0", "data.generation.shard_size"),
    ("data.on_error=bogus", "data.on_error"),
    ("task.heldout.nouns=[ladder,'dogs!']", r"task.heldout.nouns\[1\]"),
    ("task.heldout.relations=nope", "task.heldout.relations"),
])
def test_bad_prompt_config_fails_at_start_up_naming_the_key(override, key):
    """Each was accepted at start-up and failed (or was ignored) in the prompts or held-out stage."""
    from i2d2.config import ConfigError
    from i2d2.recipes.generics import check_config

    with pytest.raises(ConfigError, match=key):
        check_config(compose(override))


def test_shipped_config_passes_the_start_up_checks():
    from i2d2.recipes.generics import check_config

    check_config(compose())


def test_perplexity_refuses_an_unknown_unit(tiny_gpt2):
    from i2d2.perplexity import perplexity

    with pytest.raises(ValueError, match="per"):
        perplexity(*tiny_gpt2, ["Dogs can bark"], per="words")  # was silently per word


def test_generate_dedupes_concepts_case_insensitively():
    """The prompt builder merges "Violins" into "violins": a second spelling printed an empty block."""
    from i2d2.generate import read_concepts

    got = read_concepts(OmegaConf.create({"concepts": ["violins", "Violins", "board  games", "Board games"]}))
    assert got == ["violins", "board games"]


# ----------------------------------------------------------------------------- resumption

def test_prompt_scores_resume_with_another_chunk_size(tmp_path, tiny_gpt2):
    """Chunks a killed build left are reused only at the same chunk size (was: could not broadcast (2,) into (3,))."""
    from i2d2.prompts import score_texts

    texts = [f"Dogs can {w}" for w in ("run", "bark loudly", "swim", "eat", "sleep all day")]
    a = score_texts(*tiny_gpt2, texts, tmp_path / "w", chunk=2, progress=False)
    b = score_texts(*tiny_gpt2, texts, tmp_path / "w", chunk=3, progress=False)
    np.testing.assert_allclose(a, b, rtol=1e-6)


def test_a_rank_leaves_another_ranks_unfinished_shard_alone(tmp_path, tiny_gpt2):
    """Ranks without torch.distributed: rank 1 finishing while rank 0 is between writing its shard and the shard's
    meta deleted rank 0's shard (rank 0 then failed on it)."""
    from i2d2.generation import generate_stage, shard_path

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt_id": f"p{i}", "prompt": p, "constraints": {"clauses": []}}) + "\n"
                               for i, p in enumerate(["Dogs can", "Cats are"])))
    out = tmp_path / "gen"
    decoding = dict(beam_size=2, num_return=1, max_new_tokens=3, min_new_tokens=1, batch_size=2)
    generate_stage(*tiny_gpt2, prompts, out, decoding, shard_size=1, rank=0, world_size=2)
    shard_path(out, 0).with_suffix(".meta.json").unlink()  # rank 0 has written shard 0 but not yet its meta
    s1 = generate_stage(*tiny_gpt2, prompts, out, decoding, shard_size=1, rank=1, world_size=2)
    assert not s1["complete"] and shard_path(out, 0).exists()
    s0 = generate_stage(*tiny_gpt2, prompts, out, decoding, shard_size=1, rank=0, world_size=2)  # owner redoes it
    assert s0["complete"] and s0["shards_decoded"] == 1
