"""Negate sentences with a trained NegVerse adapter.

    python -m i2d2.negate --adapter runs/negverse/train/adapter "The shop is open." "Everyone liked it."
    python -m i2d2.negate --adapter runs/negverse/train/adapter --file sentences.txt --out negations.jsonl

Prints the kept negations per sentence (with their negation type); ``--out`` writes every kept row as
JSON lines (original, negation, negation_type, cues, masked, answers, lev_distance), ``--dropped`` the
filtered-out candidates with their drop reason.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def parse_args(argv=None):
    from i2d2.negverse.pipeline import DEFAULTS

    p = argparse.ArgumentParser(prog="python -m i2d2.negate", description=__doc__.split("\n\n")[0])
    p.add_argument("sentences", nargs="*", help="sentences to negate")
    p.add_argument("--file", type=Path, help="a file with one sentence a line ('#' lines skipped)")
    p.add_argument("--adapter", type=Path, default=Path("runs/negverse/train/adapter"),
                   help="adapter folder written by `python -m i2d2.train task=negverse` (default: %(default)s)")
    p.add_argument("--base", default=None, help="base causal LM (default: the one the adapter was trained on)")
    p.add_argument("--spacy", default="packaged:spacy-sm")
    p.add_argument("--lexicon", default=None, help="cue lexicon YAML (default conf/negverse/cues.yaml)")
    p.add_argument("--num-candidates", "-n", type=int, default=DEFAULTS["num_candidates"])
    p.add_argument("--max-variants", type=int, default=DEFAULTS["max_variants"])
    p.add_argument("--max-blanks", type=int, default=DEFAULTS["max_blanks"])
    p.add_argument("--batch-size", type=int, default=DEFAULTS["batch_size"])
    p.add_argument("--max-new-tokens", type=int, default=DEFAULTS["max_new_tokens"])
    p.add_argument("--top-p", type=float, default=DEFAULTS["top_p"])
    p.add_argument("--temperature", type=float, default=DEFAULTS["temperature"])
    p.add_argument("--greedy", action="store_true", help="greedy decoding instead of sampling")
    p.add_argument("--max-distance", type=float, default=DEFAULTS["max_distance"])
    p.add_argument("--no-cue-filter", action="store_true", help="keep candidates without a detected negation cue")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="write kept negations as JSON lines")
    p.add_argument("--dropped", type=Path, help="write dropped candidates as JSON lines")
    p.add_argument("--metrics", action="store_true", help="also print corpus metrics")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = p.parse_args(argv)
    if not args.sentences and not args.file:
        p.error("give sentences on the command line or --file")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    from i2d2.io import write_jsonl
    from i2d2.models import load_spacy
    from i2d2.negverse.cues import CueDetector
    from i2d2.negverse.data import read_sentences
    from i2d2.negverse.metrics import negation_metrics
    from i2d2.negverse.model import NegVerseLM
    from i2d2.negverse.pipeline import negate

    if args.threads:
        torch.set_num_threads(args.threads)
    sentences = list(args.sentences)
    if args.file:
        if not args.file.exists():
            print(f"error: --file {args.file} does not exist", file=sys.stderr)
            return 2
        sentences += read_sentences(args.file)
    nlp = load_spacy(args.spacy)
    lm = NegVerseLM.load(args.adapter, base_name=args.base)
    detector = CueDetector(nlp, lexicon=args.lexicon)
    kept, dropped, stats = negate(
        lm, nlp, detector, sentences, num_candidates=args.num_candidates, batch_size=args.batch_size,
        max_new_tokens=args.max_new_tokens, do_sample=not args.greedy, top_p=args.top_p,
        temperature=args.temperature, max_blanks=args.max_blanks, max_variants=args.max_variants,
        max_distance=args.max_distance, require_cue=not args.no_cue_filter, seed=args.seed)
    for s in sentences:
        s = s.strip()
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
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in stats.items()}), file=sys.stderr)
    if args.metrics:
        m = negation_metrics(kept, nlp)
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in m.items()}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
