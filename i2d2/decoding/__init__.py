"""Tensorized NeuroLogic constrained decoding (I2D2 §2.2, NeuroComparatives §2.2.1 / A.1-A.3)."""

from .constraints import (Clause, ConstraintError, ConstraintSet, CountConstraint, DynamicClause, Literal,
                          canonical_word, split_words, validate, word_variants)
from .neurologic import DecodingConfig, Generation, NeuroLogicDecoder

__all__ = ["Literal", "Clause", "CountConstraint", "DynamicClause", "ConstraintSet", "DecodingConfig",
           "NeuroLogicDecoder", "Generation", "ConstraintError", "split_words", "canonical_word", "word_variants",
           "validate"]
