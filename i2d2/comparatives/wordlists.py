"""The NeuroComparatives word lists (Tables 5, 8, 9 and the attribute scales) read from conf/wordlists."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from i2d2.config import CONF_DIR
from i2d2.io import DataError, read_text

DEFAULT_PATH = CONF_DIR / "wordlists" / "comparatives.yaml"


@dataclass(frozen=True)
class Wordlists:
    aux_verbs: list[str]
    adverbs: list[str]
    comparatives: list[str]
    negatives: dict[str, list[str]]
    scales: dict[str, tuple[list[str], list[str]]] = field(default_factory=dict)
    aux_singular: dict[str, str] = field(default_factory=dict)
    path: str = ""

    def passes(self) -> list[tuple[str, str]]:
        """Every (auxiliary verb, adverb) combination, aux-major as in Table 6 (30 for the paper's lists)."""
        return [(a, d) for a in self.aux_verbs for d in self.adverbs]

    def agree(self, aux: str, countable: bool) -> str:
        """The aux verb for a plural (countable) or singular (mass-noun) subject: 'are' -> 'is'."""
        return aux if countable else self.aux_singular.get(aux, aux)


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
    raw = yaml.safe_load(read_text(path)) or {}
    negatives = raw.get("negatives")
    if not isinstance(negatives, dict) or not negatives:
        raise DataError(f"{path}: field 'negatives' must map set names to word lists")
    neg = {name: _word_list(negatives, name, path) for name in negatives}
    scales = {}
    for name, value in (raw.get("scales") or {}).items():
        if not (isinstance(value, list) and len(value) == 2 and all(isinstance(v, list) for v in value)):
            raise DataError(f"{path}: scale '{name}' must be [[up phrases], [down phrases]]")
        scales[str(name)] = ([str(w) for w in value[0]], [str(w) for w in value[1]])
    aux_singular = raw.get("aux_singular") or {}
    if not isinstance(aux_singular, dict) or not all(isinstance(v, str) and v.strip() for v in aux_singular.values()):
        raise DataError(f"{path}: field 'aux_singular' must map aux verbs to their singular form")
    aux_verbs = _word_list(raw, "aux_verbs", path)
    unknown = sorted(set(aux_singular) - set(aux_verbs))
    if unknown:
        raise DataError(f"{path}: field 'aux_singular' names {unknown}, which are not in 'aux_verbs'")
    return Wordlists(
        aux_verbs=aux_verbs,
        adverbs=_word_list(raw, "adverbs", path),
        comparatives=_word_list(raw, "comparatives", path),
        negatives=neg,
        scales=scales,
        aux_singular={str(k): str(v) for k, v in aux_singular.items()},
        path=str(path),
    )
