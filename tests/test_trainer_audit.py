"""Regression tests from an audit of the trainers, callbacks, tracking and the entry point."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from i2d2.config import CONF_DIR

ROOT = Path(__file__).resolve().parents[1]


class CSVLogger:  # stand-ins named as Lightning's loggers (log_png picks W&B by the class name)
    def __init__(self):
        self.images = []


class WandbLogger:
    def __init__(self):
        self.images = []

    def log_image(self, key, images, **kwargs):
        self.images.append(key)


def test_pr_curve_images_reach_wandb_when_it_is_not_the_first_logger(tmp_path):
    from callbacks.pr_curve import PRCurveCallback

    csv, wb = CSVLogger(), WandbLogger()
    # Lightning's trainer.logger is the first of trainer.loggers
    trainer = types.SimpleNamespace(sanity_checking=False, is_global_zero=True, current_epoch=0,
                                    loggers=[csv, wb], logger=csv)
    module = types.SimpleNamespace(val_result=(np.array([0, 1, 1, 0]), np.array([0.1, 0.9, 0.6, 0.4])))
    PRCurveCallback(tmp_path, prefix="critic_val").on_validation_end(trainer, module)
    assert wb.images == ["critic_val/pr_curve", "critic_val/score_histogram"]


def test_logger_list_selection_is_merged_by_hydra_and_refused_at_start():
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["logger=[csv,wandb]", "run_dir=/tmp/unused"])
    # what the check guards against: one logger config, CSV's dropped
    assert cfg.logger["_target_"].endswith("WandbLogger") and "csv" not in cfg.logger
    from i2d2.train import check_logger_overrides

    for o in ("logger=[wandb,csv]", "+logger=[csv]", "logger=[csv,wandb]"):
        with pytest.raises(ValueError, match=r"logger.*wandb_csv"):
            check_logger_overrides([o])
    check_logger_overrides(["logger=wandb_csv", "logger=csv", "task.logger_x=[1]"])


def test_a_task_share_of_the_smoke_preset_chosen_alone_is_refused_at_start():
    # experiment=smoke/i2d2 composed the default Gemma generator and probe critic at smoke sizes (no tiny models), and
    # --help listed the experiment/smoke group beside experiment
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["experiment=smoke/i2d2", "run_dir=/tmp/unused"])
    assert cfg.model.name == "packaged:gemma3-270m" and cfg.decoding.beam_size == 3
    from i2d2.train import check_preset_overrides

    for o in ("experiment=smoke/i2d2", "experiment=smoke/cmp", "experiment/smoke=negverse", "+experiment/smoke=cmp"):
        with pytest.raises(ValueError, match=r"use experiment=smoke task=(i2d2|cmp|negverse)"):
            check_preset_overrides([o])
    check_preset_overrides(["experiment=smoke", "experiment=paper_i2d2", "task=cmp", "experiment/smoke=null"])


def _train(tmp_path, *overrides):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "i2d2.train", "experiment=smoke", f"run_dir={tmp_path / 'run'}",
                           f"hydra.run.dir={tmp_path / 'hydra'}", *overrides],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_entry_point_refuses_a_logger_list_and_a_missing_recipe_in_one_line(tmp_path):
    p = _train(tmp_path, "logger=[wandb,csv]")
    assert p.returncode == 2, p.stderr[-2000:]
    assert p.stderr.strip().startswith("error: logger=[wandb,csv]") and "Traceback" not in p.stderr
    p = _train(tmp_path, "task.recipe=i2d2.recipes.nope.run")
    assert p.returncode == 2, p.stderr[-2000:]
    assert "error: task.recipe='i2d2.recipes.nope.run'" in p.stderr and "Traceback" not in p.stderr


def test_progress_line_reports_the_step_loss_not_its_accumulation_share(caplog):
    """Lightning hands on_train_batch_end the loss divided by accumulate_grad_batches: with 4 the progress line
    read loss=1.717 where training_step returned (and finetune/loss_step logged) 6.868."""
    import logging

    import torch

    from i2d2.lightning_setup import ProgressLog

    trainer = types.SimpleNamespace(log_every_n_steps=1, global_step=3, is_global_zero=True, current_epoch=0,
                                    estimated_stepping_batches=10, callback_metrics={}, accumulate_grad_batches=4)
    module = types.SimpleNamespace(automatic_optimization=True)
    with caplog.at_level(logging.INFO, logger="i2d2.lightning_setup"):
        ProgressLog("finetune").on_train_batch_end(trainer, module, {"loss": torch.tensor(1.5)}, None, 0)
    assert "finetune: epoch 0 step 3/10 loss=6 " in caplog.text


def test_progress_lines_say_when_the_validation_metrics_were_measured(caplog):
    """A validation's metrics stay in callback_metrics until the next one: the CMP run's lines from step 85 to 160
    each read val/loss=16.53, measured at step 80, with nothing saying so."""
    import logging

    import torch

    from i2d2.lightning_setup import ProgressLog

    trainer = types.SimpleNamespace(log_every_n_steps=1, global_step=0, is_global_zero=True, current_epoch=0,
                                    estimated_stepping_batches=10, accumulate_grad_batches=1, sanity_checking=False,
                                    callback_metrics={"val/loss": torch.tensor(16.53)})
    module = types.SimpleNamespace(automatic_optimization=True)
    progress = ProgressLog("cmp")
    progress.on_validation_end(trainer, module)  # the untrained model's, before the fit: not this fit's
    progress.on_train_start(trainer, module)
    with caplog.at_level(logging.INFO, logger="i2d2.lightning_setup"):
        trainer.global_step = 3
        progress.on_validation_end(trainer, module)
        trainer.global_step = 5
        progress.on_train_batch_end(trainer, module, {"loss": torch.tensor(1.5)}, None, 0)
    assert "cmp: epoch 0 step 5/10 loss=1.5 val/loss=16.53 (validation at step 3)" in caplog.text
    caplog.clear()
    progress.on_train_start(trainer, module)  # a new fit: no validation yet
    with caplog.at_level(logging.INFO, logger="i2d2.lightning_setup"):
        trainer.global_step, trainer.callback_metrics = 6, {}
        progress.on_train_batch_end(trainer, module, {"loss": torch.tensor(1.5)}, None, 0)
    assert "validation at" not in caplog.text


def test_checkpoint_callback_state_follows_a_moved_run_folder(tmp_path):
    """A fit killed and resumed after its run folder moved (scratch -> project space, the project's run folders can
    move): Lightning's ModelCheckpoint dropped the best score so far (the first validation after the resume became
    "best" and overwrote a better epoch's best.ckpt) and kept best_model_path in the old folder (the critic and CMP
    read their best weights from there, or from nowhere once it was gone)."""
    import torch

    from i2d2.lightning_setup import ModelCheckpoint

    old, new = tmp_path / "scratch" / "run" / "critic" / "checkpoints", tmp_path / "project" / "run" / "critic" / "checkpoints"
    before = ModelCheckpoint(dirpath=old, filename="best", monitor="val/ap", mode="max", save_top_k=1)
    best = str(old / "best.ckpt")
    before.best_model_score, before.best_model_path, before.kth_best_model_path = torch.tensor(0.9), best, best
    before.best_k_models, before.kth_value, before.last_model_path = {best: torch.tensor(0.9)}, torch.tensor(0.9), ""
    after = ModelCheckpoint(dirpath=new, filename="best", monitor="val/ap", mode="max", save_top_k=1)
    from lightning.pytorch.callbacks import ModelCheckpoint as LightningModelCheckpoint

    # the key a checkpoint written before this class (by Lightning's own) holds: two instances of the subclass
    # always agree, so the comparison is with Lightning's class
    assert after.state_key == LightningModelCheckpoint(dirpath=old, filename="best", monitor="val/ap", mode="max",
                                                       save_top_k=1).state_key
    after.load_state_dict(before.state_dict())
    assert after.best_model_score == torch.tensor(0.9)
    assert after.best_model_path == after.kth_best_model_path == str(new / "best.ckpt")
    assert list(after.best_k_models) == [str(new / "best.ckpt")] and after.last_model_path == ""
    # resumed where it was written: as Lightning has it
    same = ModelCheckpoint(dirpath=old, filename="best", monitor="val/ap", mode="max", save_top_k=1)
    same.load_state_dict(before.state_dict())
    assert same.best_model_path == best and same.best_model_score == torch.tensor(0.9)
    # a path outside the old folder (none is written there, but a state may say so) is left as it is
    elsewhere = {**before.state_dict(), "best_model_path": str(tmp_path / "other" / "x.ckpt")}
    after.load_state_dict(elsewhere)
    assert after.best_model_path == str(tmp_path / "other" / "x.ckpt")
