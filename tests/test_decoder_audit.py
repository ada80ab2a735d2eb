"""Regression tests for defects found by an independent audit of the NeuroLogic constraint parsing and result
collection (a brute-force checker over the decoded text, and malformed constraint dicts)."""

import pytest

from i2d2.decoding import Clause, ConstraintError, ConstraintSet, CountConstraint, DecodingConfig, DynamicClause, \
    Literal, NeuroLogicDecoder
from i2d2.decoding.constraints import validate
from i2d2.models import tiny_model
from lm_tables import bigram_lm


# ------------------------------------------------------------------ malformed constraint dicts (prompt files)
@pytest.mark.parametrize("d, msg", [
    # a string where a list belongs was iterated character by character: "dog" became d OR o OR g
    ({"clauses": [{"literals": "dog"}]}, r"clauses\[0\]\.literals: must be a list"),
    ({"counts": [{"words": "the", "max_count": 0}]}, r"counts\[0\]\.words: must be a list"),
    ({"dynamic": [{"words": "cheaper", "top_k": 1}]}, r"dynamic\[0\]\.words: must be a list"),
    # misspelt keys were ignored: the clause lost its positions, the literal became a required one
    ({"clauses": [{"literals": ["dog"], "position": [1]}]}, r"clauses\[0\]: unknown keys \['position'\]"),
    ({"clauses": [{"literals": [{"text": "dog", "postive": False}]}]},
     r"clauses\[0\]\.literals\[0\]: unknown keys \['postive'\]"),
    ({"dynamic": [{"words": ["a", "b"], "topk": 1}]}, r"dynamic\[0\]: unknown keys \['topk'\]"),
    # "false" is a truthy string: the forbidden literal became a required one
    ({"clauses": [{"literals": [{"text": "dog", "positive": "false"}]}]},
     r"clauses\[0\]\.literals\[0\]\.positive: must be true or false"),
    ({"clauses": [{"literals": [["dog", "false"]]}]}, r"clauses\[0\]\.literals\[0\]\[1\]: must be true or false"),
    # silently truncated, or a bare KeyError / TypeError naming no field
    ({"counts": [{"words": ["the"], "max_count": 1.9}]}, r"counts\[0\]\.max_count: must be an integer"),
    ({"counts": [{"words": ["a"], "max_count": None}]}, r"counts\[0\]\.max_count: must be an integer"),
    ({"dynamic": [{"words": ["a"], "top_k": None}]}, r"dynamic\[0\]\.top_k: must be an integer"),
    ({"clauses": [{"positions": [1]}]}, r"clauses\[0\]: missing 'literals'"),
    ({"clauses": [{"literals": [{"positive": False}]}]}, r"clauses\[0\]\.literals\[0\]: missing 'text'"),
    ({"counts": [{"words": ["a"]}]}, r"counts\[0\]: missing 'max_count'"),
    ({"clauses": {"literals": ["a"]}}, r"clauses: must be a list"),
    ({"clauses": [{"literals": [3]}]}, r"clauses\[0\]\.literals\[0\]: must be a mapping"),
])
def test_malformed_constraint_dict_is_refused_naming_the_field(d, msg):
    with pytest.raises(ConstraintError, match=msg):
        validate(ConstraintSet.from_dict(d))


def test_fractional_position_is_refused():
    with pytest.raises(ConstraintError, match="positions"):
        validate(ConstraintSet.from_dict({"clauses": [{"literals": ["a"], "positions": [1.5]}]}))


@pytest.mark.parametrize("cs", [ConstraintSet([Clause("dog")]), ConstraintSet(counts=[CountConstraint("the", 0)]),
                                ConstraintSet(dynamic=[DynamicClause("cheaper")])])
def test_string_for_a_list_is_refused_in_a_built_set(cs):
    with pytest.raises(ConstraintError, match="must be a list"):
        validate(cs)


def test_well_formed_dicts_still_parse():
    d = {"clauses": [{"literals": ["a", ["b", False], {"text": "c", "positive": 0}], "positions": [1, 2],
                      "name": "x"}],
         "counts": [{"words": ["a"], "max_count": 2.0, "name": None}],
         "dynamic": [{"words": ["b"], "top_k": 2, "positions": None}]}
    cs = ConstraintSet.from_dict(d)
    validate(cs)
    assert [l.positive for l in cs.clauses[0].literals] == [True, False, False]
    assert cs.counts[0].max_count == 2 and cs.dynamic[0].top_k == 2
    assert ConstraintSet.from_dict(cs.to_dict()) == cs


# ------------------------------------------------------------------ matched of an ordered clause met by absence
def test_matched_names_the_absent_negative_when_the_positive_came_at_a_forbidden_rank():
    """(often OR NOT dog) must be satisfied second; in 'often are.' 'often' comes first, so only the absence of
    'dog' satisfies the clause.  ``matched`` named 'often', a literal that did not satisfy it."""
    model, tok = tiny_model("gpt2")
    h = bigram_lm(model, tok, {"Ġoften": {"Ġare": 3.0}, "Ġare": {".": 3.0}, ".": {"EOS": 3.0}}, {"Ġoften": 3.0})
    try:
        cs = ConstraintSet([Clause([Literal("often"), Literal("dog", False)], positions=[2]),
                            Clause([Literal("are")])])
        dec = NeuroLogicDecoder(model, tok, DecodingConfig(beam_size=2, num_return=2, max_new_tokens=4,
                                                           min_new_tokens=1, batch_size=1))
        gens = dec.decode(["People"], [cs])[0]
    finally:
        h.remove()
    assert gens[0].text == "often are." and gens[0].all_satisfied, gens
    assert gens[0].satisfied == [True, True]
    assert gens[0].matched == ["NOT dog", "are"], gens[0]
