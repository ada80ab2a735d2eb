"""A critic fit under DDP (``trainer=ddp``: the command relaunched per rank, gloo on the CPU) killed mid-epoch and
rerun ends with the weights of an uninterrupted run: every rank resumes its own random stream
(``i2d2.resume.ResumeState``; the checkpoint is rank 0's, and each rank's dropout draws differ)."""

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.faults

ROOT = Path(__file__).resolve().parents[2]


def train(run_dir: Path, **env) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK")}
    return subprocess.run([sys.executable, "-m", "i2d2.train", "experiment=smoke", "trainer=ddp",
                           "trainer.accelerator=cpu", "trainer.devices=2", "critic.ckpt_every_n_steps=20",
                           f"run_dir={run_dir}"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**clean, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1", **env})


def critic_weights(run_dir: Path) -> str:
    return hashlib.sha256((run_dir / "iter_0" / "critic" / "model" / "model.safetensors").read_bytes()).hexdigest()


def test_ddp_critic_killed_mid_epoch_resumes_exactly(tmp_path):
    a = train(tmp_path / "a")
    assert a.returncode == 0, (a.stdout + a.stderr)[-3000:]
    killed = train(tmp_path / "b", I2D2_FAULT_AT="train_step/critic:45")  # both ranks, after step 45 (saved: 40)
    assert killed.returncode != 0
    b = train(tmp_path / "b")
    assert b.returncode == 0, (b.stdout + b.stderr)[-3000:]
    assert "resuming epoch 0 after 40 finished batches" in b.stdout + b.stderr
    assert critic_weights(tmp_path / "b") == critic_weights(tmp_path / "a")
