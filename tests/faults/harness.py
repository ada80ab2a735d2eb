"""Run a recipe as a user does (``python -m i2d2.train experiment=smoke task=<t> run_dir=...``) in a subprocess,
optionally SIGKILLed at a fault point (``I2D2_FAULT_AT``, i2d2/faults.py), and classify what a rerun gives."""

from __future__ import annotations

import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from process_env import launch_env

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 900


@dataclass
class Result:
    rc: int
    out: str

    @property
    def killed(self) -> bool:
        return self.rc == -signal.SIGKILL


# experiment=smoke task=cmp alone stops in check_downstream_settings (the bundled 3-item fixtures cannot hold out
# the default dev_size=100); these are the settings tests/test_cmp_train.py runs the recipe with.
# I2D2's smoke preset skips the prompt perplexity pass (threshold null); a threshold no prompt reaches keeps every
# prompt and puts the prompt_scores stage under the faults too.
TASK_OVERRIDES = {"cmp": ["task.downstream.finetune.dev_size=1", "task.downstream.finetune.eval_every=1",
                          "task.downstream.seeds=[0]", "task.downstream.lr_grid=[1e-4]",
                          "task.downstream.allow_fewer_shots=true"],
                  "i2d2": ["data.perplexity.threshold=1e30"]}


def command(task: str, run_dir: Path, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "i2d2.train", "experiment=smoke", f"task={task}", f"run_dir={run_dir}",
            *TASK_OVERRIDES.get(task, []), *overrides]


def env(fault_at: str | None = None) -> dict:
    # one string hashing for the run and its rerun: a difference between them is then the fault's, not the hash's
    return launch_env(PYTHONHASHSEED="0", **({"I2D2_FAULT_AT": fault_at} if fault_at else {}))


def run(task: str, run_dir: Path, fault_at: str | None = None, *overrides: str) -> Result:
    p = subprocess.run(command(task, run_dir, *overrides), cwd=REPO, env=env(fault_at), capture_output=True,
                       text=True, timeout=TIMEOUT_S)
    return Result(p.returncode, p.stdout + p.stderr)


def start(task: str, run_dir: Path, *overrides: str) -> subprocess.Popen:
    return subprocess.Popen(command(task, run_dir, *overrides), cwd=REPO, env=env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
