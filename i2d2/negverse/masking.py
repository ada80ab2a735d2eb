"""Syntactic blank placement (NegVerse): where negations are likely to go, from the dependency parse.

Rules (token selected by POS tag / dependency label; the blank covers the token or its whole subtree):

  verb      VERB / AUX                            -> verbal negation ("did not go", "is not")
  subj_obj  nsubj, nsubjpass, dobj, pobj, attr... -> "nobody", "nothing", "none of ..."
  adv       ADV / advmod                          -> "never", "nowhere"
  adj       ADJ                                   -> affixal candidates ("unhappy", "careless")
  prep      ADP / prep                            -> "without"
  det       DET / det                             -> "no"; the blank widens over the noun/adjective it
                                                     determines ("a red car" -> "no car")

``mask_variants`` returns several masked versions of a sentence (at most ``max_blanks`` blanks each),
always including the whole sentence masked. ``training_variants`` places blanks over the words an
affirmative->negated pair changes, snapped to the same rule spans, and computes the answers.
"""

from __future__ import annotations

import difflib
import random
import re
import zlib
from dataclasses import dataclass, field

BLANK = "[BLANK]"
EMPTY = "[EMPTY]"
RULES = ("verb", "subj_obj", "adv", "adj", "prep", "det")
SUBJ_OBJ_DEPS = {"nsubj", "nsubjpass", "csubj", "dobj", "obj", "iobj", "pobj", "attr", "dative", "oprd"}


@dataclass
class Masked:
    text: str                                  # sentence with [BLANK]s
    spans: list[tuple[int, int]]               # token spans [start, end) that became blanks
    rules: list[str]                           # rule (and mode) behind each blank
    answers: list[str] | None = None           # training only: the text for each blank ([EMPTY] = deletion)
    meta: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"masked": self.text, "spans": [list(s) for s in self.spans], "rules": self.rules,
                "answers": self.answers}


def _trim(doc, s: int, e: int) -> tuple[int, int] | None:
    """Drop punctuation at the edges of a span; None if nothing is left."""
    while s < e and doc[s].is_punct:
        s += 1
    while e > s and doc[e - 1].is_punct:
        e -= 1
    return (s, e) if s < e else None


def _sentence_span(doc) -> tuple[int, int] | None:
    return _trim(doc, 0, len(doc))


def rule_spans(doc, rules=RULES, modes=("token", "subtree")) -> list[tuple[int, int, str]]:
    """All candidate blank spans ``(start, end, 'rule:mode')`` the rules select in ``doc``; one span may
    appear under several rules.

    Spans that would cover the whole sentence are left out (the whole-sentence variant is added separately).
    """
    unknown = set(rules) - set(RULES)
    if unknown:
        raise ValueError(f"unknown masking rule(s) {sorted(unknown)}; known: {list(RULES)}")
    full = _sentence_span(doc)
    out: dict[tuple[int, int, str], None] = {}

    def add(s, e, name):
        span = _trim(doc, s, e)
        if span is None or span == full:
            return
        out.setdefault((span[0], span[1], name), None)

    for t in doc:
        sel = []
        if "verb" in rules and t.pos_ in ("VERB", "AUX"):
            sel.append("verb")
        if "subj_obj" in rules and t.dep_ in SUBJ_OBJ_DEPS:
            sel.append("subj_obj")
        if "adv" in rules and (t.pos_ == "ADV" or t.dep_ == "advmod"):
            sel.append("adv")
        if "adj" in rules and t.pos_ == "ADJ":
            sel.append("adj")
        if "prep" in rules and (t.pos_ == "ADP" or t.dep_ == "prep"):
            sel.append("prep")
        if "det" in rules and (t.pos_ == "DET" or t.dep_ == "det"):
            sel.append("det")
        for rule in sel:
            if rule == "det":
                # a determiner blank widens over what it determines: the next noun/adjective (token mode)
                # or up to its head noun (subtree mode)
                if "token" in modes:
                    e = t.i + 1
                    if e < len(doc) and doc[e].pos_ in ("ADJ", "NOUN", "PROPN", "NUM", "ADV"):
                        e += 1
                    add(t.i, e, "det:token")
                if "subtree" in modes and t.head.i > t.i:
                    add(t.i, t.head.i + 1, "det:subtree")
                continue
            if "token" in modes:
                add(t.i, t.i + 1, f"{rule}:token")
            if "subtree" in modes:
                add(t.left_edge.i, t.right_edge.i + 1, f"{rule}:subtree")
    return list(out)


def render(doc, spans: list[tuple[int, int]], fills: list[str] | None = None) -> str:
    """The sentence with each span replaced by [BLANK] (or by ``fills``), keeping the original spacing."""
    spans = sorted(spans)
    parts, i = [], 0
    for k, (s, e) in enumerate(spans):
        parts.append("".join(t.text_with_ws for t in doc[i:s]))
        parts.append(BLANK if fills is None else fills[k])
        parts.append(doc[e - 1].whitespace_)
        i = e
    parts.append("".join(t.text_with_ws for t in doc[i:]))
    return "".join(parts)


def fill_blanks(masked: str, answers: list[str]) -> str | None:
    """Fill the [BLANK]s of ``masked`` in order; [EMPTY] deletes. None if the answer count is wrong."""
    pieces = masked.split(BLANK)
    if len(pieces) - 1 != len(answers):
        return None
    out = pieces[0]
    for ans, piece in zip(answers, pieces[1:]):
        ans = ans.strip()
        out += ("" if ans == EMPTY else ans) + piece
    return normalize_space(out)


def normalize_space(text: str) -> str:
    text = re.sub(r"\s+", " ", text).strip()
    text = re.sub(r"\s+([.,;:!?])", r"\1", text)
    return re.sub(r"(?<!\.)\.\.(?!\.)", ".", text)  # an answer's own full stop before the sentence's


def _stable_rng(text: str, seed: int) -> random.Random:
    return random.Random(zlib.crc32(text.encode()) ^ seed)


def _disjoint(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """Non-overlapping and not touching (two touching blanks would be one blank)."""
    return a[1] < b[0] or b[1] < a[0]


def mask_variants(doc, rules=RULES, max_blanks: int = 2, max_variants: int = 6, modes=("token", "subtree"),
                  include_full: bool = True, seed: int = 0, min_two_blank: int = 1) -> list[Masked]:
    """Up to ``max_variants`` masked versions of ``doc``: the whole sentence, one blank per rule (the
    root verb first), then pairs of blanks from different rules; deterministic per sentence and seed.

    ``min_two_blank`` slots are kept for two-blank variants whenever the parse offers two disjoint spans
    of different rules (otherwise the whole sentence and the single blanks fill every slot)."""
    rng = _stable_rng(doc.text, seed)
    out: list[Masked] = []
    full = _sentence_span(doc)
    if include_full and full is not None:
        out.append(Masked(render(doc, [full]), [full], ["sentence"]))
    cands = rule_spans(doc, rules, modes)
    by_rule: dict[str, list] = {}
    for c in cands:
        by_rule.setdefault(c[2].split(":")[0], []).append(c)
    for rule, lst in by_rule.items():
        rng.shuffle(lst)
        if rule == "verb":  # the root (main) verb is where verbal negation goes: put it first
            lst.sort(key=lambda c: (doc[c[0]].dep_ != "ROOT" and not any(doc[k].dep_ == "ROOT" for k in
                                                                          range(c[0], c[1])), c[1] - c[0]))
    order = [r for r in RULES if r in by_rule]
    singles, seen = [], set()
    for depth in range(max((len(v) for v in by_rule.values()), default=0)):
        singles += [by_rule[r][depth] for r in order if depth < len(by_rule[r])]
    pairs = []
    if max_blanks >= 2:
        pairs = [(a, b) for i, a in enumerate(cands) for b in cands[i + 1:]
                 if a[2].split(":")[0] != b[2].split(":")[0] and _disjoint(a[:2], b[:2])]
        rng.shuffle(pairs)
    single_slots = max_variants - min(len(pairs), max(0, int(min_two_blank)))
    for s, e, name in singles:
        if len(out) >= single_slots:
            break
        if (s, e) not in seen:
            seen.add((s, e))
            out.append(Masked(render(doc, [(s, e)]), [(s, e)], [name]))
    for a, b in pairs:
        if len(out) >= max_variants:
            break
        spans = sorted([a[:2], b[:2]])
        if tuple(spans) in seen:  # the same two spans under other rule names
            continue
        seen.add(tuple(spans))
        out.append(Masked(render(doc, spans), spans, [x[2] for x in sorted([a, b])]))
    return out[:max_variants]


# ----------------------------------------------------------------------------- training blanks

def _boundary_map(ops) -> dict[int, list[int]]:
    m: dict[int, list[int]] = {}
    for tag, i1, i2, j1, j2 in ops:
        if tag == "equal":
            for k in range(i1, i2 + 1):
                m.setdefault(k, []).append(j1 + k - i1)
        else:
            m.setdefault(i1, []).append(j1)
            m.setdefault(i2, []).append(j2)
    return m


def _merge(spans):
    spans = sorted(spans)
    out = []
    for s, e in spans:
        if out and s <= out[-1][1]:  # overlapping or touching
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def answers_for(orig_doc, neg_doc, spans, bmap) -> list[str] | None:
    """The negated sentence's text under each blank span of the original; None if a span edge falls
    inside a changed region (no clean alignment)."""
    answers = []
    for s, e in spans:
        if s not in bmap or e not in bmap:
            return None
        ls, re_ = min(bmap[s]), max(bmap[e])
        text = neg_doc[ls:re_].text if re_ > ls else ""
        answers.append(text.strip() or EMPTY)
    return answers


def training_variants(orig_doc, neg_doc, rules=RULES, max_blanks: int = 2, max_variants: int = 4,
                      distractor: bool = True, seed: int = 0) -> list[Masked]:
    """Masked versions of ``orig_doc`` whose blanks cover every token the negation changes, with answers.

    Variants: the smallest rule span around each change, the subtree-sized rule span, the bare changed
    tokens, a variant with an extra unchanged blank (the model must learn to copy, too), and the whole
    sentence. Each variant is checked: filling its blanks with its answers must give the negated sentence.
    """
    a = [t.text for t in orig_doc]
    b = [t.text for t in neg_doc]
    ops = difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
    regions = [(i1, i2) for tag, i1, i2, _, _ in ops if tag != "equal"]
    if not regions:
        return []
    bmap = _boundary_map(ops)
    rng = _stable_rng(orig_doc.text + "\x00" + neg_doc.text, seed)
    cands = rule_spans(orig_doc, rules)
    target = normalize_space(neg_doc.text)

    def covering(region, prefer):
        i1, i2 = region
        if i1 < i2:
            cover = [c for c in cands if c[0] <= i1 and i2 <= c[1]]
        else:  # an insertion: the blank must touch it (the answer absorbs inserted words at its edges)
            cover = [c for c in cands if c[0] <= i1 <= c[1]]
        if not cover:
            return None
        cover.sort(key=lambda c: (c[1] - c[0]) * (1 if prefer == "small" else -1))
        if prefer == "subtree":  # the smallest subtree-mode span covering the change
            sub = [c for c in cover if c[2].endswith("subtree")]
            if sub:
                return min(sub, key=lambda c: c[1] - c[0])
            return None
        return cover[0]

    def bare(region):
        i1, i2 = region
        if i1 < i2:
            return (i1, i2, "changed")
        # an insertion becomes a blank over the token before it (or after, at the start)
        k = i1 - 1 if i1 > 0 and not orig_doc[i1 - 1].is_punct else min(i1, len(orig_doc) - 1)
        return (k, k + 1, "changed")

    variants: list[tuple[list, list]] = []
    for prefer in ("small", "bare", "subtree"):
        picked = []
        for r in regions:
            c = bare(r) if prefer == "bare" else covering(r, prefer)
            if c is None:
                c = bare(r)
            picked.append(c)
        spans = _merge([p[:2] for p in picked])
        names = [next((p[2] for p in picked if p[0] >= s and p[1] <= e), "changed") for s, e in spans]
        variants.append((spans, names))
    if distractor and variants:
        spans0, names0 = variants[0]
        if len(spans0) < max_blanks:
            extra = [c for c in cands if all(_disjoint(c[:2], s) for s in spans0)]
            if extra:
                c = rng.choice(extra)
                spans = sorted(spans0 + [c[:2]])
                names = [names0[spans0.index(s)] if s in spans0 else c[2] for s in spans]
                variants.append((spans, names))
    full = _sentence_span(orig_doc)
    out, seen = [], set()
    for spans, names in variants:
        key = tuple(spans)
        if key in seen or len(spans) > max_blanks or not spans:
            continue
        answers = answers_for(orig_doc, neg_doc, spans, bmap)
        if answers is None:
            continue
        masked = render(orig_doc, spans)
        if fill_blanks(masked, answers) != target:
            continue
        seen.add(key)
        out.append(Masked(masked, list(spans), names, answers))
    if full is not None and tuple([full]) not in seen and max_variants > 0:  # always keep the whole sentence
        answers = answers_for(orig_doc, neg_doc, [full], bmap)
        masked = render(orig_doc, [full])
        if answers is not None and fill_blanks(masked, answers) == target:
            out = out[: max_variants - 1] + [Masked(masked, [full], ["sentence"], answers)]
    return out[:max_variants]
