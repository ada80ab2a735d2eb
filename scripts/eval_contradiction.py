"""Measure the NeuroComparatives contradiction scorers on hand-labelled pairs of real Gemma comparatives.

    python scripts/eval_contradiction.py sample --out pairs.jsonl            # the pairs the maintainers labelled
    python scripts/eval_contradiction.py join --pairs pairs.jsonl --labels labels.jsonl   # -> bundled file
    python scripts/eval_contradiction.py eval [--judged FILE] [--cross-encoder-dir DIR] [--out metrics.json]

``sample`` draws ordered (premise, hypothesis) pairs of statements about the same entity pair from
i2d2/data/comparatives/annotations_gemma.jsonl (statements labelled Invalid left out): half share an attribute
(a scale or a "more/less X" word, read by the lexicon scorer: code picks candidates, never labels), half are
drawn from the rest, round-robin over entity pairs. ``join`` adds the maintainers' labels (CONTRADICTION_GUIDE.md)
and writes i2d2/data/comparatives/contradiction_pairs.jsonl. ``eval`` reports precision / recall / F1 of
"contradiction" (``dont_know`` left out) for the cross-encoder at the paper's 0.99 and at 0.5, the lexicon rule
(``offline``) and constant baselines; a pair counts as a contradiction when either order passes, as in the filter.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DATA = ROOT / "i2d2" / "data" / "comparatives"
JUDGED = DATA / "contradiction_pairs.jsonl"
LABELS = ("contradiction", "entailment", "neutral", "dont_know")
# the first judged set chose the lexicon rule's attributive reading (i2d2/data/comparatives/README.md): its rows for
# that rule describe it on the pairs it was fixed from; contradiction_pairs_2.jsonl chose nothing
CHOSE_THE_RULE_NOTE = ("these judged pairs chose the lexicon rule's reading (contradiction_pairs.jsonl, "
                       "i2d2/data/comparatives/README.md): its 'lexicon_rule (offline)' row is no measurement; "
                       "score contradiction_pairs_2.jsonl, which chose nothing")


def chose_the_rule(path: Path) -> bool:
    """``path`` holds the bytes of the judged set the lexicon rule was fixed from (a copy elsewhere too)."""
    return JUDGED.exists() and Path(path).read_bytes() == JUDGED.read_bytes()


def sample_pairs(n_per_stratum: int = 150, seed: int = 16, exclude: Path | None = None, prefix: str = "p") -> list[dict]:
    """``exclude``: a judged pairs file whose pairs (either order) are not drawn again: a fresh set to measure a
    scorer changed after reading the first set's errors."""
    from critics.contradiction import ComparativeDirectionScorer
    from i2d2.io import read_jsonl

    rng = random.Random(seed)
    rows = [r for r in read_jsonl(DATA / "annotations_gemma.jsonl") if r["label"] != "Invalid"]
    by_concept: dict[str, list[str]] = {}
    for r in rows:
        by_concept.setdefault(r["concept"], []).append(r["statement"])
    lexicon = ComparativeDirectionScorer()
    attrs = {r["statement"]: {a for a, _ in lexicon.claims(r["statement"])} for r in rows}
    seen = {frozenset((r["premise"], r["hypothesis"])) for r in read_jsonl(exclude)} if exclude else set()
    shared, other = [], []
    for concept, stmts in by_concept.items():
        for a, b in itertools.combinations(sorted(set(stmts)), 2):
            if frozenset((a, b)) not in seen:
                (shared if attrs[a] & attrs[b] else other).append((concept, a, b))

    def take(pool, n):  # round-robin over entity pairs so that no pair dominates
        groups: dict[str, list] = {}
        for p in rng.sample(pool, len(pool)):
            groups.setdefault(p[0], []).append(p)
        out = []
        while len(out) < n and any(groups.values()):
            for c in rng.sample(sorted(groups), len(groups)):
                if groups[c] and len(out) < n:
                    out.append(groups[c].pop())
        return out

    pairs = []
    for concept, a, b in take(shared, n_per_stratum) + take(other, n_per_stratum):
        if rng.random() < 0.5:
            a, b = b, a
        pairs.append({"premise": a, "hypothesis": b, "concept": concept})
    rng.shuffle(pairs)
    return [{"id": f"{prefix}-{i:03d}", **p} for i, p in enumerate(pairs)]


def join(pairs_path: Path, labels_path: Path) -> list[dict]:
    from i2d2.io import read_jsonl

    labels = {}
    for n, row in enumerate(read_jsonl(labels_path), 1):
        if row.get("label") not in LABELS:
            raise ValueError(f"{labels_path}:{n}: label {row.get('label')!r} is not one of {LABELS}")
        labels[row["id"]] = row["label"]
    pairs = read_jsonl(pairs_path)
    missing = [p["id"] for p in pairs if p["id"] not in labels]
    if missing:
        print(f"warning: {len(missing)} pairs have no label (e.g. {missing[:3]}); left out", file=sys.stderr)
    return [{**p, "label": labels[p["id"]], "annotator": "maintainers"} for p in pairs if p["id"] in labels]


def prf(pred: np.ndarray, gold: np.ndarray) -> dict:
    """Precision / recall / F1 of the positive class; undefined values are None, never 0."""
    tp, fp, fn = int((pred & gold).sum()), int((pred & ~gold).sum()), int((~pred & gold).sum())
    p = tp / (tp + fp) if tp + fp else None
    r = tp / (tp + fn) if tp + fn else None
    f = 2 * p * r / (p + r) if p is not None and r is not None and p + r > 0 else (0.0 if p == 0 or r == 0 else None)
    return {"precision": p, "recall": r, "f1": f, "tp": tp, "fp": fp, "fn": fn, "n_predicted": tp + fp}


def either_order(scorer, premises, hypotheses) -> np.ndarray:
    """P(contradiction) the filter acts on: the larger of the two orders of each pair."""
    c1, _ = scorer.scores(premises, hypotheses)
    c2, _ = scorer.scores(hypotheses, premises)
    return np.maximum(c1, c2)


def evaluate(judged: list[dict], ce_cfg: dict) -> dict:
    from sklearn.metrics import average_precision_score

    from critics.contradiction import load_contradiction_scorer

    rows = [r for r in judged if r["label"] != "dont_know"]
    gold = np.array([r["label"] == "contradiction" for r in rows])
    prem, hyp = [r["premise"] for r in rows], [r["hypothesis"] for r in rows]
    ce = load_contradiction_scorer("cross_encoder", cross_encoder=ce_cfg)
    p_ce = either_order(ce, prem, hyp)
    lex = either_order(load_contradiction_scorer("offline"), prem, hyp)
    from critics.contradiction import ComparativeDirectionScorer

    lex_pred = either_order(ComparativeDirectionScorer(attributive=False), prem, hyp)
    counts = {lab: sum(r["label"] == lab for r in judged) for lab in LABELS}
    results = {
        "cross_encoder@0.99": prf(p_ce >= 0.99, gold),
        "cross_encoder@0.5": prf(p_ce >= 0.5, gold),
        "lexicon_rule (offline)": prf(lex >= 0.5, gold),
        "lexicon_rule, every comparative read as predicative (before 2026-11-28)": prf(lex_pred >= 0.5, gold),
        "constant: always contradiction": prf(np.ones_like(gold), gold),
        "constant: never contradiction": prf(np.zeros_like(gold), gold),
    }
    return {"n_judged": len(judged), "n_scored": len(rows), "label_counts": counts,
            "cross_encoder_average_precision": float(average_precision_score(gold, p_ce)) if gold.any() else None,
            "cross_encoder": ce_cfg, "results": results}


def _fmt(v) -> str:
    return "–" if v is None else f"{v:.3f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sample")
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--per-stratum", type=int, default=150)
    s.add_argument("--seed", type=int, default=16)
    s.add_argument("--exclude", type=Path, default=None, help="judged pairs not to draw again (either order)")
    s.add_argument("--id-prefix", default="p")
    j = sub.add_parser("join")
    j.add_argument("--pairs", type=Path, required=True)
    j.add_argument("--labels", type=Path, required=True)
    j.add_argument("--out", type=Path, default=JUDGED)
    e = sub.add_parser("eval")
    e.add_argument("--judged", type=Path, default=JUDGED)
    e.add_argument("--cross-encoder-dir", default=None, help="a trained cross-encoder folder (default: the cache)")
    e.add_argument("--cross-encoder-name", default="packaged:minilm")
    e.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)

    from i2d2.io import read_jsonl, write_jsonl, write_text

    if args.cmd == "sample":
        write_jsonl(args.out, sample_pairs(args.per_stratum, args.seed, args.exclude, args.id_prefix))
        return 0
    if args.cmd == "join":
        rows = join(args.pairs, args.labels)
        write_jsonl(args.out, rows)
        print(f"{len(rows)} judged pairs -> {args.out}")
        return 0
    if not args.judged.exists():
        raise SystemExit(f"{args.judged}: no judged pairs (run 'join' first)")
    out = evaluate(read_jsonl(args.judged), {"name": args.cross_encoder_name, "dir": args.cross_encoder_dir})
    out = {**out, "judged": str(args.judged), "chose_the_rule": chose_the_rule(args.judged)}
    if out["chose_the_rule"]:
        out["note"] = CHOSE_THE_RULE_NOTE
        print(f"warning: {args.judged}: {CHOSE_THE_RULE_NOTE}", file=sys.stderr)
    print(f"{out['n_scored']} pairs scored ({out['label_counts']}); cross-encoder AP "
          f"{_fmt(out['cross_encoder_average_precision'])}")
    print(f"{'scorer':34s} {'P':>6s} {'R':>6s} {'F1':>6s} {'#pred':>6s}")
    for name, m in out["results"].items():
        print(f"{name:34s} {_fmt(m['precision']):>6s} {_fmt(m['recall']):>6s} {_fmt(m['f1']):>6s} "
              f"{m['n_predicted']:6d}")
    if args.out:
        write_text(args.out, json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
