"""Labels of statements, shared by the critic's training data (critics/data.py) and the annotation tools
(i2d2/annotation.py): the label schemes and their spellings, vote aggregation, statement normal forms, and where
the bundled label files live."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Mapping, Sequence

ANNOTATION_DIR = Path(__file__).resolve().parent / "data" / "annotations"

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
# a run of them ("Generally, usually, X"): one pass strips all, so that canonicalising twice (train_critic scores
# texts it already canonicalised) reads what the critic was fitted on
_HEDGE = re.compile(r"^\s*(?:(?:" + "|".join(HEDGES) + r")\s*,\s*)+", re.IGNORECASE)


def canonical_statement(text: str) -> str:
    """The statement without a leading hedge adverb ("Generally, birds can fly." -> "Birds can fly."): the guide
    judges both alike, so the critic sees neither (``critic.canonicalize``) and cannot learn the adverb as a cue."""
    text = str(text)
    stripped = _HEDGE.sub("", text, count=1)
    return stripped[:1].upper() + stripped[1:] if stripped != text else text


# Gemma writes "It’s" as often as "It's": one statement, labelled once (the blind export showed a person both)
_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"'})


def normalize_statement(text: str) -> str:
    """Key used to de-duplicate statements across annotation rounds: case, spacing, a final period and curly
    quotes folded."""
    return re.sub(r"\s+", " ", str(text).translate(_QUOTES).strip().lower()).rstrip(" .")


def label_mapping(label_map: Mapping | None) -> dict[str, int | None]:
    """``DEFAULT_LABEL_MAP`` with a config's label map over it, keys through ``normalize_label`` (values 1/0/None
    or true/false/null). A config names only what it changes (``++critic.label_map.dont_know=0`` counts "don't
    know" as invalid instead of dropping it), so a one-key override from the command line keeps every other label."""
    out = {}
    for k, v in {**DEFAULT_LABEL_MAP, **(label_map or {})}.items():
        if v is not None and str(v).lower() not in ("0", "1", "true", "false"):  # 2, -1: not a class
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


def resolve_annotation_path(p: str | Path) -> Path:
    """An existing path, or the name of a bundled file under ``i2d2/data/annotations/``."""
    path = Path(p).expanduser()
    if path.exists():
        return path
    bundled = ANNOTATION_DIR / str(p)
    if bundled.exists():
        return bundled
    raise FileNotFoundError(f"annotation file {p!r} not found (neither a path nor a bundled file in {ANNOTATION_DIR})")
