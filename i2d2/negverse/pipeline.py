"""Negate sentences: syntactic masks -> n prompt-tuned candidates per mask (batched, left-padded) -> filters."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from i2d2.negverse.filters import apply_filters
from i2d2.negverse.formatting import build_prompt, parse_answers
from i2d2.negverse.masking import RULES, fill_blanks, mask_variants
from i2d2.progress import progress as progress_log
from i2d2.schemas import NegationOptions, defaults, fill

# Every option and its default: i2d2.schemas.NegationOptions (the recipe's generate / masking / filters sections);
# an adapter trained by the recipe carries its own values (negverse.json 'task'), which ``saved_options`` reads.
KNOWN_OPTIONS = frozenset(defaults(NegationOptions))
log = logging.getLogger(__name__)


def saved_options(adapter_dir: str | Path) -> dict:
    """The negation options an adapter was trained with (its task config in negverse.json); {} if none."""
    meta_path = Path(adapter_dir) / "negverse.json"
    if not meta_path.is_file():
        raise FileNotFoundError(f"{adapter_dir} is not a NegVerse adapter (no negverse.json); "
                                f"train one with `python -m i2d2.train task=negverse`")
    task = json.loads(meta_path.read_text()).get("task") or {}
    opts = {**(task.get("generate") or {}), **(task.get("masking") or {}), **(task.get("filters") or {})}
    return {k: v for k, v in opts.items() if k in KNOWN_OPTIONS}


def candidates(lm, nlp, sentences: list[str], num_candidates: int = 4, batch_size: int = 8,
               max_new_tokens: int = 32, do_sample: bool = True, top_p: float = 0.9, temperature: float = 0.8,
               rules=RULES, max_blanks: int = 2, max_variants: int = 6, seed: int = 0,
               progress: bool = True, min_two_blank: int = 1) -> list[dict]:
    """Every generated candidate (before filtering) with its mask, raw continuation and filled sentence."""
    import torch

    jobs = []
    for doc in nlp.pipe(sentences):
        for m in mask_variants(doc, rules=rules, max_blanks=max_blanks, max_variants=max_variants, seed=seed,
                               min_two_blank=min_two_blank):
            jobs.append({"original": doc.text.strip(), "masked": m.text, "rules": m.rules,
                         "n_blanks": len(m.spans), "prompt": build_prompt(doc.text, m.text)})
    # similar lengths in a batch waste less compute on padding
    order = sorted(range(len(jobs)), key=lambda i: len(jobs[i]["prompt"]))
    torch.manual_seed(seed)
    rows: list[dict | None] = [None] * len(jobs)
    for start in progress_log(range(0, len(order), batch_size), desc="negate", disable=not progress, leave=False,
                              logger=log):
        idx = order[start:start + batch_size]
        outs = lm.generate([jobs[i]["prompt"] for i in idx], n_blanks=[jobs[i]["n_blanks"] for i in idx],
                           num_return_sequences=num_candidates, max_new_tokens=max_new_tokens,
                           do_sample=do_sample, top_p=top_p, temperature=temperature)
        for i, cands in zip(idx, outs):
            rows[i] = [{**{k: v for k, v in jobs[i].items() if k != "prompt"}, "raw": raw} for raw in cands]
    flat = []
    for group in rows:
        for r in group or []:
            answers = parse_answers(r["raw"], r["n_blanks"])
            r["answers"] = answers
            r["negation"] = fill_blanks(r["masked"], answers) if answers is not None else None
            flat.append(r)
    return flat


def negate(lm, nlp, detector, sentences: list[str], **cfg) -> tuple[list[dict], list[dict], dict]:
    """Generate and filter; returns (kept, dropped, stats)."""
    # each sentence once: a repeat was generated for again, its outputs dropped as 'duplicate', and it counted twice
    # in sentences_with_negation's denominator but once in its numerator (keep rate and that share read low)
    given = sum(bool(s.strip()) for s in sentences)
    sentences = list(dict.fromkeys(s.strip() for s in sentences if s.strip()))
    if not sentences:
        raise ValueError("negate: no sentences to negate")
    progress = cfg.pop("progress", True)
    c = {**fill(NegationOptions, cfg, where="negation options"), "progress": progress}
    t0 = time.time()
    rows = candidates(lm, nlp, sentences, num_candidates=c["num_candidates"], batch_size=c["batch_size"],
                      max_new_tokens=c["max_new_tokens"], do_sample=c["do_sample"], top_p=c["top_p"],
                      temperature=c["temperature"], rules=c["rules"], max_blanks=c["max_blanks"],
                      max_variants=c["max_variants"], seed=c["seed"], progress=c.get("progress", True),
                      min_two_blank=c["min_two_blank"])
    gen_s = time.time() - t0
    kept, dropped, counts = apply_filters(rows, detector, max_distance=c["max_distance"],
                                          max_len_ratio=c["max_len_ratio"], require_cue=c["require_cue"],
                                          grammar=c["grammar"], nlp=nlp)
    stats = {"n_sentences": len(sentences), "n_candidates": len(rows), "n_kept": len(kept),
             "keep_rate": len(kept) / len(rows) if rows else None, "generation_s": gen_s,
             "n_two_blank_candidates": sum(r["n_blanks"] == 2 for r in rows),
             "n_repeated_sentences": given - len(sentences),
             "n_sentences_with_negation": len({r["original"] for r in kept}),  # the share's count, beside it
             "sentences_with_negation": len({r["original"] for r in kept}) / len(sentences),
             **{f"dropped_{k}": v for k, v in counts.items()}}
    return kept, dropped, stats
