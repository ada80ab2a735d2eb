"""CMP: pre-training seq2seq LMs for comparative reasoning (Yu et al., 2023).

Quintuples (e1, e2, property, v1, v2) with one document per entity are textualized into
comparative QA pairs (Table 1) and summaries, and a seq2seq model is trained on the four
tasks of Table 2 (answer generation, QA-pair generation, summary generation, text infilling)
with the summed loss. See ``i2d2.recipes.cmp`` for the end-to-end run.
"""

from i2d2.cmp.data import Quintuple, load_quintuples, write_quintuples  # noqa: F401
