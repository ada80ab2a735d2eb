"""Compile a batch of ConstraintSets into tensors: a word trie over fragment transitions, literal tables,
clause/count tables and lookahead token paths.  Runs once per batch on the host; everything it returns
lives on the decoder's device.

Node ids: 0 = ROOT (at a word boundary), 1 = DEAD (inside a word no literal starts with), 2.. = trie nodes
(a prefix of a literal word, any case variant).  Word ids: canonical literal words of the batch; an event
value -1 means "no word completed", -2 "an irrelevant word completed".
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from .constraints import ConstraintSet, phrase_words, word_variants
from .vocab import TokenTables, byte_letters

ROOT, DEAD = 0, 1
NO_EVENT, OTHER = -1, -2
PAD_WORD = -3
PAD_LEN = 1 << 20


def _on(device):
    """A converter of numpy arrays / tensors to tensors on ``device`` (the compiled tables' one way there)."""
    return lambda t: torch.as_tensor(t).to(device)


@dataclass(frozen=True)
class LitInfo:
    text: str
    words: tuple
    clause: int  # -1: count-only literal
    positive: bool
    group: int  # count group or -1
    dynamic: bool


@dataclass
class Compiled:
    B: int
    Cl: int
    G: int
    lits: list  # per row: tuple[LitInfo, ...] (shared across batches: see _row_literals)
    n_clauses: list  # per row: (#clauses, #dynamic)
    # trie
    keys: torch.Tensor  # sorted node*F+frag
    vals: torch.Tensor
    F: int
    node_word: torch.Tensor  # [Nn]
    node_depth: torch.Tensor  # [Nn]
    Wc1: int
    wtab: torch.Tensor  # [B, Wc+1, 2Cl+G] increments per completed word: clause pos hits | neg hits | groups
    wlit: torch.Tensor  # [B, Wc+1, Cl] literal index a word satisfies per clause (-1)
    Lph: int
    # the phrases' automaton (``_phrase_automaton``) as batch tables: row b * 2S + s is prompt b's state s, row
    # b * 2S + S + s its copy that ends no phrase (where no word completed, the state stays but must not count its
    # phrases again); ph_next[row * (Wc1 + 1) + word column] is the next row (column Wc1: no word)
    ph_S: int
    ph_next: torch.Tensor  # [B * 2S * (Wc1 + 1)]
    ph_out: torch.Tensor  # [B * 2S, Lph] phrases ending at the row (0 / 1)
    ph_prog: torch.Tensor  # [B * 2S, Lph] words of each phrase matched
    ph_gout: torch.Tensor  # [B * 2S, G] count-group increments of the phrases ending at the row
    # [B * 2S, Cl] the literal index (into ``lits``) of a positive phrase literal of the clause ending at the row, else
    # -1: read per word event, it names the literal that satisfied the clause where it ended first
    ph_lit: torch.Tensor
    ph_gidx: torch.Tensor
    ph_cl_pos: torch.Tensor  # [B, Lph, Cl] float
    ph_cl_neg: torch.Tensor
    ph_has_neg: bool  # some phrase is a negative literal of a clause (else ph_cl_neg is all zero)
    ph_has_grp: bool  # some phrase is a count word (else ph_gout is all zero); positive phrases: has_pos_phrase
    ph_track_occ: bool  # some phrase is a literal of a clause (positive or negative): the decoder keeps occurrences
    neg_total: torch.Tensor  # [B, Cl]
    has_neg: bool  # some clause has a negative literal (else neg_total is all zero)
    # some single word is forbidden outright (the one literal of a negative clause) or counted in a group
    has_word_limits: bool
    grp_max: torch.Tensor  # [B, G]
    cl_valid: torch.Tensor  # [B, Cl]
    cl_has_pos: torch.Tensor
    cl_posmask: torch.Tensor  # int64 bit r = rank r allowed (0 = any)
    cl_maxpos: torch.Tensor
    cl_weight: torch.Tensor  # [Cl] int64 group-hash weights
    has_order: bool  # some clause has positions: ranks need the text position of each event
    # positive literals for lookahead / progress [B, Lp]
    Lp: int
    Pp: int
    pos_words: torch.Tensor  # [B, Lp, Pp]
    pos_len: torch.Tensor
    pos_ph: torch.Tensor  # phrase index or -1
    has_pos_phrase: bool  # some positive literal is a phrase (else every one is a single word)
    pos_valid: torch.Tensor
    has_positive: bool  # some row has a positive literal (the lookahead has work)
    pos_clause: torch.Tensor
    pos_dyn: torch.Tensor  # dynamic clause index (0-based among dynamic) or -1
    pos_charlen: torch.Tensor  # [B, Lp, Pp+1]
    node_prog: torch.Tensor  # [B, Nn, Cl] progress of single positive words per trie node
    dyn_topk: torch.Tensor  # [B, D]
    D: int
    has_dyn: bool
    dyn_kmax: list
    # paths [Wc, 2, Tm]
    path_tok: torch.Tensor
    path_node: torch.Tensor
    path_first: torch.Tensor  # [Wc, 2] the first token of each path
    # [Wc, 2] the second token of a path whose first token spells no letter of the word (a lone space: the trie is
    # back at its root after it), else -1: proposed once that first token is out (see node_cont_tok)
    path_resume: torch.Tensor
    has_resume: bool
    # per trie node: the tokens that continue a literal word whose canonical path passes the node, and that word
    node_cont_tok: torch.Tensor  # [Nn, J] (-1 = none)
    node_cont_word: torch.Tensor  # [Nn, J] (-3 = none)
    prefix_node: torch.Tensor  # [Wc, 2, Dmax+1]
    words: list


def _row_key(cs: ConstraintSet) -> tuple:
    """What ``_row_literals`` reads of a set, hashable: clauses as (text, positive) literals, dynamic clauses' words,
    count groups as (words, max_count)."""
    return (tuple(tuple((li.text, li.positive) for li in c.literals) for c in cs.clauses),
            tuple(tuple(d.words) for d in cs.dynamic), tuple((tuple(g.words), int(g.max_count)) for g in cs.counts))


# a run decodes few distinct sets (NeuroComparatives: one per aux verb x adverb) over many prompts; an NC set has
# ~600 literals (~100 KB), so at most ~100 MB are kept
@lru_cache(maxsize=1024)
def _row_literals(clauses: tuple, dynamic: tuple, counts: tuple) -> tuple[LitInfo, ...]:
    """The literals of one constraint set (arguments: ``_row_key``), in the order of the batch's tables.  Shared
    between batches through the cache, so nothing downstream may modify them."""
    out = []
    for ci, c in enumerate(clauses):
        for text, positive in c:
            out.append(LitInfo(text, phrase_words(text), ci, positive, -1, False))
    nc = len(clauses)
    for di, words in enumerate(dynamic):
        seen = set()
        for w in words:
            key = phrase_words(w)
            if key not in seen:
                seen.add(key)
                out.append(LitInfo(w, key, nc + di, True, -1, True))
    # words forbidden on their own (count limit 0, or a one-literal negative clause): a forbidden phrase
    # containing one of them can never occur without an earlier violation, so it needs no state of its own
    banned = {phrase_words(w)[0] for words, mx in counts if mx == 0 for w in words if len(phrase_words(w)) == 1}
    banned |= {phrase_words(c[0][0])[0] for c in clauses
               if len(c) == 1 and not c[0][1] and len(phrase_words(c[0][0])) == 1}
    for gi, (words, mx) in enumerate(counts):
        seen = set()
        for w in words:
            key = phrase_words(w)
            if key in seen:  # a word listed twice counts once per occurrence, not twice
                continue
            seen.add(key)
            if mx == 0 and len(key) > 1 and any(x in banned for x in key):
                continue
            out.append(LitInfo(w, key, -1, True, gi, False))
    return tuple(out)


@lru_cache(maxsize=1 << 16)
def _charlen(words: tuple) -> tuple:
    """Automaton letters before each word of a phrase, and in all (``len(words) + 1`` values)."""
    out, acc = [0.0], 0.0
    for w in words:
        acc += len(byte_letters(w))
        out.append(acc)
    return tuple(out)


def _phrase_automaton(phrases: list[tuple]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Aho-Corasick automaton over word-id phrases: one state stands for every phrase's progress at once.  A state
    is the longest suffix of the text that is a prefix of some phrase.  Returns the words of the phrases (``cols``),
    the transitions ``nxt`` [S, len(cols)] (any other word leads to the root, 0), ``out`` [S, n] (1 where phrase k
    ends at the state: occurrences may overlap, "ha ha" twice in "ha ha ha") and ``prog`` [S, n] (the words of
    phrase k matched: the longest proper prefix of it ending the text, so a restart keeps what still matches,
    "so so good" inside "so so so good")."""
    states = {(): 0}
    for ph in phrases:
        for j in range(1, len(ph) + 1):
            states.setdefault(ph[:j], len(states))
    cols = sorted({w for ph in phrases for w in ph})
    col = {w: j for j, w in enumerate(cols)}
    S, n = len(states), max(len(phrases), 1)
    # each state's own facts; a state inherits the rest from its failure state (its longest proper suffix that
    # is a state), which is shallower, so filling the states by depth sees it done
    out = np.zeros((S, n), dtype=np.int64)
    prog = np.full((S, n), -1, dtype=np.int64)
    for k, ph in enumerate(phrases):
        out[states[ph], k] = 1
        prog[[states[ph[:j]] for j in range(len(ph))], k] = np.arange(len(ph))
    children = {s: [] for s in range(S)}
    for v, c in states.items():
        if v:
            children[states[v[:-1]]].append((col[v[-1]], c))
    nxt = np.zeros((S, len(cols)), dtype=np.int64)
    fail = np.zeros(S, dtype=np.int64)
    for u in sorted(states, key=len):
        s = states[u]
        if u:
            f = fail[s]
            nxt[s] = nxt[f]
            out[s] |= out[f]
            prog[s] = np.where(prog[s] >= 0, prog[s], prog[f])
        for j, c in children[s]:
            fail[c] = nxt[s, j] if u else 0  # read before this state's own edge overwrites it
            nxt[s, j] = c
    return np.asarray(cols, dtype=np.int64), nxt, out, prog


@dataclass(frozen=True)
class _RowRecord:
    """What a batch needs of one constraint set's literals that does not depend on the batch (word ids are local:
    indices into ``words``), built once per distinct set and shared through the cache like ``_row_literals``
    (its arrays are read-only; ~40 KB for a NeuroComparatives set)."""

    words: tuple  # the set's literal words in first-use order
    neg_clause: np.ndarray  # clauses with negative literals ...
    neg_count: np.ndarray  # ... and how many each has
    pos_clauses: np.ndarray  # clauses with a positive literal
    # single-word literals (per-word increment tables): word, column = index + kind * Cl (kind 0: a positive literal
    # of clause index, 1: a negative one, 2: a word of count group index)
    sw_word: np.ndarray
    sw_index: np.ndarray
    sw_kind: np.ndarray
    first_lit: np.ndarray  # [n, 3] (word, clause, literal): the first positive literal of the clause spelling the word
    phr: tuple  # literals with their own progress state: phrases, negatives of clauses with several negatives
    # their automaton (``_phrase_automaton``): the local word of each column of ``ph_next``, transitions, ends, progress
    ph_cols: np.ndarray
    ph_next: np.ndarray
    ph_out: np.ndarray
    ph_prog: np.ndarray
    pos: tuple  # positive literals (lookahead, progress)
    Pp: int  # most words in one of them
    pos_word: np.ndarray  # [n_pos, Pp] words, PAD_WORD after the last
    pos_ph: np.ndarray  # index into ``phr`` or -1
    pos_clause: np.ndarray
    pos_dyn: np.ndarray  # dynamic clause index or -1
    pos_charlen: np.ndarray  # [n_pos, Pp + 1] letters before each word (the total repeated after the last)
    prog_word: np.ndarray  # single-word positive literals: word ...
    prog_clause: np.ndarray  # ... and clause


@lru_cache(maxsize=1024)
def _row_record(clauses: tuple, dynamic: tuple, counts: tuple) -> _RowRecord:
    """``_RowRecord`` of one constraint set (arguments: ``_row_key``)."""
    lits = _row_literals(clauses, dynamic, counts)
    nc = len(clauses)
    words = tuple(dict.fromkeys(w for li in lits for w in li.words))
    wid = {w: i for i, w in enumerate(words)}
    nneg = {}
    for li in lits:
        if li.clause >= 0 and not li.positive:
            nneg[li.clause] = nneg.get(li.clause, 0) + 1
    phr, pos, sw, first_lit = [], [], [], {}
    for k, li in enumerate(lits):
        if li.clause >= 0 and li.positive:
            pos.append(k)
        if len(li.words) > 1 or (li.clause >= 0 and not li.positive and nneg[li.clause] > 1):
            phr.append(k)
            continue
        w = wid[li.words[0]]
        sw.append((w, li.group, 2) if li.group >= 0 else (w, li.clause, 0) if li.positive else (w, li.clause, 1))
        if li.group < 0 and li.positive:
            first_lit.setdefault((w, li.clause), k)
    phpos = {k: j for j, k in enumerate(phr)}
    pl = [lits[k] for k in pos]
    Pp = max([len(li.words) for li in pl] + [1])
    pos_word = np.full((len(pl), Pp), PAD_WORD, dtype=np.int64)
    pos_charlen = np.zeros((len(pl), Pp + 1), dtype=np.float32)
    for j, li in enumerate(pl):
        pos_word[j, : len(li.words)] = [wid[w] for w in li.words]
        cum = _charlen(li.words)
        pos_charlen[j] = cum + (cum[-1],) * (Pp - len(li.words))
    single = [li for li in pl if len(li.words) == 1]
    arr = lambda x: np.asarray(x, dtype=np.int64)  # noqa: E731
    ph_cols, ph_next, ph_out, ph_prog = _phrase_automaton([tuple(wid[w] for w in lits[k].words) for k in phr])
    sw = arr(sw).reshape(-1, 3)
    rec = _RowRecord(
        words=words, neg_clause=arr(list(nneg)), neg_count=arr(list(nneg.values())),
        pos_clauses=arr(sorted({li.clause for li in pl})), sw_word=sw[:, 0], sw_index=sw[:, 1], sw_kind=sw[:, 2],
        first_lit=arr([(*wc, k) for wc, k in first_lit.items()]).reshape(-1, 3), phr=tuple(phr),
        ph_cols=ph_cols, ph_next=ph_next, ph_out=ph_out,
        ph_prog=ph_prog, pos=tuple(pos), Pp=Pp, pos_word=pos_word,
        pos_ph=arr([phpos.get(k, -1) for k in pos]), pos_clause=arr([li.clause for li in pl]),
        pos_dyn=arr([li.clause - nc if li.dynamic else -1 for li in pl]), pos_charlen=pos_charlen,
        prog_word=arr([wid[li.words[0]] for li in single]), prog_clause=arr([li.clause for li in single]))
    for v in vars(rec).values():
        if isinstance(v, np.ndarray):
            v.setflags(write=False)
    return rec


@dataclass
class _WordRecord:
    """Everything about one literal word that does not depend on the batch, kept in the decoder's cache.  Indices
    into ``prefixes`` ("pi") are local to the word: the batch maps them to trie nodes with one gather."""

    prefixes: list  # v[:j], j = 0..len(v), of every variant's automaton spelling (byte_letters), concatenated
    ends: np.ndarray  # pi of each variant's full spelling
    frags: np.ndarray  # [n, 3] fragment transitions (pi from, pi to, fragment id)
    # [n, 4] lookahead path tokens: (slot, step, token, pi): pi is the word prefix the path has spelled after the
    # token (a leading space left out), -1 where that is not a prefix of the variant or the word opens with no letter
    path: np.ndarray
    resume: np.ndarray  # [2] second path token after a lone-space first token, else -1
    conts: np.ndarray  # [n, 2] (pi inside the word, next path token): continuations of the word's path
    prog: np.ndarray  # [n] pi of every non-empty prefix
    prog_frac: np.ndarray  # [n] its matched fraction of the variant (prefix length / variant length)
    slot_pref: np.ndarray  # [n, 3] (slot, d, pi of the slot's variant prefix of length d), d >= 1


def _word_record(w: str, tables: TokenTables, tok) -> _WordRecord:
    frag, strings = tables.frag_ids, tables.strings
    surface = word_variants(w)
    variants = [byte_letters(v) for v in surface]
    prefixes, first, frags, prog, prog_frac = [], [], [], [], []
    for v in variants:
        o = len(prefixes)
        first.append(o)
        prefixes += [v[:j] for j in range(len(v) + 1)]
        frags += [(o + i, o + j, frag[v[i:j]])
                  for i in range(len(v)) for j in range(i + 1, len(v) + 1) if v[i:j] in frag]
        prog += [o + d for d in range(1, len(v) + 1)]
        prog_frac += [d / len(v) for d in range(1, len(v) + 1)]
    ends = np.asarray([o + len(v) for o, v in zip(first, variants)], dtype=np.int64)
    # the lookahead path of a slot: the tokenization of ' ' + variant, else of the bare variant, whichever spells
    # the variant; else the first token of ' ' + variant (one variant: both slots alike)
    path, conts, resume = [], [], np.full(2, -1, dtype=np.int64)
    slots = (list(zip(variants, surface, first)) * 2)[:2]
    slot_pref = []
    for slot, (v, sv, o) in enumerate(slots):
        ids = None
        for text in (" " + sv, sv):
            enc = tok.encode(text, add_special_tokens=False)
            if enc and byte_letters("".join(strings[i] for i in enc if i < len(strings))) in (v, " " + v):
                ids = enc
                break
        spelled = ids is not None
        if not spelled:
            ids = tok.encode(" " + sv, add_special_tokens=False)
        alnum = v[:1].isalnum()
        # a word that opens with no letter (',' '-' '(') is a word of its own without a space before it ("dog,"):
        # its path starts at its own token. A lone space first (' ,' is 'Ġ' ',', and SentencePiece puts '▁' before
        # a bare ',' too) would be proposed again and again: it spells nothing of the word and leaves the trie at
        # its root, where the word's first token is that space again
        while not alnum and len(ids) > 1 and ids[0] < len(strings) and strings[ids[0]].isspace():
            ids = ids[1:]
        if not spelled:
            ids = ids[:1]  # at least propose how the word starts
        cov, pis = "", []
        for t in ids:
            cov += byte_letters(strings[t]) if t < len(strings) else ""
            pend = cov[1:] if cov.startswith(" ") else cov
            pis.append(o + len(pend) if alnum and v.startswith(pend) else -1)
        path += [(slot, j, t, pi) for j, (t, pi) in enumerate(zip(ids, pis))]
        if len(ids) > 1 and pis[0] == o:  # the first token spells no letter: the trie is back at its root
            resume[slot] = ids[1]
        conts += [(pis[j], ids[j + 1]) for j in range(len(ids) - 1) if pis[j] > o]
        slot_pref += [(slot, d, o + d) for d in range(1, len(v) + 1)]
    arr = lambda x, k: np.asarray(x, dtype=np.int64).reshape(-1, k)  # noqa: E731
    return _WordRecord(prefixes, ends, arr(frags, 3), arr(path, 4), resume, arr(conts, 2),
                       np.asarray(prog, dtype=np.int64), np.asarray(prog_frac, dtype=np.float64), arr(slot_pref, 3))


def _ragged(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Concatenated ``arange(s, s + c)`` for every (start, count) pair."""
    total = int(counts.sum())
    if not total:
        return np.zeros(0, dtype=np.int64)
    return np.repeat(starts - np.cumsum(counts) + counts, counts) + np.arange(total)


@dataclass(frozen=True)
class _Lexicon:
    """The trie of a batch's literal words and everything read off it (see ``compile_batch``): the device tables
    ``Compiled`` carries and the host arrays the per-row tables are built from."""

    key: tuple  # (words in batch order, number of fragments, device)
    Nn: int  # trie nodes (ROOT and DEAD included)
    tensors: dict  # Compiled's fields of the trie and the lookahead paths, on the device
    has_resume: bool
    # single-word progress: per word, the trie node of each non-empty prefix and its matched fraction
    prog_node_all: np.ndarray
    prog_frac_all: np.ndarray
    pcnt: np.ndarray
    poff: np.ndarray


def _lexicon(key: tuple, recs: list, F: int, device) -> _Lexicon:
    """``_Lexicon`` of the words whose ``_WordRecord``s are ``recs`` (batch order: word id = position)."""
    # trie nodes: one per distinct prefix of any variant (ROOT = the empty prefix; DEAD = 1 has no prefix); a
    # word's local prefix index pi is node ``pn[woff[word] + pi]``
    node_of = {"": ROOT}
    pn = np.fromiter((node_of.setdefault(x, len(node_of) + 1) for rec in recs for x in rec.prefixes), dtype=np.int64)
    npre = np.asarray([len(rec.prefixes) for rec in recs], dtype=np.int64)
    woff = np.cumsum(npre) - npre
    Nn = len(node_of) + 1
    node_depth = np.zeros(Nn, dtype=np.int64)
    node_depth[2:] = np.fromiter((len(x) for x in node_of), dtype=np.int64, count=Nn - 1)[1:]
    node_word = np.full(Nn, OTHER, dtype=np.int64)
    node_word[ROOT] = NO_EVENT

    def stacked(field, width=None):
        """The per-word array ``field`` (rows of ``width`` columns, or scalars) of every word, concatenated; with
        each row's offset into ``pn`` (a local prefix index plus it is the row's global one) and word index."""
        parts = [getattr(rec, field) for rec in recs]
        cnt = np.asarray([len(x) for x in parts], dtype=np.int64)
        cat = np.concatenate(parts) if parts else np.zeros((0,) if width is None else (0, width), dtype=np.int64)
        return cat, np.repeat(woff, cnt), np.repeat(np.arange(len(recs)), cnt)

    # a variant's full spelling is its word's node; where two words spell a variant alike ("ßx" capitalised is
    # "SSx") the later word keeps it, as writing word by word did
    ends, e_off, e_word = stacked("ends")
    end_node = pn[ends + e_off]
    last = len(end_node) - 1 - np.unique(end_node[::-1], return_index=True)[1]
    node_word[end_node[last]] = e_word[last]

    fr, fr_off, _ = stacked("frags", 3)
    # a key names a prefix and a fragment, so every write of a key carries the same node
    keys_np, first = np.unique(pn[fr[:, 0] + fr_off] * F + fr[:, 2], return_index=True)
    vals_np = pn[fr[:, 1] + fr_off][first]
    keys = torch.from_numpy(keys_np) if len(keys_np) else torch.tensor([-1], dtype=torch.long)
    vals = torch.from_numpy(vals_np) if len(vals_np) else torch.tensor([DEAD], dtype=torch.long)

    # ---- lookahead paths (see _word_record)
    Wc = max(len(recs), 1)
    pa, pa_off, pa_word = stacked("path", 4)
    Tm = int(pa[:, 1].max()) + 1 if len(pa) else 1
    path_tok = np.full((Wc, 2, Tm), -1, dtype=np.int64)
    path_node = np.full((Wc, 2, Tm), -5, dtype=np.int64)
    path_tok[pa_word, pa[:, 0], pa[:, 1]] = pa[:, 2]
    on = pa[:, 3] >= 0
    path_node[pa_word[on], pa[on, 0], pa[on, 1]] = pn[pa[on, 3] + pa_off[on]]
    sp, sp_off, sp_word = stacked("slot_pref", 3)
    Dmax = int(sp[:, 1].max()) if len(sp) else 1
    prefix_node = np.full((Wc, 2, Dmax + 1), -5, dtype=np.int64)
    prefix_node[sp_word, sp[:, 0], sp[:, 1]] = pn[sp[:, 2] + sp_off]
    path_resume = np.stack([rec.resume for rec in recs]) if recs else np.full((Wc, 2), -1, dtype=np.int64)
    # node -> {(word, next token)}. Not the root: every separator leads back there, so a root entry (the second
    # token of a path that opens with a lone space) would be proposed after any "," or " " and, forced as a
    # started literal, would skip the threshold and a dynamic clause's top-k; it also made J the number of such
    # words (414 instead of 35 for the NeuroComparatives lists). path_resume proposes it after its own first token.
    co, co_off, co_word = stacked("conts", 2)
    V1 = int(co[:, 1].max()) + 1 if len(co) else 1
    ckey = np.unique((pn[co[:, 0] + co_off] * Wc + co_word) * V1 + co[:, 1])  # sorted: node, then (word, token)
    cnode, cword, ctok = ckey // (Wc * V1), (ckey // V1) % Wc, ckey % V1
    cj = np.arange(len(ckey)) - np.searchsorted(cnode, cnode)  # the entry's rank among its node's
    J = int(cj.max()) + 1 if len(ckey) else 1
    node_cont_tok = np.full((Nn, J), -1, dtype=np.int64)
    node_cont_word = np.full((Nn, J), PAD_WORD, dtype=np.int64)
    node_cont_tok[cnode, cj], node_cont_word[cnode, cj] = ctok, cword
    # progress of a single word per trie node: matched prefix / word length (max over variants: maximum.at below)
    pr, pr_off, _ = stacked("prog")
    prog_node_all = pn[pr + pr_off]
    prog_frac_all = stacked("prog_frac")[0].astype(np.float32)
    pcnt = np.asarray([len(rec.prog) for rec in recs], dtype=np.int64)
    poff = np.cumsum(pcnt) - pcnt

    dv = _on(device)
    tensors = dict(keys=dv(keys), vals=dv(vals), node_word=dv(node_word), node_depth=dv(node_depth),
                   path_tok=dv(path_tok), path_node=dv(path_node),
                   path_first=dv(np.ascontiguousarray(path_tok[:, :, 0])), path_resume=dv(path_resume),
                   node_cont_tok=dv(node_cont_tok), node_cont_word=dv(node_cont_word), prefix_node=dv(prefix_node))
    for a in (prog_node_all, prog_frac_all, pcnt, poff):
        a.setflags(write=False)
    return _Lexicon(key=key, Nn=Nn, tensors=tensors, has_resume=bool((path_resume >= 0).any()),
                    prog_node_all=prog_node_all, prog_frac_all=prog_frac_all, pcnt=pcnt, poff=poff)


def compile_batch(css: list[ConstraintSet], tables: TokenTables, tok, device, cache: dict | None = None) -> Compiled:
    """``cache``: a dict kept by the caller across batches for one tokenizer and its ``tables`` (per-word tables, see
    ``_WordRecord``, and the last batch's ``_Lexicon``, whose tensors the returned ``Compiled`` shares: nothing may
    write into them)."""
    cache = {} if cache is None else cache
    B = len(css)
    rkeys = [_row_key(cs) for cs in css]
    rows = [_row_literals(*k) for k in rkeys]
    rrs = [_row_record(*k) for k in rkeys]
    # ---- canonical words and the trie of their surface variants
    words: dict[str, int] = {w: i for i, w in enumerate(dict.fromkeys(w for rr in rrs for w in rr.words))}
    gmaps = {}  # each distinct set's local word ids -> the batch's
    for k, rr in zip(rkeys, rrs):
        if k not in gmaps:
            gmaps[k] = np.fromiter((words[w] for w in rr.words), dtype=np.int64, count=len(rr.words))
    gmap = [gmaps[k] for k in rkeys]
    wlist = list(words)
    F = tables.num_frags
    # the trie and path tables depend on the batch's words alone (given the cache's tokenizer): a batch with the
    # previous one's words in the same order (a NeuroComparatives run within one pass, a benchmark's repeated batch)
    # takes them as they are
    lkey = (tuple(wlist), F, str(device))
    lex = cache.get(("lexicon",))
    if lex is None or lex.key != lkey:
        recs = []
        for w in wlist:
            rec = cache.get(("word", w))
            if rec is None:
                rec = cache[("word", w)] = _word_record(w, tables, tok)
            recs.append(rec)
        lex = cache[("lexicon",)] = _lexicon(lkey, recs, F, device)
    Nn = lex.Nn
    prog_node_all, prog_frac_all, pcnt, poff = lex.prog_node_all, lex.prog_frac_all, lex.pcnt, lex.poff

    # ---- literal / clause / count tables
    # Single-word literals are aggregated through per-word increment tables (wtab); phrases and the negative
    # literals of clauses with several negatives keep their own progress/occurrence state (ph_*).
    ncl = [(len(cs.clauses), len(cs.dynamic)) for cs in css]
    Cl = max([a + b for a, b in ncl] + [1])
    G = max([len(cs.counts) for cs in css] + [1])
    D = max([len(cs.dynamic) for cs in css] + [1])
    Wc1 = len(wlist) + 1
    X = 2 * Cl + G
    wtab = np.zeros((B, Wc1, X), dtype=np.int64)
    wlit = np.full((B, Wc1, Cl), -1, dtype=np.int64)
    grp_max = np.full((B, G), PAD_LEN, dtype=np.int64)
    cl_valid = np.zeros((B, Cl), dtype=bool)
    cl_has_pos = np.zeros((B, Cl), dtype=bool)
    cl_posmask = np.zeros((B, Cl), dtype=np.int64)
    cl_maxpos = np.zeros((B, Cl), dtype=np.int64)
    neg_total = np.zeros((B, Cl), dtype=np.int64)
    dyn_topk = np.ones((B, D), dtype=np.int64)
    for b, (cs, rr, g) in enumerate(zip(css, rrs, gmap)):
        for ci, c in enumerate(list(cs.clauses) + list(cs.dynamic)):
            cl_valid[b, ci] = True
            if c.positions:
                m = 0
                for q in c.positions:
                    m |= 1 << int(q)
                cl_posmask[b, ci] = m
                cl_maxpos[b, ci] = max(int(q) for q in c.positions)
        for di, d in enumerate(cs.dynamic):
            dyn_topk[b, di] = int(d.top_k)
        for gi, gr in enumerate(cs.counts):
            grp_max[b, gi] = int(gr.max_count)
        neg_total[b, rr.neg_clause] = rr.neg_count
        cl_has_pos[b, rr.pos_clauses] = True
        np.add.at(wtab[b], (g[rr.sw_word], rr.sw_index + rr.sw_kind * Cl), 1)
        wlit[b, g[rr.first_lit[:, 0]], rr.first_lit[:, 1]] = rr.first_lit[:, 2]
    Lph = max(len(rr.phr) for rr in rrs)
    ph_gidx = np.full((B, max(Lph, 1)), -1, dtype=np.int64)
    ph_cl_pos = np.zeros((B, max(Lph, 1), Cl), dtype=np.float32)
    ph_cl_neg = np.zeros((B, max(Lph, 1), Cl), dtype=np.float32)
    ph_grp = np.zeros((B, max(Lph, 1), G), dtype=np.float32)
    for b, (r, rr) in enumerate(zip(rows, rrs)):
        for k, li_idx in enumerate(rr.phr):
            li = r[li_idx]
            ph_gidx[b, k] = li_idx
            if li.group >= 0:
                ph_grp[b, k, li.group] = 1
            elif li.positive:
                ph_cl_pos[b, k, li.clause] = 1
            else:
                ph_cl_neg[b, k, li.clause] = 1
    S = max(rr.ph_next.shape[0] for rr in rrs)
    Lw = max(Lph, 1)
    ph_next = np.zeros((B, 2, S, Wc1 + 1), dtype=np.int64)
    ph_out = np.zeros((B, 2, S, Lw), dtype=np.int64)
    ph_prog = np.zeros((B, 2, S, Lw), dtype=np.int64)
    for b, (rr, g) in enumerate(zip(rrs, gmap)):
        n, base = rr.ph_next.shape[0], b * 2 * S
        blk = ph_next[b]  # [2, S, Wc1 + 1]
        blk[:] = base  # any other word leads to the root (rows past the set's states are never reached)
        blk[:, :n, g[rr.ph_cols]] = base + rr.ph_next[None]
        blk[:, :n, Wc1] = base + S + np.arange(n)  # no word: the same state, ending nothing
        ph_out[b, 0, :n, : rr.ph_out.shape[1]] = rr.ph_out
        ph_prog[b, :, :n, : rr.ph_prog.shape[1]] = rr.ph_prog
    ph_out = ph_out.reshape(B, 2 * S, Lw)
    ph_gout = (ph_out @ ph_grp.astype(np.int64)).reshape(B * 2 * S, G)
    ph_lit = np.full((B, 2 * S, Cl), -1, dtype=np.int64)
    pb, pk, pc = np.nonzero(ph_cl_pos)  # positive phrase literals (few: NeuroComparatives' phrases are count words)
    t, s = np.nonzero(ph_out[pb, :, pk])
    # of phrases of one clause ending together the last listed is named
    np.maximum.at(ph_lit, (pb[t], s, pc[t]), ph_gidx[pb[t], pk[t]])
    ph_lit = ph_lit.reshape(B * 2 * S, Cl)
    ph_out = ph_out.reshape(B * 2 * S, Lw)
    # positive literals: lookahead and progress
    Lp = max([len(rr.pos) for rr in rrs] + [1])
    Pp = max(rr.Pp for rr in rrs)
    pos_words = np.full((B, Lp, Pp), PAD_WORD, dtype=np.int64)
    pos_len = np.full((B, Lp), PAD_LEN, dtype=np.int64)
    pos_ph = np.full((B, Lp), -1, dtype=np.int64)
    pos_valid = np.zeros((B, Lp), dtype=bool)
    pos_clause = np.zeros((B, Lp), dtype=np.int64)
    pos_dyn = np.full((B, Lp), -1, dtype=np.int64)
    pos_charlen = np.zeros((B, Lp, Pp + 1), dtype=np.float32)
    node_prog = np.zeros((B, Nn, Cl), dtype=np.float32)
    for b, (rr, g) in enumerate(zip(rrs, gmap)):
        n = len(rr.pos)
        if not n:
            continue
        pw = rr.pos_word
        pos_words[b, :n, : pw.shape[1]] = np.where(pw >= 0, g[pw.clip(min=0)], PAD_WORD)
        pos_len[b, :n] = (pw >= 0).sum(1)
        pos_ph[b, :n] = rr.pos_ph
        pos_valid[b, :n] = True
        pos_clause[b, :n] = rr.pos_clause
        pos_dyn[b, :n] = rr.pos_dyn
        cl = rr.pos_charlen  # a row with shorter literals than the batch's repeats its totals
        pos_charlen[b, :n] = np.concatenate([cl, np.repeat(cl[:, -1:], Pp + 1 - cl.shape[1], 1)], 1)
        if len(rr.prog_word):
            pw = g[rr.prog_word]
            idx = _ragged(poff[pw], pcnt[pw])
            np.maximum.at(node_prog[b], (prog_node_all[idx], np.repeat(rr.prog_clause, pcnt[pw])), prog_frac_all[idx])
    gen = torch.Generator().manual_seed(1234)
    cl_weight = torch.randint(1, 1 << 58, (Cl,), generator=gen, dtype=torch.long)
    if Cl <= 58:
        cl_weight = 2 ** torch.arange(Cl, dtype=torch.long)
    dv = _on(device)
    return Compiled(
        B=B, Cl=Cl, G=G, lits=rows, n_clauses=ncl, F=F,
        Wc1=Wc1, wtab=dv(wtab), wlit=dv(wlit), Lph=Lph, ph_S=S,
        ph_next=dv(ph_next.reshape(-1)), ph_out=dv(ph_out), ph_prog=dv(ph_prog.reshape(B * 2 * S, Lw)),
        ph_gout=dv(ph_gout), ph_lit=dv(ph_lit),
        ph_gidx=dv(ph_gidx), ph_cl_pos=dv(ph_cl_pos),
        ph_cl_neg=dv(ph_cl_neg),
        ph_has_neg=bool(ph_cl_neg.any()), ph_has_grp=bool(ph_grp.any()),
        ph_track_occ=bool(ph_cl_neg.any() or ph_cl_pos.any()), neg_total=dv(neg_total), has_neg=bool(neg_total.any()),
        has_word_limits=bool(((wtab[..., Cl:2 * Cl] > 0) & (cl_valid & ~cl_has_pos)[:, None, :]).any()
                             or (wtab[..., 2 * Cl:] > 0).any()),
        grp_max=dv(grp_max),
        cl_valid=dv(cl_valid), cl_has_pos=dv(cl_has_pos), cl_posmask=dv(cl_posmask), cl_maxpos=dv(cl_maxpos),
        cl_weight=dv(cl_weight), has_order=bool((cl_posmask != 0).any() or (cl_maxpos > 0).any()),
        Lp=Lp, Pp=Pp, pos_words=dv(pos_words), pos_len=dv(pos_len), pos_ph=dv(pos_ph), has_pos_phrase=bool((pos_ph >= 0).any()),
        pos_valid=dv(pos_valid), has_positive=bool(pos_valid.any()), pos_clause=dv(pos_clause), pos_dyn=dv(pos_dyn), pos_charlen=dv(pos_charlen),
        node_prog=dv(node_prog), dyn_topk=dv(dyn_topk), D=D, has_dyn=bool((pos_dyn >= 0).any()),
        dyn_kmax=[int(x) for x in dyn_topk.max(0)], has_resume=lex.has_resume, words=wlist, **lex.tensors,
    )
