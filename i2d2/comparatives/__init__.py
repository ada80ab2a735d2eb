"""NeuroComparatives (neurocomparatives.txt): entities, prompts, constraint passes, filters, metrics, QA.

The recipe that strings these together is ``i2d2.recipes.comparatives.run``.
"""
