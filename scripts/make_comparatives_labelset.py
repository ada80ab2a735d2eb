#!/usr/bin/env python
"""Collect NeuroComparatives candidates for the maintainers to label (``i2d2/data/comparatives/annotations_gemma.*``).

The knowledge discriminator (neurocomparatives.txt §2.3.4) is trained on labelled samples of the pipeline's own
generated comparatives. This script takes the ``filtered/candidates/kept.jsonl`` of one or more comparatives runs
(the generations that satisfied their constraints, cut to one comparison), keeps one statement per near-duplicate
cluster of an entity pair, shuffles them and writes files to label:

    python -m i2d2.train task=comparatives run_dir=runs/nc_labelset data.max_pairs_per_class=3 data.max_pairs=40 \
        task.max_passes=5 logger=none                       # packaged Gemma 3 270M, the task's decoding settings
    python scripts/make_comparatives_labelset.py --runs runs/nc_labelset --out runs/nc_label
    # ... label <out>/chunks/chunk_*.jsonl against i2d2/data/comparatives/GUIDE.md into chunk_*.labels.jsonl ...
    python scripts/make_comparatives_labelset.py --runs runs/nc_labelset --out runs/nc_label --merge
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", nargs="+", required=True, help="comparatives run_dirs (iteration 0 is read)")
    ap.add_argument("--out", default="runs/nc_label")
    ap.add_argument("--chunks", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--merge", action="store_true")
    args = ap.parse_args(argv)
    if args.chunks < 1:  # checked now, not after to_label.jsonl is written
        ap.error(f"--chunks must be >= 1, got {args.chunks}")

    from i2d2.filtering import near_duplicates
    from i2d2.io import read_jsonl, write_json, write_jsonl
    from labelset_chunks import labelled_items, write_chunks

    out = Path(args.out)
    if args.merge:
        items = labelled_items(out)
        dest = ROOT / "i2d2" / "data" / "comparatives"
        write_jsonl(dest / "annotations_gemma.jsonl", [{**r, "label": label, "annotator": "maintainers"}
                                                       for r, label in items])
        write_json(dest / "annotations_gemma.config.json", json.loads((out / "sources.json").read_text()))
        print(f"wrote {len(items)} labelled comparatives to {dest / 'annotations_gemma.jsonl'}")
        return
    rows, sources = [], []
    for run in args.runs:
        it = Path(run) / "iter_0"
        rows += read_jsonl(it / "filtered" / "candidates" / "kept.jsonl")
        cfg = (it / "config.yaml").read_text()
        sources.append({"run_dir": run, "config_yaml": cfg})
    pair = [f"{r['entity1']} | {r['entity2']}" for r in rows]
    rep = near_duplicates([r["statement"] for r in rows], pair)
    items = [{"statement": r["statement"], "concept": pair[i], "prompt": r.get("prompt"), "class": r.get("class")}
             for i, r in enumerate(rows) if rep[i] == i]
    random.Random(args.seed).shuffle(items)
    write_chunks(out, items, args.chunks)
    write_json(out / "sources.json", {"script": "scripts/make_comparatives_labelset.py", "runs": sources,
                                      "n_candidates": len(rows), "n_distinct": len(items)})
    print(f"{len(items)} distinct comparatives from {len(rows)} candidates -> {out}")


if __name__ == "__main__":
    main()
