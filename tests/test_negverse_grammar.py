"""NegVerse: the parse-based grammaticality filter, two-blank variants, undefined metrics, and the negate
CLI's input errors and adapter-saved settings (no LM needed)."""

import json

import pytest

from i2d2.models import load_spacy
from i2d2.negverse.filters import clause_reason, filter_grammar, grammar_reason
from i2d2.negverse.masking import BLANK, mask_variants


@pytest.fixture(scope="module")
def nlp():
    return load_spacy("packaged:spacy-sm")


GRAMMATICAL = ["There is no bakery.", "There is not a bakery.", "Nobody liked the movie.", "The shop is not open.",
               "The shop is never open.", "She has none of the books.", "None of the students passed.",
               "He went nowhere.", "I saw nothing.", "The cat did not sleep.", "No, he left.",
               "He no longer works here.", "Nothing happened.", "I have no idea.", "She chose not to go.",
               "The dog barked at nobody.", "They had nothing to eat.", "There was nothing special about it.",
               "He was none too happy.", "Not all birds can fly.", "They have not finished the report.",
               "No one called me.", "The children did not play in the park."]
UNGRAMMATICAL = {"There is a bakery none.": "cue_with_determiner",
                 "He ate the cake nothing.": "cue_with_determiner",
                 "The store sells none bread.": "cue_as_modifier",
                 "The house is none big.": "cue_as_adverb",
                 "The cat not slept.": "not_without_auxiliary",
                 "The not cat slept.": "not_as_poss",
                 "The meeting no was long.": "misplaced_no",
                 "The train arrived no on time.": "misplaced_no",
                 "The room was clean none.": "cue_extra_argument",
                 "The child was happy at school none.": "cue_extra_argument"}


@pytest.mark.parametrize("sentence", GRAMMATICAL)
def test_grammar_check_passes_well_placed_cues(nlp, sentence):
    assert grammar_reason(nlp(sentence)) is None


@pytest.mark.parametrize("sentence,why", UNGRAMMATICAL.items())
def test_grammar_check_rejects_cues_the_parse_misplaces(nlp, sentence, why):
    assert grammar_reason(nlp(sentence)) == why


def test_grammar_filter_checks_only_the_new_cues(nlp):
    # the original's own 'not' is not the candidate's doing: only the cue at the given index is judged
    doc = nlp("The cat not slept and nobody came.")
    assert grammar_reason(doc, [5]) is None and grammar_reason(doc) == "not_without_auxiliary"
    rows = [{"original": "There is a bakery.", "negation": "There is a bakery none."},
            {"original": "There is a bakery.", "negation": "There is no bakery."}]
    kept, dropped = filter_grammar(rows, nlp)
    assert [r["negation"] for r in kept] == ["There is no bakery."]
    assert dropped[0]["drop_reason"] == "ungrammatical:cue_with_determiner"


# (original, candidate, why): a candidate's verbs must still make the original's clause
CLAUSES = [("The librarian found the book.", "The librarian did not find the book.", None),
           ("The librarian found the book.", "Nobody found the book.", None),
           ("The librarian found the book.", "The librarian never found the book.", None),
           ("He can swim.", "He cannot swim.", None),
           ("They will visit us.", "They will not visit us.", None),
           ("The shop sells bread.", "The shop does not really sell bread.", None),  # an adverb before the verb
           ("He did his homework.", "He didn't do his homework.", None),
           ("He did his homework.", "He did nothing.", None),  # 'do' as the main verb, no 'not' after it
           ("He said he was happy.", "He said nothing.", None),  # fewer finite verbs is no error
           ("The librarian found the book.", "The librarian did not found the book.", "do_without_bare_verb"),
           ("The doctor was patient.", "The doctor didn't patient.", "do_without_bare_verb"),
           ("The answer seems logical.", "The answer doesn't seems logical.", "do_without_bare_verb"),
           ("The answer seems logical.", "The answer does not seem seems logical.", "extra_finite_verb"),
           ("The librarian found the book.", "The librarian found the did not find book.", "extra_finite_verb"),
           ("The new bridge is safe.", "The new bridge not safe.", "no_finite_verb"),
           ("There is a cafe near the station.", "There not a cafe near the station.", "no_finite_verb"),
           ("All of the tickets were sold.", "All of no tickets were sold.", "no_in_partitive"),
           ("All of the tickets were sold.", "None of the tickets were sold.", None),
           ("The bus arrives every hour.", "never arrives every hour.", "no_subject"),
           ("The dog barked at the cat.", "The dog barked at nobody.", None),  # its parse has no subject arc
           ("Most of the guests arrived.", "Most did not arrive.", None),
           ("Yes, he left.", "No, he left.", None),
           ("The coffee smells strong.", "The coffee smells no.", "no_without_noun"),
           ("The mechanic repaired the car quickly.", "The mechanic repaired no quickly.", "no_without_noun"),
           ("He still works here.", "He no longer works here.", None),
           ("There is a cafe near the station.", "There is a cafe near no station.", None),
           ("She remembers her first day at school.", "She remembers her first day not school.",
            "cue_for_preposition"),
           ("The lamp is on the table.", "The lamp is not on the table.", None),
           # kept by the bundled run: 'not' where the determiner was
           ("The doctor was patient with the children.", "The doctor was patient with not children.",
            "cue_for_determiner"),
           ("The doctor was patient with the children.", "The doctor was patient with no children.", None),
           ("This is fine.", "Nothing is fine.", None),  # 'This' is no noun's determiner
           ("Some students passed.", "Not all students passed.", None),
           ("A student passed the exam.", "Not one student passed the exam.", None),  # an independent review's
           ("Both he and she like tea.", "Neither he nor she likes tea.", None),  # cases, dropped at first
           ("Both the cat and the dog are hungry.", "Neither the cat nor the dog is hungry.", None),
           # kept by the bundled run: a negation in another tense
           ("The workers are happy with their pay.", "The workers were not happy with their pay.", "tense_changed"),
           ("She runs fast.", "She did not run fast.", "tense_changed"),
           ("He walked home.", "He does not walk home.", "tense_changed"),
           ("The workers are happy with their pay.", "The workers are not happy with their pay.", None),
           ("She runs fast.", "She does not run fast.", None),
           # kept by the bundled run: the verb's number changed, its subject did not
           ("There is a cafe near the station.", "There are not a cafe near the station.", "agreement_changed"),
           ("She likes tea.", "She don't like tea.", "agreement_changed"),
           ("There is a cafe near the station.", "There are no cafes near the station.", None),
           ("The workers are happy.", "Nobody is happy.", None),
           # words copied from the original are not the candidate's doing ('do not,' is judged in neither)
           ("We do not, however, agree with everyone.", "We do not, however, agree with anyone.", None)]


# grammatical negations outside the simple declaratives the rules were written from (an independent review's cases):
# questions, ellipsis, imperatives, coordination, negative inversion, 'no' as an answer, tagger slips on the original
# ('Money talks.': talks/NNS), curly apostrophes
VALID_ELSEWHERE = [("Does it work?", "Doesn't it work?"), ("Why did he leave?", "Why didn't he leave?"),
                   ("Yes, I do.", "No, I don't."), ("Close the door.", "Don't close the door."),
                   ("Do it now.", "Don't do it now."), ("He can sing and dance.", "He can sing but doesn't dance."),
                   ("They have eaten and left.", "They have eaten but haven't left."),
                   ("Money talks.", "Money does not talk."), ("Students like homework.", "Students do not like homework."),
                   ("The teacher smiled and nodded.", "The teacher didn't smile and didn't nod."),
                   ("They visit the castle.", "They do not visit the castle."),
                   ("He has lied.", "Never has he lied."), ("He called.", "Not once did he call."),
                   ("He said yes to the offer.", "He said no to the offer."), ("The answer is yes.", "The answer is no."),
                   ("Someone called.", "No-one called."), ("He went further.", "He went no further."),
                   ("Oh yes, he left.", "Oh no, he didn't leave."), ("Oh no, the bus left.", "Oh no, the bus didn't leave."),
                   ("Kids play outside.", "Kids never play outside."), ("He likes tea.", "He doesn’t like tea."),
                   ("I’m ready.", "I’m not ready.")]


@pytest.mark.parametrize("original,candidate", VALID_ELSEWHERE)
def test_grammar_filter_keeps_grammatical_negations_of_other_shapes(nlp, original, candidate):
    from i2d2.negverse.cues import CueDetector
    from i2d2.negverse.filters import filter_cue

    rows = [{"original": original, "negation": candidate}]
    filter_cue(rows, CueDetector(nlp))  # the pipeline checks the new cues' positions
    kept, dropped = filter_grammar(rows, nlp)
    assert kept, dropped[0]["drop_reason"]


def test_grammar_filter_reads_curly_apostrophes_as_plain_ones(nlp):
    rows = [{"original": "The librarian found the book.", "negation": "The librarian didn’t found the book."},
            {"original": "The puppy chews the old slippers.", "negation": "no chews the old slippers."}]
    kept, dropped = filter_grammar(rows, nlp)
    assert not kept and [r["drop_reason"] for r in dropped] == ["ungrammatical:do_without_bare_verb",
                                                                "ungrammatical:no_subject"]


@pytest.mark.parametrize("original,candidate,why", CLAUSES)
def test_clause_check_compares_the_candidates_verbs_with_the_originals(nlp, original, candidate, why):
    assert clause_reason(nlp(candidate), nlp(original)) == why


def test_grammar_filter_runs_the_clause_check_and_scores_judged_outputs(nlp, tmp_path):
    from i2d2.negverse.cues import CueDetector
    from i2d2.negverse.grammar_eval import score_judged

    rows = [{"original": "The new bridge is safe.", "negation": "The new bridge not safe."},
            {"original": "The new bridge is safe.", "negation": "The new bridge is not safe."}]
    kept, dropped = filter_grammar(rows, nlp)
    assert [r["negation"] for r in kept] == ["The new bridge is not safe."]
    assert dropped[0]["drop_reason"] == "ungrammatical:no_finite_verb"
    judged = tmp_path / "judged.jsonl"
    judged.write_text("\n".join(json.dumps(r) for r in [
        {"source": "The new bridge is safe.", "statement": "The new bridge not safe.", "label": "ungrammatical"},
        {"source": "The new bridge is safe.", "statement": "The new bridge is not safe.", "label": "valid"},
        {"source": "The cat slept.", "statement": "The cat not slept.", "label": "ungrammatical"},
        {"source": "The cat slept.", "statement": "The dog slept.", "label": "not_negation"}]) + "\n")
    got = score_judged(judged, nlp, CueDetector(nlp))
    # 'The dog slept.' has no new cue: the pipeline drops it before the grammar filter
    assert (got["n"], got["n_without_new_cue"], got["n_kept"], got["dropped_ungrammatical"]) == (4, 1, 1, 2)
    assert got["valid_share_before"] == 1 / 3 and got["valid_share_after"] == 1.0 and got["drop_precision"] == 1.0


def test_six_variants_keep_a_two_blank_slot_where_the_parse_allows(nlp):
    for text in ("The old man smiled at a small child in the park.", "The shop sells fresh bread every morning.",
                 "My brother always eats breakfast at home."):
        vs = mask_variants(nlp(text), max_blanks=2, max_variants=6)
        assert len(vs) == 6 and vs[0].rules == ["sentence"]
        assert any(v.text.count(BLANK) == 2 for v in vs), [v.text for v in vs]
        assert len({v.text for v in vs}) == 6
    # without the reservation the whole sentence and single blanks take every slot
    vs = mask_variants(nlp("The old man smiled at a small child in the park."), max_variants=6, min_two_blank=0)
    assert all(v.text.count(BLANK) == 1 for v in vs)
    # a sentence with no two disjoint spans of different rules gets single blanks only
    short = mask_variants(nlp("Dogs bark."), max_variants=6)
    assert all(v.text.count(BLANK) == 1 for v in short)


def test_undefined_negation_metrics_are_null(nlp):
    from i2d2.negverse.metrics import negation_metrics

    empty = negation_metrics([], nlp)
    assert empty["n"] == 0 and empty["self_bleu_per_sentence"] is None and empty["levenshtein_similarity"] is None
    one_each = [{"original": "The child was happy.", "negation": "The child was not happy.", "negation_type": "verbal"},
                {"original": "The sky is blue.", "negation": "The sky is not blue.", "negation_type": "verbal"}]
    m = negation_metrics(one_each, nlp)
    assert m["self_bleu_per_sentence"] is None  # no sentence has two negations
    assert m["self_bleu_corpus"] is not None and m["n"] == 2
    assert negation_metrics(one_each[:1], nlp)["self_bleu_corpus"] is None
    assert json.loads(json.dumps(m))["self_bleu_per_sentence"] is None  # null in JSON, never 0.0


# ----------------------------------------------------------------------------- negate CLI

def test_negate_empty_or_unreadable_input_is_an_error_naming_the_file(tmp_path, capsys):
    from i2d2.negate import main

    empty = tmp_path / "empty.txt"
    empty.write_text("\n# only a comment\n\n")
    assert main(["--file", str(empty), "--adapter", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert "empty.txt: no sentences in it" in err
    assert main(["--file", str(tmp_path / "missing.txt")]) == 2
    assert "missing.txt: cannot read it" in capsys.readouterr().err
    binary = tmp_path / "bin.txt"
    binary.write_bytes(b"\xff\xfe\x00\x81")
    assert main(["--file", str(binary)]) == 2
    assert "bin.txt:1: file is UTF-16" in capsys.readouterr().err  # the reader says what is wrong with it
    assert main(["   "]) == 2 and "blank" in capsys.readouterr().err
    # a folder as --out / --dropped: refused before any model loads (was a traceback after generating everything)
    for flag in ("--out", "--dropped"):
        assert main(["x", flag, str(tmp_path), "--adapter", str(tmp_path / "none")]) == 2
        assert f"{flag} {tmp_path}: is a folder" in capsys.readouterr().err
        assert main(["x", flag, str(empty / "out.jsonl"), "--adapter", str(tmp_path / "none")]) == 2
        assert f"{flag} {empty / 'out.jsonl'}: {empty} is a file" in capsys.readouterr().err
    # a TSV given as --file: its own message (file:line), not "cannot read it"
    (tmp_path / "pairs.tsv").write_text("She likes tea.\tShe does not like tea.\tverbal\n")
    assert main(["--file", str(tmp_path / "pairs.tsv")]) == 2
    assert f"--file: {tmp_path / 'pairs.tsv'}:1: a tab" in capsys.readouterr().err


def test_negate_takes_settings_from_the_adapter_then_the_command_line(tmp_path, capsys):
    from i2d2.negate import main, negation_options, parse_args
    from i2d2.schemas import NegationOptions, defaults

    DEFAULTS = defaults(NegationOptions)

    adapter = tmp_path / "adapter"
    adapter.mkdir()
    task = {"generate": {"num_candidates": 2, "batch_size": 16, "top_p": 0.8},
            "masking": {"max_variants": 4, "max_blanks": 2, "train_max_variants": 4},
            "filters": {"max_distance": 0.4, "grammar": True}}
    (adapter / "negverse.json").write_text(json.dumps({"base_model": "tiny:gpt2", "task": task}))
    opts, source = negation_options(parse_args(["x", "--adapter", str(adapter)]))
    assert (opts["num_candidates"], opts["max_variants"], opts["max_distance"], opts["top_p"]) == (2, 4, 0.4, 0.8)
    assert source["num_candidates"] == "adapter" and "train_max_variants" not in opts
    assert opts["temperature"] == DEFAULTS["temperature"] and source["temperature"] == "default"
    opts, source = negation_options(parse_args(["x", "--adapter", str(adapter), "-n", "5", "--max-variants", "6",
                                                "--no-grammar-filter"]))
    assert (opts["num_candidates"], opts["max_variants"], opts["grammar"]) == (5, 6, False)
    assert source["num_candidates"] == "command line"
    assert main(["x", "--adapter", str(tmp_path / "not_an_adapter")]) == 2
    assert "not a NegVerse adapter" in capsys.readouterr().err
    # values no generation can use: refused before any model loads, naming the setting
    for bad, msg in ((["-n", "0"], "num_candidates: must be an integer >= 1"), (["--top-p", "2"], "top_p: must be in"),
                     (["--max-distance", "-1"], "max_distance: must be > 0"), (["-n", "0"], "given as --num-candidates 0;"),
                     (["--top-p", "2"], "given as --top-p 2.0;")):
        assert main(["x", "--adapter", str(adapter), *bad]) == 2
        assert msg in capsys.readouterr().err
    assert negation_options(parse_args(["x", "--adapter", str(adapter), "--greedy", "--temperature", "0"]))[0]["do_sample"] is False


@pytest.mark.parametrize("bad,flag,other", [(["--max-variants", "0", "--max-blanks", "3"], "--max-variants 0", "--max-blanks"),
                                            (["--top-p", "0.5", "--temperature", "0"], "--temperature 0.0", "--top-p"),
                                            (["--max-blanks", "0", "--max-variants", "3"], "--max-blanks 0", "--max-variants")])
def test_negate_names_the_flag_of_the_value_refused_and_no_other(tmp_path, capsys, bad, flag, other):
    # the flags were those whose option's key was anywhere in the message: "masking: max_blanks and max_variants must
    # be >= 1" said "given as --max-variants 0, --max-blanks 3", and a temperature of 0 blamed --top-p 0.5 as well
    from i2d2.negate import main

    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "negverse.json").write_text(json.dumps({"base_model": "tiny:gpt2", "task": {}}))
    assert main(["x", "--adapter", str(adapter), *bad]) == 2
    err = capsys.readouterr().err
    assert f"(given as {flag}; options:" in err and other not in err, err


@pytest.mark.parametrize("candidate", ["Everyone liked the neither the teacher.", "Everyone liked the nor teacher."])
def test_neither_and_nor_after_a_determiner_are_misplaced(candidate):
    # kept by the bundled run (typed non_verbal): the determiner check knew only not / no / never / none / ...
    from i2d2.negverse.filters import degenerate_reason

    assert degenerate_reason({"original": "Everyone liked the new teacher.", "negation": candidate}) \
        == "misplaced_negation"
    assert degenerate_reason({"original": "They liked the film.", "negation": "Neither of them liked the film."}) is None
    # after a pronoun or a conjunction that is spelt as a determiner, they stand
    for original, negation in (("He likes this and that.", "He likes neither this nor that."),
                               ("The book is his or hers.", "The book is neither his nor hers."),
                               ("I know that he came.", "I know that neither he nor she came.")):
        assert degenerate_reason({"original": original, "negation": negation}) is None, negation
