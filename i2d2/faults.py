"""Fault injection for the crash-and-rerun tests (tests/faults/): ``I2D2_FAULT_AT="<point>:<n>"`` SIGKILLs the
process the n-th time (1-based) it passes ``fault_point("<point>")``.

Points (a prefix match, so ``write:generations`` hits ``write:generations.jsonl`` and the shard files):
  ``stage:<name>``       a stage starts (after its _STARTED marker), ``done:<name>`` its output is written but
                         the _DONE marker not yet (i2d2.io.run_stage);
  ``write:<file name>``  an atomic write has its temporary file complete but not renamed into place
                         (i2d2.io.atomic_path: tables, markers, shards, checkpoints);
  ``train_step/<fit>``   a training step of a fit (``finetune``, ``critic``, ``cmp``, ``negverse``) finished, its
                         checkpoint not yet saved (i2d2.resume.ResumeState); ``train_step`` counts every fit's;
  ``train_end/<fit>``    a fit past its last step, winding down (``on_train_end``), before ``fit()`` returns.
Unset (the normal case), ``fault_point`` is one dictionary lookup-free comparison: the variable is read once.

``I2D2_FAULT_SIGNAL=TERM`` sends SIGTERM instead (a ``kill <pid>``: the run's own handlers run), and
``I2D2_FAULT_RANK=<r>`` fires in rank ``r`` alone of a launched multi-process run (every rank inherits the
variables; the others pass the point untouched): ``kill`` of the one process a user started, rank 0.
"""

from __future__ import annotations

import os
import signal

ENV = "I2D2_FAULT_AT"
SIGNAL_ENV = "I2D2_FAULT_SIGNAL"
RANK_ENV = "I2D2_FAULT_RANK"


def _parse(spec: str | None) -> tuple[str, int] | None:
    if not spec:
        return None
    point, _, n = spec.rpartition(":")
    if not point or not n.isdigit() or int(n) < 1:
        raise ValueError(f"{ENV}={spec!r}: expected '<point>:<n>' with n >= 1, e.g. 'train_step:3'")
    return point, int(n)


_TARGET = _parse(os.environ.get(ENV))
_SIGNAL = signal.Signals["SIG" + (os.environ.get(SIGNAL_ENV) or "KILL").upper().removeprefix("SIG")]
_RANK = os.environ.get(RANK_ENV)
_seen = 0


def fault_point(name: str) -> None:
    """SIGKILL (``I2D2_FAULT_SIGNAL``) this process here if ``I2D2_FAULT_AT`` names this point and its count is
    reached (in rank ``I2D2_FAULT_RANK`` only, when set)."""
    global _seen
    if _TARGET is None or not name.startswith(_TARGET[0]):
        return
    if _RANK is not None:
        from i2d2.ranks import launched_rank

        if str(launched_rank()) != _RANK:
            return
    _seen += 1
    if _seen == _TARGET[1]:
        os.kill(os.getpid(), _SIGNAL)
