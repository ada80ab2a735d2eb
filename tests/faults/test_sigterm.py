"""SIGTERM (``kill``, a scheduler's pre-emption or time limit) at the moments the run's handlers once missed: the run
stops there with exit 143 and one ``terminated (SIGTERM)`` line, whatever it was doing (i2d2/train.py,
i2d2/lightning_setup.py ``_StepSyncedSigterm``)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from process_env import launch_env

pytestmark = pytest.mark.faults
FAST = pytest.mark.fast  # run by the default pytest too (tests/faults/conftest.py)

ROOT = Path(__file__).resolve().parents[2]


def _said(run: Path) -> str:
    return f"terminated (SIGTERM): the i2d2 run in {run}; rerun the same command to resume"


@FAST
@pytest.mark.parametrize("fail_after", [False, True], ids=["next stage finishes", "next stage fails"])
def test_sigterm_while_a_fit_tears_down_stops_the_run_there(tmp_path, fail_after):
    """A SIGTERM after a fit's last step, before ``fit()`` returned, set Lightning's flag, which nothing read any more:
    the run went on to its next stage (and finished with exit 0), and a real error there was reported as exit 143."""
    _stops_once(tmp_path / "run", "sigterm_in_fit_teardown", f"+task.fail_after={str(fail_after).lower()}")


def _stops_once(run: Path, recipe: str, *overrides: str) -> None:
    """``tests.entry_point_recipe.<recipe>`` run by the entry point stops at its SIGTERM: exit 143, its next stage not
    run, no traceback, and one ``terminated (SIGTERM)`` line, the last."""
    p = subprocess.run([sys.executable, "-m", "i2d2.train", "experiment=smoke", f"run_dir={run}",
                        f"task.recipe=tests.entry_point_recipe.{recipe}", *overrides],
                       cwd=ROOT, capture_output=True, text=True, timeout=120, env=launch_env())
    err = p.stderr
    assert p.returncode == 143, err[-3000:]
    assert not (run / "next_stage.txt").exists(), "the run went on after the SIGTERM"
    assert not any(s in err for s in ("Traceback", "Error executing job", "Exception ignored")), err[-3000:]
    assert err.count("terminated (SIGTERM)") == 1 and err.strip().splitlines()[-1] == _said(run), err[-3000:]


def _sigterm_here():
    """Send this process a SIGTERM and give its handler the chance to run (it runs between two bytecodes)."""
    os.kill(os.getpid(), signal.SIGTERM)
    for _ in range(100):  # the handler raises long before the loop ends
        time.sleep(0.01)
    raise AssertionError("the SIGTERM raised nothing")


@FAST
def test_a_second_sigterm_stops_a_run_whose_first_terminated_was_caught_and_is_ignored_during_its_cleanup():
    """The handler ignored every SIGTERM after the one it raised ``Terminated`` for (``_RAISED``), so that a second
    signal (a scheduler's and rank 0's both reach a launched rank) does not break into the first one's cleanup. A
    Terminated that something caught and did not re-raise left the process running, deaf to every later SIGTERM. A
    second SIGTERM is ignored while the first's Terminated is being handled (an ``except`` or ``finally`` block, a
    ``with`` exit), and raises again once it is gone."""
    from i2d2.train import Terminated, sigterm_raises

    with sigterm_raises():
        # cleanup under way: the second SIGTERM leaves it alone, and the first Terminated goes on (nothing chained)
        with pytest.raises(Terminated) as first:
            try:
                _sigterm_here()
            finally:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.3)  # the second handler call runs here, in the first's cleanup
        assert first.value.__context__ is None
        # the first Terminated is caught here and the process goes on (as a swallowing `except BaseException` or a
        # finaliser would): the next SIGTERM still stops it
        with pytest.raises(Terminated):
            _sigterm_here()


@FAST
def test_a_sigterm_that_lands_in_a_finaliser_still_stops_the_run(tmp_path):
    """A SIGTERM whose handler ran inside a finaliser (``__del__``, a weakref callback: a DataLoader iterator joins its
    workers in one) raised Terminated there, which Python prints as "Exception ignored in ..." with a traceback and
    carries on from: the run went on to finish (exit 0) as if never signalled."""
    _stops_once(tmp_path / "run", "sigterm_in_a_finaliser")


def test_sigterm_as_the_finetuning_winds_down_stops_the_iteration_and_the_rerun_resumes(tmp_path):
    """The real pipeline's window: a SIGTERM as the fine-tuning fit winds down (``on_train_end``, fault point
    ``train_end/finetune``). The run saved the model and went on as if never signalled; it stops there (exit 143, one
    line, the fine-tuned model not written), and the rerun resumes the fit and finishes."""
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "i2d2.train", "experiment=smoke", "trainer=cpu", f"run_dir={run}"]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env=launch_env(I2D2_FAULT_AT="train_end/finetune:1", I2D2_FAULT_SIGNAL="TERM"))
    out = p.stdout + p.stderr
    assert p.returncode == 143, out[-3000:]
    assert "Traceback" not in out and "Error executing job" not in out, out[-3000:]
    assert out.count("terminated (SIGTERM)") == 1 and p.stderr.strip().splitlines()[-1] == _said(run), out[-3000:]
    assert not (run / "iter_0" / "model").exists()
    b = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=launch_env())
    assert b.returncode == 0, (b.stdout + b.stderr)[-3000:]
    assert "fine-tuning: resuming from" in b.stdout + b.stderr
    assert (run / "iter_0" / "model").exists()
