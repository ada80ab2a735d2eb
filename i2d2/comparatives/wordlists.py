"""The NeuroComparatives word lists (Tables 5, 8, 9 and the attribute scales) read from conf/wordlists."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from i2d2.config import CONF_DIR
from i2d2.io import DataError

DEFAULT_PATH = CONF_DIR / "wordlists" / "comparatives.yaml"


@dataclass(frozen=True)
class Wordlists:
    aux_verbs: list[str]
    adverbs: list[str]
    comparatives: list[str]
    negatives: dict[str, list[str]]
    scales: dict[str, tuple[list[str], list[str]]] = field(default_factory=dict)
    path: str = ""

    def passes(self) -> list[tuple[str, str]]:
        """Every (auxiliary verb, adverb) combination, aux-major as in Table 6 (30 for the paper's lists)."""
        return [(a, d) for a in self.aux_verbs for d in self.adverbs]


def _word_list(raw: dict, key: str, path: Path) -> list[str]:
    value = raw.get(key)
    if not isinstance(value, list) or not value or not all(isinstance(w, str) and w.strip() for w in value):
        raise DataError(f"{path}: field '{key}' must be a non-empty list of non-empty strings")
    dupes = sorted({w for w in value if value.count(w) > 1})
    if dupes:
        raise DataError(f"{path}: field '{key}' repeats {dupes[:5]}")
    return [str(w) for w in value]


def load_wordlists(path: str | Path | None = None) -> Wordlists:
    path = Path(path) if path else DEFAULT_PATH
    if not path.exists():
        raise FileNotFoundError(f"comparatives word lists not found: {path}")
    raw = yaml.safe_load(path.read_text()) or {}
    negatives = raw.get("negatives")
    if not isinstance(negatives, dict) or not negatives:
        raise DataError(f"{path}: field 'negatives' must map set names to word lists")
    neg = {name: _word_list(negatives, name, path) for name in negatives}
    scales = {}
    for name, value in (raw.get("scales") or {}).items():
        if not (isinstance(value, list) and len(value) == 2 and all(isinstance(v, list) for v in value)):
            raise DataError(f"{path}: scale '{name}' must be [[up phrases], [down phrases]]")
        scales[str(name)] = ([str(w) for w in value[0]], [str(w) for w in value[1]])
    return Wordlists(
        aux_verbs=_word_list(raw, "aux_verbs", path),
        adverbs=_word_list(raw, "adverbs", path),
        comparatives=_word_list(raw, "comparatives", path),
        negatives=neg,
        scales=scales,
        path=str(path),
    )
