"""Annotated statements for the critic: reading, label mapping, vote aggregation, grouped splits.

An annotation file is JSONL or CSV with one statement per row:

    statement  the text that was judged (required)
    label      the annotators' (aggregated) label, e.g. ``true`` / ``false`` / ``don't know`` / ``garbled``
               (I2D2's 4-way scheme) or NeuroComparatives' 6-way labels; may be empty when ``votes`` is given
    concept    the concept (or entity pair) the statement is about (required: the split is grouped by it)
    votes      optional: the individual annotators' labels (JSON list, or ``a|b|c`` in CSV)
    prompt     optional: the prompt the statement was generated from

Raw labels are normalised (lower case, ``(generally) true`` -> ``true``, ``Huh???`` -> ``huh``, spaces ->
``_``) and mapped to 1 (valid), 0 (invalid) or ``None`` (dropped, e.g. "don't know") by ``label_map``.
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np

from i2d2.io import DataError, iter_jsonl, read_csv

log = logging.getLogger(__name__)

# optional fields of a labelled generation, passed through (the surface floor and the prompt-form yield use them)
PROVENANCE = ("kind", "form", "relation", "related", "iteration", "split")

ANNOTATION_DIR = Path(__file__).resolve().parent.parent / "i2d2" / "data" / "annotations"

# Both papers' schemes plus plain binary labels. 1 = valid, 0 = invalid, None = dropped from training.
DEFAULT_LABEL_MAP: dict[str, int | None] = {
    # I2D2 (4-way): (generally) true / (generally) false / don't know / garbled ("Huh???")
    "true": 1, "false": 0, "dont_know": None, "garbled": 0, "huh": 0,
    # the finer kinds of "Huh???" in i2d2/data/annotations/GUIDE.md
    "episodic": 0, "ad_copy": 0,
    # NeuroComparatives (6-way): 'Too unfamiliar to judge' is discarded, everything but 'True' is invalid
    "too_subjective_to_judge": 0, "too_vague_to_judge": 0, "too_unfamiliar_to_judge": None, "invalid": 0,
    # binary / crowd-platform spellings
    "valid": 1, "accept": 1, "reject": 0, "1": 1, "0": 0,
}
# Spellings that mean the same label (applied after normalisation).
ALIASES = {
    "generally_true": "true", "generally_false": "false", "i_dont_know": "dont_know", "don_t_know": "dont_know",
    "unknown": "dont_know", "garbled_output": "garbled", "subjective": "too_subjective_to_judge",
    "vague": "too_vague_to_judge", "unfamiliar": "too_unfamiliar_to_judge", "too_vague": "too_vague_to_judge",
    "too_subjective": "too_subjective_to_judge", "too_unfamiliar": "too_unfamiliar_to_judge",
}

TEXT_FIELDS = ("statement", "label", "concept", "votes", "prompt")


def normalize_label(raw) -> str:
    """``'(Generally) True'`` -> ``'true'``, ``"Don't Know"`` -> ``'dont_know'``, ``'Huh???'`` -> ``'huh'``."""
    s = str(raw).strip().lower()
    s = s.replace("'", "").replace("’", "")
    s = re.sub(r"[^a-z0-9]+", "_", s).strip("_")
    s = ALIASES.get(s, s)
    if s.startswith("generally_"):
        s = ALIASES.get(s, s[len("generally_"):])
    return s


HEDGES = ("generally", "typically", "usually", "in general", "normally", "often")
_HEDGE = re.compile(r"^\s*(?:" + "|".join(HEDGES) + r")\s*,\s*", re.IGNORECASE)


def canonical_statement(text: str) -> str:
    """The statement without a leading hedge adverb ("Generally, birds can fly." -> "Birds can fly."): the guide
    judges both alike, so the critic sees neither (``critic.canonicalize``) and cannot learn the adverb as a cue."""
    text = str(text)
    stripped = _HEDGE.sub("", text, count=1)
    return stripped[:1].upper() + stripped[1:] if stripped != text else text


def normalize_statement(text: str) -> str:
    """Key used to de-duplicate statements across annotation rounds."""
    return re.sub(r"\s+", " ", str(text).strip().lower()).rstrip(" .")


def label_mapping(label_map: Mapping | None) -> dict[str, int | None]:
    """Normalise a config's label map (keys through ``normalize_label``; values 1/0/None or true/false/null)."""
    out = {}
    for k, v in (label_map if label_map is not None else DEFAULT_LABEL_MAP).items():
        if v is not None and not isinstance(v, (bool, int)) and str(v).lower() not in ("0", "1", "true", "false"):
            raise ValueError(f"label_map[{k!r}] = {v!r}: values must be 1 (valid), 0 (invalid) or null (drop)")
        out[normalize_label(k)] = None if v is None else int(v if isinstance(v, (bool, int)) else str(v).lower() in ("1", "true"))
    return out


def aggregate_votes(votes: Sequence[str], min_agreement: float = 0.5) -> str | None:
    """Majority label of annotators' votes (normalised), or None if no label gets > ``min_agreement`` of them."""
    norm = [normalize_label(v) for v in votes if str(v).strip()]
    if not norm:
        return None
    (top, n), *rest = Counter(norm).most_common()
    if n / len(norm) <= min_agreement or (rest and rest[0][1] == n):
        return None
    return top


def parse_votes(value) -> list[str]:
    if value is None or value == "":
        return []
    if isinstance(value, list):
        return [str(v) for v in value]
    s = str(value).strip()
    if s.startswith("["):
        v = json.loads(s)
        if not isinstance(v, list):
            raise ValueError("votes must be a list")
        return [str(x) for x in v]
    return [p.strip() for p in re.split(r"[|;]", s) if p.strip()]


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


def resolve_annotation_path(p: str | Path) -> Path:
    """An existing path, or the name of a bundled file under ``i2d2/data/annotations/``."""
    path = Path(p).expanduser()
    if path.exists():
        return path
    bundled = ANNOTATION_DIR / str(p)
    if bundled.exists():
        return bundled
    raise FileNotFoundError(f"annotation file {p!r} not found (neither a path nor a bundled file in {ANNOTATION_DIR})")


def load_annotations(paths: Iterable[str | Path], label_map: Mapping | None = None, on_error: str = "raise",
                     min_agreement: float = 0.5, report: LoadReport | None = None) -> list[dict]:
    """Read annotation files into rows ``{statement, concept, label, y, prompt, votes, source}``.

    ``y`` is 1/0; rows whose label maps to None (e.g. "don't know") or whose votes have no majority are left
    out and counted in ``report``. Unknown labels and broken rows raise ``DataError('file:line: ...')``
    (``on_error='raise'``) or are skipped and listed in ``report.errors`` (``on_error='skip'``).
    Statements repeated across files are de-duplicated; the later file's label wins (newer annotation rounds
    come last).
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
            if y is None:
                report.dropped[label] += 1
                continue
            key = normalize_statement(statement)
            if key in by_key:
                report.duplicates += 1
                del by_key[key]  # re-insert so order follows the newest annotation
            by_key[key] = {"statement": statement, "concept": concept, "label": label, "y": int(y),
                           "prompt": row.get("prompt") or "", "votes": votes, "source": where,
                           **{k: row.get(k) for k in PROVENANCE if row.get(k) is not None}}
    rows = list(by_key.values())
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


def grouped_split(concepts: Sequence[str], labels: Sequence[int], val_fraction: float = 0.2, seed: int = 0,
                  max_tries: int = 50) -> tuple[np.ndarray, np.ndarray]:
    """Train/validation indices with no concept on both sides (sklearn ``GroupShuffleSplit``).

    Tries successive splits until both sides hold valid and invalid examples (needed for AP / P@R).
    """
    from sklearn.model_selection import GroupShuffleSplit

    concepts = np.asarray([normalize_statement(c) for c in concepts])
    y = np.asarray(labels)
    n_groups = len(set(concepts))
    if n_groups < 2:
        raise ValueError(f"need at least 2 concepts for a grouped split, got {n_groups}")
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
