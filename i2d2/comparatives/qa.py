"""ComparativeQA export (NeuroComparatives §4, App. E.2).

"Compared to graham crackers, kiwifruits can be considered healthier" becomes
``Question: Which of the following can be considered healthier? A. graham crackers B. kiwifruits Answer: B``.
"""

from __future__ import annotations

import re

import numpy as np

PATTERN = re.compile(r"^\s*compared to (?P<e1>.+?), (?P<e2>.+?) (?P<rel>.+?)\s*[.!]?\s*$", re.IGNORECASE)
PROMPT = re.compile(r"^\s*compared to (?P<e1>.+?), (?P<e2>.+?)\s*$", re.IGNORECASE)  # "Compared to X, Y"


def to_qa(statement: str, entity1: str | None = None, entity2: str | None = None, swap: bool = False,
          prompt: str | None = None) -> dict:
    """One QA item from a comparative statement; ``entity1``/``entity2`` (the prompt's plural entities)
    make the split exact when entity names contain commas; ``prompt`` (the statement's own prompt, from any
    data.template ending with entity2) is the head cut off it. ``swap`` lists the answer as option A."""
    statement = statement.strip()
    if entity1 is not None and entity2 is not None:
        head = f"{prompt.strip()} " if prompt else f"Compared to {entity1}, {entity2} "
        if not statement.lower().startswith(head.lower()):
            raise ValueError(f"statement does not start with {head!r}: {statement!r}")
        rel = statement[len(head):].strip().rstrip(".!").strip()
        e1, e2 = entity1, entity2
    else:
        m = PATTERN.match(statement)
        if not m:
            raise ValueError(f"not a 'Compared to X, Y ...' comparative: {statement!r}")
        e1, e2, rel = m.group("e1"), m.group("e2"), m.group("rel")
    if not rel:
        raise ValueError(f"comparative without a relation: {statement!r}")
    question = f"Which of the following {rel}?"
    options = {"A": e2, "B": e1} if swap else {"A": e1, "B": e2}
    answer = "A" if swap else "B"
    text = f"Question: {question} A. {options['A']} B. {options['B']} Answer: {answer}"
    return {"question": question, "options": options, "answer": answer, "text": text, "comparative": statement}


def balanced_swaps(n: int, balance: bool, seed: int) -> np.ndarray:
    """Which of ``n`` items list their answer as option A: a seeded random ``n // 2`` of them with ``balance`` (an LM
    that always picks one letter then scores 50 %), none without."""
    swaps = np.zeros(n, dtype=bool)
    if balance:
        swaps[np.random.default_rng(seed).permutation(n)[: n // 2]] = True
    return swaps


def export_qa(rows: list[dict], balance: bool = True, seed: int = 0, statement_key: str = "statement") -> list[dict]:
    """QA items for ``rows`` (each with a statement and optionally plural1/plural2).

    ``balance`` swaps the options of a seeded random half (exactly ``n // 2`` items) so the answer is A
    as often as B, give or take one; an LM that always picks one letter then scores 50%.
    """
    out = []
    for r, s in zip(rows, balanced_swaps(len(rows), balance, seed)):
        item = to_qa(r[statement_key], r.get("plural1"), r.get("plural2"), bool(s), r.get("prompt"))
        item.update({k: r[k] for k in ("pair_id", "critic_score", "score") if k in r})
        out.append(item)
    return out


def benchmark_qa(rows: list[dict], balance: bool = True, seed: int = 0) -> list[dict]:
    """ComparativeQA as the paper built its benchmark (§4.1): one item per comparative a person judged true (the
    ``y == 1`` rows of ``critics.data.load_annotations``), its two entities read from the row's prompt ("Compared
    to X, Y"), so a multi-word entity is split exactly. A true row without such a prompt, or whose statement does not
    start with it, is a DataError naming its file:line (``source``)."""
    from i2d2.io import DataError

    true_rows = [r for r in rows if r.get("y") == 1]
    out = []
    for r, swap in zip(true_rows, balanced_swaps(len(true_rows), balance, seed)):
        m = PROMPT.match(r.get("prompt") or "")
        try:
            if not m:
                raise ValueError(f"a ComparativeQA benchmark item needs its prompt 'Compared to X, Y' (field "
                                 f"'prompt'), got {r.get('prompt')!r}")
            out.append(to_qa(r["statement"], m.group("e1"), m.group("e2"), bool(swap), r["prompt"]))
        except ValueError as e:
            raise DataError(f"{r.get('source', '?')}: {e}") from None
    return out
