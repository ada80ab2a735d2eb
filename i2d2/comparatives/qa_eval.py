"""ComparativeQA evaluation (NeuroComparatives §4.3): score an LM on the exported QA.

Each item ``Question: Which of the following <relation>? A. <x> B. <y> Answer: <letter>`` is scored by
the LM's log-likelihood of each option after ``... Answer:`` (the items' own answers cut off), the option
being its text (``target: text``, " graham crackers") or its letter (``target: letter``, " A"); the
highest-scoring option is the prediction. ``length_norm`` divides the log-likelihood by the option's
tokens (``token``) or characters (``char``, lm-evaluation-harness's acc_norm), or not at all (``none``).
``shots`` puts that many other solved items in front (the paper reports 5-shot), never ones that share
an entity with the item.

The answer-option balance is checked first: with a skewed answer key a model that always says "B" looks
good. ``python -m i2d2.comparatives.qa_eval --qa comparative_qa.jsonl --model packaged:gemma3-270m``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from i2d2.io import DataError, read_jsonl, write_text
from i2d2.schemas import is_count

log = logging.getLogger(__name__)

LETTERS = ("A", "B")
NORMS = ("none", "token", "char")
TARGETS = ("text", "letter")


@dataclass(frozen=True)
class QAEvalConfig:
    target: str = "text"            # text | letter: what is scored after "Answer:"
    length_norm: str = "char"       # none | token | char
    shots: int = 0                  # solved items in front of each question
    max_share: float = 0.6          # answer key unbalanced if one letter has more than this share (beyond +-1)
    on_unbalanced: str = "error"    # error | warn
    batch_size: int = 16
    seed: int = 0

    def __post_init__(self):
        if self.target not in TARGETS:
            raise ValueError(f"qa eval: target must be one of {TARGETS}, got {self.target!r}")
        if self.length_norm not in NORMS:
            raise ValueError(f"qa eval: length_norm must be one of {NORMS}, got {self.length_norm!r}")
        if self.on_unbalanced not in ("error", "warn"):
            raise ValueError(f"qa eval: on_unbalanced must be 'error' or 'warn', got {self.on_unbalanced!r}")
        if not 0.5 <= self.max_share <= 1.0 or self.shots < 0:
            raise ValueError(f"qa eval: max_share must be in [0.5, 1] and shots >= 0, got {self}")
        if not is_count(self.batch_size):
            raise ValueError(f"qa eval: batch_size must be an integer >= 1, got {self.batch_size!r}")


class UnbalancedAnswersError(DataError):
    """The answer key favours one option letter; accuracy would reward a constant guess."""


def validate_items(items: list[dict], where: str = "ComparativeQA") -> None:
    for i, q in enumerate(items):
        opts = q.get("options")
        if not isinstance(q.get("question"), str) or not isinstance(opts, dict) or set(opts) != set(LETTERS) \
                or q.get("answer") not in LETTERS:
            raise DataError(f"{where}: item {i} needs 'question', 'options' {{A, B}} and 'answer' A|B, got {q!r}")


def answer_balance(items: list[dict], max_share: float = 0.6) -> dict:
    """How often each letter is the answer; unbalanced when one exceeds ``max_share`` by more than one item."""
    counts = {a: sum(q["answer"] == a for q in items) for a in LETTERS}
    n = len(items)
    gap = abs(counts["A"] - counts["B"])
    return {"n": n, "counts": counts,
            "majority_share": max(counts.values()) / n if n else None,
            "balanced": gap <= max(1.0, (2 * max_share - 1) * n)}


def check_balance(items: list[dict], cfg: QAEvalConfig, where: str = "ComparativeQA") -> dict:
    bal = answer_balance(items, cfg.max_share)
    if not bal["balanced"]:
        msg = (f"{where}: answer key is unbalanced {bal['counts']} (majority share {bal['majority_share']:.2f} > "
               f"{cfg.max_share}); a constant guess would score {bal['majority_share']:.2f}. Re-export with "
               f"task.qa.balance=true, or set on_unbalanced=warn to evaluate anyway")
        if cfg.on_unbalanced == "error":
            raise UnbalancedAnswersError(msg)
        log.warning(msg)
    return bal


def question_block(item: dict) -> str:
    """The item without its answer: 'Question: ... A. x B. y Answer:'."""
    o = item["options"]
    return f"Question: {item['question']} A. {o['A']} B. {o['B']} Answer:"


def _entities(item: dict) -> set[str]:
    return {v.lower() for v in item["options"].values()}


def shot_prefixes(items: list[dict], shots: int, seed: int = 0) -> list[str]:
    """For each item, ``shots`` other solved items (sharing no entity with it), seeded, as a prompt prefix."""
    if shots == 0:
        return [""] * len(items)
    rng = np.random.default_rng(seed)
    out = []
    for i, q in enumerate(items):
        pool = [j for j in range(len(items)) if j != i and not (_entities(items[j]) & _entities(q))]
        if len(pool) < shots:
            raise DataError(f"ComparativeQA: {shots}-shot needs {shots} items sharing no entity with item {i}, "
                            f"only {len(pool)} exist")
        picked = rng.choice(pool, shots, replace=False)
        out.append("".join(f"{question_block(items[j])} {items[j]['answer']}\n\n" for j in picked))
    return out


def option_scores(model, tok, items: list[dict], cfg: QAEvalConfig) -> np.ndarray:
    """(n_items, 2) length-normalised log-likelihoods of options A and B."""
    from i2d2.perplexity import sequence_nll

    contexts = [p + question_block(q) for p, q in zip(shot_prefixes(items, cfg.shots, cfg.seed), items)]
    conts = [f" {a}" if cfg.target == "letter" else f" {q['options'][a]}" for q in items for a in LETTERS]
    prefixes = [c for c in contexts for _ in LETTERS]
    # a bar once it takes a while (the §4.1 benchmark: 534 options, about a minute on CPU)
    nll, ntok = sequence_nll(model, tok, [p + c for p, c in zip(prefixes, conts)], cfg.batch_size, prefixes,
                             progress=len(conts) >= 256, desc="ComparativeQA options")
    ll = -nll
    if cfg.length_norm == "token":
        ll = ll / np.maximum(ntok, 1)
    elif cfg.length_norm == "char":
        ll = ll / np.array([max(len(c.strip()), 1) for c in conts])
    return ll.reshape(len(items), len(LETTERS))


def evaluate_qa(model, tok, items: list[dict], cfg: QAEvalConfig | None = None, where: str = "ComparativeQA"
                ) -> tuple[dict, list[dict]]:
    """Accuracy of ``model`` on ``items``, the answer balance and the constant-guess baselines.

    Returns (metrics, per-item predictions). Metrics that need items are None for an empty set.
    """
    cfg = cfg or QAEvalConfig()
    validate_items(items, where)
    bal = check_balance(items, cfg, where)
    metrics = {"n": len(items), "answer_counts": bal["counts"], "balanced": bal["balanced"],
               "accuracy": None, "majority_baseline": bal["majority_share"], "predicted_A_share": None,
               "accuracy_when_A": None, "accuracy_when_B": None, "config": asdict(cfg)}
    if not items:
        return metrics, []
    scores = option_scores(model, tok, items, cfg)
    pred = np.array(LETTERS)[scores.argmax(1)]
    gold = np.array([q["answer"] for q in items])
    correct = pred == gold
    metrics.update(accuracy=float(correct.mean()), predicted_A_share=float((pred == "A").mean()),
                   **{f"accuracy_when_{a}": float(correct[gold == a].mean()) if (gold == a).any() else None
                      for a in LETTERS})
    rows = [{"question": q["question"], "options": q["options"], "answer": q["answer"], "prediction": p,
             "scores": {a: float(s) for a, s in zip(LETTERS, sc)}} for q, p, sc in zip(items, pred, scores)]
    return metrics, rows


# ----------------------------------------------------------------------------- CLI

def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m i2d2.comparatives.qa_eval", description=__doc__.split("\n\n")[0])
    p.add_argument("--qa", type=Path, required=True, help="comparative_qa.jsonl written by task=comparatives")
    p.add_argument("--model", required=True, help="causal LM: hub id, local dir, packaged:* or tiny:*")
    p.add_argument("--target", choices=TARGETS, default=QAEvalConfig.target)
    p.add_argument("--length-norm", choices=NORMS, default=QAEvalConfig.length_norm)
    p.add_argument("--shots", type=int, default=0)
    p.add_argument("--max-share", type=float, default=QAEvalConfig.max_share)
    p.add_argument("--allow-unbalanced", action="store_true", help="warn instead of refusing a skewed answer key")
    p.add_argument("--batch-size", type=int, default=QAEvalConfig.batch_size)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="write metrics and per-item predictions as JSON")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    from i2d2.models import load_causal_lm

    if not args.qa.is_file():
        print(f"error: --qa {args.qa} does not exist", file=sys.stderr)
        return 2
    try:  # a broken line: the message names file:line, not a traceback
        items = read_jsonl(args.qa)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not items:
        print(f"error: --qa {args.qa} has no items", file=sys.stderr)
        return 2
    cfg = QAEvalConfig(args.target, args.length_norm, args.shots, args.max_share,
                       "warn" if args.allow_unbalanced else "error", args.batch_size, args.seed)
    model, tok = load_causal_lm(args.model)
    model.eval()
    try:
        metrics, rows = evaluate_qa(model, tok, items, cfg, where=str(args.qa))
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps({k: v for k, v in metrics.items() if k != "config"}))
    if args.out:
        write_text(args.out, json.dumps({"metrics": metrics, "predictions": rows}, indent=2))  # atomic: no half file
    return 0


if __name__ == "__main__":
    sys.exit(main())
