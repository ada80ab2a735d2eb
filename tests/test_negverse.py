"""NegVerse: masking rules, prompt format, cue detector, filters, rule generator, metrics (no LM needed)."""

import pytest

from i2d2.models import load_spacy
from i2d2.negverse.cues import CueDetector
from i2d2.negverse.filters import apply_filters, dedupe, filter_cue, filter_degenerate, filter_distance
from i2d2.negverse.formatting import ANSWER, SEP, build_prompt, build_target, parse_answers
from i2d2.negverse.masking import BLANK, EMPTY, fill_blanks, mask_variants, render, rule_spans, training_variants


@pytest.fixture(scope="module")
def nlp():
    return load_spacy("packaged:spacy-sm")


@pytest.fixture(scope="module")
def detector(nlp):
    return CueDetector(nlp)


def spans_text(doc, rule):
    return {doc[s:e].text for s, e, name in rule_spans(doc) if name == rule}


# ----------------------------------------------------------------------------- masking rules

def test_verb_rule_masks_verbs_and_auxiliaries(nlp):
    doc = nlp("The old man has painted the red fence.")
    assert {"has", "painted"} <= spans_text(doc, "verb:token")


def test_subject_object_rule_masks_token_and_subtree(nlp):
    doc = nlp("The old man painted the red fence.")
    assert "man" in spans_text(doc, "subj_obj:token")
    assert {"The old man", "the red fence"} <= spans_text(doc, "subj_obj:subtree")


def test_adverb_rule(nlp):
    doc = nlp("She always arrives very early.")
    assert {"always", "early"} <= spans_text(doc, "adv:token")


def test_adjective_rule_selects_affixal_candidates(nlp):
    doc = nlp("The patient was happy with the careful nurse.")
    assert {"happy", "careful"} <= spans_text(doc, "adj:token")
    assert "happy with the careful nurse" in spans_text(doc, "adj:subtree")


def test_preposition_rule(nlp):
    doc = nlp("She went to school with her bag.")
    assert {"to", "with"} <= spans_text(doc, "prep:token")
    assert "with her bag" in spans_text(doc, "prep:subtree")


def test_determiner_blank_widens_over_its_noun_or_adjective(nlp):
    doc = nlp("I have a red car.")
    det_spans = spans_text(doc, "det:token") | spans_text(doc, "det:subtree")
    assert "a red" in det_spans and "a red car" in det_spans
    assert "a" not in det_spans  # never the bare determiner


def test_spans_never_include_edge_punctuation_or_the_whole_sentence(nlp):
    doc = nlp("Dogs bark.")
    for s, e, _ in rule_spans(doc):
        assert not doc[s].is_punct and not doc[e - 1].is_punct
        assert (s, e) != (0, 2)


def test_mask_variants_include_whole_sentence_root_verb_and_respect_limits(nlp):
    doc = nlp("The old man smiled at a small child in the park.")
    vs = mask_variants(doc, max_blanks=2, max_variants=6)
    assert len(vs) == 6
    assert vs[0].text == f"{BLANK}." and vs[0].rules == ["sentence"]
    assert vs[1].rules == ["verb:token"] and vs[1].text == f"The old man {BLANK} at a small child in the park."
    assert all(1 <= v.text.count(BLANK) <= 2 for v in vs)
    assert len({v.text for v in vs}) == len(vs)
    assert mask_variants(doc, seed=3)[0].text == vs[0].text  # deterministic per sentence
    assert [v.text for v in mask_variants(doc)] == [v.text for v in vs]


def test_unknown_rule_is_an_error(nlp):
    with pytest.raises(ValueError, match="unknown masking rule"):
        rule_spans(nlp("Dogs bark."), rules=["verb", "noun"])


def test_render_and_fill_roundtrip(nlp):
    doc = nlp("She doesn't like green apples.")
    masked = render(doc, [(1, 3), (4, 5)])
    assert masked == f"She {BLANK} like {BLANK} apples."
    assert fill_blanks(masked, ["does", EMPTY]) == "She does like apples."
    assert fill_blanks(masked, ["only one"]) is None
    assert fill_blanks(f"He {BLANK}.", ["left early."]) == "He left early."  # no double full stop


@pytest.mark.parametrize("orig,neg,answers", [
    ("She likes apples.", "She doesn't like apples.", ["doesn't like"]),
    ("Everyone came to the party.", "Nobody came to the party.", ["Nobody"]),
    ("He is happy with the result.", "He is unhappy with the result.", ["unhappy"]),
    ("I have a car.", "I have no car.", ["no car"]),
    ("The water is clean.", "The water is not clean.", ["is not"]),
    ("She went with her coat.", "She went without her coat.", ["without"]),
])
def test_training_variants_cover_the_change_and_reconstruct_the_negation(nlp, orig, neg, answers):
    vs = training_variants(nlp(orig), nlp(neg))
    assert vs[0].answers == answers
    assert vs[-1].rules == ["sentence"] and vs[-1].answers == [neg.rstrip(".")]
    for v in vs:
        assert fill_blanks(v.text, v.answers) == neg


def test_training_variant_deletion_uses_empty(nlp):
    vs = training_variants(nlp("The big old dog barked."), nlp("The dog barked."))
    assert any(EMPTY in v.answers for v in vs)
    for v in vs:
        assert fill_blanks(v.text, v.answers) == "The dog barked."


# ----------------------------------------------------------------------------- format

def test_prompt_format_is_polyjuice_style():
    p = build_prompt("She likes apples.", f"She {BLANK} apples.")
    assert p == f"She likes apples. <|perturb|> [negation] She {BLANK} apples. {SEP}"
    t = build_target(["doesn't like", EMPTY])
    assert t == f" doesn't like {ANSWER} {EMPTY} {ANSWER}"
    assert parse_answers(t + " junk after", 2) == ["doesn't like", EMPTY]
    assert parse_answers(f" only one {ANSWER} unfinished", 2) is None


# ----------------------------------------------------------------------------- cue detector

LABELLED = [
    ("The shop does not open on Sundays.", {"verbal"}),
    ("He didn't call.", {"verbal"}),
    ("She cannot swim.", {"verbal"}),
    ("Nobody came to the party.", {"non_verbal"}),
    ("No one answered.", {"non_verbal"}),
    ("Nothing happened.", {"non_verbal"}),
    ("They never win.", {"non_verbal"}),
    ("There is no milk.", {"non_verbal"}),
    ("None of the cookies were eaten.", {"non_verbal"}),
    ("She left without her coat.", {"non_verbal"}),
    ("The child was unhappy.", {"affixal"}),
    ("The answer is incorrect.", {"affixal"}),
    ("This task is impossible.", {"affixal"}),
    ("Parking here is illegal.", {"affixal"}),
    ("Her heartbeat is irregular.", {"affixal"}),
    ("He was dishonest with us.", {"affixal"}),
    ("The chemical is nontoxic.", {"affixal"}),
    ("The driver was careless.", {"affixal"}),
    ("He dislikes the office.", {"affixal"}),
    ("The man was not unkind.", {"verbal", "affixal"}),
    # no negation: prefixes/suffixes that are not negations, or whose base does not exist
    ("The cat is under the table.", set()),
    ("We ate dinner indoors at the inner table.", set()),
    ("My uncle sent important information.", set()),
    ("The museum will display a unique universal map.", set()),
    ("Bless you, unless you are busy.", set()),
    ("The interesting lecture was intense.", set()),
    ("The immediate reply was impressive.", set()),
    ("The child was happy.", set()),
    ("She knows a lot about notation.", set()),
]


@pytest.mark.parametrize("sentence,types", LABELLED)
def test_cue_detector_on_labelled_sentences(detector, sentence, types):
    assert {c.type for c in detector.detect(sentence)} == types


def test_affixal_cue_needs_an_existing_base(nlp):
    det = CueDetector(nlp, words={"happy", "kind"})  # a word list instead of spaCy's vocabulary
    assert [c.text for c in det.detect("The unhappy man was unkind.")] == ["unhappy", "unkind"]
    assert det.detect("The unwell man was unfit.") == []  # bases not in the word list
    assert det.affix_of("careless", "ADJ") is None  # 'care' not in this list


def test_pluggable_tagger_union_and_replace(nlp):
    from i2d2.negverse.cues import Cue

    class Tagger:
        def tag(self, doc):
            return [Cue(t.text, "non_verbal", t.i) for t in doc if t.lower_ == "hardly"]

    s = "He hardly ever does not smile."
    assert {c.text for c in CueDetector(nlp, tagger=Tagger()).detect(s)} == {"hardly", "not"}
    assert {c.text for c in CueDetector(nlp, tagger=Tagger(), tagger_mode="replace").detect(s)} == {"hardly"}


def test_new_cues_ignore_cues_already_in_the_original(detector):
    assert detector.new_cues("He is not happy.", "He is not unhappy.")[0].text == "unhappy"
    assert detector.new_cues("He is not happy.", "He is not very happy.") == []
    assert detector.negation_type("Everyone came.", "Nobody came.") == "non_verbal"


# ----------------------------------------------------------------------------- filters

def row(neg, orig="The child was happy at school.", answers=("x",)):
    return {"original": orig, "negation": neg, "answers": list(answers)}


def test_degenerate_filter_reasons():
    rows = [row("The child was unhappy at school."), row(None), row("The child was happy at school."),
            row("The child was at school.", answers=[" "]), row("The child was [ANSWER] at school."),
            row("The child was notttttt happy."), row("The child was was not happy at school."),
            row("The child was \u0007 happy."), row("The child was not happy " + "at school " * 10),
            row("The child was not happy at school at school."), row("The not child was happy at school."),
            row("The child was happy at school not."), row("The child was happy Not at school."),
            row("The child was not happy was happy at school."), row("The child not was happy at school.")]
    kept, dropped = filter_degenerate(rows)
    assert [r["negation"] for r in kept] == ["The child was unhappy at school."]
    assert [r["drop_reason"] for r in dropped] == ["blanks_not_filled", "unchanged", "empty_blank",
                                                   "special_token", "garbage_run", "repeated_word",
                                                   "garbage_chars", "too_long", "repeated_phrase",
                                                   "misplaced_negation", "misplaced_negation",
                                                   "misplaced_negation", "repeated_phrase", "misplaced_negation"]


def test_distance_filter_threshold():
    kept, dropped = filter_distance([row("The child was not happy at school."), row("Nobody likes rainy days.")])
    assert [r["negation"] for r in kept] == ["The child was not happy at school."]
    assert kept[0]["lev_distance"] < 0.5 <= dropped[0]["lev_distance"]


def test_cue_filter_requires_a_new_negation_cue(detector):
    kept, dropped = filter_cue([row("The child was unhappy at school."), row("The child was sad at school."),
                                row("The child was never happy at school.")], detector)
    assert [(r["negation"], r["negation_type"]) for r in kept] == [
        ("The child was unhappy at school.", "affixal"), ("The child was never happy at school.", "non_verbal")]
    assert dropped[0]["drop_reason"] == "no_negation_cue"


def test_dedupe_is_case_and_space_insensitive():
    kept, dropped = dedupe([row("The child was not happy."), row("the child  was not happy."), row("No child.")])
    assert len(kept) == 2 and dropped[0]["drop_reason"] == "duplicate"


def test_apply_filters_chain_counts(detector, nlp):
    rows = [row("The child was not happy at school."), row("The child was not happy at school."),
            row("Happy."), row("The child was glad at school."), row("The child was happy at school none.")]
    kept, dropped, counts = apply_filters(rows, detector, nlp=nlp)
    assert len(kept) == 1 and counts == {"too_far": 1, "no_negation_cue": 1, "duplicate": 1,
                                         "ungrammatical:cue_extra_argument": 1}
    _, _, no_grammar = apply_filters([row("The child was happy at school none.")], detector, grammar=False)
    assert no_grammar == {}
    with pytest.raises(ValueError, match="needs the spaCy pipeline"):
        apply_filters(rows, detector)


# ----------------------------------------------------------------------------- rule generator / data / metrics

def test_rule_based_pair_generator(nlp):
    from i2d2.negverse.rules import generate_pairs

    docs = list(nlp.pipe(["The farmer feeds the chickens.", "The sky is blue.", "Someone called the police.",
                          "She often visits Rome.", "The town has a cinema.", "All of the cakes were sold.",
                          "The bed is comfortable.", "Everyone brought a gift."]))
    got = {(p["original"], p["negated"]) for p in generate_pairs(docs, seed=0)}
    for pair in [("The farmer feeds the chickens.", "The farmer does not feed the chickens."),
                 ("The sky is blue.", "The sky is not blue."),
                 ("Someone called the police.", "Nobody called the police."),
                 ("She often visits Rome.", "She never visits Rome."),
                 ("The town has a cinema.", "The town has no cinema."),
                 ("All of the cakes were sold.", "None of the cakes were sold."),
                 ("The bed is comfortable.", "The bed is uncomfortable.")]:
        assert pair in got or (pair[0], pair[1].replace("does not", "doesn't")) in got
    # clause negation of universal subjects is skipped (scope would change the meaning)
    assert not any(o == "Everyone brought a gift." and "not" in n for o, n in got)


def test_bundled_pairs_cover_types_and_eval_sentences_are_unseen():
    from i2d2.negverse.data import DATA_DIR, read_pairs, read_sentences

    pairs = read_pairs(DATA_DIR / "pairs.tsv")
    assert len(pairs) >= 200
    assert {p["type"] for p in pairs} == {"verbal", "non_verbal", "affixal"}
    text = " ".join(p["negated"].lower() for p in pairs)
    for cue in ["nobody", "nothing", "never", " no ", "none", "un", "in", "im", "dis", "non", "less"]:
        assert cue in text
    seen = {p["original"] for p in pairs} | set(read_sentences(DATA_DIR / "affirmatives.txt"))
    assert not seen & set(read_sentences(DATA_DIR / "eval_sentences.txt"))


def test_read_pairs_errors_name_file_and_line(tmp_path):
    from i2d2.io import DataError
    from i2d2.negverse.data import read_pairs

    f = tmp_path / "p.tsv"
    f.write_text("# header\nA.\tNot A.\tverbal\nB.\tNot B.\tweird\n")
    with pytest.raises(DataError, match=r"p.tsv:3: type 'weird'"):
        read_pairs(f)


def test_metrics(nlp):
    from i2d2.negverse.metrics import negation_metrics, tree_edit_distance

    a, b = nlp("The child was happy."), nlp("The child was not happy.")
    assert tree_edit_distance(a, a) == 0
    assert tree_edit_distance(a, b, normalize=False) == 1  # one inserted 'neg' node
    rows = [{"original": "The child was happy.", "negation": "The child was not happy.", "negation_type": "verbal"},
            {"original": "The child was happy.", "negation": "The child was unhappy.", "negation_type": "affixal"}]
    m = negation_metrics(rows, nlp)
    assert m["type_verbal"] == 0.5 and m["type_affixal"] == 0.5 and m["type_non_verbal"] == 0
    assert 0.7 < m["levenshtein_similarity"] < 1
    assert 0 < m["self_bleu_per_sentence"] < 1 and m["types_covered_per_sentence"] == 2


def test_apostrophe_less_contractions_are_verbal_cues(detector, nlp):
    # generations spell "dont" / "cant" / "isnt": spaCy splits them as do + nt (dep neg), which matched no cue
    for text in ("Birds dont swim.", "Birds cant swim.", "He isnt here."):
        cues = detector.detect(nlp(text))
        assert [(c.text, c.type) for c in cues] == [("nt", "verbal")], text
    assert detector.negation_type("Birds swim.", "Birds dont swim.") == "verbal"
    assert detector.new_cues("Birds don't swim.", "Birds dont swim.") == []  # the same negation, respelt
    assert detector.detect(nlp("The NT kernel boots.")) == []  # an "nt" that negates nothing
