"""CMP data model, textualization (Table 1), documents, corpus and builder."""

import json

import pytest

from i2d2.cmp.data import Quintuple, load_quintuples, split_quintuples
from i2d2.cmp.textualize import TemplateRealiser, cut_documents, qa_pairs, segment_for, split_sentences
from i2d2.io import DataError

DIFF = Quintuple("Diablo Cody", "Diane Paulus", "occupation", "screenwriter", "director",
                 "Diablo Cody is a screenwriter.", "Diane Paulus is a director.", id="d")
SAME = Quintuple("John Lewis", "Hank Johnson", "member of political party", "Democratic Party", "Democratic Party",
                 "John Lewis was a member of the Democratic Party.", "Hank Johnson is in the Democratic Party.", id="s")


def by_template(q, **kw):
    return {p.template: (p.question, p.answer) for p in qa_pairs(q, **kw)}


def test_templates_v1_differs_from_v2():
    t = by_template(DIFF, polarity="same", swap_options=False)
    assert set(t) == {"same_value", "both_value", "what_values", "which_entity", "v1_or_v2"}
    assert t["same_value"] == ("Do Diablo Cody and Diane Paulus have the same value of occupation?", "no")
    assert t["both_value"] == ("Do Diablo Cody and Diane Paulus both have the value of screenwriter in terms of "
                               "occupation?", "no")
    assert t["what_values"] == ("What are the occupation of Diablo Cody and Diane Paulus?", "screenwriter, director")
    assert t["which_entity"] == ("Which one of the following entity's occupation is screenwriter? Diablo Cody or "
                                 "Diane Paulus?", "Diablo Cody")
    assert t["v1_or_v2"] == ("Is Diablo Cody's occupation screenwriter or director?", "screenwriter")
    # the 'different' wording flips the yes/no answer; swapped options keep the answer
    assert by_template(DIFF, polarity="different")["same_value"] == (
        "Do Diablo Cody and Diane Paulus have different values of occupation?", "yes")
    sw = by_template(DIFF, swap_options=True)
    assert sw["which_entity"][0].endswith("Diane Paulus or Diablo Cody?") and sw["which_entity"][1] == "Diablo Cody"
    assert sw["v1_or_v2"] == ("Is Diablo Cody's occupation director or screenwriter?", "screenwriter")


def test_templates_v1_equals_v2():
    t = by_template(SAME, polarity="same")
    assert set(t) == {"same_value", "both_value", "what_values", "same_as", "known_for"}
    assert t["same_value"][1] == "yes" and t["both_value"][1] == "yes"
    assert t["what_values"][1] == "Democratic Party"  # one value when both agree (Table 3, pair 3)
    assert t["same_as"] == ("Which entity has the same value as John Lewis in terms of member of political party?",
                            "Hank Johnson")
    assert t["known_for"] == ("John Lewis and Hank Johnson are known for what value of member of political party?",
                              "Democratic Party")
    assert by_template(SAME, polarity="different")["same_value"][1] == "no"
    # equality ignores case and spacing
    q = Quintuple("A", "B", "colour", "Red", " red", "A is Red.", "B is red.")
    assert {p.template for p in qa_pairs(q)} >= {"same_as", "known_for"}


def test_realiser_same_and_different():
    r = TemplateRealiser({"member of political party": "is a member of the {v}"})
    assert r([SAME]) == ["John Lewis is a member of the Democratic Party, as is Hank Johnson."]
    assert r([DIFF]) == ["Diablo Cody's occupation is screenwriter, while Diane Paulus's occupation is director."]
    bundled = TemplateRealiser()  # category-specific phrases with articles
    q = Quintuple("lithium", "nitrogen", "element category", "alkali metal", "nonmetal", "x alkali metal", "x nonmetal",
                  category="chemical element")
    assert bundled([q]) == ["Lithium is classed as an alkali metal, while nitrogen is classed as a nonmetal."]


def test_document_segment_holds_linked_sentence():
    sents = [f"Filler sentence number {i} about the town." for i in range(25)]
    sents[13] = "Oxford stands on the banks of the Thames."
    doc = " ".join(sents)
    assert len(split_sentences(doc)) == 25
    seg = segment_for(doc, "Oxford", "located next to body of water", "Thames")
    assert split_sentences(seg) == sents[10:20]
    # (property, value) also links; nothing linked -> None
    assert "Thames" in segment_for("A. B. Its body of water is the Thames.", "Oxford", "body of water", "Thames")
    assert segment_for(doc, "Oxford", "river", "Rhine") is None
    q = Quintuple("Oxford", "London", "located next to body of water", "Thames", "Thames", doc, "London is on the Thames.")
    assert split_sentences(cut_documents([q])[0].doc1) == sents[10:20]


def test_malformed_quintuples_report_every_line(tmp_path):
    good = dict(e1="A", e2="B", property="p", v1="x", v2="y", doc1="A has x.", doc2="B has y.")
    lines = [json.dumps(good),
             "{not json",
             json.dumps({**good, "e2": ""}),
             json.dumps({k: v for k, v in good.items() if k != "doc2"}),
             json.dumps({**good, "e2": "a"}),
             json.dumps({**good, "doc1": "A has nothing to say."}),
             json.dumps({**good, "split": "dev"}),
             json.dumps({**good, "v1": ["x"]}),
             "",
             json.dumps({**good, "colour": "red"})]
    path = tmp_path / "q.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError) as e:
        load_quintuples(path)
    msg = str(e.value)
    for lineno, what in [(2, "invalid JSON"), (3, "field 'e2' is empty"), (4, "missing field 'doc2'"),
                         (5, "e1 and e2 are the same entity"), (6, "field 'doc1' never mentions v1 'x'"), (7, "field 'split' must be one of"),
                         (8, "field 'v1' must be a string"), (10, "unknown field(s) colour")]:
        assert f"{path}:{lineno}: {what}" in msg, (lineno, msg)
    assert f"{path}:1:" not in msg and "8 problem(s)" in msg
    errors = []
    rows = load_quintuples(path, on_error="skip", errors=errors)
    assert len(rows) == 1 and rows[0].id == "q-1" and len(errors) == 8


def test_bundled_corpus_is_valid_and_has_no_fixed_splits():
    qs = load_quintuples()
    assert len(qs) >= 2000  # every same-category pair: an entity split keeps only same-side pairs
    assert len({q.category for q in qs}) >= 10
    assert 0.1 < sum(q.same for q in qs) / len(qs) < 0.6
    assert all(q.split is None for q in qs)  # data.val_fraction / test_fraction / seed decide the split
    splits = split_quintuples(qs)
    assert all(splits[s] for s in ("train", "validation", "test"))
    for q in qs[:50]:  # the linked sentence states the fact
        assert segment_for(q.doc1, q.e1, q.property, q.v1) is not None


def test_builder_pairs_by_category_property_and_cooccurrence(tmp_path):
    from i2d2.cmp.builder import build_quintuples, load_articles, load_paragraphs, load_statements

    st = [dict(entity="Diablo Cody", property="occupation", value="screenwriter", category="human",
               property_aliases=["work"]),
          dict(entity="Diane Paulus", property="occupation", value="director", category="human",
               property_aliases=["work"]),
          dict(entity="Diane Paulus", property="educated at", value="Harvard University", category="human"),
          dict(entity="Juno", property="occupation", value="screenwriter", category="film"),
          dict(entity="Greta Gerwig", property="occupation", value="director", category="human")]
    (tmp_path / "s.jsonl").write_text("\n".join(json.dumps(s) for s in st))
    (tmp_path / "p.txt").write_text(
        "The work of screenwriter Diablo Cody and the work of director Diane Paulus meet in the show. "
        "Juno, a film, has a screenwriter credit for its work.\n\n"
        "Greta Gerwig's work as a director is praised.\n")
    arts = [{"title": "Diablo Cody", "text": "Diablo Cody is an American writer. Diablo Cody is a screenwriter."},
            {"title": "Diane Paulus", "text": "Diane Paulus is an American director of theatre."},
            {"title": "Greta Gerwig", "text": "Greta Gerwig is a director."}]
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps(a) for a in arts))
    rows, stats = build_quintuples(load_statements(tmp_path / "s.jsonl"), load_paragraphs(tmp_path / "p.txt"),
                                   load_articles(tmp_path / "a.jsonl"), progress=False)
    # Juno: other category; Greta Gerwig: not in the same paragraph; 'educated at': never linked
    assert [(q.e1, q.e2, q.property, q.v1, q.v2) for q in rows] == [
        ("Diablo Cody", "Diane Paulus", "occupation", "screenwriter", "director")]
    assert rows[0].doc1 == "Diablo Cody is a screenwriter." or "screenwriter" in rows[0].doc1
    assert "director" in rows[0].doc2 and stats["quintuples"] == 1
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(st[0]) + "\n" + json.dumps({"entity": "X", "property": "p"}) + "\n")
    with pytest.raises(DataError, match=r"bad.jsonl:2: missing field\(s\) value, category"):
        load_statements(bad)
    # the command line: quintuples written, exit 0; nothing linked, nothing written and exit 1
    from i2d2.cmp.builder import main

    args = ["--statements", str(tmp_path / "s.jsonl"), "--paragraphs", str(tmp_path / "p.txt"),
            "--articles", str(tmp_path / "a.jsonl")]
    assert main([*args, "--out", str(tmp_path / "q.jsonl")]) == 0 and (tmp_path / "q.jsonl").exists()
    (tmp_path / "none.txt").write_text("Nothing links here.\n")
    args[3] = str(tmp_path / "none.txt")
    assert main([*args, "--out", str(tmp_path / "empty.jsonl")]) == 1 and not (tmp_path / "empty.jsonl").exists()
