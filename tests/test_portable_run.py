"""A run folder is self-contained: the paths it records are relative to run_dir, so a finished iteration made with a
relative run_dir can be moved and the next iteration run on it from another working directory."""

import json
import shutil
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from i2d2.config import CONF_DIR, setup_run
from i2d2.io import DONE, read_jsonl
from i2d2.recipes.generics import run

pytestmark = pytest.mark.integration

SMALL_LABELS = Path(__file__).parent / "fixtures" / "generics_seed_handwritten.jsonl"  # a quick critic


def _run(run_dir, *extra):
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["experiment=smoke", f"critic.seed_annotations=[{SMALL_LABELS}]",
                                          f"run_dir={run_dir}", *extra])
    setup_run(cfg)
    return run(cfg)


def _recorded_strings(run_dir: Path):
    """Every string in the markers, summaries and metrics a run writes (not in its data tables)."""
    def walk(v):
        if isinstance(v, dict):
            for x in v.values():
                yield from walk(x)
        elif isinstance(v, list):
            for x in v:
                yield from walk(x)
        elif isinstance(v, str):
            yield v

    for f in [*run_dir.rglob(DONE), *run_dir.rglob("metrics.json"), *run_dir.rglob("i2d2_meta.json")]:
        yield from ((f, s) for s in walk(json.loads(f.read_text())))


def test_moved_run_continues_from_another_directory(tmp_path, monkeypatch):
    first, second, elsewhere = tmp_path / "first", tmp_path / "second", tmp_path / "elsewhere"
    for d in (first, second, elsewhere):
        d.mkdir()
    monkeypatch.chdir(first)
    _run("runs/i2d2")  # the default form of run_dir: relative to the launch directory
    old = first / "runs" / "i2d2"
    for f, s in _recorded_strings(old):
        assert "runs/i2d2" not in s and str(tmp_path) not in s, f"{f} records {s!r}"
    assert read_jsonl(old / "iter_0" / "filtered" / "kept.jsonl")  # iteration 1 has a model to start from
    done_before = {p: p.stat().st_mtime_ns for p in old.rglob(DONE)}

    moved = second / "moved"
    shutil.move(old, moved)
    monkeypatch.chdir(elsewhere)
    (r1,) = _run(moved, "iteration=1")
    assert r1["critic_reused_from"] == 0  # iteration 0's critic, found through its recorded (relative) path
    assert r1["generator"] == "iter_0/model" and r1["critic_model"] == "iter_0/critic/model"
    assert (moved / "iter_1" / "model" / "model.safetensors").is_file()
    meta1 = json.loads((moved / "iter_1" / "model" / "i2d2_meta.json").read_text())
    assert meta1["trained_from"] == "iter_0/model"
    # iteration 0 was only read, and re-running it on the moved folder finds every stage finished
    (r0,) = _run(moved, "iteration=0")
    assert {p.relative_to(old): t for p, t in done_before.items()} == {
        p.relative_to(moved): p.stat().st_mtime_ns for p in (moved / "iter_0").rglob(DONE)}
    assert r0["next_model"] == "iter_0/model"
    assert not (elsewhere / "runs").exists() and not list(elsewhere.iterdir())
