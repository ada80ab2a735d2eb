"""Quintuple textualization (§3.2.3): synthetic QA pairs (Table 1), summaries, document segments."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from i2d2.cmp.data import BUNDLED, Quintuple
from i2d2.io import read_text


@dataclass(frozen=True)
class QAPair:
    template: str     # template id, e.g. 'same_value' (see TEMPLATES)
    question: str
    answer: str


# Table 1. 'all' templates apply to every quintuple, 'diff' ones when v1 != v2, 'same' ones when v1 == v2.
TEMPLATES = {
    "same_value": "all",      # Do e1 and e2 have the same/different value of p?  -> yes/no
    "both_value": "all",      # Do e1 and e2 both have the value of v1 in terms of p?  -> yes/no
    "what_values": "all",     # What are the p of e1 and e2?  -> v1, v2
    "which_entity": "diff",   # Which one of the following entity's p is v1? e1 or e2?  -> e1
    "v1_or_v2": "diff",       # Is e1's p v1 or v2?  -> v1
    "same_as": "same",        # Which entity has the same value as e1 in terms of p?  -> e2
    "known_for": "same",      # e1 and e2 are known for what value of p?  -> v1
}


def _bit(key: str, salt: str) -> bool:
    """A stable pseudo-random bit per quintuple: picks surface variants without a global RNG."""
    return hashlib.sha1(f"{salt}|{key}".encode()).digest()[0] & 1 == 1


def _cap(s: str) -> str:
    return s[:1].upper() + s[1:]


def _key(q: Quintuple) -> str:
    return q.id or f"{q.e1}|{q.e2}|{q.property}|{q.v1}|{q.v2}"


def qa_pairs(q: Quintuple, polarity: str | None = None, swap_options: bool | None = None) -> list[QAPair]:
    """Every Table 1 template that applies to ``q`` (3 'All' + 2 of the v1≠v2 / v1=v2 branch).

    ``polarity`` ('same' | 'different') picks the wording of the first template and ``swap_options``
    the order in which the two options of a choice question are offered; by default both are fixed
    per quintuple by a hash, so the corpus holds both wordings and no positional shortcut.
    """
    e1, e2, p, v1, v2 = q.e1, q.e2, q.property, q.v1, q.v2
    same = q.same
    yes, no = "yes", "no"
    if polarity is None:
        polarity = "different" if _bit(_key(q), "polarity") else "same"
    if swap_options is None:
        swap_options = _bit(_key(q), "options")
    if polarity == "same":
        out = [QAPair("same_value", f"Do {e1} and {e2} have the same value of {p}?", yes if same else no)]
    elif polarity == "different":
        out = [QAPair("same_value", f"Do {e1} and {e2} have different values of {p}?", no if same else yes)]
    else:
        raise ValueError(f"polarity must be 'same' or 'different', got {polarity!r}")
    out.append(QAPair("both_value", f"Do {e1} and {e2} both have the value of {v1} in terms of {p}?",
                      yes if same else no))
    out.append(QAPair("what_values", f"What are the {p} of {e1} and {e2}?", v1 if same else f"{v1}, {v2}"))
    if not same:
        a, b = (e2, e1) if swap_options else (e1, e2)
        out.append(QAPair("which_entity", f"Which one of the following entity's {p} is {v1}? {a} or {b}?", e1))
        a, b = (v2, v1) if swap_options else (v1, v2)
        out.append(QAPair("v1_or_v2", f"Is {e1}'s {p} {a} or {b}?", v1))
    else:
        out.append(QAPair("same_as", f"Which entity has the same value as {e1} in terms of {p}?", e2))
        out.append(QAPair("known_for", _cap(f"{e1} and {e2} are known for what value of {p}?"), v1))
    return out


# ----------------------------------------------------------------------------- summaries

class TemplateRealiser:
    """Turns a quintuple into one declarative comparative sentence.

    ``phrases`` maps a property to a verb phrase with ``{v}`` (e.g. ``"continent": "is located in {v}"``);
    keys may be 'category|property' or a bare property; properties without a phrase get the generic
    "X's p is v" wording. ``{a}`` in a phrase is the indefinite article of the value.
    """

    def __init__(self, phrases: dict | str | Path | None = "bundled"):
        if phrases == "bundled":
            phrases = BUNDLED / "property_phrases.json"
        if isinstance(phrases, (str, Path)):
            phrases = json.loads(read_text(phrases))
        self.phrases = dict(phrases or {})

    def _phrase(self, q: Quintuple) -> str | None:
        return self.phrases.get(f"{q.category}|{q.property}") or self.phrases.get(q.property)

    @staticmethod
    def _fill(phrase: str, v: str) -> str:
        return phrase.format(v=v, a="an" if v[:1].lower() in "aeiou" else "a")

    def _clause(self, q: Quintuple, e: str, v: str) -> str:
        phrase = self._phrase(q)
        return f"{e} {self._fill(phrase, v)}" if phrase else f"{e}'s {q.property} is {v}"

    def realise_one(self, q: Quintuple) -> str:
        if q.same:
            phrase = self._phrase(q)
            if phrase:  # "X is a member of the Democratic Party, as is Y." (the paper's Table 3 style)
                first = phrase.split()[0]
                aux = first if first in ("is", "was", "are", "were") else "does"
                return f"{q.e1} {self._fill(phrase, q.v1)}, as {aux} {q.e2}."
            return f"{q.e1} and {q.e2} have the same {q.property}, {q.v1}."
        return f"{self._clause(q, q.e1, q.v1)}, while {self._clause(q, q.e2, q.v2)}."

    def __call__(self, quintuples: list[Quintuple]) -> list[str]:
        return [_cap(self.realise_one(q)) for q in quintuples]


class Seq2SeqRealiser:
    """A data-to-text seq2seq model (e.g. a T5 fine-tuned on DART, as in the paper) as the realiser.

    The two statements are linearised in the DART/WebNLG style ``<H> e <R> p <T> v`` that such models
    are trained on; ``model`` is any name ``i2d2.models.load_seq2seq`` accepts.
    """

    def __init__(self, model: str, prefix: str = "translate Graph to English: ", batch_size: int = 16,
                 max_new_tokens: int = 64, num_beams: int = 4):
        from i2d2.models import load_seq2seq

        self.model, self.tok = load_seq2seq(model)
        self.model.eval()
        self.prefix, self.batch_size, self.max_new_tokens, self.num_beams = prefix, batch_size, max_new_tokens, num_beams

    @staticmethod
    def linearise(q: Quintuple) -> str:
        return f"<H> {q.e1} <R> {q.property} <T> {q.v1} <H> {q.e2} <R> {q.property} <T> {q.v2}"

    def __call__(self, quintuples: list[Quintuple]) -> list[str]:
        from i2d2.cmp.tasks import generate

        return generate(self.model, self.tok, [self.prefix + self.linearise(q) for q in quintuples],
                        batch_size=self.batch_size, max_new_tokens=self.max_new_tokens, num_beams=self.num_beams)


# ----------------------------------------------------------------------------- documents

_SENT = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])")


def split_sentences(text: str) -> list[str]:
    """Rule-based sentence splitter (terminal punctuation followed by a capitalised start)."""
    text = " ".join(text.split())
    return [s for s in _SENT.split(text) if s] if text else []


def _mentions(sentence: str, alias: str) -> bool:
    return re.search(r"(?<!\w)" + re.escape(alias.lower()) + r"(?!\w)", sentence.lower()) is not None


def link_sentence(sentences: list[str], entity: str, prop: str, value: str,
                  aliases: dict[str, list[str]] | None = None) -> int | None:
    """Index of the first sentence stating (entity, prop, value): it mentions the value and the entity
    or the property (the two heuristics of §3.2.3); None if no sentence does."""
    aliases = aliases or {}

    def any_of(s, name):
        return any(_mentions(s, a) for a in [name, *aliases.get(name, [])])

    for i, s in enumerate(sentences):
        if any_of(s, value) and (any_of(s, entity) or any_of(s, prop)):
            return i
    return None


def segment_for(document: str, entity: str, prop: str, value: str, segment_sentences: int = 10,
                aliases: dict[str, list[str]] | None = None) -> str | None:
    """The ``segment_sentences``-sentence segment of ``document`` holding the linked sentence (§3.2.3)."""
    sents = split_sentences(document)
    i = link_sentence(sents, entity, prop, value, aliases)
    if i is None:
        return None
    start = (i // segment_sentences) * segment_sentences
    return " ".join(sents[start:start + segment_sentences])


def cut_documents(quintuples: list[Quintuple], segment_sentences: int = 10) -> list[Quintuple]:
    """Each document cut to the segment holding its linked sentence (unchanged when no sentence links)."""
    from dataclasses import replace

    out = []
    for q in quintuples:
        d1 = segment_for(q.doc1, q.e1, q.property, q.v1, segment_sentences) or q.doc1
        d2 = segment_for(q.doc2, q.e2, q.property, q.v2, segment_sentences) or q.doc2
        out.append(q if (d1, d2) == (q.doc1, q.doc2) else replace(q, doc1=d1, doc2=d2))
    return out
