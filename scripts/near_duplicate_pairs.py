#!/usr/bin/env python
"""Draw the near-duplicate pairs of ``i2d2/data/annotations/near_duplicate_pairs.jsonl`` (before labelling).

Population: every pair of two distinct finished statements of one concept in the labelled Gemma generations
(``generics_gemma.jsonl``, rows as the default critic reads them: ``critics.train.default_critic_data``), for the
concepts of the critic's dev and test splits (a pair takes its concept's split; train concepts are not drawn).
Strata: MiniLM cosine bin (``packaged:minilm``) x whether the current rule (``i2d2.filtering.near_duplicates``,
ratio 90 + content words) merges the pair; a fixed number of pairs is drawn at random from each stratum of each
split (all of a smaller one) and ``stratum_population`` records its size, so that an estimate can be weighted back
to all within-concept pairs. ``same`` is left null: the pairs are labelled by reading them against GUIDE.md.

  python scripts/near_duplicate_pairs.py --out pairs.jsonl [--per-stratum 30] [--seed 0]
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# cosine bin edges: dense where a threshold is plausible
BINS = (0.0, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 1.01)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--per-stratum", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    import numpy as np

    from critics.train import default_critic_data
    from i2d2.filtering import near_duplicates
    from i2d2.io import write_jsonl
    from i2d2.models import load_sentence_encoder

    _, rows, _, _, (_, dev, test) = default_critic_data()
    split_of = {rows[i]["concept"]: name for name, idx in (("dev", dev), ("test", test)) for i in idx}
    by_concept: dict[str, list[str]] = {}
    for r in rows:
        if r["concept"] in split_of and r["statement"] not in by_concept.setdefault(r["concept"], []):
            by_concept[r["concept"]].append(r["statement"])
    texts = sorted({t for ts in by_concept.values() for t in ts})
    emb = load_sentence_encoder().encode(texts, batch_size=64, normalize_embeddings=True, convert_to_numpy=True)
    vec = dict(zip(texts, emb))
    pairs = []
    for concept, ts in sorted(by_concept.items()):
        for a, b in itertools.combinations(ts, 2):
            merges = bool(near_duplicates([a, b], by_content=True)[1] == 0)
            cos = float(vec[a] @ vec[b])
            cbin = int(np.digitize(cos, BINS)) - 1
            pairs.append({"concept": concept, "split": split_of[concept], "a": a, "b": b, "same": None,
                          "cosine": round(cos, 4), "rule_merges": merges,
                          "stratum": f"cos[{BINS[cbin]:.2f},{min(BINS[cbin + 1], 1.0):.2f})|rule={int(merges)}"})
    rng = np.random.default_rng(args.seed)
    out = []
    for key in sorted({(p["split"], p["stratum"]) for p in pairs}):
        members = [p for p in pairs if (p["split"], p["stratum"]) == key]
        for j in sorted(rng.permutation(len(members))[:args.per_stratum].tolist()):
            out.append({**members[j], "stratum_population": len(members), "annotator": "maintainers"})
        print(f"{key[0]:5s} {key[1]:28s} population {len(members):6d} drawn {min(len(members), args.per_stratum)}")
    write_jsonl(args.out, out)
    print(f"{len(out)} pairs of {len(pairs)} -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
