"""Seed-concept loaders for I2D2 prompt construction (i2d2.txt §2.1, A.1).

Formats (``format:`` of a source in ``conf/data/generics.yaml``):

* ``lines``      one concept per line; blank lines and ``#`` comments are ignored.
* ``jsonl``      one object per line: ``{"concept": "hotel", "kind": "noun", "related": ["credit card"]}``;
                 ``kind`` and ``related`` are optional (``plural: true`` marks a plural noun phrase).
* ``genericskb`` GenericsKB TSV (header with ``term`` and ``generic_sentence`` columns); a term becomes a
                 concept when it has at least ``min_statements`` generic sentences (5 in the paper).
* ``conceptnet`` ConceptNet assertions CSV (tab separated: edge URI, relation, start, end, JSON info);
                 English start nodes with a configured relation (``/r/IsA``) to a configured target
                 (``artifact``, ``person`` ...) become concepts; ``/r/RelatedTo`` edges give related concepts.

A malformed line raises :class:`i2d2.io.DataError` naming ``file:line`` (``on_error='raise'``) or is skipped
and its message appended to ``errors`` (``on_error='skip'``).
"""

from __future__ import annotations

import csv
import inspect
import re
from collections import Counter, OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from i2d2.io import DataError, iter_jsonl, text_lines

KINDS = ("noun", "goal")
FORMATS = ("lines", "jsonl", "genericskb", "conceptnet")
# A concept is words of letters/digits joined by spaces, hyphens, apostrophes, periods or slashes.
_CONCEPT_RE = re.compile(r"^[^\W_](?:[\w'’.\-/ ]*[\w.])?$", re.UNICODE)


@dataclass
class Concept:
    text: str
    kind: str = "noun"
    related: list[str] = field(default_factory=list)
    source: str = ""                 # "file:line" it came from
    relations: str | None = None     # name of the relational-phrase list to pair it with (nouns)
    plural: bool | None = None       # None: guess the number with inflect


class _Reporter:
    def __init__(self, path: Path, on_error: str, errors: list | None):
        if on_error not in ("skip", "raise"):
            raise ValueError(f"on_error must be 'skip' or 'raise', got {on_error!r}")
        self.path, self.on_error, self.errors = path, on_error, errors

    def __call__(self, lineno: int, msg: str) -> None:
        text = f"{self.path}:{lineno}: {msg}"
        if self.on_error == "raise":
            raise DataError(text)
        if self.errors is not None:
            self.errors.append(text)


def validate_concept(text, max_words: int = 8) -> str:
    """Normalised concept text, or ValueError saying what is wrong with it."""
    if not isinstance(text, str):
        raise ValueError(f"concept must be a string, got {type(text).__name__}")
    if "\t" in text:
        raise ValueError("concept contains a tab (a TSV line? use format: genericskb)")
    norm = " ".join(text.split())
    if not norm:
        raise ValueError("empty concept")
    if not _CONCEPT_RE.match(norm) or not any(c.isalpha() for c in norm):
        raise ValueError(f"not a noun phrase or goal: {norm!r}")
    if len(norm.split()) > max_words:
        raise ValueError(f"concept has {len(norm.split())} words (max_words={max_words}): {norm!r}")
    return norm


def load_lines(path, kind: str = "noun", on_error: str = "skip", errors: list | None = None,
               max_words: int = 8) -> list[Concept]:
    path = Path(path)
    report = _Reporter(path, on_error, errors)
    out = []
    for lineno, line in enumerate(text_lines(path), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            text = validate_concept(line.rstrip("\n"), max_words)
        except ValueError as e:
            report(lineno, str(e))
            continue
        out.append(Concept(text, kind, source=f"{path.name}:{lineno}"))
    return out


def load_jsonl(path, kind: str = "noun", on_error: str = "skip", errors: list | None = None,
               max_words: int = 8) -> list[Concept]:
    path = Path(path)
    report = _Reporter(path, on_error, errors)
    out = []
    for lineno, row, problem in iter_jsonl(path):
        try:
            if problem is not None:
                raise ValueError(problem)
            if "concept" not in row:
                raise ValueError("missing field 'concept'")
            text = validate_concept(row["concept"], max_words)
            k = row.get("kind", kind)
            if k not in KINDS:
                raise ValueError(f"field 'kind' must be one of {KINDS}, got {k!r}")
            related = row.get("related", [])
            if isinstance(related, str):
                related = [related]
            if not isinstance(related, list):
                raise ValueError("field 'related' must be a list of strings")
            related = [validate_concept(r, max_words) for r in related]
            plural = row.get("plural")
            if plural is not None and not isinstance(plural, bool):
                raise ValueError("field 'plural' must be true or false")
        except ValueError as e:
            report(lineno, str(e))
            continue
        out.append(Concept(text, k, related=_dedupe(related), source=f"{path.name}:{lineno}", plural=plural))
    return out


def load_genericskb(path, on_error: str = "skip", errors: list | None = None, min_statements: int = 5,
                    term_column: str = "term", sentence_column: str = "generic_sentence",
                    min_score: float | None = None, score_column: str = "score", max_words: int = 8) -> list[Concept]:
    """Terms with at least ``min_statements`` generic sentences, in order of first appearance."""
    path = Path(path)
    report = _Reporter(path, on_error, errors)
    counts: Counter = Counter()
    names: dict[str, str] = {}
    first_line: "OrderedDict[str, int]" = OrderedDict()
    reader = csv.reader(text_lines(path), delimiter="\t", quoting=csv.QUOTE_NONE)
    header = next(reader, None)
    if header is None:
        raise DataError(f"{path}:1: empty file, expected a GenericsKB TSV header")
    missing = [c for c in (term_column, sentence_column) if c not in header]
    if missing:
        raise DataError(f"{path}:1: header lacks column(s) {', '.join(missing)} (has {', '.join(header)})")
    ti, si = header.index(term_column), header.index(sentence_column)
    sc = header.index(score_column) if min_score is not None and score_column in header else None
    for row in reader:
        lineno = reader.line_num
        if not row or all(not c.strip() for c in row):
            continue
        try:
            if len(row) != len(header):
                raise ValueError(f"expected {len(header)} tab-separated columns, got {len(row)}")
            term = validate_concept(row[ti], max_words)
            if not row[si].strip():
                raise ValueError(f"empty {sentence_column}")
            if sc is not None:
                try:
                    score = float(row[sc])
                except ValueError:
                    raise ValueError(f"{score_column} is not a number: {row[sc]!r}") from None
                if score < min_score:
                    continue
        except ValueError as e:
            report(lineno, str(e))
            continue
        key = term.lower()
        counts[key] += 1
        first_line.setdefault(key, lineno)
        names.setdefault(key, term)
    return [Concept(names[k], "noun", source=f"{path.name}:{ln}") for k, ln in first_line.items()
            if counts[k] >= min_statements]


def conceptnet_text(uri: str, language: str = "en") -> str:
    """``/c/en/credit_card/n/wn/artifact`` -> ``credit card``; ValueError for other languages/shapes."""
    parts = uri.split("/")
    if len(parts) < 4 or parts[1] != "c" or not parts[3]:
        raise ValueError(f"not a ConceptNet concept URI: {uri!r}")
    if parts[2] != language:
        raise LookupError(parts[2])
    return parts[3].replace("_", " ")


def load_conceptnet(path, on_error: str = "skip", errors: list | None = None, relations: Iterable[str] = ("/r/IsA",),
                    targets: Iterable[str] = ("artifact", "person"),
                    related_relations: Iterable[str] = ("/r/RelatedTo",),
                    max_related: int = 5, language: str = "en", delimiter: str = "\t",
                    max_words: int = 8) -> list[Concept]:
    """Concepts with an edge ``relation`` to one of ``targets``, with related concepts from ``related_relations``."""
    path = Path(path)
    report = _Reporter(path, on_error, errors)
    relations, targets, related_relations = set(relations), {t.lower() for t in targets}, set(related_relations)
    concepts: "OrderedDict[str, Concept]" = OrderedDict()
    related: dict[str, list[str]] = {}
    reader = csv.reader(text_lines(path), delimiter=delimiter, quoting=csv.QUOTE_NONE)
    for row in reader:
        lineno = reader.line_num
        if not row or all(not c.strip() for c in row):
            continue
        try:
            if len(row) < 4:
                raise ValueError(f"expected >= 4 columns (edge, relation, start, end), got {len(row)}")
            rel, start, end = row[1], row[2], row[3]
            if not rel.startswith("/r/"):
                raise ValueError(f"not a ConceptNet relation URI: {rel!r}")
            if rel not in relations and rel not in related_relations:
                continue
            try:
                head, tail = conceptnet_text(start, language), conceptnet_text(end, language)
            except LookupError:
                continue  # another language: not an error
            head = validate_concept(head, max_words)
            tail = validate_concept(tail, max_words)
        except ValueError as e:
            report(lineno, str(e))
            continue
        if rel in relations and tail.lower() in targets:
            concepts.setdefault(head.lower(), Concept(head, "noun", source=f"{path.name}:{lineno}"))
        if rel in related_relations and head.lower() != tail.lower():
            related.setdefault(head.lower(), []).append(tail)
    for key, c in concepts.items():
        c.related = _dedupe(related.get(key, []))[:max_related]
    return list(concepts.values())


def _dedupe(items: Iterable[str]) -> list[str]:
    seen, out = set(), []
    for x in items:
        if x.lower() not in seen:
            seen.add(x.lower())
            out.append(x)
    return out


def resolve_path(path: str, base_dir: str | None) -> Path:
    """Absolute paths as given; relative ones against ``base_dir`` (None: the bundled i2d2/data/generics)."""
    p = Path(str(path)).expanduser()
    if p.is_absolute():
        return p
    base = Path(base_dir).expanduser() if base_dir else Path(__file__).parent / "data" / "generics"
    return base / p


def data_files(cfg_data) -> list[Path]:
    """Every file the prompt builder reads for ``cfg_data`` (enabled concept sources, relational-phrase lists, the
    noun lexicons that decide a noun's number), resolved as the loaders resolve them: stages fingerprint these files'
    bytes, so an edited concepts.txt is a new input even though its path is the same."""
    from i2d2.comparatives.entities import PLURAL_ONLY, UNCOUNTABLE

    base = cfg_data.get("dir")
    paths = [resolve_path(src["path"], base) for src in (cfg_data.get("sources") or {}).values() if src]
    paths += [resolve_path(rel, base) for rel in (cfg_data.get("relations") or {}).values() if rel]
    return paths + [UNCOUNTABLE, PLURAL_ONLY]


SOURCE_KEYS = ("path", "format", "kind", "relations", "max_concepts", "options", "on_error")


def check_sources(cfg_data) -> None:
    """Every enabled ``data.sources`` entry (``check_source``), before any work."""
    if cfg_data.get("on_error") not in (None, "skip", "raise"):
        raise ValueError(f"data.on_error: must be skip or raise, got {cfg_data.get('on_error')!r}")
    relations = cfg_data.get("relations") or {}
    for name, src in (cfg_data.get("sources") or {}).items():
        if src:  # null: the source is off
            check_source(src, cfg_data.get("dir"), relations, f"data.sources.{name}")
            rel = str(src.get("relations") or "general")  # the list its nouns are paired with (candidate_groups)
            path = resolve_path(relations[rel], cfg_data.get("dir")) if rel in relations else None
            if src.get("kind", "noun") == "noun" and path is not None and not path.is_file():
                # was a bare FileNotFoundError in the prompts stage
                raise FileNotFoundError(f"data.relations.{rel}: relational-phrase file not found: {path} "
                                        f"(used by data.sources.{name})")


def check_source(src, base_dir: str | None = None, relations=None, where: str = "source") -> None:
    """One ``data.sources`` entry as ``load_source`` reads it: known keys, format, kind, on_error, a cap that is null
    or >= 1, a relational-phrase list that ``relations`` (data.relations; None: not checked) names, an existing file.
    A ValueError (FileNotFoundError for the file) names ``<where>.<key>``."""
    if not isinstance(src, Mapping):
        raise ValueError(f"{where}: must be a map of {list(SOURCE_KEYS)} or null (off), got {src!r}")
    unknown = sorted(set(src) - set(SOURCE_KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; known: {list(SOURCE_KEYS)}")
    if not src.get("path"):
        raise ValueError(f"{where}.path: required (the concept file)")
    for key, allowed in (("format", FORMATS), ("kind", KINDS), ("on_error", (None, "skip", "raise"))):
        if key in src and src[key] not in allowed:
            raise ValueError(f"{where}.{key}: must be one of {[a for a in allowed if a]}, got {src[key]!r}")
    cap = src.get("max_concepts")
    if cap is not None and not (isinstance(cap, int) and not isinstance(cap, bool) and cap >= 1):
        raise ValueError(f"{where}.max_concepts: must be null (all) or an integer >= 1, got {cap!r}")
    if src.get("options") is not None and not isinstance(src["options"], Mapping):
        raise ValueError(f"{where}.options: must be a map of the {src.get('format', 'lines')} loader's options")
    known = _loader_options(src.get("format", "lines"))
    unknown = sorted(set(src.get("options") or {}) - set(known))
    if unknown:  # a misspelt option was a TypeError from the loader in the prompts stage
        raise ValueError(f"{where}.options: unknown option(s) {unknown} for format {src.get('format', 'lines')}; "
                         f"known: {known}")
    rel = src.get("relations")
    if relations is not None and rel is not None and str(rel) not in relations:
        raise ValueError(f"{where}.relations: {rel!r} is not a relational-phrase list of data.relations "
                         f"({', '.join(map(str, relations))})")
    path = resolve_path(src["path"], base_dir)
    if not path.is_file():
        raise FileNotFoundError(f"{where}.path: concept file not found: {path}")


def _loader_options(fmt: str) -> list[str]:
    """The ``options`` a format's loader takes: its keyword arguments other than those load_source passes itself."""
    loader = {"genericskb": load_genericskb, "conceptnet": load_conceptnet}.get(fmt)
    if loader is None:  # lines, jsonl: load_source passes them no options
        return []
    return [p for p in inspect.signature(loader).parameters if p not in ("path", "on_error", "errors", "max_words")]


def load_source(src: dict, base_dir: str | None = None, on_error: str = "skip", errors: list | None = None,
                max_words: int = 8) -> list[Concept]:
    """Load one ``sources.<name>`` entry of the data config (checked by ``check_source`` first)."""
    check_source(src, base_dir)
    fmt = src.get("format", "lines")
    path = resolve_path(src["path"], base_dir)
    on_error = src.get("on_error") or on_error
    kind = src.get("kind", "noun")
    opts = dict(src.get("options") or {})
    if fmt == "lines":
        out = load_lines(path, kind, on_error, errors, max_words)
    elif fmt == "jsonl":
        out = load_jsonl(path, kind, on_error, errors, max_words)
    elif fmt == "genericskb":
        out = load_genericskb(path, on_error, errors, max_words=max_words, **opts)
    else:
        out = load_conceptnet(path, on_error, errors, max_words=max_words, **opts)
    for c in out:
        if c.kind == "noun":
            c.relations = src.get("relations")
    limit = src.get("max_concepts")
    return out if limit is None else out[: int(limit)]


def load_concepts(cfg_data, errors: list | None = None) -> list[Concept]:
    """All concepts of the enabled sources (a source set to null is off), de-duplicated per kind."""
    sources = cfg_data.get("sources") or {}
    merged: "OrderedDict[tuple[str, str], Concept]" = OrderedDict()
    for name, src in sources.items():
        if not src:
            continue
        for c in load_source(src, cfg_data.get("dir"), cfg_data.get("on_error", "skip"), errors,
                             int(cfg_data.get("max_words", 8))):
            key = (c.kind, c.text.lower())
            if key in merged:
                merged[key].related = _dedupe(merged[key].related + c.related)
            else:
                merged[key] = c
    return list(merged.values())


def load_phrases(path: Path) -> list[str]:
    """A relational-phrase list: one phrase per line, ``#`` comments and blanks ignored."""
    out = []
    for lineno, line in enumerate(text_lines(path), 1):
        s = " ".join(line.split())
        if not s or s.startswith("#"):
            continue
        if not all(w.replace("'", "").isalpha() for w in s.split()):
            raise DataError(f"{path}:{lineno}: relational phrase must be words, got {s!r}")
        out.append(s)
    if not out:
        raise DataError(f"{path}: no relational phrases")
    return _dedupe(out)
