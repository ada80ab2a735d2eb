"""Comparative prompts (§2.1.4) and the NeuroLogic constraint passes (§2.2.1, App. A.2-A.3)."""

from __future__ import annotations

import itertools
import logging

import numpy as np
import pandas as pd

from i2d2.comparatives.entities import Entity
from i2d2.comparatives.wordlists import Wordlists

log = logging.getLogger(__name__)

TEMPLATE = "Compared to {entity1}, {entity2}"
DEFAULT_ORDER = {"aux": [1, 2], "adverb": [1, 2], "comparative": [3]}


def make_pairs(classes: dict[str, list[Entity]], template: str = TEMPLATE, both_orders: bool = False,
               max_per_class: int | None = None, seed: int = 0) -> pd.DataFrame:
    """Entity pairs within each class, one prompt each with plural entities (mass nouns singular;
    ``countable2`` says which number entity2's verb takes).

    An unordered pair seen in several classes is kept once (its first class). ``max_per_class`` samples
    that many pairs per class (seeded) for small runs.
    """
    rng = np.random.default_rng(seed)
    rows, seen = [], set()
    for cls, ents in classes.items():
        combos = list(itertools.permutations(ents, 2) if both_orders else itertools.combinations(ents, 2))
        if max_per_class is not None and len(combos) > max_per_class:
            combos = [combos[i] for i in sorted(rng.choice(len(combos), max_per_class, replace=False))]
        for a, b in combos:
            key = (a.name.lower(), b.name.lower()) if both_orders else tuple(sorted((a.name.lower(), b.name.lower())))
            if key in seen or a.name.lower() == b.name.lower():
                continue
            seen.add(key)
            rows.append({"pair_id": f"{a.name} | {b.name}", "class": cls, "entity1": a.name, "entity2": b.name,
                         "plural1": a.plural, "plural2": b.plural, "countable2": b.countable,
                         "prompt": template.format(entity1=a.plural, entity2=b.plural)})
    return pd.DataFrame(rows, columns=["pair_id", "class", "entity1", "entity2", "plural1", "plural2", "countable2",
                                       "prompt"])


def perplexity_filter(pairs: pd.DataFrame, ppl: np.ndarray, drop_fraction: float = 0.3) -> pd.DataFrame:
    """Mark the ``drop_fraction`` of prompts with the highest LM perplexity as dropped (§2.1.4).

    Adds ``perplexity`` and ``kept`` columns; ties at the cut are broken by order (stable ranking).
    """
    if not 0.0 <= drop_fraction < 1.0:
        raise ValueError(f"prompt_filter.drop_fraction must be in [0, 1), got {drop_fraction}")
    out = pairs.copy()
    out["perplexity"] = np.asarray(ppl, dtype=float)
    n_keep = int(np.ceil(len(out) * (1.0 - drop_fraction)))
    rank = out["perplexity"].rank(method="first").to_numpy()
    out["kept"] = rank <= n_keep
    return out


def select_passes(wordlists: Wordlists, max_passes: int | None = None) -> list[tuple[str, str]]:
    """The (aux, adverb) passes, aux-major (Table 6 order).

    ``max_passes=n`` (small runs) walks the grid diagonally: pass ``j`` takes aux verb
    ``floor(j * n_aux / n)`` and adverb ``j mod n_adverbs``, so the chosen passes are distinct and spread
    over different aux verbs and adverbs; ``n`` equal to the grid size gives every pass.
    """
    passes = wordlists.passes()
    if max_passes is None or int(max_passes) >= len(passes):
        return passes
    n = int(max_passes)
    if n < 1:
        raise ValueError(f"max_passes must be >= 1 or null, got {max_passes}")
    na, nd = len(wordlists.aux_verbs), len(wordlists.adverbs)
    return [(wordlists.aux_verbs[(j * na) // n], wordlists.adverbs[j % nd]) for j in range(n)]


def constraint_set(aux: str, adverb: str, wordlists: Wordlists, top_k: int = 5,
                   order: dict | None = None, negatives: list[str] | None = None):
    """One pass's constraints: aux verb and adverb clauses, Table 9 negative sets (forbidden words),
    the dynamic top-k comparative clause over Table 8, with ordered satisfaction positions (A.3).

    Default order: aux verb and adverb come first (either order) and the comparative after both,
    e.g. "... typically have fewer moving parts", "... are generally considered more reliable".
    """
    from i2d2.decoding import Clause, ConstraintSet, CountConstraint, DynamicClause, Literal

    order = {**DEFAULT_ORDER, **(order or {})}
    pos = {k: (list(v) if v else None) for k, v in order.items()}
    clauses = [Clause([Literal(aux)], positions=pos["aux"], name="aux"),
               Clause([Literal(adverb)], positions=pos["adverb"], name="adverb")]
    names = list(wordlists.negatives) if negatives is None else list(negatives)
    unknown = [n for n in names if n not in wordlists.negatives]
    if unknown:
        raise ValueError(f"unknown negative set(s) {unknown}; {wordlists.path} has {list(wordlists.negatives)}")
    counts = [CountConstraint(wordlists.negatives[n], max_count=0, name=f"neg:{n}") for n in names]
    dynamic = [DynamicClause(wordlists.comparatives, top_k=top_k, positions=pos["comparative"], name="comparative")]
    return ConstraintSet(clauses=clauses, counts=counts, dynamic=dynamic)


def prompt_rows(pairs: pd.DataFrame, passes: list[tuple[str, str]], wordlists: Wordlists, top_k: int = 5,
                order: dict | None = None, negatives: list[str] | None = None) -> list[dict]:
    """One generation prompt per (pair, pass), with the pass's ConstraintSet and provenance.

    The aux verb agrees with entity2: a mass noun takes the singular form ('silver is', 'rice has').
    """
    index = {p: i for i, p in enumerate(wordlists.passes())}  # the pass's number among all 30
    sets: dict[tuple[str, str], dict] = {}
    rows = []
    for pair in pairs.to_dict("records"):
        countable = bool(pair.get("countable2", True))
        for aux, adverb in passes:
            i = index.get((aux, adverb), -1)
            verb = wordlists.agree(aux, countable)
            if (verb, adverb) not in sets:
                sets[(verb, adverb)] = constraint_set(verb, adverb, wordlists, top_k, order, negatives).to_dict()
            rows.append({"prompt_id": f"{pair['pair_id']} #{i:02d}", "prompt": pair["prompt"],
                         "constraints": sets[(verb, adverb)],
                         **{k: pair[k] for k in ("pair_id", "class", "entity1", "entity2", "plural1", "plural2")},
                         "aux": verb, "adverb": adverb, "pass": i})
    return rows
