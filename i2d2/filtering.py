"""Apply the critic: keep generations whose critic score exceeds δ (I2D2 Algorithm 1, line 7)."""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Sequence

import numpy as np

from i2d2.io import write_json

_NON_WORD = re.compile(r"[^\w]+", re.UNICODE)


_CLOSERS = "\"'”’)]"


def ends_sentence(text: str) -> bool:
    """True when the text ends a sentence (. ! ? before optional closing quotes/brackets): a generation cut off by
    max_new_tokens is not a statement, nor one that trails off in an ellipsis ("Dogs are known to..." or "…", one
    rule for both spellings; "..." passed only because it ends in a full stop)."""
    t = str(text).rstrip().rstrip(_CLOSERS)
    return t.endswith((".", "!", "?")) and not t.endswith(("..", "…"))


def dedupe_key(text: str) -> str:
    """Case, hyphens, punctuation and spacing folded: "Well-known dogs." == "well known dogs"."""
    return " ".join(_NON_WORD.sub(" ", str(text).lower()).split())


# Words that change neither what a generic claims nor which statement it is: articles, the possibility modals and
# copulas, the leading Generally/Typically/Usually of I2D2's templates, "etc". ("Beds may be made of wood, metal,
# plastic, etc." and "A bed is made of wood, plastic, metal." are one statement.) Not here: negations (see _negated),
# quantifiers ("always", "some") and the deontic should/must, which change the claim.
_FILLER = frozenset("a an the generally typically usually can could may might will would is are am be been being was "
                    "were etc".split())
# singular verb forms too short or irregular for singular_noun ("a tree has" / "trees have")
_AGREEMENT = {"has": "have", "does": "do"}
_NEGATIONS = frozenset("not no never cannot nothing none nor neither".split())
_NT = re.compile(r"n[’']t\b")


@functools.lru_cache(maxsize=1)
def _inflect():
    import inflect

    return inflect.engine()


@functools.lru_cache(maxsize=100_000)
def _singular(word: str) -> str:
    """inflect's singular of a plural noun.  inflect strips the "s" of any word ending in one ("gas" -> "ga",
    "lens" -> "len", "bus" -> "bu") while "gases" -> "gas": the two would never meet.  A bare strip whose result is
    far rarer than the word itself (wordfreq) is a singular noun already and stays as it is."""
    if len(word) <= 3:
        return word
    single = _inflect().singular_noun(word) or word
    if single == word[:-1] and word.endswith("s"):
        from wordfreq import zipf_frequency

        if zipf_frequency(single, "en") < zipf_frequency(word, "en") - 0.5:
            return word
    return single


def _words(text: str) -> list[str]:
    """dedupe_key's words with "n't" / "n’t" spelt " not"."""
    return dedupe_key(_NT.sub(" not", str(text))).split()


def content_key(text: str) -> str:
    """The statement's words without the fillers above, each passed through inflect's singular_noun (plural and
    singular nouns meet; other words change the same way on both sides), in sorted order: statements that differ
    only in word order ("wood, metal, plastic" / "wood, plastic, metal"), article, number, possibility modal or
    leading adverb get the same key."""
    return " ".join(sorted(_singular(_AGREEMENT.get(w, w)) for w in _words(text) if w not in _FILLER))


def frame_key(text: str, concept: str) -> str:
    """``content_key`` without the concept's own words: the template a statement fills in. "Chairs can be made of
    wood, metal, plastic, etc." (chair) and "Beds may be made of wood, plastic, metal." (bed) share one frame;
    "A kitchen knife is used to cut food." and "Scissors are used to cut paper." do not."""
    own = {_singular(w) for w in _words(concept)}
    return " ".join(w for w in content_key(text).split() if w not in own)


def _negated(text: str) -> bool:
    return not _NEGATIONS.isdisjoint(_words(text))


_LIST_SPLIT = re.compile(r",|;|\b(?:and|or)\b", re.IGNORECASE)


def repeats_list_item(text: str) -> bool:
    """True when one enumeration in the statement names the same short item twice ("cut meat, vegetables, fruits,
    fruits, vegetables"; "relax, relax, relax"): the model looping inside a list. An enumeration is a run of
    consecutive 1-2 word pieces between commas / "and" / "or"; its first item is the last word or two of the
    piece before it ("cut wood, wood, etc.": "cut wood" opens the list), and a longer piece ends it and opens the
    next ("fly, walk, or swim, and some can walk and swim" holds two). All 44 such statements of the labelled Gemma
    set (63 rows of every labelled set) are labelled garbled (i2d2/data/annotations), and the critic keeps some."""
    run: list[str] = []
    for k, piece in enumerate(dedupe_key(x) for x in _LIST_SPLIT.split(str(text))):
        words = piece.split()
        if k == 0 or len(words) > 2:  # the list's first item ends this piece: one word or two
            run = [" ".join(words[-1:]), " ".join(words[-2:])] if words else []
        elif words and piece != "etc":
            if piece in run:
                return True
            run.append(piece)
    return False


def near_duplicates(texts: Sequence[str], groups: Sequence[str] | None = None, threshold: float = 90.0,
                    order: Sequence[float] | None = None, by_content: bool = False) -> np.ndarray:
    """For each text, the index of the text it duplicates (itself when it is the group's representative).

    Texts are compared within a group (the concept: statements about different concepts are never
    duplicates, and the comparison stays O(sum of group sizes squared)). Two texts are near-duplicates when
    rapidfuzz's ``ratio`` (normalised Indel similarity, 0-100) is >= ``threshold`` on their ``dedupe_key``
    ("happy with our room" ~ "pleased with our room") or, with ``by_content``, their ``content_key`` is the same
    (the same words in another order, article, number or possibility modal), and both or neither is negated
    ("Birds can fly." is no duplicate of "Birds can’t fly."). ``by_content`` suits generics: sorted words also
    equate "Cats chase mice." with "Mice chase cats.", which comparatives must keep apart. ``order`` (higher
    first, e.g. the critic score) decides which text of a cluster represents it; ties keep the earlier one.
    """
    from rapidfuzz import fuzz, process

    n = len(texts)
    keys = [dedupe_key(t) for t in texts]
    contents = np.array([content_key(t) for t in texts] if by_content else range(n), dtype=object)
    negated = np.array([_negated(t) for t in texts], dtype=bool)
    groups = ["" for _ in range(n)] if groups is None else [str(g).lower() for g in groups]
    rank = np.arange(n) if order is None else np.lexsort((np.arange(n), -np.asarray(order, dtype=float)))
    rep = np.arange(n)
    by_group: dict[str, list[int]] = {}
    for i in rank.tolist():
        by_group.setdefault(groups[i], []).append(i)
    for members in by_group.values():
        if len(members) < 2:
            continue
        # uint8 rounds each ratio (94.5 -> 95): the cut is made on the exact ratio (score_cutoff: below it, 0)
        sim = process.cdist([keys[i] for i in members], [keys[i] for i in members], scorer=fuzz.ratio,
                            score_cutoff=threshold, dtype=np.uint8 if threshold >= 1 else np.float32, workers=1)
        ck, neg = contents[members], negated[members]
        close = ((sim > 0) | (ck[:, None] == ck[None, :])) & (neg[:, None] == neg[None, :])
        close = np.triu(close, k=1)  # j later (lower-ranked) than i
        taken = np.zeros(len(members), dtype=bool)
        for a in range(len(members)):  # greedy clustering in rank order; the matrix is already computed
            if taken[a]:
                continue
            dups = np.flatnonzero(close[a] & ~taken)
            taken[dups] = True
            rep[[members[j] for j in dups]] = members[a]
    return rep


def threshold_filter(rows: Sequence[dict], scores, delta: float) -> tuple[list[dict], list[dict]]:
    """Split ``rows`` into (kept, dropped) by ``score > delta``; every returned row gets ``critic_score``.

    Rows are copied (the inputs are not modified); order is preserved within each side.
    """
    scores = np.asarray(scores, dtype=float).reshape(-1)
    if len(scores) != len(rows):
        raise ValueError(f"threshold_filter: {len(rows)} rows but {len(scores)} scores")
    if np.isnan(scores).any():
        raise ValueError(f"threshold_filter: {int(np.isnan(scores).sum())} scores are NaN")
    keep = scores > float(delta)
    kept, dropped = [], []
    for row, s, k in zip(rows, scores.tolist(), keep.tolist()):
        (kept if k else dropped).append({**row, "critic_score": s})
    return kept, dropped


def write_filtered(out_dir: str | Path, kept, dropped, delta: float | None = None, tracker=None) -> dict:
    """Write the ``kept/`` and ``dropped/`` tables (Arrow, atomically), ``kept.jsonl`` (the kept set, readable) and
    ``summary.json``; return the summary. ``kept``/``dropped``: ``datasets.Dataset`` or lists of dicts."""
    from i2d2.io import export_jsonl, save_table

    out_dir = Path(out_dir)
    kept, dropped = _as_dataset(kept), _as_dataset(dropped)
    save_table(out_dir / "kept", kept)
    save_table(out_dir / "dropped", dropped)
    export_jsonl(out_dir / "kept.jsonl", kept)
    n = len(kept) + len(dropped)
    summary = {"n_in": n, "n_kept": len(kept), "n_dropped": len(dropped),
               "keep_rate": len(kept) / n if n else 0.0, "delta": delta}
    write_json(out_dir / "summary.json", summary)
    if tracker is not None:  # keep_rate as the report names it (the file keeps its key: runs read it back)
        tracker.log_metrics({f"filter/{'kept_fraction' if k == 'keep_rate' else k}": v for k, v in summary.items()
                             if v is not None})
    return summary


def _as_dataset(rows):
    import datasets
    import pyarrow as pa

    from i2d2.io import _nulls_as_strings

    return rows if isinstance(rows, datasets.Dataset) else datasets.Dataset(_nulls_as_strings(pa.Table.from_pylist(list(rows))))


def filter_and_write(rows: Sequence[dict], scores, delta: float, out_dir: str | Path, tracker=None) -> dict:
    """``threshold_filter`` then ``write_filtered``."""
    kept, dropped = threshold_filter(rows, scores, delta)
    return write_filtered(out_dir, kept, dropped, delta=delta, tracker=tracker)
