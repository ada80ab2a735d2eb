"""Regression tests from an audit of the annotation round-trip and the numbers the I2D2 report gives."""

import json

import pytest

from i2d2.annotation import export_blind, heldout_store, import_annotations, import_blind, labels_store
from i2d2.io import DataError, read_csv, read_jsonl, write_csv, write_jsonl


def _fake_run(root):
    for k, texts in enumerate([["Dogs bark.", "Dogs fly.", "Cats purr."], ["Dogs bark.", "Owls hoot.", "Cats are."]]):
        d = root / f"iter_{k}" / "heldout"
        d.mkdir(parents=True)
        write_jsonl(d / "statements.jsonl", [{"statement": t, "concept": t.split()[0].lower()} for t in texts])
    return root


def _ids(run, tmp_path):
    return {it["statement"]: it["item_id"] for it in export_blind(run, tmp_path / "b.csv", n_per_iteration=3)}


def test_csv_errors_name_the_line_the_row_is_on(tmp_path):
    """A blank line (skipped by the csv reader) or a quoted statement holding a newline shifted every later row's
    line number: the labeller was sent to the wrong row."""
    run = _fake_run(tmp_path / "run")
    ids = _ids(run, tmp_path)
    head = "item_id,statement,label,votes\n"
    (tmp_path / "blank.csv").write_text(f"{head}{ids['Dogs bark.']},Dogs bark.,true,\n\n{ids['Dogs fly.']},Dogs fly.,maybe,\n")
    with pytest.raises(DataError, match=r"blank\.csv:4: unknown label"):
        import_blind(tmp_path / "blank.csv", run)
    (tmp_path / "nl.csv").write_text(f'{head}{ids["Dogs bark."]},"Dogs\nbark.",true,\n{ids["Dogs fly."]},Dogs fly.,maybe,\n')
    with pytest.raises(DataError, match=r"nl\.csv:4: unknown label"):
        import_blind(tmp_path / "nl.csv", run)
    # the non-blind import reads its CSV the same way
    (tmp_path / "done.csv").write_text('concept,statement,label\n\ndog,"Dogs\nbark.",true\ndog,Dogs fly.,maybe\n')
    with pytest.raises(DataError, match=r"done\.csv:5: unknown label"):
        import_annotations(tmp_path / "done.csv")


def test_a_statement_labelled_twice_differently_in_one_file_is_refused(tmp_path):
    """The store keeps one row per statement: the first label was dropped unseen while the count said 2."""
    run = _fake_run(tmp_path / "run")
    ids = _ids(run, tmp_path)
    fly = ids["Dogs fly."]
    (tmp_path / "dup.csv").write_text(f"item_id,statement,label,votes\n{fly},Dogs fly.,true,\n{fly},Dogs fly.,false,\n")
    with pytest.raises(DataError, match=r"dup\.csv:3: statement labelled again, differently: line 2 says 'true'"):
        import_blind(tmp_path / "dup.csv", run)
    assert not heldout_store(run).exists()
    errors = []
    assert len(import_blind(tmp_path / "dup.csv", run, on_error="skip", errors=errors)) == 1 and len(errors) == 1
    # the same label twice is one statement, counted once
    (tmp_path / "same.csv").write_text(f"item_id,statement,label,votes\n{fly},Dogs fly.,false,\n{fly},x,False,\n")
    assert len(import_blind(tmp_path / "same.csv", run)) == 1
    store = labels_store(tmp_path / "run2")
    (tmp_path / "two.csv").write_text("concept,statement,label\ndog,Dogs bark.,true\ndog,dogs bark,garbled\n")
    with pytest.raises(DataError, match=r"two\.csv:3: statement labelled again"):
        import_annotations(tmp_path / "two.csv", store)
    assert not store.exists()


def test_cli_refuses_non_positive_counts_and_names_a_broken_store(tmp_path, capsys):
    from i2d2.annotate import main

    run = _fake_run(tmp_path / "run")
    write_jsonl(tmp_path / "gen.jsonl", [{"statement": f"S {i}.", "concept": "c", "critic_score": i / 10} for i in range(5)])
    # --k 0 was a numpy traceback; --n -1 silently exported all but one statement of every iteration
    for argv in (["export", "--input", str(tmp_path / "gen.jsonl"), "--out", str(tmp_path / "o.csv"), "--k", "0"],
                 ["export", "--blind", "--run-dir", str(run), "--out", str(tmp_path / "b.csv"), "--n", "-1"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2 and "must be a positive integer" in capsys.readouterr().err
    assert not (tmp_path / "o.csv").exists() and not (tmp_path / "b.csv").exists()
    # a store row without a statement was a KeyError traceback: now file:line
    (tmp_path / "store.jsonl").write_text('{"statement": "S 1.", "label": "true"}\n{"label": "true"}\n')
    assert main(["export", "--input", str(tmp_path / "gen.jsonl"), "--out", str(tmp_path / "o.csv"),
                 "--store", str(tmp_path / "store.jsonl")]) == 2
    assert "store.jsonl:2: missing field(s) statement" in capsys.readouterr().err
    (tmp_path / "done.csv").write_text("concept,statement,label\nc,S 2.,true\n")
    assert main(["import", "--input", str(tmp_path / "done.csv"), "--store", str(tmp_path / "store.jsonl")]) == 2
    assert "store.jsonl:2: missing field(s) statement" in capsys.readouterr().err
    key = run / "annotations" / "blind_key.jsonl"
    main(["export", "--blind", "--run-dir", str(run), "--out", str(tmp_path / "b.csv")])
    key.write_text(key.read_text() + '{"statement": "Dogs bark."}\n')
    assert main(["import", "--blind", "--run-dir", str(run), "--input", str(tmp_path / "b.csv")]) == 2
    assert "blind_key.jsonl:6: missing field(s) item_id, iterations" in capsys.readouterr().err


def test_report_pr_of_human_labels_uses_only_the_critics_test_concepts(tmp_path):
    """The loop's critic trains on the labels store: the report's human-label PR curve (Figure 7) and precision at
    δ were measured on statements the critic had been fitted on (or chose δ with)."""
    import pyarrow as pa
    from omegaconf import OmegaConf

    from i2d2.io import save_table
    from i2d2.recipes.generics import report_stage

    run, it = tmp_path / "run", tmp_path / "run" / "iter_0"
    rows = [{"statement": s, "concept": c, "critic_score": p, "all_satisfied": True, "generation": s, "prompt": ""}
            for s, c, p in [("Dogs bark.", "dog", 0.9), ("Dogs meow.", "dog", 0.1),  # a train concept: fitted on
                            ("Cats purr.", "cat", 0.3), ("Cats bark.", "cat", 0.8)]]  # a test concept
    write_jsonl(it / "filtered" / "kept.jsonl", [r for r in rows if r["critic_score"] > 0.5])
    save_table(it / "filtered" / "dropped",
               pa.Table.from_pylist([dict(r, drop_reason="critic") for r in rows if r["critic_score"] <= 0.5]))
    (it / "critic" / "model").mkdir(parents=True)
    (it / "critic" / "split.json").write_text(json.dumps({"train_concepts": ["dog"], "dev_concepts": [],
                                                          "test_concepts": ["cat"]}))
    write_jsonl(it / "critic" / "test_scores.jsonl", [{"statement": "x", "y": 1, "critic_score": 0.5}])
    write_jsonl(labels_store(run), [{"statement": r["statement"], "concept": r["concept"],
                                     "label": "true" if r["statement"] in ("Dogs bark.", "Cats purr.") else "false"}
                                    for r in rows])
    cfg = OmegaConf.create({"run_dir": str(run), "seed": 0, "task": {"report": {"samples": 2}}, "critic": {}})
    out = report_stage(cfg, 0, it, {"n_generations": 4}, {"model_dir": str(it / "critic" / "model")},
                       {"delta": 0.5, "accepted_rate": 0.5, "keep_rate": 0.5, "n_kept": 2}, {}, {}, {}, "tiny", None)
    pr = json.loads((it / "report" / "pr_data.json").read_text())
    assert pr["source"] == "human labels" and pr["y"] == [0, 1] and pr["scores"] == [0.8, 0.3]  # cats only
    assert out["human_accuracy"] == 0.5 and out["human_n_labelled"] == 4  # the generator's accuracy: every label
    assert out["human_precision_at_delta"] == 0.0  # "Cats bark." (false) is the test concept's one kept row
    # no labelled generation of a test concept: the curve is the critic's test split, not its training labels
    (it / "critic" / "split.json").write_text(json.dumps({"test_concepts": ["owl"]}))
    out = report_stage(cfg, 0, it, {"n_generations": 4}, {"model_dir": str(it / "critic" / "model")},
                       {"delta": 0.5, "accepted_rate": 0.5, "keep_rate": 0.5, "n_kept": 2}, {}, {}, {}, "tiny", None)
    assert json.loads((it / "report" / "pr_data.json").read_text())["source"].startswith("critic test split")
    assert out["human_precision_at_delta"] is None and out["human_accuracy"] == 0.5
    assert read_jsonl(labels_store(run))  # the store is only read


def test_blind_export_to_jsonl_is_jsonl_and_imports_back(tmp_path):
    """A .jsonl blind export held CSV text, which import --blind then refused line by line as broken JSON."""
    run = _fake_run(tmp_path / "run")
    items = export_blind(run, tmp_path / "b.jsonl", n_per_iteration=3)
    rows = read_jsonl(tmp_path / "b.jsonl")
    assert len(rows) == len(items) and all(set(r) == {"item_id", "statement", "label", "votes"} for r in rows)
    write_jsonl(tmp_path / "done.jsonl", [dict(r, label="true") for r in rows])
    assert len(import_blind(tmp_path / "done.jsonl", run)) == len(items) == 5


def test_a_newer_dont_know_overrides_an_older_label(tmp_path):
    """Newest annotation wins (the run's store after the seed set), a don't-know too: the older label of a
    statement the maintainer could no longer judge is not trained on."""
    from critics.data import load_annotations

    seed, store = tmp_path / "seed.jsonl", tmp_path / "store.jsonl"
    write_jsonl(seed, [{"statement": "Dogs bark.", "concept": "dog", "label": "true"},
                       {"statement": "Cats purr.", "concept": "cat", "label": "true"}])
    write_jsonl(store, [{"statement": "dogs bark", "concept": "dog", "label": "dont_know"}])
    assert [r["statement"] for r in load_annotations([seed, store])] == ["Cats purr."]
    assert [r["statement"] for r in load_annotations([store, seed])] == ["Dogs bark.", "Cats purr."]


def test_held_out_statements_skip_folders_that_are_not_iterations(tmp_path):
    from i2d2.annotation import heldout_statements

    run = _fake_run(tmp_path / "run")
    bak = run / "iter_0.bak" / "heldout"
    bak.mkdir(parents=True)
    write_jsonl(bak / "statements.jsonl", [{"statement": "Old.", "concept": "old"}])
    rows = heldout_statements(run)
    assert [r["iteration"] for r in rows] == [0, 0, 0, 1, 1, 1]


def test_concurrent_imports_into_one_store_keep_both_annotators_labels(tmp_path):
    import threading
    import time

    import filelock

    from i2d2.annotation import merge_labels

    store = tmp_path / "labels.jsonl"
    merge_labels(store, [{"statement": "Birds can fly.", "concept": "bird", "label": "true"}])
    # another import is between its read and its write: this one must wait, then merge over what that one wrote
    other = filelock.FileLock(tmp_path / ".labels.jsonl.lock")
    other.acquire()
    done = threading.Event()
    worker = threading.Thread(target=lambda: (merge_labels(
        store, [{"statement": "Fish can swim.", "concept": "fish", "label": "true"}]), done.set()))
    worker.start()
    time.sleep(0.3)
    assert not done.is_set()  # waiting for the lock, not writing a store that would drop the other's rows
    rows = read_jsonl(store)
    write_jsonl(store, rows + [{"statement": "Cats can bark.", "concept": "cat", "label": "false"}])
    other.release()
    worker.join(10)
    assert done.is_set()
    assert sorted(r["statement"] for r in read_jsonl(store)) == ["Birds can fly.", "Cats can bark.", "Fish can swim."]


@pytest.mark.parametrize("name,text,pattern", [
    # a file of statements, not of labels: was imported as 0 labelled statements, exit code 0
    ("nolabel.csv", "statement,concept\nDogs bark.,dog\n", r"nolabel\.csv:1: header needs a column label or votes"),
    ("header.csv", "statement,concept,label\n", r"header\.csv: no rows below the header"),
    ("empty.jsonl", "", r"empty\.jsonl: no rows \(an empty file\)"),
    ("nolabel.jsonl", '{"statement": "Dogs bark.", "concept": "dog"}\n',
     r"nolabel\.jsonl: no row has a 'label' or 'votes' key"),
])
def test_an_import_without_labels_is_an_error(tmp_path, name, text, pattern):
    (tmp_path / name).write_text(text)
    with pytest.raises(DataError, match=pattern):
        import_annotations(tmp_path / name, tmp_path / "store.jsonl")
    assert not (tmp_path / "store.jsonl").exists()
    import_annotations(_write(tmp_path / "votes.csv", "statement,concept,votes\nDogs bark.,dog,true|true\n"))
    # labelled in part: the labelled row imports, the row with an empty label is skipped as unlabelled
    part = _write(tmp_path / "part.jsonl", '{"statement": "Dogs bark.", "concept": "dog", "label": "true"}\n'
                                           '{"statement": "Cats purr.", "concept": "cat", "label": ""}\n')
    assert [r["statement"] for r in import_annotations(part)] == ["Dogs bark."]


def test_a_blind_import_without_rows_is_an_error(tmp_path):
    run = _fake_run(tmp_path / "run")
    _ids(run, tmp_path)
    with pytest.raises(DataError, match=r"h\.csv: no rows below the header"):
        import_blind(_write(tmp_path / "h.csv", "item_id,statement,label\n"), run)


def _write(path, text):
    path.write_text(text)
    return path


@pytest.mark.parametrize("blind", [True, False], ids=["blind", "sample"])
def test_an_export_never_writes_over_labels_or_another_file(tmp_path, capsys, blind):
    """Exporting twice into the file being labelled wiped its labels, and ``--out`` naming the input (kept.jsonl)
    replaced it with the sample; both exited 0. An unlabelled earlier export is still replaced."""
    from i2d2.annotate import main

    run = _fake_run(tmp_path / "run")
    write_jsonl(tmp_path / "kept.jsonl", [{"statement": "Dogs bark.", "concept": "dog", "critic_score": 0.9}])

    def export(out):
        return main(["export", "--blind", "--run-dir", str(run), "--out", str(out)] if blind else
                    ["export", "--input", str(tmp_path / "kept.jsonl"), "--out", str(out)])

    assert export(tmp_path / "b.jsonl") == 0 and export(tmp_path / "b.jsonl") == 0  # nothing labelled yet
    rows = read_jsonl(tmp_path / "b.jsonl")
    write_jsonl(tmp_path / "b.jsonl", [dict(rows[0], label="true"), *rows[1:]])
    key = run / "annotations" / "blind_key.jsonl"
    before = {p: p.read_bytes() for p in (tmp_path / "b.jsonl", tmp_path / "kept.jsonl", key) if p.exists()}
    capsys.readouterr()
    assert export(tmp_path / "b.jsonl") == 2
    assert f"error: --out {tmp_path}/b.jsonl holds 1 label(s) not in the labels store" in capsys.readouterr().err
    assert export(tmp_path / "kept.jsonl") == 2
    assert "is not an export of statements to label" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in before} == before
    (tmp_path / "empty.jsonl").write_text("")  # an empty file loses nothing (`touch` before the first export)
    assert export(tmp_path / "empty.jsonl") == 0


@pytest.mark.parametrize("suffix", ["csv", "jsonl"])
def test_the_blind_round_exports_again_over_a_file_it_imported(tmp_path, capsys, suffix):
    """The README's round, once an iteration: export --blind, label, import --blind, export --blind to the same file.
    The labels are in the store after the import, so writing over the file loses nothing; the refusal ("import it
    first") could not be cleared by importing."""
    from i2d2.annotate import main

    run = _fake_run(tmp_path / "run")
    out = tmp_path / f"blind.{suffix}"
    export = ["export", "--blind", "--run-dir", str(run), "--out", str(out), "--n", "1"]
    assert main(export) == 0
    rows = read_csv(out) if suffix == "csv" else read_jsonl(out)
    rows = [dict(r, label="true") for r in rows]
    write_csv(out, rows, list(rows[0])) if suffix == "csv" else write_jsonl(out, rows)
    assert main(["import", "--blind", "--run-dir", str(run), "--input", str(out)]) == 0
    assert main(export) == 0, capsys.readouterr().err


@pytest.mark.parametrize("blind", [True, False], ids=["blind", "sample"])
def test_an_export_never_writes_over_a_label_corrected_after_its_import(tmp_path, capsys, blind):
    """Export, label, import, then correct a label in the file and export to it again before importing: the
    statement was in the store, so the export wrote over the file and the correction was lost, exit 0."""
    from i2d2.annotate import main

    run = _fake_run(tmp_path / "run")
    write_jsonl(tmp_path / "kept.jsonl", [{"statement": "Dogs bark.", "concept": "dog", "critic_score": 0.9}])
    out, store = tmp_path / "b.jsonl", tmp_path / "store.jsonl"
    export = (["export", "--blind", "--run-dir", str(run), "--out", str(out), "--n", "1"] if blind else
              ["export", "--input", str(tmp_path / "kept.jsonl"), "--out", str(out), "--store", str(store)])
    imp = (["import", "--blind", "--run-dir", str(run), "--input", str(out)] if blind else
           ["import", "--input", str(out), "--store", str(store)])
    assert main(export) == 0
    write_jsonl(out, [dict(r, label="vague") for r in read_jsonl(out)])
    assert main(imp) == 0
    labelled = out.read_bytes()
    rows = read_jsonl(out)
    write_jsonl(out, [dict(rows[0], label="true"), *rows[1:]])  # the correction
    corrected = out.read_bytes()
    capsys.readouterr()
    assert main(export) == 2
    assert "holds 1 label(s) not in the labels store (or stored otherwise" in capsys.readouterr().err
    assert out.read_bytes() == corrected
    out.write_bytes(labelled.replace(b'"vague"', b'"Vague"'))  # the stored label, spelt otherwise: nothing to lose
    assert main(export) == 0


def test_accuracy_of_a_run_without_held_out_generations_is_an_error(tmp_path, capsys):
    """A misspelt --run-dir printed an empty table with exit code 0."""
    from i2d2.annotate import main

    assert main(["accuracy", "--run-dir", str(tmp_path / "nonexistent")]) == 2
    assert f"error: no held-out generations under {tmp_path}/nonexistent/iter_*/heldout/" in capsys.readouterr().err
    assert main(["accuracy", "--run-dir", str(_fake_run(tmp_path / "run"))]) == 0
    assert "| 1 | 3 | 0 | – | – |" in capsys.readouterr().out


def test_export_names_the_input_and_line_that_lacks_a_field(tmp_path, capsys):
    """'row 1: needs fields ...' named no file (rows of every --input together) and no line."""
    from i2d2.annotate import main

    write_jsonl(tmp_path / "kept.jsonl", [{"statement": "Dogs bark.", "concept": "dog"}])
    (tmp_path / "gens.jsonl").write_text('{"statement": "Owls hoot.", "concept": "owl"}\n\n{"generation": "x"}\n')
    assert main(["export", "--input", str(tmp_path / "kept.jsonl"), "--input", str(tmp_path / "gens.jsonl"),
                 "--out", str(tmp_path / "s.csv")]) == 2
    assert (f"error: {tmp_path}/gens.jsonl:3: missing field(s) statement, concept (--text-key / --concept-key name "
            "other fields)") in capsys.readouterr().err
    assert not (tmp_path / "s.csv").exists()


@pytest.mark.parametrize("row", [{"statement": "Owls hoot.", "concept": None}, {"statement": "", "concept": "owl"}])
def test_export_reads_jsonl_as_every_reader_does_an_empty_field_is_missing(tmp_path, capsys, row):
    """annotate's own JSONL check took a present key as a value: a null concept was exported as concept 'None'
    (stream_jsonl, which every other reader uses, calls a null or empty field missing)."""
    from i2d2.annotate import main

    write_jsonl(tmp_path / "gens.jsonl", [{"statement": "Dogs bark.", "concept": "dog"}, row])
    assert main(["export", "--input", str(tmp_path / "gens.jsonl"), "--out", str(tmp_path / "s.csv")]) == 2
    assert f"error: {tmp_path}/gens.jsonl:2: missing field(s) " in capsys.readouterr().err
    assert not (tmp_path / "s.csv").exists()


def test_a_folder_or_file_in_place_of_a_path_is_an_error_not_a_traceback(tmp_path, capsys):
    """Only DataError and FileNotFoundError were caught: --store or --input naming a folder (IsADirectoryError), a
    --store inside a file (FileExistsError) were tracebacks."""
    from i2d2.annotate import main

    (tmp_path / "folder").mkdir()
    (tmp_path / "notes.txt").write_text("kept\n")
    done = tmp_path / "done.jsonl"
    write_jsonl(done, [{"statement": "Dogs bark.", "concept": "dog", "label": "true"}])
    for args in (["--input", str(done), "--store", str(tmp_path / "folder")],
                 ["--input", str(tmp_path / "folder"), "--store", str(tmp_path / "s.jsonl")],
                 ["--input", str(done), "--store", str(tmp_path / "notes.txt" / "labels.jsonl")]):
        assert main(["import", *args]) == 2
        assert capsys.readouterr().err.startswith("error: ")
    assert (tmp_path / "notes.txt").read_text() == "kept\n" and not (tmp_path / "s.jsonl").exists()


def test_a_blind_export_killed_between_its_writes_leaves_no_export_without_its_key(tmp_path, monkeypatch):
    """The export was written before the key: a kill between the two left items no key held, whose labels could
    never be imported."""
    import i2d2.io

    def killed(point):
        if point == "write:blind_key.jsonl":
            raise KeyboardInterrupt(point)

    run = _fake_run(tmp_path / "run")
    monkeypatch.setattr(i2d2.io, "fault_point", killed)
    with pytest.raises(KeyboardInterrupt):
        export_blind(run, tmp_path / "b.csv", n_per_iteration=3)
    assert not (tmp_path / "b.csv").exists() and not (run / "annotations" / "blind_key.jsonl").exists()
    monkeypatch.undo()
    items = export_blind(run, tmp_path / "b.csv", n_per_iteration=3)  # the rerun: both, the same items
    assert {r["item_id"] for r in read_jsonl(run / "annotations" / "blind_key.jsonl")} == {i["item_id"] for i in items}


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_a_blind_export_given_to_the_plain_import_names_blind(tmp_path, capsys, suffix):
    """A labelled `export --blind` file imported without --blind said only 'header lacks column(s) concept'
    (CSV) or "missing 'statement' or 'concept'" on every line (JSONL)."""
    from i2d2.annotate import main

    run = _fake_run(tmp_path / "run")
    export_blind(run, tmp_path / f"b{suffix}", n_per_iteration=3)
    rows = read_csv(tmp_path / "b.csv") if suffix == ".csv" else read_jsonl(tmp_path / "b.jsonl")
    done = tmp_path / f"done{suffix}"
    rows = [{k: v for k, v in dict(r, label="true").items() if k != "_line"} for r in rows]
    if suffix == ".csv":
        write_csv(done, rows, ["item_id", "statement", "label", "votes"])
    else:
        write_jsonl(done, rows)
    assert main(["import", "--input", str(done), "--store", str(tmp_path / "store.jsonl")]) == 2
    err = capsys.readouterr().err
    assert f"{done}: a blind export" in err and "import --blind --run-dir" in err
    assert not (tmp_path / "store.jsonl").exists()
    assert len(import_blind(done, run)) == 5  # what the message says works


def test_curly_and_straight_apostrophes_are_one_statement_to_label(tmp_path):
    """Gemma writes "It’s" and "It's" alike: the blind export showed a person both as two items, and the store
    would keep two labels of one statement."""
    root = tmp_path / "run"
    for k, texts in enumerate([["A dog’s nose is wet.", "Owls hoot."], ["A dog's nose is wet.", "Cats purr."]]):
        d = root / f"iter_{k}" / "heldout"
        d.mkdir(parents=True)
        write_jsonl(d / "statements.jsonl", [{"statement": t, "concept": "dog"} for t in texts])
    items = export_blind(root, tmp_path / "b.jsonl", n_per_iteration=2)
    assert sorted(it["statement"].replace("’", "'") for it in items) == ["A dog's nose is wet.", "Cats purr.",
                                                                         "Owls hoot."]


@pytest.mark.parametrize("flag", ["--n", "--k"])
def test_a_count_that_is_no_number_is_refused_in_words(tmp_path, capsys, flag):
    # was "argument --n: invalid _positive_int value: 'abc'" (the name of the parsing function)
    from i2d2.annotate import main

    with pytest.raises(SystemExit) as e:
        main(["export", "--input", str(tmp_path / "kept.jsonl"), "--out", str(tmp_path / "out.csv"), flag, "abc"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: must be a positive integer, not abc" in err and "_positive_int" not in err


def test_a_label_another_file_superseded_in_the_store_is_not_an_unimported_one(tmp_path, capsys):
    """One statement in two iterations' to_label.csv (the second exported before the first was imported), labelled
    differently, both imported: the store keeps the newer label. The first file's label was imported (and superseded,
    newer wins), yet it counted as 'not in the labels store': the rerun's filter-stage check stopped at its iteration
    asking to import it, which brought the old label back and stopped the rerun at the other file, and so on."""
    from i2d2.annotate import main
    from i2d2.annotation import labels_not_imported

    store = tmp_path / "store.jsonl"
    a, b = tmp_path / "iter_0.csv", tmp_path / "iter_1.csv"
    for path, label in ((a, "true"), (b, "false")):
        write_csv(path, [{"item_id": "x1", "statement": "Dogs bark.", "concept": "dog", "label": label}],
                  columns=["item_id", "statement", "concept", "label"])
        assert main(["import", "--input", str(path), "--store", str(store)]) == 0
    assert [r["label"] for r in read_jsonl(store)] == ["false"]
    assert labels_not_imported(b, store) == 0
    assert labels_not_imported(a, store) == 0  # imported, then superseded by iter_1.csv: nothing unimported
    # the file's own label corrected after its import is still one the store does not hold
    write_csv(b, [{"item_id": "x1", "statement": "Dogs bark.", "concept": "dog", "label": "vague"}],
              columns=["item_id", "statement", "concept", "label"])
    assert labels_not_imported(b, store) == 1
