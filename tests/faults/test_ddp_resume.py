"""Runs under DDP (``trainer=ddp``, gloo on the CPU) killed mid-fit and rerun end with the weights of an
uninterrupted run: a critic fit over two relaunched ranks (every rank resumes its own random stream,
``i2d2.resume.ResumeState``; the checkpoint is rank 0's, and each rank's dropout draws differ), and the iteration
after a resumed LM fine-tuning (DDP-family strategies re-seed at setup from the process's last seed_everything,
``i2d2.resume.seed_fit``)."""

import contextlib
import hashlib
import subprocess
import sys
import time
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


def test_sigterm_to_rank_0_alone_stops_every_rank_quietly_and_the_rerun_resumes(tmp_path):
    """``kill <pid>`` of a launched DDP run reaches rank 0 alone (the process the user started; Lightning's launcher
    started the other ranks). In a fit every rank hung: Lightning's handler broadcast rank 0's flag from inside the
    signal handler, a collective no other rank was in; outside one, rank 0 exited 143 and the other ranks, finding it
    gone, failed with a traceback. Rank 0 now passes the SIGTERM on to the ranks it launched, and every rank stops as
    under a scheduler's SIGTERM to the whole job: exit 143, one line, no rank left running; the rerun resumes."""
    import psutil

    run = tmp_path / "run"
    out = tmp_path / "out.txt"
    overrides = ("trainer.devices=2", "task.finetune.batch_size=1")  # 4 fine-tuning steps per rank
    # rank 0 sends itself the SIGTERM (a `kill` of its pid) after its second fine-tuning step
    env = launch_env(I2D2_FAULT_AT="train_step/finetune:2", I2D2_FAULT_SIGNAL="TERM", I2D2_FAULT_RANK="0")
    with open(out, "w") as out_file:  # every rank writes here (the launched ranks inherit rank 0's stdout/stderr)
        p = subprocess.Popen([sys.executable, "-m", "i2d2.train", "experiment=smoke", "trainer=ddp",
                              "trainer.accelerator=cpu", *overrides, f"run_dir={run}"], cwd=ROOT,
                             stdout=out_file, stderr=subprocess.STDOUT, env=env)
        launched = set()
        try:
            main = psutil.Process(p.pid)
            deadline = time.monotonic() + 300  # about 40 s on a 2-core CPU
            while p.poll() is None and time.monotonic() < deadline:  # the ranks it launched, seen while it runs
                with contextlib.suppress(psutil.Error):
                    launched |= set(main.children(recursive=True))
                time.sleep(0.5)
            assert p.poll() is not None, "the run hung after the SIGTERM"
        finally:
            for q in [p, *launched]:
                with contextlib.suppress(Exception):
                    q.kill()
    text = out.read_text()
    assert p.returncode == 143, text[-3000:]
    assert launched, "no rank was launched"
    _, alive = psutil.wait_procs(list(launched), timeout=60)  # each launched rank ends on its own, soon after
    alive = [q for q in alive if q.is_running() and q.status() != psutil.STATUS_ZOMBIE]
    assert not alive, [q.cmdline() for q in alive]
    assert "Traceback" not in text and "Error executing job" not in text, text[-3000:]
    assert text.count("terminated (SIGTERM)") == 1 and \
        f"terminated (SIGTERM): the i2d2 run in {run}; rerun the same command to resume" in text, text[-3000:]
    assert not (run / "iter_0" / "model").exists()
    b = train(run, *overrides)
    assert b.returncode == 0, (b.stdout + b.stderr)[-3000:]
    assert "fine-tuning: resuming from" in b.stdout + b.stderr
    assert (run / "iter_0" / "model").exists()
