"""A tqdm bar whose progress also reaches the log: the bar is drawn on a terminal only, so a log file (Hydra's
train.log, a batch job's output) showed nothing during the long loops (the probe critic's features: 5 minutes on
2 CPU cores; P_k's perplexity of the critic's test split: 2), only their result."""

from __future__ import annotations

import logging
import time
from typing import Iterable, Iterator, TypeVar

from tqdm.auto import tqdm

T = TypeVar("T")

LINES = 10         # log lines over a loop at most: one each tenth of it
MIN_SECONDS = 5.0  # a loop done sooner logs nothing (scoring a handful of statements is no progress worth a line)


def progress(iterable: Iterable[T], *, desc: str, total: int | None = None, disable: bool = False,
             logger: logging.Logger | None = None, unit: str = "batch", **tqdm_kw) -> Iterator[T]:
    """``tqdm(iterable, desc=desc, total=total, disable=disable, ...)``, and one ``logger`` line each tenth of
    ``total`` (``done/total unit (pct), rate, time left``) once the loop has run ``MIN_SECONDS``."""
    logger = logger or logging.getLogger(__name__)
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)  # type: ignore[arg-type]
    t0, done = time.time(), 0
    plural = unit + ("es" if unit.endswith(("s", "sh", "ch", "x")) else "s")
    for item in tqdm(iterable, desc=desc, total=total, disable=disable, unit=unit, **tqdm_kw):
        yield item
        done += 1
        if disable or not total:
            continue
        elapsed = time.time() - t0
        if done * LINES // total > (done - 1) * LINES // total and elapsed >= MIN_SECONDS:
            rate = done / max(elapsed, 1e-9)
            logger.info("%s: %d/%d %s (%.0f%%), %.0fs, ~%.0fs left", desc, done, total, plural, 100 * done / total,
                        elapsed, (total - done) / rate)
