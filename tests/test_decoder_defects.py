"""Regression tests for NeuroLogic decoder defects found by an independent checker (issue 14, part 4).

Every decoding test drives a tiny random model whose next-token logits are replaced by a small table, so the
text the unconstrained search wants is known, and checks the result on the decoded text itself.
"""

import re

import pytest
import torch

from i2d2.decoding import Clause, ConstraintSet, CountConstraint, DecodingConfig, Literal, NeuroLogicDecoder
from i2d2.decoding.vocab import byte_letters, token_tables
from i2d2.models import tiny_model
from lm_tables import bigram_lm

_W = re.compile(r"[^\W_]+|[^\s]")


def occurrences(text, phrase):
    """Start indices (in words) of `phrase` in `text`, overlapping ones included (first letter any case)."""
    ws, ps = _W.findall(text), _W.findall(phrase)
    low = lambda w: w[:1].lower() + w[1:]  # noqa: E731
    return [i for i in range(len(ws) - len(ps) + 1) if all(low(ws[i + j]) == low(ps[j]) for j in range(len(ps)))]


def decode(model, tok, prompt, cs, **kw):
    base = dict(beam_size=4, num_return=4, max_new_tokens=6, min_new_tokens=1, prune_factor=50, sat_tolerance=3,
                beta=0.0, batch_size=1)
    return NeuroLogicDecoder(model, tok, DecodingConfig(**{**base, **kw})).decode([prompt], [cs])[0]


@pytest.fixture
def gpt2():
    model, tok = tiny_model("gpt2")
    yield model, tok


# ------------------------------------------------------------------ phrases whose first words repeat (the phrase automaton)
def test_forbidden_phrase_with_repeated_first_word_is_caught(gpt2):
    """'so so dog' is forbidden; the model wants 'so so so dog.'.  A matcher that restarts without backtracking
    misses the phrase there and reports the text satisfied."""
    model, tok = gpt2
    h = bigram_lm(model, tok, {"Ġso": {"Ġso": 3.0, "Ġdog": 1.0}, "Ġdog": {".": 3.0}, ".": {"EOS": 3.0}},
                 {"Ġso": 3.0, "Ġdog": 0.0})
    try:
        cs = ConstraintSet([Clause([Literal("so so dog", False)])])
        gens = decode(model, tok, "People say", cs, max_new_tokens=7)
        assert gens
        for g in gens:
            assert not occurrences(g.text, "so so dog"), g
            assert g.all_satisfied
    finally:
        h.remove()


def test_required_phrase_with_repeated_first_word_is_found(gpt2):
    """'ha ha b' is required and the model only ever says 'ha ha ha b': the phrase is there, it must count."""
    model, tok = gpt2
    h = bigram_lm(model, tok, {"Ġha": {"Ġha": 3.0, "Ġb": 2.0}, "Ġb": {".": 3.0}, ".": {"EOS": 3.0}},
                 {"Ġha": 3.0})
    try:
        cs = ConstraintSet([Clause([Literal("ha ha b")])])
        gens = decode(model, tok, "People say", cs, max_new_tokens=6)
        assert any(g.text.startswith("ha ha ha b") for g in gens), gens
        for g in gens:
            assert g.all_satisfied == bool(occurrences(g.text, "ha ha b")), g
            assert g.all_satisfied and g.matched == ["ha ha b"], g
    finally:
        h.remove()


def test_count_limit_counts_overlapping_phrase_occurrences(gpt2):
    """'ha ha' occurs twice in 'ha ha ha'; with at most one occurrence allowed that text breaks the limit."""
    model, tok = gpt2
    h = bigram_lm(model, tok, {"Ġha": {"Ġha": 3.0, ".": 0.0}, ".": {"EOS": 3.0}}, {"Ġha": 3.0})
    try:
        cs = ConstraintSet(counts=[CountConstraint(["ha ha"], 1)])
        gens = decode(model, tok, "People say", cs, max_new_tokens=5)
        assert gens
        for g in gens:
            assert g.all_satisfied == (len(occurrences(g.text, "ha ha")) <= 1), g
        assert any(g.all_satisfied for g in gens)
    finally:
        h.remove()


def test_phrase_automaton_matches_a_direct_count():
    """One automaton state stands for every phrase of a prompt: on random texts over a small vocabulary (phrases
    that overlap, repeat their first words or are each other's prefix or suffix), after each word it says which
    phrases end there and how many words of each are matched, as counting on the text itself does."""
    import random

    from i2d2.decoding.compile import _phrase_automaton

    rng = random.Random(0)
    for _ in range(300):
        v = rng.randint(2, 5)  # words 0 .. v - 1 in phrases, v in none
        phrases = [tuple(rng.randrange(v) for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 6))]
        cols, nxt, out, prog = _phrase_automaton(phrases)
        col = {int(w): j for j, w in enumerate(cols)}
        text, s = (), 0
        for _ in range(12):
            w = rng.randrange(v + 1)
            text += (w,)
            s = nxt[s, col[w]] if w in col else 0
            for k, ph in enumerate(phrases):
                assert out[s, k] == (text[-len(ph):] == ph), (phrases, text, k)
                matched = max(j for j in range(len(ph)) if text[len(text) - j:] == ph[:j])
                assert prog[s, k] == matched, (phrases, text, k)


# ------------------------------------------------------------------ ordered clauses completed in one step
def test_clauses_completed_in_one_step_are_ranked_by_text_position(gpt2):
    """'often' must come first and 'are' second.  In 'are often' cut at max_new_tokens both complete in the last
    step; ranking them by clause index instead of text position reported that text satisfied."""
    model, tok = gpt2
    h = bigram_lm(model, tok, {"Ġare": {"Ġoften": 3.0, "Ġare": 0.0}, "Ġoften": {"Ġare": 1.0, "Ġoften": 0.0}},
                 {"Ġare": 3.0, "Ġoften": 1.0})
    try:
        cs = ConstraintSet([Clause([Literal("often")], positions=[1]), Clause([Literal("are")], positions=[2])])
        gens = decode(model, tok, "People say", cs, max_new_tokens=2)
        assert gens
        for g in gens:
            want = bool(occurrences(g.text, "often")) and bool(occurrences(g.text, "are")) \
                   and occurrences(g.text, "often")[0] < occurrences(g.text, "are")[0]
            assert g.all_satisfied == want, g
        assert gens[0].text == "often are" and gens[0].all_satisfied
    finally:
        h.remove()


# ------------------------------------------------------------------ characters split over byte-fallback tokens
def _byte_fallback_lm():
    """A SentencePiece-style tokenizer with byte fallback ('é' only as <0xC3><0xA9>) and a tiny GPT-2 on it."""
    import transformers as tf
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    vocab = {t: i for i, t in enumerate(specials + [f"<0x{b:02X}>" for b in range(256)])}
    merges = []
    for ch in "abcdefghijklmnopqrstuvwxyz.▁":
        vocab.setdefault(ch, len(vocab))
    for ch in "abcdefghijklmnopqrstuvwxyz":  # ▁a .. ▁z: word-initial pieces, as SentencePiece has
        merges.append(("▁", ch))
        vocab[f"▁{ch}"] = len(vocab)
    for a, b in [("▁c", "a"), ("▁ca", "f"), ("▁d", "o"), ("▁do", "g")]:
        merges.append((a, b))
        vocab[a + b] = len(vocab)
    bpe = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True))
    bpe.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    bpe.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok = tf.PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                     unk_token="<unk>")
    tok.padding_side = "left"
    torch.manual_seed(0)
    model = tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=len(tok), n_positions=64, n_embd=32, n_layer=1, n_head=2,
                                             pad_token_id=0, bos_token_id=1, eos_token_id=2)).eval()
    return model, tok


def test_byte_fallback_character_stays_inside_its_word():
    model, tok = _byte_fallback_lm()
    assert tok.convert_ids_to_tokens(tok.encode("café", add_special_tokens=False)) == ["▁caf", "<0xC3>", "<0xA9>"]
    tables = token_tables(tok, len(tok), [tok.eos_token_id])
    for piece in ("<0xC3>", "<0xA9>"):  # part of a letter: extends the pending word, separates nothing
        assert not bool(tables.has_sep[tok.convert_tokens_to_ids(piece)]), piece
    assert byte_letters("caf" + "é") == byte_letters(tables.strings[tok.convert_tokens_to_ids("▁caf")].strip()
                                                     + tables.strings[tok.convert_tokens_to_ids("<0xC3>")]
                                                     + tables.strings[tok.convert_tokens_to_ids("<0xA9>")])
    wants = {"▁caf": {"<0xC3>": 3.0, "▁dog": 0.0}, "<0xC3>": {"<0xA9>": 3.0}, "<0xA9>": {".": 3.0},
             "▁dog": {".": 3.0}, ".": {"EOS": 3.0}}
    h = bigram_lm(model, tok, wants, {"▁caf": 3.0, "▁dog": 0.0})
    try:
        forbid = ConstraintSet([Clause([Literal("café", False)])])
        gens = decode(model, tok, "a", forbid)
        assert gens and all(not occurrences(g.text, "café") and g.all_satisfied for g in gens), gens
        need = ConstraintSet([Clause([Literal("café")])])
        gens = decode(model, tok, "a", need)
        assert gens and gens[0].text == "café.", gens
        for g in gens:
            assert g.all_satisfied == bool(occurrences(g.text, "café")), g
            if g.all_satisfied:
                assert g.matched == ["café"], g
    finally:
        h.remove()


def test_byte_fallback_punctuation_mark_ends_the_word_before_it():
    model, tok = _byte_fallback_lm()
    assert tok.convert_ids_to_tokens(tok.encode("dog’s", add_special_tokens=False)) == [
        "▁dog", "<0xE2>", "<0x80>", "<0x99>", "s"]
    wants = {"▁dog": {"<0xE2>": 3.0}, "<0xE2>": {"<0x80>": 3.0}, "<0x80>": {"<0x99>": 3.0}, "<0x99>": {"s": 3.0},
             "s": {".": 3.0}, ".": {"EOS": 3.0}}
    h = bigram_lm(model, tok, wants, {"▁dog": 3.0})
    try:
        gens = decode(model, tok, "a", ConstraintSet([Clause([Literal("dog")])]), beam_size=1, num_return=1)
        assert [(g.text, g.all_satisfied, g.matched) for g in gens] == [("dog’s.", True, ["dog"])]
    finally:
        h.remove()


# ------------------------------------------------------------------ no_repeat_ngram_size and token id 0
def test_no_repeat_ngram_can_ban_token_id_zero(gpt2):
    model, tok = gpt2
    dec = NeuroLogicDecoder(model, tok, DecodingConfig(no_repeat_ngram_size=2))
    hist = torch.tensor([[5, 0, 7, 5], [5, 0, 7, 5]])  # the bigram (5, 0) was seen; the history ends in 5
    lp = torch.zeros(2, dec.vocab)
    banned = torch.isinf(dec._ban_ngrams(lp, hist, 2))
    assert banned[:, 0].all()
    assert banned.sum().item() == 2  # nothing else


# ------------------------------------------------------------------ added control tokens (Gemma <end_of_turn>)
def _with_added_tokens():
    from tokenizers import AddedToken

    model, tok = tiny_model("gpt2")
    n = len(tok)
    tok.add_tokens([AddedToken("<end_of_turn>", special=True), AddedToken("<unused0>", special=False),
                    AddedToken("<unused1>", special=False)])
    model.resize_token_embeddings(len(tok))
    return model, tok, list(range(n, len(tok)))


def test_added_control_tokens_are_banned_and_not_read_as_words():
    model, tok, added = _with_added_tokens()
    tables = token_tables(tok, len(tok), [tok.eos_token_id])
    for i in added:
        assert tables.strings[i] == "" and bool(tables.banned[i]) and bool(tables.empty[i]), i
    rows = {t: {"<end_of_turn>": 5.0, "<unused0>": 5.0, "<unused1>": 5.0, "Ġdog": 1.0, ".": 0.5, "EOS": 0.0}
            for t in ("Ġdog", ".")}
    h = bigram_lm(model, tok, rows, {"<end_of_turn>": 5.0, "<unused0>": 5.0, "<unused1>": 5.0, "Ġdog": 1.0})
    seen = {}
    dec = NeuroLogicDecoder(model, tok, DecodingConfig(beam_size=3, num_return=3, max_new_tokens=5, batch_size=1))
    orig = dec._collect

    def spy(cp, css, fin_seq, fin_lp, fin_S, fin_n, *rest):
        seen["ids"] = [fin_seq[0, r, : int(fin_n[0, r])].tolist() for r in range(fin_seq.shape[1])
                       if torch.isfinite(fin_S[0, r])]
        return orig(cp, css, fin_seq, fin_lp, fin_S, fin_n, *rest)

    dec._collect = spy
    try:
        gens = dec.decode(["A dog"], [ConstraintSet([Clause([Literal("unused", False)])])])[0]
    finally:
        h.remove()
    assert gens and seen["ids"]
    for ids in seen["ids"]:
        assert not set(ids) & set(added), ids


def test_added_end_token_listed_as_eos_ends_the_text():
    model, tok, added = _with_added_tokens()
    eot = added[0]
    model.generation_config.eos_token_id = [tok.eos_token_id, eot]
    dec = NeuroLogicDecoder(model, tok, DecodingConfig(beam_size=2, num_return=2, max_new_tokens=4))
    assert bool(dec.is_eos_v[eot]) and not torch.isinf(dec.bias[eot])
    assert all(torch.isinf(dec.bias[i]) for i in added[1:])


# ------------------------------------------------------------------ num_return > beam_size
def test_num_return_larger_than_beam_is_filled_at_max_new_tokens(gpt2):
    model, tok = gpt2
    fill = {"Ġthe": 1.0, "Ġa": 0.9, "Ġof": 0.8, "Ġis": 0.7, "Ġin": 0.6}
    h = bigram_lm(model, tok, {t: fill for t in fill}, fill)  # no EOS: every hypothesis runs to the limit
    try:
        gens = decode(model, tok, "A dog", ConstraintSet(), beam_size=2, num_return=7, max_new_tokens=3)
    finally:
        h.remove()
    assert len(gens) == 7 and len({g.text for g in gens}) == 7
    assert [g.score for g in gens] == sorted((g.score for g in gens), reverse=True)
    assert all(g.num_tokens == 3 for g in gens)


# ------------------------------------------------------------------ an in-progress literal survives pruning
def test_next_token_of_started_word_survives_pruning(gpt2):
    """'cat' is 'Ġc' + 'at'.  After 'Ġc' four fillers outrank 'at', so with prune_factor=3 'at' is below the
    pruning threshold; the word under way must still be offered its next token, or 'cat' is never finished."""
    model, tok = gpt2
    fill = {"Ġthe": 3.0, "Ġa": 2.9, "Ġof": 2.8, "Ġis": 2.7}
    h = bigram_lm(model, tok, {"Ġc": {**fill, "at": 0.0}, "at": {".": 3.0}, ".": {"EOS": 3.0}},
                 {**fill, "Ġc": 2.95, "EOS": -3.0})
    try:
        cs = ConstraintSet([Clause([Literal("cat")])])
        gens = decode(model, tok, "A dog", cs, prune_factor=3, beam_size=3, num_return=3, beta=1.0)
    finally:
        h.remove()
    assert gens and gens[0].all_satisfied, gens
    for g in gens:
        assert g.all_satisfied == bool(occurrences(g.text, "cat")), g


# ------------------------------------------------------------------ words whose path opens with a lone space
def _cheaper_lm(model, tok, after_comma, after_space):
    return bigram_lm(model, tok, {"Ġdog": {",": 3.0}, ",": after_comma, "Ġ": after_space, "C": {"heaper": 3.0},
                                  "heaper": {".": 3.0}, "Ġcheaper": {".": 3.0}, ".": {"EOS": 3.0}}, {"Ġdog": 3.0})


def test_space_led_word_is_not_forced_after_any_separator(gpt2):
    """' Cheaper' is 'Ġ' 'C' 'heaper' on this vocabulary. After ',' the trie is at its root as after 'Ġ'; the
    second token 'C' must not be forced there as a started literal (it skipped the threshold and glued the word
    to the comma: 'dog,Cheaper.')."""
    model, tok = gpt2
    assert tok.convert_ids_to_tokens(tok.encode(" Cheaper", add_special_tokens=False)) == ["Ġ", "C", "heaper"]
    h = _cheaper_lm(model, tok, {"EOS": 3.0, "Ġcheaper": -7.0, "C": -8.0}, {"C": 0.0})
    try:
        gens = decode(model, tok, "Apples are", ConstraintSet([Clause([Literal("cheaper")])]), prune_factor=2)
        assert gens and all(g.all_satisfied for g in gens)
        assert not [g.text for g in gens if ",C" in g.text]
    finally:
        h.remove()


def test_space_led_word_continues_after_its_own_space(gpt2):
    """Once the lone 'Ġ' that opens ' Cheaper' is out, 'C' is the literal's next token: it survives pruning even
    below the threshold, and the word is finished."""
    model, tok = gpt2
    h = _cheaper_lm(model, tok, {"Ġ": 2.0, "EOS": 3.0}, {"Ġdog": 3.0, "D": 2.0, "C": -8.0})
    try:
        gens = decode(model, tok, "Apples are", ConstraintSet([Clause([Literal("cheaper")])]), prune_factor=2)
        assert any(g.all_satisfied and "dog, Cheaper." in g.text for g in gens), [g.text for g in gens]
    finally:
        h.remove()


def test_space_led_word_of_a_dynamic_clause_continues_after_its_own_space(gpt2):
    """The same with a dynamic clause: its top-k ranks words by their first token, which says nothing once the
    lone space is out; the started word goes on, as a continuation would."""
    from i2d2.decoding import DynamicClause

    model, tok = gpt2
    h = _cheaper_lm(model, tok, {"Ġ": 2.0, "EOS": 3.0}, {"Ġdog": 3.0, "D": 2.0, "C": -8.0})
    try:
        gens = decode(model, tok, "Apples are", ConstraintSet(dynamic=[DynamicClause(["cheaper"], top_k=1)]),
                      prune_factor=2)
        assert any(g.all_satisfied and "dog, Cheaper." in g.text for g in gens), [g.text for g in gens]
    finally:
        h.remove()


def test_character_classes_split_text_as_the_word_pieces_do():
    """A completed split character is read by its class: it must agree with ``_PIECE_RE``, which splits every
    other text into words, for letters, digits, '_' (not a word character there), spaces and marks of any script."""
    from i2d2.decoding.vocab import _PIECE_RE, char_class

    cls = char_class()
    assert cls.shape == (0x110000,)
    for o in [*range(1, 0x3000), *range(0x3000, 0x110000, 97)]:
        ch = chr(o)
        want = 0 if _PIECE_RE.fullmatch(ch) and (ch.isalnum() and ch != "_") else 1 if ch.isspace() else 2
        assert cls[o] == want, (hex(o), ch, int(cls[o]), want)
    assert [int(cls[ord(c)]) for c in "a_ \u00a0’é9"] == [0, 2, 1, 1, 2, 0, 0]
