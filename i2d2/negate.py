"""Negate sentences with a trained NegVerse adapter.

    python -m i2d2.negate --adapter runs/negverse/train/adapter "The shop is open." "Everyone liked it."
    python -m i2d2.negate --adapter runs/negverse/train/adapter --file sentences.txt --out negations.jsonl

Prints the kept negations per sentence (with their negation type); ``--out`` writes every kept row as
JSON lines (original, negation, negation_type, cues, masked, answers, lev_distance), ``--dropped`` the
filtered-out candidates with their drop reason. Generation, masking and filter settings are those the
adapter was trained with (saved in its negverse.json) unless given here. A missing, unreadable or empty
``--file`` is an error (exit status 2).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


# option name -> CLI flag; None on the command line means "as the adapter was trained" (negverse.json)
OPTIONS = {"num_candidates": "--num-candidates", "max_variants": "--max-variants", "max_blanks": "--max-blanks",
           "batch_size": "--batch-size", "max_new_tokens": "--max-new-tokens", "top_p": "--top-p",
           "temperature": "--temperature", "max_distance": "--max-distance"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m i2d2.negate", description=__doc__.split("\n\n")[0])
    p.add_argument("sentences", nargs="*", help="sentences to negate")
    p.add_argument("--file", type=Path, help="a file with one sentence a line ('#' lines skipped)")
    p.add_argument("--adapter", type=Path, default=Path("runs/negverse/train/adapter"),
                   help="adapter folder written by `python -m i2d2.train task=negverse` (default: %(default)s)")
    p.add_argument("--base", default=None, help="base causal LM (default: the one the adapter was trained on)")
    p.add_argument("--spacy", default="packaged:spacy-sm")
    p.add_argument("--lexicon", default=None, help="cue lexicon YAML (default conf/negverse/cues.yaml)")
    unset = " (default: as the adapter was trained)"
    p.add_argument("--num-candidates", "-n", type=int, help="sampled candidates per masked variant" + unset)
    p.add_argument("--max-variants", type=int, help="masked variants per sentence" + unset)
    p.add_argument("--max-blanks", type=int, help="blanks per variant at most" + unset)
    p.add_argument("--batch-size", type=int, help=unset.strip(" ()"))
    p.add_argument("--max-new-tokens", type=int, help=unset.strip(" ()"))
    p.add_argument("--top-p", type=float, help=unset.strip(" ()"))
    p.add_argument("--temperature", type=float, help=unset.strip(" ()"))
    p.add_argument("--greedy", action="store_true", help="greedy decoding instead of sampling")
    p.add_argument("--max-distance", type=float, help="normalised Levenshtein limit" + unset)
    p.add_argument("--no-cue-filter", action="store_true", help="keep candidates without a detected negation cue")
    p.add_argument("--no-grammar-filter", action="store_true",
                   help="keep candidates whose negation cue the parse puts in an ungrammatical position")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="write kept negations as JSON lines")
    p.add_argument("--dropped", type=Path, help="write dropped candidates as JSON lines")
    p.add_argument("--metrics", action="store_true", help="also print corpus metrics")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = p.parse_args(argv)
    if not args.sentences and not args.file:
        p.error("give sentences on the command line or --file")
    return args


def input_sentences(args) -> list[str]:
    """Command-line sentences plus those of ``--file``; a missing, unreadable or empty file is an error."""
    from i2d2.io import DataError
    from i2d2.negverse.data import read_sentences

    sentences = [s.strip() for s in args.sentences if s.strip()]
    if args.file:
        try:
            from_file = read_sentences(args.file)
        except DataError as e:  # read, but not one sentence a line (its message names file:line)
            raise InputError(f"--file: {e}") from None
        except (OSError, UnicodeDecodeError) as e:  # missing, a folder, not UTF-8 text
            raise InputError(f"--file {args.file}: cannot read it ({e.__class__.__name__}: {e})") from None
        if not from_file:
            raise InputError(f"--file {args.file}: no sentences in it (empty, or only blank and '#' lines)")
        sentences += from_file
    if not sentences:
        raise InputError("no sentences to negate (all given sentences are blank)")
    return sentences


def check_outputs(args) -> None:
    """--out / --dropped must name files: a folder was found only when writing, after every candidate was generated,
    as an IsADirectoryError traceback."""
    from i2d2.config import file_in_the_way

    for flag, path in (("--out", args.out), ("--dropped", args.dropped)):
        if path is not None and path.is_dir():
            raise InputError(f"{flag} {path}: is a folder; give a file to write the JSON lines to")
        blocker = file_in_the_way(path.parent) if path is not None else None  # 'notes.txt/out.jsonl'
        if blocker is not None:
            raise InputError(f"{flag} {path}: {blocker} is a file, not a folder to write into")


class InputError(ValueError):
    """Bad input to negate (a missing, unreadable or empty file): reported on stderr, exit status 2."""


def negation_options(args) -> tuple[dict, dict]:
    """(options for pipeline.negate, where each came from): command line > the adapter's saved task
    config > i2d2.schemas.NegationOptions (only for an adapter saved without one)."""
    from i2d2.negverse.pipeline import saved_options
    from i2d2.schemas import NegationOptions, defaults

    DEFAULTS = defaults(NegationOptions)

    saved = saved_options(args.adapter)
    opts, source = {}, {}
    for key in DEFAULTS:
        if key == "seed":
            continue
        given = getattr(args, key, None) if key in OPTIONS else None
        if given is not None:
            opts[key], source[key] = given, "command line"
        elif key in saved:
            opts[key], source[key] = saved[key], "adapter"
        else:
            opts[key], source[key] = DEFAULTS[key], "default"
    if args.greedy:
        opts["do_sample"], source["do_sample"] = False, "command line"
    if args.no_cue_filter:
        opts["require_cue"], source["require_cue"] = False, "command line"
    if args.no_grammar_filter:
        opts["grammar"], source["grammar"] = False, "command line"
    opts["seed"] = args.seed
    from i2d2.schemas import fill

    try:  # the ranges now, before the models load (e.g. --num-candidates 0, --top-p 2)
        fill(NegationOptions, opts, where="negation options")
    except ValueError as e:  # the option it concerns (OptionError.key): say which flag gave it, if one did. Not every
        # key found in the message: "masking: max_blanks and max_variants must be >= 1" blamed both flags for one value
        key = getattr(e, "key", None)
        given = f"given as {OPTIONS[key]} {opts[key]}; " if key in OPTIONS and source.get(key) == "command line" else ""
        raise InputError(f"{e} ({given}options: command line > {args.adapter}/negverse.json > defaults)") from None
    return opts, source


def _rounded(d: dict) -> str:
    return json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in d.items()})


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    from i2d2.io import DataError, write_jsonl
    from i2d2.models import load_spacy
    from i2d2.negverse.cues import CueDetector
    from i2d2.negverse.metrics import negation_metrics
    from i2d2.negverse.model import NegVerseLM
    from i2d2.negverse.pipeline import negate

    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        sentences = input_sentences(args)
        check_outputs(args)
        opts, source = negation_options(args)
    except (InputError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    defaulted = sorted(k for k, v in source.items() if v == "default")
    if defaulted:
        print(f"warning: {args.adapter}/negverse.json has no saved {', '.join(defaulted)}; using the built-in "
              f"defaults", file=sys.stderr)
    try:  # the adapter first: a missing or damaged one is refused before spaCy loads
        lm = NegVerseLM.load(args.adapter, base_name=args.base)
    except (DataError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    nlp = load_spacy(args.spacy)
    detector = CueDetector(nlp, lexicon=args.lexicon)
    kept, dropped, stats = negate(lm, nlp, detector, sentences, **opts)
    for s in sentences:
        rows = [r for r in kept if r["original"] == s]
        print(s)
        if not rows:
            print("    (no negation passed the filters)")
        for r in rows:
            print(f"    [{r.get('negation_type') or '-'}] {r['negation']}")
    if args.out:
        write_jsonl(args.out, kept)
    if args.dropped:
        write_jsonl(args.dropped, dropped)
    print(_rounded(stats), file=sys.stderr)
    if args.metrics:
        print(_rounded(negation_metrics(kept, nlp)), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
