"""NeuroComparatives: mass nouns, the entity-frequency filter (§2.1.3), undefined metrics and the
ComparativeQA evaluation (§4.3)."""

import json

import numpy as np
import pandas as pd
import pytest

from i2d2.comparatives.entities import Entity, is_mass_noun, load_classes, pluralize
from i2d2.comparatives.frequency import FrequencyFilter, corpus_counts, filter_obscure, wordfreq_counts
from i2d2.comparatives.metrics import corpus_metrics, fmt, relation_entropy
from i2d2.comparatives.prompts import make_pairs, prompt_rows
from i2d2.comparatives.qa import export_qa
from i2d2.comparatives.qa_eval import (QAEvalConfig, UnbalancedAnswersError, answer_balance, evaluate_qa,
                                       shot_prefixes)
from i2d2.comparatives.wordlists import load_wordlists
from i2d2.io import DataError


@pytest.fixture(scope="module")
def wl():
    return load_wordlists()


@pytest.fixture()
def substances(tmp_path):
    path = tmp_path / "substances.json"
    path.write_text(json.dumps({
        "metal": ["gold", "silver", "aluminum", "steel beam"],
        "grain": ["rice", "barley"],
        "cheese": ["cheddar", "brie", {"name": "cheese wheel", "plural": "cheese wheels"}],
        "container": [{"name": "tin", "plural": True}, "jar", {"name": "cheese", "plural": False}],
    }))
    return load_classes(path)


# ----------------------------------------------------------------------------- mass nouns

def test_mass_nouns_stay_singular_in_prompts_and_take_singular_verbs(substances, wl):
    forms = {e.name: e.plural for ents in substances.values() for e in ents}
    assert [forms[n] for n in ("gold", "silver", "aluminum", "rice", "barley", "cheddar")] == \
        ["gold", "silver", "aluminum", "rice", "barley", "cheddar"]
    assert forms["steel beam"] == "steel beams"      # the head noun counts
    assert forms["tin"] == "tins" and forms["cheese"] == "cheese"  # per-entity overrides beat the lexicon
    assert forms["jar"] == "jars" and forms["cheese wheel"] == "cheese wheels"
    pairs = make_pairs(substances)
    prompts = set(pairs.prompt)
    assert {"Compared to gold, silver", "Compared to rice, barley", "Compared to silver, aluminum",
            "Compared to gold, steel beams", "Compared to cheddar, brie"} <= prompts
    assert not any(w in p for p in prompts for w in ("golds", "silvers", "aluminums", "rices", "barleys", "cheddars"))
    rows = prompt_rows(pairs, [("are", "generally"), ("have", "typically"), ("can", "often")], wl)
    by_pair = {}
    for r in rows:
        by_pair.setdefault(r["pair_id"], []).append(r["aux"])
    assert by_pair["gold | silver"] == ["is", "has", "can"]            # 'silver is generally ...'
    assert by_pair["gold | steel beam"] == ["are", "have", "can"]      # 'steel beams are ...'
    clauses = next(r for r in rows if r["pair_id"] == "rice | barley")["constraints"]["clauses"]
    assert [[lit["text"] for lit in c["literals"]] for c in clauses] == [["is"], ["generally"]]


def test_mass_noun_lexicon_and_pluralize():
    assert is_mass_noun("gold") and is_mass_noun("stainless steel") and is_mass_noun("Basmati rice")
    assert not is_mass_noun("rice cooker") and not is_mass_noun("blender")
    assert pluralize("rice") == "rice" and pluralize("rice cooker") == "rice cookers"
    assert Entity("gold", "gold", "metal").countable is False and Entity("car", "cars", "x").countable is True


@pytest.mark.parametrize("name, plural, mass, forms", [
    ("cup of tea", "cups of tea", False, ("cup of tea", "cups of tea")),      # the head "cup" counts, not "tea"
    ("bag of rice", "bags of rice", False, ("bag of rice", "bags of rice")),
    ("pair of scissors", "pairs of scissors", False, ("pair of scissors", "pairs of scissors")),
    ("cream of tartar", "cream of tartar", True, None),                        # a mass head stays singular
    ("glass of water", "glasses of water", False, ("glass of water", "glasses of water")),
])
def test_an_of_phrase_takes_its_number_from_its_head(name, plural, mass, forms):
    from i2d2.concepts import Concept
    from i2d2.prompts import noun_forms, noun_kind

    assert pluralize(name) == plural and is_mass_noun(name) is mass
    c = Concept(name)
    assert noun_kind(c, noun_forms(c)) == ("mass" if mass else "count")
    if forms:
        assert noun_forms(c) == forms
    from i2d2.comparatives.entities import is_plural_only

    assert not is_plural_only(plural)  # 'glasses of water' is a glass's plural, not the eyewear


@pytest.mark.parametrize("name, kind", [
    ("sheep of the hills", "count"),        # a zero plural head: "a sheep of the hills", not plural-only by its "s"
    ("fish of the rivers", "count"),
    ("scissors of steel", "plural_only"),   # an invariant head in -s: no "a scissors of steel"
    ("sheep", "count"), ("scissors", "plural_only"), ("cup of tea", "count"),
])
def test_an_of_phrase_is_invariant_in_s_by_its_head(name, kind):
    from i2d2.concepts import Concept
    from i2d2.prompts import noun_forms, noun_kind

    c = Concept(name)
    assert noun_kind(c, noun_forms(c)) == kind


def test_plural_override_must_be_string_or_bool(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"metal": ["gold", {"name": "silver", "plural": 3}]}))
    with pytest.raises(DataError, match="c.json: class 'metal' entity 1: 'plural' must be"):
        load_classes(path)


# ----------------------------------------------------------------------------- entity frequency (§2.1.3)

def _ents(*names):
    return [Entity(n, pluralize(n), "c") for n in names]


def test_wordfreq_counts_scale_with_the_corpus_and_sum_singular_and_plural():
    ents = _ents("car", "blender", "zqxwv gadget")
    small, big = wordfreq_counts(ents, 1e6), wordfreq_counts(ents, 1e9)
    assert np.allclose(big, small * 1000)
    from wordfreq import word_frequency
    assert big[0] == pytest.approx((word_frequency("car", "en") + word_frequency("cars", "en")) * 1e9)
    assert big[0] > big[1] > 0 and big[2] == 0  # a made-up word never occurs
    assert FrequencyFilter(min_count=100, corpus_words=1e9).min_zipf == pytest.approx(2.0)


def test_filter_drops_obscure_entities_then_small_classes():
    classes = {"appliance": _ents("blender", "toaster", "zqxwv tapper"),
               "gadget": _ents("microwave", "prensqx ironing")}
    out, summary = filter_obscure(classes, FrequencyFilter(min_count=100, corpus_words=7e9))
    assert [e.name for e in out["appliance"]] == ["blender", "toaster"]
    assert "gadget" not in out  # one entity left: no pair to make
    assert summary["dropped_entities"] == ["prensqx ironing", "zqxwv tapper"]
    assert summary["dropped_classes"] == ["gadget"] and summary["n_entities_out"] == 2
    # a stricter threshold drops the rarer entity too
    strict, _ = filter_obscure(classes, FrequencyFilter(min_count=1e6, corpus_words=7e9))
    assert strict == {}


def test_corpus_source_counts_phrases_exactly(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("I bought a food processor and two blenders.\nThe Blender broke; food  processors are loud.\n"
                      "A home keg tapper.\n")
    ents = _ents("food processor", "blender", "keg tapper", "kettle")
    assert corpus_counts(ents, corpus).tolist() == [2, 2, 1, 0]
    out, s = filter_obscure({"kitchen": ents}, FrequencyFilter(source=str(corpus), min_count=2))
    assert [e.name for e in out["kitchen"]] == ["food processor", "blender"] and s["min_zipf"] is None
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        corpus_counts(ents, tmp_path / "nope.txt")


# ----------------------------------------------------------------------------- undefined metrics

def test_undefined_metrics_are_none_and_print_as_a_dash(wl):
    df = pd.DataFrame({"pair_id": ["a"], "text": ["are nice."], "statement": ["Compared to x, y are nice."]})
    assert relation_entropy(df["text"], wl.comparatives) is None
    m = corpus_metrics(df, wl.comparatives)
    assert m["relation_entropy"] is None and m["self_bleu_2"] is None and m["n_relations"] == 0
    assert corpus_metrics(df.iloc[:0], wl.comparatives)["relation_entropy"] is None
    one = pd.Series(["are cheaper.", "are cheaper."])
    assert relation_entropy(one, wl.comparatives) == 0.0  # defined: a single relation has zero entropy
    assert fmt(None) == "\u2013" and fmt(float("nan")) == "\u2013" and fmt(0.0) == "0.000"


# ----------------------------------------------------------------------------- ComparativeQA evaluation

def _qa(n=6, seed=0):
    rows = [{"statement": f"Compared to cars{i}, bikes{i} are generally cheaper.", "plural1": f"cars{i}",
             "plural2": f"bikes{i}"} for i in range(n)]
    return export_qa(rows, balance=True, seed=seed)


def test_export_balances_the_answer_key_exactly():
    for n in (1, 2, 7, 40):
        counts = answer_balance(_qa(n))["counts"]
        assert abs(counts["A"] - counts["B"]) <= 1
    skewed = export_qa([{"statement": "Compared to a, b are cheaper."}] * 10, balance=False)
    assert answer_balance(skewed)["balanced"] is False


def test_unbalanced_answer_key_is_refused_or_warned(tiny_gpt2, caplog):
    model, tok = tiny_gpt2
    skewed = export_qa([{"statement": f"Compared to a{i}, b{i} are cheaper."} for i in range(8)], balance=False)
    with pytest.raises(UnbalancedAnswersError, match=r"unbalanced \{'A': 0, 'B': 8\}"):
        evaluate_qa(model, tok, skewed)
    metrics, _ = evaluate_qa(model, tok, skewed, QAEvalConfig(on_unbalanced="warn"))
    assert "unbalanced" in caplog.text and metrics["majority_baseline"] == 1.0


def test_qa_accuracy_follows_option_log_likelihoods(tiny_gpt2):
    from i2d2.perplexity import sequence_nll

    model, tok = tiny_gpt2
    items = _qa(6)
    for target, norm in (("text", "char"), ("letter", "none"), ("text", "token")):
        cfg = QAEvalConfig(target=target, length_norm=norm)
        metrics, rows = evaluate_qa(model, tok, items, cfg)
        # recompute one item's scores by hand from the LM
        q = items[0]
        ctx = f"Question: {q['question']} A. {q['options']['A']} B. {q['options']['B']} Answer:"
        conts = [f" {a}" if target == "letter" else f" {q['options'][a]}" for a in ("A", "B")]
        nll, ntok = sequence_nll(model, tok, [ctx + c for c in conts], prefixes=[ctx, ctx])
        den = {"none": [1, 1], "token": ntok, "char": [len(c.strip()) for c in conts]}[norm]
        assert [rows[0]["scores"]["A"], rows[0]["scores"]["B"]] == pytest.approx(list(-nll / np.array(den)), rel=1e-4)
        pred = np.array([r["prediction"] for r in rows])
        gold = np.array([r["answer"] for r in rows])
        assert metrics["accuracy"] == pytest.approx(float((pred == gold).mean()))
        assert metrics["predicted_A_share"] == pytest.approx(float((pred == "A").mean()))
        assert metrics["n"] == 6 and metrics["answer_counts"] == {"A": 3, "B": 3}
    empty, _ = evaluate_qa(model, tok, [])
    assert empty["accuracy"] is None and empty["majority_baseline"] is None


def test_few_shot_prefixes_share_no_entity_with_the_item():
    items = _qa(6)
    prefixes = shot_prefixes(items, 2, seed=1)
    for q, p in zip(items, prefixes):
        assert p.count("Question:") == 2 and q["options"]["A"] not in p and q["options"]["B"] not in p
    with pytest.raises(DataError, match="6-shot needs 6 items"):
        shot_prefixes(items, 6)


def test_qa_eval_cli(tmp_path, capsys):
    from i2d2.comparatives.qa_eval import main
    from i2d2.io import write_jsonl

    path = tmp_path / "qa.jsonl"
    write_jsonl(path, _qa(4))
    out = tmp_path / "res.json"
    assert main(["--qa", str(path), "--model", "tiny:gpt2", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["metrics"]["n"] == 4 and len(res["predictions"]) == 4
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main(["--qa", str(empty), "--model", "tiny:gpt2"]) == 2
    assert "empty.jsonl has no items" in capsys.readouterr().err


def test_benchmark_items_are_the_true_rows_split_by_their_prompt(tmp_path):
    from critics.data import load_annotations
    from i2d2.comparatives.qa import benchmark_qa

    rows = [{"statement": "Compared to pruning shears, garden hoses are generally cheaper.", "label": "True",
             "concept": "pruning shear | garden hose", "prompt": "Compared to pruning shears, garden hoses"},
            {"statement": "Compared to wasps, dragonflies typically have a shorter lifespan.", "label": "False",
             "concept": "wasp | dragonfly", "prompt": "Compared to wasps, dragonflies"},
            {"statement": "Compared to wool sweaters, velvet dresses are generally more expensive.", "label": "True",
             "concept": "wool sweater | velvet dress", "prompt": "Compared to wool sweaters, velvet dresses"}]
    path = tmp_path / "labels.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    label_map = {"true": 1, "false": 0}
    items = benchmark_qa(load_annotations([path], label_map), balance=True, seed=0)
    assert [i["comparative"] for i in items] == [rows[0]["statement"], rows[2]["statement"]]  # the true rows only
    first = items[0]
    assert first["question"] == "Which of the following are generally cheaper?"
    assert set(first["options"].values()) == {"pruning shears", "garden hoses"}  # multi-word entities kept whole
    assert first["options"][first["answer"]] == "garden hoses"
    assert sorted(i["answer"] for i in items) == ["A", "B"]  # balanced
    rows[2]["prompt"] = ""  # a true row without its prompt cannot be split exactly: named, not guessed
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match=r"labels\.jsonl:3: a ComparativeQA benchmark item needs its prompt"):
        benchmark_qa(load_annotations([path], label_map))
