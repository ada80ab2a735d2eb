"""Tensorized NeuroLogic constrained decoding (I2D2 §2.2, NeuroComparatives §2.2.1 / A.1-A.3)."""

from .constraints import (Clause, ConstraintError, ConstraintSet, CountConstraint, DynamicClause, Literal,
                          canonical_word, split_words, validate, word_variants)
from .neurologic import DecodingConfig, Generation, NeuroLogicDecoder

# What the decoder returns for the same model, prompts and config. Raise it when a change alters the output rows
# (sequences, scores or ``matched``: revision 2 names the first-completed literal of a clause), so that shards
# an older decoder wrote are decoded again on resume rather than mixed with new ones. Revision 3: on a CPU with a
# small vocabulary the prune threshold is selected alone, so exactly tied log-probs may order differently.
# Revision 4: the lookahead no longer proposes words that would break the clause order (positions), a one-literal
# negative clause or a count limit, by a first token or by a continuation of the pending word.  Revision 5: a space
# or punctuation mark split over byte tokens (’ “ — on GPT-2's byte-level vocabulary, a byte-fallback no-break space
# on Gemma) ends the word before it once complete, as the one-token mark does, instead of gluing the words around it.
OUTPUT_REVISION = 5

__all__ = ["Literal", "Clause", "CountConstraint", "DynamicClause", "ConstraintSet", "DecodingConfig",
           "NeuroLogicDecoder", "Generation", "ConstraintError", "split_words", "canonical_word", "word_variants",
           "validate", "OUTPUT_REVISION"]
