#!/usr/bin/env python
"""Precision and recall of "same claim" on the labelled near-duplicate pairs
(``i2d2/data/annotations/near_duplicate_pairs.jsonl``, drawn by ``scripts/near_duplicate_pairs.py``, labelled
against GUIDE.md "Same claim?") for three de-duplication rules:

  rule          the filter's current rule (rapidfuzz ratio >= 90 or same content words: ``rule_merges``)
  cosine>=t     MiniLM cosine >= t, t chosen on the dev pairs only
  rule|cos>=t   either, t chosen on the dev pairs only
  bleu>0.85     the mark-and-recapture count's recapture test (``generics_report.mark_recapture``, the paper's
                A.1.7: sentence BLEU of ``b`` against ``a``, folded text, > 0.85), fixed, not tuned

A pair whose statements differ in negation never merges by cosine (the filter's guard). t is the threshold with
the highest weighted dev recall among those whose weighted dev precision is >= ``--min-precision`` (ties: the
higher t). Every estimate is weighted back to all within-concept pairs of its split: a pair weighs its stratum's
population over the pairs drawn from it. Test chose nothing; the raw counts (tp / fp / fn of drawn pairs) stand
beside the weighted numbers.

  python scripts/near_duplicate_eval.py [--pairs FILE] [--min-precision 0.9]
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PAIRS = ROOT / "i2d2/data/annotations/near_duplicate_pairs.jsonl"


def recapture_bleu() -> float:
    """The default run's mark-and-recapture BLEU threshold (``task.report.mnr_bleu``, conf/task/i2d2.yaml)."""
    from omegaconf import OmegaConf

    return float(OmegaConf.select(OmegaConf.load(ROOT / "conf/task/i2d2.yaml"), "task.report.mnr_bleu"))


def arrays(rows) -> dict:
    """The columns the estimates need, ``weight``: stratum population / pairs drawn from the stratum."""
    from sacrebleu.metrics import BLEU

    from i2d2.filtering import _negated, dedupe_key

    bleu = BLEU(effective_order=True)
    drawn = Counter((r["split"], r["stratum"]) for r in rows)
    return {"same": np.array([bool(r["same"]) for r in rows]),
            "rule": np.array([bool(r["rule_merges"]) for r in rows]),
            "cosine": np.array([float(r["cosine"]) for r in rows]),
            "same_negation": np.array([_negated(r["a"]) == _negated(r["b"]) for r in rows]),
            "bleu": np.array([bleu.sentence_score(dedupe_key(r["b"]), [dedupe_key(r["a"])]).score / 100.0
                              for r in rows]),
            "weight": np.array([r["stratum_population"] / drawn[r["split"], r["stratum"]] for r in rows])}


def weighted_pr(pred: np.ndarray, same: np.ndarray, weight: np.ndarray) -> dict:
    """Population-weighted precision / recall of ``pred`` (None where undefined) and the raw tp / fp / fn."""
    tp, fp, fn = pred & same, pred & ~same, ~pred & same
    w_tp, w_fp, w_fn = (float(weight[m].sum()) for m in (tp, fp, fn))
    return {"precision": w_tp / (w_tp + w_fp) if w_tp + w_fp else None,
            "recall": w_tp / (w_tp + w_fn) if w_tp + w_fn else None,
            "tp": int(tp.sum()), "fp": int(fp.sum()), "fn": int(fn.sum())}


def predict(cols: dict, t: float | None, with_rule: bool) -> np.ndarray:
    by_cosine = np.zeros(len(cols["same"]), bool) if t is None else (cols["cosine"] >= t) & cols["same_negation"]
    return by_cosine | cols["rule"] if with_rule else by_cosine


def choose_threshold(cols: dict, with_rule: bool, min_precision: float) -> float | None:
    """The cosine threshold with the highest weighted recall at weighted precision >= ``min_precision`` (ties:
    the higher threshold); None when no threshold reaches it."""
    best = None
    for t in sorted(set(cols["cosine"].tolist()), reverse=True):
        m = weighted_pr(predict(cols, t, with_rule), cols["same"], cols["weight"])
        if m["precision"] is not None and m["precision"] >= min_precision and (best is None or m["recall"] > best[1]):
            best = (t, m["recall"])
    return None if best is None else best[0]


def evaluate(rows, min_precision: float = 0.9) -> dict:
    """{"thresholds": {method: t}, "dev"/"test": {method: weighted_pr}} for rule, cosine, rule|cosine, bleu>0.85."""
    cols = {s: arrays([r for r in rows if r["split"] == s]) for s in ("dev", "test")}
    mnr_bleu = recapture_bleu()
    ts = {"cosine": choose_threshold(cols["dev"], False, min_precision),
          "rule|cosine": choose_threshold(cols["dev"], True, min_precision)}
    out = {"thresholds": ts}
    for s, c in cols.items():
        out[s] = {"rule": weighted_pr(c["rule"], c["same"], c["weight"]),
                  "cosine": weighted_pr(predict(c, ts["cosine"], False), c["same"], c["weight"]),
                  "rule|cosine": weighted_pr(predict(c, ts["rule|cosine"], True), c["same"], c["weight"]),
                  "bleu>0.85": weighted_pr(c["bleu"] > mnr_bleu, c["same"], c["weight"]),
                  "n_pairs": len(c["same"]), "n_same": int(c["same"].sum()),
                  "population": float(sum({(r["stratum"]): r["stratum_population"]
                                           for r in rows if r["split"] == s}.values()))}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", default=str(PAIRS))
    ap.add_argument("--min-precision", type=float, default=0.9)
    args = ap.parse_args(argv)
    from i2d2.io import read_jsonl

    try:  # a missing file, a broken row or a missing field: named (file:line), not a traceback
        rows = read_jsonl(args.pairs, required=("split", "a", "b", "same", "cosine", "rule_merges", "stratum",
                                                 "stratum_population"))
    except (ValueError, OSError) as e:
        ap.error(str(e))
    res = evaluate(rows, args.min_precision)
    fmt = lambda v: "  n/a" if v is None else f"{v:5.3f}"  # noqa: E731
    print(f"thresholds chosen on dev (weighted precision >= {args.min_precision}): {res['thresholds']}")
    for s in ("dev", "test"):
        r = res[s]
        print(f"\n{s}: {r['n_pairs']} labelled pairs ({r['n_same']} same) standing for {r['population']:.0f} "
              f"within-concept pairs")
        print(f"{'method':14s} {'precision':>9s} {'recall':>7s} {'tp':>4s} {'fp':>4s} {'fn':>4s}")
        for m in ("rule", "cosine", "rule|cosine", "bleu>0.85"):
            v = r[m]
            print(f"{m:14s} {fmt(v['precision']):>9s} {fmt(v['recall']):>7s} {v['tp']:4d} {v['fp']:4d} {v['fn']:4d}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
