"""Comparable entities: classes of everyday objects read from JSON, TSV or Wikidata-style class files.

Formats (NeuroComparatives §2.1):
  * JSON: ``{"class": ["entity", {"name": "entity", "plural": "override"}, ...], ...}``
  * TSV:  ``class<TAB>entity[<TAB>plural]`` per line (``#`` comments, optional ``class\tentity`` header)
  * Wikidata-style TSV with header ``id  label  property  parent``: one edge per line, ``property`` is
    ``P31``/``instance_of`` or ``P279``/``subclass_of``. Classes are taken breadth-first up to
    ``max_depth`` levels below the root classes (the paper uses 'physical object' and 'artificial
    physical object', depth 2); a class's entities are its direct instances and subclasses.

Prompts name entities in the plural ("Compared to blenders, food processors"), except mass nouns:
an entity whose head noun (or whole name) is in the uncountable-noun lexicon
(conf/wordlists/uncountable_nouns.txt, its source stated there) stays singular ("Compared to gold,
silver"). Plurals come from ``inflect``. A per-entity ``plural`` in the class file overrides both: a
string is the form used (the entity's own name keeps it singular), ``false`` keeps it singular, ``true``
pluralises a noun the lexicon lists.
"""

from __future__ import annotations

import csv
import functools
from collections import defaultdict, deque
from dataclasses import dataclass
from pathlib import Path

from i2d2.config import CONF_DIR
from i2d2.io import DataError, open_text, read_json, read_text, text_lines

BUNDLED = Path(__file__).resolve().parent.parent / "data" / "comparatives" / "classes.json"
UNCOUNTABLE = CONF_DIR / "wordlists" / "uncountable_nouns.txt"
PLURAL_ONLY = CONF_DIR / "wordlists" / "plural_only_nouns.txt"


@dataclass(frozen=True)
class Entity:
    name: str
    plural: str          # the form prompts use: the plural, or the name itself for a mass noun
    cls: str
    mass: bool | None = None  # None: a mass noun when plural == name (zero plurals 'sheep', 'pliers' need False)

    @property
    def countable(self) -> bool:
        """False for an entity named in the singular (mass noun): its verb agrees in the singular."""
        return not self.mass if self.mass is not None else self.plural.lower() != self.name.lower()


@functools.lru_cache(maxsize=1)
def _inflect():
    import inflect

    return inflect.engine()


@functools.lru_cache(maxsize=8)
def load_lexicon(path: str | Path) -> frozenset[str]:
    """A noun lexicon: one lower-case noun (or multi-word name) a line, '#' comments."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"noun lexicon not found: {path}")
    words = (ln.split("#", 1)[0].strip().lower() for ln in read_text(path).splitlines())
    return frozenset(w for w in words if w)


def load_uncountable(path: str | Path | None = None) -> frozenset[str]:
    """The uncountable-noun lexicon (``conf/wordlists/uncountable_nouns.txt`` by default)."""
    return load_lexicon(path or UNCOUNTABLE)


def split_of(name: str) -> tuple[str, str]:
    """A noun phrase's head part and its "of" tail: 'cup of tea' -> ('cup', ' of tea'), 'statue of a king' ->
    ('statue', ' of a king'), 'rice cooker' -> ('rice cooker', ''). The head part carries the phrase's number."""
    words = name.split()
    lower = [w.lower() for w in words]
    if "of" in lower[1:-1]:
        i = lower.index("of", 1)
        return " ".join(words[:i]), " " + " ".join(words[i:])
    return name, ""


def _in_lexicon(name: str, lexicon: frozenset[str]) -> bool:
    words = name.lower().split()
    head = split_of(" ".join(words))[0].split()
    return bool(words) and (" ".join(words) in lexicon or head[-1] in lexicon)


def is_mass_noun(name: str, lexicon: frozenset[str] | None = None) -> bool:
    """Is the noun phrase a mass noun? Its whole name or its head (last word, before any "of" tail) is in the
    lexicon: 'gold', 'stainless steel', 'cheddar', 'cream of tartar' yes; 'steel beam', 'rice cooker', 'cup of
    tea', 'bag of rice' no (their heads count)."""
    return _in_lexicon(name, load_uncountable() if lexicon is None else lexicon)


def is_plural_only(name: str, lexicon: frozenset[str] | None = None) -> bool:
    """Is the noun phrase plural only ('jeans', 'reading glasses', 'scissors': no singular a sentence uses, where
    inflect would give 'jean' / 'glass')? Its whole name or its head is in ``conf/wordlists/plural_only_nouns.txt``;
    a head with an "of" tail is a count noun's plural ('glasses of water'), so only the whole name counts there."""
    lexicon = load_lexicon(PLURAL_ONLY) if lexicon is None else lexicon
    if split_of(name.strip())[1]:
        return " ".join(name.lower().split()) in lexicon
    return _in_lexicon(name, lexicon)


def pluralize(name: str, lexicon: frozenset[str] | None = None) -> str:
    """The form prompts use: the plural of a (possibly multi-word) noun phrase ('food processor' ->
    'food processors'), or the name unchanged for a mass noun ('gold', 'rice')."""
    name = name.strip()
    if is_mass_noun(name, lexicon):
        return name
    return _inflect().plural_noun(name) or name


def _entity(raw, cls: str, where: str) -> Entity:
    if isinstance(raw, str):
        name, plural = raw.strip(), None
    elif isinstance(raw, dict) and isinstance(raw.get("name"), str):
        name, plural = raw["name"].strip(), raw.get("plural")
    else:
        raise DataError(f"{where}: an entity must be a string or {{'name': ..., 'plural': ...}}, got {raw!r}")
    if not name:
        raise DataError(f"{where}: empty entity name")
    if plural is False:  # a mass noun the lexicon misses
        return Entity(name, name, cls, mass=True)
    if plural is True:  # countable although the lexicon lists it ('tins' in a container class)
        return Entity(name, _inflect().plural_noun(name) or name, cls, mass=False)
    if plural is not None and (not isinstance(plural, str) or not plural.strip()):
        raise DataError(f"{where}: 'plural' must be a non-empty string, true or false, got {plural!r}")
    if plural:
        return Entity(name, plural.strip(), cls)
    # the lexicon decides, not plural == name: 'sheep', 'salmon', 'pliers' are plurals ('sheep are'), not mass nouns
    return Entity(name, pluralize(name), cls, mass=is_mass_noun(name))


def _finish(classes: dict[str, list[Entity]], min_entities: int) -> dict[str, list[Entity]]:
    out = {}
    for cls, ents in classes.items():
        seen, uniq = set(), []
        for e in ents:
            if e.name.lower() not in seen:
                seen.add(e.name.lower())
                uniq.append(e)
        if len(uniq) >= min_entities:  # a class needs at least two entities to make a pair (§2.1.3)
            out[cls] = uniq
    return out


def load_classes_json(path: Path, min_entities: int = 2) -> dict[str, list[Entity]]:
    raw = read_json(path)
    if not isinstance(raw, dict):
        raise DataError(f"{path}: expected an object mapping class names to entity lists")
    classes = {}
    for cls, ents in raw.items():
        if not isinstance(ents, list):
            raise DataError(f"{path}: class {cls!r} must map to a list of entities")
        classes[cls] = [_entity(e, cls, f"{path}: class {cls!r} entity {i}") for i, e in enumerate(ents)]
    return _finish(classes, min_entities)


def load_classes_tsv(path: Path, min_entities: int = 2) -> dict[str, list[Entity]]:
    classes: dict[str, list[Entity]] = defaultdict(list)
    with open_text(path) as f:
        for lineno, row in enumerate(csv.reader(f, delimiter="\t"), 1):
            if not row or not "".join(row).strip() or row[0].startswith("#"):
                continue
            if lineno == 1 and [c.strip().lower() for c in row[:2]] == ["class", "entity"]:
                continue
            if len(row) not in (2, 3) or not row[0].strip() or not row[1].strip():
                raise DataError(f"{path}:{lineno}: expected 'class<TAB>entity[<TAB>plural]', got {row!r}")
            cls = row[0].strip()
            plural = row[2] if len(row) == 3 and row[2].strip() else None
            classes[cls].append(_entity({"name": row[1], "plural": plural}, cls, f"{path}:{lineno}"))
    return _finish(dict(classes), min_entities)


_INSTANCE = {"p31", "instance_of", "instance of"}
_SUBCLASS = {"p279", "subclass_of", "subclass of"}


def load_wikidata_classes(path: Path, roots: list[str] | tuple[str, ...] = ("physical object", "artificial physical object"),
                          max_depth: int = 2, min_entities: int = 2) -> dict[str, list[Entity]]:
    """Classes up to ``max_depth`` subclass levels below ``roots`` (ids or labels) and their direct members."""
    labels: dict[str, str] = {}
    children: dict[str, list[tuple[str, str]]] = defaultdict(list)  # parent -> [(child, property)]
    with open_text(path) as f:
        reader = csv.DictReader(f, delimiter="\t")
        need = {"id", "label", "property", "parent"}
        if not need <= set(reader.fieldnames or []):
            raise DataError(f"{path}:1: header must have columns {sorted(need)}, got {reader.fieldnames}")
        for lineno, row in enumerate(reader, 2):
            prop = (row["property"] or "").strip().lower()
            if prop not in _INSTANCE | _SUBCLASS:
                raise DataError(f"{path}:{lineno}: property must be P31/instance_of or P279/subclass_of, got {row['property']!r}")
            if not (row["id"] or "").strip() or not (row["parent"] or "").strip():
                raise DataError(f"{path}:{lineno}: empty id or parent")
            node, parent = row["id"].strip(), row["parent"].strip()
            labels[node] = (row["label"] or node).strip()
            children[parent].append((node, "subclass" if prop in _SUBCLASS else "instance"))
    by_label = defaultdict(list)
    for node, lab in labels.items():
        by_label[lab.lower()].append(node)
    start = []
    for r in roots:
        ids = [r] if r in children or r in labels else by_label.get(r.lower(), [])
        if not ids:
            raise DataError(f"{path}: root class {r!r} not found (by id or label)")
        start += ids
    depth = {s: 0 for s in start}
    queue = deque(start)
    while queue:  # breadth-first over subclass edges
        node = queue.popleft()
        if depth[node] >= max_depth:
            continue
        for child, kind in children.get(node, []):
            if kind == "subclass" and child not in depth:
                depth[child] = depth[node] + 1
                queue.append(child)
    classes = {}
    for node, d in depth.items():
        if d == 0:
            continue
        cls = labels.get(node, node)
        classes[cls] = [_entity(labels.get(c, c), cls, f"{path}: {c}") for c, _ in children.get(node, [])]
    return _finish(classes, min_entities)


FORMATS = ("auto", "json", "tsv", "wikidata")  # data.format


def load_classes(path: str | Path | None = None, fmt: str = "auto", min_entities: int = 2,
                 wikidata_roots=("physical object", "artificial physical object"), wikidata_depth: int = 2
                 ) -> dict[str, list[Entity]]:
    """Load class -> entities from ``path`` (default: the bundled classes); ``fmt`` json|tsv|wikidata|auto."""
    path = Path(str(path)).expanduser() if path else BUNDLED  # "~/classes.tsv", as the other input paths
    if not path.exists():
        raise FileNotFoundError(f"entity class file not found: {path}")
    if fmt == "auto":
        if path.suffix.lower() == ".json":
            fmt = "json"
        else:
            first = next(text_lines(path), "").lower().split("\t")
            fmt = "wikidata" if {"id", "property", "parent"} <= {c.strip() for c in first} else "tsv"
    if fmt == "json":
        return load_classes_json(path, min_entities)
    if fmt == "tsv":
        return load_classes_tsv(path, min_entities)
    if fmt == "wikidata":
        return load_wikidata_classes(path, list(wikidata_roots), wikidata_depth, min_entities)
    raise ValueError(f"unknown class file format {fmt!r} ({', '.join(FORMATS)})")
