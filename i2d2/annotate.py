"""Annotation round-trip from the command line.

    python -m i2d2.annotate export --input runs/i2d2/iter_0/filtered/kept.jsonl \
        --input runs/i2d2/iter_0/filtered/dropped --out runs/i2d2/iter_0/to_label.csv --k 4 \
        --store runs/i2d2/annotations/labels.jsonl
    python -m i2d2.annotate import --input to_label_done.csv --store runs/i2d2/annotations/labels.jsonl

Blind per-iteration evaluation on the fixed held-out concepts (``task.heldout``):

    python -m i2d2.annotate export --blind --run-dir runs/i2d2 --out blind.csv --n 40
    python -m i2d2.annotate import --blind --run-dir runs/i2d2 --input blind_done.csv
    python -m i2d2.annotate accuracy --run-dir runs/i2d2

``export --blind`` draws n statements per iteration, shuffles them together and writes only item id, statement
and empty label and votes columns (no score, iteration or concept); ``import --blind`` maps the labels back through the key
kept in the run, stores them apart from the critic's labels and writes the accuracy into every iteration's
``report.md`` / ``report/metrics.json``; ``accuracy`` prints the person-judged accuracy per iteration.

``export`` samples k statements per concept stratified by ``critic_score`` and skips statements already in
the store; ``import`` validates the labels (errors name file:line) and merges them into the store, which
the next iteration's critic trains on together with the seed set.
"""

from __future__ import annotations

import argparse
import logging
import sys

from pathlib import Path

from i2d2.annotation import export_blind, export_for_annotation, heldout_accuracy, import_annotations, import_blind
from i2d2.io import DataError, read_jsonl, read_table, stream_jsonl


def _read_rows(path: str, fields: tuple[str, ...] = ()):
    """Rows of a JSONL file (``i2d2.io.stream_jsonl``: a field absent, null or empty is missing, named by
    file:line), or of a stage table folder (``filtered/kept``, ``filtered/dropped``), streamed; each holds
    ``fields`` (``--text-key``, ``--concept-key``), else a DataError names the file: the export's own check said
    only "row 1", of all the inputs together."""
    if not Path(path).is_dir():
        return list(stream_jsonl(path, fields, hint="--text-key / --concept-key name other fields"))
    table = read_table(path)
    missing = [k for k in fields if k not in table.column_names]
    if missing:
        raise DataError(f"{path}: the table lacks column(s) {', '.join(missing)} (--text-key / --concept-key)")
    return (row for batch in table.iter(batch_size=10_000)
            for row in (dict(zip(batch, vals)) for vals in zip(*batch.values())))


def _positive_int(s: str) -> int:
    # --k 0 crashed in numpy with a traceback and --n -1 silently exported all but one statement per iteration
    try:
        n = int(s)
    except ValueError:  # argparse's own message named this function: "invalid _positive_int value: 'abc'"
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {s}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {s}")
    return n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m i2d2.annotate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    ex = sub.add_parser("export", help="write a sample of statements to label (CSV or JSONL by suffix)")
    ex.add_argument("--input", action="append", help="JSONL rows or a stage table folder (Arrow; repeatable)")
    ex.add_argument("--blind", action="store_true", help="blind sample of every iteration's held-out generations")
    ex.add_argument("--run-dir", help="with --blind: the run directory")
    ex.add_argument("--n", type=_positive_int, default=40, help="with --blind: statements per iteration")
    ex.add_argument("--out", required=True)
    ex.add_argument("--k", type=_positive_int, default=4, help="statements per concept")
    ex.add_argument("--text-key", default="statement")
    ex.add_argument("--concept-key", default="concept")
    ex.add_argument("--score-key", default="critic_score")
    ex.add_argument("--seed", type=int, default=0)
    ex.add_argument("--store", help="labels store: statements already labelled there are not exported again")
    im = sub.add_parser("import", help="read labels back and merge them into the labels store")
    im.add_argument("--input", required=True)
    im.add_argument("--store", help="labels store (not with --blind)")
    im.add_argument("--blind", action="store_true", help="a labelled blind export: map back through the run's key")
    im.add_argument("--run-dir", help="with --blind: the run directory")
    ac = sub.add_parser("accuracy", help="person-judged accuracy per iteration on the held-out concepts")
    ac.add_argument("--run-dir", required=True)
    im.add_argument("--on-error", choices=["raise", "skip"], default="raise")
    im.add_argument("--iteration", type=int)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        if args.cmd == "export" and args.blind:
            if not args.run_dir:
                ap.error("export --blind needs --run-dir")
            out = export_blind(args.run_dir, args.out, args.n, seed=args.seed)
            print(f"wrote {len(out)} statements (blind: no scores, iterations or concepts) to {args.out}")
        elif args.cmd == "export":
            if not args.input:
                ap.error("export needs --input (or --blind --run-dir)")
            rows = [r for p in args.input for r in _read_rows(p, (args.text_key, args.concept_key))]
            # a store that does not exist yet (before the first import) holds nothing to leave out
            exclude = (read_jsonl(args.store, required=("statement",))
                       if args.store and Path(args.store).exists() else [])
            out = export_for_annotation(rows, args.out, args.k, args.text_key, args.concept_key, args.score_key,
                                        seed=args.seed, exclude=exclude)
            print(f"wrote {len(out)} statements to {args.out}")
        elif args.cmd == "accuracy":
            rows = heldout_accuracy(args.run_dir)
            if not rows:  # a misspelt --run-dir printed an empty table, exit code 0
                raise DataError(f"no held-out generations under {args.run_dir}/iter_*/heldout/ (run an iteration "
                                "first, or check --run-dir)")
            print("| iteration | held-out generations | labelled | person-judged accuracy | 95% CI |")
            print("|---|---|---|---|---|")
            for r in rows:
                acc = "–" if r["accuracy"] is None else f"{r['accuracy']:.3f}"
                ci = "–" if r["ci95_low"] is None else f"{r['ci95_low']:.3f}–{r['ci95_high']:.3f}"
                print(f"| {r['iteration']} | {r['n_generations']} | {r['n_labelled']} | {acc} | {ci} |")
        else:
            errors: list[str] = []
            if args.blind:
                if not args.run_dir:
                    ap.error("import --blind needs --run-dir")
                rows = import_blind(args.input, args.run_dir, on_error=args.on_error, errors=errors)
                where = f"{args.run_dir}/annotations/heldout_labels.jsonl"
            else:
                if not args.store:
                    ap.error("import needs --store (or --blind --run-dir)")
                rows = import_annotations(args.input, args.store, on_error=args.on_error, errors=errors,
                                          iteration=args.iteration)
                where = args.store
            for e in errors:
                print(f"skipped: {e}", file=sys.stderr)
            print(f"imported {len(rows)} labelled statements into {where}")
            if args.blind:  # the iterations' reports were written before these labels existed
                from i2d2.recipes.generics_report import refresh_heldout_accuracy

                for path in refresh_heldout_accuracy(args.run_dir):
                    print(f"person-judged accuracy written into {path}")
    except (DataError, OSError) as e:  # OSError names the path: a folder given as a file was a traceback
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
