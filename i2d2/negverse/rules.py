"""Rule-based affirmative -> negated pair generator (enlarges the hand-written training pairs).

Each rule reads the dependency parse and rewrites one place in the sentence:

  verbal_aux     'not' after the first auxiliary / copula of the main clause   (is -> is not)
  verbal_do      do-support for a main verb without auxiliary                  (likes -> does not like)
  nobody/nothing indefinite pronoun subject/object                              (someone -> nobody)
  never          frequency adverb                                              (always -> never)
  no             indefinite determiner of the object of have/be/there-is       (a car -> no car)
  none_of        quantifier + 'of' partitive                                   (all of -> none of)
  affixal        adjective with a listed affixal antonym (conf/negverse/affixal_pairs.tsv)
"""

from __future__ import annotations

import random
from pathlib import Path

from i2d2.config import CONF_DIR
from i2d2.io import DataError, read_text

AFFIXAL_PAIRS = CONF_DIR / "negverse" / "affixal_pairs.tsv"
PRONOUNS = {"someone": "nobody", "somebody": "nobody", "everyone": "nobody", "everybody": "nobody",
            "something": "nothing", "everything": "nothing", "anyone": "nobody", "anything": "nothing"}
FREQUENCY = {"always", "often", "usually", "sometimes", "frequently", "occasionally", "regularly"}
QUANTIFIERS = {"all", "some", "many", "most", "several", "each", "both"}
RULE_TYPES = {"verbal_aux": "verbal", "verbal_do": "verbal", "pronoun": "non_verbal", "never": "non_verbal",
              "no": "non_verbal", "none_of": "non_verbal", "affixal": "affixal"}


def load_affixal_pairs(path: str | Path | None = None) -> dict[str, str]:
    path = Path(path or AFFIXAL_PAIRS)
    pairs = {}
    for lineno, line in enumerate(read_text(path).splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        cols = line.split("\t")
        if len(cols) != 2 or not all(c.strip() for c in cols):
            raise DataError(f"{path}:{lineno}: expected 'base<TAB>negated form', got {line!r}")
        pairs[cols[0].strip().lower()] = cols[1].strip()
    return pairs


def _rewrite(doc, start: int, end: int, text: str) -> str:
    """The sentence with tokens [start, end) replaced by ``text`` (capitalised at sentence start)."""
    if start == 0 and text:
        text = text[0].upper() + text[1:]
        rest = [(t.text if t.i != end or t.pos_ == "PROPN" or t.text == "I" else t.text.lower()) + t.whitespace_
                for t in doc[end:]]
    else:
        rest = [t.text_with_ws for t in doc[end:]]
    head = "".join(t.text_with_ws for t in doc[:start])
    ws = doc[end - 1].whitespace_ if end > start else " "
    return head + text + ws + "".join(rest)


def _match_case(src: str, word: str) -> str:
    return word[0].upper() + word[1:] if src[:1].isupper() else word


def _root(doc):
    return next((t for t in doc if t.dep_ == "ROOT"), None)


def _scope_trouble(doc) -> bool:
    """Clause negation of sentences with universal/indefinite pronouns, frequency adverbs or quantifiers
    changes their meaning unpredictably ("everyone did not ..."): the verbal rules skip them."""
    return any(t.lower_ in PRONOUNS or t.lower_ in FREQUENCY or (t.lower_ in QUANTIFIERS and t.dep_ != "det")
               for t in doc)


def rule_verbal_aux(doc, rng):
    root = _root(doc)
    if root is None or _scope_trouble(doc):
        return None
    auxes = [c for c in root.children if c.dep_ in ("aux", "auxpass") and c.i < root.i]
    if (root.pos_ == "AUX" or root.lemma_ == "be") and not auxes:
        auxes = [root]
    if not auxes or any(c.dep_ == "neg" for c in root.children):
        return None
    aux = auxes[0]
    if aux.lower_ in ("to",):
        return None
    if aux.lower_ == "can":
        return _rewrite(doc, aux.i, aux.i + 1, _match_case(aux.text, "cannot"))
    if aux.lower_ in ("do", "does", "did"):
        return None
    return _rewrite(doc, aux.i, aux.i + 1, aux.text + " not")


def rule_verbal_do(doc, rng):
    root = _root(doc)
    if root is None or root.pos_ != "VERB" or root.lemma_ == "be" or _scope_trouble(doc) \
            or any(c.dep_ in ("aux", "auxpass", "neg") for c in root.children):
        return None
    do = {"VBZ": "does", "VBD": "did", "VBP": "do"}.get(root.tag_)
    if do is None:
        return None
    neg = f"{do}n't" if rng.random() < 0.3 else f"{do} not"
    return _rewrite(doc, root.i, root.i + 1, f"{neg} {root.lemma_}")


def rule_pronoun(doc, rng):
    for t in doc:
        if t.lower_ in PRONOUNS and t.dep_ in ("nsubj", "nsubjpass", "dobj", "pobj"):
            new = PRONOUNS[t.lower_]
            if new == "nobody" and t.dep_.startswith("nsubj") and rng.random() < 0.3:
                new = "no one"
            return _rewrite(doc, t.i, t.i + 1, new)
    return None


def rule_never(doc, rng):
    for t in doc:
        if t.lower_ in FREQUENCY and t.dep_ == "advmod":
            return _rewrite(doc, t.i, t.i + 1, "never")
    return None


def rule_no(doc, rng):
    root = _root(doc)
    if root is None or root.lemma_ not in ("have", "be", "contain", "need", "own"):
        return None
    for t in doc:
        if t.dep_ == "det" and t.lower_ in ("a", "an", "some", "any") and t.head.dep_ in ("dobj", "attr") \
                and t.head.head.i == root.i:
            return _rewrite(doc, t.i, t.i + 1, "no")
    return None


def rule_none_of(doc, rng):
    for t in doc:
        if t.lower_ in QUANTIFIERS and t.i + 1 < len(doc) and doc[t.i + 1].lower_ == "of":
            return _rewrite(doc, t.i, t.i + 1, "none")
    return None


def make_rule_affixal(pairs: dict[str, str]):
    def rule_affixal(doc, rng):
        for t in doc:
            if t.pos_ == "ADJ" and t.lower_ in pairs:
                return _rewrite(doc, t.i, t.i + 1, _match_case(t.text, pairs[t.lower_]))
        return None
    return rule_affixal


def generate_pairs(docs, affixal_pairs: dict[str, str] | None = None, seed: int = 0,
                   rules: list[str] | None = None) -> list[dict]:
    """Apply every rule that fits each parsed sentence; one pair per (sentence, rule)."""
    table = {"verbal_aux": rule_verbal_aux, "verbal_do": rule_verbal_do, "pronoun": rule_pronoun,
             "never": rule_never, "no": rule_no, "none_of": rule_none_of,
             "affixal": make_rule_affixal(affixal_pairs if affixal_pairs is not None else load_affixal_pairs())}
    names = rules or list(table)
    bad = set(names) - set(table)
    if bad:
        raise ValueError(f"unknown pair-generator rule(s) {sorted(bad)}; known: {list(table)}")
    rng = random.Random(seed)
    out = []
    for doc in docs:
        for name in names:
            neg = table[name](doc, rng)
            if neg and neg.strip() != doc.text.strip():
                out.append({"original": doc.text.strip(), "negated": neg.strip(), "type": RULE_TYPES[name],
                            "source": f"rule:{name}"})
    return out
