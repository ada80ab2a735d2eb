"""Constraint objects for NeuroLogic decoding and their validation.

Matching semantics (shared by the decoder and documented for users):

* Text is split into *words*: maximal runs of letters/digits; every other non-space character
  (punctuation, symbols) is a one-character word; whitespace only separates.
* A literal is a phrase = a sequence of such words.  It occurs in a text when its words occur as
  consecutive words.  Each word also matches with its first letter upper- or lower-cased
  ("the" matches "The"), never as part of a longer word ("the" does not match "there").
* Only the generated continuation is searched; the prompt never counts.
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import lru_cache

WORD_RE = re.compile(r"[^\W_]+|[^\s]", re.UNICODE)  # a letter/digit run, or any single non-space char


class ConstraintError(ValueError):
    """A constraint that cannot be decoded (empty phrase, contradiction, ...); the message names the clause."""


def split_words(text: str) -> list[str]:
    """Words of ``text`` per the matching semantics above."""
    return WORD_RE.findall(text)


def canonical_word(word: str) -> str:
    """The case-folded key of a word: first character lower-cased (``The`` and ``the`` are one word)."""
    return word[:1].lower() + word[1:]


def word_variants(word: str) -> list[str]:
    """Surface forms a literal word matches: lower-case first letter and capitalised first letter."""
    c = canonical_word(word)
    out = [c]
    cap = c[:1].upper() + c[1:]
    if cap != c:
        out.append(cap)
    return out


@dataclass(frozen=True)
class Literal:
    text: str
    positive: bool = True

    def words(self) -> tuple[str, ...]:
        return phrase_words(self.text)


@lru_cache(maxsize=1 << 16)
def phrase_words(text: str) -> tuple[str, ...]:
    """The canonical words of a literal's text (cached: a NeuroComparatives batch re-reads its ~300 dynamic words
    for every prompt of every batch)."""
    return tuple(canonical_word(w) for w in split_words(text))


@dataclass
class Clause:
    """An OR of literals; ``positions``: allowed 1-based ranks in the order clauses get satisfied (NC A.3)."""

    literals: list[Literal]
    positions: list[int] | None = None
    name: str | None = None


@dataclass
class CountConstraint:
    """count(occurrences of any of ``words``) <= ``max_count`` (0 forbids them all)."""

    words: list[str]
    max_count: int
    name: str | None = None


@dataclass
class DynamicClause:
    """A positive clause whose literals are, at every step, the ``top_k`` words of ``words`` that the model
    currently finds most likely (NeuroComparatives' comparative-adjective constraint)."""

    words: list[str]
    top_k: int = 5
    positions: list[int] | None = None
    name: str | None = None


_LITERAL_KEYS = {"text", "positive"}
_CLAUSE_KEYS = {"literals", "positions", "name"}
_COUNT_KEYS = {"words", "max_count", "name"}
_DYNAMIC_KEYS = {"words", "top_k", "positions", "name"}


def _list_of(v, where: str, what: str) -> list:
    """``v`` as a list; a string (iterated it would be its characters: "dog" -> d OR o OR g) or a mapping is refused."""
    if isinstance(v, (str, bytes, Mapping)) or not isinstance(v, Sequence):
        raise ConstraintError(f"{where}: must be a list of {what}, got {v!r}")
    return list(v)


def _flag(v, where: str) -> bool:
    """A literal's ``positive``: a bool (or 0 / 1); a string such as "false" would be truthy."""
    if isinstance(v, (bool, numbers.Integral)) and v in (0, 1):
        return bool(v)
    raise ConstraintError(f"{where}: must be true or false, got {v!r}")


def _integer(v, where: str) -> int:
    """An integer field (``max_count``, ``top_k``): 2 or 2.0, never 1.9, None or a string."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or v != v or abs(v) == float("inf") or int(v) != v:
        raise ConstraintError(f"{where}: must be an integer, got {v!r}")
    return int(v)


def _fields(d, keys: set, where: str, required: tuple) -> dict:
    if not isinstance(d, Mapping):
        raise ConstraintError(f"{where}: must be a mapping, got {d!r}")
    unknown = set(d) - keys
    if unknown:
        raise ConstraintError(f"{where}: unknown keys {sorted(map(str, unknown))} (allowed: {sorted(keys)})")
    for k in required:
        if k not in d:
            raise ConstraintError(f"{where}: missing {k!r}")
    return d


def _positions(v):
    """A positions list as a list (a YAML / OmegaConf sequence included); anything else is left for validate()."""
    return list(v) if isinstance(v, Sequence) and not isinstance(v, (str, bytes)) else v


def _lit(d, where: str = "literal") -> Literal:
    if isinstance(d, Literal):
        return d
    if isinstance(d, str):
        return Literal(d)
    if isinstance(d, Sequence) and not isinstance(d, bytes):
        if not 1 <= len(d) <= 2:
            raise ConstraintError(f"{where}: a literal list is [text] or [text, positive], got {d!r}")
        return Literal(d[0], _flag(d[1], f"{where}[1]") if len(d) > 1 else True)
    d = _fields(d, _LITERAL_KEYS, where, ("text",))
    return Literal(d["text"], _flag(d.get("positive", True), f"{where}.positive"))


@dataclass
class ConstraintSet:
    clauses: list[Clause] = field(default_factory=list)
    counts: list[CountConstraint] = field(default_factory=list)
    dynamic: list[DynamicClause] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "clauses": [{"literals": [asdict(l) for l in c.literals], "positions": c.positions, "name": c.name}
                        for c in self.clauses],
            "counts": [asdict(c) for c in self.counts],
            "dynamic": [asdict(d) for d in self.dynamic],
        }

    @classmethod
    def from_dict(cls, d: dict | None) -> "ConstraintSet":
        if d is None:
            return cls()
        if isinstance(d, ConstraintSet):
            return d
        w = "ConstraintSet.from_dict"
        d = _fields(d, {"clauses", "counts", "dynamic"}, w, ())

        def items(key):
            return _list_of(d.get(key) or [], f"{w}: {key}", "mappings")

        clauses = []
        for i, c in enumerate(items("clauses")):
            at = f"{w}: clauses[{i}]"
            c = _fields(c, _CLAUSE_KEYS, at, ("literals",))
            lits = _list_of(c["literals"], f"{at}.literals", "literals")
            clauses.append(Clause([_lit(l, f"{at}.literals[{j}]") for j, l in enumerate(lits)],
                                  _positions(c.get("positions")), c.get("name")))
        counts = []
        for i, c in enumerate(items("counts")):
            at = f"{w}: counts[{i}]"
            c = _fields(c, _COUNT_KEYS, at, ("words", "max_count"))
            counts.append(CountConstraint(_list_of(c["words"], f"{at}.words", "words"),
                                          _integer(c["max_count"], f"{at}.max_count"), c.get("name")))
        dynamic = []
        for i, c in enumerate(items("dynamic")):
            at = f"{w}: dynamic[{i}]"
            c = _fields(c, _DYNAMIC_KEYS, at, ("words",))
            dynamic.append(DynamicClause(_list_of(c["words"], f"{at}.words", "words"),
                                         _integer(c.get("top_k", 5), f"{at}.top_k"),
                                         _positions(c.get("positions")), c.get("name")))
        return cls(clauses, counts, dynamic)

    def labels(self) -> list[str]:
        """Names used for clauses then dynamic clauses (the order of Generation.satisfied)."""
        out = [c.name or f"clause {i} ({' OR '.join(('' if l.positive else 'NOT ') + repr(l.text) for l in c.literals)})"
               for i, c in enumerate(self.clauses)]
        out += [d.name or f"dynamic clause {i}" for i, d in enumerate(self.dynamic)]
        return out


def validate(cs: ConstraintSet, encode=None, where: str = "", checked: set | None = None) -> None:
    """Raise ConstraintError naming the clause for malformed constraints.

    ``encode(text) -> list[int]`` (the tokenizer) checks that every phrase tokenizes to something.
    ``checked``: word lists (tuples) already found well formed with this ``encode``, kept by the caller across
    sets: NeuroComparatives' ~300 comparatives and its forbidden words repeat in every prompt's set.
    """
    pre = f"{where}: " if where else ""
    for i, c in enumerate(cs.clauses):  # before labels(), which reads every literal
        if isinstance(c.literals, str) or not all(isinstance(l, Literal) for l in c.literals):
            raise ConstraintError(f"{pre}{c.name or f'clause {i}'}: literals must be a list of Literal, "
                                  f"got {c.literals!r}")
    labels = cs.labels()

    def check_text(text, label, kind="literal"):
        if not isinstance(text, str) or not text.strip():
            raise ConstraintError(f"{pre}{label}: empty {kind} {text!r}")
        if not phrase_words(text):  # cached: a NeuroComparatives batch re-checks its ~300 dynamic words
            raise ConstraintError(f"{pre}{label}: {kind} {text!r} has no words")
        if encode is not None and len(encode(" " + text.strip())) == 0:
            raise ConstraintError(f"{pre}{label}: {kind} {text!r} tokenizes to nothing")

    def check_words(words, label):
        if isinstance(words, str):  # its characters would be the words
            raise ConstraintError(f"{pre}{label}: words must be a list of words, got {words!r}")
        key = tuple(words) if all(isinstance(w, str) for w in words) else None  # else check_text names the bad one
        if checked is not None and key in checked:
            return
        for w in words:
            check_text(w, label, "word")
        if checked is not None and key is not None:
            checked.add(key)

    for i, c in enumerate(cs.clauses):
        if not c.literals:
            raise ConstraintError(f"{pre}{labels[i]}: clause has no literals")
        for l in c.literals:
            check_text(l.text, labels[i])
            # a set built in code skips from_dict's checks: positive="false" would be a required literal
            _flag(l.positive, f"{pre}{labels[i]}: literal {l.text!r}: positive")
        _check_positions(c.positions, f"{pre}{labels[i]}")
    for j, c in enumerate(cs.counts):
        label = c.name or f"count constraint {j}"
        if not c.words:
            raise ConstraintError(f"{pre}{label}: no words")
        if _integer(c.max_count, f"{pre}{label}: max_count") < 0:
            raise ConstraintError(f"{pre}{label}: max_count must be >= 0, got {c.max_count}")
        check_words(c.words, label)
    for j, d in enumerate(cs.dynamic):
        label = labels[len(cs.clauses) + j]
        if not d.words:
            raise ConstraintError(f"{pre}{label}: no words")
        if _integer(d.top_k, f"{pre}{label}: top_k") < 1:
            raise ConstraintError(f"{pre}{label}: top_k must be >= 1, got {d.top_k}")
        check_words(d.words, label)
        _check_positions(d.positions, f"{pre}{label}")
    # a literal both required and forbidden: the forbidden one is the required one or occurs inside it ("hot dog"
    # cannot be written without "dog")
    required = {}
    for i, c in enumerate(cs.clauses):
        if len(c.literals) == 1 and c.literals[0].positive:
            required.setdefault(c.literals[0].words(), labels[i])

    def required_by(words):
        """The label of a required literal that ``words`` occur in, else None."""
        return next((lab for r, lab in required.items() if occurs_in(words, r)), None)

    for i, c in enumerate(cs.clauses):
        by = required_by(c.literals[0].words()) if len(c.literals) == 1 and not c.literals[0].positive else None
        if by:
            raise ConstraintError(f"{pre}{labels[i]}: literal {c.literals[0].text!r} is forbidden here but required "
                                  f"by {by}")
        words = [l.words() for l in c.literals]
        pos = {w for w, l in zip(words, c.literals) if l.positive}
        both = [l.text for w, l in zip(words, c.literals) if not l.positive and w in pos]
        if both:  # (A or not A) is a tautology: almost surely a mistake
            raise ConstraintError(f"{pre}{labels[i]}: literal {both[0]!r} is both required and forbidden in one "
                                  f"clause")
    for j, c in enumerate(cs.counts):
        if int(c.max_count) == 0 and required:
            for w in c.words:
                by = required_by(phrase_words(w))
                if by:
                    raise ConstraintError(f"{pre}{c.name or f'count constraint {j}'}: word {w!r} is forbidden "
                                          f"(max_count=0) but required by {by}")
    # a positive clause whose every literal is forbidden outright can never be satisfied (single-literal ones are
    # caught above); a literal forbidden only inside an OR, or under a max_count >= 1, may still occur
    forbidden = {}  # words -> (text, label) of a one-literal negative clause or a max_count=0 word
    for i, c in enumerate(cs.clauses):
        if len(c.literals) == 1 and not c.literals[0].positive:
            forbidden.setdefault(c.literals[0].words(), (c.literals[0].text, labels[i]))
    for j, c in enumerate(cs.counts):
        if int(c.max_count) == 0:
            for w in c.words:
                forbidden.setdefault(phrase_words(w), (w, f"{c.name or f'count constraint {j}'} (max_count=0)"))

    def forbidding(text):
        """How ``text`` is forbidden (as the message says it), else None."""
        words = phrase_words(text)
        f = next((f for f in forbidden if occurs_in(f, words)), None)
        if f is None:
            return None
        ftext, by = forbidden[f]
        return f"{text!r} by {by}" + ("" if f == words else f" ({ftext!r} occurs in it)")

    if forbidden:
        positive = [(labels[i], [l.text for l in c.literals]) for i, c in enumerate(cs.clauses)
                    if all(l.positive for l in c.literals)]
        positive += [(labels[len(cs.clauses) + j], list(d.words)) for j, d in enumerate(cs.dynamic)]
        for label, texts in positive:
            why = []
            for text in texts:  # stops at the first allowed literal (a NeuroComparatives clause has ~300)
                w = forbidding(text)
                if w is None:
                    break
                why.append(w)
            else:
                raise ConstraintError(f"{pre}{label}: every literal is forbidden elsewhere, so the clause can never "
                                      f"be satisfied: {', '.join(why)}")
    # a clause is ranked when a positive literal of it first occurs, so ranks stop at the number of clauses with one:
    # positions all beyond that leave the clause nothing but its negative literals
    ranked = sum(any(l.positive for l in c.literals) for c in cs.clauses) + len(cs.dynamic)
    for i, c in enumerate(list(cs.clauses) + list(cs.dynamic)):
        has_negative = any(not l.positive for l in getattr(c, "literals", ()))  # a dynamic clause has none
        if c.positions and min(c.positions) > ranked and not has_negative:
            raise ConstraintError(f"{pre}{labels[i]}: positions {list(c.positions)} can never be reached: only "
                                  f"{ranked} clauses can be satisfied in order")


def count_in(part: tuple, whole: tuple) -> int:
    """How many times the words ``part`` occur as consecutive words of ``whole`` (overlaps counted, as the decoder's
    phrase automaton counts them)."""
    n = len(part)
    return sum(whole[k:k + n] == part for k in range(len(whole) - n + 1)) if n else 0


def occurs_in(part: tuple, whole: tuple) -> bool:
    """Whether the words ``part`` occur as consecutive words of ``whole``."""
    n = len(part)
    return any(whole[k:k + n] == part for k in range(len(whole) - n + 1))


def _check_positions(pos, label):
    if pos is None:
        return
    if (not isinstance(pos, (list, tuple)) or not pos
            or any(isinstance(p, bool) or not isinstance(p, numbers.Real) or not 1 <= p <= 62 or p != int(p)
                   for p in pos)):
        raise ConstraintError(f"{label}: positions must be a non-empty list of ints in 1..62, got {pos!r}")
