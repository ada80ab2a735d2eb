"""Filters for generated negations: degenerate outputs, edit distance, negation cue, grammaticality of
the cue's position in the dependency parse, duplicates.

Each filter takes candidate rows (dicts with at least ``original`` and ``negation``) and returns
``(kept, dropped)``; dropped rows carry ``drop_reason``. ``apply_filters`` chains them.
"""

from __future__ import annotations

import re

from rapidfuzz.distance import Levenshtein

from i2d2.negverse.formatting import SPECIAL_TOKENS
from i2d2.negverse.masking import normalize_space

_WORD = re.compile(r"[A-Za-z]+(?:['’][A-Za-z]+)?")


def lev_distance(a: str, b: str) -> float:
    """Normalised character Levenshtein distance in [0, 1] (rapidfuzz)."""
    return float(Levenshtein.normalized_distance(a, b))


def _split(rows, ok, reason):
    kept, dropped = [], []
    for r in rows:
        if ok(r):
            kept.append(r)
        else:
            dropped.append({**r, "drop_reason": reason(r) if callable(reason) else reason})
    return kept, dropped


def degenerate_reason(row: dict, max_len_ratio: float = 2.0) -> str | None:
    """Why a candidate is degenerate, or None: unfilled/empty blanks, unchanged, special tokens or
    garbage (non-text characters, long character runs, repeated words, runaway length)."""
    neg, orig = row.get("negation"), row["original"]
    if neg is None:
        return "blanks_not_filled"
    answers = row.get("answers") or []
    if any(not a.strip() for a in answers):
        return "empty_blank"
    if normalize_space(neg).lower().rstrip(".!?") == normalize_space(orig).lower().rstrip(".!?"):
        return "unchanged"
    if any(t in neg for t in SPECIAL_TOKENS) or "[BLANK" in neg or "<" in neg:
        return "special_token"
    if any(not (c.isprintable()) for c in neg) or re.search(r"[^\w\s.,;:!?'’\"()\-&%$/]", neg):
        return "garbage_chars"
    if re.search(r"(.)\1{3,}", neg):
        return "garbage_run"
    words = _WORD.findall(neg.lower())
    if not words:
        return "no_words"
    if any(words[i] == words[i + 1] and words[i] not in ("had", "that") for i in range(len(words) - 1)):
        return "repeated_word"
    if len(neg) > max_len_ratio * len(orig) + 10:
        return "too_long"
    if _repeated_phrase(words, _WORD.findall(orig.lower())) or _copied_word(words, _WORD.findall(orig.lower())):
        return "repeated_phrase"
    if _misplaced_cue(neg):
        return "misplaced_negation"
    return None


# neither / nor too: "liked the neither the teacher" (a cue after a determiner) was kept
_CUES = {"not", "no", "never", "nobody", "nothing", "none", "nowhere", "neither", "nor"}
_DETS = {"the", "a", "an", "this", "that", "these", "those", "my", "his", "her", "their", "our", "its", "your"}
# the words before which neither / nor are misplaced: only articles, since 'this', 'that', 'his', 'her' are also
# pronouns ('likes neither this nor that', 'neither his nor hers') and 'that' a conjunction ('that neither he ...')
_ARTICLES = {"the", "a", "an"}
_COORDINATED = {"neither", "nor"}


def _repeated_phrase(words: list[str], orig_words: list[str], n: int = 2) -> bool:
    """A word n-gram (n >= 2) repeated more often than in the original: the model copied the rest of
    the sentence into a blank ("the room was not clean was clean")."""
    def counts(ws):
        c: dict[tuple, int] = {}
        for i in range(len(ws) - n + 1):
            c[tuple(ws[i:i + n])] = c.get(tuple(ws[i:i + n]), 0) + 1
        return c
    before = counts(orig_words)
    return any(v > 1 and v > before.get(k, 0) for k, v in counts(words).items())


_FUNCTION = _DETS | {"and", "or", "of", "to", "in", "on", "at", "for", "with", "by", "from", "as", "but", "it"}
_FINITE = {"is", "are", "was", "were", "has", "have", "had", "does", "do", "did", "will", "can"}


def _copied_word(words: list[str], orig_words: list[str]) -> bool:
    """A content word of the original appearing more often than there ("the room was not clean was clean")."""
    from collections import Counter

    before, after = Counter(orig_words), Counter(words)
    return any(after[w] > before[w] >= 1 for w in after if w not in _FUNCTION and w not in _CUES and len(w) > 2)


def _misplaced_cue(neg: str) -> bool:
    """A negation word where English never puts one: right after a determiner ("the not bridge"),
    sentence-final ("painted the wall not."), or capitalised mid-sentence ("his friends Not the city")."""
    toks = re.findall(r"[A-Za-z']+|[.,;:!?]", neg)
    for i, t in enumerate(toks):
        low = t.lower()
        if low not in _CUES:
            continue
        if i > 0 and toks[i - 1].lower() in (_ARTICLES if low in _COORDINATED else _DETS):
            return True
        if low == "not" and (i + 1 == len(toks) or toks[i + 1] in ".!?"):
            return True
        if low == "not" and i + 1 < len(toks) and toks[i + 1].lower() in _FINITE:  # "the hotel not was"
            return True
        if t[0].isupper() and i > 0 and toks[i - 1] not in ".!?":
            return True
    return False


def filter_degenerate(rows: list[dict], max_len_ratio: float = 2.0):
    return _split(rows, lambda r: degenerate_reason(r, max_len_ratio) is None,
                  lambda r: degenerate_reason(r, max_len_ratio))


def filter_distance(rows: list[dict], max_distance: float = 0.5):
    """Keep candidates whose normalised Levenshtein distance to the original is < ``max_distance``."""
    for r in rows:
        r["lev_distance"] = lev_distance(r["original"], r["negation"])
    return _split(rows, lambda r: r["lev_distance"] < max_distance, "too_far")


def filter_cue(rows: list[dict], detector, nlp=None):
    """Keep candidates in which the cue detector finds a negation cue the original lacks; rows get
    ``cues`` and ``negation_type``."""
    for r in rows:
        cues = detector.new_cues(r["original"], r["negation"])
        r["cues"] = [c.to_dict() for c in cues]
        r["negation_type"] = detector.negation_type(r["original"], r["negation"]) if cues else None
    return _split(rows, lambda r: bool(r["cues"]), "no_negation_cue")


# ----------------------------------------------------------------------------- grammaticality (parse-based)

_PRONOUN_CUES = {"none", "nothing", "nobody", "noone"}
_ADVERB_CUES = {"never", "nowhere"}
_NOT = {"not", "n't", "nt"}  # "nt": an apostrophe-less "dont" / "cant" as spaCy splits it
_NOMINAL_MODIFIER_DEPS = {"det", "compound", "poss", "nummod", "amod"}
_NOT_DEPS = {"neg", "advmod", "preconj", "cc", "conj"}
_FINITE_TAGS = {"VBD", "VBZ", "VBP"}
_ARGUMENT_DEPS = {"nsubj", "nsubjpass", "dobj", "attr", "pobj"}
_COMPLEMENT_DEPS = {"attr", "acomp", "dobj", "oprd"}


def _cue_problem(tok) -> str | None:
    """Why the parse puts the negation cue ``tok`` where English does not, or None. Examples:
    'There is a bakery none.' (a pronoun cue with a determiner), 'The store sells none bread.' (a cue
    as a noun modifier), 'The cat not slept.' (not without an auxiliary), 'The meeting no was long.'
    (a second subject), 'The train arrived no on time.' (a stray 'no')."""
    low = tok.lower_
    children = list(tok.children)
    if tok.dep_ == "dep":
        return "cue_unattached"
    if low in _PRONOUN_CUES or low in _ADVERB_CUES:
        if tok.dep_ in _NOMINAL_MODIFIER_DEPS:
            return "cue_as_modifier"                      # 'none bread'
        if any(c.dep_ in _NOMINAL_MODIFIER_DEPS and c.i < tok.i for c in children):
            return "cue_with_determiner"                  # 'a bakery none', 'the cake nothing'
        nxt = tok.nbor(1).lower_ if tok.i + 1 < len(tok.doc) else ""
        if low in _PRONOUN_CUES and tok.dep_ == "npadvmod" and nxt not in ("too", "the"):
            return "cue_as_adverb"                        # 'is none big' ('none too big' is fine)
    if low == "no":
        if tok.dep_ == "det" and tok.head.i > tok.i:
            return None                                   # 'no bakery'
        if tok.dep_ in ("neg", "advmod") and tok.head.i > tok.i:
            return None                                   # 'no longer', 'no more'
        if tok.dep_ == "intj" and (tok.i == 0 or tok.nbor(-1).is_punct or tok.nbor(-1).tag_ == "UH"):
            return None                                   # 'No, he left.', 'Oh no, ...'
        if _answer_no(tok):
            return None                                   # 'He said no.', 'The answer is no.'
        return "misplaced_no"
    if low in _NOT:
        if tok.dep_ not in _NOT_DEPS:
            return "not_as_" + tok.dep_                   # 'the not cat' (poss)
        head = tok.head
        if tok.dep_ == "neg" and head.pos_ == "VERB" and head.tag_ in _FINITE_TAGS \
                and head.lemma_ not in ("be", "have", "do") \
                and not any(c.dep_ in ("aux", "auxpass") for c in head.children):  # "I don't." is do-support
            return "not_without_auxiliary"                # 'The cat not slept.'
    if tok.dep_ in _ARGUMENT_DEPS and low in _PRONOUN_CUES | {"no"}:
        rivals = _COMPLEMENT_DEPS if tok.dep_ in _COMPLEMENT_DEPS else {tok.dep_}
        if any(c.dep_ in rivals and c.i != tok.i for c in tok.head.children):
            return "cue_extra_argument"                   # 'The room was clean none.'
    return None


def grammar_reason(doc, cue_indices: list[int] | None = None) -> str | None:
    """The first ungrammatical negation cue in a parsed candidate, or None. ``cue_indices``: the new
    cues' token positions (from the cue filter); without them every lexical cue word is checked."""
    words = _PRONOUN_CUES | _ADVERB_CUES | _NOT | {"no"}
    idx = [i for i in cue_indices if i < len(doc)] if cue_indices is not None \
        else [t.i for t in doc if t.lower_ in words]
    for i in idx:
        if doc[i].lower_ in words:
            why = _cue_problem(doc[i])
            if why:
                return why
    return None


_FINITE_OR_MODAL = _FINITE_TAGS | {"MD"}
_QUANTIFIERS = {"all", "most", "some", "many", "each", "both", "several", "few", "any", "much"}
_SUBJECT_TAGS = {"NN", "NNS", "NNP", "NNPS", "PRP", "EX", "CD", "WP"}
_PRONOMINAL = {"all", "most", "some", "many", "each", "both", "neither", "either", "few", "several", "this", "that",
               "these", "those", "much", "more", "less"}
# 'no longer', 'no one', 'no doubt', 'no sooner', 'no-one'
_NO_BEFORE = {"longer", "more", "less", "fewer", "doubt", "matter", "one", "sooner", "later", "further", "earlier",
              "-"}
_NO_ANSWER_VERBS = {"say", "answer", "reply", "vote", "be", "shout", "nod", "shake"}  # 'He said no.', 'is no.'
_NEG_FRONT = {"never", "nowhere", "not", "seldom", "rarely", "hardly", "no"}  # 'Never has he lied.'
_NP_TAGS = {"PRP", "PRP$", "DT", "NN", "NNS", "NNP", "NNPS", "JJ", "JJR", "JJS", "CD", "POS", "RB", "RBR", "RBS"}


def _has_subject(doc, finite: set[int]) -> bool:
    """A noun, pronoun or pronominal determiner before the first finite verb, or right after it when a negative
    adverb is fronted ('Never has he lied.'); False without a finite verb (``finite``: their positions). By tags: a
    broken sentence's parse often has no subject arc even where the words are there ('The dog barked at nobody.')."""
    if not finite:
        return False  # no finite verb, no subject position (an imperative: 'Close the door.')
    for t in doc:
        if t.i in finite:  # inversion needs an auxiliary: 'Never has he lied.', not 'no chews the slippers.'
            nxt = doc[t.i + 1] if t.i + 1 < len(doc) else None
            return bool(doc[0].lower_ in _NEG_FRONT and (t.tag_ == "MD" or t.lemma_ in ("be", "have", "do"))
                        and nxt is not None and (nxt.tag_ in {"PRP", "PRP$", "NNP", "EX"} or nxt.lower_ == "the"))
        if t.tag_ in _SUBJECT_TAGS or t.lower_ in _PRONOMINAL:
            return True
    return False


def _predicates(doc) -> int:
    """The original's verbs that a negation may turn into do-support: finite verbs and modals, the root (an
    imperative's bare verb, or a verb the tagger misreads: 'Money talks.' as NNS) and verbs conjoined to it."""
    root = next((t for t in doc if t.dep_ == "ROOT"), None)
    idx = {t.i for t in doc if t.tag_ in _FINITE_OR_MODAL}
    if root is not None:
        idx.add(root.i)
        idx |= {c.i for c in root.children if c.dep_ == "conj" and c.tag_.startswith("VB")}
    return len(idx)


def _word_alignment(doc, orig_doc) -> list[tuple]:
    """difflib's opcodes from the original's lower-cased words to the candidate's."""
    from difflib import SequenceMatcher

    a, b = [t.lower_ for t in orig_doc], [t.lower_ for t in doc]
    return SequenceMatcher(None, a, b, autojunk=False).get_opcodes()


def _cue_for_preposition(doc, orig_doc, ops) -> bool:
    """The candidate replaced one of the original's prepositions with a negation: 'her first day not school',
    'a park no the school', "their grandparents didn't Sunday"."""
    return any(op == "replace" and all(t.tag_ == "IN" for t in orig_doc[i1:i2])
               and any(t.lower_ in _CUES or t.lower_ == "n't" for t in doc[j1:j2])
               and not any(t.tag_ == "IN" for t in doc[j1:j2]) for op, i1, i2, j1, j2 in ops)


def _cue_for_determiner(doc, orig_doc, ops) -> bool:
    """The candidate replaced one of the original's determiners with a negation that cannot stand before a noun:
    'patient with not children' ('with no children' is the negation; 'no' and a kept determiner pass)."""
    def before_a_noun(t) -> bool:  # 'not children'; 'not one student', 'not a single', 'not all' stand
        return t.i + 1 < len(t.doc) and t.nbor(1).pos_ in ("NOUN", "PROPN", "ADJ")

    return any(op == "replace" and all(t.dep_ == "det" for t in orig_doc[i1:i2])
               and any((t.lower_ in _CUES - {"no"} or t.lower_ == "n't") and before_a_noun(t) for t in doc[j1:j2])
               and not any(t.tag_ == "DT" for t in doc[j1:j2]) for op, i1, i2, j1, j2 in ops)


def _tense_changed(doc, orig_doc, ops) -> bool:
    """The candidate rewrote a finite verb in the other tense: 'The workers are happy.' -> 'The workers were not
    happy.', 'She runs.' -> 'She did not run.' (a negation keeps the original's tense; past = VBD)."""
    def pasts(tokens):
        return {t.tag_ == "VBD" for t in tokens if t.tag_ in _FINITE_TAGS}

    return any(op == "replace" and pasts(orig_doc[i1:i2]) and pasts(doc[j1:j2])
               and not pasts(orig_doc[i1:i2]) & pasts(doc[j1:j2]) for op, i1, i2, j1, j2 in ops)


def _agreement_changed(doc, orig_doc, ops) -> bool:
    """The candidate changed a present verb's number (VBZ / VBP) but no noun or pronoun: 'There is a cafe' ->
    'There are not a cafe', 'She likes tea' -> "She don't like tea"."""
    changed = [(orig_doc[i1:i2], doc[j1:j2]) for op, i1, i2, j1, j2 in ops if op != "equal"]
    if any(t.pos_ in ("NOUN", "PROPN", "PRON") for _, new in changed for t in new):
        return False  # a new subject or complement may take the other number: 'There are no cafes', 'Nobody is'
    if any(t.lower_ in _COORDINATED for _, new in changed for t in new):
        return False  # 'Both he and she like tea.' -> 'Neither he nor she likes tea.': the subject's number changed

    def numbers(tokens):
        return {t.tag_ for t in tokens if t.tag_ in ("VBZ", "VBP")}

    return any(numbers(old) and numbers(new) and not numbers(old) & numbers(new) for old, new in changed)


def _answer_no(t) -> bool:
    """'no' as an answer: 'He said no (to the offer).', 'The answer is no.'"""
    nxt = t.nbor(1) if t.i + 1 < len(t.doc) else None
    return t.i > 0 and t.nbor(-1).lemma_ in _NO_ANSWER_VERBS and (nxt is None or nxt.is_punct or nxt.lower_ == "to")


def _lone_no(t) -> bool:
    """'no' with no noun phrase after it: 'The coffee smells no.', 'repaired no quickly' (not 'no longer', 'No,',
    an answer 'no' or 'Oh no')."""
    doc = t.doc
    nxt = doc[t.i + 1] if t.i + 1 < len(doc) else None
    if nxt is not None and (nxt.lower_ in _NO_BEFORE or nxt.lower_ == ","):  # 'no longer', 'No, he left.'
        return False
    if _answer_no(t) or (t.i > 0 and doc[t.i - 1].tag_ == "UH"):  # 'Oh no'
        return False
    return nxt is None or nxt.is_punct or nxt.tag_.startswith(("VB", "RB", "IN", "MD", "TO", "DT"))


def _do_without_bare_verb(t, orig_doc) -> bool:
    """'do' + not/n't whose verb never comes: the next word past a subject (a question: "Doesn't it work?") and
    adverbs must be a bare verb, or the sentence may end where the original ended on an auxiliary ('Yes, I do.' ->
    "No, I don't.")."""
    doc = t.doc
    if not (t.lemma_ == "do" and t.tag_ in _FINITE_TAGS and t.i + 1 < len(doc) and doc[t.i + 1].lower_ in _NOT):
        return False
    nxt = next((u for u in doc[t.i + 2:] if u.tag_ not in _NP_TAGS), None)
    if nxt is not None and nxt.tag_ == "VB":
        return False
    if nxt is None or nxt.is_punct:
        words = [u for u in orig_doc if not u.is_punct]
        if words and words[-1].tag_ in _FINITE_OR_MODAL and all(u.is_punct for u in doc[t.i + 2:]):
            return False
    return True


def clause_reason(doc, orig_doc) -> str | None:
    """Why the candidate's verbs and cues do not make the clause its original had, or None. By part-of-speech tags
    and word alignment, which stay informative where a broken sentence's parse does not; the word checks judge only
    the words the candidate does not share with the original:
    - 'do' + not/n't must be followed by a bare verb: 'did not found', "doesn't in his garden", 'does not logical';
    - no more finite verbs (or modals) than the original has predicates, where the negation replaced a verb instead
      of adding do-support around it: 'found the did not find book', 'does not seem seems', "grows tomatoes doesn't
      grow";
    - a finite verb where the original had one: 'There not a cafe', 'The new bridge not safe';
    - a subject before the first finite verb where the original had one: 'never arrives every ten minutes';
    - 'no' followed by a noun phrase (or 'longer', 'one', ...): 'The coffee smells no.', 'repaired no quickly';
    - no negation in place of a preposition: 'her first day not school';
    - no negation but 'no' in place of a determiner: 'patient with not children';
    - the original's tense: 'The workers are happy.' -> 'The workers were not happy.';
    - the verb's number where no noun changed: 'There is a cafe' -> 'There are not a cafe';
    - no 'no' inside a partitive: 'All of no tickets'."""
    ops = _word_alignment(doc, orig_doc)
    # candidate position -> original position of the words it copied: the checks judge only what the model wrote
    # ('Oh no, the bus left.' keeps its 'no'), and a copied verb may keep the original's tag (below)
    copied = {j1 + k: i1 + k for op, i1, _, j1, j2 in ops if op == "equal" for k in range(j2 - j1)}
    for t in doc:
        if t.i in copied:
            continue
        if t.lower_ == "no" and _lone_no(t):
            return "no_without_noun"
        if _do_without_bare_verb(t, orig_doc):
            return "do_without_bare_verb"
        if t.lower_ == "no" and t.dep_ == "det" and t.head.head.lower_ == "of" \
                and t.head.head.head.lower_ in _QUANTIFIERS:
            return "no_in_partitive"
    finite = {t.i for t in doc if t.tag_ in _FINITE_OR_MODAL}
    if not any(i not in copied for i in finite):
        # the model added no finite verb or modal (no do-support): a verb it copied is still the finite one, whatever
        # the tagger now reads ('Kids never play outside.', 'No-one called.')
        finite |= {j for j, i in copied.items() if orig_doc[i].tag_ in _FINITE_OR_MODAL}
    orig_finite = {t.i for t in orig_doc if t.tag_ in _FINITE_OR_MODAL}
    if len(finite) > max(len(orig_finite), _predicates(orig_doc)):
        return "extra_finite_verb"
    if orig_finite and not finite:
        return "no_finite_verb"
    if _has_subject(orig_doc, orig_finite) and not _has_subject(doc, finite):
        return "no_subject"
    if _cue_for_preposition(doc, orig_doc, ops):
        return "cue_for_preposition"
    if _cue_for_determiner(doc, orig_doc, ops):
        return "cue_for_determiner"
    if _tense_changed(doc, orig_doc, ops):
        return "tense_changed"
    if _agreement_changed(doc, orig_doc, ops):
        return "agreement_changed"
    return None


def _plain_apostrophes(text: str) -> str:
    """’ -> ' (same token positions): spaCy's small tagger reads "doesn’t like" as a preposition, "doesn't like" as
    a verb."""
    return text.replace("\u2019", "'")


def filter_grammar(rows: list[dict], nlp):
    """Keep candidates whose negation cues sit where the dependency parse says English allows them and whose
    verbs still make the original's clause (``clause_reason``); dropped rows carry ``drop_reason``
    'ungrammatical:<why>'."""
    originals = list(dict.fromkeys(r["original"] for r in rows))
    orig_docs = dict(zip(originals, nlp.pipe([_plain_apostrophes(o) for o in originals])))
    docs = nlp.pipe([_plain_apostrophes(r["negation"]) for r in rows])
    for r, doc in zip(rows, docs):
        cues = r.get("cues")
        r["grammar"] = grammar_reason(doc, [c["index"] for c in cues] if cues else None) \
            or clause_reason(doc, orig_docs[r["original"]])
    return _split(rows, lambda r: r["grammar"] is None, lambda r: f"ungrammatical:{r['grammar']}")


def dedupe(rows: list[dict]):
    """Drop repeated (original, negation) pairs, case- and spacing-insensitively, a final .!? and ’ / ' folded (as
    the 'unchanged' check and the cue filter read them; the same negation spelt twice was kept twice, counted in
    n and self-BLEU); keeps the first."""
    seen, kept, dropped = set(), [], []
    for r in rows:
        key = (r["original"], _plain_apostrophes(normalize_space(r["negation"]).lower()).rstrip(".!?"))
        if key in seen:
            dropped.append({**r, "drop_reason": "duplicate"})
        else:
            seen.add(key)
            kept.append(r)
    return kept, dropped


def apply_filters(rows: list[dict], detector, max_distance: float = 0.5, max_len_ratio: float = 2.0,
                  require_cue: bool = True, grammar: bool = True, nlp=None) -> tuple[list[dict], list[dict], dict]:
    """Degenerate -> distance -> cue -> grammar -> dedupe. Returns (kept, dropped, counts per drop reason)."""
    kept, dropped = filter_degenerate(rows, max_len_ratio)
    kept, d = filter_distance(kept, max_distance)
    dropped += d
    if require_cue:
        kept, d = filter_cue(kept, detector)
        dropped += d
    if grammar:
        if nlp is None:
            raise ValueError("apply_filters(grammar=True) needs the spaCy pipeline (nlp=...)")
        kept, d = filter_grammar(kept, nlp)
        dropped += d
    kept, d = dedupe(kept)
    dropped += d
    counts: dict[str, int] = {}
    for r in dropped:
        counts[r["drop_reason"]] = counts.get(r["drop_reason"], 0) + 1
    return kept, dropped, counts
