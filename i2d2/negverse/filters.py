"""Filters for generated negations: degenerate outputs, edit distance, negation cue, duplicates.

Each filter takes candidate rows (dicts with at least ``original`` and ``negation``) and returns
``(kept, dropped)``; dropped rows carry ``drop_reason``. ``apply_filters`` chains them.
"""

from __future__ import annotations

import re

from rapidfuzz.distance import Levenshtein

from i2d2.negverse.formatting import SPECIAL_TOKENS
from i2d2.negverse.masking import normalize_space

_WORD = re.compile(r"[A-Za-z]+(?:['’][A-Za-z]+)?")


def lev_distance(a: str, b: str) -> float:
    """Normalised character Levenshtein distance in [0, 1] (rapidfuzz)."""
    return float(Levenshtein.normalized_distance(a, b))


def _split(rows, ok, reason):
    kept, dropped = [], []
    for r in rows:
        if ok(r):
            kept.append(r)
        else:
            dropped.append({**r, "drop_reason": reason(r) if callable(reason) else reason})
    return kept, dropped


def degenerate_reason(row: dict, max_len_ratio: float = 2.0) -> str | None:
    """Why a candidate is degenerate, or None: unfilled/empty blanks, unchanged, special tokens or
    garbage (non-text characters, long character runs, repeated words, runaway length)."""
    neg, orig = row.get("negation"), row["original"]
    if neg is None:
        return "blanks_not_filled"
    answers = row.get("answers") or []
    if any(not a.strip() for a in answers):
        return "empty_blank"
    if normalize_space(neg).lower().rstrip(".!?") == normalize_space(orig).lower().rstrip(".!?"):
        return "unchanged"
    if any(t in neg for t in SPECIAL_TOKENS) or "[BLANK" in neg or "<" in neg:
        return "special_token"
    if any(not (c.isprintable()) for c in neg) or re.search(r"[^\w\s.,;:!?'’\"()\-&%$/]", neg):
        return "garbage_chars"
    if re.search(r"(.)\1{3,}", neg):
        return "garbage_run"
    words = _WORD.findall(neg.lower())
    if not words:
        return "no_words"
    if any(words[i] == words[i + 1] and words[i] not in ("had", "that") for i in range(len(words) - 1)):
        return "repeated_word"
    if len(neg) > max_len_ratio * len(orig) + 10:
        return "too_long"
    if _repeated_phrase(words, _WORD.findall(orig.lower())) or _copied_word(words, _WORD.findall(orig.lower())):
        return "repeated_phrase"
    if _misplaced_cue(neg):
        return "misplaced_negation"
    return None


_CUES = {"not", "no", "never", "nobody", "nothing", "none", "nowhere"}
_DETS = {"the", "a", "an", "this", "that", "these", "those", "my", "his", "her", "their", "our", "its", "your"}


def _repeated_phrase(words: list[str], orig_words: list[str], n: int = 2) -> bool:
    """A word n-gram (n >= 2) repeated more often than in the original: the model copied the rest of
    the sentence into a blank ("the room was not clean was clean")."""
    def counts(ws):
        c: dict[tuple, int] = {}
        for i in range(len(ws) - n + 1):
            c[tuple(ws[i:i + n])] = c.get(tuple(ws[i:i + n]), 0) + 1
        return c
    before = counts(orig_words)
    return any(v > 1 and v > before.get(k, 0) for k, v in counts(words).items())


_FUNCTION = _DETS | {"and", "or", "of", "to", "in", "on", "at", "for", "with", "by", "from", "as", "but", "it"}
_FINITE = {"is", "are", "was", "were", "has", "have", "had", "does", "do", "did", "will", "can"}


def _copied_word(words: list[str], orig_words: list[str]) -> bool:
    """A content word of the original appearing more often than there ("the room was not clean was clean")."""
    from collections import Counter

    before, after = Counter(orig_words), Counter(words)
    return any(after[w] > before[w] >= 1 for w in after if w not in _FUNCTION and w not in _CUES and len(w) > 2)


def _misplaced_cue(neg: str) -> bool:
    """A negation word where English never puts one: right after a determiner ("the not bridge"),
    sentence-final ("painted the wall not."), or capitalised mid-sentence ("his friends Not the city")."""
    toks = re.findall(r"[A-Za-z']+|[.,;:!?]", neg)
    for i, t in enumerate(toks):
        low = t.lower()
        if low not in _CUES:
            continue
        if i > 0 and toks[i - 1].lower() in _DETS:
            return True
        if low == "not" and (i + 1 == len(toks) or toks[i + 1] in ".!?"):
            return True
        if low == "not" and i + 1 < len(toks) and toks[i + 1].lower() in _FINITE:  # "the hotel not was"
            return True
        if t[0].isupper() and i > 0 and toks[i - 1] not in ".!?":
            return True
    return False


def filter_degenerate(rows: list[dict], max_len_ratio: float = 2.0):
    return _split(rows, lambda r: degenerate_reason(r, max_len_ratio) is None,
                  lambda r: degenerate_reason(r, max_len_ratio))


def filter_distance(rows: list[dict], max_distance: float = 0.5):
    """Keep candidates whose normalised Levenshtein distance to the original is < ``max_distance``."""
    for r in rows:
        r["lev_distance"] = lev_distance(r["original"], r["negation"])
    return _split(rows, lambda r: r["lev_distance"] < max_distance, "too_far")


def filter_cue(rows: list[dict], detector, nlp=None):
    """Keep candidates in which the cue detector finds a negation cue the original lacks; rows get
    ``cues`` and ``negation_type``."""
    for r in rows:
        cues = detector.new_cues(r["original"], r["negation"])
        r["cues"] = [c.to_dict() for c in cues]
        r["negation_type"] = detector.negation_type(r["original"], r["negation"]) if cues else None
    return _split(rows, lambda r: bool(r["cues"]), "no_negation_cue")


def dedupe(rows: list[dict]):
    """Drop repeated (original, negation) pairs, case- and spacing-insensitively; keeps the first."""
    seen, kept, dropped = set(), [], []
    for r in rows:
        key = (r["original"], normalize_space(r["negation"]).lower())
        if key in seen:
            dropped.append({**r, "drop_reason": "duplicate"})
        else:
            seen.add(key)
            kept.append(r)
    return kept, dropped


def apply_filters(rows: list[dict], detector, max_distance: float = 0.5, max_len_ratio: float = 2.0,
                  require_cue: bool = True) -> tuple[list[dict], list[dict], dict]:
    """Degenerate -> distance -> cue -> dedupe. Returns (kept, dropped, counts per drop reason)."""
    kept, dropped = filter_degenerate(rows, max_len_ratio)
    kept, d = filter_distance(kept, max_distance)
    dropped += d
    if require_cue:
        kept, d = filter_cue(kept, detector)
        dropped += d
    kept, d = dedupe(kept)
    dropped += d
    counts: dict[str, int] = {}
    for r in dropped:
        counts[r["drop_reason"]] = counts.get(r["drop_reason"], 0) + 1
    return kept, dropped, counts
