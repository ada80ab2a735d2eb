"""Regression tests from an audit of the fault-tolerance and tracking core (i2d2/io.py, checkpoints.py, tracking.py):
each failed before its fix."""

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from i2d2 import checkpoints, io

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- stage outputs outside out_dir

def test_damaged_output_outside_the_stage_folder_redoes_the_stage(tmp_path, caplog):
    # the fine-tuning writes iter_k/model beside its stage folder (run_stage's ``outputs``): the _DONE marker did not
    # cover it, so a truncated model.safetensors was reused ("already finished") and iteration k+1 crashed loading it
    out, model = tmp_path / "iter_0" / "finetune", tmp_path / "iter_0" / "model"
    runs = []

    def fn(d):
        runs.append(d)
        model.mkdir(parents=True, exist_ok=True)
        (model / "model.safetensors").write_bytes(b"w" * 100)
        return {"steps": 3}

    io.run_stage(out, "fp", fn, "finetune", outputs=(model,))
    io.run_stage(out, "fp", fn, "finetune", outputs=(model,))
    assert len(runs) == 1  # intact: reused
    recorded = json.loads((out / io.DONE).read_text())["outputs"]
    assert "../model/model.safetensors" in recorded  # relative to out_dir: the run folder can move
    (model / "model.safetensors").write_bytes(b"w" * 50)  # a kill on a full disk, a half copy
    with caplog.at_level(logging.WARNING):
        io.run_stage(out, "fp", fn, "finetune", outputs=(model,))
    assert len(runs) == 2 and (model / "model.safetensors").read_bytes() == b"w" * 100
    assert "model.safetensors changed since the stage finished" in caplog.text


# ----------------------------------------------------------------------------- DeepSpeed checkpoint directories

def _deepspeed_dir(root: Path) -> Path:
    ckpt = root / "last.ckpt"
    (ckpt / "checkpoint").mkdir(parents=True)
    torch.save({"module": {"w": torch.ones(64)}}, ckpt / "checkpoint" / "mp_rank_00_model_states.pt")
    torch.save({"optimizer": {"m": torch.ones(64)}}, ckpt / "checkpoint" / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    (ckpt / "latest").write_text("checkpoint")
    return ckpt


def test_half_rewritten_deepspeed_checkpoint_is_refused(tmp_path, monkeypatch, caplog):
    # Lightning saves DeepSpeed checkpoints under one tag, so every save rewrites the same files in place and 'latest'
    # stays from the save before: a kill during a save left 'latest' beside a truncated file, and the fit resumed
    # from it (DeepSpeed's load then fails on every rerun) instead of starting afresh
    import i2d2.lightning_setup as S

    monkeypatch.setattr(S, "uses_deepspeed", lambda trainer: True)
    good = _deepspeed_dir(tmp_path / "good")
    assert S.resume_checkpoint(good, None) == str(good)
    bad = _deepspeed_dir(tmp_path / "bad")
    f = bad / "checkpoint" / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with caplog.at_level(logging.WARNING):
        assert S.resume_checkpoint(bad, None) is None
    assert "zero_pp_rank_0_mp_rank_00_optim_states.pt" in caplog.text and "restarts from the beginning" in caplog.text
    assert not bad.exists() and (tmp_path / "bad" / "last.ckpt.damaged").is_dir()  # the next save starts clean
    (good / "latest").write_text("")  # a kill while DeepSpeed rewrote 'latest'
    assert S.resume_checkpoint(good, None) is None


# ----------------------------------------------------------------------------- checkpoint rotation

def test_kill_between_the_rotation_renames_keeps_a_resume_point(tmp_path, monkeypatch):
    # a save moves last.ckpt to last.ckpt.prev, then its record: killed between the two, .prev sat under the record
    # of the checkpoint before it (quarantined as damaged) and last.ckpt was gone, so the fit restarted from step 0
    cio, path = checkpoints.VerifiedCheckpointIO(), tmp_path / "last.ckpt"
    cio.save_checkpoint({"state_dict": {"w": torch.zeros(8)}, "step": 1}, path)
    cio.save_checkpoint({"state_dict": {"w": torch.ones(8)}, "step": 2}, path)
    real_replace, calls = os.replace, []

    def killed_after_the_first_rename(src, dst):
        calls.append(dst)
        real_replace(src, dst)
        if len(calls) == 1:
            raise SystemExit("killed")

    monkeypatch.setattr(os, "replace", killed_after_the_first_rename)
    with pytest.raises(SystemExit):
        cio.save_checkpoint({"state_dict": {"w": torch.full((8,), 3.0)}, "step": 3}, path)
    monkeypatch.setattr(os, "replace", real_replace)
    picked = checkpoints.pick_resume(path)
    assert picked is not None and torch.load(picked, weights_only=True)["step"] == 2


# ----------------------------------------------------------------------------- text files are UTF-8

def test_writers_write_utf8_whatever_the_locale(tmp_path):
    # every reader decodes UTF-8 (text_lines); the writers used the locale's encoding: under a non-UTF-8 locale a
    # statement with 'é' or the report's 'δ' crashed the write (ASCII) or was written in bytes the readers refuse
    code = ("import sys; from pathlib import Path; from i2d2 import io; d = Path(sys.argv[1]); "
            "io.write_jsonl(d / 'a.jsonl', [{'s': 'Caf\\u00e9 \\u03b4'}]); io.write_text(d / 'r.md', '\\u03b4 = 0.5'); "
            "io.write_csv(d / 'c.csv', [{'s': 'na\\u00efve'}])")
    env = {**os.environ, "PYTHONUTF8": "0", "LC_ALL": "C", "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-1000:]
    assert io.read_jsonl(tmp_path / "a.jsonl") == [{"s": "Café δ"}]
    assert io.read_text(tmp_path / "r.md") == "δ = 0.5"
    assert io.read_csv(tmp_path / "c.csv")[0]["s"] == "naïve"


# ----------------------------------------------------------------------------- W&B: a rerun continues its run

def test_rerun_continues_the_same_wandb_run(tmp_path, monkeypatch):
    # WandbLogger drew a new random run id per launch: a killed iteration rerun opened a second W&B run (the config
    # logged twice, its metrics split across both) instead of resuming the one it started
    from hydra import compose, initialize_config_dir

    from i2d2.config import CONF_DIR, setup_run
    from i2d2.tracking import tracked_run

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    ids = []
    for iteration in (0, 0, 1):  # a run, its rerun after a kill, the next iteration
        with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
            cfg = compose("train", overrides=[f"run_dir={tmp_path}", "logger=wandb", f"iteration={iteration}"])
        setup_run(cfg)
        with tracked_run(cfg, tmp_path / "report") as tracker:
            tracker.log_metrics({"x": 1.0})
            ids.append(tracker.wandb.experiment.id)
    assert ids[0] == ids[1] != ids[2]
    runs = sorted(p.name.rsplit("-", 1)[1] for p in (tmp_path / "wandb").glob("offline-run-*"))
    assert sorted(runs) == sorted(ids)
