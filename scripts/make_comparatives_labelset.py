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

    out = Path(args.out)
    if args.merge:
        items = read_jsonl(out / "to_label.jsonl")
        labels = {int(r["id"]): r["label"] for p in sorted((out / "chunks").glob("chunk_*.labels.jsonl"))
                  for r in read_jsonl(p)}
        missing = [i for i in range(len(items)) if i not in labels]
        if missing:
            raise SystemExit(f"{len(missing)} statements have no label yet (first ids: {missing[:10]})")
        dest = ROOT / "i2d2" / "data" / "comparatives"
        write_jsonl(dest / "annotations_gemma.jsonl", [{**r, "label": labels[i], "annotator": "maintainers"}
                                                       for i, r in enumerate(items)])
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
    write_jsonl(out / "to_label.jsonl", items)
    write_json(out / "sources.json", {"script": "scripts/make_comparatives_labelset.py", "runs": sources,
                                      "n_candidates": len(rows), "n_distinct": len(items)})
    size = -(-len(items) // args.chunks)
    for c in range(args.chunks):
        write_jsonl(out / "chunks" / f"chunk_{c}.jsonl", [{"id": i, "statement": items[i]["statement"]}
                                                          for i in range(c * size, min(len(items), (c + 1) * size))])
    print(f"{len(items)} distinct comparatives from {len(rows)} candidates -> {out}")


if __name__ == "__main__":
    main()
