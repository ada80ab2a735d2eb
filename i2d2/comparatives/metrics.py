"""Corpus metrics for NeuroComparatives (§3.2): Self-BLEU per entity pair, relation-phrase entropy."""

from __future__ import annotations


import numpy as np
import pandas as pd

from i2d2.comparatives.filters import QUANTIFIERS, comparative_pattern
from i2d2.metrics import entropy, self_bleu

UNDEFINED = "\u2013"  # how reports print a metric that is undefined (None), never as 0.0


def fmt(value, digits: int = 3) -> str:
    """A metric for a report: the number, or '\u2013' when it is undefined (None / NaN)."""
    if value is None or (isinstance(value, float) and not np.isfinite(value)):
        return UNDEFINED
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def pair_self_bleu(df: pd.DataFrame, max_order: int, text_col: str = "text", group_col: str = "pair_id") -> float | None:
    """Mean over entity pairs (with >= 2 kept statements) of Self-BLEU among that pair's statements.

    The continuation (``text``) is used: every statement of a pair shares the prompt, which would
    otherwise inflate the score.
    """
    values = [self_bleu(g.tolist(), max_order) for _, g in df.groupby(group_col, sort=False)[text_col] if len(g) >= 2]
    return float(np.mean(values)) if values else None  # no pair with two statements


def relation_phrases(texts: pd.Series, comparatives: list[str]) -> pd.Series:
    """The comparative relation phrase of each statement: 'more expensive', 'less healthy', 'cheaper'.

    ``more``/``less``/``fewer`` take the following word; other Table 8 comparatives stand alone.
    Statements without one give NaN. (``pair_self_bleu`` is None when no pair has two statements.)
    """
    pat = r"\b(" + comparative_pattern(comparatives) + r"|" + "|".join(QUANTIFIERS) + r")\b"
    return texts.fillna("").str.lower().str.extract(pat, expand=False).str.replace(r"\s+", " ", regex=True)


def relation_entropy(texts: pd.Series, comparatives: list[str]) -> float | None:
    """Entropy (bits) of the relation phrases; None (undefined) when no statement has one."""
    phrases = relation_phrases(texts, comparatives).dropna()
    return entropy(phrases.tolist()) + 0.0 if len(phrases) else None  # + 0.0: no -0.0


def corpus_metrics(df: pd.DataFrame, comparatives: list[str], prefix: str = "") -> dict:
    """Self-BLEU-2/3 over each pair's statements, relation entropy, sizes; undefined values are None."""
    if df.empty:
        return {f"{prefix}n": 0, f"{prefix}n_pairs": 0, f"{prefix}self_bleu_2": None, f"{prefix}self_bleu_3": None,
                f"{prefix}relation_entropy": None, f"{prefix}n_relations": 0}
    return {
        f"{prefix}n": int(len(df)),
        f"{prefix}n_pairs": int(df["pair_id"].nunique()),
        f"{prefix}self_bleu_2": pair_self_bleu(df, 2),
        f"{prefix}self_bleu_3": pair_self_bleu(df, 3),
        f"{prefix}relation_entropy": relation_entropy(df["text"], comparatives),
        f"{prefix}n_relations": int(relation_phrases(df["text"], comparatives).nunique()),
    }
