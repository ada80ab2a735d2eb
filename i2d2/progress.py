"""A tqdm bar whose progress also reaches the log: the bar is drawn on a terminal only, so a log file (Hydra's
train.log, a batch job's output) showed nothing during the long loops (generation: hours at the paper's scale; the
probe critic's features: 5 minutes on 2 CPU cores; P_k's perplexity of the critic's test split: 2), only their
result."""

from __future__ import annotations

import logging
import time
from typing import Iterable, Iterator, TypeVar

from tqdm.auto import tqdm

T = TypeVar("T")

LINES = 10         # log lines over a loop at most: one each tenth of it
MIN_SECONDS = 5.0  # a loop done sooner logs nothing (scoring a handful of statements is no progress worth a line)


class LoggedBar(tqdm):
    """``tqdm(...)`` that also logs one ``logger`` line each ``1/lines`` of ``total`` (``desc: done/total units
    (pct), rate, elapsed, time left``) once it has run ``min_seconds``. Its rate counts this call's items only
    (``initial``: items done by an earlier, resumed run)."""

    def __init__(self, *args, logger: logging.Logger | None = None, lines: int | None = None,
                 min_seconds: float | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self._log = logger or logging.getLogger(__name__)
        self._lines = LINES if lines is None else lines
        self._min_seconds = MIN_SECONDS if min_seconds is None else min_seconds
        self._t0, self._start = time.time(), self.n

    def update(self, n: int = 1):
        before = self.n
        out = super().update(n)
        total, done = self.total, self.n
        if self.disable or not total or not n:
            return out
        elapsed = time.time() - self._t0
        if done * self._lines // total > before * self._lines // total and elapsed >= self._min_seconds:
            rate = (done - self._start) / max(elapsed, 1e-9)
            unit = self.unit + ("es" if self.unit.endswith(("s", "sh", "ch", "x")) else "s")
            self._log.info("%s: %d/%d %s (%.0f%%), %.2f %s/s, %.0fs, ~%.0fs left", self.desc, done, total, unit,
                           100 * done / total, rate, unit, elapsed, (total - done) / max(rate, 1e-9))
        return out


def progress(iterable: Iterable[T], *, desc: str, total: int | None = None, disable: bool = False,
             logger: logging.Logger | None = None, unit: str = "batch", **tqdm_kw) -> Iterator[T]:
    """``tqdm(iterable, ...)`` as a :class:`LoggedBar`: one log line each tenth of ``total``."""
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)  # type: ignore[arg-type]
    with LoggedBar(total=total, desc=desc, disable=disable, unit=unit, logger=logger, **tqdm_kw) as bar:
        for item in iterable:
            yield item
            bar.update(1)
