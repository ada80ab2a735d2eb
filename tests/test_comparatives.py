"""NeuroComparatives: entities, prompts, constraint passes, the four filters, QA export, metrics."""

import json
import math

import numpy as np
import pandas as pd
import pytest

from i2d2.comparatives import filters as F
from i2d2.comparatives.entities import load_classes, pluralize
from i2d2.comparatives.metrics import pair_self_bleu, relation_entropy, relation_phrases
from i2d2.comparatives.prompts import make_pairs, perplexity_filter, select_passes
from i2d2.comparatives.qa import export_qa, to_qa
from i2d2.comparatives.wordlists import load_wordlists
from i2d2.io import DataError


@pytest.fixture(scope="module")
def wl():
    return load_wordlists()


# ----------------------------------------------------------------------------- word lists (Tables 5, 6, 8, 9)

def test_passes_are_the_aux_times_adverb_grid_of_tables_5_and_6(wl):
    passes = wl.passes()
    assert len(passes) == 30 and len(set(passes)) == 30
    # Table 5 words, Table 6 order: first (have, typically), then have-often, have-always ... last (would, normally)
    assert {"have", "need", "may", "are", "would"} <= set(wl.aux_verbs)
    assert wl.adverbs == ["typically", "often", "always", "generally", "normally"]
    assert passes[:3] == [("have", "typically"), ("have", "often"), ("have", "always")]
    assert passes[-1] == ("would", "normally")
    small = select_passes(wl, 5)
    assert len(set(small)) == 5 and len({a for a, _ in small}) == 5 and len({d for _, d in small}) == 5
    assert select_passes(wl, None) == passes


def test_table_8_comparatives_and_table_9_negatives(wl):
    assert len(wl.comparatives) == 290 and len(set(wl.comparatives)) == 290
    for w in ("cheaper", "more", "less", "fewer", "heavier", "quirkier", "nimbler", "littler"):
        assert w in wl.comparatives
    assert set(wl.negatives) == {"punctuation", "pronouns", "connectives"}
    assert {"I", "you", "he", "he.", "They", "we", "my", "think"} <= set(wl.negatives["pronouns"])
    assert {"than", "and", "because", "however", "the following", "by now", "not", "no"} <= set(wl.negatives["connectives"])
    assert {";", "(", ")", "?", "!", "\""} <= set(wl.negatives["punctuation"])
    assert "." not in wl.negatives["punctuation"]  # statements still end with a full stop


def test_wordlist_errors_name_the_file_and_field(tmp_path):
    bad = tmp_path / "wl.yaml"
    bad.write_text("aux_verbs: [have, have]\nadverbs: [often]\ncomparatives: [more]\nnegatives: {p: [';']}\n")
    with pytest.raises(DataError, match=r"wl.yaml: field 'aux_verbs' repeats"):
        load_wordlists(bad)


# ----------------------------------------------------------------------------- entities

def test_bundled_classes_are_tens_of_classes_hundreds_of_entities():
    classes = load_classes()
    assert len(classes) >= 30
    assert sum(len(v) for v in classes.values()) >= 300
    ents = {e.name: e for v in classes.values() for e in v}
    assert ents["food processor"].plural == "food processors"
    assert ents["cherry"].plural == "cherries" and ents["knife"].plural == "knives"
    assert ents["tongs"].plural == "tongs"  # file override beats inflect


def test_json_tsv_and_wikidata_loaders(tmp_path):
    (tmp_path / "c.json").write_text(json.dumps({"fruit": ["cherry", {"name": "peach", "plural": "peaches"}],
                                                 "lonely": ["moon"]}))
    c = load_classes(tmp_path / "c.json")
    assert list(c) == ["fruit"]  # a class needs two entities
    assert [e.plural for e in c["fruit"]] == ["cherries", "peaches"]

    (tmp_path / "c.tsv").write_text("class\tentity\n# comment\nappliance\tblender\nappliance\tfood processor\n"
                                    "appliance\tmouse\tcomputer mice\n")
    c = load_classes(tmp_path / "c.tsv")
    assert [e.plural for e in c["appliance"]] == ["blenders", "food processors", "computer mice"]
    (tmp_path / "bad.tsv").write_text("appliance\tblender\nappliance\n")
    with pytest.raises(DataError, match=r"bad.tsv:2:"):
        load_classes(tmp_path / "bad.tsv")

    # Wikidata-style: physical object > artificial object > home appliance > kitchen appliance > {blender, ...}
    rows = ["id\tlabel\tproperty\tparent",
            "Q2\tartificial object\tP279\tQ1",
            "Q3\thome appliance\tP279\tQ2",
            "Q4\tkitchen appliance\tP279\tQ3",       # depth 3: beyond max_depth=2 as a class
            "Q5\tblender\tP279\tQ4",
            "Q6\tfood processor\tP279\tQ4",
            "Q7\twashing machine\tP279\tQ3",
            "Q8\tvacuum cleaner\tP31\tQ3",
            "Q9\tchair\tP31\tQ2",
            "Q1\tphysical object\tsubclass_of\tQ0"]
    (tmp_path / "wd.tsv").write_text("\n".join(rows) + "\n")
    c = load_classes(tmp_path / "wd.tsv", wikidata_roots=["physical object"], wikidata_depth=2)
    assert set(c) == {"artificial object", "home appliance"}
    assert {e.name for e in c["home appliance"]} == {"kitchen appliance", "washing machine", "vacuum cleaner"}
    assert {e.name for e in c["artificial object"]} == {"home appliance", "chair"}
    c3 = load_classes(tmp_path / "wd.tsv", wikidata_roots=["Q1"], wikidata_depth=3)
    assert {e.plural for e in c3["kitchen appliance"]} == {"blenders", "food processors"}
    with pytest.raises(DataError, match="root class 'furniture' not found"):
        load_classes(tmp_path / "wd.tsv", wikidata_roots=["furniture"])


# ----------------------------------------------------------------------------- prompts

def test_prompts_use_plural_entities_within_a_class():
    classes = load_classes()
    pairs = make_pairs({"fruit": classes["fruit"][:4], "road vehicle": classes["road vehicle"][:2]})
    assert len(pairs) == 6 + 1
    row = pairs.loc[pairs.pair_id == "cherry | peach"].iloc[0]
    assert row.prompt == "Compared to cherries, peaches" and row["class"] == "fruit"
    assert pluralize("graham cracker") == "graham crackers"
    both = make_pairs({"fruit": classes["fruit"][:3]}, both_orders=True)
    assert len(both) == 6 and {"Compared to cherries, apples", "Compared to apples, cherries"} <= set(both.prompt)


def test_perplexity_filter_drops_the_worst_30_percent(tiny_gpt2):
    from i2d2.perplexity import perplexity

    pairs = pd.DataFrame({"prompt": [f"Compared to p{i}, q{i}" for i in range(10)]})
    out = perplexity_filter(pairs, np.arange(10.0)[::-1], 0.3)   # prompt 0 has the highest perplexity
    assert out["kept"].tolist() == [False] * 3 + [True] * 7
    model, tok = tiny_gpt2
    texts = ["Compared to dogs, cats", "Compared to cars, motorcycles", "zx qq vv ww", "Compared to pens, pencils"]
    ppl = perplexity(model, tok, texts, per="word")
    out = perplexity_filter(pd.DataFrame({"prompt": texts}), ppl, 0.25)
    assert out["kept"].sum() == 3 and not out.loc[out.perplexity.idxmax(), "kept"]


# ----------------------------------------------------------------------------- filters

def _gens(rows):
    df = pd.DataFrame(rows, columns=["pair_id", "text", "score", "aux", "adverb", "comparative"])
    return df.assign(statement="Compared to cars, motorcycles " + df["text"])


def test_dedup_keeps_the_best_score_per_cluster_of_near_duplicates():
    df = _gens([("a", "are cheaper.", -1.0, "are", None, "cheaper"),
                ("a", "are much cheaper.", -0.5, "are", None, "cheaper"),
                ("a", "have fewer wheels.", -2.0, "have", None, "fewer"),
                ("b", "are cheaper.", -3.0, "are", None, "cheaper")])
    emb = np.array([[1.0, 0.0], [0.99, 0.05], [0.0, 1.0], [1.0, 0.0]])
    out = F.dedup(df, emb, distance_threshold=0.1)
    # rows 0 and 1 merge (keep the better S, row 1); row 2 stays; pair b is clustered on its own
    assert sorted(out.index) == [1, 2, 3]
    assert out["cluster"].nunique() == 3


def test_dedup_with_minilm_merges_paraphrases():
    from i2d2.models import load_sentence_encoder

    texts = ["are typically cheaper to buy.", "are typically cheaper to purchase.",
             "generally have fewer moving parts.", "can often carry more passengers."]
    df = _gens([("a", t, s, None, None, None) for t, s in zip(texts, [-1.0, -0.8, -1.2, -1.5])])
    emb = load_sentence_encoder().encode(texts, normalize_embeddings=True)
    out = F.dedup(df, emb, distance_threshold=0.15)
    assert sorted(out.index) == [1, 2, 3]


@pytest.fixture(scope="module")
def minilm():
    from i2d2.models import load_sentence_encoder

    return load_sentence_encoder()


@pytest.fixture(scope="module")
def rule(wl):
    from critics.contradiction import load_contradiction_scorer

    return load_contradiction_scorer("offline", scales=wl.scales, comparatives=wl.comparatives)


def test_split_contradictions_moves_opposites_of_the_best_member_greedily():
    # one cluster of four, best first: 1 contradicts 0 (moved), 2 contradicts only 1 (stays with 0), 3 contradicts
    # 0 and 1 (moved, then moved again from 1's new cluster); another cluster of one is left alone
    c = np.zeros((5, 5), dtype=bool)
    for i, j in ((0, 1), (1, 2), (0, 3), (1, 3)):
        c[i, j] = c[j, i] = True
    out = F.split_contradictions(np.array([0, 0, 0, 0, 1]), c, np.array([4.0, 3.0, 2.0, 1.0, 0.0]))
    assert out[0] == out[2] and len({out[0], out[1], out[3], out[4]}) == 4


def test_dedup_keeps_opposites_within_the_embedding_threshold_apart_with_the_rule(minilm, rule):
    """MiniLM puts "larger" and "smaller" within 0.15: without the split only the better-scored reached the
    contradiction filter. A paraphrase of the best one (entailment, no contradiction) still merges."""
    texts = ["are generally larger.", "are generally smaller.", "are typically larger."]
    df = _gens([("a", t, s, None, None, None) for t, s in zip(texts, [-1.0, -1.2, -1.5])])
    emb = minilm.encode(texts, normalize_embeddings=True)
    assert float(1 - emb[0] @ emb[1]) < 0.15  # the case the split is for
    assert sorted(F.dedup(df, emb, 0.15).index) == [0]
    assert sorted(F.dedup(df, emb, 0.15, scorer=rule).index) == [0, 1]


def test_dedup_with_the_rule_still_merges_paraphrases(minilm, rule):
    texts = ["are typically cheaper to buy.", "are typically cheaper to purchase.",
             "generally have fewer moving parts.", "can often carry more passengers."]
    df = _gens([("a", t, s, None, None, None) for t, s in zip(texts, [-1.0, -0.8, -1.2, -1.5])])
    emb = minilm.encode(texts, normalize_embeddings=True)
    assert sorted(F.dedup(df, emb, 0.15, scorer=rule).index) == [1, 2, 3]


@pytest.mark.parametrize("split, kept", [(True, [0, 1]), (False, [0]), (None, [0])])  # None: a task file without it
def test_the_dedup_stage_reads_split_contradictions(monkeypatch, wl, split, kept):
    from omegaconf import OmegaConf

    import i2d2.models
    from i2d2.recipes.comparatives import _dedup_fn

    class Same:  # every statement at one point: one cluster unless the rule splits it
        def encode(self, texts, **_):
            return np.ones((len(texts), 2), dtype=np.float32) / np.sqrt(2)

    monkeypatch.setattr(i2d2.models, "load_sentence_encoder", lambda *a, **k: Same())
    fcfg = OmegaConf.create({"encoder": "packaged:minilm", "distance_threshold": 0.15, "linkage": "average",
                             "batch_size": 8, **({} if split is None else {"split_contradictions": split})})
    OmegaConf.set_struct(fcfg, True)  # as a composed config is: a missing key raises on attribute access
    df = _gens([("a", "are generally cheaper.", -1.0, None, None, None),
                ("a", "are generally more expensive.", -2.0, None, None, None)])
    assert sorted(_dedup_fn(fcfg, wl)(df).index) == kept


def test_split_contradictions_is_a_typed_key_in_the_dedup_fingerprint(monkeypatch):
    from hydra import compose, initialize_config_dir

    from critics.contradiction import ComparativeDirectionScorer
    from i2d2.config import CONF_DIR, ConfigTypeError, check_keys
    from i2d2.io import fingerprint
    from i2d2.recipes.comparatives import _fingerprinted_cfg

    def cfg(*overrides):
        with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
            return compose("train", overrides=["model=tiny_gpt2", "critic=tiny", "logger=none", "task=comparatives",
                                               *overrides])

    assert cfg().task.filters.dedup.split_contradictions is False  # measured: no gain, more contradictions kept
    with pytest.raises(ConfigTypeError, match=r"task\.filters\.dedup\.split_contradictions='maybe' \(expected true"):
        check_keys(cfg("task.filters.dedup.split_contradictions=maybe"))
    check_keys(cfg("experiment=paper_comparatives"))
    assert cfg("experiment=paper_comparatives").task.filters.dedup.split_contradictions is False

    def fp(split):
        return fingerprint(_fingerprinted_cfg("dedup", {"distance_threshold": 0.15, "split_contradictions": split}))

    on, off = fp(True), fp(False)
    assert on != off
    # off, the default: the fingerprint of a run made before the key existed
    assert off == fingerprint(_fingerprinted_cfg("dedup", {"distance_threshold": 0.15}))
    monkeypatch.setattr(ComparativeDirectionScorer, "REVISION", "another-reading", raising=False)
    assert fp(True) != on and fp(False) == off  # the rule's reading decides the split only when it splits


def test_constraint_groups_keep_the_best_score_per_aux_adverb_comparative():
    df = _gens([("a", "are typically cheaper.", -1.0, "are", "typically", "cheaper"),
                ("a", "are typically cheaper to run.", -0.7, "are", "typically", "cheaper"),
                ("a", "are typically lighter.", -2.0, "are", "typically", "lighter"),
                ("a", "are often cheaper.", -1.5, "are", "often", "cheaper"),
                ("b", "are typically cheaper.", -3.0, "are", "typically", "cheaper"),
                ("b", "are typically.", -0.1, "are", "typically", None),          # comparative unsatisfied
                ("b", "are typically bigger.", -0.2, "are", "typically", "Cheaper")])  # literal not in text
    out = F.constraint_groups(df)
    assert sorted(out.index) == [1, 2, 3, 4]
    kept_all = F.constraint_groups(df, require_satisfied=False)
    assert sorted(kept_all.index) == [1, 2, 3, 5, 6]  # unsatisfied rows form their own group


def test_contradiction_filter_removes_the_minority_direction(wl):
    from critics.contradiction import ComparativeDirectionScorer

    scorer = ComparativeDirectionScorer(wl.scales, wl.comparatives)
    df = _gens([("a", "are typically cheaper.", -1.0, "are", "typically", "cheaper"),
                ("a", "are generally less expensive.", -1.1, "are", "generally", "less"),
                ("a", "are often more affordable.", -1.3, "are", "often", "more"),
                ("a", "are often more expensive.", -0.5, "are", "often", "more"),
                ("b", "have fewer moving parts.", -0.9, "have", "typically", "fewer"),
                ("b", "have more moving parts.", -0.8, "have", "often", "more"),
                ("b", "are generally faster.", -1.2, "are", "generally", "faster")])
    out = F.contradiction_filter(df, scorer, k=None)
    # §2.3.3 "contradict others more often than not": 'more expensive' contradicts all 3 others -> dropped;
    # 'fewer' vs 'more moving parts' contradict 1 of their 2 others each -> both kept
    assert sorted(out.index) == [0, 1, 2, 4, 5, 6]
    assert out.loc[0, "n_agree"] == 2 and out.loc[0, "n_contradict"] == 1 and out.loc[0, "n_others"] == 3
    top2 = F.contradiction_filter(df, scorer, k=2)
    assert sorted(top2.index) == [0, 1, 4, 5]  # the two best S of each pair's survivors


def test_contradiction_thresholds_and_pairwise_interface(wl):
    from critics.contradiction import ComparativeDirectionScorer, PairwiseScorer, load_contradiction_scorer

    C = np.array([[0, 0.995, 0.5], [0.2, 0, 0], [0.98, 0, 0]])
    E = np.array([[0, 0, 0.9], [0, 0, 0.86], [0, 0.1, 0]])
    n_c, n_e = F.contradiction_counts(C, E, 0.99, 0.85)
    assert n_c.tolist() == [1, 1, 0] and n_e.tolist() == [1, 1, 2]

    s = load_contradiction_scorer("offline", scales=wl.scales, comparatives=wl.comparatives)
    assert isinstance(s, ComparativeDirectionScorer)
    c, e = s.scores(["Compared to cars, bikes are cheaper.", "Compared to cars, bikes are smaller."],
                    ["Compared to cars, bikes are more expensive.", "Compared to cars, bikes are littler."])
    assert c.tolist() == [1.0, 0.0] and e.tolist() == [0.0, 1.0]
    # the generic matrix (used by NLI scorers) agrees with the vectorised one
    texts = ["x are cheaper.", "x are pricier.", "x are heavier.", "x are lighter in weight."]
    Cm, Em = s.matrix(texts)
    Cg, Eg = PairwiseScorer.matrix(s, texts)
    assert np.array_equal(Cm, Cg) and np.array_equal(Em, Eg)
    assert Cm[0, 1] == 1 and Cm[2, 3] == 1 and Cm[0, 2] == 0


def test_nli_scorer_reads_label_indices(tiny_gpt2):
    from critics.contradiction import NLIScorer

    with pytest.raises(ValueError, match="cannot find 'contradiction'"):
        NLIScorer("tiny:roberta")
    s = NLIScorer("tiny:roberta", label_indices={"contradiction": 0, "entailment": 2})
    C, E = s.matrix(["cars are cheaper.", "cars are pricier.", "cars are red."])
    assert C.shape == (3, 3) and np.all(np.diag(C) == 0)
    assert np.all((C + E <= 1 + 1e-6) & (C >= 0))


def test_discriminator_cuts_are_top_fractions():
    df = pd.DataFrame({"statement": list("abcdefghij")})
    scores = np.linspace(0, 1, 10)
    cuts = F.discriminator_cuts(df, scores, {"nc_xl": 1.0, "nc_l": 0.5, "nc_s": 0.2})
    assert len(cuts["nc_xl"]) == 10 and len(cuts["nc_l"]) == 5 and len(cuts["nc_s"]) == 2
    assert cuts["nc_s"]["statement"].tolist() == ["j", "i"]
    assert cuts["nc_l"]["critic_score"].min() > cuts["nc_xl"]["critic_score"].median() - 1e-9


def test_cut_precision_on_labelled_rows_and_the_floor_warning():
    from critics.metrics import precision_at_top
    from critics.surface import floor_warning
    from i2d2.recipes.comparatives import _discriminator_lines

    y = np.array([1, 0, 1, 0, 0, 1, 0, 0, 0, 0])
    s = np.linspace(1, 0, 10)  # best first
    assert precision_at_top(y, s, 1.0) == (0.3, 10)
    assert precision_at_top(y, s, 0.2) == (0.5, 2) and precision_at_top(y, s, 0.25) == (2 / 3, 3)  # ceil, as the cuts
    for bad in (1.5, -0.1, float("nan")):  # 1.5 was an IndexError, -0.1 a precision of rows counted from the end
        with pytest.raises(ValueError, match=r"precision_at_top: fraction must be in \[0, 1\].*got"):
            precision_at_top(y, s, bad)
    assert precision_at_top(y[:0], s[:0], 0.5) == (None, 0)
    # a critic under the surface floor + 0.15 is flagged; one above it, or with an undefined AP, is not
    assert floor_warning(0.60, 0.46) and "0.600" in floor_warning(0.60, 0.46) and floor_warning(0.445, 0.555)
    assert floor_warning(0.62, 0.46) is None and floor_warning(None, 0.5) is None and floor_warning(0.9, None) is None
    assert floor_warning(float("nan"), 0.5) is None  # one class in the test split: AP undefined
    assert "less than 0.15 better than wording cues" in floor_warning(0.60, 0.46)  # above the floor, not enough
    assert "wording cues alone (length" in floor_warning(0.445, 0.555)  # below it
    # a high floor leaves less room than 0.15: half of it is asked for, so a perfect critic is never flagged
    assert floor_warning(1.0, 0.87) is None and floor_warning(0.90, 0.87) and floor_warning(0.94, 0.87) is None
    c = {"ap": 0.445, "surface_ap": 0.555, "test_valid_rate": 0.34, "n_train": 500, "n_dev": 100, "n_test": 148,
         "n_test_concepts": 30, "cuts_test": {"nc_s": {"precision": 0.4, "n_kept": 30, "ci95": [0.2459, 0.5768]}}}
    md = "\n".join(_discriminator_lines(c))
    assert "Warning: the discriminator's test AP 0.445 does not beat the surface-only floor 0.555" in md
    # a record from before the recall and fraction were kept: the row reads '–' for the recall, no fraction
    assert "| precision of the nc_s cut on test (kept; recall; 95 % interval) | 0.400 (30; recall –; 0.25–0.58) |" \
        in md
    assert "| 0.340 |" in md
    from i2d2.metrics import wilson_interval
    lo, hi = wilson_interval(15, 30)
    assert round(lo, 3) == 0.332 and round(hi, 3) == 0.668 and wilson_interval(0, 0) is None
    # the ends at k = 0 and k = n are exact (rounding put them at -2.8e-17 and 0.9999999999999999)
    assert all(wilson_interval(0, n)[0] == 0.0 and wilson_interval(n, n)[1] == 1.0 for n in range(1, 200))
    assert round(wilson_interval(0, 10)[1], 3) == 0.278 and round(wilson_interval(10, 10)[0], 3) == 0.722
    assert "Warning" not in "\n".join(_discriminator_lines(dict(c, ap=0.8)))
    # an AP near the share valid is a random ranking: the cuts are then said to be no better than keeping everything
    assert "ranks at chance" not in md
    chance = "\n".join(_discriminator_lines(dict(c, ap=0.422, test_valid_rate=0.448)))
    assert "Warning: the discriminator ranks at chance on test** (AP 0.422, share valid 0.448)" in chance
    # the report states the margin it applies: 0.15, or half the room left above a high floor
    assert "(must beat it by ≥ 0.15) | 0.555 |" in md
    assert "(must beat it by ≥ 0.07) | 0.870 |" in "\n".join(_discriminator_lines(dict(c, ap=0.95, surface_ap=0.87)))


def test_first_sentence_and_word_matching():
    s = F.first_sentence(pd.Series(["are cheaper. They are", "have more wheels", " are lighter!  x"]))
    assert s.tolist() == ["are cheaper.", "have more wheels", "are lighter!"]
    c = F.first_sentence(pd.Series(["are typically smaller, lighter, and faster.", "cost 1,000 more; yes", "are cheaper",
                                    "are cheaper, which makes them popular. x", "have more storage, more memory",
                                    "are typically found in kitchens, larger ones"]), at_clause=True)
    assert c.tolist() == ["are typically smaller, lighter, and faster.", "cost 1,000 more.", "are cheaper",
                          "are cheaper.", "have more storage, more memory", "are typically found in kitchens."]
    hit = F.contains_word(pd.Series(["are cheaper.", "are cheaper.", "are often-used"]),
                          pd.Series(["cheaper", "cheap", "often-used"]))
    assert hit.tolist() == [True, False, True]


# ----------------------------------------------------------------------------- QA export (App. E.2)

def test_qa_export_matches_appendix_e2():
    q = to_qa("Compared to graham crackers, kiwifruits can be considered healthier")
    assert q["text"] == ("Question: Which of the following can be considered healthier? "
                         "A. graham crackers B. kiwifruits Answer: B")
    assert q["options"] == {"A": "graham crackers", "B": "kiwifruits"} and q["answer"] == "B"
    q2 = to_qa("Compared to cars, trucks, and vans are bigger.", "cars, trucks", "and vans", swap=True)
    assert q2["text"] == "Question: Which of the following are bigger? A. and vans B. cars, trucks Answer: A"
    rows = [{"statement": f"Compared to p{i}, q{i} are larger.", "plural1": f"p{i}", "plural2": f"q{i}"}
            for i in range(40)]
    items = export_qa(rows, balance=True, seed=0)
    answers = [it["options"][it["answer"]] for it in items]
    assert answers == [f"q{i}" for i in range(40)]          # the answer is always the statement's subject
    assert 10 < sum(it["answer"] == "A" for it in items) < 30  # but not always in position B
    assert all(it["answer"] == "B" for it in export_qa(rows, balance=False))
    with pytest.raises(ValueError, match="not a 'Compared to X, Y"):
        to_qa("Cats are cute.")


# ----------------------------------------------------------------------------- metrics

def test_self_bleu_per_pair_equals_hand_computed_value():
    df = pd.DataFrame({"pair_id": ["a", "a", "b", "b", "c"],
                       "text": ["are typically much cheaper", "are typically much lighter",
                                "have fewer parts", "have fewer parts", "are faster"]})
    # pair a: each text vs the other: unigram p = 3/4, bigram p = 2/3, trigram p = 1/2, equal lengths (BP = 1)
    sb2_a = math.sqrt(3 / 4 * 2 / 3)
    sb3_a = (3 / 4 * 2 / 3 * 1 / 2) ** (1 / 3)
    # pair b: identical statements -> 1; pair c has a single statement and is left out
    assert pair_self_bleu(df, 2) == pytest.approx((sb2_a + 1.0) / 2, abs=1e-4)
    assert pair_self_bleu(df, 3) == pytest.approx((sb3_a + 1.0) / 2, abs=1e-4)
    assert pair_self_bleu(df[df.pair_id == "c"], 2) is None


def test_relation_phrases_and_entropy(wl):
    texts = pd.Series(["are typically more expensive.", "are cheaper.", "have fewer moving parts.",
                       "are often cheaper to run.", "are nice."])
    assert relation_phrases(texts, wl.comparatives).tolist()[:4] == ["more expensive", "cheaper", "fewer moving",
                                                                     "cheaper"]
    # phrases: more expensive, cheaper x2, fewer moving -> H = 1.5 bits
    assert relation_entropy(texts, wl.comparatives) == pytest.approx(1.5)


# ----------------------------------------------------------------------------- constraint sets (App. A.2-A.3)

def test_constraint_sets_match_the_tables(wl):
    from i2d2.comparatives.prompts import constraint_set, prompt_rows
    from i2d2.decoding import ConstraintSet
    from i2d2.decoding.constraints import validate

    cs = constraint_set("have", "typically", wl)
    validate(cs)
    assert [c.name for c in cs.clauses] == ["aux", "adverb"]
    assert [l.text for l in cs.clauses[0].literals] == ["have"] and cs.clauses[0].literals[0].positive
    assert [l.text for l in cs.clauses[1].literals] == ["typically"]
    assert cs.clauses[0].positions == [1, 2] and cs.clauses[1].positions == [1, 2]
    (dyn,) = cs.dynamic
    assert dyn.name == "comparative" and dyn.top_k == 5 and dyn.words == wl.comparatives and dyn.positions == [3]
    assert {c.name: c.max_count for c in cs.counts} == {"neg:punctuation": 0, "neg:pronouns": 0, "neg:connectives": 0}
    assert [c.words for c in cs.counts] == [wl.negatives[n] for n in ("punctuation", "pronouns", "connectives")]
    assert ConstraintSet.from_dict(cs.to_dict()).to_dict() == cs.to_dict()

    pairs = make_pairs({"fruit": load_classes()["fruit"][2:4]})   # cherry, peach
    rows = prompt_rows(pairs, wl.passes(), wl)
    assert len(rows) == 30  # one prompt row per (pair, pass): Table 6
    assert {r["prompt"] for r in rows} == {"Compared to cherries, peaches"}
    assert [(r["aux"], r["adverb"]) for r in rows] == wl.passes()
    assert rows[-1]["constraints"]["clauses"][0]["literals"][0]["text"] == "would"
    assert rows[-1]["constraints"]["clauses"][1]["literals"][0]["text"] == "normally"
    assert len({r["prompt_id"] for r in rows}) == 30
    unordered = constraint_set("may", "often", wl, order={"aux": None, "adverb": None, "comparative": None},
                               negatives=["pronouns"])
    assert unordered.clauses[0].positions is None and [c.name for c in unordered.counts] == ["neg:pronouns"]


def test_report_stage_counts_name_every_discriminator_cut():
    # the discriminator's 'out' is its smallest cut: "| discriminator | 20 | 4 |" read as 4 of 20 kept, though
    # NC-XL keeps 20 and NC-L 10
    import pandas as pd

    from i2d2.recipes.comparatives import _report

    prompts = {"n_classes": 1, "n_entities": 2, "n_pairs": 1, "n_pairs_after_perplexity": 1, "n_pairs_used": 1,
               "passes": ["are generally"]}
    counts = {"groups": {"in": 25, "out": 20},
              "discriminator": {"in": 20, "nc_l": 10, "nc_s": 4, "nc_xl": 20, "out": 4}}
    report = _report(0, prompts, counts, {}, pd.DataFrame(columns=["statement", "score"]), [])
    assert "| groups | 25 | 20 |" in report
    assert "| discriminator | 20 | 4 (the smallest cut; nc_l 10, nc_s 4, nc_xl 20) |" in report


def test_report_samples_name_the_set_they_come_from():
    # the samples are the QA source's rows (nc_s: the smallest cut), under a bare "## Samples" heading
    import pandas as pd

    from i2d2.recipes.comparatives import _report

    prompts = {"n_classes": 1, "n_entities": 2, "n_pairs": 1, "n_pairs_after_perplexity": 1, "n_pairs_used": 1,
               "passes": ["are generally"]}
    samples = pd.DataFrame({"statement": ["Compared to wasps, dragonflies are generally more docile."],
                            "score": [-8.183]})
    report = _report(0, prompts, {}, {"qa_source": "nc_s"}, samples, [])
    assert "## Samples (from `nc_s`, by pair, best S first)\n\n- Compared to wasps, dragonflies are generally " \
           "more docile. (S=-8.183)" in report
