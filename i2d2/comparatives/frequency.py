"""Filtering obscure candidate entities (NeuroComparatives §2.1.3).

The paper discards entities that occur fewer than n = 100 times in the language model's training
corpus (OpenWebText for GPT-2), then every class left with fewer than 2 entities. Two count sources:

  * ``wordfreq``: the ``wordfreq`` package's word frequencies (a blend of web, subtitle, news, book and
    Wikipedia text), turned into an expected count in a corpus of ``corpus_words`` words. An entity's
    count is that of its singular plus its plural form. wordfreq has no phrase counts: for a multi-word
    entity it estimates the phrase from its words (about the rarest word's frequency), which is an
    upper bound, so it only drops phrases with an obscure word ('home keg tapper' passes on 'keg').
  * a text corpus (a file, one document a line, e.g. a sample of the LM's own training data): exact,
    case-insensitive counts of each entity's singular and plural as word n-grams (sklearn's
    CountVectorizer restricted to the entities), multi-word entities included.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from i2d2.comparatives.entities import Entity

log = logging.getLogger(__name__)

TOKEN_PATTERN = r"(?u)\b\w[\w'-]*\b"  # keeps 'yo-yo' and "children's" one token, as entity names have them


@dataclass(frozen=True)
class FrequencyFilter:
    source: str = "wordfreq"          # 'wordfreq' or the path of a text corpus
    min_count: float = 100.0          # §2.1.3: n = 100 occurrences
    corpus_words: float = 7.0e9       # the corpus the count refers to, for wordfreq (OpenWebText ~ 7e9 words)
    min_entities: int = 2             # §2.1.3: classes with fewer entities afterwards are dropped
    lang: str = "en"

    @property
    def min_zipf(self) -> float:
        """The threshold on wordfreq's Zipf scale (log10 of occurrences per 10^9 words)."""
        return math.log10(self.min_count / self.corpus_words * 1e9)


def _surface_forms(entities: list[Entity]) -> list[tuple[str, ...]]:
    return [tuple(dict.fromkeys(f.lower().strip() for f in (e.name, e.plural))) for e in entities]


def wordfreq_counts(entities: list[Entity], corpus_words: float, lang: str = "en") -> np.ndarray:
    """Expected occurrences of each entity (singular + plural) in ``corpus_words`` words, from wordfreq."""
    from wordfreq import word_frequency

    freq = np.array([sum(word_frequency(f, lang) for f in forms) for forms in _surface_forms(entities)])
    return freq * float(corpus_words)


def corpus_counts(entities: list[Entity], path: str | Path) -> np.ndarray:
    """Occurrences of each entity (singular + plural) as word n-grams in a text file, case-insensitive."""
    from sklearn.feature_extraction.text import CountVectorizer

    path = Path(str(path)).expanduser()  # as the start-up check (data.entity_filter.source) resolves it
    if not path.is_file():
        raise FileNotFoundError(f"entity frequency corpus not found: {path}")
    forms = _surface_forms(entities)
    tokenize = CountVectorizer(token_pattern=TOKEN_PATTERN).build_tokenizer()
    vocab = sorted({" ".join(tokenize(f)) for fs in forms for f in fs} - {""})
    if not vocab:
        return np.zeros(len(entities))
    n_max = max(len(v.split()) for v in vocab)
    vec = CountVectorizer(vocabulary=vocab, ngram_range=(1, n_max), token_pattern=TOKEN_PATTERN, lowercase=True)
    with open(path, encoding="utf-8", errors="replace") as f:
        totals = np.asarray(vec.transform(f).sum(axis=0)).ravel()  # streams the file line by line
    index = vec.vocabulary_
    return np.array([sum(totals[index[" ".join(tokenize(f))]] for f in fs if " ".join(tokenize(f)) in index)
                     for fs in forms], dtype=float)


def entity_counts(entities: list[Entity], cfg: FrequencyFilter) -> np.ndarray:
    if cfg.source == "wordfreq":
        return wordfreq_counts(entities, cfg.corpus_words, cfg.lang)
    return corpus_counts(entities, cfg.source)


def filter_obscure(classes: dict[str, list[Entity]], cfg: FrequencyFilter
                   ) -> tuple[dict[str, list[Entity]], dict]:
    """Drop entities seen fewer than ``cfg.min_count`` times, then classes left with fewer than
    ``cfg.min_entities`` entities. Returns (classes, summary with the dropped names and counts)."""
    if cfg.min_count < 0 or cfg.corpus_words <= 0:
        raise ValueError(f"entity frequency filter: min_count must be >= 0 and corpus_words > 0, got {cfg}")
    entities = [e for ents in classes.values() for e in ents]
    counts = entity_counts(entities, cfg) if entities else np.zeros(0)
    count_of = {id(e): c for e, c in zip(entities, counts)}
    kept = {cls: [e for e in ents if count_of[id(e)] >= cfg.min_count] for cls, ents in classes.items()}
    dropped_entities = sorted({e.name for e in entities if count_of[id(e)] < cfg.min_count})
    out = {cls: ents for cls, ents in kept.items() if len(ents) >= cfg.min_entities}
    summary = {"source": str(cfg.source), "min_count": cfg.min_count,
               "min_zipf": round(cfg.min_zipf, 3) if cfg.source == "wordfreq" else None,
               "n_entities_in": len(entities), "n_entities_out": sum(len(v) for v in out.values()),
               "n_classes_in": len(classes), "n_classes_out": len(out),
               "dropped_entities": dropped_entities,
               "dropped_classes": sorted(set(classes) - set(out)),
               "n_multiword_upper_bound": sum(" " in e.name for e in entities) if cfg.source == "wordfreq" else 0}
    return out, summary


def log_filter_summary(summary: dict) -> None:
    """``filter_obscure``'s summary in one log line: the prompts stage's, not the start-up check's, which runs the
    same filter to refuse one that leaves no pair (logged by both, the line came twice a run)."""
    log.info("entity frequency filter (%s, >= %g occurrences): %d -> %d entities, %d -> %d classes",
             summary["source"], summary["min_count"], summary["n_entities_in"], summary["n_entities_out"],
             summary["n_classes_in"], summary["n_classes_out"])
