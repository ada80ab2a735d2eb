"""The graded contradiction scorer (critics/contradiction.py): rule-built training pairs, the cross-encoder
(tiny:bert here), its cache, the config switch and §2.3.3's keep rule."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from critics.contradiction import (LABELS, META, ComparativeDirectionScorer, CrossEncoderScorer, PairBuilder,
                                   cross_encoder_config, load_contradiction_scorer, rule_pairs, train_cross_encoder)
from i2d2.comparatives import filters as F
from i2d2.comparatives.wordlists import load_wordlists


@pytest.fixture(scope="module")
def lexicon():
    wl = load_wordlists()
    return ComparativeDirectionScorer(wl.scales, wl.comparatives)


def _pairs(lexicon, text, prompt):
    return PairBuilder(lexicon, seed=3).pairs(text, prompt)


def test_rule_pairs_edit_the_scale_word_with_the_edit_as_label(lexicon):
    text, prompt = "Compared to cars, bikes are generally cheaper.", "Compared to cars, bikes"
    pairs = _pairs(lexicon, text, prompt)
    assert {lab for _, _, lab in pairs} == set(LABELS)
    c, e = lexicon.scores([p for p, _, _ in pairs], [h for _, h, _ in pairs])
    for (p, h, lab), ci, ei in zip(pairs, c, e):
        assert p.startswith(prompt) and h.startswith(prompt)  # the entity names are never edited
        if lab == "contradiction":  # the other end of the cost scale
            assert ci == 1.0, (p, h)
        elif lab == "neutral":  # another scale: the two statements share none
            scales = [{sc for sc, _ in lexicon.claims(t[len(prompt):])} for t in (p, h)]
            assert ci == 0.0 and scales[0] and scales[1] and not scales[0] & scales[1], (p, h)
        else:
            assert ci == 0.0, (p, h)


def test_ambiguous_words_and_non_comparatives_get_no_scale_edit(lexicon):
    # 'lighter' sits on weight and brightness: its opposite is unknown, so only the hedge swap is made
    pairs = _pairs(lexicon, "Compared to vans, cars are typically lighter.", "Compared to vans, cars")
    assert {lab for _, _, lab in pairs} <= {"entailment", "neutral"}
    assert not any("heavier" in h or "darker" in h for _, h, _ in pairs)
    # 'more care' -> 'less care' is a contradiction; 'more of' names no attribute
    pairs = _pairs(lexicon, "Compared to cats, dogs often need more care.", "Compared to cats, dogs")
    assert ("Compared to cats, dogs often need more care.", "Compared to cats, dogs often need less care.",
            "contradiction") in pairs
    assert not any(lab == "contradiction" for _, _, lab in _pairs(lexicon, "Compared to cats, dogs are more of a pet.",
                                                                   "Compared to cats, dogs"))


def test_rule_pairs_are_marked_as_rule_built_and_deduplicated(lexicon):
    rows = rule_pairs([{"statement": "Compared to cars, bikes are generally cheaper.", "concept": "car | bike"}] * 2,
                      lexicon)
    assert rows and all(r["source"] == "rule" and r["concept"] == "car | bike" for r in rows)
    assert len({(r["premise"], r["hypothesis"]) for r in rows}) == len(rows)


def test_cross_encoder_trains_caches_and_scores_probabilities(tmp_path):
    from critics.contradiction import source_statements

    statements = tmp_path / "statements.jsonl"  # 40 real Gemma comparatives keep the test quick
    statements.write_text("".join(json.dumps(r) + "\n" for r in source_statements(None)[:40]))
    cfg = {"name": "tiny:bert", "dir": str(tmp_path / "ce"), "max_steps": 3, "batch_size": 8,
           "statements": [str(statements)]}
    folder = train_cross_encoder(cfg)
    meta = json.loads((folder / META).read_text())
    assert meta["labels"] == list(LABELS) and meta["steps"] == 3 and "not human judgements" in meta["training_pairs"]
    assert meta["n_train"] + meta["n_val"] == meta["n_pairs"] > 100 / 2
    # val/acc is about entities the cross-encoder never trained on: no entity, in either order, on both sides
    split = json.loads((folder / "split.json").read_text())
    ents = [{e.strip().lower() for c in split[k] for e in c.split("|")} for k in ("train_concepts", "val_concepts")]
    assert split["val_concepts"] and not ents[0] & ents[1]
    stamp = (folder / META).stat().st_mtime_ns
    assert train_cross_encoder(cfg) == folder and (folder / META).stat().st_mtime_ns == stamp  # reused, not retrained
    assert not (tmp_path / "ce.work").exists()
    s = load_contradiction_scorer("cross_encoder", cross_encoder=cfg)
    assert isinstance(s, CrossEncoderScorer)
    C, E = s.matrix(["Compared to cars, bikes are cheaper.", "Compared to cars, bikes are pricier.",
                     "Compared to cars, bikes are slower."])
    off = ~np.eye(3, dtype=bool)
    assert np.all(np.diag(C) == 0) and np.all((C[off] > 0) & (C[off] < 1)) and np.all(C + E <= 1 + 1e-6)
    assert len(np.unique(np.round(C[off], 6))) > 1  # graded: different pairs, different probabilities


def test_config_switch_and_bad_keys(tmp_path):
    assert isinstance(load_contradiction_scorer("offline"), ComparativeDirectionScorer)
    with pytest.raises(ValueError, match="unknown key.*'epochs'"):
        cross_encoder_config({"epochs": 3})
    bad = tmp_path / "s.jsonl"
    bad.write_text('{"statement": "Compared to cars, bikes are cheaper."}\n{"text": "x"}\n')
    with pytest.raises(ValueError, match=r"s.jsonl:2: key 'statement'"):
        train_cross_encoder({"name": "tiny:bert", "dir": str(tmp_path / "ce"), "statements": [str(bad)]})


class _Fixed:
    """A scorer with given probability matrices (one entity pair)."""

    def __init__(self, C, E):
        self.C, self.E = np.asarray(C, float), np.asarray(E, float)

    def matrix(self, texts):
        return self.C[:len(texts), :len(texts)], self.E[:len(texts), :len(texts)]


def test_keep_rule_is_contradicting_more_often_than_not():
    # statement 0 contradicts 1 and 2 (2 of 3 others) -> dropped; 1 and 2 contradict 1 of 3 -> kept, though no
    # statement agrees with them (the old n_contradict <= n_agree rule dropped them); 0.98 is under 0.99
    C = [[0, 0.995, 0.999, 0.98], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]
    E = np.zeros((4, 4))
    df = pd.DataFrame({"pair_id": ["a"] * 4, "statement": list("wxyz"), "score": [0.0, -1.0, -2.0, -3.0]})
    out = F.contradiction_filter(df, _Fixed(C, E), 0.99, 0.85, k=None)
    assert sorted(out.index) == [1, 2, 3] and out["n_others"].tolist() == [3, 3, 3]
    assert F.contradicts_more_often_than_not(np.array([1, 2, 1, 0]), np.array([1, 3, 2, 0])).tolist() == \
        [True, True, False, False]


def test_the_fresh_judged_pairs_share_no_pair_with_the_set_that_chose_the_rule():
    """contradiction_pairs_2.jsonl measures a rule changed after reading contradiction_pairs.jsonl's errors: no pair
    of the first file (in either order) may be in it, and every row carries a guide label."""
    from i2d2.io import read_jsonl

    data = Path(__file__).resolve().parent.parent / "i2d2" / "data" / "comparatives"
    first, fresh = read_jsonl(data / "contradiction_pairs.jsonl"), read_jsonl(data / "contradiction_pairs_2.jsonl")
    key = lambda r: frozenset((r["premise"], r["hypothesis"]))  # noqa: E731
    assert not {key(r) for r in first} & {key(r) for r in fresh}
    labels = {"contradiction", "entailment", "neutral", "dont_know"}
    assert len(fresh) == 200 and all(r["label"] in labels and r["annotator"] == "maintainers" for r in fresh)
    assert len({r["id"] for r in fresh}) == 200


def test_contradiction_stage_counts_the_k_cap_apart_from_contradictions(tmp_path):
    # 7 statements of one pair, one contradicting 4 of its 6 others: 1 contradiction, then the k=5 cap takes 1 more.
    # The stage's 7 -> 5 alone read as 2 contradictions in the report (the default job: 25 -> 20, all 5 by the cap)
    import pandas as pd

    from i2d2.recipes.comparatives import _filter_stage, _report

    C = np.zeros((7, 7))
    C[0, 1:5] = 1.0
    df = pd.DataFrame({"pair_id": ["a"] * 7, "statement": list("abcdefg"), "score": -np.arange(7.0)})
    (tmp_path / "in.jsonl").write_text(df.to_json(orient="records", lines=True))

    def fn(d):  # as the recipe's contradiction step: (kept, rows each step dropped)
        dropped = {}
        return F.contradiction_filter(d, _Fixed(C, np.zeros((7, 7))), k=5, dropped=dropped), dropped

    counts = {"contradiction": _filter_stage("contradiction", tmp_path / "in.jsonl", tmp_path / "out", {}, fn)}
    assert (counts["contradiction"]["in"], counts["contradiction"]["out"]) == (7, 5)
    assert (counts["contradiction"]["contradicted"], counts["contradiction"]["beyond_k"]) == (1, 1)
    prompts = {"n_classes": 1, "n_entities": 2, "n_pairs": 1, "n_pairs_after_perplexity": 1, "n_pairs_used": 1,
               "passes": ["are generally"]}
    report = _report(0, prompts, counts, {}, pd.DataFrame(columns=["statement", "score"]), [])
    assert "dropped 1 statements that contradict more than half of their pair's others and 1 beyond the k best" \
        in report


def test_contradiction_stage_without_k_reports_no_cap():
    # k: null keeps every consistent statement: the report said "0 beyond the k best" of a cap that was not there
    import pandas as pd

    from i2d2.recipes.comparatives import _report

    C = np.zeros((3, 3))
    df = pd.DataFrame({"pair_id": ["a"] * 3, "statement": list("abc"), "score": [0.0, -1.0, -2.0]})
    dropped = {}
    assert len(F.contradiction_filter(df, _Fixed(C, C), k=None, dropped=dropped)) == 3
    assert dropped == {"contradicted": 0}
    prompts = {"n_classes": 1, "n_entities": 2, "n_pairs": 1, "n_pairs_after_perplexity": 1, "n_pairs_used": 1,
               "passes": ["are generally"]}
    counts = {"contradiction": {"in": 3, "out": 3, **dropped}}
    report = _report(0, prompts, counts, {}, pd.DataFrame(columns=["statement", "score"]), [])
    assert "dropped 0 statements that contradict more than half of their pair's others." in report
    assert "beyond the k best" not in report
