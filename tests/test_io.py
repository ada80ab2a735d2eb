"""Stage I/O: atomic writes, readers that name file:line, fingerprints and stage skipping."""

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from i2d2 import io
from i2d2.metrics import chapman_estimate, entropy
from i2d2.perplexity import perplexity, sequence_nll


def test_read_jsonl_names_file_and_line(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_text('{"statement": "x", "label": "true"}\n\nnot json\n{"label": "false"}\n')
    with pytest.raises(io.DataError, match=r"a.jsonl:3:"):
        io.read_jsonl(p, required=["statement"])
    errors = []
    rows = io.read_jsonl(p, required=["statement"], on_error="skip", errors=errors)
    assert rows == [{"statement": "x", "label": "true"}]
    assert errors[0].endswith("a.jsonl:3: Expecting value: line 1 column 1 (char 0)")
    assert "a.jsonl:4: missing field(s) statement" in errors[1]


def test_atomic_write_keeps_old_file_on_failure(tmp_path):
    p = tmp_path / "out.jsonl"
    io.write_jsonl(p, [{"a": 1}])

    def rows():
        yield {"a": 2}
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        io.write_jsonl(p, rows())
    assert io.read_jsonl(p) == [{"a": 1}]
    assert [q.name for q in tmp_path.iterdir()] == ["out.jsonl"]


def test_run_stage_skips_finished_and_redoes_changed(tmp_path):
    calls = []

    def fn(out):
        calls.append(out)
        (out / "x.txt").write_text(str(len(calls)))
        return {"n": len(calls)}

    src = tmp_path / "in.txt"
    src.write_text("v1")
    out = tmp_path / "stage"
    assert io.run_stage(out, io.fingerprint({"k": 1}, src), fn) == {"n": 1}
    assert io.run_stage(out, io.fingerprint({"k": 1}, src), fn) == {"n": 1}  # skipped
    assert len(calls) == 1
    src.write_text("v2")  # input changed: redo from scratch
    assert io.run_stage(out, io.fingerprint({"k": 1}, src), fn) == {"n": 2}
    assert (out / "x.txt").read_text() == "2"


def test_interrupted_stage_is_resumed_not_wiped(tmp_path):
    out = tmp_path / "stage"
    fp = io.fingerprint({"k": 1})

    def dies(o):
        (o / "unit-0.done").write_text("ok")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        io.run_stage(out, fp, dies)
    seen = []
    io.run_stage(out, fp, lambda o: seen.append(sorted(p.name for p in o.glob("unit-*"))))
    assert seen == [["unit-0.done"]]


def test_perplexity_is_batch_invariant_and_prefix_aware(tiny_gpt2):
    model, tok = tiny_gpt2
    texts = ["a bicycle can carry a rider", "dogs bark", "the sun rises in the east and sets in the west"]
    p1 = perplexity(model, tok, texts, batch_size=1, per="token")
    p3 = perplexity(model, tok, texts, batch_size=3, per="token")
    np.testing.assert_allclose(p1, p3, rtol=1e-4)
    # NLL(prefix + continuation) = NLL(prefix) + NLL(continuation | prefix)
    full, n_full = sequence_nll(model, tok, ["the sun rises in the east"])
    pre, n_pre = sequence_nll(model, tok, ["the sun rises"])
    cont, n_cont = sequence_nll(model, tok, ["the sun rises in the east"], prefixes=["the sun rises"])
    assert n_cont[0] == n_full[0] - n_pre[0] and n_cont[0] > 0
    np.testing.assert_allclose(full, pre + cont, rtol=1e-4)


def test_chapman_and_entropy():
    assert chapman_estimate(["a", "b", "c"], ["b", "c", "d"]) == pytest.approx(4 * 4 / 3 - 1)
    assert entropy(["x", "y"]) == pytest.approx(1.0)
    assert entropy(["x", "x"]) == 0.0


def test_load_state_dict_refuses_pickled_code(tmp_path):
    import argparse

    import pytest
    import torch

    from i2d2.io import DataError, load_state_dict

    torch.save({"state_dict": {"w": torch.ones(2)}, "epoch": 3}, tmp_path / "ok.ckpt")
    assert torch.equal(load_state_dict(tmp_path / "ok.ckpt")["w"], torch.ones(2))
    torch.save({"state_dict": {}, "obj": argparse.Namespace(a=1)}, tmp_path / "bad.ckpt")  # needs unpickling code
    with pytest.raises(DataError, match="bad.ckpt: not a loadable weights-only checkpoint"):
        load_state_dict(tmp_path / "bad.ckpt")
    (tmp_path / "cut.ckpt").write_bytes((tmp_path / "ok.ckpt").read_bytes()[:40])
    with pytest.raises(DataError, match="cut.ckpt"):
        load_state_dict(tmp_path / "cut.ckpt")


# ----------------------------------------------------------------------------- stage fingerprints (issue 17 part 2)

def test_failed_redo_removes_the_stale_output_first(tmp_path):
    """A stage's output outside its folder (iter_k/model) is removed before a redo runs: if the redo dies, the
    next stage finds nothing rather than the previous result."""
    out, model = tmp_path / "finetune", tmp_path / "model"

    def writes_model(d):
        model.mkdir(exist_ok=True)
        (model / "config.json").write_text("{}")
        return {}

    io.run_stage(out, "fp1", writes_model, outputs=[model])
    assert (model / "config.json").exists()

    def dies(d):
        raise RuntimeError("killed mid-redo")

    with pytest.raises(RuntimeError):
        io.run_stage(out, "fp2", dies, outputs=[model])
    assert not model.exists() and io.stage_done(out, "fp1") is None


def test_damaged_marker_redoes_the_stage(tmp_path):
    out, calls = tmp_path / "s", []
    io.run_stage(out, "fp", lambda d: calls.append(1))
    (out / io.DONE).write_text('{"fingerprint": "f')  # truncated by a full disk
    io.run_stage(out, "fp", lambda d: calls.append(1))
    assert len(calls) == 2


def test_model_fingerprint_is_the_folder_content(tmp_path):
    m = tmp_path / "critic" / "model"
    m.mkdir(parents=True)
    (m / "model.safetensors").write_bytes(b"v1")
    a = io.model_fingerprint(str(m))
    (m / "model.safetensors").write_bytes(b"v2")  # retrained into the same folder
    assert io.model_fingerprint(str(m)) != a
    assert io.model_fingerprint("tiny:gpt2") == "tiny:gpt2"


def test_prompt_inputs_are_the_concept_files_bytes(tmp_path):
    from i2d2.concepts import data_files

    (tmp_path / "nouns.txt").write_text("violin\n")
    (tmp_path / "rel.txt").write_text("can\n")
    data = {"dir": str(tmp_path), "sources": {"n": {"path": "nouns.txt"}, "off": None}, "relations": {"r": "rel.txt"}}
    from i2d2.comparatives.entities import PLURAL_ONLY, UNCOUNTABLE

    # the noun lexicons decide a noun's number, so a prompt's wording: they are inputs too
    assert data_files(data) == [tmp_path / "nouns.txt", tmp_path / "rel.txt", UNCOUNTABLE, PLURAL_ONLY]
    before = io.fingerprint("prompts", data, *data_files(data))
    (tmp_path / "nouns.txt").write_text("violin\ncello\n")  # same path, new content
    assert io.fingerprint("prompts", data, *data_files(data)) != before


def test_stage_format_version_redoes_the_stage(tmp_path, monkeypatch):
    from i2d2.recipes import generics

    calls = []
    run = lambda: generics.stage(generics.Ranks(), tmp_path / "f", "same inputs", lambda d: calls.append(1), "filter")
    run()
    run()
    assert len(calls) == 1
    monkeypatch.setitem(generics.STAGE_FORMAT, "filter", generics.STAGE_FORMAT["filter"] + 1)
    run()
    assert len(calls) == 2


# ----------------------------------------------------------------------------- checkpoints (issue 17 part 4)

def _fit(tmp_path, steps, resume=None):
    """A tiny Lightning fit through build_trainer: last.ckpt every step, verified checkpoint IO."""
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint

    from i2d2.lightning_setup import build_trainer

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 1)

        def training_step(self, batch, i):
            return self.lin(batch[0]).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    torch.manual_seed(0)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(16, 4)), batch_size=2)
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True, save_top_k=0, every_n_train_steps=1)
    trainer = build_trainer({"_target_": "lightning.Trainer", "accelerator": "cpu", "devices": 1}, max_steps=steps,
                            callbacks=[ckpt], logger=False, enable_progress_bar=False, enable_model_summary=False)
    model = Tiny()
    trainer.fit(model, data, ckpt_path=resume)
    return trainer, model


def test_checkpoints_are_recorded_and_a_damaged_newest_falls_back(tmp_path, caplog):
    from i2d2 import checkpoints
    from i2d2.lightning_setup import resume_checkpoint

    trainer, _ = _fit(tmp_path, 3)
    last = tmp_path / "ckpt" / "last.ckpt"
    prev = checkpoints.previous_path(last)
    assert checkpoints.problem(last) is None and checkpoints.problem(prev) is None
    assert json.loads(checkpoints.record_path(last).read_text())["size"] == last.stat().st_size
    assert not [p for p in last.parent.iterdir() if p.name.endswith(".tmp")]

    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])  # a kill during a save on a full disk
    with pytest.raises(io.DataError, match="last.ckpt: damaged checkpoint: size"):
        trainer.strategy.checkpoint_io.load_checkpoint(last)
    with caplog.at_level(logging.WARNING):
        picked = resume_checkpoint(last, trainer)
    assert picked == str(prev) and "damaged" in caplog.text and "previous checkpoint" in caplog.text
    assert (last.parent / "last.ckpt.damaged").exists()
    trainer2, _ = _fit(tmp_path, 4, resume=picked)  # the fallback resumes (step 2 -> 4)
    assert trainer2.global_step == 4 and checkpoints.problem(last) is None


def test_no_intact_checkpoint_restarts_the_training(tmp_path, caplog):
    from i2d2 import checkpoints

    _fit(tmp_path, 2)
    last = tmp_path / "ckpt" / "last.ckpt"
    for p in (last, checkpoints.previous_path(last)):
        data = bytearray(p.read_bytes())
        data[len(data) // 2] ^= 0xFF  # one flipped byte: same size, other hash
        p.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        assert checkpoints.pick_resume(last) is None
    assert "restarts from the beginning" in caplog.text and "SHA-256" in caplog.text


def test_every_rank_picks_the_same_resume_point_when_another_moved_the_damaged_file(tmp_path, monkeypatch):
    # every rank of a DDP fit calls pick_resume at once: the one that finds last.ckpt damaged second must not fail
    # on the rename the first one did (it raised FileNotFoundError, and the other rank then waited for it forever)
    from i2d2 import checkpoints

    _fit(tmp_path, 2)
    last = tmp_path / "ckpt" / "last.ckpt"
    data = bytearray(last.read_bytes())
    data[len(data) // 2] ^= 0xFF
    last.write_bytes(bytes(data))
    real_problem = checkpoints.problem

    def problem_while_another_rank_quarantines(path):
        why = real_problem(path)
        if why is not None and Path(path) == last:
            checkpoints.quarantine(last, why)  # the other rank, between this rank's check and its rename
        return why

    monkeypatch.setattr(checkpoints, "problem", problem_while_another_rank_quarantines)
    assert checkpoints.pick_resume(last) == str(checkpoints.previous_path(last))
    assert (last.parent / "last.ckpt.damaged").exists() and not last.exists()
    monkeypatch.setattr(checkpoints, "problem", real_problem)
    assert checkpoints.pick_resume(last) == str(checkpoints.previous_path(last))  # a rank that came later
    assert checkpoints.problem(last) == "missing"


def test_failed_checkpoint_save_surfaces_and_leaves_no_temp_file(tmp_path, monkeypatch):
    import errno
    import os as os_

    from i2d2.checkpoints import VerifiedCheckpointIO

    cio, path = VerifiedCheckpointIO(), tmp_path / "last.ckpt"
    cio.save_checkpoint({"state_dict": {}}, path)
    good = path.read_bytes()

    def full_disk(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os_, "fsync", full_disk)
    with pytest.raises(OSError, match=r"cannot write .*last.ckpt: No space left"):
        cio.save_checkpoint({"state_dict": {"w": 1}}, path)
    assert path.read_bytes() == good
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt", "last.ckpt.integrity.json"]


def test_atomic_dir_removes_what_a_killed_writer_left(tmp_path):
    import subprocess
    import sys

    from i2d2.io import atomic_dir

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".model.{dead.pid}.deadbeef.tmp"
    stale.mkdir()
    (stale / "weights.bin").write_bytes(b"half")
    with atomic_dir(tmp_path / "model") as tmp:
        (tmp / "weights.bin").write_bytes(b"whole")
    assert not stale.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_run_stage_returns_the_summary_a_rerun_reads(tmp_path):
    """A report built from a stage's summary must be the same bytes whether the stage ran now or in a killed
    earlier run (its summary then comes from the _DONE marker: keys sorted, numpy numbers as JSON numbers)."""
    fresh = io.run_stage(tmp_path / "s", "fp", lambda d: {"zeta": np.float32(0.5), "alpha": {"b": 1, "a": 2}})
    reread = io.run_stage(tmp_path / "s", "fp", lambda d: pytest.fail("a finished stage ran again"))
    assert fresh == reread and list(fresh) == list(reread) == ["alpha", "zeta"] and list(fresh["alpha"]) == ["a", "b"]
