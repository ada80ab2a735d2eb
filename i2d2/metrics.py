"""Corpus metrics shared by the tasks: diversity (Self-BLEU), population estimates, entropy, proportion intervals."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np


def self_bleu(texts: list[str], max_order: int = 4) -> float | None:
    """Mean BLEU-``max_order`` of each text against all the others as references (Zhu et al. 2018).

    Lower is more diverse. Uses sacrebleu's sentence BLEU with uniform weights up to ``max_order``
    and exponential smoothing; returns a value in [0, 1]. Fewer than two texts: None (undefined; a 0 would read
    as perfectly diverse).
    """
    from sacrebleu.metrics import BLEU

    if len(texts) < 2:
        return None
    bleu = BLEU(max_ngram_order=max_order, effective_order=True)
    scores = [bleu.sentence_score(t, texts[:i] + texts[i + 1:]).score for i, t in enumerate(texts)]
    return float(np.mean(scores) / 100.0)


def chapman_estimate(first: list[str], second: list[str]) -> float:
    """Mark-and-recapture population size (Chapman's bias-corrected Lincoln-Petersen estimator).

    ``first`` and ``second`` are two independent samples of (normalised) unique items; the estimate is
    (n1 + 1)(n2 + 1) / (m + 1) - 1 with m the items seen in both (i2d2.txt A.1.7).
    """
    a, b = set(first), set(second)
    m = len(a & b)
    return (len(a) + 1) * (len(b) + 1) / (m + 1) - 1


def entropy(items: list[str], base: float = 2.0) -> float:
    """Shannon entropy of the empirical distribution of ``items`` (e.g. comparative relation phrases)."""
    counts = np.array(list(Counter(items).values()), dtype=float)
    if counts.size == 0:
        return 0.0
    p = counts / counts.sum()
    return float(-(p * np.log(p)).sum() / math.log(base))


def wilson_interval(k: int, n: int, z: float = 1.96) -> tuple[float, float] | None:
    """The Wilson score interval (95 % by default) of a proportion k / n: how far a precision on n rows can be
    trusted. Its ends are exactly 0 at k = 0 and 1 at k = n (rounding would put them a hair off, e.g. "-0.000")."""
    if n <= 0:
        return None
    p, d = k / n, 1 + z * z / n
    centre = (p + z * z / (2 * n)) / d
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (0.0 if k <= 0 else float(centre - half)), (1.0 if k >= n else float(centre + half))
