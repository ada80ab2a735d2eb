"""I2D2 prompt construction: concepts, template expansion, perplexity selection, threshold, constraints."""

import json
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from i2d2 import config  # noqa: F401  (resolvers)
from i2d2.concepts import Concept, load_concepts, load_conceptnet, load_genericskb, load_jsonl, load_lines
from i2d2.io import DataError
from i2d2.prompts import (Variant, build_generic_prompts, goal_variants, noun_forms, noun_variants, phrase_number,
                          select_variants)

ROOT = Path(__file__).resolve().parent.parent
FIX = Path(__file__).parent / "fixtures"


def data_cfg(tmp_path, nouns=("umbrella", "child"), goals=("bake bread",), related=None, **over):
    cfg = OmegaConf.load(ROOT / "conf/data/generics.yaml")
    (tmp_path / "nouns.txt").write_text("\n".join(nouns) + "\n")
    (tmp_path / "goals.txt").write_text("\n".join(goals) + "\n")
    (tmp_path / "rel.txt").write_text("# test list\nis\nare\ncan be\n")
    sources = {"nouns": {"path": str(tmp_path / "nouns.txt"), "format": "lines", "kind": "noun", "relations": "t"},
               "goals": {"path": str(tmp_path / "goals.txt"), "format": "lines", "kind": "goal"}}
    if related:
        (tmp_path / "rel.jsonl").write_text("".join(json.dumps(r) + "\n" for r in related))
        sources["related"] = {"path": str(tmp_path / "rel.jsonl"), "format": "jsonl", "relations": "t"}
    cfg.sources = sources
    cfg.relations = {"t": str(tmp_path / "rel.txt")}
    cfg.dir = None
    # the paper's prompt rule (A.1.1): lowest-perplexity variant, four goal prefixes; the measured-forms default
    # is tested in test_forms_selection_builds_one_prompt_per_pair_without_a_perplexity_pass
    cfg.prompt_selection = "perplexity"
    cfg.goal_prefixes = ["In order to", "Before you", "After you", "While you"]
    for k, v in over.items():
        OmegaConf.update(cfg, k, v)
    return cfg


# ----------------------------------------------------------------------------- template expansion

def test_noun_template_expansion_agrees_in_number():
    cfg = OmegaConf.load(ROOT / "conf/data/generics.yaml")
    texts = {v.text for v in noun_variants(Concept("umbrella"), "can be", cfg)}
    # modal verb: both numbers; a/an chosen by inflect; "the" for both; optional adverb with a comma
    base = {"Umbrella can be", "An umbrella can be", "The umbrella can be", "Umbrellas can be",
            "The umbrellas can be"}
    expected = base | {f"{adv}, {b[0].lower()}{b[1:]}" for adv in ("Generally", "Typically", "Usually") for b in base}
    assert texts == expected
    assert not any(t.startswith(("A umbrella", "An umbrellas")) for t in texts)

    sg = {v.text for v in noun_variants(Concept("hour"), "has", cfg)}
    assert "An hour has" in sg and "Usually, the hour has" in sg and not any("hours" in t for t in sg)
    assert len(sg) == 4 * 3  # (no adverb + 3) x (no article, an, the)
    pl = [v for v in noun_variants(Concept("child"), "are", cfg)]
    assert {v.text for v in pl} >= {"Children are", "Generally, the children are"}
    assert all(v.number == "pl" and v.article in (None, "the") for v in pl) and len(pl) == 8
    v = next(v for v in pl if v.text == "Typically, the children are")
    assert v.template == "Typically, the {concept} are" and v.surface == "children" and v.adverb == "Typically"


def test_number_of_concepts_and_phrases():
    cfg = OmegaConf.load(ROOT / "conf/data/generics.yaml")
    modals = cfg.modal_verbs
    assert [phrase_number(p, modals) for p in ("is found in", "are", "has", "have", "produces", "can", "may be")] == \
        ["sg", "pl", "sg", "pl", "sg", "any", "any"]
    assert noun_forms(Concept("bus")) == ("bus", "buses")
    assert noun_forms(Concept("glasses")) == ("glass", "glasses")
    assert noun_forms(Concept("sheep")) == ("sheep", "sheep")
    assert noun_forms(Concept("knife")) == ("knife", "knives")
    assert noun_forms(Concept("hiking boots", plural=True)) == ("hiking boot", "hiking boots")


def test_goal_prompts_get_four_prefixes():
    cfg = OmegaConf.load(ROOT / "conf/data/generics.yaml")
    assert list(cfg.goal_prefixes) == ["In order to"]  # the measured default (prompt_form_yield.json)
    cfg.goal_prefixes = ["In order to", "Before you", "After you", "While you"]  # the paper's four
    vs = goal_variants(Concept("get better at chess", "goal"), cfg)
    assert [v.text for v in vs] == ["In order to get better at chess,", "Before you get better at chess,",
                                    "After you get better at chess,", "While you get better at chess,"]
    assert [v.relation for v in vs] == ["In order to", "Before you", "After you", "While you"]


# ----------------------------------------------------------------------------- selection and threshold

def _v(text, concept="x"):
    return Variant(text, Concept(concept), "is", text, concept)


def test_select_variants_keeps_lowest_and_applies_threshold():
    groups = [[_v("a1"), _v("a2"), _v("a3")], [_v("b1")], [_v("c1"), _v("c2")]]
    ppl = np.array([30.0, 12.0, 50.0, 400.0, 260.0, 249.0])
    kept, dropped = select_variants(groups, ppl, threshold=250)
    assert [(v.text, s) for v, s in kept] == [("a2", 12.0), ("c2", 249.0)]
    assert [(v.text, s) for v, s in dropped] == [("b1", 400.0)]
    kept, dropped = select_variants(groups, ppl, threshold=None)
    assert [v.text for v, _ in kept] == ["a2", "b1", "c2"] and not dropped
    kept, _ = select_variants(groups, np.array([np.nan, 5, 1, 1, 1, 1.0]), threshold=250)
    assert kept[0][0].text == "a3"  # NaN never wins


def test_build_prompts_picks_lowest_perplexity_variant(tmp_path, tiny_gpt2):
    from i2d2.perplexity import perplexity

    model, tok = tiny_gpt2
    cfg = data_cfg(tmp_path, **{"perplexity.threshold": None})
    out = tmp_path / "prompts" / "prompts.jsonl"
    summary = build_generic_prompts(cfg, model, tok, out)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert summary["n_concepts"] == 3 and summary["n_pairs"] == 2 * 3 + 4 and len(rows) == 10
    for rel in ("is", "are", "can be"):
        row = next(r for r in rows if r["concept"] == "umbrella" and r["relation"] == rel)
        variants = [v.text for v in noun_variants(Concept("umbrella"), rel, cfg)]
        ppl = perplexity(model, tok, variants, batch_size=7, per="word")
        assert row["prompt"] == variants[int(np.argmin(ppl))]
        assert row["perplexity"] == pytest.approx(float(ppl.min()), rel=1e-4)
    assert sorted(r["prompt"] for r in rows if r["kind"] == "goal") == sorted(
        ["In order to bake bread,", "Before you bake bread,", "After you bake bread,", "While you bake bread,"])
    # provenance
    r = rows[0]
    assert set(r) >= {"prompt_id", "prompt", "constraints", "concept", "kind", "template", "perplexity", "source"}
    for r in rows:
        filled = r["template"].replace("{concept}" if r["kind"] == "noun" else "{goal}", r["surface"])
        assert r["prompt"] == filled[:1].upper() + filled[1:]
    assert len({r["prompt_id"] for r in rows}) == len(rows)
    assert not list(out.parent.glob(".*"))  # no temporary files or perplexity chunks left behind


def test_threshold_drops_high_perplexity_prompts(tmp_path, tiny_gpt2):
    model, tok = tiny_gpt2
    cfg = data_cfg(tmp_path, **{"perplexity.threshold": None})
    all_rows = tmp_path / "all.jsonl"
    build_generic_prompts(cfg, model, tok, all_rows)
    ppls = sorted(json.loads(line)["perplexity"] for line in all_rows.read_text().splitlines())
    cut = (ppls[3] + ppls[4]) / 2
    cfg = data_cfg(tmp_path, **{"perplexity.threshold": cut})
    out = tmp_path / "cut.jsonl"
    s = build_generic_prompts(cfg, model, tok, out)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 4 and s["n_dropped_threshold"] == len(ppls) - 4
    assert all(r["perplexity"] <= cut for r in rows)
    cfg = data_cfg(tmp_path, **{"perplexity.threshold": 1.0})
    with pytest.raises(DataError, match="dropped by the perplexity threshold"):
        build_generic_prompts(cfg, model, tok, tmp_path / "none.jsonl")


# ----------------------------------------------------------------------------- constraints

def test_constraints_built_as_specified(tmp_path, tiny_gpt2):
    from i2d2.decoding import ConstraintSet

    model, tok = tiny_gpt2
    cfg = data_cfg(tmp_path, nouns=("child",), goals=("get better at chess",),
                   related=[{"concept": "get better at chess", "kind": "goal", "related": ["strategy"]}],
                   **{"perplexity.threshold": None})
    out = tmp_path / "p.jsonl"
    s = build_generic_prompts(cfg, model, tok, out)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert s["n_with_related"] == 4 and len(rows) == 3 + 4 + 4  # related: both plain and related prompts
    fw, conn = list(cfg.constraints.function_words), list(cfg.constraints.connectives)
    assert all(isinstance(w, str) for w in fw + conn) and {"on", "no", "the following"} <= set(fw + conn)
    for r in rows:
        d = r["constraints"]
        cs = ConstraintSet.from_dict(d)  # round-trips through the datasets JSON table
        assert ConstraintSet.from_dict(cs.to_dict()).to_dict() == d
        counts = {c["name"]: c for c in d["counts"]}
        assert counts["function_words"]["max_count"] == 1 and counts["function_words"]["words"] == fw
        assert counts["connectives"]["max_count"] == 0 and counts["connectives"]["words"] == conn
        clauses = {c["name"]: c for c in d["clauses"]}
        neg = {c["literals"][0]["text"] for c in d["clauses"] if not c["literals"][0]["positive"]}
        if r["kind"] == "noun":
            assert neg == {"child", "children", r["relation"]}
        else:
            assert neg == {"get better at chess", r["relation"].lower()}
        if r["related"]:
            lits = clauses["related:strategy"]["literals"]
            assert {lit["text"] for lit in lits} == {"strategy", "strategies"} and all(lit["positive"] for lit in lits)
        else:
            assert not any(n.startswith("related:") for n in clauses)


@pytest.mark.parametrize("concept, related, kept", [
    ("dog", "hot dog", set()),              # "dog" is forbidden, so "hot dog(s)" can never be written
    ("bread", "salt and pepper", set()),    # the connective "and" has max_count 0
    ("dog", "cat", {"cat", "cats"}),
    ("table", "cup of tea", {"cup of tea", "cups of tea"}),  # "of" is a function word: one is allowed
    ("table", "bottle of the wine", set()),   # "of" and "the": two function words where one is allowed
])
def test_a_related_form_that_holds_a_forbidden_word_is_not_required(concept, related, kept):
    """validate refuses a clause whose every literal is forbidden; the prompt builder must not make one (it was
    a DataError stopping generation)."""
    from i2d2.decoding import ConstraintSet
    from i2d2.decoding.constraints import validate
    from i2d2.prompts import Variant, build_constraints

    cfg = OmegaConf.load(ROOT / "conf/data/generics.yaml").constraints
    v = Variant(f"A {concept} is", Concept(concept), "is", "A {concept} is", concept, None, "a", "sg")
    d = build_constraints(v, related, cfg)
    validate(ConstraintSet.from_dict(d))
    req = [c for c in d["clauses"] if c["name"].startswith("related:")]
    assert {lit["text"] for c in req for lit in c["literals"]} == kept


# ----------------------------------------------------------------------------- concept loaders

def test_malformed_lines_reported_with_line_numbers(tmp_path):
    p = tmp_path / "c.txt"
    p.write_text("# comment\nbicycle\n\n???\nred\tapple\nkitchen table\n" + "very " * 9 + "long\n")
    errors = []
    cs = load_lines(p, on_error="skip", errors=errors)
    assert [c.text for c in cs] == ["bicycle", "kitchen table"]
    assert [e.split(": ")[0] for e in errors] == [f"{p}:4", f"{p}:5", f"{p}:7"]
    assert "tab" in errors[1] and "max_words" in errors[2]
    with pytest.raises(DataError, match=rf"{p}:4: not a noun phrase"):
        load_lines(p, on_error="raise")

    j = tmp_path / "c.jsonl"
    j.write_text('{"concept": "hotel", "related": ["credit card"]}\n{"concept": \n{"kind": "noun"}\n'
                 '{"concept": "run", "kind": "verb"}\n{"concept": "cup", "related": 3}\n'
                 '{"concept": "goal x", "kind": "goal"}\n')
    errors = []
    cs = load_jsonl(j, errors=errors)
    assert [(c.text, c.kind, c.related) for c in cs] == [("hotel", "noun", ["credit card"]), ("goal x", "goal", [])]
    assert [e.split(": ")[0] for e in errors] == [f"{j}:{n}" for n in (2, 3, 4, 5)]
    with pytest.raises(DataError, match=rf"{j}:2:"):
        load_jsonl(j, on_error="raise")


def test_load_concepts_from_config_skip_or_raise(tmp_path):
    cfg = data_cfg(tmp_path, nouns=("umbrella", "!!", "child", "umbrella"), goals=("bake bread",))
    errors = []
    cs = load_concepts(cfg, errors)
    assert [c.text for c in cs] == ["umbrella", "child", "bake bread"]  # de-duplicated
    assert len(errors) == 1 and errors[0].startswith(f"{tmp_path / 'nouns.txt'}:2:")
    cfg.on_error = "raise"
    with pytest.raises(DataError, match="nouns.txt:2"):
        load_concepts(cfg)


def test_heldout_concepts_never_reach_the_loops_prompts(tmp_path):
    """task.heldout's concepts are evaluation only: a data source that also lists them (the paper preset's full
    lists do) must not prompt, keep, label or fine-tune on them."""
    from i2d2.prompts import heldout_keys, prompt_candidates

    cfg = data_cfg(tmp_path, nouns=("umbrella", "child", "ladder"), goals=("bake bread", "plant a tree"))
    held = heldout_keys({"nouns": ["Umbrella", "ladder"], "goals": ["plant a tree"]})
    assert {c.text for c in prompt_candidates(cfg).concepts} >= {"umbrella", "ladder", "plant a tree"}
    kept = prompt_candidates(cfg, exclude=held)
    assert [c.text for c in kept.concepts] == ["child", "bake bread"]
    assert all("umbrella" not in t.lower() and "ladder" not in t.lower() for t in kept.to_score())


def test_genericskb_tsv_loader():
    errors = []
    cs = load_genericskb(FIX / "genericskb_small.tsv", errors=errors, min_statements=5)
    # bicycle (6) and kettle (5) have >= 5 generic sentences; tiger (4) and orpiment (1) do not
    assert [c.text for c in cs] == ["bicycle", "kettle"]
    assert [e.rsplit("/", 1)[1].split(": ")[0] for e in errors] == ["genericskb_small.tsv:5", "genericskb_small.tsv:11"]
    assert "columns" in errors[0] and "not a noun phrase" in errors[1]
    assert [c.text for c in load_genericskb(FIX / "genericskb_small.tsv", min_statements=4)] == \
        ["bicycle", "kettle", "tiger"]
    with pytest.raises(DataError, match="genericskb_small.tsv:5"):
        load_genericskb(FIX / "genericskb_small.tsv", on_error="raise")


def test_conceptnet_csv_loader():
    errors = []
    cs = load_conceptnet(FIX / "conceptnet_small.csv", errors=errors, targets=["artifact", "person"])
    assert [(c.text, c.related) for c in cs] == [("hammer", ["nail", "carpenter"]), ("teacher", ["school"]),
                                                 ("credit card", []), ("wrench", [])]
    assert [e.rsplit("/", 1)[1].split(": ")[0] for e in errors] == ["conceptnet_small.csv:8", "conceptnet_small.csv:11"]
    with pytest.raises(DataError, match="conceptnet_small.csv:8"):
        load_conceptnet(FIX / "conceptnet_small.csv", on_error="raise")


def test_bundled_default_concepts_load_cleanly():
    cfg = OmegaConf.load(ROOT / "conf/data/generics.yaml")
    errors = []
    cs = load_concepts(cfg, errors)
    assert errors == []
    nouns = [c for c in cs if c.kind == "noun"]
    goals = [c for c in cs if c.kind == "goal"]
    assert len(nouns) >= 250 and len(goals) >= 100
    assert any(c.related for c in goals) and any(c.related for c in nouns)


def test_prompt_scoring_resumes_after_kill(tmp_path, tiny_gpt2, monkeypatch):
    import i2d2.perplexity as P

    model, tok = tiny_gpt2
    cfg = data_cfg(tmp_path, **{"perplexity.threshold": None, "perplexity.chunk_size": 16})
    ref = tmp_path / "ref.jsonl"
    build_generic_prompts(cfg, model, tok, ref)
    real, calls = P.perplexity, []

    def dying(*a, **k):
        calls.append(len(a[2]))
        if len(calls) == 3:
            raise KeyboardInterrupt("simulated kill")
        return real(*a, **k)

    monkeypatch.setattr(P, "perplexity", dying)
    out = tmp_path / "p" / "prompts.jsonl"
    with pytest.raises(KeyboardInterrupt):
        build_generic_prompts(cfg, model, tok, out)
    assert not out.exists() and len(list((out.parent / ".prompts.jsonl.ppl").glob("chunk-*.npy"))) == 2
    calls.clear()
    monkeypatch.setattr(P, "perplexity", lambda *a, **k: calls.append(len(a[2])) or real(*a, **k))
    s = build_generic_prompts(cfg, model, tok, out)
    assert len(calls) == -(-s["n_variants"] // 16) - 2  # only the unscored chunks
    assert out.read_text() == ref.read_text()


def test_forms_selection_builds_one_prompt_per_pair_without_a_perplexity_pass(tmp_path, tiny_gpt2, monkeypatch):
    from i2d2 import prompts as P

    cfg = data_cfg(tmp_path, prompt_selection="forms", **{"perplexity.threshold": None})
    cfg.prompt_forms = ["adverb+bare_plural", "adverb+indefinite"]
    monkeypatch.setattr(P, "score_texts", lambda *a, **k: (_ for _ in ()).throw(AssertionError("perplexity pass")))
    out = tmp_path / "p.jsonl"
    summary = P.build_generic_prompts(cfg, *tiny_gpt2, out)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    nouns = [r for r in rows if r["kind"] == "noun"]
    assert len(nouns) == 2 * 3 and summary["prompt_selection"] == "forms"  # 2 nouns x 3 phrases, one form each
    assert {r["form"] for r in nouns} <= {"adverb+bare_plural", "adverb+indefinite"}
    assert "Generally, umbrellas are" in {r["prompt"] for r in nouns} and "Generally, an umbrella is" in {
        r["prompt"] for r in nouns}
    assert all(r["perplexity"] is None for r in rows)


def test_the_prompts_log_line_counts_what_was_built_and_skipped(tmp_path, tiny_gpt2, caplog):
    # it printed the variants left after one form per pair was kept as the variants built, and the pairs with none
    # of the listed forms were dropped without a word
    import logging

    from i2d2 import prompts as P

    cfg = data_cfg(tmp_path, prompt_selection="forms", **{"perplexity.threshold": None})
    cfg.prompt_forms = ["adverb+bare_plural"]  # the goal pairs are built, and a noun pair lacking it is skipped
    cand = P.prompt_candidates(cfg)
    with caplog.at_level(logging.INFO, logger="i2d2.prompts"):
        summary = P.build_generic_prompts(cfg, *tiny_gpt2, tmp_path / "p.jsonl", candidates=cand)
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("prompts: "))
    pairs = summary["n_pairs"] + summary["n_pairs_without_form"]
    assert cand.n_built > summary["n_variants"] == summary["n_pairs"]
    assert f"-> {pairs} pairs ({cand.n_built} variants built;" in line, line
    assert f"-> {summary['n_variants']} variants" in line and f"-> {summary['n_prompts']} prompts" in line, line
    assert (f"{summary['n_pairs_without_form']} pairs have none of those forms" in line) == \
        (summary["n_pairs_without_form"] > 0), line


def test_a_function_word_listed_twice_counts_once_for_a_related_form():
    from i2d2.prompts import Variant, build_constraints

    cfg = {"function_words": ["of", "Of"], "max_function_words": 1, "connectives": ["and"]}
    v = Variant("Generally, dogs can", Concept("dog"), "can", "{concept} can", "dogs", None, None, "pl")
    names = [c["name"] for c in build_constraints(v, "cup of tea", cfg)["clauses"]]
    assert "related:cup of tea" in names
