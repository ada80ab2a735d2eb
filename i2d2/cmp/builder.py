"""Quintuple collection from local files (§3.2.2 + §3.2.3).

Inputs (all local):
  * statements JSONL: ``{"entity", "property", "value", "category"}`` (+ optional alias lists
    ``entity_aliases``, ``property_aliases``, ``value_aliases``) — Wikidata-style (e, p, v) facts;
    ``category`` is the entity's 'instance of' value;
  * paragraphs: a ``.jsonl`` with a ``text`` field per paragraph, or a text file with paragraphs
    separated by blank lines (news / encyclopedia text);
  * articles JSONL: ``{"title", "text"}``, one descriptive document per entity (Wikipedia-style).

A statement is linked to a paragraph sentence when aliases of its entity, property and value all
appear in it. Two linked statements become a quintuple when (1) their entities share a category,
(2) their properties are equal and (3) their sentences co-occur in one paragraph. Each entity's
document is its article cut to the 10-sentence segment holding the sentence that states the value.

    python -m i2d2.cmp.builder --statements s.jsonl --paragraphs p.txt --articles a.jsonl --out q.jsonl
"""

from __future__ import annotations

import argparse
import sys
import itertools
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from tqdm.auto import tqdm

from i2d2.cmp.data import Quintuple, write_quintuples
from i2d2.cmp.textualize import segment_for, split_sentences
from i2d2.io import DataError, iter_jsonl, read_text


@dataclass(frozen=True)
class Statement:
    entity: str
    property: str
    value: str
    category: str
    entity_aliases: tuple[str, ...] = field(default=())
    property_aliases: tuple[str, ...] = field(default=())
    value_aliases: tuple[str, ...] = field(default=())

    def names(self, part: str) -> tuple[str, ...]:
        return (getattr(self, part), *getattr(self, f"{part}_aliases"))


def _jsonl_rows(path, fields, numbers: bool = False) -> list[tuple[int, dict]]:
    """(line, row) for each row of a JSONL file; a broken line, or a field that is missing or not a non-empty
    string (or number, with ``numbers``), is a DataError naming file:line and the field, not a traceback later."""
    kinds = (str, int, float) if numbers else (str,)
    out = []
    for lineno, row, problem in iter_jsonl(path):
        if problem is None:
            missing = [k for k in fields if row.get(k) in (None, "")]
            wrong = [f"'{k}' ({type(row[k]).__name__})" for k in fields if k not in missing and (
                isinstance(row[k], bool) or not isinstance(row[k], kinds) or not str(row[k]).strip())]
            problem = f"missing field(s) {', '.join(missing)}" if missing else \
                f"field(s) {', '.join(wrong)} must be {'text or a number' if numbers else 'text'}" if wrong else None
        if problem is not None:
            raise DataError(f"{path}:{lineno}: {problem}")
        out.append((lineno, row))
    return out


def load_statements(path) -> list[Statement]:
    out = []
    for lineno, r in _jsonl_rows(path, ("entity", "property", "value", "category"), numbers=True):
        kw = {}
        for k in ("entity_aliases", "property_aliases", "value_aliases"):
            v = r.get(k, [])
            if not isinstance(v, list) or not all(isinstance(a, str) for a in v):
                raise DataError(f"{path}:{lineno}: field '{k}' must be a list of strings")
            kw[k] = tuple(v)
        out.append(Statement(str(r["entity"]), str(r["property"]), str(r["value"]), str(r["category"]), **kw))
    return out


def load_paragraphs(path) -> list[str]:
    path = Path(path)
    if path.suffix == ".jsonl":
        return [r["text"] for _, r in _jsonl_rows(path, ("text",))]
    return [" ".join(p.split()) for p in re.split(r"\n\s*\n", read_text(path)) if p.strip()]


def load_articles(path) -> dict[str, str]:
    return {r["title"]: r["text"] for _, r in _jsonl_rows(path, ("title", "text"))}


def _alias_regex(names) -> re.Pattern:
    alts = sorted({n.lower() for n in names if n}, key=len, reverse=True)
    return re.compile(r"(?<!\w)(" + "|".join(map(re.escape, alts)) + r")(?!\w)")


class Linker:
    """Finds the statements stated by a sentence: one regex pass over all entity aliases narrows the
    candidates, then each candidate's property and value aliases are checked."""

    def __init__(self, statements: list[Statement]):
        self.by_alias: dict[str, list[Statement]] = defaultdict(list)
        for s in statements:
            for a in s.names("entity"):
                self.by_alias[a.lower()].append(s)
        self.entity_re = _alias_regex(self.by_alias) if self.by_alias else None

    @staticmethod
    def _has(sentence: str, names) -> bool:
        return any(re.search(r"(?<!\w)" + re.escape(n.lower()) + r"(?!\w)", sentence) for n in names)

    def link(self, sentence: str) -> list[Statement]:
        if self.entity_re is None:
            return []
        low = sentence.lower()
        cands = {s for m in self.entity_re.finditer(low) for s in self.by_alias[m.group(1)]}
        return [s for s in cands if self._has(low, s.names("property")) and self._has(low, s.names("value"))]


def build_quintuples(statements: list[Statement], paragraphs: list[str], articles: dict[str, str],
                     segment_sentences: int = 10, progress: bool = True) -> tuple[list[Quintuple], dict]:
    linker = Linker(statements)
    seen, rows = set(), []
    stats = {"paragraphs": len(paragraphs), "linked_statements": 0, "pairs": 0, "no_article": 0, "no_link_in_article": 0}
    for pi, par in enumerate(tqdm(paragraphs, desc="link paragraphs", disable=not progress)):
        linked = {s for sent in split_sentences(par) for s in linker.link(sent)}
        stats["linked_statements"] += len(linked)
        for s1, s2 in itertools.combinations(sorted(linked, key=lambda s: (s.entity, s.property, s.value)), 2):
            if s1.entity == s2.entity or s1.category != s2.category or s1.property != s2.property:
                continue
            key = (s1.entity, s2.entity, s1.property)
            if key in seen:
                continue
            seen.add(key)
            stats["pairs"] += 1
            docs = []
            for s in (s1, s2):
                art = next((articles[n] for n in s.names("entity") if n in articles), None)
                if art is None:
                    stats["no_article"] += 1
                    break
                aliases = {s.entity: list(s.entity_aliases), s.property: list(s.property_aliases),
                           s.value: list(s.value_aliases)}
                seg = segment_for(art, s.entity, s.property, s.value, segment_sentences, aliases)
                if seg is None:
                    stats["no_link_in_article"] += 1
                    break
                docs.append(seg)
            if len(docs) == 2:
                rows.append(Quintuple(e1=s1.entity, e2=s2.entity, property=s1.property, v1=s1.value, v2=s2.value,
                                      doc1=docs[0], doc2=docs[1], id=f"built-{len(rows):06d}", category=s1.category,
                                      source=f"paragraph:{pi}"))
    stats["quintuples"] = len(rows)
    return rows, stats


def main(argv=None):
    ap = argparse.ArgumentParser(description="Collect CMP quintuples from local statements, paragraphs and articles")
    ap.add_argument("--statements", required=True)
    ap.add_argument("--paragraphs", required=True)
    ap.add_argument("--articles", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--segment-sentences", type=int, default=10)
    a = ap.parse_args(argv)
    try:  # bad input: one line naming the file (and line / field), exit status 2, as the other CLIs
        inputs = load_statements(a.statements), load_paragraphs(a.paragraphs), load_articles(a.articles)
    except (DataError, OSError, UnicodeDecodeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rows, stats = build_quintuples(*inputs, a.segment_sentences)
    print(stats)
    if not rows:  # an empty corpus file would only fail later, in pre-training, far from its cause
        print(f"error: no quintuple could be built (counts above), nothing written to {a.out}", file=sys.stderr)
        return 1
    write_quintuples(a.out, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
