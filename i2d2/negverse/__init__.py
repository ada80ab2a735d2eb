"""NegVerse: negation generation by syntactic masking and prompt tuning (see i2d2/recipes/negverse.py)."""
