"""NeuroLogic decoder: constraints checked on the decoded text, independently of the decoder's own flags."""

import itertools
import json
import math
import re
from dataclasses import fields

import numpy as np

import pytest
import torch

from i2d2.decoding import (Clause, ConstraintError, ConstraintSet, CountConstraint, DecodingConfig, DynamicClause,
                           Literal, NeuroLogicDecoder)
from i2d2.decoding.constraints import validate
from i2d2.models import tiny_model
from lm_tables import bigram_lm

# ---------------------------------------------------------------- an independent checker on plain text
_W = re.compile(r"[^\W_]+|[^\s]")


def words_of(text):
    return _W.findall(text)


def _same(a, b):
    return a == b or (a[:1].lower() + a[1:]) == (b[:1].lower() + b[1:])


def occurrences(text, phrase):
    """Start indices (in words) where `phrase` occurs as whole words (first letter case-insensitive)."""
    ws, ps = words_of(text), words_of(phrase)
    return [i for i in range(len(ws) - len(ps) + 1) if all(_same(ws[i + j], ps[j]) for j in range(len(ps)))]


def check(text, cs: ConstraintSet):
    """True iff `text` satisfies every clause, count and dynamic clause (dynamic = any list word appears)."""
    first_sat = {}
    for ci, c in enumerate(cs.clauses):
        ok = False
        for lit in c.literals:
            occ = occurrences(text, lit.text)
            if lit.positive and occ:
                ok = True
                first_sat[ci] = min(first_sat.get(ci, 10 ** 9), occ[0] + len(words_of(lit.text)))
            if not lit.positive and not occ:
                ok = True
        if not ok:
            return False
    for di, d in enumerate(cs.dynamic):
        ends = [o + len(words_of(w)) for w in d.words for o in occurrences(text, w)]
        if not ends:
            return False
        first_sat[len(cs.clauses) + di] = min(ends)
    for g in cs.counts:
        if sum(len(occurrences(text, w)) for w in set(g.words)) > g.max_count:
            return False
    ranked = sorted(first_sat, key=lambda k: first_sat[k])
    allc = list(cs.clauses) + list(cs.dynamic)
    for r, k in enumerate(ranked, 1):
        if allc[k].positions and r not in allc[k].positions:
            return False
    return True


# ---------------------------------------------------------------- fixtures
@pytest.fixture(scope="module", params=["gpt2", "llama"])
def lm(request):
    return tiny_model(request.param)


def cfg(**kw):
    base = dict(beam_size=6, num_return=4, max_new_tokens=14, min_new_tokens=1, prune_factor=5000, beta=3.0,
                sat_tolerance=2, batch_size=3)
    base.update(kw)
    return DecodingConfig(**base)


PROMPTS = ["Compared to cars, bicycles", "A dog is", "Typically, birds", "Water is"]


def test_decoding_presets_compose_to_the_papers_settings():
    from hydra import compose, initialize_config_dir

    from i2d2.config import CONF_DIR
    from i2d2.lightning_setup import plain

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        i2d2 = DecodingConfig(**plain(compose("decoding/i2d2").decoding))
        nc = DecodingConfig(**plain(compose("decoding/comparatives").decoding))
    assert (i2d2.beam_size, i2d2.num_return, i2d2.length_penalty, i2d2.prune_factor) == (10, 10, 0.1, 50)
    assert (nc.beam_size, nc.no_repeat_ngram_size, nc.beta, nc.sat_tolerance) == (15, 3, 1.25, 3)
    assert i2d2.stop_strings == nc.stop_strings == [".", "!", "?", "\n"]


def test_constraint_set_roundtrip():
    cs = ConstraintSet([Clause([Literal("have"), Literal("the cat", False)], positions=[1, 2], name="aux")],
                       [CountConstraint(["in", "on"], 1)], [DynamicClause(["bigger", "smaller"], 3, [2])])
    d = json.loads(json.dumps(cs.to_dict()))
    assert ConstraintSet.from_dict(d) == cs


def test_positive_negative_count_order_hold_on_text(lm):
    model, tok = lm
    dec = NeuroLogicDecoder(model, tok, cfg())
    sets = [
        ConstraintSet([Clause([Literal("cat")]), Clause([Literal("the", False)])]),
        ConstraintSet([Clause([Literal("dog")], positions=[1]), Clause([Literal("water")], positions=[2]),
                       Clause([Literal("is", False)])]),
        ConstraintSet([Clause([Literal("people"), Literal("bird")]), Clause([Literal("often")])],
                      [CountConstraint(["of", "the", "a"], 0)]),
        ConstraintSet([Clause([Literal("have"), Literal("are")], positions=[1])],
                      dynamic=[DynamicClause(["bigger", "sweeter", "faster", "colder"], top_k=2, positions=[2])]),
    ]
    res = dec.decode(PROMPTS, sets)
    assert len(res) == len(PROMPTS)
    for gens, cs, p in zip(res, sets, PROMPTS):
        assert 1 <= len(gens) <= 4
        for g in gens:
            assert g.all_satisfied, (p, g)
            assert check(g.text, cs), (p, g.text)  # independent of the decoder's flags
            assert all(g.satisfied) and len(g.satisfied) == len(cs.clauses) + len(cs.dynamic)
            assert all(m is not None for m in g.matched)
        assert [g.score for g in gens] == sorted([g.score for g in gens], reverse=True)
        g = gens[0]
        assert math.isclose(g.score, g.logprob / g.num_tokens ** 0.1, rel_tol=1e-4)


def test_negatives_and_counts_bite(lm):
    """Forbid the words the unconstrained decoder likes most; they must vanish, counts must hold."""
    model, tok = lm
    dec = NeuroLogicDecoder(model, tok, cfg(beta=0.0))
    free = dec.decode(PROMPTS[:2], [ConstraintSet(), ConstraintSet()])
    sets = []
    for gens in free:
        ws = [w for g in gens for w in words_of(g.text) if w.isalpha()]
        common = [w for w, _ in sorted(((w, ws.count(w)) for w in set(ws)), key=lambda x: -x[1])]
        assert common
        sets.append(ConstraintSet([Clause([Literal(w, False)]) for w in common[:2]],
                                  [CountConstraint(common[2:5] or ["xyz"], 1)]))
    res = dec.decode(PROMPTS[:2], sets)
    for gens, cs in zip(res, sets):
        assert gens
        for g in gens:
            for c in cs.clauses:
                assert not occurrences(g.text, c.literals[0].text), (c.literals[0].text, g.text)
            assert sum(len(occurrences(g.text, w)) for w in cs.counts[0].words) <= 1
            assert g.all_satisfied and check(g.text, cs)


def test_multiword_phrase_and_mixed_clause(lm):
    model, tok = lm
    dec = NeuroLogicDecoder(model, tok, cfg(max_new_tokens=16))
    cs = ConstraintSet([Clause([Literal("a dog")]), Clause([Literal("water"), Literal("is", False)])])
    gens = dec.decode(["Cars have"], [cs])[0]
    for g in gens:
        assert g.all_satisfied and check(g.text, cs), g.text
        assert occurrences(g.text, "a dog")


def test_brute_force_equivalence_on_tiny_vocab():
    """Vocabulary restricted to 5 tokens + EOS, 4 new tokens: exhaustive search vs the decoder."""
    model, tok = tiny_model("gpt2", seed=3)
    allowed = [tok.convert_tokens_to_ids(t) for t in ["Ġc", "at", "Ġdog", "Ġthe", "."]] + [tok.eos_token_id]
    assert all(i is not None and i != tok.unk_token_id for i in allowed)
    mask = torch.full((model.config.vocab_size,), float("-inf"))
    mask[allowed] = 0
    h = model.lm_head.register_forward_hook(lambda m, i, o: o + mask)
    try:
        cs = ConstraintSet([Clause([Literal("cat")]), Clause([Literal("the", False)])])
        T, alpha, prompt = 4, 0.1, "A dog is"
        c = DecodingConfig(beam_size=150, num_return=3, max_new_tokens=T, min_new_tokens=1, length_penalty=alpha,
                           prune_factor=1000, sat_tolerance=10, early_stopping=False, batch_size=1)
        got = NeuroLogicDecoder(model, tok, c).decode([prompt], [cs])[0]
        # exhaustive: every sequence over the 5 tokens of length T, log-probs of all prefixes + EOS
        body = allowed[:-1]
        seqs = torch.tensor(list(itertools.product(body, repeat=T)))
        pids = tok(prompt, return_tensors="pt")["input_ids"][0]
        inp = torch.cat([pids.expand(len(seqs), -1), seqs], 1)
        with torch.no_grad():
            lp = torch.log_softmax(model(inp).logits.float(), -1)[:, len(pids) - 1:]
        best = {}
        for s in range(len(seqs)):
            acc = 0.0
            for n in range(1, T + 1):
                acc += float(lp[s, n - 1, seqs[s, n - 1]])
                ids = tuple(seqs[s, :n].tolist())
                ends = [("eos", acc + float(lp[s, n, tok.eos_token_id]))]  # EOS after n tokens
                if n == T:
                    ends.append(("max", acc))  # stopped by max_new_tokens
                text = tok.decode(list(ids)).strip()
                if check(text, cs):
                    for how, total in ends:
                        best[(ids, how)] = (total / n ** alpha, text)
        ranked = sorted(best.values(), key=lambda x: -x[0])
        assert got and got[0].all_satisfied
        assert math.isclose(got[0].score, ranked[0][0], rel_tol=1e-4), (got[0], ranked[:3])
        assert got[0].text == ranked[0][1]
    finally:
        h.remove()


def test_unsatisfiable_returns_flagged_partials(lm):
    model, tok = lm
    dec = NeuroLogicDecoder(model, tok, cfg(max_new_tokens=6))
    cs = ConstraintSet([Clause([Literal("dog")], positions=[1]), Clause([Literal("water")], positions=[1]),
                        Clause([Literal("the", False)])])
    short = NeuroLogicDecoder(model, tok, cfg(max_new_tokens=1))
    part = dec.decode(["A cat"], [cs])[0]
    res = part + short.decode(["A cat"], [ConstraintSet([Clause([Literal("typically")])])])[0]
    assert part and res
    nsat = [sum(g.satisfied) for g in part]  # best partial first: most clauses satisfied, then S
    assert nsat == sorted(nsat, reverse=True), [(g.text, g.satisfied) for g in part]
    for g in res:
        assert not g.all_satisfied
        assert False in g.satisfied
        assert not occurrences(g.text, "the")  # satisfiable parts still hold


@pytest.mark.parametrize("cs, msg", [
    (ConstraintSet([Clause([Literal("")])]), "empty"),
    (ConstraintSet([Clause([Literal("   ")], name="blank")]), "blank"),
    (ConstraintSet([Clause([Literal("dog")], name="need-dog"), Clause([Literal("dog", False)], name="no-dog")]),
     "no-dog"),
    (ConstraintSet([Clause([Literal("Dog")], name="need-dog")], [CountConstraint(["dog"], 0, name="nodogs")]),
     "nodogs"),
    (ConstraintSet([Clause([Literal("dog"), Literal("dog", False)], name="taut")]), "taut"),
    (ConstraintSet([Clause([], name="nolits")]), "nolits"),
    (ConstraintSet([Clause([Literal("dog")], positions=[0], name="badpos")]), "badpos"),
])
def test_bad_constraints_raise_naming_clause(tiny_gpt2, cs, msg):
    model, tok = tiny_gpt2
    dec = NeuroLogicDecoder(model, tok, cfg())
    with pytest.raises(ConstraintError, match=msg):
        dec.decode(["A dog"], [cs])


def test_phrase_tokenizing_to_nothing_names_clause():
    cs = ConstraintSet([Clause([Literal("dog")], name="first"), Clause([Literal("zzz")], name="ghost")])
    with pytest.raises(ConstraintError, match="ghost.*tokenizes to nothing"):
        validate(cs, encode=lambda s: [] if "zzz" in s else [1])


def test_word_lists_checked_once_per_caller():
    """A word list found well formed is not checked again (NeuroComparatives repeats ~300 words in every set); a
    list that differs is, and its error names the set."""
    calls = []

    def encode(s):
        calls.append(s)
        return [] if "zzz" in s else [1]

    checked = set()
    ok = ConstraintSet(dynamic=[DynamicClause(["bigger", "smaller"])], counts=[CountConstraint(["he", "she"], 0)])
    validate(ok, encode, checked=checked)
    n = len(calls)
    validate(ok, encode, checked=checked)
    assert n == 4 and len(calls) == n
    bad = ConstraintSet(counts=[CountConstraint(["he", "zzz"], 0, name="pronouns")])
    with pytest.raises(ConstraintError, match="prompt 3: pronouns.*'zzz' tokenizes to nothing"):
        validate(bad, encode, where="prompt 3", checked=checked)
    assert ("he", "zzz") not in checked
    # a word that is not a string is named, not hashed (a list in a list from JSON)
    odd = ConstraintSet.from_dict({"counts": [{"words": [["a"]], "max_count": 0, "name": "nested"}]})
    with pytest.raises(ConstraintError, match="nested: empty word"):
        validate(odd, encode, checked=checked)


def test_head_larger_than_tokenizer_and_no_constraint_matches_hf_beam():
    import transformers as tf

    _, tok = tiny_model("gpt2")
    torch.manual_seed(0)
    model = tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=len(tok) + 37, n_positions=64, n_embd=32, n_layer=1,
                                             n_head=2, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                                             bos_token_id=tok.bos_token_id)).eval()
    c = DecodingConfig(beam_size=4, num_return=4, max_new_tokens=8, min_new_tokens=1, length_penalty=0.0, batch_size=2)
    dec = NeuroLogicDecoder(model, tok, c)
    prompts = ["A dog is", "Compared to cars, trains"]
    res = dec.decode(prompts, [ConstraintSet(), None])
    banned = [i for i in tok.all_special_ids if i != tok.eos_token_id] + list(range(len(tok), len(tok) + 37))
    enc = tok(prompts, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**enc, num_beams=4, num_return_sequences=1, max_new_tokens=8, min_new_tokens=1,
                             length_penalty=0.0, early_stopping=True, do_sample=False, suppress_tokens=banned,
                             pad_token_id=tok.pad_token_id)
    for i, gens in enumerate(res):
        hf = tok.decode(out[i, enc["input_ids"].shape[1]:], skip_special_tokens=True).strip()
        assert gens[0].text == hf
        assert all(0 <= t for t in tok(gens[0].text)["input_ids"])


@pytest.mark.filterwarnings("error::FutureWarning")  # the KV cache goes by the model's own keyword (see below)
def test_seq2seq_decoder():
    model, tok = tiny_model("bart")
    dec = NeuroLogicDecoder(model, tok, cfg(max_new_tokens=10, beam_size=4, num_return=2))
    cs = ConstraintSet([Clause([Literal("dog")]), Clause([Literal("the", False)])])
    gens = dec.decode(["Dogs are loyal companions."], [cs])[0]
    assert gens
    for g in gens:
        assert g.all_satisfied and check(g.text, cs), g.text


def test_seq2seq_batch_of_prompts_of_different_lengths():
    """An encoder-decoder's attention mask is the encoder's (one per prompt): it is reordered with the beams, never
    grown by a column per step (which broke any batch whose prompts differ in length). Each prompt decodes in a batch
    as it does alone."""
    model, tok = tiny_model("bart")
    dec = NeuroLogicDecoder(model, tok, cfg(max_new_tokens=10, beam_size=4, num_return=2))
    cs = ConstraintSet([Clause([Literal("dog")]), Clause([Literal("the", False)])])
    prompts = ["Dogs are loyal companions.", "A dog", "Cats and dogs are pets that people keep at home."]
    batch = dec.decode(prompts, [cs] * 3)
    for p, gens in zip(prompts, batch):
        alone = dec.decode([p], [cs])[0]
        assert gens and [g.text for g in gens] == [g.text for g in alone]
        assert [g.score for g in gens] == pytest.approx([g.score for g in alone], abs=1e-4)
    # the validation's tokenization cache survives the batches (the encoder's outputs were stored under its name)
    assert isinstance(dec._enc, dict) and " dog" in dec._enc


def test_batching_each_prompt_own_constraints(tiny_gpt2):
    model, tok = tiny_gpt2
    words = ["dog", "water", "people", "often", "cat"]
    sets = [ConstraintSet([Clause([Literal(w)]), Clause([Literal(words[(i + 1) % 5], False)])])
            for i, w in enumerate(words)]
    prompts = [f"Prompt number {i} is" for i in range(5)]
    res = NeuroLogicDecoder(model, tok, cfg(batch_size=2)).decode(prompts, sets, progress=True)
    for gens, cs, w in zip(res, sets, words):
        assert gens
        for g in gens:
            assert check(g.text, cs) and occurrences(g.text, w), (w, g.text)


def _restrict(model, tok, pieces):
    ids = [tok.convert_tokens_to_ids(t) for t in pieces] + [tok.eos_token_id]
    assert all(i is not None and i != tok.unk_token_id for i in ids), pieces
    mask = torch.full((model.config.vocab_size,), float("-inf"))
    mask[ids] = 0
    return model.lm_head.register_forward_hook(lambda m, i, o: o + mask)


def test_any_tokenization_counts():
    """'cat' spelled 'Ġc'+'a'+'t' (not the canonical 'Ġc'+'at') is still the word 'cat'."""
    model, tok = tiny_model("gpt2", seed=1)
    h = _restrict(model, tok, ["Ġc", "a", "t", "at", "Ġdog", "."])
    try:
        c = cfg(beta=0.0, max_new_tokens=8)
        forbid = ConstraintSet([Clause([Literal("cat", False)]), Clause([Literal("a", False)])])
        for g in NeuroLogicDecoder(model, tok, c).decode(["A dog"], [forbid])[0]:
            assert not occurrences(g.text, "cat") and not occurrences(g.text, "a"), g.text
    finally:
        h.remove()
    h = _restrict(model, tok, ["Ġc", "a", "t", "Ġdog", "."])  # no 'at': only c+a+t spells cat
    try:
        need = ConstraintSet([Clause([Literal("cat")])])
        gens = NeuroLogicDecoder(model, tok, cfg(beta=2.0, max_new_tokens=8)).decode(["A dog"], [need])[0]
        assert gens and all(g.all_satisfied and occurrences(g.text, "cat") for g in gens)
    finally:
        h.remove()


def test_pending_literal_word_joins_its_satisfied_group():
    """Regression (NeuroComparatives 'are typically'): a hypothesis whose last token spells the second literal
    ('dog water', 'water' still pending until the next separator) must rank in the group of both clauses, not
    low inside the {dog} group, where the round-robin beam drops it.  Here 'water' is reachable only right
    after 'dog' and six fillers outscore it there by more than beta, so losing it loses every satisfying text."""
    model, tok = tiny_model("gpt2")
    fill = ["Ġthe", "Ġa", "Ġof", "Ġis", "Ġin", "Ġon"]
    rows = {"Ġdog": {t: 3.0 - 0.2 * i for i, t in enumerate(fill)} | {"Ġwater": 0.0, "EOS": -5.0},
            "Ġwater": {".": 3.0, "Ġthe": 1.0, "EOS": 0.0}, ".": {"EOS": 5.0, "Ġthe": 0.0}}
    rows |= {t: {f: 1.0 for f in fill} | {"EOS": 0.0} for t in fill}
    h = bigram_lm(model, tok, rows, {"Ġdog": 2.0, "Ġthe": 1.0, "Ġa": 0.8, "Ġof": 0.6, "Ġis": 0.4, "EOS": -5.0})
    try:
        cs = ConstraintSet([Clause([Literal("dog")]), Clause([Literal("water")])])
        c = DecodingConfig(beam_size=4, num_return=4, max_new_tokens=6, min_new_tokens=1, prune_factor=50,
                           sat_tolerance=3, beta=1.25, batch_size=1)
        gens = NeuroLogicDecoder(model, tok, c).decode(["People say"], [cs])[0]
        assert gens and gens[0].text == "dog water.", [(g.text, g.satisfied) for g in gens]
        for g in gens:
            assert g.all_satisfied and check(g.text, cs) and g.matched == ["dog", "water"], g
    finally:
        h.remove()


def test_unsatisfiable_best_partial_satisfies_most_clauses():
    """'people' is unreachable, so the set is unsatisfiable; 'the ...' is likelier than 'dog ...', but the best
    partial result is the one satisfying the most clauses (NeuroLogic's final selection), flagged unsatisfied."""
    model, tok = tiny_model("gpt2")
    nxt = {".": 1.0, "Ġthe": 0.5}
    h = bigram_lm(model, tok, {"Ġthe": nxt, "Ġdog": nxt, ".": {"Ġthe": 0.0, "EOS": 0.0}},
                {"Ġthe": 2.0, "Ġdog": 0.0, "Ġpeople": float("-inf")})
    try:
        cs = ConstraintSet([Clause([Literal("dog")]), Clause([Literal("people")])])
        c = DecodingConfig(beam_size=4, num_return=4, max_new_tokens=3, min_new_tokens=1, sat_tolerance=3,
                           beta=0.0, batch_size=1)
        gens = NeuroLogicDecoder(model, tok, c).decode(["People say"], [cs])[0]
        assert gens and not any(g.all_satisfied for g in gens)
        assert gens[0].satisfied == [True, False] and occurrences(gens[0].text, "dog"), gens[0]
        assert any(not occurrences(g.text, "dog") and g.score > gens[0].score for g in gens), gens
        nsat = [sum(g.satisfied) for g in gens]
        assert nsat == sorted(nsat, reverse=True)
    finally:
        h.remove()


def test_no_repeat_ngram_and_gemma_arch():
    model, tok = tiny_model("gemma")  # sliding-window cache layers, SentencePiece-style tokenizer
    dec = NeuroLogicDecoder(model, tok, cfg(no_repeat_ngram_size=2, max_new_tokens=14, beta=0.0))
    seen = {}
    orig = dec._collect

    def spy(cp, css, fin_seq, fin_lp, fin_S, fin_n, *rest):
        seen["seq"], seen["n"], seen["S"] = fin_seq.clone(), fin_n.clone(), fin_S.clone()
        return orig(cp, css, fin_seq, fin_lp, fin_S, fin_n, *rest)

    dec._collect = spy
    cs = ConstraintSet([Clause([Literal("the", False)])], [CountConstraint(["a", "of"], 1)])
    res = dec.decode(["A dog is", "Ovens have"], [cs, cs])
    for gens in res:
        assert gens and all(check(g.text, cs) for g in gens)
    checked = 0
    for b in range(2):
        for r in range(seen["seq"].shape[1]):
            if math.isfinite(float(seen["S"][b, r])):
                ids = seen["seq"][b, r, : int(seen["n"][b, r])].tolist()
                grams = list(zip(ids, ids[1:]))
                assert len(grams) == len(set(grams)), ids
                checked += 1
    assert checked >= 2


@pytest.mark.slow
def test_packaged_gemma(gemma):
    model, tok = gemma
    dec = NeuroLogicDecoder(model, tok, DecodingConfig(beam_size=4, num_return=2, max_new_tokens=12, batch_size=2,
                                                       beta=1.25))
    cs = ConstraintSet([Clause([Literal("often")]), Clause([Literal("bicycle", False)])],
                       [CountConstraint(["the", "a", "of"], 1)])
    for gens in dec.decode(["Generally, a bicycle", "Dogs are"], [cs, cs]):
        for g in gens:
            assert check(g.text, cs), g.text


def test_stop_strings_end_hypotheses_at_sentence_end(lm):
    """With stop_strings a hypothesis finishes at its first sentence end: one generic, one sentence."""
    model, tok = lm
    cs = ConstraintSet([Clause([Literal(".")]), Clause([Literal("dog")])])
    dec = NeuroLogicDecoder(model, tok, cfg(stop_strings=[".", "\n"], max_new_tokens=16))
    for gens in dec.decode(PROMPTS[:2], [cs, cs]):
        assert gens
        for g in gens:
            if g.all_satisfied:
                assert g.text.endswith(".") and g.text.count(".") == 1, g.text
                assert "\n" not in g.text
            assert check(g.text, cs) == g.all_satisfied, g.text


def test_compiled_tables_per_literal(tiny_gpt2):
    """The batch tables the step reads: the first literal of a clause spelling a word is the one reported, a word
    counts once per count group, a single word's trie progress is matched letters / word length in either case
    variant, and a phrase's character offsets are per word."""
    from i2d2.decoding.compile import compile_batch
    from i2d2.decoding.constraints import phrase_words

    model, tok = tiny_gpt2
    dec = NeuroLogicDecoder(model, tok, DecodingConfig())
    rows = [ConstraintSet(clauses=[Clause([Literal("Dogs"), Literal("dogs"), Literal("used for")])],
                          counts=[CountConstraint(["cats", "cats", "the"], 1), CountConstraint(["cats"], 2)]),
            ConstraintSet(dynamic=[DynamicClause(["bigger", "dogs"], top_k=1)])]
    cp = compile_batch(rows, dec.tables, tok, "cpu", {})
    w = {x: i for i, x in enumerate(cp.words)}
    lits = [[li.text for li in r] for r in cp.lits]
    assert cp.wlit[0, w["dogs"], 0].item() == lits[0].index("Dogs")  # the first of the two spellings
    assert cp.wtab[0, w["dogs"], 0].item() == 2  # both are literals of clause 0
    G0 = 2 * cp.Cl
    assert cp.wtab[0, w["cats"], G0].item() == 1 and cp.wtab[0, w["cats"], G0 + 1].item() == 1
    assert cp.wtab[0, w["the"], G0].item() == 1 and cp.wtab[0, w["the"], G0 + 1].item() == 0
    node = {s: i for s, i in zip(*_trie_nodes(cp))}
    for prefix, frac in [("dog", 0.75), ("Dog", 0.75), ("do", 0.5), ("D", 0.25)]:
        assert cp.node_prog[0, node[prefix], 0].item() == pytest.approx(frac)
    assert cp.node_prog[1, node["bigg"], 0].item() == pytest.approx(4 / 6)
    assert cp.node_prog[1, node["bigg"], 0].item() > 0 and cp.node_prog[0, node["bigg"], 0].item() == 0
    k = [i for i, li in enumerate(cp.lits[0]) if li.positive and li.clause == 0].index(lits[0].index("used for"))
    assert cp.pos_charlen[0, k].tolist()[:3] == [0.0, 4.0, 7.0]
    assert phrase_words("Used for") == ("used", "for") and cp.pos_dyn[1, :2].tolist() == [0, 0]


def test_compile_with_a_warm_word_cache_equals_a_cold_compile(tiny_gpt2):
    """Per-word tables are kept across batches (the decoder's cache); a batch compiled after others that share
    some of its words gets exactly the tables of a compile from nothing: same node ids, paths and progress."""
    from i2d2.decoding.compile import compile_batch

    model, tok = tiny_gpt2
    dec = NeuroLogicDecoder(model, tok, DecodingConfig())
    first = [ConstraintSet(clauses=[Clause([Literal("bigger dogs"), Literal("the")])],
                           dynamic=[DynamicClause(["faster", "Bigger", "café"], top_k=2)])]
    rows = [ConstraintSet(clauses=[Clause([Literal("dogs")], positions=[1]), Clause([Literal("used for", False)])],
                          counts=[CountConstraint(["cats", "the", "so so"], 1)],
                          dynamic=[DynamicClause(["bigger", "faster", "more expensive", "café"], top_k=2)]),
            ConstraintSet(clauses=[Clause([Literal("A cat")])])]
    warm = {}
    compile_batch(first, dec.tables, tok, "cpu", warm)
    a, b = compile_batch(rows, dec.tables, tok, "cpu", warm), compile_batch(rows, dec.tables, tok, "cpu", {})
    for k, v in vars(b).items():
        w = getattr(a, k)
        if isinstance(v, torch.Tensor):
            assert v.dtype == w.dtype and torch.equal(v, w), k
        elif k != "lits":
            assert v == w, k
    assert [[vars(li) for li in r] for r in a.lits] == [[vars(li) for li in r] for r in b.lits]
    assert a.node_cont_tok.shape[1] >= 1 and (a.path_tok[:, :, 0] >= 0).all()


def test_a_sets_tables_do_not_depend_on_its_batch(tiny_gpt2):
    """A set's literal tables are built once per distinct set, with set-local word ids the batch maps to its own:
    read back through the batch's words they are the same alone, first or second in a batch, and beside a set with
    longer phrases (a shorter literal's letter offsets repeat its total)."""
    from i2d2.decoding.compile import PAD_LEN, compile_batch

    model, tok = tiny_gpt2
    dec = NeuroLogicDecoder(model, tok, DecodingConfig())
    a = ConstraintSet(clauses=[Clause([Literal("much better than"), Literal("dogs")], positions=[1]),
                               Clause([Literal("so so good", False), Literal("bad", False)])],
                      counts=[CountConstraint(["cats", "in the"], 1)],
                      dynamic=[DynamicClause(["bigger", "faster"], top_k=1)])
    b = ConstraintSet(clauses=[Clause([Literal("the")], positions=[2]), Clause([Literal("cats", False)])],
                      counts=[CountConstraint(["and"], 0)])

    def row(cp, i):
        """Row ``i``'s tables read through the batch's words (and clause / group indices for table columns)."""
        words = list(cp.words) + ["<other>"]
        Cl, nc, n = cp.Cl, sum(cp.n_clauses[i]), int(cp.pos_valid[i].sum())
        kind = lambda c: ("pos", c) if c < Cl else ("neg", c - Cl) if c < 2 * Cl else ("count", c - 2 * Cl)  # noqa: E731
        S, W2 = cp.ph_S, cp.Wc1 + 1
        nxt = cp.ph_next.reshape(cp.B, 2, S, W2)[i] - i * 2 * S  # the prompt's own rows: 0 is its root
        rows = i * 2 * S + torch.arange(S)
        # the set's own states (the batch pads to its widest automaton): the last one ends or begins a phrase
        live = (cp.ph_out[rows] + cp.ph_prog[rows]).any(1).nonzero()
        own = slice(i * 2 * S, i * 2 * S + (int(live.max()) + 1 if len(live) else 1))
        # a state's copy moves alike and ends no phrase; no word keeps the state, on its copy
        assert torch.equal(nxt[1], nxt[0]) and (cp.ph_out[i * 2 * S + S: (i + 1) * 2 * S] == 0).all()
        n_own = own.stop - own.start
        assert torch.equal(nxt[0, :n_own, cp.Wc1], S + torch.arange(n_own))
        lens = cp.pos_len[i, :n].tolist()
        cl = cp.pos_charlen[i, :n].tolist()
        return dict(
            wtab={(words[w], kind(c)): v for (w, c), v in np.ndenumerate(cp.wtab[i].numpy()) if v},
            wlit={(words[w], c): v for (w, c), v in np.ndenumerate(cp.wlit[i].numpy()) if v >= 0},
            phrases=[(cp.lits[i][cp.ph_gidx[i, k]].words, cp.ph_gidx[i, k].item(),
                      cp.ph_out[own, k].tolist(), cp.ph_prog[own, k].tolist())
                     for k in range(int((cp.ph_gidx[i] >= 0).sum()))],
            automaton={(s, words[w]): v for (s, w), v in np.ndenumerate(nxt[0, :n_own, :cp.Wc1].numpy()) if v},
            group_ends=cp.ph_gout[own][:, cp.grp_max[i] < PAD_LEN].tolist(), clause_ends=cp.ph_lit[own, :nc].tolist(),
            neg=cp.neg_total[i, :nc].tolist(), has_pos=cp.cl_has_pos[i, :nc].tolist(), pos_len=lens,
            pos_words=[tuple(words[w] for w in r if w >= 0) for r in cp.pos_words[i, :n].tolist()],
            pos_clause=cp.pos_clause[i, :n].tolist(), pos_dyn=cp.pos_dyn[i, :n].tolist(),
            pos_ph=cp.pos_ph[i, :n].tolist(), charlen=[r[: k + 1] for r, k in zip(cl, lens)],
            charlen_pad_is_total=all(v == r[k] for r, k in zip(cl, lens) for v in r[k:]),
            prog={(prefix, c): cp.node_prog[i, node, c].item() for prefix, node in zip(*_trie_nodes(cp))
                  for c in range(nc) if cp.node_prog[i, node, c] > 0})

    alone = {"a": row(compile_batch([a], dec.tables, tok, "cpu"), 0),
             "b": row(compile_batch([b], dec.tables, tok, "cpu"), 0)}
    for order in (["a", "b"], ["b", "a"], ["b", "b", "a"]):
        cp = compile_batch([{"a": a, "b": b}[x] for x in order], dec.tables, tok, "cpu")
        assert cp.Pp == 3
        for i, x in enumerate(order):
            assert row(cp, i) == alone[x], (order, i)
    assert alone["a"]["charlen"][0] == [0.0, 4.0, 10.0, 14.0] and alone["b"]["charlen"] == [[0.0, 3.0]]
    assert [p[0] for p in alone["a"]["phrases"]] == [("much", "better", "than"), ("so", "so", "good"), ("bad",),
                                                    ("in", "the")]
    assert alone["b"]["wtab"] == {("the", ("pos", 0)): 1, ("cats", ("neg", 1)): 1, ("and", ("count", 0)): 1}


def test_set_literals_are_reused_by_content_and_never_stale(tiny_gpt2):
    """A set's literal list is kept by its contents (a run repeats a few sets over many prompts): an equal set built
    anew reuses it, and a set changed in place after a batch compiles its new contents."""
    from i2d2.decoding.compile import compile_batch

    model, tok = tiny_gpt2
    dec = NeuroLogicDecoder(model, tok, DecodingConfig())

    def make():
        return ConstraintSet(clauses=[Clause([Literal("dogs")]), Clause([Literal("the", False)])],
                             counts=[CountConstraint(["cats", "cats food"], 0)],
                             dynamic=[DynamicClause(["bigger", "faster"], top_k=1)])

    cs = make()
    a = compile_batch([cs], dec.tables, tok, "cpu")
    assert compile_batch([make()], dec.tables, tok, "cpu").lits[0] is a.lits[0]
    # "cats" may not occur at all, so the phrase "cats food" needs no state of its own
    assert [li.text for li in a.lits[0] if li.group == 0] == ["cats"]
    cs.dynamic[0].words.append("slower")
    cs.counts[0].max_count = 1
    cs.clauses[1].literals[0] = Literal("the")
    b = compile_batch([cs], dec.tables, tok, "cpu")
    assert [li.text for li in b.lits[0] if li.dynamic] == ["bigger", "faster", "slower"]
    assert [li.positive for li in b.lits[0] if li.clause == 1] == [True]
    # with a limit above 0 the phrase is counted on its own
    assert [li.text for li in b.lits[0] if li.group == 0] == ["cats", "cats food"]
    assert len(b.lits[0]) == len(a.lits[0]) + 2


def test_word_cache_is_bounded_and_emptying_it_changes_nothing(tiny_gpt2, monkeypatch):
    import i2d2.decoding.neurologic as nl

    model, tok = tiny_gpt2
    sets = [ConstraintSet(clauses=[Clause([Literal(w)])], counts=[CountConstraint(["the", "a"], 1)])
            for w in ("dog", "bicycles", "water", "birds")]
    want = NeuroLogicDecoder(model, tok, cfg(batch_size=1)).decode(PROMPTS, sets)
    monkeypatch.setattr(nl, "CACHE_MAX", 4)
    dec = NeuroLogicDecoder(model, tok, cfg(batch_size=1))
    got = dec.decode(PROMPTS, sets)
    assert [[(g.text, g.score) for g in gs] for gs in got] == [[(g.text, g.score) for g in gs] for gs in want]
    # emptied whenever it held more than 4 entries (words and the last batch's trie) before a batch: the first
    # prompts' words are gone
    assert {k[1] for k in dec._words if k[0] == "word"} == {"water", "birds", "the", "a"}


def test_a_batch_with_the_last_batchs_words_reuses_its_trie_and_compiles_alike(tiny_gpt2):
    """The trie and path tables are kept for the next batch with the same words (a NeuroComparatives pass, a
    benchmark): reused there, rebuilt for other words, and every table equal to a compilation from scratch."""
    from i2d2.decoding.compile import compile_batch

    model, tok = tiny_gpt2
    dec = NeuroLogicDecoder(model, tok, cfg())
    comps = ["bigger", "smaller", "cheaper"]

    def nc(aux, adv):
        return ConstraintSet(clauses=[Clause([Literal(aux)], positions=[1, 2]),
                                      Clause([Literal(adv)], positions=[1, 2])],
                             counts=[CountConstraint(["I", "you"], 0)], dynamic=[DynamicClause(comps, top_k=2)])

    a = [nc("are", "often"), nc("have", "typically")]
    b = [nc("are", "usually"), nc("have", "typically")]  # one word differs
    cache = {}
    seen = []
    for css in (a, a, b, a, a[::-1]):  # the last: a's words in another order, so other word ids
        cp = compile_batch(css, dec.tables, tok, "cpu", cache)
        fresh = compile_batch(css, dec.tables, tok, "cpu", {})
        for f in fields(cp):
            x, y = getattr(cp, f.name), getattr(fresh, f.name)
            assert torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y, f.name
        seen.append(cp.keys)
    assert seen[1] is seen[0] and seen[2] is not seen[1] and seen[3] is not seen[0] and seen[4] is not seen[3]


def _trie_nodes(cp):
    """(prefix, node id) of every trie node, read back from the prefix table."""
    out = {}
    for wi, word in enumerate(cp.words):
        for vi, v in enumerate((word, word[:1].upper() + word[1:])):
            for dd in range(1, len(v) + 1):
                out[v[:dd]] = int(cp.prefix_node[wi, vi, dd])
    return list(out), list(out.values())


def test_cpu_topk_matches_torch_topk(monkeypatch):
    """The CPU top-k off torch's nth-element path (64 k > n) returns torch's values, and indices that name those
    values inside the input, also where fewer than k entries are finite: a small k pads rows onto torch's partial
    sort, a larger one (the vocabulary's top-50 on a small vocabulary) selects with numpy on one thread and with
    torch on several, also on a 3-D, non-contiguous or gradient-tracking input."""
    from i2d2.decoding.neurologic import _topk

    selects = []  # numpy's selection, by thread count: one thread only
    argpartition = np.argpartition
    monkeypatch.setattr(np, "argpartition",
                        lambda *a, **k: selects.append(torch.get_num_threads()) or argpartition(*a, **k))
    threads = torch.get_num_threads()
    try:
        for nt in (1, 2):
            torch.set_num_threads(nt)
            g = torch.Generator().manual_seed(0)
            for n, k in ((292, 5), (619, 10), (100, 10), (20, 3), (1000, 50), (300, 20), (40, 40)):
                x = torch.randn(6, n, generator=g)
                x[0, 3:] = float("-inf")  # a row with 3 finite entries
                x[1] = float("-inf")
                v, i = _topk(x, k)
                want = x.topk(k, dim=-1).values
                assert torch.equal(v, want), (nt, n, k)
                assert int(i.max()) < n and torch.equal(x.gather(1, i), v), (nt, n, k)
                if k > 12:  # distinct values: the indices are torch's too
                    assert torch.equal(i[2:], x[2:].topk(k, dim=-1).indices), (nt, n, k)
            x = torch.randn(4, 3, 700, generator=g).transpose(0, 1).requires_grad_()
            v, i = _topk(x, 30)
            want = x.detach().topk(30, dim=-1)
            assert torch.equal(v, want.values) and torch.equal(i, want.indices), nt
    finally:
        torch.set_num_threads(threads)
    assert selects and set(selects) == {1}


def test_kth_largest_is_the_topk_threshold():
    """The prune threshold read by selection alone is the k-th value of torch's top-k, exactly: with -inf entries
    (banned tokens, fewer finite than k), ties, and on a non-contiguous input."""
    from i2d2.decoding.neurologic import _kth_largest

    g = torch.Generator().manual_seed(1)
    for n, k in ((1000, 500), (1000, 50), (300, 299), (40, 1), (40, 40)):
        x = torch.randn(6, n, generator=g)
        x[0, 3:] = float("-inf")
        x[1] = float("-inf")
        x[2] = torch.round(x[2])  # many equal values
        assert torch.equal(_kth_largest(x, k), x.topk(k, dim=-1).values[:, -1]), (n, k)
    x = torch.randn(50, 6, generator=g).t()
    assert torch.equal(_kth_largest(x, 7), x.topk(7, dim=-1).values[:, -1])


@pytest.mark.filterwarnings("error::FutureWarning")
def test_kv_cache_goes_by_the_models_own_keyword(tiny_gpt2):
    """transformers renamed ``past_key_values`` to ``cache`` (the old name warns and is removed in 5.40): the decoder
    passes whichever name the model's forward takes, so a newer transformers neither warns nor breaks it."""
    import inspect

    model, tok = tiny_gpt2
    dec = NeuroLogicDecoder(model, tok, cfg(max_new_tokens=6, beam_size=3, num_return=2))
    fwd = inspect.signature(model.forward).parameters
    assert dec._cache_kw == ("cache" if "cache" in fwd else "past_key_values") and dec._cache_kw in fwd
    assert dec.decode(["Dogs"], [ConstraintSet()])[0]

