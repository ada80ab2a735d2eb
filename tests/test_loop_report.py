"""Loop helpers without models: mark-and-recapture, human-label evaluation, truncation, prompt sampling."""

import json

import numpy as np
import pytest

from i2d2.recipes.generics import ConfigError, sample_prompts, truncate
from i2d2.recipes.generics_report import human_eval, mark_recapture, render_markdown


def test_mark_recapture_estimates_unique_population():
    rows = [{"statement": f"Concept {i % 10} has property number {i}.", "concept": f"c{i % 10}"} for i in range(400)]
    est = mark_recapture(rows, fraction=0.3, seed=0)
    assert est["n_first"] == est["n_second"] == 120
    assert 250 < est["population"] < 700  # 400 distinct statements
    # 400 rows that are 20 statements repeated: the estimate collapses towards 20
    dup = [{"statement": f"Statement {i % 20} about a thing.", "concept": f"c{i % 20}"} for i in range(400)]
    assert mark_recapture(dup, seed=0)["population"] == pytest.approx(20, abs=2)
    # near-duplicates (BLEU > 0.85 against the same concept's first capture) count as recaptures
    near = [{"statement": f"Dogs are very loyal and friendly animals that love people number {i % 5}"
             + ("!" if i % 2 else "."), "concept": "dog"} for i in range(200)]
    assert mark_recapture(near, seed=1)["population"] < 15


def test_human_eval_uses_labels_of_this_iterations_generations():
    rows = [{"statement": "Dogs bark.", "critic_score": 0.9}, {"statement": "Cats bark.", "critic_score": 0.7},
            {"statement": "Unlabelled one.", "critic_score": 0.1}]
    out = human_eval(rows, {"dogs bark": 1, "cats bark": 0}, delta=0.8)  # keys: i2d2.filtering.dedupe_key
    assert out["n_labelled"] == 2 and out["human_accuracy"] == 0.5 and out["human_precision_at_delta"] == 1.0
    assert human_eval(rows, {"other": 1}, 0.5) is None


def test_human_eval_finds_a_test_concept_spelled_in_another_case():
    # the split groups concepts with case folded ("Dog" and "dog" are one, both test): matching split.json's
    # spelling exactly left the generations of " Dog" out of the critic's test-concept PR
    from critics.data import split_groups

    rows = [{"statement": "Dogs bark.", "critic_score": 0.9, "concept": " Dog"},
            {"statement": "Cats bark.", "critic_score": 0.7, "concept": "cat"}]
    assert len(set(split_groups(["dog", " Dog"]))) == 1
    out = human_eval(rows, {"dogs bark": 1, "cats bark": 0}, delta=0.8, test_concepts={"dog"})
    assert out["n_labelled_test_concepts"] == 1 and out["y"] == [1] and out["scores"] == [0.9]


def test_truncate_keeps_one_statement():
    assert truncate("fun to play. They are old.") == "fun to play."
    assert truncate("a nice view.\nWe had fun") == "a nice view."
    assert truncate("made of wood, e.g oak", "sentence") == "made of wood, e.g oak"
    assert truncate("line one\nline two", "newline") == "line one"
    assert truncate(" as is. Two.", "none") == " as is. Two."
    with pytest.raises(ConfigError, match="task.filter.truncate"):
        truncate("x", "words")


def test_sample_prompts_spreads_over_concepts():
    pool = [{"prompt_id": f"a{i}", "concept": "hotel"} for i in range(30)] + \
           [{"prompt_id": f"b{i}", "concept": c} for i, c in enumerate(["dog", "cat", "tree", "car"])]
    got = sample_prompts(pool, 8, np.random.default_rng(0))
    assert len(got) == 8 and {p["concept"] for p in got} == {"hotel", "dog", "cat", "tree", "car"}
    assert [pool.index(p) for p in got] == sorted(pool.index(p) for p in got)  # pool order kept
    assert sample_prompts(pool, None, np.random.default_rng(0)) == pool


def test_markdown_report_lists_iterations_and_samples():
    m = dict(iteration=1, generator="runs/x/iter_0/model", next_model="runs/x/iter_1/model", n_prompts=4,
             n_generations=20, constraint_satisfaction_rate=0.5, critic_model="c", critic_reused_from=0, critic_ap=0.9,
             delta=0.5, accepted_rate=0.25, kept_fraction=0.2, n_kept=4)
    sample = {"Top kept generations": [{"critic_score": 0.9, "all_satisfied": True, "statement": "Dogs | bark."}]}
    md = render_markdown(m, sample, [dict(m, iteration=0, accepted_rate=0.1), m], "report/pr_curves.png")
    assert "reused from iteration 0" in md and "| 0.250 |" in md and "Dogs \\| bark." in md
    assert "## All iterations" in md and "![PR curves](report/pr_curves.png)" in md
    assert "Warning" not in md
    # the table of all iterations shows how many were kept beside the fraction; the loss is the last epoch's mean
    assert "| 1 | 20 | 0.500 | 0.900 | 0.500 | 0.250 | – | 4 (0.200) |" in md.split("## All iterations")[1]
    assert "mean loss of the last epoch" in md and "final loss" not in md
    # undefined numbers print as "–"; a wording-sensitive critic is flagged at the top; person-judged accuracy shows
    m2 = dict(m, critic_precision=None, critic_probe_shift=0.25, heldout_accuracy=0.6, heldout_ci95_low=0.52,
              heldout_ci95_high=0.68,
              heldout_n_labelled=150)
    md2 = render_markdown(m2, sample, [m2], None)
    assert "probe shift is 0.250" in md2 and "| – / " in md2 and "0.600 (95 % CI 0.520–0.680, n=150)" in md2
    assert "does not beat" not in md2  # no surface AP: no floor warning
    md3 = render_markdown(dict(m, critic_ap=0.6, critic_surface_ap=0.5), sample, [m], None)
    assert "Warning: the critic's test AP 0.600 does not beat the surface-only floor 0.500" in md3


def test_self_bleu_of_fewer_than_two_statements_is_undefined_and_reads_as_such():
    from i2d2.recipes.generics_report import _esc, diversity

    one = diversity([{"statement": "Dogs bark.", "concept": "dog"}], sample=200)
    assert one["self_bleu"] is None  # a 0.0 would read as perfectly diverse
    two = diversity([{"statement": "Dogs bark.", "concept": "dog"}, {"statement": "Dogs bark loudly.", "concept": "dog"}])
    assert 0 < two["self_bleu"] <= 1
    assert _esc("Dogs\x13 bark | loudly\n") == "Dogs\\x13 bark \\| loudly "


def test_report_breaks_generations_and_person_judged_heldout_accuracy_down_by_prompt_form(tmp_path):
    import json

    from i2d2.annotation import heldout_accuracy, heldout_store
    from i2d2.io import write_jsonl
    from i2d2.recipes.generics_report import by_prompt_form

    kept = [{"form": "adverb+indefinite", "prompt_id": "p1", "critic_score": 0.9, "all_satisfied": True}]
    dropped = [{"form": "adverb+indefinite", "prompt_id": "p1", "critic_score": 0.2, "all_satisfied": False},
               {"form": "adverb+bare_plural", "prompt_id": "p2", "critic_score": 0.7, "all_satisfied": True},
               {"form": "goal", "prompt_id": "p3", "critic_score": 0.1}]
    forms = by_prompt_form(kept, dropped, delta=0.5)
    assert forms["adverb+indefinite"] == {"prompts": 1, "generations": 2, "kept": 1, "satisfied_rate": 0.5,
                                          "accepted_rate": 0.5}
    # a form whose rows carry no constraint column: unknown, not 0
    assert forms["goal"]["satisfied_rate"] is None and forms["adverb+bare_plural"]["satisfied_rate"] == 1.0
    assert forms["adverb+bare_plural"]["accepted_rate"] == 1.0 and forms["goal"]["kept"] == 0
    # held-out person-judged accuracy per form, from the blind labels store
    d = tmp_path / "iter_0" / "heldout"
    d.mkdir(parents=True)
    write_jsonl(d / "statements.jsonl", [
        {"statement": "Generally, a dog can bark.", "form": "adverb+indefinite"},
        {"statement": "Generally, a dog can fly.", "form": "adverb+indefinite"},
        {"statement": "Generally, dogs are loyal.", "form": "adverb+bare_plural"}])
    write_jsonl(heldout_store(tmp_path), [{"statement": "Generally, a dog can bark.", "label": "true"},
                                          {"statement": "Generally, a dog can fly.", "label": "false"}])
    rows = heldout_accuracy(tmp_path, by="form")
    assert [(r["form"], r["n_generations"], r["n_labelled"], r["accuracy"]) for r in rows] == [
        ("adverb+bare_plural", 1, 0, None), ("adverb+indefinite", 2, 2, 0.5)]
    assert [r["accuracy"] for r in heldout_accuracy(tmp_path)] == [0.5]  # the iteration as a whole, unchanged
    m = dict(iteration=0, generator="g", n_prompts=3, n_generations=4, constraint_satisfaction_rate=1.0,
             critic_model="c", critic_ap=0.7, delta=0.5, accepted_rate=0.5, kept_fraction=0.25, n_kept=1,
             by_form=forms, heldout_by_form=json.loads(json.dumps(rows)))
    md = render_markdown(m, {}, [m], None)
    assert "## Prompt forms" in md
    assert "| adverb+indefinite | 1 | 2 | 0.500 | 0.500 | 1 | 0.500 (" in md and "n=2) |" in md
    assert "| adverb+bare_plural | 1 | 1 | 1.000 | 1.000 | 0 | – |" in md
    # re-rendered from metrics.json (sorted keys, as annotate import --blind does): the same order, most generations first
    md2 = render_markdown(json.loads(json.dumps(m, sort_keys=True)), {}, [m], None)
    order = [line.split(" | ")[0] for line in md2.split("## Prompt forms")[1].splitlines() if line.startswith("| adverb")
             or line.startswith("| goal")]
    assert order == ["| adverb+indefinite", "| adverb+bare_plural", "| goal"]
    assert md2.split("## Prompt forms")[1] == md.split("## Prompt forms")[1]


def test_sample_tables_count_distinct_rows_and_do_not_repeat_a_short_rejected_list():
    from i2d2.recipes.generics_report import pick_samples

    kept = [{"statement": f"Dogs bark {i}.", "critic_score": 0.9} for i in range(3)]
    dropped = [{"statement": s, "critic_score": c, "drop_reason": "critic"}
               for s, c in [("Cats fly.", 0.2), ("cats fly", 0.1), ("Fish walk.", 0.3)]]
    t = pick_samples(kept, dropped, n=10)
    assert list(t) == ["Top kept generations (3 distinct kept)", "Random kept generations",
                       "Rejected by the critic (all 2 distinct)"]
    dropped += [{"statement": f"Rocks sing {i}.", "critic_score": i / 100, "drop_reason": "critic"} for i in range(12)]
    t = pick_samples(kept, dropped, n=10)
    near, worst = t["Rejected by the critic, closest to δ (14 distinct)"], t["Rejected by the critic, lowest score"]
    assert near[0]["critic_score"] == 0.3 and worst[0]["critic_score"] == 0.0 and len(near) == len(worst) == 10


def test_the_trackers_table_of_iterations_has_the_markdown_tables_columns(tmp_path):
    """report/iterations (W&B) had the labels store's human_accuracy where report.md shows the blind held-out
    accuracy, and no held-out Self-BLEU: the two tables of all iterations disagreed."""
    from i2d2.recipes.generics_report import write_report

    class Tables:
        def __init__(self):
            self.tables = {}

        def log_metrics(self, metrics, step=None):
            pass

        def log_table(self, key, columns, rows):
            self.tables[key] = (columns, rows)

        def log_image(self, key, path):
            pass

    m = dict(iteration=0, generator="g", next_model="iter_0/model", n_prompts=4, n_generations=20,
             constraint_satisfaction_rate=0.5, critic_model="c", critic_ap=0.9, delta=0.5, accepted_rate=0.25,
             kept_fraction=0.2, n_kept=4, heldout_accuracy=0.6, heldout_self_bleu=0.8, human_accuracy=None)
    kept = [{"statement": "Dogs bark.", "critic_score": 0.9, "concept": "dog", "form": "bare_plural", "prompt_id": "p0"}]
    tracker = Tables()
    write_report(tmp_path / "iter_0", tmp_path, m, kept, [], {"source": "s", "y": [1, 0], "scores": [0.9, 0.1]},
                 tracker=tracker)
    cols, rows = tracker.tables["report/iterations"]
    row = dict(zip(cols, rows[0]))
    assert "human_accuracy" not in cols
    assert (row["heldout_accuracy"], row["heldout_self_bleu"], row["n_kept"], row["kept_fraction"]) == (0.6, 0.8, 4, 0.2)


def test_a_report_re_rendered_from_older_metrics_does_not_claim_the_kept_sample_size():
    """annotate import --blind re-renders every iteration's report.md from its metrics.json; one written before the
    sample sizes were recorded (all generations' Self-BLEU then on task.report.self_bleu_sample texts) read 'a sample
    of –, the kept sample's size'."""
    m = dict(iteration=0, generator="g", next_model="n", n_prompts=4, n_generations=20, constraint_satisfaction_rate=0.5,
             critic_model="c", critic_ap=0.9, delta=0.5, accepted_rate=0.25, kept_fraction=0.2, n_kept=4,
             self_bleu_kept=0.5, self_bleu_all=0.9)
    old = render_markdown(m, {}, [m], None)
    assert "the kept sample's size" not in old and "| Self-BLEU of all generations (sample) | 0.900 |" in old
    new = render_markdown(dict(m, self_bleu_kept_n=4, self_bleu_all_n=4), {}, [m], None)
    assert "| Self-BLEU of all generations (a sample of 4, the kept sample's size) | 0.900 |" in new


def test_an_ellipsis_is_no_sentence_end_in_either_spelling():
    # "…" counted as unfinished while "..." passed (it ends in a full stop): a trailing ellipsis marks a cut-off
    # thought (GUIDE.md: garbled), so both are unfinished, and neither is a sentence end to truncate at
    from i2d2.filtering import ends_sentence

    for ellipsis in ("...", "…"):
        assert not ends_sentence(f"Dogs are known to{ellipsis}")
        assert not ends_sentence(f"Dogs are known to{ellipsis}\u201d ")
        assert truncate(f"loyal{ellipsis} and kind. More") == f"loyal{ellipsis} and kind."
    assert ends_sentence("Dogs bark.") and ends_sentence("Do dogs bark?") and ends_sentence('He said "wait."')
    assert ends_sentence("Made in the U.S.") and not ends_sentence("Dogs are")


def test_the_numbers_measured_on_a_labelled_split_are_logged_named_by_it(tmp_path):
    """critic/ap (test) beside critic/dev_ap (dev), report/critic_precision (test, at the filter's δ): W&B keys that
    did not say which split measured them. Logged now as <stage>/<split>_<what>; metrics.json keeps its keys."""
    from critics.train import log_critic_metrics
    from i2d2.recipes.generics_report import write_report

    class Recorder:
        def __init__(self):
            self.metrics = {}

        def log_metrics(self, metrics, step=None):
            self.metrics.update(metrics)

        def log_table(self, *a, **k):
            pass

        log_image = log_table

    tracker = Recorder()
    log_critic_metrics(tracker, {"ap": 0.7, "dev_ap": 0.8, "precision": 0.6, "n_kept_test": 5, "p_at_r": 0.5,
                                 "surface_auc_train": 0.6, "probe_ap": 0.55, "n_test": 30, "delta": 0.4})
    assert tracker.metrics == {"critic/test_ap": 0.7, "critic/dev_ap": 0.8, "critic/test_precision": 0.6,
                               "critic/test_n_kept": 5, "critic/test_p_at_r": 0.5, "critic/train_surface_auc": 0.6,
                               "critic/probe_ap": 0.55, "critic/n_test": 30, "critic/delta": 0.4}
    tracker = Recorder()
    m = dict(iteration=0, generator="g", next_model="iter_0/model", n_prompts=4, n_generations=20,
             constraint_satisfaction_rate=0.5, critic_model="c", critic_ap=0.9, critic_precision=0.75,
             critic_recall=0.5, critic_n_kept_test=4, human_precision_at_delta=0.5, delta=0.5, accepted_rate=0.25,
             kept_fraction=0.2, n_kept=4)
    write_report(tmp_path / "iter_0", tmp_path, m, [], [], {"source": "s", "y": [1, 0], "scores": [0.9, 0.1]},
                 tracker=tracker)
    logged = {k: v for k, v in tracker.metrics.items() if "critic" in k or "human" in k}
    assert logged == {"report/test_critic_precision": 0.75, "report/test_critic_recall": 0.5,
                      "report/test_critic_n_kept": 4, "report/test_human_precision_at_delta": 0.5}
    assert json.loads((tmp_path / "iter_0" / "report" / "metrics.json").read_text())["critic_precision"] == 0.75
