"""Regression tests from an audit of the numbers the NegVerse recipe reports: evaluation sentences may not be
training sentences (also re-cased or re-punctuated), a rate comes with the count it is over, a metric that was not
measured is null (not 0 or 1), duplicates that differ only in punctuation or apostrophe are one negation, and the
grammar-filter figures the README quotes are what the current filter gives on the judged fresh set."""

import json

import pytest

from negverse_setup import negverse_cfg

from i2d2.config import ConfigError


@pytest.fixture(scope="module")
def nlp():
    from i2d2.models import load_spacy

    return load_spacy("packaged:spacy-sm")


def _cfg(tmp_path, *overrides, eval_text="The dog is hungry.\n"):
    return negverse_cfg(tmp_path, *overrides, eval_text=eval_text)


# ----------------------------------------------------------------------------- eval / train disjointness

@pytest.mark.parametrize("sentence", ["She likes apples.",          # a pair's original, exact
                                      "she likes apples",           # re-cased, no full stop
                                      "The child was unhappy!",     # a pair's negated side (a training target)
                                      "The  sky is blue."])         # an affirmative the rule generator trains on
def test_eval_sentences_that_are_training_sentences_are_refused(tmp_path, sentence):
    # the disjointness was only assumed: a test compared the bundled files exactly; any data.eval_sentences that
    # repeated a training sentence (or the same one re-cased / re-punctuated) was negated and reported as held out
    from i2d2.recipes.negverse import check_config

    check_config(_cfg(tmp_path))
    with pytest.raises(ConfigError, match=r"data.eval_sentences: 1 sentence\(s\) .* also training sentences"):
        check_config(_cfg(tmp_path, eval_text=f"The dog is hungry.\n{sentence}\n"))


def test_affirmatives_count_only_when_the_rules_train_on_them(tmp_path):
    from i2d2.recipes.negverse import check_config

    check_config(_cfg(tmp_path, "data.use_rules=false", eval_text="The sky is blue.\n"))


def test_bundled_eval_sentences_are_unseen_up_to_case_and_punctuation():
    from i2d2.negverse.data import DATA_DIR, read_sentences, seen_in_training

    assert seen_in_training(read_sentences(DATA_DIR / "eval_sentences.txt"), DATA_DIR / "pairs.tsv",
                            DATA_DIR / "affirmatives.txt") == []


# ----------------------------------------------------------------------------- rates with their counts

class _LM:
    """Negates the whole-sentence variant of 'The dog is hungry.' and deletes every other blank (no model needed)."""

    def generate(self, prompts, n_blanks=None, num_return_sequences=1, **kw):
        out = []
        for p, n in zip(prompts, n_blanks):
            whole = p.split("[negation]")[1].split("[SEP]")[0].strip().rstrip(".") == "[BLANK]"
            out.append(["The dog is not hungry [ANSWER]" if whole else " [EMPTY] [ANSWER]" * n] * num_return_sequences)
        return out


def test_sentences_with_negation_counts_each_sentence_once(nlp):
    # a sentence given twice counted twice in the denominator and once in the numerator (1 of 2 read 0.5 although
    # the only sentence was negated); the rate also came without its count
    from i2d2.negverse.cues import CueDetector
    from i2d2.negverse.pipeline import negate

    det = CueDetector(nlp)
    kw = dict(num_candidates=1, max_variants=2, grammar=False, progress=False)
    _, _, once = negate(_LM(), nlp, det, ["The dog is hungry."], **kw)
    kept, _, twice = negate(_LM(), nlp, det, ["The dog is hungry.", "The dog is hungry."], **kw)
    assert once["sentences_with_negation"] == 1.0 and once["n_sentences_with_negation"] == 1
    assert twice["n_sentences"] == 1 and twice["sentences_with_negation"] == 1.0
    assert twice["n_sentences_with_negation"] == 1 and twice["n_repeated_sentences"] == 1
    assert (twice["n_candidates"], twice["n_kept"]) == (once["n_candidates"], once["n_kept"])


def test_type_shares_are_null_where_no_row_was_typed(nlp):
    # with the cue filter off (negate --no-cue-filter --metrics) no row has a negation type: the shares read 0.0
    # each and 'types covered per sentence' 1.0, as if measured
    from i2d2.negverse.metrics import negation_metrics

    rows = [{"original": "The child was happy.", "negation": "The child was not happy."},
            {"original": "The child was happy.", "negation": "The child was glad."}]
    m = negation_metrics(rows, nlp)
    assert m["n"] == 2 and m["n_typed"] == 0
    assert m["type_verbal"] is None and m["type_affixal"] is None and m["types_covered_per_sentence"] is None
    typed = [{**rows[0], "negation_type": "verbal"}, {**rows[1], "negation_type": "affixal"}]
    m = negation_metrics(typed, nlp)
    assert m["n_typed"] == 2 and m["type_verbal"] == 0.5 and m["types_covered_per_sentence"] == 2


def test_self_bleu_per_sentence_comes_with_its_count(nlp):
    from i2d2.negverse.metrics import negation_metrics

    rows = [{"original": "The child was happy.", "negation": "The child was not happy.", "negation_type": "verbal"},
            {"original": "The child was happy.", "negation": "The child was unhappy.", "negation_type": "affixal"},
            {"original": "The sky is blue.", "negation": "The sky is not blue.", "negation_type": "verbal"}]
    m = negation_metrics(rows, nlp)
    assert m["n_originals"] == 2 and m["n_originals_self_bleu"] == 1 and m["self_bleu_per_sentence"] is not None
    assert negation_metrics(rows[2:], nlp)["n_originals_self_bleu"] == 0


def test_val_loss_names_how_many_examples_it_read(tmp_path, nlp):
    # val_loss was read from the first task.train.val_batches batches only (16 of the bundled 84 validation
    # examples), while the report's data table shows n_val: the loss came without the count it was measured on
    from i2d2.recipes.negverse import data_stage, train_stage

    cfg = _cfg(tmp_path, "task.prompt.num_virtual_tokens=2", "task.train.val_fraction=0.5", "task.train.batch_size=1",
               "task.train.val_batches=1", "task.train.max_steps=1", "+trainer.enable_progress_bar=false",
               "+trainer.enable_model_summary=false")
    stats = data_stage(cfg, nlp, tmp_path / "data")
    assert stats["n_val"] >= 2
    out = train_stage(cfg, tmp_path / "data", tmp_path / "train", None)
    assert out["val_loss"] is not None and out["n_val_loss_examples"] == 1


# ----------------------------------------------------------------------------- dedupe

def test_dedupe_folds_final_punctuation_and_curly_apostrophes():
    # the 'unchanged' check folds a final .!? but dedupe did not, and the cue filter reads ’ as ': the same
    # negation spelt twice was kept twice, counted in n and in self-BLEU
    from i2d2.negverse.filters import dedupe

    rows = [{"original": "The shop is open.", "negation": n} for n in
            ("The shop isn't open.", "The shop isn’t open.", "The shop isn't open!", "the shop isn't open",
             "The shop is not open.")]
    kept, dropped = dedupe(rows)
    assert [r["negation"] for r in kept] == ["The shop isn't open.", "The shop is not open."]
    assert len(dropped) == 3


# ----------------------------------------------------------------------------- the README's grammar-filter figures

def test_readme_grammar_filter_figures_are_what_the_filter_gives_on_the_fresh_set(nlp):
    # README: "On 111 outputs ... from 30.6 % (no grammar filter; 111 kept) ... to 66.7 % (51 kept ...), dropping 59 of
    # the 70 ungrammatical outputs and none of the 34 valid ones". A filter change moves these: re-measure on a set
    # no check was written from, and update the README with the new counts.
    from i2d2.negverse.cues import CueDetector
    from i2d2.negverse.data import DATA_DIR
    from i2d2.negverse.grammar_eval import score_judged

    got = score_judged(DATA_DIR / "judged" / "fresh_outputs_2.jsonl", nlp, CueDetector(nlp))
    assert (got["n"], got["n_with_new_cue"], got["n_kept"]) == (111, 111, 51)
    assert got["labels"] == {"not_negation": 7, "ungrammatical": 70, "valid": 34}
    assert (got["dropped_ungrammatical"], got["dropped_valid"]) == (59, 0)
    assert round(100 * got["valid_share_before"], 1) == 30.6 and round(100 * got["valid_share_after"], 1) == 66.7
    assert json.loads(json.dumps(got)) == got


def test_report_says_the_eval_rates_are_read_by_the_filters_that_chose_the_kept_set():
    """With a fresh eval file the report gave keep rate, sentences_with_negation and type shares bare: read as a share
    of sentences negated correctly, though the filters and cue detector that chose the kept rows measure them too."""
    from i2d2.recipes.negverse import _report

    summary = {"eval": {"n_sentences": 4, "n_sentences_with_negation": 3, "sentences_with_negation": 0.75,
                        "keep_rate": 0.5, "type_verbal": 1.0}, "train": {"val_loss": 1.0}, "data": {"n_pairs": 2}}
    for bundled in (False, True):
        md = _report(summary, bundled_eval=bundled, eval_name="fresh.txt")
        note = md.split("| metric | value |")[0]  # said before the numbers
        assert "own filters and cue detector" in note and "no output was judged" in note
        assert ("`sentences_with_negation` is the share of sentences with at least one candidate the filters kept"
                in note)
        assert "grammar_eval --judged" in note


def test_report_names_the_data_behind_val_loss_and_that_it_chose_nothing():
    """The prompt-tuning table gave val_loss with no word on its data (its count sat in a row below, n_val in another
    table was the whole split) nor on whether it picked the adapter."""
    from i2d2.recipes.negverse import _report

    summary = {"eval": {"n_sentences": 1}, "data": {"n_val": 84},
               "train": {"val_loss": 1.5, "n_val_loss_examples": 16, "train_loss_first10": 2.0}}
    tuning = _report(summary).split("## Prompt tuning")[1].split("| key | value |")[0]
    assert "`val_loss`: the first 16 examples of the validation split" in tuning
    assert "nothing was selected on it" in tuning and "training batches" in tuning
    no_val = dict(summary, train={"val_loss": None, "n_val_loss_examples": 0})
    assert "`val_loss`" not in _report(no_val).split("## Prompt tuning")[1].split("| key | value |")[0]


def test_grammar_eval_flags_judged_files_that_shaped_the_filter(nlp, tmp_path):
    """grammar_eval --judged printed valid shares and drop precision on the judged files whose items the filter's checks
    were written from (the first fresh set, the bundled outputs) as on a fresh one: a number on data that chose."""
    import shutil

    from i2d2.negverse.cues import CueDetector
    from i2d2.negverse.data import DATA_DIR
    from i2d2.negverse.grammar_eval import score_judged

    judged = DATA_DIR / "judged"
    copy = shutil.copy(judged / "fresh_outputs.jsonl", tmp_path / "renamed.jsonl")  # a copy is the same rows
    for path in (judged / "grammar_filter_outputs.jsonl", judged / "fresh_outputs.jsonl", copy):
        got = score_judged(path, nlp, CueDetector(nlp))
        assert got["shaped_the_filter"] and "do not measure it" in got["note"], path
    fresh = score_judged(judged / "fresh_outputs_2.jsonl", nlp, CueDetector(nlp))  # the README's measurement
    assert fresh["shaped_the_filter"] is False and "note" not in fresh


def test_grammar_eval_warns_for_the_bundled_eval_sentences_however_named(tmp_path):
    """Its keep-rate warning read ``not data.eval_sentences``: the bundled file named by its path went unflagged."""
    from i2d2.negverse.data import DATA_DIR
    from i2d2.negverse.grammar_eval import bundled_eval_sentences

    fresh = tmp_path / "fresh.txt"
    fresh.write_text("The dog is hungry.\n")
    assert bundled_eval_sentences(None) and bundled_eval_sentences(str(DATA_DIR / "eval_sentences.txt"))
    assert bundled_eval_sentences(str(DATA_DIR / ".." / "negverse" / "eval_sentences.txt"))
    assert not bundled_eval_sentences(str(fresh))
