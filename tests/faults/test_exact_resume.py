"""Exact resume (issue 17 part 3): a fit stopped mid-epoch and rerun ends with the weights and numbers of an
uninterrupted run, for the critic, CMP pre-training and NegVerse prompt tuning (LM fine-tuning:
tests/test_finetune.py). In process: the ``train_step`` fault point (i2d2.resume.ResumeState) raises instead of
SIGKILLing (the subprocess kills are in test_kill_rerun.py)."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from safetensors.torch import load_file

from i2d2.config import CONF_DIR, setup_run

from .compare import assert_same_numbers

pytestmark = pytest.mark.faults

FIXTURES = Path(__file__).parents[1] / "fixtures"


class Crash(RuntimeError):
    pass


def crash_at_step(monkeypatch, n: int) -> None:
    """Raise after the n-th finished training step of this process, before that step's checkpoint is saved."""
    seen = [0]

    def point(name):
        if name.startswith("train_step"):
            seen[0] += 1
            if seen[0] == n:
                raise Crash(f"simulated kill after step {n}")

    monkeypatch.setattr("i2d2.resume.fault_point", point)


def assert_same_safetensors(a: Path, b: Path) -> None:
    for fa in sorted(a.glob("*.safetensors")):
        wa, wb = load_file(str(fa)), load_file(str(b / fa.name))
        assert wa.keys() == wb.keys()
        for k in wa:
            assert torch.equal(wa[k], wb[k]), f"{fa.name}:{k} differs after resume"
    assert list(a.glob("*.safetensors")), f"no weights in {a}"


def last_logged(run: str, key: str, root: Path) -> float:
    """The last value of ``key`` in the newest CSV log of a critic trained in ``root / run``."""
    import csv

    newest = sorted((root / run / "logs").glob("version_*/metrics.csv"))[-1]
    with newest.open() as f:
        return float([r[key] for r in csv.DictReader(f) if r.get(key)][-1])


def compose_cfg(run_dir, *overrides):
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["experiment=smoke", f"run_dir={run_dir}", *overrides])
    setup_run(cfg)
    return cfg


@pytest.mark.fast
def test_critic_killed_mid_epoch_resumes_exactly(tmp_path, monkeypatch):
    from critics.train import train_critic

    small = tmp_path / "small.jsonl"
    small.write_text("".join((FIXTURES / "generics_seed_handwritten.jsonl").read_text().splitlines(keepends=True)[:120]))
    cfg = {"name": "tiny:roberta", "max_epochs": 2, "lr": 1e-3, "patience": 0, "batch_size": 16, "min_examples": 10,
           "ckpt_every_n_steps": 1, "probes": False, "keep_checkpoints": True}
    trainer_cfg = {"_target_": "lightning.Trainer", "accelerator": "cpu", "devices": 1,
                   "enable_progress_bar": False, "enable_model_summary": False}
    ref = train_critic(cfg, [small], tmp_path / "a", trainer_cfg)
    steps_per_epoch = -(-ref["n_train"] // cfg["batch_size"])
    crash_at_step(monkeypatch, steps_per_epoch + 2)  # in the second epoch, after the first epoch's validation
    with pytest.raises(Crash):
        train_critic(cfg, [small], tmp_path / "b", trainer_cfg)
    assert (tmp_path / "b" / "checkpoints" / "last.ckpt").exists() and not (tmp_path / "b" / "model").exists()
    monkeypatch.undo()
    res = train_critic(cfg, [small], tmp_path / "b", trainer_cfg)
    assert_same_safetensors(tmp_path / "a" / "model", tmp_path / "b" / "model")
    # the final weights too: the saved model is the best epoch's, which may be the one before the kill
    last_a, last_b = (torch.load(tmp_path / d / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
                      for d in ("a", "b"))
    assert all(torch.equal(last_a[k], last_b[k]) for k in last_a), "final weights differ after resume"
    assert_same_numbers(ref, res, ignore={"fit_seconds", "model_dir", "pr_curve", "score_histogram"})
    # the logged epoch mean of the killed epoch covers all of its batches (Lightning's own restarted at the resume)
    assert last_logged("a", "train/loss_epoch", tmp_path) == pytest.approx(last_logged("b", "train/loss_epoch", tmp_path),
                                                                          abs=1e-6)
    for table in ("dev_scores.jsonl", "test_scores.jsonl", "split.json"):
        assert (tmp_path / "a" / table).read_bytes() == (tmp_path / "b" / table).read_bytes(), table


@pytest.mark.parametrize("at_step", [3, 4])  # after a validation+checkpoint (val_every=2) and between two
def test_cmp_pretraining_killed_mid_run_resumes_exactly(tmp_path, monkeypatch, at_step):
    from i2d2.recipes.cmp import run

    extra = ["task=cmp", "task.pretrain.max_steps=5", "task.pretrain.val_every=2", "task.downstream.datasets=[]"]
    ref = run(compose_cfg(tmp_path / "a", *extra))
    crash_at_step(monkeypatch, at_step)
    with pytest.raises(Crash):
        run(compose_cfg(tmp_path / "b", *extra))
    assert (tmp_path / "b" / "pretrain" / "checkpoints" / "last.ckpt").exists()
    monkeypatch.undo()
    res = run(compose_cfg(tmp_path / "b", *extra))
    assert_same_safetensors(tmp_path / "a" / "pretrain" / "model", tmp_path / "b" / "pretrain" / "model")
    assert_same_numbers(ref["pretrain"], res["pretrain"], ignore={"train_seconds"})
    assert_same_numbers(ref["zero_shot"], res["zero_shot"])


def test_negverse_prompt_tuning_killed_mid_epoch_resumes_exactly(tmp_path, monkeypatch):
    from i2d2.recipes.negverse import run

    extra = ["task=negverse", "task.train.max_steps=6", "task.train.batch_size=2"]
    ref = run(compose_cfg(tmp_path / "a", *extra))
    crash_at_step(monkeypatch, 4)
    with pytest.raises(Crash):
        run(compose_cfg(tmp_path / "b", *extra))
    monkeypatch.undo()
    res = run(compose_cfg(tmp_path / "b", *extra))
    assert res["train"]["steps_this_session"] < res["train"]["steps"] == 6  # it did resume
    assert_same_safetensors(tmp_path / "a" / "train" / "adapter", tmp_path / "b" / "train" / "adapter")
    assert_same_numbers(ref["train"], res["train"], ignore={"fit_s", "steps_this_session"})
    assert_same_numbers(ref["eval"], res["eval"])
    a, b = tmp_path / "a" / "eval" / "negations.jsonl", tmp_path / "b" / "eval" / "negations.jsonl"
    assert a.read_bytes() == b.read_bytes()
    json.loads((tmp_path / "b" / "train" / "summary.json").read_text())
    shutil.rmtree(tmp_path / "a")
