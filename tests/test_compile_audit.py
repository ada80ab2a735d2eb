"""Regression tests for defects found by an audit of the constraint compiler (i2d2/decoding/compile.py) and the
constraint types and their validation (i2d2/decoding/constraints.py).

The decoder is checked against an independent count on the decoded text: a model whose next token is forced, step
by step, along a given token sequence is decoded under random small constraint sets, and what the decoder reports
(``satisfied``, ``all_satisfied``, ``matched``) must be what plain string processing of the text says.
"""

import random
import re

import pytest
import torch

from i2d2.decoding import (Clause, ConstraintError, ConstraintSet, CountConstraint, DecodingConfig, DynamicClause,
                           Literal, NeuroLogicDecoder)
from i2d2.decoding.compile import compile_batch
from i2d2.decoding.constraints import validate
from i2d2.models import tiny_model
from lm_tables import bigram_lm

_W = re.compile(r"[^\W_]+|[^\s]")


def _fold(word):
    return word[:1].lower() + word[1:]


def _ends(words, phrase):
    """Word indices just past each occurrence of ``phrase`` in ``words`` (overlapping ones included)."""
    ps = [_fold(w) for w in _W.findall(phrase)]
    return [i + len(ps) for i in range(len(words) - len(ps) + 1) if words[i:i + len(ps)] == ps]


def expected(text, cs):
    """What the constraints say of ``text``, by counting on its words: (satisfied per clause then dynamic clause,
    all satisfied, per clause the literals ``matched`` may name).  A clause is ranked where a positive literal of it
    first ends (ties by clause index); it holds if that rank is one of its positions, or if a negative literal is
    absent (the first absent one is named)."""
    words = [_fold(w) for w in _W.findall(text)]
    clauses = [(c.literals, c.positions) for c in cs.clauses]
    clauses += [([Literal(w) for w in d.words], d.positions) for d in cs.dynamic]
    first, first_lits = {}, {}
    for ci, (lits, _) in enumerate(clauses):
        for li in lits:
            e = _ends(words, li.text) if li.positive else []
            if e and (ci not in first or e[0] < first[ci]):
                first[ci], first_lits[ci] = e[0], [li.text]
            elif e and e[0] == first[ci]:
                first_lits[ci].append(li.text)
        # of literals ending together the first one-word literal is named, else any (phrases ending together)
        one_word = [x for x in first_lits.get(ci, []) if len(_W.findall(x)) == 1]
        if one_word:
            first_lits[ci] = one_word[:1]
    rank = {ci: r + 1 for r, ci in enumerate(sorted(first, key=lambda ci: (first[ci], ci)))}
    sat, matched = [], []
    for ci, (lits, positions) in enumerate(clauses):
        by_positive = ci in first and (not positions or rank[ci] in positions)
        absent = [li.text for li in lits if not li.positive and not _ends(words, li.text)]
        sat.append(by_positive or bool(absent))
        matched.append(set(first_lits[ci]) if by_positive else {f"NOT {absent[0]}"} if absent else {None})
    counts_ok = all(sum(len(_ends(words, w)) for w in {tuple(_fold(x) for x in _W.findall(w)): w
                                                       for w in g.words}.values()) <= g.max_count
                    for g in cs.counts)
    return sat, all(sat) and counts_ok, matched


def forced_decode(model, tok, seqs, css):
    """Decode one prompt per sequence, each forced along its token sequence (all of one length): the model gives
    the sequence's next token log-prob 0 and every other token -inf."""
    T, B = len(seqs[0]), len(seqs)
    V = model.get_output_embeddings().weight.shape[0]
    nxt = torch.tensor(seqs)
    step = [0]

    def hook(mod, args, kwargs, out):
        n = kwargs["input_ids"].shape[0]  # beam 1: one row per prompt
        logits = torch.full((n, kwargs["input_ids"].shape[1], V), float("-inf"))
        logits[torch.arange(n), -1, nxt[:, min(step[0], T - 1)]] = 0.0
        step[0] += 1
        out.logits = logits.to(out.logits.dtype)
        return out

    cfg = DecodingConfig(beam_size=1, num_return=1, max_new_tokens=T, min_new_tokens=0, prune_factor=50,
                         sat_tolerance=100, beta=0.0, batch_size=B, block_eos_until_satisfied=False,
                         early_stopping=False)
    h = model.register_forward_hook(hook, with_kwargs=True)
    try:
        return [g[0] for g in NeuroLogicDecoder(model, tok, cfg).decode(["x"] * B, css)]
    finally:
        h.remove()


# literal texts: prefixes of each other, a phrase repeating its word, case, punctuation, hyphens, digits, non-ASCII
PHRASES = ["car", "cars", "park", "car park", "park car", "The car", "the", "the the", "dog", "Dogs", "dog's",
           "dog ,", "ha", "ha ha", "ha ha ha", "ha-ha", "a", "is", "s", "Car", "CAR", "ca", "car2", "can't", "café",
           "park."]
PUNCT = [",", "'", "-", ".", "2"]  # also words of their own
SURFACES = ["car", "cars", "park", "the", "The", "dog", "Dogs", "dog's", "dogs,", "ha", "ha-ha", "s", "a", "is",
            "Car", "Park", "CAR", "car2", "can't", "café", "éclair", ",", "'", "-", ".", "2"]


def _random_set(rng, palette):
    """A random set whose literals and words are drawn from ``palette``: a few phrases, so that one set's literals
    repeat, overlap and prefix each other."""
    def lit():
        positive = rng.random() < 0.6
        return Literal(rng.choice(palette + PUNCT), positive)

    def positions():
        return sorted(rng.sample(range(1, 5), rng.randint(1, 2))) if rng.random() < 0.3 else None

    clauses = [Clause([lit() for _ in range(rng.randint(1, 4))], positions()) for _ in range(rng.randint(0, 3))]
    counts = [CountConstraint(rng.sample(palette + PUNCT, rng.randint(1, 3)), rng.randint(0, 2))
              for _ in range(rng.randint(0, 2))]
    dynamic = [DynamicClause(rng.sample(palette, rng.randint(1, 3)), rng.randint(1, 4), positions())
               for _ in range(rng.randint(0, 1))]
    return ConstraintSet(clauses, counts, dynamic)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_forced_texts_satisfy_what_a_count_on_the_text_says(arch):
    model, tok = tiny_model(arch)

    def pieces(words):
        """Tokenizations of each word with and without a space before it (none with a token unknown: llama's tiny
        vocabulary spells no 'é')."""
        out = [tok.encode(t, add_special_tokens=False) for w in words for t in (" " + w, " " + w, w)]
        return [ids for ids in out if ids and tok.unk_token_id not in ids]

    def text_tokens(T, palette):
        """T tokens of a text of the set's phrases and a surface word or two, so that words repeat ("ha ha ha") and
        the literals occur (a word cut at the end, or glued to the one before it, included)."""
        choice = pieces(palette + rng.sample(SURFACES, 2))
        out = []
        while len(out) < T:
            out += rng.choice(choice)
        return out[:T]

    rng = random.Random(7)
    checked = 0
    for _ in range(8):
        T = rng.randint(2, 9)
        css, seqs = [], []
        while len(css) < 16:
            palette = rng.sample(PHRASES, 3)
            a, b = rng.sample(palette, 2)  # one phrase in the other case, one grown by its last word ("ha ha ha")
            palette += [a[:1].swapcase() + a[1:], b + " " + _W.findall(b)[-1]]
            cs = _random_set(rng, palette)
            try:
                validate(cs)
            except ConstraintError:
                continue
            css.append(cs)
            seqs.append(text_tokens(T, palette))
        for seq, cs, g in zip(seqs, css, forced_decode(model, tok, seqs, css)):
            text = tok.decode(seq, skip_special_tokens=True).strip()
            if "\ufffd" in text:  # part of a character: the decoder reads its byte as a letter, the text can't
                continue
            sat, all_sat, matched = expected(text, cs)
            assert g.text == text
            assert (g.satisfied, g.all_satisfied) == (sat, all_sat), (text, cs, g)
            assert all(m in ok for m, ok in zip(g.matched, matched)), (text, cs, g.matched, matched)
            checked += 1
    assert checked > 100


# ------------------------------------------------------------------ lookahead path of a punctuation literal
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_punctuation_word_path_starts_at_its_own_token(arch):
    """' ,' is 'Ġ' ',' on GPT-2 and a bare ',' is '▁' ',' on SentencePiece.  The path of ',' started with that lone
    space, and no resume token followed it (a punctuation word has no letter to resume): the lookahead proposed the
    space again and again and never the mark itself."""
    model, tok = tiny_model(arch)
    dec = NeuroLogicDecoder(model, tok, DecodingConfig())
    marks = [",", ".", "-", "'", "(", "?"]
    cp = compile_batch([ConstraintSet([Clause([Literal(m) for m in marks + ["car"]])])], dec.tables, tok, "cpu", {})
    for m in marks:
        w = cp.words.index(m)
        for slot in range(2):
            path = [t for t in cp.path_tok[w, slot].tolist() if t >= 0]
            assert "".join(dec.tables.strings[t] for t in path) == m, (m, tok.convert_ids_to_tokens(path))
    w = cp.words.index("car")  # a word that opens with a letter keeps its space
    assert dec.tables.strings[int(cp.path_first[w, 0])].startswith(" ")


@pytest.mark.parametrize("arch, sp", [("gpt2", "Ġ"), ("llama", "▁")])
@pytest.mark.parametrize("mark", [",", "-"])
def test_required_punctuation_is_proposed(arch, sp, mark):
    """The mark is the 6th likeliest token (outside the 4 top candidates, inside prune_factor 10): only the
    lookahead can bring it in, as a word of a clause and of a dynamic clause."""
    model, tok = tiny_model(arch)
    fill = {f"{sp}the": 3.0, f"{sp}a": 2.9, f"{sp}is": 2.8, f"{sp}in": 2.7, f"{sp}to": 2.6}
    h = bigram_lm(model, tok, {mark: {"EOS": 5.0}}, {**fill, mark: 0.0, sp: -1.0, "EOS": -3.0})
    try:
        dec = NeuroLogicDecoder(model, tok, DecodingConfig(beam_size=2, num_return=2, max_new_tokens=4,
                                                           min_new_tokens=1, prune_factor=10, beta=0.0, batch_size=2))
        sets = [ConstraintSet([Clause([Literal(mark)])]), ConstraintSet(dynamic=[DynamicClause([mark, "zebra"], 1)])]
        for gens in dec.decode(["A dog"] * 2, sets):
            assert gens and gens[0].all_satisfied and mark in gens[0].text, gens
    finally:
        h.remove()


# ------------------------------------------------------------------ validation
@pytest.mark.parametrize("cs, msg", [
    # built in code, not through from_dict: "false" is truthy, the forbidden literal became a required one
    (ConstraintSet([Clause([Literal("dog", "false")], name="c")]), r"c: literal 'dog': positive: must be true or false"),
    # a bare TypeError naming nothing, or a silently truncated limit
    (ConstraintSet(counts=[CountConstraint(["a"], None, name="g")]), r"g: max_count: must be an integer, got None"),
    (ConstraintSet(counts=[CountConstraint(["a"], 1.5)]), r"count constraint 0: max_count: must be an integer"),
    (ConstraintSet(dynamic=[DynamicClause(["a"], None)]), r"dynamic clause 0: top_k: must be an integer"),
    (ConstraintSet(dynamic=[DynamicClause(["a"], 2.5)]), r"dynamic clause 0: top_k: must be an integer"),
    # with a name, the message named no literal
    (ConstraintSet([Clause([Literal("cat"), Literal("dog"), Literal("Dog", False)], name="taut")]),
     r"taut: literal 'Dog' is both required and forbidden"),
    # a forbidden word inside a required phrase: "hot dog" cannot be written without "dog"
    (ConstraintSet([Clause([Literal("hot dog")], name="need"), Clause([Literal("Dog", False)], name="no")]),
     r"no: literal 'Dog' is forbidden here but required by need"),
    (ConstraintSet([Clause([Literal("a hot dog")], name="need")], [CountConstraint(["the", "hot dog"], 0, name="g")]),
     r"g: word 'hot dog' is forbidden \(max_count=0\) but required by need"),
    # every literal of a positive clause forbidden outright (by a one-literal negative clause, by a max_count=0
    # word, or by one occurring in it): the clause could never be satisfied
    (ConstraintSet([Clause([Literal("dog"), Literal("cat")], name="need"),
                    Clause([Literal("dog", False)], name="no_dog")], [CountConstraint(["cat"], 0, name="g")]),
     r"need: every literal is forbidden elsewhere, so the clause can never be satisfied: 'dog' by no_dog, 'cat' by "
     r"g \(max_count=0\)$"),
    (ConstraintSet([Clause([Literal("hot dog"), Literal("Dogs")], name="need"), Clause([Literal("Dog", False)])],
                   [CountConstraint(["the", "dogs"], 0)]),
     r"need: .*: 'hot dog' by clause 1 \(NOT 'Dog'\) \('Dog' occurs in it\), 'Dogs' by count constraint 0 "
     r"\(max_count=0\)$"),
    (ConstraintSet(counts=[CountConstraint(["dog", "cat"], 0)], dynamic=[DynamicClause(["dog", "cat"], name="d")]),
     r"d: every literal is forbidden elsewhere.*'cat' by count constraint 0 \(max_count=0\)$"),
    # ranks stop at the number of clauses with a positive literal: the clause could never be satisfied
    (ConstraintSet([Clause([Literal("a")]), Clause([Literal("b")], positions=[3], name="third")]),
     r"third: positions \[3\] can never be reached: only 2 clauses"),
    (ConstraintSet([Clause([Literal("a", False)])], dynamic=[DynamicClause(["b"], positions=[2], name="d")]),
     r"d: positions \[2\] can never be reached: only 1 clauses"),
])
def test_malformed_or_contradictory_set_is_refused_naming_it(cs, msg):
    with pytest.raises(ConstraintError, match=msg):
        validate(cs)


@pytest.mark.parametrize("cs", [
    ConstraintSet([Clause([Literal("hot dog")])], [CountConstraint(["dog"], 1)]),  # one "dog" is allowed
    ConstraintSet([Clause([Literal("dog")]), Clause([Literal("hot dog", False)])]),  # "dog" without "hot" is fine
    ConstraintSet([Clause([Literal("a")]), Clause([Literal("b"), Literal("c", False)], positions=[5])]),  # absent c
    ConstraintSet([Clause([Literal("a")], positions=[1, 2]), Clause([Literal("b")], positions=[1, 2])],
                  dynamic=[DynamicClause(["c"], top_k=5.0, positions=[3])]),
    ConstraintSet([Clause([Literal("dog", 0), Literal("cat", 1)])], [CountConstraint(["the"], 2.0)]),
    # near misses of an all-forbidden clause: one literal is still allowed
    ConstraintSet([Clause([Literal("dog"), Literal("cat")]), Clause([Literal("dog", False)])],
                  [CountConstraint(["cat"], 1)]),  # one "cat" is allowed
    ConstraintSet([Clause([Literal("dog"), Literal("cat")]), Clause([Literal("dog", False), Literal("cat", False)])]),
    ConstraintSet([Clause([Literal("dog"), Literal("cat")]), Clause([Literal("dog", False)])],
                  [CountConstraint(["cats", "a cat"], 0)]),  # "cat" is neither "cats" nor contains "a cat"
    ConstraintSet([Clause([Literal("dog"), Literal("hot", False)]), Clause([Literal("dog", False)])]),  # absent hot
    ConstraintSet(counts=[CountConstraint(["dog", "a cat"], 0)], dynamic=[DynamicClause(["dog", "cat"])]),
])
def test_well_formed_sets_still_validate(cs):
    validate(cs)


# ------------------------------------------------------------------ matched literal within one token step
@pytest.mark.parametrize("text, later", [(" car park,", ","),  # ',' completes 'park', then is a word itself
                                         (" car park is", "is"),  # the last step: 'park' ends, then the text
                                         (" car park,", "park ,")])  # two phrases: not the later-listed one
def test_matched_names_the_phrase_that_ended_first_in_one_step(text, later):
    """The clause (car park OR <later>) is satisfied by 'car park' first, which ends a word before <later> in the
    same token step; ``matched`` named <later> (the phrase's literal was read only where no word event named the
    clause, and of phrases ending in one step the last listed)."""
    model, tok = tiny_model("gpt2")
    seq = tok.encode(text, add_special_tokens=False)
    g = forced_decode(model, tok, [seq], [ConstraintSet([Clause([Literal("car park"), Literal(later)])])])[0]
    assert g.text == text.strip() and g.satisfied == [True]
    assert g.matched == ["car park"]
