"""The CMP data model: a quintuple (e1, e2, property, v1, v2) with the two entity documents.

JSONL, one quintuple per line::

    {"id": "country-0003", "e1": "France", "e2": "Spain", "property": "currency",
     "v1": "euro", "v2": "euro", "doc1": "France is ...", "doc2": "Spain is ...",
     "category": "country", "split": "train"}

``id``, ``category``, ``split`` and ``source`` are optional; ``split`` is used only with
``data.split_by=field`` (by default splits are drawn by entity, see ``split_quintuples``). Every row
is validated; all problems are reported together, each as ``file:line: message``.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from i2d2.io import DataError, open_text, write_jsonl

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
        """The unordered entity pair."""
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
    with open_text(path) as f:
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


def facts_of(q: Quintuple) -> tuple[tuple[str, str, str], tuple[str, str, str]]:
    """The two (entity, property, value) facts a quintuple states."""
    return (_canon(q.e1), _canon(q.property), _canon(q.v1)), (_canon(q.e2), _canon(q.property), _canon(q.v2))


def _parts(q: Quintuple) -> dict[str, set]:
    return {"entity": {_canon(q.e1), _canon(q.e2)}, "document": {_canon(q.doc1), _canon(q.doc2)},
            "fact": set(facts_of(q))}


def split_leaks(splits: dict[str, list[Quintuple]]) -> dict[str, dict[str, list[str]]]:
    """Entities, documents and facts that a held-out split shares with ``train``, per held-out split
    (empty lists = no leak)."""
    seen = {"entity": set(), "document": set(), "fact": set()}
    for q in splits.get("train", []):
        for kind, items in _parts(q).items():
            seen[kind] |= items
    out = {}
    for s in ("validation", "test"):
        shared = {kind: set() for kind in seen}
        for q in splits.get(s, []):
            for kind, items in _parts(q).items():
                shared[kind] |= items & seen[kind]
        out[s] = {kind: sorted(map(str, v)) for kind, v in shared.items()}
    return out


def _entity_splits(quintuples: list[Quintuple], val_fraction: float, test_fraction: float,
                   seed: int) -> dict[str, str]:
    """Entity -> split. Within each category the entities are shuffled and the given shares of them
    held out, so every category has unseen entities."""
    import random

    by_cat: dict[str, list[str]] = {}
    first_cat: dict[str, str] = {}
    for q in quintuples:
        for e in (_canon(q.e1), _canon(q.e2)):
            if e not in first_cat:
                first_cat[e] = q.category or ""
                by_cat.setdefault(first_cat[e], []).append(e)
    rng = random.Random(seed)
    where = {}
    for cat in sorted(by_cat):
        ents = sorted(by_cat[cat])
        rng.shuffle(ents)
        n_val, n_test = round(len(ents) * val_fraction), round(len(ents) * test_fraction)
        for i, e in enumerate(ents):
            where[e] = "validation" if i < n_val else "test" if i < n_val + n_test else "train"
    return where


def split_quintuples(quintuples: list[Quintuple], val_fraction: float = 0.2, test_fraction: float = 0.2,
                     seed: int = 0, by: str = "entity") -> dict[str, list[Quintuple]]:
    """Train / validation / test lists, plus ``dropped``: quintuples that no split can hold.

    ``by='entity'`` (default; rows' ``split`` fields are ignored): ``val_fraction`` / ``test_fraction``
    of each category's entities are held out; a quintuple belongs to a split when both its entities do.
    Quintuples pairing a training entity with a held-out one are dropped, and so is any held-out
    quintuple whose document text or (entity, property, value) fact also occurs in training (a
    corpus with aliases or shared documents). Held-out entities, documents and facts are thus
    unseen in training: zero-shot results measure unseen entities.

    ``by='field'``: every row's own ``split`` field (a released split); nothing is dropped, and
    ``split_leaks`` tells what it shares with training.
    """
    if by == "field":
        missing = [q.id for q in quintuples if q.split is None]
        if missing:
            raise ValueError(f"data.split_by=field but {len(missing)} quintuple(s) have no 'split' field "
                             f"(first: {missing[0]!r}); use data.split_by=entity")
        return {s: [q for q in quintuples if q.split == s] for s in SPLITS} | {"dropped": []}
    if by != "entity":
        raise ValueError(f"data.split_by must be 'entity' or 'field', got {by!r}")
    for name, f in (("data.val_fraction", val_fraction), ("data.test_fraction", test_fraction)):
        if not 0 <= f < 1:
            raise ValueError(f"{name} must be in [0, 1), got {f}")
    if val_fraction + test_fraction >= 1:
        raise ValueError(f"data.val_fraction + data.test_fraction must be < 1, got {val_fraction + test_fraction}")
    where = _entity_splits(quintuples, val_fraction, test_fraction, seed)
    splits: dict[str, list[Quintuple]] = {s: [] for s in (*SPLITS, "dropped")}
    for q in quintuples:
        s1, s2 = where[_canon(q.e1)], where[_canon(q.e2)]
        splits[s1 if s1 == s2 else "dropped"].append(q)
    train_parts = {"document": set(), "fact": set()}
    for q in splits["train"]:
        train_parts["document"] |= _parts(q)["document"]
        train_parts["fact"] |= _parts(q)["fact"]
    for s in ("validation", "test"):
        keep = []
        for q in splits[s]:
            parts = _parts(q)
            leaks = parts["document"] & train_parts["document"] or parts["fact"] & train_parts["fact"]
            (splits["dropped"] if leaks else keep).append(q)
        splits[s] = keep
    return splits
