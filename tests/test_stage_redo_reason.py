"""A stage redone because its inputs changed says which input changed (i2d2.io.prepare_stage's log line), from the
part descriptions the stage markers record beside the fingerprint; the fingerprint's hex itself is unchanged."""

import json
import logging
import pickle
from pathlib import Path

from i2d2 import io


def _redo(tmp_path, caplog, before, after, name="s"):
    """Run a stage with fingerprint ``before``, then with ``after``: the redo's log line."""
    out = tmp_path / name
    io.run_stage(out, before, lambda d: {})
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="i2d2.io"):
        io.run_stage(out, after, lambda d: {}, name=name)
    lines = [r.getMessage() for r in caplog.records if "inputs changed" in r.getMessage()]
    assert len(lines) == 1 and "\n" not in lines[0]
    return lines[0]


def test_fingerprint_hex_is_what_it_was_and_the_parts_are_described(tmp_path):
    """Run folders keep their markers: the hex of a known call is pinned (computed with the code before parts were
    described). A folder part is described by its path as given and its content digest, missing by None."""
    (tmp_path / "f.txt").write_text("hello\n")
    d = tmp_path / "dir"
    (d / "sub").mkdir(parents=True)
    (d / "a.txt").write_text("x")
    (d / "sub" / "b.txt").write_text("y")
    (d / ".hidden").write_text("z")  # dot files are left out
    fp = io.fingerprint({"delta": 0.5, "k": [1, "a"]}, "filter", 3, tmp_path / "f.txt", d, tmp_path / "missing")
    assert fp == "c92766e675031ac3" and isinstance(fp, str)
    assert fp.parts[:3] == [{"value": {"delta": 0.5, "k": [1, "a"]}}, {"value": "filter"}, {"value": 3}]
    assert fp.parts[3] == {"path": str(tmp_path / "f.txt"), "digest": io.file_digest(tmp_path / "f.txt")[:16]}
    assert fp.parts[4]["path"] == str(d) and len(fp.parts[4]["digest"]) == 16
    assert fp.parts[5] == {"path": str(tmp_path / "missing"), "digest": None}
    # a nested fingerprint hashes as its hex string did, and is described by its own parts
    outer = io.fingerprint(fp, 2)
    assert outer == io.fingerprint("c92766e675031ac3", 2)
    assert outer.parts[0] == {"fingerprint": "c92766e675031ac3", "parts": fp.parts}
    # a large config is recorded by its digest, not its text
    big = io.fingerprint(["w" * 100] * 50)
    assert list(big.parts[0]) == ["digest"]
    # a fingerprint crosses process boundaries (pickled for DDP / data loader workers) with its parts
    again = pickle.loads(pickle.dumps(outer))
    assert again == outer and again.parts == outer.parts


def test_markers_record_the_parts(tmp_path):
    fp = io.fingerprint({"k": 1}, "x")
    io.run_stage(tmp_path / "s", fp, lambda d: {})
    for marker in (io.STARTED, io.DONE):
        info = json.loads((tmp_path / "s" / marker).read_text())
        assert info["fingerprint"] == fp and info["parts"] == [{"value": {"k": 1}}, {"value": "x"}]


def test_markers_record_no_path_of_where_the_run_lies(tmp_path, monkeypatch):
    """A run folder can be moved and continued (tests/test_portable_run.py): an input inside the run is recorded
    relative to the stage folder, whether given relative to the working directory or absolute; one far outside it
    (a bundled data file) as given."""
    monkeypatch.chdir(tmp_path)
    run = Path("runs") / "i2d2"
    (run / "iter_0" / "generations").mkdir(parents=True)
    (run / "iter_0" / "generations" / "table").write_text("t")
    (run / "iter_0" / "model").mkdir()
    (run / "iter_0" / "model" / "w").write_text("w")
    bundled = Path(io.__file__).resolve()
    model = io.model_fingerprint(str(tmp_path / run / "iter_0" / "model"))  # a nested fingerprint of a folder
    io.run_stage(run / "iter_1" / "filtered", io.fingerprint(run / "iter_0" / "generations" / "table", model, bundled),
                 lambda d: {})
    info = json.loads((run / "iter_1" / "filtered" / io.DONE).read_text())
    assert [d.get("path") for d in info["parts"]] == ["../../iter_0/generations/table", None, str(bundled)]
    assert info["parts"][1]["parts"][0]["path"] == "../../iter_0/model"
    assert "runs/i2d2" not in json.dumps(info) and str(tmp_path) not in json.dumps(info)


def test_a_changed_config_key_is_named_with_old_and_new_value(tmp_path, caplog):
    cfg = {"delta": 0.605, "seed": 1, "dedupe": {"ratio": 90, "on": True}}
    line = _redo(tmp_path, caplog, io.fingerprint("filter", cfg),
                 io.fingerprint("filter", {**cfg, "delta": 0.5, "dedupe": {"ratio": 90, "on": False}}), "filter")
    assert line.startswith("stage filter: inputs changed (part 2 config: dedupe.on true -> false, delta 0.605 -> 0.5), "
                           "redoing it (removing ")
    # a key added or removed, and a value of another JSON type (1 and 1.0 hash differently)
    line = _redo(tmp_path, caplog, io.fingerprint({"a": 1, "b": 2}), io.fingerprint({"a": 1.0, "c": 3}), "t")
    assert "(part 1 config: a 1 -> 1.0, b 2 -> absent, c absent -> 3)" in line
    # a part that is not a dict: its old and new value
    line = _redo(tmp_path, caplog, io.fingerprint("x", 4), io.fingerprint("x", 5), "u")
    assert "(part 2: 4 -> 5)" in line


def test_a_changed_file_is_named(tmp_path, caplog):
    src = tmp_path / "data" / "iter_0" / "table.jsonl"
    src.parent.mkdir(parents=True)
    src.write_text("v1\n")
    before = io.fingerprint({"k": 1}, src)
    src.write_text("v2\n")
    line = _redo(tmp_path, caplog, before, io.fingerprint({"k": 1}, src))
    # a file is called by its path (from the stage folder tmp_path/s), not its position
    assert "(file ../data/iter_0/table.jsonl: content changed)" in line
    src.unlink()
    line = _redo(tmp_path, caplog, before, io.fingerprint({"k": 1}, src), "t")
    assert "table.jsonl: now missing)" in line


def test_a_long_path_and_long_values_are_cut_and_at_most_five_changes_listed(tmp_path, caplog):
    src = tmp_path / ("long" * 20) / "iter_0" / "generations" / "table"
    src.mkdir(parents=True)
    (src / "a").write_text("1")
    old = {f"k{i}": i for i in range(7)}
    before = io.fingerprint(src, {**old, "text": "a" * 100})
    (src / "a").write_text("2")
    line = _redo(tmp_path, caplog, before, io.fingerprint(src, {f"k{i}": i + 1 for i in range(7)} | {"text": "b"}))
    assert "(file ...longlong" in line  # the end of the path, the part that tells which input
    assert "long/iter_0/generations/table: content changed; part 2 config: k0 0 -> 1, k1 1 -> 2, k2 2 -> 3, " \
           "k3 3 -> 4; and 4 more)" in line
    assert len(line) < 400 + len(str(tmp_path))
    line = _redo(tmp_path, caplog, io.fingerprint({"text": "a" * 100}), io.fingerprint({"text": "b"}), "t")
    assert f'(part 1 config: text "{"a" * 36}... -> "b")' in line


def test_a_change_inside_a_nested_fingerprint_is_named_down_to_the_key(tmp_path, caplog):
    def fp(layers, version=1):
        labels = io.fingerprint("critic", {"lr": 0.001, "model": {"layers": layers}})
        return io.fingerprint(io.fingerprint(labels, "policy"), version)

    line = _redo(tmp_path, caplog, fp(2), fp(4))
    assert "(part 1.1.2 config: model.layers 2 -> 4)" in line
    line = _redo(tmp_path, caplog, fp(2), fp(2, version=2), "t")  # a stage's format version
    assert "(part 2: 1 -> 2)" in line


def test_a_stage_format_version_is_named(tmp_path, caplog, monkeypatch):
    from i2d2.recipes import generics

    def run():
        generics.stage(generics.Ranks(), tmp_path / "f", io.fingerprint("filter", {"delta": 0.5}), lambda d: {}, "filter")

    run()
    version = generics.STAGE_FORMAT["filter"]
    monkeypatch.setitem(generics.STAGE_FORMAT, "filter", version + 1)
    with caplog.at_level(logging.INFO, logger="i2d2.io"):
        run()
    assert f"stage filter: inputs changed (format version: {version} -> {version + 1}), redoing it" in caplog.text


def test_an_earlier_run_without_part_descriptions_gets_a_plain_reason(tmp_path, caplog):
    """Run folders from before the markers recorded parts, a code change that added a part, a damaged marker and a
    marker edited into another shape: said plainly (or nothing said), never a wrong reason, never a crash."""
    out = tmp_path / "s"
    fp = io.fingerprint({"k": 1}, "x")
    io.run_stage(out, fp, lambda d: {})
    for marker in (io.STARTED, io.DONE):  # as the code before this change wrote them
        info = json.loads((out / marker).read_text())
        del info["parts"]
        (out / marker).write_text(json.dumps(info))
    with caplog.at_level(logging.INFO, logger="i2d2.io"):
        io.run_stage(out, io.fingerprint({"k": 2}, "x"), lambda d: {}, name="s")
    assert "stage s: inputs changed (the earlier run recorded no input details), redoing it" in caplog.text

    line = _redo(tmp_path, caplog, io.fingerprint({"k": 1}), io.fingerprint({"k": 1}, "v2"), "t")
    assert "inputs changed (the stage's inputs are now 2 parts, were 1), redoing it" in line

    (out / io.STARTED).write_text('{"fingerprint": "f')  # damaged: the message it always had
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="i2d2.io"):
        io.run_stage(out, io.fingerprint({"k": 3}, "x"), lambda d: {}, name="s")
    assert "stage s: inputs changed, redoing it (removing" in caplog.text

    (out / io.STARTED).write_text(json.dumps({"fingerprint": "0" * 16, "parts": [7, "x"]}))  # another shape
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="i2d2.io"):
        io.run_stage(out, io.fingerprint({"k": 4}, "x"), lambda d: {}, name="s")
    assert "stage s: inputs changed, redoing it (removing" in caplog.text


def test_a_marker_that_is_json_but_no_object_is_damaged_not_a_crash(tmp_path, caplog):
    """A ``_STARTED.json`` (or ``_DONE.json``) holding ``null``, a list or a string (stage_done already takes such a
    ``_DONE.json`` as not finished): prepare_stage redoes the stage as for a damaged marker, where it raised
    AttributeError ('.get')."""
    out = tmp_path / "s"
    for text in ("null", "[1, 2]", '"x"'):
        io.run_stage(out, io.fingerprint({"k": 1}), lambda d: {})
        (out / io.DONE).unlink()  # a stage killed mid-way, its _STARTED.json odd
        (out / io.STARTED).write_text(text)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="i2d2.io"):
            io.run_stage(out, io.fingerprint({"k": 1}), lambda d: {}, name="s")
        assert "stage s: inputs changed, redoing it (removing" in caplog.text, text
        assert io.stage_fingerprint(out) == io.fingerprint({"k": 1})


def test_a_config_that_grew_past_the_recorded_size_is_changed_not_another_kind(tmp_path, caplog):
    small, large = {"words": ["a"]}, {"words": ["a"] * (io.SMALL_PART // 4)}  # recorded by value, then by digest
    line = _redo(tmp_path, caplog, io.fingerprint("x", small), io.fingerprint("x", large), "grown")
    assert "(part 2: changed)" in line
    line = _redo(tmp_path, caplog, io.fingerprint("x", small), io.fingerprint("x", Path(tmp_path / "f")), "kind")
    assert "(part 2: changed (another kind of input))" in line


def test_a_named_part_hashes_as_its_value_and_is_recorded_with_its_name(tmp_path):
    """``named`` changes no fingerprint (run folders keep their finished stages): the pinned call above, its parts
    named, has the same hex; the name goes into the part's description only, and into the markers."""
    (tmp_path / "f.txt").write_text("hello\n")
    d = tmp_path / "dir"
    (d / "sub").mkdir(parents=True)
    (d / "a.txt").write_text("x")
    (d / "sub" / "b.txt").write_text("y")
    (d / ".hidden").write_text("z")
    plain = io.fingerprint({"delta": 0.5, "k": [1, "a"]}, "filter", 3, tmp_path / "f.txt", d, tmp_path / "missing")
    fp = io.fingerprint(io.named("filter config", {"delta": 0.5, "k": [1, "a"]}), "filter", io.named("shards", 3),
                        io.named("table", tmp_path / "f.txt"), d, tmp_path / "missing")
    assert fp == plain == "c92766e675031ac3"
    assert fp.parts[0] == {"name": "filter config", "value": {"delta": 0.5, "k": [1, "a"]}}
    assert fp.parts[2] == {"name": "shards", "value": 3} and fp.parts[3] == {"name": "table", **plain.parts[3]}
    assert fp.parts[1] == plain.parts[1] and fp.parts[4:] == plain.parts[4:]
    outer = io.fingerprint(io.named("critic", fp), io.named("format version", 2))
    assert outer == io.fingerprint(plain, 2)
    assert outer.parts == [{"name": "critic", "fingerprint": fp, "parts": fp.parts}, {"name": "format version", "value": 2}]
    io.run_stage(tmp_path / "s", outer, lambda d: {})
    info = json.loads((tmp_path / "s" / io.DONE).read_text())
    assert info["parts"][0]["name"] == "critic" and info["parts"][0]["parts"][3]["name"] == "table"


def test_a_named_part_is_called_by_its_name(tmp_path, caplog):
    def fp(delta, on=True, version=7, table="t1"):
        (tmp_path / "table").write_text(table)
        inner = io.fingerprint("filter", tmp_path / "table", io.named("delta", delta),
                               io.named("filter config", {"dedupe": on, "ratio": 90}), {"k": 4})
        return io.fingerprint(inner, io.named("format version", version))

    line = _redo(tmp_path, caplog, fp(0.605), fp(0.7, on=False), "filter")
    assert line.startswith("stage filter: inputs changed (delta: 0.605 -> 0.7; filter config: dedupe true -> false), "
                           "redoing it (removing ")
    assert "(format version: 7 -> 8)" in _redo(tmp_path, caplog, fp(0.5), fp(0.5, version=8), "v")
    assert "(file ../table: content changed)" in _redo(tmp_path, caplog, fp(0.5), fp(0.5, table="t2"), "f")
    # a named earlier fingerprint: its own parts under its name, by theirs or by their position
    critic = lambda lr, layers: io.fingerprint("critic", io.named("lr", lr), {"layers": layers})  # noqa: E731
    line = _redo(tmp_path, caplog, io.fingerprint(io.named("critic", critic(0.1, 2)), 1),
                 io.fingerprint(io.named("critic", critic(0.2, 4)), 1), "c")
    assert "(critic lr: 0.1 -> 0.2; critic part 3 config: layers 2 -> 4)" in line


def test_a_marker_from_before_parts_were_named_gets_the_names(tmp_path, caplog):
    """A run folder whose markers the code before ``named`` wrote (parts without names, same hex): a rerun with
    other inputs is told the change by the new names; with the same inputs the stage is still finished."""
    def fp(delta, large="a"):
        return io.fingerprint(io.fingerprint("filter", io.named("delta", delta), io.named("words", [large] * 2000)),
                              io.named("format version", 7))

    out = tmp_path / "filter"
    io.run_stage(out, fp(0.5), lambda d: {})
    for marker in (io.STARTED, io.DONE):  # as the code before names wrote them
        info = json.loads((out / marker).read_text())
        for part in [*info["parts"], *info["parts"][0]["parts"]]:
            part.pop("name", None)
        assert "name" not in json.dumps(info)
        (out / marker).write_text(json.dumps(info))
    calls = []
    io.run_stage(out, fp(0.5), lambda d: calls.append(d) or {})
    assert calls == []  # the same inputs: finished, names or not
    with caplog.at_level(logging.INFO, logger="i2d2.io"):
        io.run_stage(out, fp(0.7), lambda d: {}, name="filter")
    assert "stage filter: inputs changed (delta: 0.5 -> 0.7), redoing it" in caplog.text  # not "words: changed"


def test_a_change_repeated_by_a_config_part_is_listed_once(tmp_path, caplog):
    """The filter's delta is a part of its own and a key of the filter config: one change (same key, same values)
    reads once; a key that differs in values, or another key, is still listed."""
    def fp(delta, cfg_delta, ratio=90):
        return io.fingerprint("filter", io.named("delta", delta),
                              io.named("filter config", {"delta": cfg_delta, "ratio": ratio}))

    line = _redo(tmp_path, caplog, fp(0.7, 0.7), fp(0.75, 0.75), "filter")
    assert "stage filter: inputs changed (delta: 0.7 -> 0.75), redoing it" in line
    line = _redo(tmp_path, caplog, fp(0.605, None), fp(0.7, 0.7, ratio=80), "t")
    assert "(delta: 0.605 -> 0.7; filter config: delta null -> 0.7, ratio 90 -> 80)" in line
    # unnamed parts have no key to repeat: both listed, as before
    line = _redo(tmp_path, caplog, io.fingerprint(1, {"a": 1}), io.fingerprint(2, {"a": 2}), "u")
    assert "(part 1: 1 -> 2; part 2 config: a 1 -> 2)" in line
