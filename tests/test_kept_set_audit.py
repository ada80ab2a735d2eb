"""scripts/kept_set_audit.py: the blind export hides what the labeller must not see, and the scores are the
population's (dropped rows weighted by their sampling rate), on a filter output built here."""
import csv
from pathlib import Path

import datasets
import numpy as np
import pytest
from sklearn.metrics import average_precision_score

from i2d2.io import read_jsonl, save_table

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def audit(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import kept_set_audit
    return kept_set_audit


def _run(tmp_path):
    """4 kept; 40 dropped by the critic (scores below the kept ones'), 10 unfinished, 2 duplicates."""
    def row(i, score, reason):
        return {"statement": f"Statement number {i}.", "concept": f"c{i % 5}", "critic_score": score,
                "drop_reason": reason}
    kept = [row(i, 0.9 - i / 100, None) for i in range(4)]
    dropped = [row(100 + i, 0.5 - i / 100, "critic") for i in range(40)] + \
        [row(200 + i, 0.3, "unfinished") for i in range(10)] + [row(300 + i, 0.8, "duplicate") for i in range(2)]
    f = tmp_path / "run" / "iter_0" / "filtered"
    save_table(f / "kept", datasets.Dataset.from_list(kept))
    save_table(f / "dropped", datasets.Dataset.from_list(dropped))
    return tmp_path / "run"


def _label(path: Path, out: Path, key: dict, true_if) -> None:
    rows = list(csv.DictReader(path.open()))
    for r in rows:
        r["label"] = "true" if true_if(key[r["item_id"]]) else "vague"
    with out.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=["item_id", "statement", "label"])
        w.writeheader()
        w.writerows(rows)


def test_export_is_blind_and_score_weights_the_dropped_sample(tmp_path, audit, capsys):
    run = _run(tmp_path)
    blind = tmp_path / "blind.csv"
    audit.main(["export", "--run-dir", str(run), "--rejected", "20", "--out", str(blind)])
    rows = list(csv.DictReader(blind.open()))
    assert list(rows[0]) == ["item_id", "statement", "label"]  # no score, no kept flag, no concept
    assert len(rows) == 24 and all(r["label"] == "" for r in rows)
    key = {r["item_id"]: r for r in read_jsonl(run / "iter_0" / "audit" / "key.jsonl")}
    assert sum(r["kept"] for r in key.values()) == 4
    assert [key[r["item_id"]]["kept"] for r in rows] != sorted((key[r["item_id"]]["kept"] for r in rows), reverse=True)

    # kept: 3 of 4 true; dropped by the critic: the best-scored half true (so recall and AP are not trivial)
    def true_if(r):
        return r["statement"] != "Statement number 3." if r["kept"] else (
            r["drop_reason"] == "critic" and r["critic_score"] > 0.3) or r["drop_reason"] == "duplicate"
    done = tmp_path / "done.csv"
    _label(blind, done, key, true_if)
    capsys.readouterr()
    audit.main(["score", "--run-dir", str(run), "--labels", str(done), "--labels", str(done)])
    out = capsys.readouterr().out
    assert "precision 0.750" in out and "(3 of 4)" in out and "yield 4 kept of 56 generations" in out
    sampled = [r for r in key.values() if r["drop_reason"] == "critic"]
    true_share = sum(true_if(r) for r in sampled) / len(sampled)
    est = true_share * 40  # the critic's 40 drops, estimated from the sample: duplicates are not lost knowledge
    assert f"filter recall (estimated): {3 / (3 + est):.3f}" in out
    ranked = [r for r in key.values() if r["kept"] or r["drop_reason"] in ("critic", "duplicate")]
    n_of = {reason: sum(1 for r in key.values() if r["drop_reason"] == reason) for reason in ("critic", "duplicate")}
    total = {"critic": 40, "duplicate": 2}
    weights = [1.0 if r["kept"] else total[r["drop_reason"]] / n_of[r["drop_reason"]] for r in ranked]
    ap = average_precision_score([int(true_if(r)) for r in ranked], [r["critic_score"] for r in ranked],
                                 sample_weight=weights)
    assert f"weighted to the population): {ap:.3f}" in out
    assert "Cohen's kappa 1.000" in out


def test_score_names_an_unknown_label_and_a_missing_item(tmp_path, audit):
    run = _run(tmp_path)
    blind = tmp_path / "blind.csv"
    audit.main(["export", "--run-dir", str(run), "--rejected", "5", "--out", str(blind)])
    rows = list(csv.DictReader(blind.open()))
    bad = tmp_path / "bad.csv"
    with bad.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=["item_id", "statement", "label"])
        w.writeheader()
        w.writerows([{**r, "label": "true"} for r in rows[:-1]] + [{**rows[-1], "label": "maybe"}])
    with pytest.raises(SystemExit, match=r"bad\.csv:10: label 'maybe' is not a label of GUIDE\.md"):
        audit.main(["score", "--run-dir", str(run), "--labels", str(bad)])
    with bad.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=["item_id", "statement", "label"])
        w.writeheader()
        w.writerows([{**r, "label": "true"} for r in rows[:-1]])
    with pytest.raises(SystemExit, match=r"1 items have no label"):
        audit.main(["score", "--run-dir", str(run), "--labels", str(bad)])


ANNOTATIONS = ROOT / "i2d2" / "data" / "annotations"


def test_the_bundled_audit_reprints_the_readme_table_and_its_concepts_chose_nothing(audit, capsys):
    """The README's kept-set audit, from the bundled file (settled labels, then each labeller's)."""
    f = str(ANNOTATIONS / "kept_audit_fresh.jsonl")
    audit.main(["score", "--key", f, "--labels", f, "--labels", f"{f}:label_1", "--labels", f"{f}:label_2"])
    out = capsys.readouterr().out
    assert "precision 0.717 [0.62, 0.80] (66 of 92); yield 92 kept of 1000 generations (0.092)" in out
    assert "dropped for critic: true 0.304 [0.23, 0.39] (35 of 115) of the sample; 606 dropped in all" in out
    assert "filter recall (estimated): 0.230" in out and "weighted to the population): 0.766 (base rate 0.432" in out
    assert "critic score >= 0.60: precision 0.804, recall 0.492, ~216 statements (114 labelled)" in out
    assert "dropped for reasons the sample did not draw: 4 (left out of the recall)" in out  # 4 repeated-item drops
    for labeller, precision in (("label_1", "0.696"), ("label_2", "0.750")):
        audit.main(["score", "--key", f, "--labels", f"{f}:{labeller}"])
        assert f"precision {precision}" in capsys.readouterr().out
    rows = read_jsonl(f)
    assert len(rows) == 252 and sum(r["adjudicated"] for r in rows) == 28
    assert all((r["label_1"] == r["label_2"] == r["label"]) != r["adjudicated"] for r in rows)
    # every concept audited is one no critic label, held-out judgement or default run has seen
    audited = {r["concept"] for r in rows}
    nouns = (ANNOTATIONS / "kept_audit_fresh.nouns.txt").read_text().split("\n")
    goals = (ANNOTATIONS / "kept_audit_fresh.goals.txt").read_text().split("\n")
    assert audited <= set(nouns) | set(goals)
    seen = {r.get("concept") for p in ANNOTATIONS.glob("*.jsonl") if p.name != "kept_audit_fresh.jsonl"
            for r in read_jsonl(p)}
    assert not audited & seen
    import yaml
    task = yaml.safe_load((ROOT / "conf" / "task" / "i2d2.yaml").read_text())["task"]
    assert not audited & set(task["heldout"]["nouns"] + task["heldout"]["goals"])


def test_rows_the_critic_passed_but_a_later_rule_dropped_count_in_its_ap(tmp_path, audit, capsys):
    """The filter scores every finished statement and only then drops empty ones, unmet constraints and repeated
    list items (i2d2.recipes.generics.filter_generations): those rows carry a critic score above δ and are part of
    what the critic ranked. Leaving them out hid the critic's top-scored false statements from its AP."""
    from i2d2.recipes.generics import filter_generations
    from i2d2.io import write_arrow

    gens = [("dog", "bark loudly."), ("dog", "eat meat, bones, meat."), ("cat", "purr."), ("cat", "chase dogs.")]
    write_arrow(tmp_path / "generations" / "table" / "shard-00000.arrow",
                [{"prompt_id": f"p{i}", "prompt": c.capitalize() + "s", "generation": g, "rank_in_prompt": 0,
                  "all_satisfied": True, "concept": c} for i, (c, g) in enumerate(gens)])
    scores = {"Dogs bark loudly.": 0.8, "Dogs eat meat, bones, meat.": 0.95, "Cats purr.": 0.7, "Cats chase dogs.": 0.2}
    out = tmp_path / "run" / "iter_0" / "filtered"
    out.mkdir(parents=True)
    filter_generations(tmp_path / "generations", out, lambda t: np.array([scores[x] for x in t]), 0.5,
                       {"dedupe": False, "max_per_concept": None})
    blind = tmp_path / "blind.csv"
    audit.main(["export", "--run-dir", str(tmp_path / "run"), "--rejected", "10", "--out", str(blind)])
    key = {r["item_id"]: r for r in read_jsonl(tmp_path / "run" / "iter_0" / "audit" / "key.jsonl")}
    assert {r["drop_reason"]: r["critic_score"] for r in key.values() if not r["kept"]} == {
        "repeated_item": 0.95, "critic": 0.2}
    done = tmp_path / "done.csv"
    _label(blind, done, key, lambda r: r["drop_reason"] != "repeated_item" and r["critic_score"] != 0.2)
    capsys.readouterr()
    audit.main(["score", "--run-dir", str(tmp_path / "run"), "--labels", str(done)])
    out = capsys.readouterr().out
    ap = average_precision_score([1, 0, 1, 0], [0.8, 0.95, 0.7, 0.2])  # the looped list is the critic's top score
    assert f"weighted to the population): {ap:.3f} (base rate 0.500, 4 labelled)" in out


def test_dont_know_rows_are_left_out_alike_on_the_kept_and_the_dropped_side(tmp_path, audit, capsys):
    """A dropped row stands for total / sampled rows of its reason (its inverse sampling rate), dont_know or not:
    dividing by the judged rows only counted a dropped dont_know at its reason's true share while a kept dont_know
    counted as not true, which pulled the recall down and over-weighted the dropped rows in the AP."""
    def row(i, score):
        return {"statement": f"Statement number {i}.", "concept": "c", "critic_score": score, "drop_reason": "critic"}
    f = tmp_path / "run" / "iter_0" / "filtered"
    save_table(f / "kept", datasets.Dataset.from_list([{**row(i, s), "drop_reason": None}
                                                      for i, s in enumerate((0.9, 0.85, 0.8, 0.75))]))
    save_table(f / "dropped", datasets.Dataset.from_list([row(10 + i, s) for i, s in enumerate((0.4, 0.3, 0.2, 0.1))]))
    blind = tmp_path / "blind.csv"
    audit.main(["export", "--run-dir", str(tmp_path / "run"), "--rejected", "4", "--out", str(blind)])  # all drawn
    key = {r["item_id"]: r for r in read_jsonl(tmp_path / "run" / "iter_0" / "audit" / "key.jsonl")}
    label_of = {0.9: "true", 0.85: "true", 0.8: "dont_know", 0.75: "vague",  # kept: 2 true of 3 judged
                0.4: "true", 0.3: "dont_know", 0.2: "vague", 0.1: "dont_know"}  # dropped: 1 true of 2 judged
    rows = list(csv.DictReader(blind.open()))
    with (tmp_path / "done.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=["item_id", "statement", "label"])
        w.writeheader()
        w.writerows([{**r, "label": label_of[key[r["item_id"]]["critic_score"]]} for r in rows])
    capsys.readouterr()
    audit.main(["score", "--run-dir", str(tmp_path / "run"), "--labels", str(tmp_path / "done.csv")])
    out = capsys.readouterr().out
    assert "4 dropped in all, ~1.0 true" in out  # every dropped row was drawn: 1 labelled true, 1 true in all
    assert "filter recall (estimated): 0.667" in out  # 2 true kept / (2 + 1)
    ap = average_precision_score([1, 1, 0, 1, 0], [0.9, 0.85, 0.75, 0.4, 0.2])  # a census: every weight 1
    assert f"weighted to the population): {ap:.3f} (base rate 0.600, 5 labelled)" in out


def test_by_concept_names_the_concepts_with_no_true_kept_row_and_their_mean_scores(tmp_path, audit, capsys):
    """--by-concept: the kept set per concept (true of judged) and, from the run, each concept's mean critic score over
    every scored generation of it (kept and dropped, the whole table, not the audit's sample)."""
    f = tmp_path / "run" / "iter_0" / "filtered"
    kept = [("a", "Ants are insects.", 0.9), ("a", "Ants live in colonies.", 0.8),
            ("b", "Bees are fish.", 0.7), ("c", "Cats purr.", 0.95), ("c", "Cats are plants.", 0.6)]
    save_table(f / "kept", datasets.Dataset.from_list(
        [{"statement": s, "concept": c, "critic_score": x, "drop_reason": None} for c, s, x in kept]))
    save_table(f / "dropped", datasets.Dataset.from_list(
        [{"statement": f"Bees thing {i}.", "concept": "b", "critic_score": 0.1, "drop_reason": "critic"}
         for i in range(3)] + [{"statement": "Cats are", "concept": "c", "critic_score": None,
                                "drop_reason": "unfinished"}]))
    blind = tmp_path / "blind.csv"
    audit.main(["export", "--run-dir", str(tmp_path / "run"), "--rejected", "1", "--out", str(blind)])
    key = {r["item_id"]: r for r in read_jsonl(tmp_path / "run" / "iter_0" / "audit" / "key.jsonl")}
    truth = {"Ants are insects.", "Ants live in colonies.", "Cats purr."}
    _label(blind, tmp_path / "done.csv", key, lambda r: r["statement"] in truth)
    capsys.readouterr()
    audit.main(["score", "--run-dir", str(tmp_path / "run"), "--labels", str(tmp_path / "done.csv"), "--by-concept"])
    out = capsys.readouterr().out
    assert "  b: 0 of 1, mean score 0.250\n" in out  # (0.7 + 3 × 0.1) / 4: the dropped rows the sample left out count
    assert "  c: 1 of 2, mean score 0.775\n" in out  # the unscored (unfinished) row left out
    assert "  a: 2 of 2, mean score 0.850\n" in out
    assert out.index("  b: ") < out.index("  c: ") < out.index("  a: ")  # worst concepts first
    assert "concepts with no kept statement judged true: 1 (b), 1 kept rows" in out
    assert "Spearman 1.000 over 3 concepts" in out
    audit.main(["score", "--key", str(tmp_path / "run" / "iter_0" / "audit" / "key.jsonl"),
                "--labels", str(tmp_path / "done.csv"), "--by-concept"])
    assert "  b: 0 of 1\n" in capsys.readouterr().out  # without the run, no mean scores


def _labelled(tmp_path, audit, rejected: int, label_of) -> tuple[Path, list[dict]]:
    """The _run export with ``rejected`` dropped rows drawn, labelled by ``label_of(key row)`` into done.csv."""
    run = _run(tmp_path)
    blind = tmp_path / "blind.csv"
    audit.main(["export", "--run-dir", str(run), "--rejected", str(rejected), "--out", str(blind)])
    key = {r["item_id"]: r for r in read_jsonl(run / "iter_0" / "audit" / "key.jsonl")}
    rows = list(csv.DictReader(blind.open()))
    with (tmp_path / "done.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=["item_id", "statement", "label"])
        w.writeheader()
        w.writerows([{**r, "label": label_of(key[r["item_id"]])} for r in rows])
    return run, rows


def test_agreement_with_nothing_to_compare_or_one_class_says_so(tmp_path, audit, capsys):
    # a second labeller who answered dont_know everywhere crashed the agreement (zip of nothing); two who used one
    # class printed "Cohen's kappa nan"
    run, rows = _labelled(tmp_path, audit, 5, lambda r: "true")
    with (tmp_path / "unsure.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=["item_id", "statement", "label"])
        w.writeheader()
        w.writerows([{**r, "label": "dont_know"} for r in rows])
    capsys.readouterr()
    audit.main(["score", "--run-dir", str(run), "--labels", str(tmp_path / "done.csv"),
                "--labels", str(tmp_path / "unsure.csv"), "--labels", str(tmp_path / "done.csv")])
    out = capsys.readouterr().out
    assert f"agreement with {tmp_path / 'unsure.csv'}: nothing to compare" in out
    assert f"agreement with {tmp_path / 'done.csv'}: 1.000 on {len(rows)} items, Cohen's kappa undefined (one class)" \
        in out and "nan" not in out


def test_recall_is_unknown_when_no_dropped_statement_was_drawn(tmp_path, audit, capsys):
    # with --rejected 0 it printed "filter recall (estimated): 1.000" below "the sample did not draw" every drop
    run, _ = _labelled(tmp_path, audit, 0, lambda r: "true")
    capsys.readouterr()
    audit.main(["score", "--run-dir", str(run), "--labels", str(tmp_path / "done.csv")])
    out = capsys.readouterr().out
    assert "dropped for reasons the sample did not draw: 52" in out
    assert "filter recall (estimated): unknown (none of the 52 dropped statements was drawn" in out
