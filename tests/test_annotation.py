"""Annotation round-trip: stratified export, import with validation, label store across iterations."""

import csv

import numpy as np
import pytest

from critics.data import load_annotations
from i2d2.annotation import (critic_annotation_paths, export_for_annotation, import_annotations, labels_store,
                             merge_labels)
from i2d2.io import DataError, read_jsonl

LABELS = ["(Generally) True", "false", "Don't Know", "Huh???"]


def _generations(n_concepts=5, per_concept=12):
    rows = []
    for c in range(n_concepts):
        for j in range(per_concept):
            rows.append({"statement": f"Concept {c} statement number {j}, with a comma.", "concept": f"concept-{c}",
                         "prompt": f"Generally, concept {c}", "critic_score": (j + 0.5) / per_concept,
                         "prompt_id": f"p{c}-{j}"})
    return rows


def _fill_csv(path, out, labels):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for r, lab in zip(rows, labels):
        r["label"] = lab
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return rows


def test_export_is_stratified_by_critic_score(tmp_path):
    out = export_for_annotation(_generations(), tmp_path / "sample.jsonl", k_per_concept=4, seed=3)
    assert len(out) == 20
    for c in range(5):
        scores = sorted(r["critic_score"] for r in out if r["concept"] == f"concept-{c}")
        # 12 candidates with scores spread over (0, 1): one pick from each quartile
        assert [int(s * 4) for s in scores] == [0, 1, 2, 3]
    assert (tmp_path / "sample.instructions.md").exists()
    assert read_jsonl(tmp_path / "sample.jsonl") == out
    # concepts with fewer candidates than k give all of them; already-labelled statements are skipped
    rows = _generations(2, 3)
    out = export_for_annotation(rows, tmp_path / "s2.jsonl", k_per_concept=4, exclude=[rows[0]["statement"].upper()])
    assert len(out) == 5 and rows[0]["statement"] not in {r["statement"] for r in out}
    # rows the critic never scored (unfinished, dropped before it) are not sampled while scored ones exist
    rows = _generations(2, 6) + [{"statement": f"Concept {c} is cut off at", "concept": f"concept-{c}",
                                  "critic_score": None} for c in range(2) for _ in range(1)]
    rows += [{"statement": "Concept 9 ends in", "concept": "concept-9"}]  # nothing scored: uniform among its rows
    out = export_for_annotation(rows, tmp_path / "s3.jsonl", k_per_concept=6)
    assert all(r["critic_score"] is not None for r in out if r["concept"] != "concept-9")
    assert len(out) == 13 and [r["statement"] for r in out if r["concept"] == "concept-9"] == ["Concept 9 ends in"]


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_export_import_round_trip_loses_nothing(tmp_path, suffix):
    exported = export_for_annotation(_generations(), tmp_path / f"sample{suffix}", k_per_concept=4)
    labels = [LABELS[i % 4] for i in range(len(exported))]
    done = tmp_path / f"done{suffix}"
    if suffix == ".csv":
        _fill_csv(tmp_path / "sample.csv", done, labels)
    else:
        from i2d2.io import write_jsonl

        write_jsonl(done, [{**r, "label": lab} for r, lab in zip(exported, labels)])
    store = labels_store(tmp_path / "run")
    back = import_annotations(done, store_path=store, iteration=0)
    assert len(back) == len(exported)
    for e, b, lab in zip(exported, back, labels):
        for k in ("item_id", "concept", "statement", "prompt", "source"):
            assert b[k] == e[k], k
        assert b["critic_score"] == pytest.approx(e["critic_score"])
        assert b["label"] == {"(Generally) True": "true", "false": "false", "Don't Know": "dont_know",
                              "Huh???": "huh"}[lab]
        assert b["iteration"] == 0
    assert len(read_jsonl(store)) == len(exported)
    # the store feeds the next critic: every label maps (don't know is dropped by default)
    rows = load_annotations([store])
    assert len(rows) == len(exported) - labels.count("Don't Know")
    assert sum(r["y"] for r in rows) == labels.count("(Generally) True")


def test_labels_accumulate_across_iterations(tmp_path):
    run = tmp_path / "run"
    store = labels_store(run)
    first = [{"statement": "Ants live in colonies.", "concept": "ant", "label": "false"},
             {"statement": "Ants are tiny.", "concept": "ant", "label": "true"}]
    assert merge_labels(store, first) == {"n_total": 2, "n_new": 2, "n_updated": 0}
    second = [{"statement": "ants live in colonies", "concept": "ant", "label": "true"},  # re-labelled
              {"statement": "Ants can lift heavy loads.", "concept": "ant", "votes": ["true", "true", "false"],
               "label": ""}]
    assert merge_labels(store, second) == {"n_total": 3, "n_new": 1, "n_updated": 1}
    rows = load_annotations(critic_annotation_paths(["generics_gemma.jsonl"], run))
    by = {r["statement"]: r["y"] for r in rows}
    assert by["ants live in colonies"] == 1 and by["Ants can lift heavy loads."] == 1
    assert len(rows) > 400  # the seed set comes first, the store adds to it
    assert critic_annotation_paths(["generics_gemma.jsonl"], tmp_path / "fresh")[-1].name == "generics_gemma.jsonl"


def test_import_reports_unknown_labels_with_line_numbers(tmp_path):
    export_for_annotation(_generations(2, 4), tmp_path / "s.csv", k_per_concept=4)
    _fill_csv(tmp_path / "s.csv", tmp_path / "d.csv", ["true", "", "probably", "false", "true|x", "garbled",
                                                               "Huh???", "don't know"])
    with pytest.raises(DataError, match=r"d\.csv:4: unknown label"):
        import_annotations(tmp_path / "d.csv")
    errors = []
    rows = import_annotations(tmp_path / "d.csv", on_error="skip", errors=errors)
    assert [e.split(": ")[0].rsplit(":", 1)[1] for e in errors] == ["4", "6"]
    assert len(rows) == 5  # 8 rows: 1 unlabelled, 2 bad
    assert [r["label"] for r in rows] == ["true", "false", "garbled", "huh", "dont_know"]


def test_annotate_cli_round_trip(tmp_path, capsys):
    from i2d2.annotate import main
    from i2d2.io import write_jsonl

    write_jsonl(tmp_path / "kept.jsonl", _generations(3, 6))
    store = tmp_path / "labels.jsonl"
    # the README's first export names the store before any import has made it: nothing to leave out yet
    assert main(["export", "--input", str(tmp_path / "kept.jsonl"), "--out", str(tmp_path / "s.csv"), "--k", "2",
                 "--store", str(store)]) == 0
    assert not store.exists()
    _fill_csv(tmp_path / "s.csv", tmp_path / "d.csv", ["true", "garbled"] * 3)
    assert main(["import", "--input", str(tmp_path / "d.csv"), "--store", str(store)]) == 0
    assert len(read_jsonl(store)) == 6
    # a second export skips what the store already holds
    assert main(["export", "--input", str(tmp_path / "kept.jsonl"), "--out", str(tmp_path / "s2.jsonl"),
                 "--k", "6", "--store", str(store)]) == 0
    assert len(read_jsonl(tmp_path / "s2.jsonl")) == 12
    _fill_csv(tmp_path / "s.csv", tmp_path / "bad.csv", ["sure"])
    assert main(["import", "--input", str(tmp_path / "bad.csv"), "--store", str(store)]) == 2
    assert "bad.csv:2: unknown label" in capsys.readouterr().err
    assert np.all([r["label"] in ("true", "garbled") for r in read_jsonl(store)])


def test_non_numeric_critic_score_is_refused_naming_where(tmp_path):
    rows = _generations(2, 4)
    rows[3]["critic_score"] = "high"
    with pytest.raises(DataError, match=r"row 4: critic_score 'high' is not a number"):
        export_for_annotation(rows, tmp_path / "s.csv", k_per_concept=4)
    export_for_annotation(_generations(2, 4), tmp_path / "s.csv", k_per_concept=4)
    done = _fill_csv(tmp_path / "s.csv", tmp_path / "d.csv", ["true"] * 8)
    done[1]["critic_score"] = "abc"
    with open(tmp_path / "d.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(done[0]))
        w.writeheader()
        w.writerows(done)
    with pytest.raises(DataError, match=r"d\.csv:3: could not convert string to float: 'abc'"):
        import_annotations(tmp_path / "d.csv")
    errors = []
    assert len(import_annotations(tmp_path / "d.csv", on_error="skip", errors=errors)) == 7 and len(errors) == 1
