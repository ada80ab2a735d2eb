"""The surface-only floor a critic must clear, and the invariance probes it is checked on.

``SurfaceClassifier``: logistic regression (scikit-learn) on features that say nothing about truth — leading
adverb, article, length, commas, prompt type (noun/goal, related concept), relation phrase, prompt form. Trained
on the critic's training labels and scored on its test split, it measures how much of the task a critic could
solve from wording alone; a surface AUC much higher on train than on test means a cue that exists only in the
training data.

``score_probes``: meaning-preserving rewrites ("Generally, X" / "A X" / "Xs") must not move the critic's score,
and short fluent falsehoods must score low. Probe rows (``i2d2/data/annotations/probes.jsonl``) are hand-written
test inputs, never training data.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from critics.data import split_groups
from i2d2.io import read_jsonl

log = logging.getLogger(__name__)

ADVERBS = ("generally", "typically", "usually", "often", "normally")
ARTICLES = ("a", "an", "the")
GOAL_PREFIXES = ("in order to", "before you", "after you", "while you")
PROBES = Path(__file__).resolve().parent.parent / "i2d2" / "data" / "annotations" / "probes.jsonl"
FLOOR_MARGIN = 0.15  # a critic's test AP must beat the surface-only floor's by this much to count as judging content


def floor_margin(surface_ap: float) -> float:
    """``FLOOR_MARGIN``, or half the room left above a high floor (a floor of 0.9 leaves 0.1: no critic could beat it
    by 0.15)."""
    return min(FLOOR_MARGIN, (1.0 - surface_ap) / 2)


def margin_text(surface_ap) -> str:
    """The margin a report asks of a critic over this floor ("0.15"; less over a floor above 0.7)."""
    return f"{FLOOR_MARGIN}" if surface_ap is None or not np.isfinite(surface_ap) else f"{floor_margin(surface_ap):.2f}"


def floor_warning(ap, surface_ap, what: str = "the critic") -> str | None:
    """The loud warning for a critic whose test AP does not beat the surface-only floor by ``floor_margin`` (None
    when it does, or when either AP is undefined): its kept set is then not a truth judgement."""
    if ap is None or surface_ap is None or not np.isfinite(ap - surface_ap):
        return None
    need = floor_margin(surface_ap)
    if ap - surface_ap >= need:
        return None
    how = ("wording cues alone (length, article, adverb, relation) rank the test statements better"
           if surface_ap > ap else f"it ranks the test statements less than {need:.2f} better than wording cues alone "
                                  "(length, article, adverb, relation)")
    return (f"{what}'s test AP {ap:.3f} does not beat the surface-only floor {surface_ap:.3f} by {need:.2f} "
            f"({ap - surface_ap:+.3f}): {how}, so its scores say little about truth")


_WORD = re.compile(r"[\w'’]+", re.UNICODE)


def surface_features(row: Mapping) -> dict:
    """Features of a statement's wording and provenance only (``statement`` + optional ``kind``, ``relation``,
    ``form``, ``related`` fields of an annotation row)."""
    text = str(row.get("statement", ""))
    words = [w.lower() for w in _WORD.findall(text)]
    first = words[0] if words else ""
    body = words[1:] if first in ADVERBS else words
    article = body[0] if body and body[0] in ARTICLES else "none"
    low = text.lower()
    goal = any(low.startswith(p) for p in GOAL_PREFIXES) or row.get("kind") == "goal"
    f = {
        "adverb": float(first in ADVERBS), f"article={article}": 1.0, "n_words": float(len(words)),
        "log_words": float(np.log1p(len(words))), "n_chars": len(text) / 50.0, "n_commas": float(text.count(",")),
        "goal": float(goal), "has_related": float(bool(row.get("related"))),
        "ends_period": float(text.rstrip().endswith(".")),
        f"relation={str(row.get('relation') or '').lower()}": 1.0, f"form={row.get('form') or ''}": 1.0,
    }
    return f


class SurfaceClassifier:
    """``DictVectorizer`` + standardisation + logistic regression over ``surface_features``."""

    def __init__(self, C: float = 1.0, seed: int = 0):
        from sklearn.feature_extraction import DictVectorizer
        from sklearn.linear_model import LogisticRegression
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler

        self.model = make_pipeline(DictVectorizer(sparse=False), StandardScaler(),
                                   LogisticRegression(C=C, max_iter=2000, random_state=seed))

    def fit(self, rows: Sequence[Mapping], y) -> "SurfaceClassifier":
        self.model.fit([surface_features(r) for r in rows], np.asarray(y))
        return self

    def score(self, rows: Sequence[Mapping]) -> np.ndarray:
        return self.model.predict_proba([surface_features(r) for r in rows])[:, 1]


def auc(y, scores) -> float | None:
    from sklearn.metrics import roc_auc_score

    y = np.asarray(y)
    return float(roc_auc_score(y, scores)) if len(set(y.tolist())) == 2 else None


def surface_floor(train_rows, y_train, test_rows, y_test, seed: int = 0, folds: int = 5) -> dict:
    """Fit on train; AP and AUC on test. ``surface_auc_train`` is the out-of-fold AUC on the training split (5-fold,
    grouped by ``concept``): a cue that exists only in the training labels scores high there and not on test, while
    mere in-sample fit (``surface_auc_train_in_sample``) does not count as a cue."""
    from sklearn.model_selection import GroupKFold

    from critics.metrics import average_precision

    y_train, y_test = np.asarray(y_train), np.asarray(y_test)
    clf = SurfaceClassifier(seed=seed).fit(train_rows, y_train)
    s_test = clf.score(test_rows)
    # one concept however it is spelled, and an entity pair in either order, as grouped_split groups it
    groups = split_groups([str(r.get("concept", i)) for i, r in enumerate(train_rows)])
    oof = np.zeros(len(train_rows))
    k = min(folds, len(set(groups)))
    for a, b in GroupKFold(k).split(np.zeros(len(groups)), groups=groups):
        if len(set(y_train[a].tolist())) < 2:
            oof[b] = float(y_train[a].mean())
            continue
        part = SurfaceClassifier(seed=seed).fit([train_rows[i] for i in a], y_train[a])
        oof[b] = part.score([train_rows[i] for i in b])
    a_tr, a_te = auc(y_train, oof), auc(y_test, s_test)
    return {"surface_ap": average_precision(y_test, s_test), "surface_auc_train": a_tr, "surface_auc_test": a_te,
            "surface_auc_train_in_sample": auc(y_train, clf.score(train_rows)),
            "surface_auc_gap": None if a_tr is None or a_te is None else a_tr - a_te,
            "surface_scores": s_test}


def score_probes(score_fn: Callable[[list[str]], np.ndarray], path: str | Path = PROBES,
                 warn_shift: float = 0.1, reads: Callable[[str], str] | None = None) -> dict:
    """Score the probe set; returns mean |Δ score| over rewrite pairs (each variant against its group's first
    row), the probes' AP (every probe has a truth label), and per-row scores. ``reads``: the text the critic reads
    (``canonical_statement`` for a canonicalising critic). ``probe_shift`` averages every pair; ``probe_shift_read``
    only the pairs the critic reads as two texts (a canonicalised adverb scores 0 by construction: averaged in,
    3 of 5 pairs per group, it dilutes the article / number shift 2.5x). Logs a warning when either is above
    ``warn_shift``."""
    from critics.metrics import average_precision

    rows = read_jsonl(path, required=("group", "statement", "y", "type"))
    scores = np.asarray(score_fn([r["statement"] for r in rows]), dtype=float)
    reads = reads or str
    base: dict[str, tuple[float, str]] = {}
    shifts, read, by_rewrite = [], [], {}
    for r, s in zip(rows, scores):
        if r["type"] != "rewrite":
            continue
        if r["group"] not in base:
            base[r["group"]] = (s, reads(r["statement"]))
        else:
            b, text = base[r["group"]]
            by_rewrite.setdefault(r.get("rewrite", "rewrite"), []).append(abs(s - b))
            shifts.append(abs(s - b))
            if reads(r["statement"]) != text:
                read.append(abs(s - b))
    y = np.asarray([int(r["y"]) for r in rows])
    false_probe = np.asarray([r["type"] == "falsehood" for r in rows])
    out = {"probe_shift": float(np.mean(shifts)) if shifts else None,
           "probe_shift_read": float(np.mean(read)) if read else None, "probe_n_pairs_read": len(read),
           "probe_shift_max": float(np.max(shifts)) if shifts else None,
           "probe_shift_by_rewrite": {k: float(np.mean(v)) for k, v in by_rewrite.items()},
           "probe_ap": average_precision(y, scores), "probe_n": len(rows), "probe_n_pairs": len(shifts),
           "probe_false_mean_score": float(scores[false_probe].mean()) if false_probe.any() else None,
           "probe_true_mean_score": float(scores[y == 1].mean()) if (y == 1).any() else None,
           "rows": [{**r, "critic_score": float(s)} for r, s in zip(rows, scores)]}
    worst = max((v for v in (out["probe_shift"], out["probe_shift_read"]) if v is not None), default=None)
    if worst is not None and worst > warn_shift:
        log.warning("!!! CRITIC PROBE SHIFT %.3f over all rewrite pairs, %s over those it reads as two texts (> %.2f): "
                    "meaning-preserving rewrites (leading adverb, article, number) move the critic's score; it "
                    "partly judges wording, not truth. See probe_scores.jsonl.", out["probe_shift"],
                    "–" if out["probe_shift_read"] is None else f"{out['probe_shift_read']:.3f}", warn_shift)
    return out
