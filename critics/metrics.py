"""Ranking metrics for the critic and the threshold δ (vectorised numpy / sklearn)."""

from __future__ import annotations

import logging

import numpy as np

log = logging.getLogger(__name__)


def _scores(scores) -> np.ndarray:
    """Scores as floats, NaN refused: a NaN compares False with every threshold, so it fell silently on one side of
    each cut (choose_delta returned δ = NaN as "reached", under which the filter dropped nothing)."""
    s = np.asarray(scores, dtype=float).reshape(-1)
    if np.isnan(s).any():
        raise ValueError(f"{int(np.isnan(s).sum())} of {len(s)} scores are NaN (a broken critic?)")
    return s


def average_precision(y, scores) -> float:
    from sklearn.metrics import average_precision_score

    y = np.asarray(y)
    if len(set(y.tolist())) < 2:
        return float("nan")
    return float(average_precision_score(y, _scores(scores)))


def precision_recall_at(y, scores, delta: float) -> tuple[float | None, float | None, int]:
    """Precision, recall and number kept of the rule ``score > delta`` (the filter's rule).

    Precision of an empty kept set is undefined: None, never 1.0; so is recall where no row is positive."""
    y = np.asarray(y).astype(bool)
    keep = _scores(scores) > delta
    n_keep = int(keep.sum())
    tp = int((keep & y).sum())
    precision = float(tp / n_keep) if n_keep else None
    recall = float(tp / int(y.sum())) if y.any() else None
    return precision, recall, n_keep


def precision_at_top(y, scores, fraction: float) -> tuple[float | None, int]:
    """Precision and size of the ``ceil(fraction * n)`` best-scored rows: what a keep-the-top-fraction cut such as
    NeuroComparatives' NC-L / NC-S holds when applied to labelled rows. Rows tied at the cut's lowest score count
    by their mean label (the expected precision over every order of the tie): which of them the cut takes says
    nothing about the critic, and taking them in the file's order let that order set the precision (a critic whose
    float32 P(valid) saturates at 1.0 ties many rows)."""
    fraction = float(fraction)
    if not 0.0 <= fraction <= 1.0:  # above 1 the cut indexed past the rows (IndexError); below 0, from their end
        raise ValueError(f"precision_at_top: fraction must be in [0, 1] (a share of the rows), got {fraction}")
    y = np.asarray(y).astype(float)
    s = _scores(scores)
    n_keep = int(np.ceil(fraction * len(y)))
    if not n_keep:
        return None, 0
    lowest = np.sort(s)[::-1][n_keep - 1]
    above, tied = s > lowest, s == lowest
    tp = y[above].sum() + (n_keep - int(above.sum())) * y[tied].mean()
    return float(tp / n_keep), n_keep


def _cuts(y, scores):
    """For every distinct score v (descending): precision/recall of keeping ``score >= v``."""
    y = np.asarray(y).astype(float)
    s = _scores(scores)
    order = np.argsort(-s, kind="mergesort")
    s, y = s[order], y[order]
    tp = np.cumsum(y)
    n = np.arange(1, len(y) + 1)
    last = np.r_[s[1:] != s[:-1], True][:len(s)]  # last index of each run of tied scores (none of no rows)
    values, tp, n = s[last], tp[last], n[last]
    precision = tp / n
    recall = tp / max(y.sum(), 1)
    return values, precision, recall


def _cut_below(values, i: int) -> float:
    """δ for ``score > δ`` keeping the scores down to ``values[i]`` (distinct, descending): halfway to the next lower
    one, or that lower score itself where the two are adjacent floats (float64 P(valid) near 1: the midpoint rounds
    onto ``values[i]``, and the cut kept none of the rows it chose)."""
    lower = values[i + 1] if i + 1 < len(values) else values[i] - max(1e-6, abs(values[i]) * 1e-6)
    mid = (values[i] + lower) / 2
    return float(mid if lower < mid < values[i] else lower)


def precision_at_recall(y, scores, min_recall: float = 0.8) -> float | None:
    """Best precision among thresholds whose recall is at least ``min_recall`` (NeuroComparatives App. B); None
    (undefined) where no row is positive."""
    _, p, r = _cuts(y, scores)
    if not np.asarray(y).astype(bool).any():
        return None
    ok = r >= min_recall - 1e-12
    return float(p[ok].max()) if ok.any() else 0.0


def cut_at_recall(y, scores, min_recall: float) -> float | None:
    """The threshold δ whose kept set ``score > δ`` has the best precision among those with recall at least
    ``min_recall``: choose it on dev and apply it to test, where ``precision_at_recall`` picks its threshold on the
    very rows it scores (a ranking summary, not a filter anyone could run). None where no row is positive."""
    values, p, r = _cuts(y, scores)
    if not len(values) or not np.asarray(y).astype(bool).any():
        return None
    ok = r >= min_recall - 1e-12  # the last cut keeps every row: recall 1, so some cut is always ok
    i = int(np.flatnonzero(ok & (p == p[ok].max()))[0])  # among equal precision the highest threshold
    return _cut_below(values, i)


def choose_delta(y, scores, target_precision: float) -> dict:
    """The threshold δ with the most recall whose kept set ``score > δ`` reaches ``target_precision``.

    δ sits halfway between the last kept score and the next lower one, so ``score > δ`` keeps exactly
    the chosen set on this data and generalises smoothly. If no threshold reaches the target, the most
    precise one is used and ``reached`` is False.
    Returns ``dict(delta, precision, recall, n_kept, reached)``.
    """
    values, p, r = _cuts(y, scores)
    if len(values) == 0:
        raise ValueError("choose_delta needs at least one scored example")
    ok = p >= target_precision - 1e-12
    reached = bool(ok.any())
    if reached:
        best = r[ok].max()  # most recall; among equal recall the highest threshold (fewest false positives)
        i = int(np.flatnonzero(ok & (r == best))[0])
    else:
        i = int(np.argmax(p))
        log.warning("no threshold reaches precision %.3f on validation; best is %.3f at recall %.3f",
                    target_precision, p[i], r[i])
    delta = _cut_below(values, i)
    precision, recall, n_keep = precision_recall_at(y, scores, delta)
    return {"delta": delta, "precision": precision, "recall": recall, "n_kept": n_keep, "reached": reached}
