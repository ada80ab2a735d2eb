"""The CMP data model: a quintuple (e1, e2, property, v1, v2) with the two entity documents.

JSONL, one quintuple per line::

    {"id": "country-0003", "e1": "France", "e2": "Spain", "property": "currency",
     "v1": "euro", "v2": "euro", "doc1": "France is ...", "doc2": "Spain is ...",
     "category": "country", "split": "train"}

``id``, ``category``, ``split`` and ``source`` are optional. Every row is validated; all problems
are reported together, each as ``file:line: message``.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from i2d2.io import DataError, write_jsonl

REQUIRED = ("e1", "e2", "property", "v1", "v2", "doc1", "doc2")
OPTIONAL = ("id", "category", "split", "source")
SPLITS = ("train", "validation", "test")
BUNDLED = Path(__file__).resolve().parent.parent / "data" / "cmp"


@dataclass(frozen=True)
class Quintuple:
    e1: str
    e2: str
    property: str
    v1: str
    v2: str
    doc1: str
    doc2: str
    id: str = ""
    category: str | None = None
    split: str | None = None
    source: str | None = None

    @property
    def same(self) -> bool:
        """Whether the two values agree (case- and whitespace-insensitive)."""
        return _canon(self.v1) == _canon(self.v2)

    @property
    def pair(self) -> tuple[str, str]:
        """The unordered entity pair (used to keep held-out pairs out of training)."""
        return tuple(sorted((self.e1, self.e2)))

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v not in (None, "")}


def _canon(v: str) -> str:
    return " ".join(str(v).lower().split())


def validate_row(row, check_links: bool = True) -> list[str]:
    """Problems with one parsed row (empty list = valid)."""
    if not isinstance(row, dict):
        return ["expected a JSON object"]
    errs = []
    for k in REQUIRED:
        if k not in row or row[k] is None:
            errs.append(f"missing field '{k}'")
        elif isinstance(row[k], bool) or not isinstance(row[k], (str, int, float)):
            errs.append(f"field '{k}' must be a string, got {type(row[k]).__name__}")
        elif not str(row[k]).strip():
            errs.append(f"field '{k}' is empty")
    for k in OPTIONAL:
        if k in row and row[k] is not None and not isinstance(row[k], str):
            errs.append(f"field '{k}' must be a string, got {type(row[k]).__name__}")
    unknown = sorted(set(row) - set(REQUIRED) - set(OPTIONAL))
    if unknown:
        errs.append(f"unknown field(s) {', '.join(unknown)}")
    if errs:
        return errs
    if _canon(row["e1"]) == _canon(row["e2"]):
        errs.append(f"e1 and e2 are the same entity {row['e1']!r}")
    if row.get("split") is not None and row["split"] not in SPLITS:
        errs.append(f"field 'split' must be one of {', '.join(SPLITS)}, got {row['split']!r}")
    if check_links:
        # §3.2.3: a document is usable only if it holds a sentence stating the entity's value.
        for doc, v in (("doc1", "v1"), ("doc2", "v2")):
            if _canon(row[v]) not in _canon(row[doc]):
                errs.append(f"field '{doc}' never mentions {v} {str(row[v])!r}")
    return errs


def load_quintuples(path: str | os.PathLike | None = None, check_links: bool = True,
                    on_error: str = "raise", errors: list | None = None) -> list[Quintuple]:
    """Read and validate a quintuple JSONL file (``None`` = the bundled corpus).

    With ``on_error='raise'`` every bad row is listed in one DataError (``file:line: problem``);
    with ``'skip'`` bad rows are dropped and their messages appended to ``errors``.
    """
    path = Path(path) if path is not None else BUNDLED / "corpus.jsonl"
    if not path.exists():
        raise DataError(f"{path}: quintuple file not found")
    out, problems, seen = [], [], {}
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                problems.append(f"{path}:{lineno}: invalid JSON ({e.msg} at column {e.colno})")
                continue
            errs = validate_row(row, check_links)
            rid = row.get("id") if isinstance(row, dict) else None
            if not errs and rid:
                if rid in seen:
                    errs.append(f"duplicate id {rid!r} (first on line {seen[rid]})")
                seen.setdefault(rid, lineno)
            if errs:
                problems += [f"{path}:{lineno}: {e}" for e in errs]
                continue
            vals = {k: str(row[k]).strip() for k in REQUIRED}
            opt = {k: row.get(k) for k in OPTIONAL}
            opt["id"] = opt["id"] or f"{path.stem}-{lineno}"
            out.append(Quintuple(**vals, **opt))
    if problems:
        if on_error == "raise":
            shown = problems[:50]
            more = f"\n... and {len(problems) - 50} more" if len(problems) > 50 else ""
            raise DataError(f"{len(problems)} problem(s) in {path}:\n" + "\n".join(shown) + more)
        if errors is not None:
            errors.extend(problems)
    return out


def write_quintuples(path: str | os.PathLike, quintuples: list[Quintuple]) -> Path:
    return write_jsonl(path, [q.to_dict() for q in quintuples])


def split_quintuples(quintuples: list[Quintuple], val_fraction: float = 0.1, test_fraction: float = 0.1,
                     seed: int = 0) -> dict[str, list[Quintuple]]:
    """Train/validation/test lists. Rows with a ``split`` field keep it; the others are split by
    unordered entity pair so that no held-out pair is seen in training."""
    import random

    splits = {s: [] for s in SPLITS}
    free = [q for q in quintuples if q.split is None]
    for q in quintuples:
        if q.split is not None:
            splits[q.split].append(q)
    pairs = sorted({q.pair for q in free})
    random.Random(seed).shuffle(pairs)
    n_val, n_test = round(len(pairs) * val_fraction), round(len(pairs) * test_fraction)
    where = {p: ("validation" if i < n_val else "test" if i < n_val + n_test else "train") for i, p in enumerate(pairs)}
    for q in free:
        splits[where[q.pair]].append(q)
    return splits
