"""Annotated statements for the critic: reading, label mapping, vote aggregation, grouped splits.

An annotation file is JSONL or CSV with one statement per row:

    statement  the text that was judged (required)
    label      the annotators' (aggregated) label, e.g. ``true`` / ``false`` / ``don't know`` / ``garbled``
               (I2D2's 4-way scheme) or NeuroComparatives' 6-way labels; may be empty when ``votes`` is given
    concept    the concept (or entity pair) the statement is about (required: the split is grouped by it)
    votes      optional: the individual annotators' labels (JSON list, or ``a|b|c`` in CSV)
    prompt     optional: the prompt the statement was generated from

Raw labels are normalised (lower case, ``(generally) true`` -> ``true``, ``Huh???`` -> ``huh``, spaces ->
``_``) and mapped to 1 (valid), 0 (invalid) or ``None`` (dropped, e.g. "don't know") by ``DEFAULT_LABEL_MAP`` with
``label_map``'s entries over it.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np

from i2d2.io import DataError, iter_jsonl, read_csv
from i2d2.labels import (ALIASES, ANNOTATION_DIR, DEFAULT_LABEL_MAP, HEDGES, aggregate_votes,  # noqa: F401 (re-exported)
                         canonical_statement, label_mapping, normalize_label, normalize_statement, parse_votes,
                         resolve_annotation_path)

log = logging.getLogger(__name__)

# optional fields of a labelled generation, passed through (the surface floor and the prompt-form yield use them)
PROVENANCE = ("kind", "form", "relation", "related", "iteration", "split")

TEXT_FIELDS = ("statement", "label", "concept", "votes", "prompt")


@dataclass
class LoadReport:
    """What loading dropped, with file:line for every problem row."""

    errors: list[str] = field(default_factory=list)     # broken rows / unknown labels (on_error='skip')
    dropped: Counter = field(default_factory=Counter)   # label -> rows mapped to None (e.g. dont_know)
    no_majority: int = 0
    duplicates: int = 0

    def summary(self) -> str:
        parts = [f"{len(self.errors)} bad rows"] if self.errors else []
        if self.dropped:
            parts.append("dropped " + ", ".join(f"{v} {k}" for k, v in sorted(self.dropped.items())))
        if self.no_majority:
            parts.append(f"{self.no_majority} without a majority vote")
        if self.duplicates:
            parts.append(f"{self.duplicates} duplicates (later files win)")
        return "; ".join(parts) or "clean"


def _read_rows(path: Path, on_error: str, errors: list) -> list[tuple[int, dict]]:
    if path.suffix.lower() == ".csv":
        rows = read_csv(path, required=("statement", "concept"))
        return [(r.pop("_line"), r) for r in rows]
    out = []
    for lineno, row, problem in iter_jsonl(path):
        if problem is not None:
            msg = f"{path}:{lineno}: broken row ({problem})"
            if on_error == "raise":
                raise DataError(msg)
            errors.append(msg)
            continue
        out.append((lineno, row))
    return out


def load_annotations(paths: Iterable[str | Path], label_map: Mapping | None = None, on_error: str = "raise",
                     min_agreement: float = 0.5, report: LoadReport | None = None, quiet: bool = False) -> list[dict]:
    """Read annotation files into rows ``{statement, concept, label, y, prompt, votes, source}``.

    ``y`` is 1/0; rows whose label maps to None (e.g. "don't know") or whose votes have no majority are left
    out and counted in ``report``. Unknown labels and broken rows raise ``DataError('file:line: ...')``
    (``on_error='raise'``) or are skipped and listed in ``report.errors`` (``on_error='skip'``).
    Statements repeated across files are de-duplicated; the later file's label wins (newer annotation rounds
    come last). ``quiet``: no summary in the log (a start-up check that reads the files the critic stage reads
    again: the same line was logged once per reading, three times a run).
    """
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', not {on_error!r}")
    mapping = label_mapping(label_map)
    report = report if report is not None else LoadReport()
    by_key: dict[str, dict] = {}
    for p in paths:
        path = resolve_annotation_path(p)
        for lineno, row in _read_rows(path, on_error, report.errors):
            where = f"{path}:{lineno}"
            try:
                for key in ("statement", "concept"):  # {"statement": 123} was read as the statement "123"
                    if row.get(key) is not None and not isinstance(row[key], str):
                        raise ValueError(f"field {key!r} must be text, got {row[key]!r}")
                statement = str(row.get("statement") or "").strip()
                concept = str(row.get("concept") or "").strip()
                if not statement:
                    raise ValueError("missing field 'statement'")
                if not concept:
                    raise ValueError("missing field 'concept'")
                votes = parse_votes(row.get("votes"))
                raw = row.get("label")
                if raw is not None and str(raw).strip() != "":
                    label = normalize_label(raw)
                elif votes:
                    label = aggregate_votes(votes, min_agreement)
                    bad = sorted({normalize_label(v) for v in votes} - set(mapping))
                    if bad:
                        raise ValueError(f"unknown vote label(s) {bad}; known: {sorted(mapping)}")
                    if label is None:
                        report.no_majority += 1
                        continue
                else:
                    raise ValueError("missing field 'label' (and no 'votes')")
                if label not in mapping:
                    raise ValueError(f"unknown label {raw!r} (normalised {label!r}); known labels: "
                                     f"{sorted(mapping)} (extend critic.label_map)")
            except ValueError as e:
                msg = f"{where}: {e}"
                if on_error == "raise":
                    raise DataError(msg) from None
                report.errors.append(msg)
                continue
            y = mapping[label]
            key = normalize_statement(statement)
            if y is None:
                report.dropped[label] += 1
                # the newest annotation wins, a don't-know too: an older file's label of it is not kept
                if by_key.pop(key, None) is not None:
                    report.duplicates += 1
                continue
            if key in by_key:
                report.duplicates += 1
                del by_key[key]  # re-insert so order follows the newest annotation
            by_key[key] = {"statement": statement, "concept": concept, "label": label, "y": int(y),
                           "prompt": row.get("prompt") or "", "votes": votes, "source": where,
                           **{k: row.get(k) for k in PROVENANCE if row.get(k) is not None}}
    rows = list(by_key.values())
    if quiet:
        return rows
    if report.errors:
        log.warning("annotations: skipped %d bad rows, first: %s", len(report.errors), report.errors[0])
    log.info("annotations: %d rows (%d valid) from %s; %s", len(rows), sum(r["y"] for r in rows),
             ", ".join(str(p) for p in paths), report.summary())
    return rows


def grouped_split3(concepts: Sequence[str], labels: Sequence[int], dev_fraction: float = 0.15,
                   test_fraction: float = 0.2, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Train / dev / test indices with every concept on one side only.

    Test is split off first (``test_fraction`` of the concepts), then dev from the rest, each with
    ``grouped_split``; dev chooses the checkpoint and δ, test gives every reported number.
    """
    concepts = list(concepts)
    y = np.asarray(labels)
    rest, test = grouped_split(concepts, y, test_fraction, seed)
    tr, dev = grouped_split([concepts[i] for i in rest], y[rest], dev_fraction / max(1e-9, 1.0 - test_fraction), seed + 1)
    return rest[tr], rest[dev], test


PAIR_SEPARATOR = "|"  # an entity pair's concept, "X | Y" (NeuroComparatives' pair_id)


def concept_key(concept: str) -> str:
    """A concept however it is spelled ("Dog", " dog"): what the splits group by, and what a lookup of a concept in
    a split's concepts (split.json) must compare."""
    return normalize_statement(concept)


def split_groups(concepts: Sequence[str]) -> list[str]:
    """The group each concept is split by: the concept however it is spelled ("Dog" and "dog" are one), and every
    entity pair ("X | Y", NeuroComparatives' pair_id) joined with each pair or concept that shares an entity with it
    (connected components): "tulip | daffodil", "daffodil | tulip" (both made under ``data.both_orders``) and
    "daffodil | rose" are one group, so no test statement is about an entity the critic was trained on. A group takes
    the key of its first-seen concept: a set whose concepts share no entity keeps the keys, and so the splits, it had."""
    keys = [concept_key(c) for c in concepts]
    parts = [[p.strip() for p in k.split(PAIR_SEPARATOR)] if k.count(PAIR_SEPARATOR) == 1 else [k] for k in keys]
    parent: dict = {}

    def root(e):
        while parent.setdefault(e, e) != e:
            parent[e] = parent[parent[e]]  # path halving
            e = parent[e]
        return e

    for ps in parts:
        for e in ps[1:]:
            parent[root(e)] = root(ps[0])
    first: dict = {}
    return [first.setdefault(root(ps[0]), k) for ps, k in zip(parts, keys)]


def grouped_split(concepts: Sequence[str], labels: Sequence[int], val_fraction: float = 0.2, seed: int = 0,
                  max_tries: int = 50) -> tuple[np.ndarray, np.ndarray]:
    """Train/validation indices with no concept (``split_groups``) on both sides (sklearn ``GroupShuffleSplit``).

    Tries successive splits until both sides hold valid and invalid examples (needed for AP / P@R).
    """
    from sklearn.model_selection import GroupShuffleSplit

    concepts = np.asarray(split_groups(concepts))
    y = np.asarray(labels)
    n_groups = len(set(concepts))
    if n_groups < 2:
        raise ValueError(f"need at least 2 concept groups for a grouped split, got {n_groups} (entity pairs that "
                         "share an entity, directly or through other pairs, are one group: label pairs from more "
                         "than one connected set of entities)")
    gss = GroupShuffleSplit(n_splits=max_tries, test_size=val_fraction, random_state=seed)
    first = None
    for tr, va in gss.split(np.zeros(len(y)), y, groups=concepts):
        first = first or (tr, va)
        if len(set(y[tr])) == 2 and len(set(y[va])) == 2:
            return tr, va
    log.warning("no grouped split with both classes on both sides in %d tries; using the first", max_tries)
    return first


class StatementDataset:
    """Map-style dataset of ``(statement, y)`` for the critic's DataLoader."""

    def __init__(self, texts: Sequence[str], labels: Sequence[int] | None = None):
        self.texts = list(texts)
        self.labels = None if labels is None else list(labels)

    def __len__(self):
        return len(self.texts)

    def __getitem__(self, i):
        return self.texts[i], (-1 if self.labels is None else self.labels[i])


class Collator:
    def __init__(self, tokenizer, max_length: int = 64):
        self.tok, self.max_length = tokenizer, max_length

    def __call__(self, batch):
        import torch

        texts, labels = zip(*batch)
        enc = self.tok(list(texts), padding=True, truncation=True, max_length=self.max_length, return_tensors="pt")
        enc = {k: v for k, v in enc.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
        enc["labels"] = torch.tensor(labels, dtype=torch.long)
        return enc
