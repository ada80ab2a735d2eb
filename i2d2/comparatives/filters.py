"""The four NeuroComparatives filters (§2.3) on a DataFrame of generations, one row per generation.

Columns used: ``pair_id``, ``score`` (the decoder's S), ``statement`` / ``text`` (continuation),
``aux``/``adverb``/``comparative`` (the literal each clause matched). Each filter returns the kept rows
(original index preserved) and leaves counting/logging to the recipe's stage wrapper.
"""

from __future__ import annotations

import functools
import re

import numpy as np
import pandas as pd

QUANTIFIERS = ("more", "less", "fewer")


def comparative_pattern(comparatives: list[str]) -> str:
    """Regex (no groups) for one comparative: a Table 8 word, or 'more'/'less'/'fewer' + the next word."""
    words = sorted({w.lower() for w in comparatives} - set(QUANTIFIERS), key=len, reverse=True)
    return r"(?:(?:" + "|".join(QUANTIFIERS) + r")\s+[a-z][a-z-]*|" + "|".join(map(re.escape, words)) + ")"


@functools.lru_cache(maxsize=4)
def _coordination_res(comparatives: tuple[str, ...]) -> tuple[re.Pattern, re.Pattern]:
    item = comparative_pattern(list(comparatives))
    return (re.compile(rf"\b{item}$", re.IGNORECASE),                               # 'smaller' before a comma
            re.compile(rf"^\s+(?:(?:and|or)\s+)?{item}\b", re.IGNORECASE))          # ' and faster' after it


def _cut_at_clause(sentence: str, comparatives: tuple[str, ...]) -> str:
    """Cut at the first ',', ';' or ':' that ends a clause, ending the statement with a full stop. A comma
    between two comparatives coordinates them ('smaller, lighter, and faster') and is kept."""
    before_re, after_re = _coordination_res(comparatives)
    for m in re.finditer(r"[,;:](?=\s|$)", sentence):
        head, tail = sentence[:m.start()].rstrip(), sentence[m.end():]
        if m.group() == "," and before_re.search(head) and after_re.match(tail):
            continue
        return head + "."
    return sentence


def first_sentence(texts: pd.Series, at_clause: bool = False, comparatives: list[str] | None = None) -> pd.Series:
    """Cut each continuation after its first sentence end (generations run on past it).

    ``at_clause`` also cuts at the first comma / semicolon / colon followed by a space and ends the
    statement there with a full stop ("are cheaper, which makes them ..." -> "are cheaper."), except for
    commas that coordinate comparatives ("are typically smaller, lighter, and faster." stays whole);
    ``comparatives`` (default: Table 8 of the bundled word lists) says what a comparative is.
    """
    texts = texts.fillna("").astype(str).str.strip()
    cut = texts.str.extract(r"^(.*?\S)([.!?])(?:\s|$)", expand=True)
    sentences = (cut[0] + cut[1]).fillna(texts).str.strip()
    if not at_clause:
        return sentences
    if comparatives is None:
        from i2d2.comparatives.wordlists import load_wordlists

        comparatives = load_wordlists().comparatives
    key = tuple(comparatives)
    return sentences.map(lambda t: _cut_at_clause(t, key)).str.strip()


def contains_word(texts: pd.Series, words: pd.Series) -> np.ndarray:
    """Row-wise: does ``texts[i]`` contain ``words[i]`` as a whole word (case-insensitive)?"""
    t = (" " + texts.fillna("").str.lower().str.replace(r"[^\w'-]+", " ", regex=True) + " ").to_numpy()
    w = (" " + words.fillna("\x00").str.lower().str.strip() + " ").to_numpy()
    return np.char.find(t.astype(str), w.astype(str)) >= 0


def best_per_group(df: pd.DataFrame, keys: list[str], score_col: str = "score") -> pd.DataFrame:
    """The row with the highest score in each group (first on ties), in original order."""
    if df.empty:
        return df
    idx = df.sort_values(score_col, ascending=False, kind="stable").groupby(keys, sort=False, dropna=False).head(1).index
    return df.loc[df.index.isin(idx)]


# ----------------------------------------------------------------------------- 1. deduplication

def cluster_labels(embeddings: np.ndarray, groups: np.ndarray, distance_threshold: float,
                   linkage: str = "average", metric: str = "cosine") -> np.ndarray:
    """Agglomerative clusters of sentence embeddings, computed separately within each group (entity pair).

    Returns a global integer cluster id per row. ``distance_threshold`` is in ``metric`` units
    (cosine distance = 1 - cosine similarity of the embeddings).
    """
    from sklearn.cluster import AgglomerativeClustering

    labels = np.full(len(embeddings), -1, dtype=np.int64)
    codes, uniq = pd.factorize(pd.Series(groups))
    next_id = 0
    for g in range(len(uniq)):  # one clustering per entity pair; rows inside are handled by sklearn
        rows = np.flatnonzero(codes == g)
        if len(rows) == 1:
            labels[rows] = next_id
            next_id += 1
            continue
        model = AgglomerativeClustering(n_clusters=None, distance_threshold=distance_threshold,
                                        linkage=linkage, metric=metric)
        lab = model.fit_predict(embeddings[rows])
        labels[rows] = lab + next_id
        next_id += int(lab.max()) + 1
    return labels


def _heads(labels: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """Per row, the position of its cluster's best-scored row (first on ties, as ``best_per_group``)."""
    order = np.lexsort((np.arange(len(labels)), -scores, labels))
    uniq, first = np.unique(labels[order], return_index=True)
    return order[first][np.searchsorted(uniq, labels)]


def split_contradictions(labels: np.ndarray, contradicts: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """Cluster ids of one pair's rows where the members that contradict their cluster's best-scored member move
    together to a new cluster (one per old cluster), and so on within the moved rows: no cluster's best member is
    contradicted by a member merged into it. ``contradicts``: the pair's symmetric boolean contradiction matrix.
    Embeddings put "are larger." and "are smaller." within the dedup distance; without this only the better-scored
    of the two reached the contradiction filter, true or not."""
    labels, scores = np.asarray(labels).copy(), np.asarray(scores, dtype=float)
    todo = np.arange(len(labels))
    while len(todo) > 1:  # each round settles every todo cluster's head: at most one round per row
        heads = todo[_heads(labels[todo], scores[todo])]
        off = contradicts[todo, heads]
        if not off.any():
            break
        labels[todo[off]] += labels.max() + 1  # distinct old ids stay distinct after the shift
        todo = todo[off]
    return labels


def contradiction_mask(C: np.ndarray, c_threshold: float = 0.99) -> np.ndarray:
    """Which ordered pairs contradict, either direction at or above the threshold (diagonal False)."""
    c = (C >= c_threshold) | (C.T >= c_threshold)
    np.fill_diagonal(c, False)
    return c


def _split_by_scorer(df: pd.DataFrame, labels: np.ndarray, scorer, c_threshold: float, group_col: str,
                     score_col: str, text_col: str) -> np.ndarray:
    """``split_contradictions`` per pair, scoring only the rows of clusters with more than one member."""
    labels = labels.copy()
    shared = pd.Series(labels).duplicated(keep=False).to_numpy()
    texts, scores = df[text_col].astype(str).tolist(), df[score_col].to_numpy(dtype=float)
    codes, _ = pd.factorize(df[group_col])
    for g in np.unique(codes[shared]):  # only a merge can hide an opposite
        rows = np.flatnonzero(shared & (codes == g))
        c = contradiction_mask(scorer.matrix([texts[i] for i in rows])[0], c_threshold)
        local = split_contradictions(labels[rows], c, scores[rows])
        moved = local != labels[rows]
        labels[rows[moved]] = labels.max() + 1 + local[moved]  # fresh global ids
    return labels


def dedup(df: pd.DataFrame, embeddings: np.ndarray, distance_threshold: float = 0.15, linkage: str = "average",
          group_col: str = "pair_id", score_col: str = "score", scorer=None, c_threshold: float = 0.99,
          text_col: str = "text") -> pd.DataFrame:
    """§2.3.1: cluster near-duplicate statements of each pair, keep the best-S one per cluster. With a contradiction
    ``scorer`` (the offline lexicon rule) a cluster's members that contradict its best one are split off
    (``split_contradictions``), so that both sides reach the contradiction filter (§2.3.3), which can weigh them."""
    if df.empty:
        return df.assign(cluster=pd.Series(dtype=np.int64))
    if len(embeddings) != len(df):
        raise ValueError(f"dedup: {len(embeddings)} embeddings for {len(df)} rows")
    labels = cluster_labels(np.asarray(embeddings, dtype=np.float32), df[group_col].to_numpy(), distance_threshold,
                            linkage)
    if scorer is not None:
        labels = _split_by_scorer(df, labels, scorer, c_threshold, group_col, score_col, text_col)
    return best_per_group(df.assign(cluster=labels), ["cluster"], score_col)


# ----------------------------------------------------------------------------- 2. constraint groups

def satisfied_mask(df: pd.DataFrame, keys=("aux", "adverb", "comparative"), text_col: str = "text") -> np.ndarray:
    """Rows whose every clause matched a literal that still occurs (as a word) in the cleaned text."""
    ok = np.ones(len(df), dtype=bool)
    for k in keys:
        ok &= df[k].notna().to_numpy() & contains_word(df[text_col], df[k])
    return ok


def constraint_groups(df: pd.DataFrame, keys=("aux", "adverb", "comparative"), group_col: str = "pair_id",
                      score_col: str = "score", text_col: str = "text", require_satisfied: bool = True) -> pd.DataFrame:
    """§2.3.2: per pair, group by the matched (aux verb, adverb, comparative) and keep the best S.

    With ``require_satisfied`` rows whose clauses were not all matched (or whose matched literals no
    longer occur in the cleaned text) are dropped first.
    """
    keys = list(keys)
    if df.empty:
        return df
    ok = satisfied_mask(df, keys, text_col) if require_satisfied else np.ones(len(df), dtype=bool)
    kept = df.loc[ok].assign(**{f"_{k}": df.loc[ok, k].str.lower() for k in keys})
    out = best_per_group(kept, [group_col] + [f"_{k}" for k in keys], score_col)
    return out.drop(columns=[f"_{k}" for k in keys])


# ----------------------------------------------------------------------------- 3. contradictions

def contradiction_counts(C: np.ndarray, E: np.ndarray, c_threshold: float = 0.99, e_threshold: float = 0.85
                         ) -> tuple[np.ndarray, np.ndarray]:
    """Per statement: how many others it contradicts / agrees with (either direction of the pair, probability
    at or above the threshold; a pair that passes both counts as a contradiction)."""
    c = contradiction_mask(C, c_threshold)
    e = ((E >= e_threshold) | (E.T >= e_threshold)) & ~c
    np.fill_diagonal(e, False)
    return c.sum(1), e.sum(1)


def contradicts_more_often_than_not(n_contradict: np.ndarray, n_others: np.ndarray) -> np.ndarray:
    """§2.3.3's keep rule, as written: "we discard comparatives that contradict others more often than not",
    i.e. those that contradict more than half of the other statements about their entity pair. Entailment
    (the 0.85 threshold) only decides which pairs count as agreeing (``n_agree``, reported); the paper's rule
    does not weigh it. A pair's only two statements that contradict each other are both dropped (1 of 1)."""
    return 2 * np.asarray(n_contradict) > np.asarray(n_others)


def contradiction_filter(df: pd.DataFrame, scorer, c_threshold: float = 0.99, e_threshold: float = 0.85,
                         k: int | None = 5, group_col: str = "pair_id", score_col: str = "score",
                         text_col: str = "statement", dropped: dict | None = None) -> pd.DataFrame:
    """§2.3.3: drop statements that contradict more than half of their pair's other statements
    (``contradicts_more_often_than_not``), then keep the ``k`` best-S statements per pair.
    Adds ``n_contradict``/``n_agree``/``n_others``. ``dropped`` (a dict) receives how many rows each step took out,
    ``contradicted`` and ``beyond_k``: the stage's in -> out alone reads as all contradictions."""
    if dropped is not None:
        dropped.update(contradicted=0, **({} if k is None else {"beyond_k": 0}))
    if df.empty:
        return df.assign(n_contradict=pd.Series(dtype=int), n_agree=pd.Series(dtype=int),
                         n_others=pd.Series(dtype=int))
    n_c = np.zeros(len(df), dtype=int)
    n_e = np.zeros(len(df), dtype=int)
    codes, uniq = pd.factorize(df[group_col])
    texts = df[text_col].tolist()
    for g in range(len(uniq)):  # all ordered pairs of one entity pair's statements at once
        rows = np.flatnonzero(codes == g)
        C, E = scorer.matrix([texts[i] for i in rows])
        n_c[rows], n_e[rows] = contradiction_counts(C, E, c_threshold, e_threshold)
    n_others = np.bincount(codes)[codes] - 1
    out = df.assign(n_contradict=n_c, n_agree=n_e, n_others=n_others)
    out = out.loc[~contradicts_more_often_than_not(n_c, n_others)]
    n_consistent = len(out)
    if k is not None:
        top = out.sort_values(score_col, ascending=False, kind="stable").groupby(group_col, sort=False).head(int(k))
        out = out.loc[out.index.isin(top.index)]
    if dropped is not None:  # no k: nothing is dropped beyond it, and the report says nothing of a cap
        dropped.update(contradicted=len(df) - n_consistent, **({} if k is None else {"beyond_k": n_consistent - len(out)}))
    return out


# ----------------------------------------------------------------------------- 4. discriminator cuts

def discriminator_cuts(df: pd.DataFrame, scores: np.ndarray, cuts: dict[str, float]) -> dict[str, pd.DataFrame]:
    """§3: rank by discriminator P(valid) and keep the top fraction for each cut (NC-XL/L/S = 1.0/0.5/0.2).

    Each cut keeps ``ceil(fraction * n)`` rows, sorted best first, with a ``critic_score`` column.
    """
    scored = df.assign(critic_score=np.asarray(scores, dtype=float))
    ranked = scored.sort_values("critic_score", ascending=False, kind="stable")
    out = {}
    for name, frac in cuts.items():
        if not 0.0 < float(frac) <= 1.0:
            raise ValueError(f"discriminator cut {name!r}: fraction must be in (0, 1], got {frac}")
        out[name] = ranked.head(int(np.ceil(float(frac) * len(ranked))))
    return out
