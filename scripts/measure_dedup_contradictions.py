#!/usr/bin/env python
"""Does the NeuroComparatives dedup (§2.3.1) merge opposite comparatives, and what does splitting them change?

    python scripts/measure_dedup_contradictions.py [--seeds 20] [--out dedup_contradictions.json]

Reads the bundled data only (i2d2/data/comparatives): the maintainer-judged pairs (contradiction_pairs.jsonl chose
the lexicon rule; contradiction_pairs_2.jsonl chose nothing) and the labelled Gemma comparatives
(annotations_gemma.jsonl). Embeds each statement's continuation (the statement minus its prompt, the dedup's
``text``) with the dedup's encoder (packaged MiniLM, normalised) and reads contradictions with the lexicon rule
(``scorer: offline``), as the filters do. The labelled set has no decoding score: the pipeline is replayed with
random scores, one run per seed, and the counts are averaged over seeds.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DATA = ROOT / "i2d2" / "data" / "comparatives"
THRESHOLD = 0.15  # conf/task/comparatives.yaml task.filters.dedup.distance_threshold


class MatrixScorer:
    """The lexicon rule's matrices read from one precomputed matrix over every text (the rule is pairwise and reads
    the two texts only, so a submatrix is what ``matrix`` would compute)."""

    def __init__(self, C: np.ndarray, E: np.ndarray, texts: list[str]):
        self.C, self.E, self.at = C, E, {t: i for i, t in enumerate(texts)}

    def matrix(self, texts):
        ix = np.array([self.at[t] for t in texts], dtype=int)
        return self.C[np.ix_(ix, ix)], self.E[np.ix_(ix, ix)]


def continuation(statement: str, prompt: str | None) -> str:
    return statement[len(prompt):].strip() if prompt and statement.startswith(prompt) else statement


def judged_pairs(path: Path, text_of: dict, emb_of, flags) -> dict:
    """Per label: pairs, pairs within the dedup distance, and the same for pairs the rule flags."""
    df = pd.read_json(path, lines=True)
    p = [text_of.get(s, s) for s in df["premise"]]
    h = [text_of.get(s, s) for s in df["hypothesis"]]
    dist = 1.0 - (emb_of(p) * emb_of(h)).sum(1)
    flagged = flags(p, h)
    out = {"unmatched_statements": int(sum(s not in text_of for s in [*df["premise"], *df["hypothesis"]]))}
    for label, g in df.groupby("label"):
        ix = g.index.to_numpy()
        out[label] = {"pairs": len(ix), "within": int((dist[ix] < THRESHOLD).sum()),
                      "rule_flagged": int(flagged[ix].sum()),
                      "rule_flagged_within": int((flagged[ix] & (dist[ix] < THRESHOLD)).sum())}
    return out


def merged_opposites(ann: pd.DataFrame, labels: np.ndarray, c: np.ndarray) -> dict:
    """Clusters of the labelled set holding two statements the rule flags, and the labels of each flagged pair."""
    same = (labels[:, None] == labels[None, :]) & np.triu(c, 1)
    i, j = np.nonzero(same)
    la, lb = ann["label"].to_numpy()[i], ann["label"].to_numpy()[j]
    unfamiliar = (la == "Too unfamiliar to judge") | (lb == "Too unfamiliar to judge")
    valid_a, valid_b = la == "True", lb == "True"
    return {"clusters_with_2plus": int((np.bincount(labels) > 1).sum()),
            "clusters_with_opposites": len(np.unique(labels[i])), "opposite_pairs_in_clusters": len(i),
            "pairs_true_vs_false": int(((la == "True") & (lb == "False") | (la == "False") & (lb == "True")).sum()),
            "pairs_valid_vs_invalid": int(((valid_a != valid_b) & ~unfamiliar).sum()),
            "pairs_same_validity": int(((valid_a == valid_b) & ~unfamiliar).sum()),
            "pairs_with_unfamiliar": int(unfamiliar.sum()),
            "label_pairs": {k: int(v) for k, v in pd.Series([" / ".join(sorted(x)) for x in zip(la, lb)],
                                                             dtype=object).value_counts().items()}}


def replay(ann: pd.DataFrame, emb: np.ndarray, scorer, c: np.ndarray, split: bool, seed: int) -> dict:
    """dedup -> contradiction keep rule (no k, and k=5) on the labelled set with random scores."""
    from i2d2.comparatives import filters as F

    df = ann.assign(score=np.random.default_rng(seed).normal(size=len(ann)))
    kept = F.dedup(df, emb, THRESHOLD, "average", group_col="concept", scorer=scorer if split else None)
    out = {"dedup_out": len(kept), "opposite_pairs_after_dedup": _opposites(c, kept.index.to_numpy())}
    for name, cap in (("keep_rule", None), ("keep_rule_k5", 5)):
        rest = F.contradiction_filter(kept, scorer, k=cap, group_col="concept", text_col="text")
        judged = rest["label"] != "Too unfamiliar to judge"
        out[name] = {"out": len(rest), "judged": int(judged.sum()), "valid": int((rest["label"] == "True").sum()),
                     "opposite_pairs": _opposites(c, rest.index.to_numpy())}
    return out


def _opposites(c: np.ndarray, rows: np.ndarray) -> int:
    """Pairs of ``rows`` the rule flags (``c`` is already False across entity pairs)."""
    return int(np.triu(c[np.ix_(rows, rows)], 1).sum())


def mean_runs(runs: list[dict]) -> dict:
    flat = pd.json_normalize(runs)
    return {k: round(float(v), 2) for k, v in flat.mean().items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    from critics.contradiction import load_contradiction_scorer
    from i2d2.comparatives import filters as F
    from i2d2.comparatives.wordlists import load_wordlists
    from i2d2.models import load_sentence_encoder

    ann = pd.read_json(DATA / "annotations_gemma.jsonl", lines=True)
    ann["text"] = [continuation(s, p) for s, p in zip(ann["statement"], ann["prompt"])]
    wl = load_wordlists()
    rule = load_contradiction_scorer("offline", scales=wl.scales, comparatives=wl.comparatives)
    enc = load_sentence_encoder("packaged:minilm")

    def emb_of(texts):
        return enc.encode(list(texts), batch_size=64, normalize_embeddings=True, convert_to_numpy=True)

    def flags(p, h):  # either order, as the filter counts a pair
        c1, _ = rule.scores(p, h)
        c2, _ = rule.scores(h, p)
        return (c1 >= 0.99) | (c2 >= 0.99)

    text_of = dict(zip(ann["statement"], ann["text"]))
    report = {"judged": {f.name: judged_pairs(f, text_of, emb_of, flags)
                         for f in (DATA / "contradiction_pairs.jsonl", DATA / "contradiction_pairs_2.jsonl")}}
    uniq = list(dict.fromkeys(ann["text"]))
    C, E = rule.matrix(uniq)
    scorer = MatrixScorer(C, E, uniq)
    ix = np.array([scorer.at[t] for t in ann["text"]])
    c = F.contradiction_mask(C[np.ix_(ix, ix)]) & (ann["concept"].to_numpy()[:, None] == ann["concept"].to_numpy())
    emb = emb_of(ann["text"])
    labels = F.cluster_labels(emb, ann["concept"].to_numpy(), THRESHOLD, "average")
    report["gemma"] = {"statements": len(ann), "concepts": int(ann["concept"].nunique()),
                       "rule_opposite_pairs": int(np.triu(c, 1).sum()), **merged_opposites(ann, labels, c)}
    for split in (False, True):
        runs = [replay(ann, emb, scorer, c, split, s) for s in range(args.seeds)]
        report["gemma"][f"replay_split_{str(split).lower()}"] = {"seed0": runs[0], f"mean_{args.seeds}_seeds":
                                                                 mean_runs(runs)}
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
