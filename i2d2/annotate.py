"""Annotation round-trip from the command line.

    python -m i2d2.annotate export --input runs/i2d2/iter_0/filtered/kept.jsonl \
        --input runs/i2d2/iter_0/filtered/dropped.jsonl --out runs/i2d2/iter_0/to_label.csv --k 4 \
        --store runs/i2d2/annotations/labels.jsonl
    python -m i2d2.annotate import --input to_label_done.csv --store runs/i2d2/annotations/labels.jsonl

``export`` samples k statements per concept stratified by ``critic_score`` and skips statements already in
the store; ``import`` validates the labels (errors name file:line) and merges them into the store, which
the next iteration's critic trains on together with the seed set.
"""

from __future__ import annotations

import argparse
import logging
import sys

from i2d2.annotation import export_for_annotation, import_annotations
from i2d2.io import DataError, read_jsonl


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m i2d2.annotate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    ex = sub.add_parser("export", help="write a sample of statements to label (CSV or JSONL by suffix)")
    ex.add_argument("--input", action="append", required=True, help="JSONL rows (repeatable)")
    ex.add_argument("--out", required=True)
    ex.add_argument("--k", type=int, default=4, help="statements per concept")
    ex.add_argument("--text-key", default="statement")
    ex.add_argument("--concept-key", default="concept")
    ex.add_argument("--score-key", default="critic_score")
    ex.add_argument("--seed", type=int, default=0)
    ex.add_argument("--store", help="labels store: statements already labelled there are not exported again")
    im = sub.add_parser("import", help="read labels back and merge them into the labels store")
    im.add_argument("--input", required=True)
    im.add_argument("--store", required=True)
    im.add_argument("--on-error", choices=["raise", "skip"], default="raise")
    im.add_argument("--iteration", type=int)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        if args.cmd == "export":
            rows = [r for p in args.input for r in read_jsonl(p)]
            exclude = [r["statement"] for r in read_jsonl(args.store)] if args.store else []
            out = export_for_annotation(rows, args.out, args.k, args.text_key, args.concept_key, args.score_key,
                                        seed=args.seed, exclude=exclude)
            print(f"wrote {len(out)} statements to {args.out}")
        else:
            errors: list[str] = []
            rows = import_annotations(args.input, args.store, on_error=args.on_error, errors=errors,
                                      iteration=args.iteration)
            for e in errors:
                print(f"skipped: {e}", file=sys.stderr)
            print(f"imported {len(rows)} labelled statements into {args.store}")
    except (DataError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
