"""Runs under DDP (``trainer=ddp``, gloo on the CPU) killed mid-fit and rerun end with the weights of an
uninterrupted run: a critic fit over two relaunched ranks (every rank resumes its own random stream,
``i2d2.resume.ResumeState``; the checkpoint is rank 0's, and each rank's dropout draws differ), and the iteration
after a resumed LM fine-tuning (DDP-family strategies re-seed at setup from the process's last seed_everything,
``i2d2.resume.seed_fit``)."""

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
from process_env import launch_env

pytestmark = pytest.mark.faults

ROOT = Path(__file__).resolve().parents[2]


def train(run_dir: Path, *overrides, **env) -> subprocess.CompletedProcess:
    overrides = overrides or ("trainer.devices=2", "critic.ckpt_every_n_steps=20")
    return subprocess.run([sys.executable, "-m", "i2d2.train", "experiment=smoke", "trainer=ddp",
                           "trainer.accelerator=cpu", *overrides, f"run_dir={run_dir}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600,
                          env=launch_env(**env))


def weights(folder: Path) -> str:
    return hashlib.sha256(b"".join(f.read_bytes() for f in sorted(folder.glob("*.safetensors")))).hexdigest()


def critic_weights(run_dir: Path) -> str:
    return weights(run_dir / "iter_0" / "critic" / "model")


def test_ddp_critic_killed_mid_epoch_resumes_exactly(tmp_path):
    a = train(tmp_path / "a")
    assert a.returncode == 0, (a.stdout + a.stderr)[-3000:]
    killed = train(tmp_path / "b", I2D2_FAULT_AT="train_step/critic:45")  # both ranks, after step 45 (saved: 40)
    assert killed.returncode != 0
    b = train(tmp_path / "b")
    assert b.returncode == 0, (b.stdout + b.stderr)[-3000:]
    assert "resuming epoch 0 after 40 finished batches" in b.stdout + b.stderr
    assert critic_weights(tmp_path / "b") == critic_weights(tmp_path / "a")


def test_iteration_after_a_resumed_ddp_finetuning_matches(tmp_path):
    """The H100 finding, on the CPU: a ZeRO-2 run killed in its fine-tuning resumed to the same iteration-0 model, and
    its iteration 1 then differed (the resumed process never trained the critic, whose seed_everything the
    uninterrupted one's fine-tuning had been re-seeded with). One process (devices=1) shows it: DDPStrategy
    re-seeds at setup whatever the device count."""
    one = ("trainer.devices=1", "iteration=0", "num_iterations=2")
    a = train(tmp_path / "a", *one)
    assert a.returncode == 0, (a.stdout + a.stderr)[-3000:]
    killed = train(tmp_path / "b", *one, I2D2_FAULT_AT="train_step/finetune:2")
    assert killed.returncode != 0 and not (tmp_path / "b" / "iter_0" / "model").exists()
    b = train(tmp_path / "b", *one)
    assert b.returncode == 0, (b.stdout + b.stderr)[-3000:]
    assert "fine-tuning: resuming from" in b.stdout + b.stderr
    for k in (0, 1):
        assert weights(tmp_path / "b" / f"iter_{k}" / "model") == weights(tmp_path / "a" / f"iter_{k}" / "model"), k
