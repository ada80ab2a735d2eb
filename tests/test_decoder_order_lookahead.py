"""Lookahead under ordered clauses (``positions``): a proposed token whose word would satisfy a clause at a rank its
positions forbid, or would take the rank another clause still needs, breaks the order irreversibly.  Such tokens
took the few lookahead slots (ranked by log-prob) from the one token that keeps the order, so a satisfiable ordered
set came back unsatisfied.  So did a word that would break a one-literal negative clause or a count limit."""

import re

import pytest

from i2d2.decoding import Clause, ConstraintSet, CountConstraint, DecodingConfig, Literal, NeuroLogicDecoder
from i2d2.models import tiny_model
from lm_tables import bigram_lm

_W = re.compile(r"[^\W_]+|[^\s]")

# the LM's top tokens fill the candidates; of the literal words, " than" and " more" are likelier than " the" / " car"
_ROW = {"Ġa": 3.0, "Ġare": 2.5, "Ġso": 2.5, "Ġis": 2.5, "Ġthan": 1.0, "Ġmore": 0.5, "Ġthe": -1.0, "Ġcar": -1.0,
        "EOS": -2.0}


def _decode(cs, row=_ROW, rows=None, **kw):
    """The generations of "People say" under ``cs``, the LM's next-token logits ``row`` after every token (``rows``:
    after the tokens it names)."""
    model, tok = tiny_model("gpt2")
    h = bigram_lm(model, tok, rows or {}, row)
    try:
        cfg = DecodingConfig(**{**dict(beam_size=2, num_return=2, max_new_tokens=4, min_new_tokens=1, prune_factor=20,
                                       lookahead=1, beta=0.0, batch_size=1), **kw})
        return NeuroLogicDecoder(model, tok, cfg).decode(["People say"], [cs])[0]
    finally:
        h.remove()


@pytest.mark.parametrize("cs, first", [
    # "than" / "more" first would rank their clause 1st: its positions say 2nd
    (ConstraintSet([Clause([Literal("the")], positions=[1]),
                    Clause([Literal("than"), Literal("more")], positions=[2])]), "the"),
    # "than" or "more" first would take rank 1, which "car" needs
    (ConstraintSet([Clause([Literal("car")], positions=[1]), Clause([Literal("than")]), Clause([Literal("more")])]),
     "car"),
])
def test_lookahead_proposes_the_word_that_keeps_the_order(cs, first):
    gens = _decode(cs)
    assert gens and gens[0].all_satisfied, [(g.text, g.satisfied) for g in gens]
    assert _W.findall(gens[0].text)[0] == first, gens[0].text


@pytest.mark.parametrize("cs", [
    # "than" would break the one-literal negative clause: only "car" satisfies the OR
    ConstraintSet([Clause([Literal("than"), Literal("car")]), Clause([Literal("than", False)])]),
    # "than" is allowed 0 times
    ConstraintSet([Clause([Literal("than"), Literal("car")])], [CountConstraint(["than", "more"], 0)]),
    # "more" once already (the prompt's words never count: "more" must come first), "than" shares its limit
    ConstraintSet([Clause([Literal("more")], positions=[1]), Clause([Literal("than"), Literal("car")])],
                  [CountConstraint(["than", "more"], 1)]),
])
def test_lookahead_skips_a_word_that_is_forbidden(cs):
    """An OR's literal forbidden elsewhere (validate allows it: the other literal can satisfy the clause) was
    proposed, ranked by log-prob, in place of the allowed one."""
    gens = _decode(cs)
    assert gens and gens[0].all_satisfied, [(g.text, g.satisfied) for g in gens]
    assert "car" in _W.findall(gens[0].text), gens[0].text


# with a phrase among the literals the lookahead reads each literal's current word at every step (not the fixed
# per-literal tables of one-word sets): the same words are ruled out there; " hot" is likelier than " car" / " the"
_PHRASE_ROW = {**_ROW, "Ġhot": 2.0, "Ġdog": 1.0}


@pytest.mark.parametrize("cs", [
    ConstraintSet([Clause([Literal("than"), Literal("car")]), Clause([Literal("than", False)]),
                   Clause([Literal("hot dog")])]),
    ConstraintSet([Clause([Literal("than"), Literal("car")]), Clause([Literal("hot dog")])],
                  [CountConstraint(["than", "more"], 0)]),
    ConstraintSet([Clause([Literal("more")], positions=[1]), Clause([Literal("than"), Literal("car")]),
                   Clause([Literal("hot dog")])], [CountConstraint(["than", "more"], 1)]),
    # "hot dog" or "than" first would rank their clause 1st: its positions say 2nd
    ConstraintSet([Clause([Literal("the")], positions=[1]),
                   Clause([Literal("than"), Literal("hot dog")], positions=[2])]),
])
def test_lookahead_rules_out_the_same_words_beside_a_phrase(cs):
    gens = _decode(cs, _PHRASE_ROW, beam_size=4, beta=2.0)
    assert gens and gens[0].all_satisfied, [(g.text, g.satisfied) for g in gens]


@pytest.mark.parametrize("cs, text", [
    (ConstraintSet([Clause([Literal("park"), Literal("car")]), Clause([Literal("park", False)])]), "par car"),
    (ConstraintSet([Clause([Literal("park"), Literal("car")])], [CountConstraint(["park"], 0)]), "par car"),
    # "park" now would rank its clause 1st: its positions say 2nd
    (ConstraintSet([Clause([Literal("the")], positions=[1]),
                    Clause([Literal("park"), Literal("car")], positions=[2])]), "par the car"),
])
def test_lookahead_does_not_continue_a_word_it_would_not_start(cs, text):
    """" park" is " par" + "k": after the LM's " par" the continuation "k" (a literal under way, proposed first) took
    the one lookahead slot from " car" / " the", though completing "park" breaks the negative clause, the count
    limit or the order."""
    # " par" is the only first token the LM allows (" car" not yet); then its top 4 tokens hold "k", not " car"
    gens = _decode(cs, {"Ġa": 3.0, "Ġare": 2.5, "Ġso": 2.5, "k": 2.0, "Ġcar": -1.0, "Ġthe": -1.0, "EOS": -2.0},
                   {"ay": {"Ġpar": 3.0, "EOS": -5.0}}, max_new_tokens=len(text.split()))
    assert [g.text for g in gens if g.all_satisfied] == [text], [(g.text, g.satisfied) for g in gens]
