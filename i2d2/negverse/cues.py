"""Negation cue detection: lexicon + dependency parse (verbal, non-verbal, affixal).

``CueDetector.detect(doc)`` returns the cues in a parsed sentence. Affixal cues (un-, in-, im-, il-, ir-,
dis-, non-, -less) count only when the word's base exists (spaCy's vocabulary strings, or a word list
passed in) and the part of speech allows it, so that ``under`` or ``indoor`` are not taken for
negations. A trained token tagger can replace or extend the rules: anything with
``tag(doc) -> list[Cue]`` plugs in through ``CueDetector(tagger=...)``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Protocol

from omegaconf import OmegaConf

from i2d2.config import CONF_DIR

DEFAULT_LEXICON = CONF_DIR / "negverse" / "cues.yaml"
TYPES = ("verbal", "non_verbal", "affixal")


@dataclass(frozen=True)
class Cue:
    text: str      # the cue word as written ("not", "nobody", "unhappy")
    type: str      # verbal | non_verbal | affixal
    index: int     # token index in the sentence
    affix: str = ""  # for affixal cues: the prefix/suffix ("un", "less")

    def to_dict(self) -> dict:
        return asdict(self)


class CueTagger(Protocol):
    """A trained cue tagger (e.g. a token classifier): returns the cues it finds in a parsed sentence."""

    def tag(self, doc) -> list[Cue]: ...


def load_lexicon(path: str | Path | None = None) -> dict:
    path = Path(path or DEFAULT_LEXICON)
    if not path.exists():
        raise FileNotFoundError(f"negation cue lexicon {path} not found")
    lex = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    for key in ("verbal", "non_verbal", "affixal"):
        if key not in lex:
            raise ValueError(f"{path}: missing top-level field {key!r}")
    for key in ("prefixes", "suffixes"):
        if key not in lex["affixal"]:
            raise ValueError(f"{path}: field affixal.{key} is missing")
    return lex


class CueDetector:
    def __init__(self, nlp=None, lexicon: dict | str | Path | None = None, words: Iterable[str] | None = None,
                 tagger: CueTagger | None = None, tagger_mode: str = "union"):
        """``words``: the vocabulary affixal bases are checked against (default: spaCy's vocab strings).

        ``tagger_mode``: 'union' adds the tagger's cues to the rule-based ones, 'replace' uses the tagger alone.
        """
        if tagger_mode not in ("union", "replace"):
            raise ValueError(f"tagger_mode must be 'union' or 'replace', got {tagger_mode!r}")
        self.nlp = nlp
        self.lex = lexicon if isinstance(lexicon, dict) else load_lexicon(lexicon)
        self.words = set(w.lower() for w in words) if words is not None else None
        self.tagger, self.tagger_mode = tagger, tagger_mode
        a = self.lex["affixal"]
        self.verbal = {w.lower() for w in self.lex["verbal"]}
        multi = [w for w in self.lex["non_verbal"] if " " in w]
        self.non_verbal = {w.lower() for w in self.lex["non_verbal"] if " " not in w}
        self.non_verbal_multi = [tuple(w.lower().split()) for w in multi]
        self.prefixes = sorted(a["prefixes"], key=len, reverse=True)
        self.suffixes = list(a["suffixes"])
        self.assimilation = {k: tuple(v) for k, v in (a.get("assimilation") or {}).items()}
        self.pos = set(a.get("pos", ["ADJ", "ADV"]))
        self.verb_prefixes = set(a.get("verb_prefixes", []))
        self.noun_prefixes = set(a.get("noun_prefixes", []))
        self.min_base = int(a.get("min_base_length", 3))
        self.exceptions = {w.lower() for w in a.get("exceptions", [])}

    # ------------------------------------------------------------------ vocabulary
    def is_word(self, w: str) -> bool:
        w = w.lower()
        if self.words is not None:
            return w in self.words
        if self.nlp is None:
            raise ValueError("CueDetector needs either a spaCy pipeline (nlp=) or a word list (words=)")
        return w in self.nlp.vocab.strings

    def affix_of(self, word: str, pos: str) -> tuple[str, str] | None:
        """(affix, base) when ``word`` is an affixal negation of an existing base, else None."""
        w = word.lower().strip()
        if not w.isascii() or w in self.exceptions:
            return None
        w_clean = w.replace("-", "")
        for p in self.prefixes:
            if not w_clean.startswith(p):
                continue
            allowed = pos in self.pos or (pos == "VERB" and p in self.verb_prefixes) or \
                (pos in ("NOUN", "PROPN") and p in self.noun_prefixes)
            if not allowed:
                continue
            base = w_clean[len(p):]
            if len(base) < self.min_base or not base.isalpha():
                continue
            if p in self.assimilation and not base.startswith(self.assimilation[p]):
                continue
            if p == "in" and base[0] in "bmplr":  # those bases take im-/il-/ir-
                continue
            if self.is_word(base):
                return p, base
        if pos in self.pos:
            for s in self.suffixes:
                if w_clean.endswith(s) and len(w_clean) - len(s) >= self.min_base:
                    base = w_clean[: -len(s)]
                    if base.isalpha() and self.is_word(base):
                        return s, base
        return None

    # ------------------------------------------------------------------ detection
    def parse(self, text_or_doc):
        if isinstance(text_or_doc, str):
            if self.nlp is None:
                raise ValueError("CueDetector got text but has no spaCy pipeline to parse it")
            return self.nlp(text_or_doc)
        return text_or_doc

    def detect(self, text_or_doc) -> list[Cue]:
        doc = self.parse(text_or_doc)
        cues = [] if (self.tagger is not None and self.tagger_mode == "replace") else self._rule_cues(doc)
        if self.tagger is not None:
            seen = {(c.index, c.type) for c in cues}
            cues += [c for c in self.tagger.tag(doc) if (c.index, c.type) not in seen]
        return sorted(cues, key=lambda c: c.index)

    def _rule_cues(self, doc) -> list[Cue]:
        cues = []
        lowered = [t.lower_ for t in doc]
        taken = set()
        for phrase in self.non_verbal_multi:
            n = len(phrase)
            for i in range(len(doc) - n + 1):
                if tuple(lowered[i:i + n]) == phrase:
                    cues.append(Cue(doc[i:i + n].text, "non_verbal", i))
                    taken.update(range(i, i + n))
        for t in doc:
            if t.i in taken:
                continue
            low = t.lower_.replace("’", "'")
            if low == "nt" and t.dep_ == "neg" and t.i > 0 and not doc[t.i - 1].whitespace_:
                low = "n't"  # "dont", "cant", "isnt": spaCy splits the apostrophe-less contraction as do + nt
            if low in self.verbal:
                # the parse decides: negating a verb/auxiliary is verbal, 'not' on a noun phrase is not
                kind = "verbal" if (t.head.pos_ in ("VERB", "AUX") or t.dep_ == "neg" or t.head.i == t.i) \
                    else "non_verbal"
                cues.append(Cue(t.text, kind, t.i))
            elif low in self.non_verbal:
                cues.append(Cue(t.text, "non_verbal", t.i))
            elif t.is_alpha:
                hit = self.affix_of(t.text, t.pos_)
                if hit is not None:
                    cues.append(Cue(t.text, "affixal", t.i, hit[0]))
        return cues

    def new_cues(self, original, candidate) -> list[Cue]:
        """Cues in ``candidate`` beyond those in ``original`` (a negation must add at least one)."""
        before = {}
        for c in self.detect(original):
            before[self._key(c)] = before.get(self._key(c), 0) + 1
        out = []
        for c in self.detect(candidate):
            k = self._key(c)
            if before.get(k, 0) > 0:
                before[k] -= 1
            else:
                out.append(c)
        return out

    def _key(self, cue: Cue) -> str:
        """What a cue counts as when original and candidate are compared: "isn’t" -> "isn't" -> "is not" keep the
        same negation, so n't / n’t / not / cannot are one cue."""
        low = cue.text.lower().replace("’", "'")
        return "not" if low in self.verbal or (cue.type == "verbal" and low == "nt") else low

    def negation_type(self, original, candidate) -> str | None:
        cues = self.new_cues(original, candidate)
        if not cues:
            return None
        return sorted({c.type for c in cues}, key=TYPES.index)[0]
