"""Measure the parse-based grammaticality filter on the recipe's evaluation sentences.

    python -m i2d2.negverse.grammar_eval --adapter runs/negverse/train/adapter --out-dir /tmp [key=value ...]

Composes ``task=negverse`` (its held-out sentences ``data.eval_sentences`` and its generate / masking /
filter settings; Hydra overrides after the options), generates the candidates once, and filters them
twice: every filter but the grammaticality check ("before"), then with it ("after"). Prints the keep
rates and the grammar filter's drop reasons, and writes ``negverse_judge_before.jsonl`` and
``negverse_judge_after.jsonl`` (``{"id", "statement", "source"}``: a seeded sample of kept negations and
the sentence each came from) for a person to judge, plus ``negverse_grammar_dropped.jsonl``. The bundled
``eval_sentences.txt`` is no measurement: the filter's checks were in part written from its outputs (a warning says
so); pass ``data.eval_sentences=<file>`` with sentences no check was written from.

    python -m i2d2.negverse.grammar_eval --judged i2d2/data/negverse/judged/fresh_outputs.jsonl

scores the current grammar filter on judged outputs (rows with ``source``, ``statement`` and a ``label`` of
``i2d2/data/negverse/judged/GUIDE.md``): the share valid before and after it, and how many of the ungrammatical
and of the valid ones it drops. Judged rows that shaped the filter measure nothing: score fresh ones.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path


# the bundled judged files whose items shaped the filter's checks (i2d2/data/negverse/judged/README.md): the filter
# scored on them is read on rows it was written from, not measured
SHAPED_THE_FILTER = ("grammar_filter_outputs.jsonl", "fresh_outputs.jsonl", "fresh_outputs.second_pass.jsonl")
SHAPED_NOTE = ("these judged outputs shaped the filter's checks (i2d2/data/negverse/judged/README.md): the shares "
               "below describe the filter on rows it was written from, they do not measure it; score a fresh set")


def shaped_the_filter(path: Path) -> bool:
    """``path`` holds the bytes of a bundled judged file that shaped the filter (a copy elsewhere too)."""
    from i2d2.negverse.data import DATA_DIR

    data = Path(path).read_bytes()
    return any((DATA_DIR / "judged" / name).read_bytes() == data for name in SHAPED_THE_FILTER)


def bundled_eval_sentences(path) -> bool:
    """``data.eval_sentences`` (null or a path) is the bundled eval_sentences.txt, however it is given: the warning
    that its keep rates measure nothing was skipped when the bundled file was named by its path."""
    from i2d2.negverse.data import DATA_DIR, resolve

    return resolve(path, "eval_sentences.txt").resolve() == (DATA_DIR / "eval_sentences.txt").resolve()


def judge_rows(rows: list[dict], n: int, prefix: str, seed: int = 0) -> list[dict]:
    """A seeded sample of ``n`` kept rows as {"id", "statement", "source"} records."""
    picked = random.Random(seed).sample(rows, min(n, len(rows)))
    return [{"id": f"{prefix}-{i:03d}", "statement": r["negation"], "source": r["original"]}
            for i, r in enumerate(picked)]


def score_judged(path: Path, nlp, detector) -> dict:
    """The grammar filter on judged outputs: kept / valid before and after it, and its drops by label (rows the
    cue filter drops are counted apart, as the pipeline never grammar-checks them)."""
    from i2d2.io import read_jsonl
    from i2d2.negverse.filters import filter_cue, filter_grammar

    judged = read_jsonl(path, required=("source", "statement", "label"))
    rows = [{"original": r["source"], "negation": r["statement"], "label": r["label"]} for r in judged]
    # as in the pipeline: rows without a new negation cue never reach the grammar filter, the rest are checked at
    # their cues' positions
    with_cue, no_cue = filter_cue(rows, detector)
    kept, dropped = filter_grammar(with_cue, nlp)

    def count(rs, label):
        return sum(r["label"] == label for r in rs)

    reasons: dict[str, int] = {}
    for r in dropped:
        reasons[r["drop_reason"]] = reasons.get(r["drop_reason"], 0) + 1
    return {"judged": str(path), "n": len(rows), "labels": {k: count(rows, k) for k in sorted({r["label"] for r in rows})},
            "n_without_new_cue": len(no_cue), "n_with_new_cue": len(with_cue),  # valid_share_before's count
            "valid_share_before": count(with_cue, "valid") / len(with_cue)
            if with_cue else None,
            "n_kept": len(kept), "valid_share_after": count(kept, "valid") / len(kept) if kept else None,
            "n_dropped": len(dropped), "dropped_ungrammatical": count(dropped, "ungrammatical"),
            "dropped_valid": count(dropped, "valid"), "dropped_not_negation": count(dropped, "not_negation"),
            "ungrammatical_recall": count(dropped, "ungrammatical") / count(rows, "ungrammatical")
            if count(rows, "ungrammatical") else None,
            "drop_precision": count(dropped, "ungrammatical") / len(dropped) if dropped else None,
            "drop_reasons": reasons,
            **({"shaped_the_filter": True, "note": SHAPED_NOTE} if shaped_the_filter(path) else
               {"shaped_the_filter": False})}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m i2d2.negverse.grammar_eval", description=__doc__.split("\n\n")[0])
    p.add_argument("--adapter", type=Path, help="the prompt-tuned adapter that generates (not with --judged)")
    p.add_argument("--judged", type=Path, help="score the grammar filter on these judged outputs instead")
    p.add_argument("--out-dir", type=Path, default=Path("."))
    p.add_argument("--n-judge", type=int, default=40)
    p.add_argument("--max-sentences", type=int, default=None, help="first N held-out sentences only (CPU time)")
    p.add_argument("overrides", nargs="*", help="Hydra overrides of task=negverse, e.g. task.generate.num_candidates=4")
    args = p.parse_args(argv)

    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from i2d2 import config
    from i2d2.io import write_jsonl
    from i2d2.models import load_spacy
    from i2d2.negverse.cues import CueDetector
    from i2d2.negverse.data import read_sentences, resolve
    from i2d2.negverse.filters import apply_filters, filter_grammar
    from i2d2.negverse.model import NegVerseLM
    from i2d2.negverse.pipeline import candidates

    if (args.adapter is None) == (args.judged is None):
        p.error("give --adapter (generate and filter) or --judged (score the filter on judged outputs)")
    with initialize_config_dir(config_dir=str(config.CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["task=negverse", *args.overrides])
    t = cfg.task
    if args.judged is not None:
        nlp = load_spacy(t.spacy)
        scored = score_judged(args.judged, nlp, CueDetector(nlp, lexicon=t.cue_lexicon))
        if scored["shaped_the_filter"]:
            print(f"warning: {args.judged}: {SHAPED_NOTE}", file=sys.stderr)
        print(json.dumps(scored, indent=1))
        return 0
    gen = OmegaConf.to_container(t.generate, resolve=True)
    filt = OmegaConf.to_container(t.filters, resolve=True)
    sentences = read_sentences(resolve(cfg.data.eval_sentences, "eval_sentences.txt"))[: args.max_sentences]
    if bundled_eval_sentences(cfg.data.eval_sentences):  # the keep rates would read as a measurement of the filter
        print("warning: the bundled eval_sentences.txt shaped the grammar and degenerate filters (their checks were "
              "in part written from its outputs): these keep rates measure nothing; pass data.eval_sentences=<file> "
              "with sentences no check was written from", file=sys.stderr)
    nlp = load_spacy(t.spacy)
    lm = NegVerseLM.load(args.adapter)
    detector = CueDetector(nlp, lexicon=t.cue_lexicon)
    t0 = time.time()
    rows = candidates(lm, nlp, sentences, rules=list(t.masking.rules), max_blanks=int(t.masking.max_blanks),
                      max_variants=int(t.masking.max_variants), min_two_blank=int(t.masking.min_two_blank),
                      seed=int(cfg.seed), **gen)
    gen_s = time.time() - t0
    before, _, counts = apply_filters(rows, detector, max_distance=filt["max_distance"],
                                      max_len_ratio=filt["max_len_ratio"], require_cue=filt["require_cue"],
                                      grammar=False)
    after, dropped = filter_grammar([dict(r) for r in before], nlp)
    reasons: dict[str, int] = {}
    for r in dropped:
        reasons[r["drop_reason"]] = reasons.get(r["drop_reason"], 0) + 1
    n = len(rows)
    stats = {"n_sentences": len(sentences), "n_candidates": n,
             "n_two_blank_candidates": sum(r["n_blanks"] == 2 for r in rows),
             "n_kept_before_grammar": len(before), "n_kept_after_grammar": len(after),
             "keep_rate_before": len(before) / n if n else None, "keep_rate_after": len(after) / n if n else None,
             "grammar_drop_share_of_kept": len(dropped) / len(before) if before else None,
             "sentences_with_negation_before": len({r["original"] for r in before}),
             "sentences_with_negation_after": len({r["original"] for r in after}),
             "grammar_drop_reasons": reasons, "other_drop_reasons": counts, "generation_s": round(gen_s, 1),
             "settings": {**gen, "max_variants": int(t.masking.max_variants),
                          "min_two_blank": int(t.masking.min_two_blank), **filt}}
    args.out_dir.mkdir(parents=True, exist_ok=True)
    write_jsonl(args.out_dir / "negverse_judge_before.jsonl", judge_rows(before, args.n_judge, "before"))
    write_jsonl(args.out_dir / "negverse_judge_after.jsonl", judge_rows(after, args.n_judge, "after"))
    write_jsonl(args.out_dir / "negverse_grammar_dropped.jsonl",
                [{"statement": r["negation"], "source": r["original"], "reason": r["drop_reason"]} for r in dropped])
    print(json.dumps(stats, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
