"""Lookahead under ordered clauses (``positions``): a proposed token whose word would satisfy a clause at a rank its
positions forbid, or would take the rank another clause still needs, breaks the order irreversibly.  Such tokens
took the few lookahead slots (ranked by log-prob) from the one token that keeps the order, so a satisfiable ordered
set came back unsatisfied."""

import re

import pytest

from i2d2.decoding import Clause, ConstraintSet, CountConstraint, DecodingConfig, Literal, NeuroLogicDecoder
from i2d2.models import tiny_model
from lm_tables import bigram_lm

_W = re.compile(r"[^\W_]+|[^\s]")

# the LM's top tokens fill the candidates; of the literal words, " than" and " more" are likelier than " the" / " car"
_ROW = {"Ġa": 3.0, "Ġare": 2.5, "Ġso": 2.5, "Ġis": 2.5, "Ġthan": 1.0, "Ġmore": 0.5, "Ġthe": -1.0, "Ġcar": -1.0,
        "EOS": -2.0}


@pytest.mark.parametrize("cs, first", [
    # "than" / "more" first would rank their clause 1st: its positions say 2nd
    (ConstraintSet([Clause([Literal("the")], positions=[1]),
                    Clause([Literal("than"), Literal("more")], positions=[2])]), "the"),
    # "than" or "more" first would take rank 1, which "car" needs
    (ConstraintSet([Clause([Literal("car")], positions=[1]), Clause([Literal("than")]), Clause([Literal("more")])]),
     "car"),
])
def test_lookahead_proposes_the_word_that_keeps_the_order(cs, first):
    model, tok = tiny_model("gpt2")
    h = bigram_lm(model, tok, {}, _ROW)
    try:
        cfg = DecodingConfig(beam_size=2, num_return=2, max_new_tokens=4, min_new_tokens=1, prune_factor=20,
                             lookahead=1, beta=0.0, batch_size=1)
        gens = NeuroLogicDecoder(model, tok, cfg).decode(["People say"], [cs])[0]
    finally:
        h.remove()
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
    model, tok = tiny_model("gpt2")
    h = bigram_lm(model, tok, {}, _ROW)
    try:
        cfg = DecodingConfig(beam_size=2, num_return=2, max_new_tokens=4, min_new_tokens=1, prune_factor=20,
                             lookahead=1, beta=0.0, batch_size=1)
        gens = NeuroLogicDecoder(model, tok, cfg).decode(["People say"], [cs])[0]
    finally:
        h.remove()
    assert gens and gens[0].all_satisfied, [(g.text, g.satisfied) for g in gens]
    assert "car" in _W.findall(gens[0].text), gens[0].text
