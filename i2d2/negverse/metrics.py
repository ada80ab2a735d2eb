"""NegVerse metrics: Levenshtein similarity, syntactic tree-edit distance, self-BLEU, negation types."""

from __future__ import annotations

from collections import Counter

import numpy as np
from zss import Node, simple_distance

from i2d2.metrics import self_bleu
from i2d2.negverse.filters import lev_distance


def dep_tree(doc) -> Node:
    """A zss tree of a parsed sentence: nodes labelled by dependency label + coarse POS."""
    def build(tok):
        node = Node(f"{tok.dep_}/{tok.pos_}")
        for child in tok.children:
            node.addkid(build(child))
        return node

    roots = [t for t in doc if t.head.i == t.i]
    if len(roots) == 1:
        return build(roots[0])
    top = Node("DOC")
    for r in roots:
        top.addkid(build(r))
    return top


def tree_edit_distance(doc_a, doc_b, normalize: bool = True) -> float:
    """Zhang-Shasha edit distance between the dependency trees (optionally / size of the larger tree)."""
    d = simple_distance(dep_tree(doc_a), dep_tree(doc_b))
    return d / max(len(doc_a), len(doc_b), 1) if normalize else float(d)


UNDEFINED_WHEN_EMPTY = ("levenshtein_similarity", "tree_edit_distance", "tree_edit_distance_norm",
                        "self_bleu_per_sentence", "self_bleu_corpus", "types_covered_per_sentence")


def negation_metrics(rows: list[dict], nlp, types=("verbal", "non_verbal", "affixal")) -> dict:
    """Corpus metrics over kept negations (rows: original, negation, negation_type).

    A metric with nothing to average is None (JSON null), never 0.0: everything but the counts when no
    row is kept, self-BLEU per sentence when no sentence has two negations, corpus self-BLEU below two rows, the
    type shares and types per sentence when no row has a negation type (the cue filter was off). Each average
    has its count: ``n`` (rows), ``n_originals`` (sentences with a kept negation: types per sentence),
    ``n_originals_self_bleu`` (those with two or more: self-BLEU per sentence), ``n_typed`` (type shares).
    """
    if not rows:
        return {"n": 0, "n_originals": 0, "n_originals_self_bleu": 0, "n_typed": 0,
                **{k: None for k in UNDEFINED_WHEN_EMPTY}, **{f"type_{t}": None for t in types}}
    lev_sim = [1.0 - lev_distance(r["original"], r["negation"]) for r in rows]
    originals = list(dict.fromkeys(r["original"] for r in rows))
    parsed = dict(zip(originals, nlp.pipe(originals)))
    neg_docs = list(nlp.pipe([r["negation"] for r in rows]))
    ted = [tree_edit_distance(parsed[r["original"]], d) for r, d in zip(rows, neg_docs)]
    ted_raw = [tree_edit_distance(parsed[r["original"]], d, normalize=False) for r, d in zip(rows, neg_docs)]
    # type shares over the rows the cue filter typed: with it off (require_cue=False) no row has a type, and the
    # shares read 0.0 and the types per sentence 1.0 (None counted as a type) as if measured
    typed = [r for r in rows if r.get("negation_type")]
    counts = Counter(r["negation_type"] for r in typed)
    # self-BLEU within each original's set of negations (diversity of what one sentence turns into)
    groups: dict[str, list[str]] = {}
    for r in rows:
        groups.setdefault(r["original"], []).append(r["negation"])
    sb = [self_bleu(g) for g in groups.values() if len(g) > 1]
    typed_groups: dict[str, set] = {}
    for r in typed:
        typed_groups.setdefault(r["original"], set()).add(r["negation_type"])
    out = {"n": len(rows), "n_originals": len(groups), "n_originals_self_bleu": len(sb), "n_typed": len(typed),
           "levenshtein_similarity": float(np.mean(lev_sim)),
           "tree_edit_distance": float(np.mean(ted_raw)), "tree_edit_distance_norm": float(np.mean(ted)),
           "self_bleu_per_sentence": float(np.mean(sb)) if sb else None,
           "self_bleu_corpus": self_bleu([r["negation"] for r in rows]) if len(rows) > 1 else None,
           "types_covered_per_sentence": float(np.mean([len(v) for v in typed_groups.values()]))
           if typed_groups else None}
    for t in types:
        out[f"type_{t}"] = counts.get(t, 0) / len(typed) if typed else None
    return out
