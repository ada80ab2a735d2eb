"""Tensorized NeuroLogic decoding (Lu et al., 2021) with the I2D2 / NeuroComparatives extensions.

Every hypothesis carries its constraint state as tensors on the model's device: the word-automaton node,
per-literal phrase progress and occurrence counts, the rank at which each clause was satisfied.  One step:

1. candidates = top tokens of each hypothesis + lookahead tokens that advance a pending positive phrase
   (for dynamic clauses only the top-k words by the current next-token probability), lookahead tokens
   below the ``prune_factor``-th best token of their hypothesis are dropped;
2. the automaton is advanced for all candidates at once (sorted-key lookups, no per-beam Python);
3. candidates that irreversibly violate a clause / count limit / order are pruned, the rest are kept when
   within ``sat_tolerance`` of the best number of satisfied clauses of their prompt;
4. kept candidates are grouped by their set of satisfied clauses and the beam is filled round-robin
   across groups (best first inside a group by log-prob + beta * progress of the longest partial phrase);
   words are only known to be complete at the next separator, so for grouping, the sat_tolerance count and
   the beta reward the pending (unfinished) word is taken as complete: a candidate whose last token spells a
   literal joins the group of the clauses it would satisfy, and one whose pending word would break a limit,
   a negative literal or an order once completed ranks after the safe ones;
5. EOS candidates in the selection finish their hypothesis (EOS is blocked until positive clauses are met
   when ``block_eos_until_satisfied``); finished hypotheses are ranked by (all satisfied, number of
   satisfied clauses, S) with S = logprob / num_tokens ** length_penalty.

The step is free of host synchronisation: shapes are fixed per batch (the widest in-token word run is measured
once per batch), finished hypotheses are pooled on the device and ranked once at the end, and whether every
prompt is done is read on the host only every ``STOP_CHECK_EVERY`` steps.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field

import numpy as np
import torch

from i2d2.models import cache_keyword, output_cache
from i2d2.schemas import DecodingConfig

from .compile import DEAD, NO_EVENT, OTHER, ROOT, Compiled, compile_batch
from .constraints import ConstraintError, ConstraintSet, validate
from .vocab import char_class, token_tables

NEG = float("-inf")
_KEEP_FIRST = 1e4  # ranking bonus (not a score) putting in-progress literal tokens first among lookahead tokens
STOP_CHECK_EVERY = 4  # steps between host-side checks that every prompt is done (the only sync in the loop)
# per-word tables (about 5 KB a word on GPT-2's vocabulary, plus the last batch's trie) and validation tokenizations
# kept across batches: each store is emptied before a batch once it holds more entries than this (at most ~100 MB
# of word tables)
CACHE_MAX = 20_000
# per-prompt tables ([N, 1, ...]) the constraint-state update reads against [N, C, ...] candidates
_CAND_TABLES = ("neg_total", "grp_max", "cl_valid", "cl_has_pos", "cl_rank_ok", "cl_maxpos",
                "cl_ordered_pos", "cl_neg_only", "cl_not_pos", "cl_invalid")


def _topk(x, k: int):
    """``x.topk(k, dim=-1)``.  On a CPU, torch selects by nth_element once 64 * k > n, which costs 2-4x its partial
    sort: there a small k pads the rows with -inf up to 64 * k.  A larger k (the vocabulary's top-50 on a small
    vocabulary) stays with torch where it has several threads (it splits the rows over them: 0.31 against 0.72 ms
    for numpy on [80, 1000], 2 threads, an idle machine; with the other core busy the two come close); on one thread
    numpy's introselect and a sort of the k picks is a little faster (0.75 against 0.84 ms).  Exactly equal values
    (bf16 weights on a small vocabulary, -inf) may come out in another order than torch's, which can change which of
    them a beam keeps; a -inf pick may name a padding column: indices are clamped to the last real one."""
    n = x.shape[-1]
    if x.device.type != "cpu" or 64 * k <= n or k >= n or (k > 12 and torch.get_num_threads() > 1):
        return x.topk(k, dim=-1)
    if k <= 12 or x.dtype not in (torch.float32, torch.float64):
        v, i = torch.cat([x, x.new_full((*x.shape[:-1], 64 * k - n), NEG)], -1).topk(k, dim=-1)
        return v, i.clamp(max=n - 1)
    idx = torch.from_numpy(np.argpartition(x.detach().numpy(), n - k, axis=-1)[..., n - k:])
    v, o = x.gather(-1, idx).sort(dim=-1, descending=True)
    return v, idx.gather(-1, o)


def _kth_largest(x, k: int):
    """The k-th largest value of each row of a CPU float ``x`` whose k is a large share of its width (a small
    vocabulary's prune threshold): numpy's introselect reads it without sorting the k above it, 0.1 ms against 1.8
    for torch's top-500 of [80, 1000] on one thread.  The value equals ``x.topk(k).values[..., -1]`` exactly."""
    n = x.shape[-1]
    return torch.from_numpy(np.partition(x.detach().numpy(), n - k, axis=-1)[..., n - k].copy())


def _take(table, idx):
    """``table[idx]`` for a non-negative integer index tensor of any shape (no wrap-around of -1), as one
    ``index_select``: on a CPU advanced indexing costs 2-3x more per call, and the step makes dozens of lookups (a
    1-D index skips the two reshapes, which cost more than the lookup itself)."""
    if idx.dim() == 1:
        return table.index_select(0, idx)
    return table.index_select(0, idx.reshape(-1)).reshape(*idx.shape, *table.shape[1:])


@dataclass
class Generation:
    text: str
    score: float
    logprob: float
    num_tokens: int
    satisfied: list = field(default_factory=list)
    all_satisfied: bool = True
    matched: list = field(default_factory=list)


class _State:
    """Per-hypothesis tensors ([N, ...], N = prompts x beam).  ``ph_state``: the row of the phrases' automaton
    (``Compiled.ph_next``), one for all of a prompt's phrases.  A character the text ends inside of (its bytes
    split over tokens): ``pmiss`` its continuation bytes still to come (0: none), ``pbits`` its bits so far and
    ``bnode`` the pending word's node before it (None where the tokenizer splits no character)."""

    __slots__ = ("node", "ph_state", "ph_occ", "cpos", "cneg", "gcnt", "cmatch", "crank", "rctr", "cbad", "sat",
                 "bnode", "pbits", "pmiss")

    def take(self, idx, n_flat):
        """Select rows ``idx`` of the candidate-level state flattened to ``n_flat`` rows."""
        out = {}
        for k in self.__slots__:
            v = getattr(self, k)
            out[k] = None if v is None else _take(v.reshape(n_flat, *v.shape[2:]), idx)
        return _State(**out)

    def __init__(self, **kw):
        for k, v in kw.items():
            setattr(self, k, v)


class NeuroLogicDecoder:
    def __init__(self, model, tokenizer, config: DecodingConfig | dict | None = None):
        if isinstance(config, dict):
            config = DecodingConfig(**config)
        self.cfg = config or DecodingConfig()
        self.model = model.eval()
        self.tok = tokenizer
        self.device = next(model.parameters()).device
        self.is_s2s = bool(getattr(model.config, "is_encoder_decoder", False))
        head = model.get_output_embeddings()
        self.vocab = int(head.weight.shape[0]) if head is not None else int(model.config.vocab_size)
        gc = getattr(model, "generation_config", None)
        eos = getattr(gc, "eos_token_id", None) if gc is not None else None
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        self.tables = token_tables(tokenizer, self.vocab, eos)
        if not self.tables.eos_ids:
            raise ValueError("NeuroLogicDecoder: the tokenizer/model defines no EOS token")
        T = self.tables
        V = self.vocab
        d = self.device
        # a character split over tokens ends the word before it once complete if it is a space or punctuation: the
        # completing token is then read by its variant row (V or 2V past its id; token_tables), which the step picks
        # by the completed character's class
        self.split_chars = T.split_chars
        size = T.empty.shape[0]
        rows = (lambda x: torch.cat([x[r * size: r * size + V] for r in range(3)]).to(d)) if self.split_chars \
            else (lambda x: x[:V].to(d))
        self.t_hassep = rows(T.has_sep)
        self.t_lead = rows(T.lead)
        self.t_tail = rows(T.tail)
        self.t_inner = rows(T.inner)
        if self.split_chars:
            self.t_before = rows(T.before)
            self.t_utf8 = T.utf8[:V].reshape(V * 4, 5).to(d)  # row 4 * token + missing bytes of the pending char
            # code point -> offset of the row to read; past U+10FFFF (bytes no valid character has) the token's own
            cls = torch.cat([char_class(), torch.zeros((1 << 21) - 0x110000, dtype=torch.int8)])
            self.char_row = (cls.to(torch.int32) * V).to(d)
        self.bias = torch.zeros(V, device=d)
        self.bias[T.banned[:V].to(d)] = NEG
        self.eos_ids = torch.tensor(T.eos_ids, device=d)
        self.is_eos_v = torch.zeros(V, dtype=torch.bool, device=d)
        self.is_eos_v[self.eos_ids] = True
        self.is_end_v = self.is_eos_v.clone()  # tokens that finish a hypothesis
        if self.cfg.stop_strings:
            stops = tuple(self.cfg.stop_strings)
            ends = torch.tensor([any(x in s for x in stops) for s in T.strings[:V]], dtype=torch.bool)
            # only tokens that end on a separator: ".The" would leave a word pending
            self.is_end_v[: ends.shape[0]] |= (ends & (T.tail[: ends.shape[0]] == 0) & ~T.banned[: ends.shape[0]]).to(d)
        self.end_block = torch.where(self.is_end_v, NEG, 0.0)  # added to log-probs before min_new_tokens
        fwd = inspect.signature(model.forward).parameters
        self._pos_ids = "position_ids" in fwd and not self.is_s2s
        self._cache_kw = cache_keyword(model.forward)
        self._words = {}  # compile._WordRecord per literal word and the last batch's compile._Lexicon
        self._enc = {}  # tokenization of each literal text validated
        self._checked = set()  # word lists validated with this tokenizer (constraints.validate)

    # ------------------------------------------------------------------ public
    def decode(self, prompts: list[str], constraints: list[ConstraintSet | dict | None],
               progress: bool = False) -> list[list[Generation]]:
        if len(prompts) != len(constraints):
            raise ValueError(f"decode: {len(prompts)} prompts but {len(constraints)} constraint sets")
        css = []
        if len(self._enc) > CACHE_MAX:  # a long run over ever new concepts must not grow without bound
            self._enc.clear()
            self._checked.clear()

        def enc(text):
            ids = self._enc.get(text)
            if ids is None:
                ids = self._enc[text] = self.tok.encode(text, add_special_tokens=False)
            return ids

        for i, c in enumerate(constraints):
            cs = ConstraintSet.from_dict(c) if not isinstance(c, ConstraintSet) else c
            validate(cs, enc, where=f"prompt {i}", checked=self._checked)
            css.append(cs)
        bs = self.cfg.batch_size
        chunks = range(0, len(prompts), bs)
        if progress:
            from tqdm.auto import tqdm

            chunks = tqdm(chunks, desc="neurologic", unit="batch")
        out = []
        for s in chunks:
            if len(self._words) > CACHE_MAX:
                self._words.clear()
            out.extend(self._decode_batch(list(prompts[s: s + bs]), css[s: s + bs]))
        return out

    # ------------------------------------------------------------------ model plumbing
    def _prefill(self, prompts, K):
        tok, d = self.tok, self.device
        old = tok.padding_side
        tok.padding_side = "right" if self.is_s2s else "left"
        try:
            enc = tok(prompts, return_tensors="pt", padding=True)
        finally:
            tok.padding_side = old
        ids, am = enc["input_ids"].to(d), enc["attention_mask"].to(d)
        if ids.shape[1] == 0 or (am.sum(-1) == 0).any():  # an empty prompt: start from BOS (or EOS)
            start = tok.bos_token_id if tok.bos_token_id is not None else self.tables.eos_ids[0]
            col = torch.full((ids.shape[0], 1), start, device=d, dtype=ids.dtype)
            ids = torch.cat([ids, col], 1) if not self.is_s2s else torch.cat([col, ids], 1)
            am = torch.cat([am, torch.ones_like(col)], 1) if not self.is_s2s else torch.cat([torch.ones_like(col), am], 1)
        B = ids.shape[0]
        rep = torch.arange(B, device=d).repeat_interleave(K)
        if self.is_s2s:
            from transformers.modeling_outputs import BaseModelOutput

            enc_out = self.model.get_encoder()(input_ids=ids, attention_mask=am)
            hidden = enc_out.last_hidden_state[rep]
            self._encoder_out = BaseModelOutput(last_hidden_state=hidden)
            am = am[rep]
            start = self.model.config.decoder_start_token_id
            if start is None:
                start = getattr(getattr(self.model.config, "decoder", None), "bos_token_id", None) or tok.bos_token_id
            dec = torch.full((B * K, 1), int(start), device=d, dtype=torch.long)
            out = self.model(encoder_outputs=self._encoder_out, attention_mask=am, decoder_input_ids=dec, use_cache=True)
            return out.logits[:, -1, :], output_cache(out), am, None
        kw = {}
        if self._pos_ids:
            kw["position_ids"] = (am.cumsum(-1) - 1).clamp(min=0)
        out = self.model(input_ids=ids, attention_mask=am, use_cache=True, **kw)
        cache = output_cache(out)
        cache.reorder_cache(rep)
        logits = out.logits[:, -1, :][rep]
        am = am[rep]
        return logits, cache, am, am.sum(-1)

    def _forward(self, tokens, cache, am, pos):
        kw = {self._cache_kw: cache}
        if self.is_s2s:
            out = self.model(encoder_outputs=self._encoder_out, attention_mask=am, decoder_input_ids=tokens[:, None],
                             use_cache=True, **kw)
        else:
            if self._pos_ids:
                kw["position_ids"] = pos[:, None]
            out = self.model(input_ids=tokens[:, None], attention_mask=am, use_cache=True, **kw)
        return out.logits[:, -1, :], output_cache(out)

    # ------------------------------------------------------------------ automaton
    def _lookup(self, cp: Compiled, n, f):
        key = n * cp.F + f
        idx = torch.searchsorted(cp.keys, key).clamp(max=cp.keys.numel() - 1)
        found = _take(cp.keys, idx) == key
        # DEAD (node 1) spells no prefix, so no key starts from it: a lookup from DEAD finds nothing and stays DEAD
        res = torch.where(found, _take(cp.vals, idx), DEAD)
        return torch.where(f == 0, n, res)

    def _inner_events(self, cp: Compiled):
        """[V, I] word events of the complete words inside each token, for this batch's literals.  Runs of
        irrelevant words act like one (they only reset phrase progress), so they are merged and the width I is
        the most events any token really has here (usually 0 or 1): a static bound for every step."""
        inner = self.t_inner
        if not inner.shape[1]:
            return inner[:, :0]
        iw = cp.node_word[self._lookup(cp, torch.zeros_like(inner), inner)]
        prev = torch.cat([torch.full_like(iw[:, :1], NO_EVENT), iw[:, :-1]], 1)
        keep = (iw >= 0) | ((iw == OTHER) & (prev != OTHER))
        order = (~keep).long().argsort(dim=1, stable=True)
        width = int(keep.sum(1).max())  # once per batch
        packed = torch.where(keep.gather(1, order), iw.gather(1, order), NO_EVENT)
        return packed[:, :width].contiguous()

    def _events(self, cp: Compiled, lt, st: _State, cand, final: bool):
        """Word events of every (hypothesis, candidate) pair in text order, [E, N, C] (word id / NO_EVENT /
        OTHER), and the pending trie node after the candidate token."""
        N, C = cand.shape
        chars = None
        if lt["chars"]:  # the character the pending word ends inside of, completed or continued by the token
            u = _take(self.t_utf8, torch.add(st.pmiss[:, None], cand, alpha=4))  # [N, C, 5]
            x = torch.addcmul(u[..., 1], st.pbits[:, None], u[..., 0])  # its code point (< 0: none completes)
            cand = cand + _take(self.char_row, x.clamp(min=0))  # a space / punctuation completed: the variant row
            # the word before that mark ends at the node it had before the mark's first byte
            base = torch.where(cand >= self.vocab, st.bnode[:, None], st.node[:, None])
            ext, bext = self._lookup(cp, base, torch.stack([_take(self.t_lead, cand), _take(self.t_before, cand)]))
            chars = (u, x, bext)
        else:
            ext = self._lookup(cp, st.node[:, None].expand(N, C), _take(self.t_lead, cand))
        hs = _take(self.t_hassep, cand)
        node = torch.where(hs, _take(lt["tail_node"], cand), ext)
        if chars is not None:  # after a separator, the word's text before an incomplete last character starts at ROOT
            u, x, bext = chars
            bnode = torch.where(hs, _take(lt["before_node"], cand), bext)
            chars = (torch.where(u[..., 2] > 0, st.bnode[:, None], bnode), torch.addcmul(u[..., 3], x, u[..., 2]),
                     u[..., 4])
        events = [torch.where(hs, _take(cp.node_word, ext), NO_EVENT)[None]]
        if lt["inner_ev"].shape[1]:
            events.append(_take(lt["inner_ev"], cand).permute(2, 0, 1))
        if final:  # the text ends: the pending word is complete
            events.append(torch.where(_take(self.is_eos_v, cand % self.vocab), NO_EVENT, _take(cp.node_word, node))[None])
            node = torch.zeros_like(node)
        return torch.cat(events) if len(events) > 1 else events[0], node, chars

    @staticmethod
    def _phrase_step(cp: Compiled, state, col):
        """The phrases' automaton row after a word event given as its column ``col`` (the word id; Wc1 - 1 an
        irrelevant word; Wc1 none): one multiply-add and one lookup, whatever the number of phrases."""
        return _take(cp.ph_next, torch.add(col, state, alpha=cp.Wc1 + 1))

    @staticmethod
    def _rank_ok(lt, rank):
        """[N, C, Cl] whether each clause may be satisfied as the ``rank``-th (its ``positions``): one lookup in the
        per-rank table (rank <= Cl: a rank counts satisfied clauses)."""
        return lt["cl_rank_ok"].gather(3, rank[..., None]).squeeze(3)

    def _advance(self, cp: Compiled, lt, st: _State, cand, step: int, final: bool):
        """Advance the constraint state of every (hypothesis, candidate token) pair."""
        N, C = cand.shape
        Cl = cp.Cl
        ev, node, chars = self._events(cp, lt, st, cand, final)
        E = ev.shape[0]
        # single-word literals: per-word increment tables
        wl = cp.Wc1 - 1
        col = torch.where(ev >= 0, ev, wl)  # [E, N, C]: the word's column in the per-word tables
        uidx = col + lt["rowoff"]
        d = _take(lt["wtab"], uidx)  # [E, N, C, 2Cl+G]
        inc = d.sum(0)
        lits = _take(lt["wlit"], uidx)  # [E, N, C, Cl]: the first event naming a literal of the clause wins
        lit = None  # with positive phrases the phrase loop below picks it, event by event
        if not cp.has_pos_phrase:
            lit = lits[E - 1]
            for e in range(E - 2, -1, -1):  # E is 1-3: elementwise selects beat a reduction over a short outer dim
                lit = torch.where(lits[e] >= 0, lits[e], lit)
        cpos = st.cpos[:, None, :] + inc[..., :Cl]
        has_neg = cp.has_neg  # without negative literals cneg stays 0 and no clause holds by absence
        cneg = st.cneg[:, None, :] + inc[..., Cl:2 * Cl] if has_neg else None
        gcnt = st.gcnt[:, None, :] + inc[..., 2 * Cl:]
        # with one event a step, every clause satisfied in it is hit at event 0: the clause index alone ranks them
        by_pos = cp.has_order and E > 1
        if by_pos:  # event index at which each clause first gets a positive hit (E: none); after the last event
            # the count is cpos, after event e the running sum
            hit_e = torch.where(cpos > 0, E - 1, E)
            part, hit_by = st.cpos[:, None, :], []
            for e in range(E - 1):
                part = part + d[e, ..., :Cl]
                hit_by.append(part > 0)
            for e in range(E - 2, -1, -1):
                hit_e = torch.where(hit_by[e], e, hit_e)
        # phrases (and negatives of clauses with several negatives): one automaton state for all of a prompt's phrases
        if cp.Lph:
            Lph, B, K = cp.Lph, cp.B, N // cp.B
            ph_state = st.ph_state[:, None]
            n_comp = None  # completions of each phrase in this step
            g_inc = None  # count-group increments of the phrases completed in this step
            ph_hit_e = None  # event at which a phrase literal of each clause first completes (E: none)
            pcol = torch.where(ev == NO_EVENT, cp.Wc1, col)  # no word leaves a phrase's progress as it is
            # phrases count for clauses (positive / negative literals) and count groups: each table is read only
            # where the batch has such phrases (NeuroComparatives' phrases are count-only: no occurrence state,
            # their completions go straight to their groups)
            for e in range(E):
                ph_state = self._phrase_step(cp, ph_state, pcol[e])
                if cp.ph_track_occ:
                    comp = _take(cp.ph_out, ph_state)
                    n_comp = comp if n_comp is None else n_comp + comp
                if cp.ph_has_grp:
                    g = _take(cp.ph_gout, ph_state)
                    g_inc = g if g_inc is None else g_inc + g
                if cp.has_pos_phrase:
                    # a phrase literal ending at this event names its clause unless an earlier event did (a phrase
                    # of the clause may end a word before a one-word literal of it in one token: " car park,");
                    # where the clause had a positive literal before this step, cmatch below keeps that one
                    pl = _take(cp.ph_lit, ph_state)  # [N, C, Cl]
                    el = torch.where(lits[e] >= 0, lits[e], pl)  # at one event the one-word literal is named
                    lit = el if lit is None else torch.where(lit >= 0, lit, el)
                    if by_pos:
                        hit = pl >= 0
                        ph_hit_e = (torch.where(hit, e, E) if ph_hit_e is None
                                    else torch.where(hit & (ph_hit_e == E), e, ph_hit_e))
            if cp.ph_track_occ:  # phrases that occur for the first time
                occ0 = st.ph_occ[:, None, :]
                occ = occ0 + n_comp
                newly = ((occ > 0) & (occ0 == 0)).float().reshape(B, K * C, Lph)
            if cp.has_pos_phrase:
                cpos = cpos + torch.bmm(newly, cp.ph_cl_pos).reshape(N, C, Cl).long()
                if by_pos:
                    hit_e = torch.minimum(hit_e, ph_hit_e)
            if cp.ph_has_neg:
                cneg = cneg + torch.bmm(newly, cp.ph_cl_neg).reshape(N, C, Cl).long()
            if cp.ph_has_grp:
                gcnt = gcnt + g_inc
            ph_occ = occ.clamp(max=1 << 20) if cp.ph_track_occ else None
        else:
            ph_state = ph_occ = None
        cmatch = torch.where(st.cmatch[:, None, :] < 0, lit, st.cmatch[:, None, :])
        # clause level
        pos_hit = cpos > 0
        count_viol = (gcnt > lt["grp_max"]).any(-1)
        crank = st.crank[:, None, :]
        newly = pos_hit & (crank == 0) & lt["cl_valid"]
        if by_pos:  # clauses satisfied in one step are ranked by where in the text they were satisfied
            # clause-major [Cl, N, C]: the [Cl, Cl] comparison then runs over N * C contiguous entries (3-4x
            # cheaper on a CPU than with Cl innermost)
            key = (hit_e * Cl + lt["cl_index"]).permute(2, 0, 1).contiguous()
            rank = ((key[None] <= key[:, None]) & newly.permute(2, 0, 1).contiguous()[None]).sum(1)
            rank += st.rctr[None, :, None]
            rank = rank.permute(1, 2, 0).contiguous()
        else:
            rank = st.rctr[:, None, None] + newly.cumsum(-1)
        bad_new = newly & ~self._rank_ok(lt, rank)
        crank = torch.where(newly, rank, crank.expand_as(newly))
        rctr = st.rctr[:, None] + newly.sum(-1)
        cbad = st.cbad[:, None, :] | bad_new
        sat = pos_hit & ~cbad
        if has_neg:
            sat |= cneg < lt["neg_total"]
        mp = lt["cl_maxpos"]
        unsat = ~sat
        passed = lt["cl_ordered_pos"] & unsat & (mp <= rctr[..., None])
        valid_cl = lt["cl_valid"]
        violated = ((lt["cl_neg_only"] & unsat) | bad_new | passed).any(-1) | count_viol
        satv = sat & valid_cl
        if not final:
            # The pending (unfinished) word is only known to be complete at the next separator.  For ranking it
            # is taken as complete here, as the final step does (and as token-level NeuroLogic does): a candidate
            # whose last token spells a literal joins the group of clauses it satisfies and counts them for
            # sat_tolerance ("tentative" satisfaction, ``tsat``), instead of ranking low inside the group it had;
            # one whose pending word would break a limit, a negative literal or an order once completed is
            # ``risky`` (a likely dead end, ranked after the safe ones).
            w_end = _take(cp.node_word, node)
            t_col = torch.where(w_end >= 0, w_end, wl)
            d = _take(lt["wtab"], t_col + lt["rowoff"])
            tpos = cpos + d[..., :Cl]
            tneg = cneg + d[..., Cl:2 * Cl] if has_neg else None
            tg = gcnt + d[..., 2 * Cl:]
            if cp.Lph:
                t_state = self._phrase_step(cp, ph_state, torch.where(w_end == NO_EVENT, cp.Wc1, t_col))
                if cp.ph_track_occ:
                    tnew = (_take(cp.ph_out, t_state) & (occ == 0)).float().reshape(B, K * C, Lph)
                if cp.has_pos_phrase:
                    tpos = tpos + torch.bmm(tnew, cp.ph_cl_pos).reshape(N, C, Cl).long()
                if cp.ph_has_neg:
                    tneg = tneg + torch.bmm(tnew, cp.ph_cl_neg).reshape(N, C, Cl).long()
                if cp.ph_has_grp:
                    tg = tg + _take(cp.ph_gout, t_state)
            t_hit = tpos > 0
            t_new = t_hit & (crank == 0) & valid_cl
            t_rank = rctr[..., None] + t_new.cumsum(-1)
            t_bad = t_new & ~self._rank_ok(lt, t_rank)
            tsat = t_hit & ~(cbad | t_bad)
            if has_neg:
                tsat |= tneg < lt["neg_total"]
            tsat &= valid_cl
            t_rctr = rctr + t_new.sum(-1)
            t_unsat = ~tsat
            t_passed = lt["cl_ordered_pos"] & t_unsat & (mp <= t_rctr[..., None])
            risky = ((lt["cl_neg_only"] & t_unsat) | t_bad | t_passed).any(-1) | (tg > lt["grp_max"]).any(-1)
        else:
            tsat = satv
            risky = torch.zeros_like(count_viol)
        pos_ok = (satv | lt["cl_not_pos"]).all(-1)
        all_sat = (satv | lt["cl_invalid"]).all(-1) & ~count_viol
        new = _State(node=node, ph_state=ph_state, ph_occ=ph_occ, cpos=cpos.clamp(max=1 << 20),
                     cneg=cneg.clamp(max=1 << 20) if has_neg else None, gcnt=gcnt.clamp(max=1 << 20),
                     cmatch=cmatch.expand(N, C, Cl),
                     crank=crank, rctr=rctr, cbad=cbad, sat=satv, **dict(zip(("bnode", "pbits", "pmiss"),
                                                                             chars or (None,) * 3)))
        return new, violated, pos_ok, all_sat, risky, tsat

    def _progress(self, cp: Compiled, lt, st: _State, sat):
        """beta's reward: matched fraction of the longest partly matched positive literal of a clause not
        (tentatively, ``sat``) satisfied; a literal the pending word already completes is no longer partial."""
        N, C = st.node.shape
        unsat_cl = ~sat & lt["cl_has_pos"]
        single = _take(cp.node_prog.reshape(-1, cp.Cl), st.node + lt["nodeoff"])  # [N, C, Cl]
        best = torch.where(unsat_cl, single, 0.0).max(-1).values
        if cp.Lph and cp.has_pos_phrase:
            Lp = cp.Lp
            ph = lt["pos_ph"]  # [N,1,Lp]
            prog = torch.where(ph >= 0, _take(cp.ph_prog, st.ph_state).gather(2, ph.clamp(min=0).expand(N, C, Lp)), 0)
            words = lt["pos_words"].expand(N, C, Lp * cp.Pp).gather(2, lt["pos_lidx"] + prog.clamp(max=cp.Pp - 1))
            depth = _take(cp.node_depth, st.node).clamp(max=cp.prefix_node.shape[2] - 1)[..., None].expand_as(words)
            w = words.clamp(min=0)
            on = torch.zeros_like(prog, dtype=torch.bool)
            for v in range(2):
                on |= cp.prefix_node[w, v, depth] == st.node[..., None]
            on &= words >= 0
            cl = lt["pos_charlen"].expand(N, C, -1, -1)
            done = cl.gather(3, prog[..., None]).squeeze(-1) + torch.where(on, depth.float(), 0.0)
            frac = done / cl[..., -1].clamp(min=1)
            unsat = ~sat.gather(2, lt["pos_clause"].expand(N, C, Lp)) & (ph >= 0)
            best = torch.maximum(best, torch.where(unsat, frac, 0.0).max(-1).values)
        return best

    @staticmethod
    def _keeps_order(cp: Compiled, lt, st: _State, pend_word, last_word):
        """[N, Lp] whether proposing a literal's current word can keep the clause order.  A word that completes its
        literal, after a pending word that completes none, ranks the literal's clause next (rctr + 1): that breaks
        the order irreversibly where the clause's positions forbid that rank, where another unsatisfied clause needs
        a rank up to it, or where the clause was already ranked (at a forbidden rank: it is not satisfied).  Such
        proposals only took lookahead slots, ranked by log-prob, from the word that keeps the order.  Elsewhere
        (a phrase's earlier words, a pending literal word that may take the rank first) nothing is ruled out."""
        N, Cl = st.crank.shape
        r = (st.rctr + 1).clamp(max=Cl)
        rank_ok = lt["cl_rank_ok"][:, 0].gather(2, r[:, None, None].expand(N, Cl, 1)).squeeze(2)  # [N, Cl]
        blocking = (lt["cl_ordered_pos"][:, 0] & ~st.sat & (lt["cl_maxpos"][:, 0] <= r[:, None])).long()
        free = rank_ok & (st.crank == 0) & (blocking.sum(-1, keepdim=True) == blocking)  # none but itself blocks
        ok = free.gather(1, lt["pos_clause2"]) | (pend_word >= 0)
        return ok if last_word is None else ok | ~last_word

    def _lookahead(self, cp: Compiled, lt, st: _State, lp, A: int, thresh, prev):
        """Constraint tokens proposed beside the LM's top tokens: [N, A] tokens and whether each is real.
        ``prev`` [N]: each hypothesis's last token (-1 before the first)."""
        N = lp.shape[0]
        pend_word = _take(cp.node_word, st.node)[:, None]
        if lt["single_words"] is not None:  # every positive literal is one word: its current word never changes
            raw, words, start, start0, resume, start_res = lt["single_words"]
            pend_done = pend_word == raw  # the pending word already spells it: nothing left to propose
            # valid & ~(satisfied | done), as one comparison of booleans (False < True)
            need = (st.sat.gather(1, lt["pos_clause2"].expand(N, cp.Lp)) | pend_done) < lt["pos_valid2"]
            unsat, under_way = need, None  # no literal is under way at a word boundary
            last_word = None  # the current word of every literal is its last
        else:
            ph = lt["pos_ph2"]
            if cp.Lph:
                prog = torch.where(ph >= 0, _take(cp.ph_prog, st.ph_state).gather(1, ph.clamp(min=0)), 0)
            else:
                prog = torch.zeros_like(ph)
            wflat = lt["pos_words2"]
            words = wflat.gather(1, lt["pos_lidx2"] + prog.clamp(max=cp.Pp - 1))
            # the pending word already spells the next literal word: propose the word after it
            pend_done = pend_word == words
            prog = prog + pend_done.long()
            live = prog < lt["pos_len2"]
            words = wflat.gather(1, lt["pos_lidx2"] + prog.clamp(max=cp.Pp - 1)).clamp(min=0)
            vidx = words[:, None, :] + lt["variant_off"]
            start = _take(lt["path_first"], vidx)  # [N, 2, Lp]: first token of each variant of the current word
            unsat = ~st.sat.gather(1, lt["pos_clause2"].expand(N, cp.Lp)) & lt["pos_valid2"] & live
            need = unsat & ~pend_done
            under_way = prog > 0
            last_word = prog == lt["pos_len2"] - 1
            start0 = start[:, 0].clamp(min=0)
            if cp.has_resume:
                resume = _take(lt["path_resume"], vidx)
                start_res = torch.where(resume >= 0, start, -2)  # a start token that has a resume token
        # a literal whose word, once complete, breaks the clause order, a one-literal negative clause or a count limit
        # (a literal of an OR may be forbidden elsewhere) is proposed neither by its first token nor by a continuation
        # of the pending word: it only took a lookahead slot from a word that keeps them (a continuation the first)
        keep = self._keeps_order(cp, lt, st, pend_word, last_word) if cp.has_order else None
        if lt["word_forbidden"] is not None:
            if lt["single_words"] is not None:  # each literal's word is fixed
                forbidden, groups = lt["lit_forbidden"], lt["lit_groups"]
            else:
                idx = words + lt["rowoff"]
                forbidden, groups = _take(lt["word_forbidden"], idx), _take(lt["word_groups"], idx)
            full = st.gcnt >= lt["grp_max"][:, 0]  # [N, G] groups at their limit
            allowed = ~(forbidden | (groups & full[:, None, :]).any(-1))
            keep = allowed if keep is None else keep & allowed
        if keep is not None:
            unsat, need = unsat & keep, need & keep
        # continuations of the pending word along a literal's canonical path: looked up by trie node ([N, J]),
        # kept when that word is the current word of an unsatisfied literal whose pending word is not done
        # [N, word]: some literal needs it; a column without a continuation reads the spare last word, never needed
        want = torch.zeros(N, cp.Wc1 + 1, dtype=torch.long, device=lp.device)
        want.scatter_add_(1, words, need.long())
        cont = _take(lt["cont_tok"], st.node)
        cont_ok = want.gather(1, _take(lt["cont_word"], st.node)) > 0
        if cp.has_dyn:  # a dynamic clause proposes only its top_k words by current next-token log-prob
            sc = lp.gather(1, start0)  # [N, Lp]
            s = torch.where(lt["dyn_mine"], sc[:, None, :], NEG)  # [N, D, Lp]: -inf outside the dynamic clause
            # a k-th score of -inf (fewer finite scores than k) is raised so that -inf itself is never promoted
            kth = _topk(s, lt["dyn_kk"])[0].gather(2, lt["dyn_kth"]).clamp(min=torch.finfo(s.dtype).min)
            promoted = (s >= kth)[:, 0] if cp.D == 1 else (s >= kth).any(1)
            start_ok = unsat & (lt["pos_static2"] | promoted)
        else:
            start_ok = unsat
        # masks stay per literal [N, Lp] as long as they can; per variant they are [N, 2, Lp], variant-major: an
        # elementwise op that broadcasts over a last dimension of 2 costs ~10x more on a CPU than over Lp
        started_start = None if under_way is None else start_ok & under_way
        if cp.has_resume:  # the path's lone-space first token is out (and left the trie at its root): its second
            # token is next. The word is under way, so like a continuation it skips a dynamic clause's top-k (ranked
            # by first tokens, which say nothing here) and the threshold
            resume_ok = (prev[:, None, None] == start_res) & ((st.node == ROOT)[:, None] & need)[:, None, :]
            start = torch.where(resume_ok, resume, start)
            start_ok = start_ok[:, None, :] | resume_ok
            started_start = resume_ok if started_start is None else started_start[:, None, :] | resume_ok
        else:
            start_ok = start_ok[:, None, :]
            started_start = (torch.zeros_like(start, dtype=torch.bool) if started_start is None
                             else started_start[:, None, :].expand_as(start))
        # every column holds a real token (a word's path always has a first token; a continuation column without
        # one reads token 0): whether it is proposed is ``prop`` alone
        toks = torch.cat([start.reshape(N, -1), cont], -1)
        prop = torch.cat([start_ok.expand_as(start).reshape(N, -1), cont_ok], -1)
        # the next token of a literal already under way (inside its word, or the next word of a started phrase)
        # is never pruned, as in the original NeuroLogic: otherwise long words ("typically" = 4 tokens on a
        # small vocabulary) are started and dropped
        started = torch.cat([started_start.reshape(N, -1), cont_ok], -1)
        tlp = lp.gather(1, toks)
        # started literals take the first slots; a banned token (log-prob -inf) keeps key -inf, started or not
        key = torch.where(prop, torch.where(started, tlp + _KEEP_FIRST, torch.where(tlp >= thresh[:, None], tlp, NEG)),
                          NEG)
        a = min(A, tlp.shape[1])
        # equal keys are copies of one token or -inf (not proposed): their order changes nothing (short of two
        # tokens with exactly equal log-probs)
        v, i = _topk(key, a)
        ok = v > NEG  # isfinite(): log-probs are never +inf, and this is one kernel, not four
        return torch.where(ok, toks.gather(1, i), -1), ok

    # ------------------------------------------------------------------ search
    def _decode_batch(self, prompts, css):
        cfg, d = self.cfg, self.device
        K = cfg.beam_size
        R = cfg.num_return
        B = len(prompts)
        N = B * K
        T_max = cfg.max_new_tokens
        cp = compile_batch(css, self.tables, self.tok, d, self._words)
        Cl, Lph = cp.Cl, cp.Lph
        rep = torch.arange(B, device=d).repeat_interleave(K)
        lt = {  # per-hypothesis views of the per-prompt tables
            "rowoff": (rep * cp.Wc1)[:, None],
            "nodeoff": (rep * cp.node_word.numel())[:, None],
            "wtab": cp.wtab.reshape(B * cp.Wc1, -1),
            "wlit": cp.wlit.reshape(B * cp.Wc1, -1),
            "inner_ev": self._inner_events(cp),
            # [V] the trie node a token's text after its last separator reaches from the root (-> DEAD if none)
            "tail_node": self._lookup(cp, torch.zeros_like(self.t_tail), self.t_tail),
            # [3V] after a separator, the node of the word's text before an incomplete last character
            "before_node": self._lookup(cp, torch.zeros_like(self.t_before), self.t_before) if self.split_chars else None,
            # split characters are followed only where words matter: the batch has literal words (Wc1 - 1)
            "chars": self.split_chars and cp.Wc1 > 1,
            "cont_tok": cp.node_cont_tok.clamp(min=0),  # a column with no continuation (word -3) is never proposed
            "cont_word": torch.where(cp.node_cont_word >= 0, cp.node_cont_word, cp.Wc1),
            "cl_index": torch.arange(Cl, device=d),
            "neg_total": cp.neg_total[rep][:, None, :],
            "grp_max": cp.grp_max[rep][:, None, :],
            "cl_valid": cp.cl_valid[rep][:, None, :],
            "cl_has_pos": cp.cl_has_pos[rep][:, None, :],
            "cl_posmask": cp.cl_posmask[rep][:, None, :],
            "cl_maxpos": cp.cl_maxpos[rep][:, None, :],
            "pos_ph": cp.pos_ph[rep][:, None, :],
            "pos_ph2": cp.pos_ph[rep],
            "pos_words": cp.pos_words.reshape(B, -1)[rep][:, None, :],
            "pos_words2": cp.pos_words.reshape(B, -1)[rep],
            "pos_lidx": (torch.arange(cp.Lp, device=d) * cp.Pp)[None, None, :],
            "pos_lidx2": (torch.arange(cp.Lp, device=d) * cp.Pp)[None, :],
            "pos_len2": cp.pos_len[rep],
            "pos_clause": cp.pos_clause[rep][:, None, :],
            "pos_clause2": cp.pos_clause[rep],
            "pos_valid2": cp.pos_valid[rep],
            "pos_charlen": cp.pos_charlen[rep][:, None],
            "dyn_topk": cp.dyn_topk[rep],
            "dyn_mine": cp.pos_dyn[rep][:, None, :] == torch.arange(cp.D, device=d)[None, :, None],
            "pos_static2": cp.pos_dyn[rep] < 0,
        }
        # clause masks the step reads as they are (each saves a few ops per step)
        cv, has_pos = lt["cl_valid"], lt["cl_has_pos"]
        # [N, 1, Cl, Cl + 1]: clause c may be the r-th satisfied (bit r of its positions mask; no mask: any rank)
        pm = lt.pop("cl_posmask")[..., None]
        rank_ok = (pm == 0) | (((pm >> torch.arange(Cl + 1, device=d).clamp(max=62)) & 1) == 1)
        lt.update(cl_rank_ok=rank_ok, cl_ordered_pos=has_pos & (lt["cl_maxpos"] > 0),
                  cl_neg_only=cv & ~has_pos, cl_not_pos=~has_pos | ~cv, cl_invalid=~cv)
        # a dynamic clause's k-th best literal score: one top-k of the widest k, then each clause's own k-th
        lt["dyn_kk"] = min(max(cp.dyn_kmax), cp.Lp)
        lt["dyn_kth"] = (lt["dyn_topk"][..., None] - 1).clamp(max=lt["dyn_kk"] - 1)
        # per-variant path tables, variant-major ([2 * Wc]; a word's variant v at v * Wc + word)
        lt["path_first"] = cp.path_first.T.reshape(-1)
        lt["path_resume"] = cp.path_resume.T.reshape(-1)
        lt["variant_off"] = torch.tensor([0, cp.path_first.shape[0]], device=d)[None, :, None]
        lt["single_words"] = None
        if not cp.has_pos_phrase:  # every positive literal is a single word (Pp = 1): its lookahead tables are fixed
            raw = lt["pos_words2"]
            words = raw.clamp(min=0)
            vidx = words[:, None, :] + lt["variant_off"]
            resume = _take(lt["path_resume"], vidx)
            start = _take(lt["path_first"], vidx)
            lt["single_words"] = (raw, words, start, start[:, 0].clamp(min=0), resume,
                                  torch.where(resume >= 0, start, -2))
        lt["word_forbidden"] = None
        if cp.has_positive and cp.has_word_limits:
            # per (prompt, word): completing the word breaks a one-literal negative clause; the count groups it is in
            neg_only = cp.cl_valid & ~cp.cl_has_pos
            forbidden = ((cp.wtab[..., Cl:2 * Cl] > 0) & neg_only[:, None, :]).any(-1).reshape(-1)
            groups = (cp.wtab[..., 2 * Cl:] > 0).reshape(B * cp.Wc1, cp.G)
            lt["word_forbidden"], lt["word_groups"] = forbidden, groups
            if lt["single_words"] is not None:
                idx = lt["single_words"][1] + lt["rowoff"]
                lt["lit_forbidden"], lt["lit_groups"] = _take(forbidden, idx), _take(groups, idx)
        has_positive = cp.has_positive
        z = lambda *shape: torch.zeros(*shape, dtype=torch.long, device=d)  # noqa: E731
        ph_start = rep * 2 * cp.ph_S  # each prompt's automaton root
        st = _State(node=z(N), ph_state=ph_start if Lph else None, ph_occ=z(N, Lph) if cp.ph_track_occ else None,
                    cpos=z(N, Cl), cneg=z(N, Cl) if cp.has_neg else None, gcnt=z(N, cp.G), cmatch=z(N, Cl) - 1,
                    crank=z(N, Cl), rctr=z(N),
                    cbad=torch.zeros(N, Cl, dtype=torch.bool, device=d),
                    sat=(cp.neg_total[rep] > 0) & cp.cl_valid[rep],  # negative clauses hold on the empty text
                    **({"bnode": z(N), "pbits": z(N), "pmiss": z(N)} if lt["chars"] else
                       {"bnode": None, "pbits": None, "pmiss": None}))
        cum = torch.full((N,), NEG, device=d)
        cum[::K] = 0.0
        hist = torch.zeros(N, T_max, dtype=torch.long, device=d)
        # finished hypotheses: every step records which of its candidates finish (by index, with the step's
        # [N, C] tables; of the [N * C, Cl] clause tables only their rows, which bounds the memory), and the best R
        # are read out and chosen once at the end: the step needs no host check of whether anything finished
        fin = []
        n_done = torch.zeros(B, dtype=torch.long, device=d)  # finished hypotheses satisfying everything
        done = torch.zeros(B, dtype=torch.bool, device=d)

        M = min(cfg.candidates_per_beam or 2 * K, cfg.prune_factor, self.vocab)
        PF = min(cfg.prune_factor, self.vocab)
        kth_alone = d.type == "cpu" and 64 * PF > self.vocab  # see _kth_largest / _topk
        A = cfg.lookahead or K
        alpha = cfg.length_penalty
        n_gram = cfg.no_repeat_ngram_size
        ar_B = torch.arange(B, device=d)
        no_prev = torch.full((N,), -1, dtype=torch.long, device=d)

        with torch.inference_mode():
            logits, cache, am, pos = self._prefill(prompts, K)
            ones_col = torch.ones_like(am[:, :1])  # each step's new attention-mask column
            for t in range(T_max):
                final = t == T_max - 1
                lp = torch.log_softmax(logits.float(), -1) + self.bias
                if t < cfg.min_new_tokens:
                    lp = lp + self.end_block
                if n_gram and t >= n_gram:
                    lp = self._ban_ngrams(lp, hist[:, : t], n_gram)
                # the prune threshold (the PF-th best log-prob) gates proposed constraint tokens; one top-k serves
                # it and the candidates unless PF is a large share of a small vocabulary on a CPU, where selecting
                # the PF-th value alone is cheaper than sorting the PF best (exactly equal log-probs, e.g. bf16
                # weights, may then come in another order among the top M: OUTPUT_REVISION 3)
                if has_positive and PF > M and kth_alone:
                    topv, topi = _topk(lp, M)
                    thresh = _kth_largest(lp, PF)
                else:
                    topv, topi = _topk(lp, max(M, PF))
                    thresh = topv[:, PF - 1]
                cand = topi[:, :M]
                cvalid = topv[:, :M] > NEG  # finite: a log-prob is never +inf (one kernel, isfinite is four)
                if has_positive:
                    la, la_ok = self._lookahead(cp, lt, st, lp, A, thresh, hist[:, t - 1] if t else no_prev)
                    cand = torch.cat([cand, la.clamp(min=0)], 1)
                    if t == 0:  # [A, M + A]: the columns before each lookahead column
                        earlier = torch.arange(cand.shape[1], device=d) < torch.arange(M, cand.shape[1], device=d)[:, None]
                    # de-duplicate: a proposed token (la = -1 where none) that is a top token or an earlier proposal
                    # is dropped (proposals have a finite log-prob, so the earlier copy is a valid candidate)
                    dup = ((la[:, :, None] == cand[:, None, :]) & earlier).any(-1)
                    cvalid = torch.cat([cvalid, la_ok & ~dup], 1)
                C = cand.shape[1]
                if t == 0:  # C is fixed for the batch: the per-prompt tables take the candidates' shape once, so the
                    # step's elementwise ops meet operands of one shape (on a CPU, broadcasting over a last dimension
                    # of Cl costs 5-10x more than the op itself)
                    for k in _CAND_TABLES:
                        lt[k] = lt[k].expand(N, C, *lt[k].shape[2:]).contiguous()
                    KC = K * C
                    ar = torch.arange(KC, device=d).expand(B, KC)  # candidate positions in a prompt's row
                    ar_eos = ar + KC  # an EOS candidate's position when hypotheses to continue are picked
                    row_off = ar_B[:, None] * KC  # each prompt's first candidate in the flat [N * C]
                clp = cum[:, None] + lp.gather(1, cand)
                clp = torch.where(cvalid, clp, NEG)
                new, violated, pos_ok, all_sat, risky, tsat = self._advance(cp, lt, st, cand, t, final)
                is_eos = _take(self.is_end_v, cand)  # EOS or a stop token: the hypothesis finishes here
                if cfg.block_eos_until_satisfied and not final:
                    clp = torch.where(is_eos & ~pos_ok, NEG, clp)
                rank_sc = clp
                if cfg.beta and has_positive:
                    rank_sc = clp + cfg.beta * self._progress(cp, lt, new, tsat)
                # grouping and sat_tolerance see a pending word that spells a literal as satisfying it
                nsat = tsat.sum(-1)
                group = (tsat * cp.cl_weight).sum(-1)
                # ---- selection per prompt row
                f_clp = clp.reshape(B, KC)
                fin_ok = f_clp > NEG
                f_viol = violated.reshape(B, KC)
                f_nsat = nsat.reshape(B, KC)
                good = fin_ok & ~f_viol
                best = torch.where(good, f_nsat, -1).max(1, keepdim=True).values
                elig = good & (f_nsat >= best - cfg.sat_tolerance)
                # tiers: 0 kept, 1 kept but its pending word is a dead end, 2 outside sat_tolerance,
                # 3 irreversibly violating (used only when nothing better is left), 4 impossible
                f_risky = risky.reshape(B, KC)
                tier = torch.where(elig, f_risky, torch.where(good, 2, torch.where(fin_ok, 3, 4)))
                f_sc = torch.where(fin_ok, rank_sc.reshape(B, KC), NEG)
                f_grp = group.reshape(B, KC)
                o_sc = f_sc.argsort(dim=1, descending=True, stable=True)
                g_o = f_grp.gather(1, o_sc) * 8 + tier.gather(1, o_sc)
                o2 = g_o.argsort(dim=1, stable=True)
                o = o_sc.gather(1, o2)
                gs = g_o.gather(1, o2)
                start_flag = torch.ones_like(gs, dtype=torch.bool)
                start_flag[:, 1:] = gs[:, 1:] != gs[:, :-1]
                start_pos = torch.where(start_flag, ar, 0).cummax(1).values
                rig = torch.empty_like(ar).scatter_(1, o, ar - start_pos)
                # lexicographic: tier, rank-in-group, -nsat, -score: one stable sort of the integer part over the
                # score order (nsat <= Cl, rank-in-group < KC)
                lex = (tier * KC + rig) * (Cl + 1) + (Cl - f_nsat)
                o = o_sc.gather(1, lex.gather(1, o_sc).argsort(dim=1, stable=True))
                f_eos = is_eos.reshape(B, KC).gather(1, o)
                if final:  # every hypothesis ends here; up to max(K, R) of the candidates fill the results
                    sel = o[:, :K]
                    fin_pick = o[:, :min(max(K, R), KC)]
                    fin_mask = tier.gather(1, fin_pick) < 4
                else:
                    keypos = torch.where(f_eos, ar_eos, ar)
                    sel = o.gather(1, keypos.topk(K, dim=1, largest=False).indices.sort(1).values)
                    fin_pick = o[:, :K]
                    fin_mask = f_eos[:, :K] & (tier.gather(1, fin_pick) <= 2)
                fin_mask &= ~done[:, None]
                # ---- finished hypotheses -> pool (a finished candidate's clp is finite: tier <= 2, or < 4 at the end)
                gidx = row_off + fin_pick  # [B, Kf] into N*C
                rows = [_take(x.reshape(N * C, -1), gidx) for x in (  # [B, Kf, Cl]
                    (new.sat, new.cmatch, new.ph_occ) if cp.ph_track_occ else (new.sat, new.cmatch))]
                if cp.has_order:  # clauses met at a forbidden rank: their matched literal is unset once, in _pool
                    rows.append(_take(new.cbad.reshape(N * C, -1), gidx))
                fin.append((gidx, fin_mask, hist, cand, clp, all_sat, rows))
                if cfg.early_stopping:
                    n_done = n_done + (_take(all_sat.reshape(-1), gidx) & fin_mask).sum(1)
                    done = n_done >= R
                if final or (cfg.early_stopping and (t + 1) % STOP_CHECK_EVERY == 0 and bool(done.all())):
                    break
                # ---- advance beams
                gsel = (row_off + sel).reshape(-1)
                src = gsel // C
                tok_next = _take(cand.reshape(-1), gsel)
                cum = _take(clp.reshape(-1), gsel)
                hist = _take(hist, src)
                hist[:, t] = tok_next
                st = new.take(gsel, N * C)
                cache.reorder_cache(src)
                if not self.is_s2s:  # an encoder-decoder's mask is the encoder's: one per prompt, never longer
                    am = torch.cat([_take(am, src), ones_col], 1)
                if pos is not None:
                    pos = _take(pos, src)
                logits, cache = self._forward(tok_next, cache, am, pos)
                if pos is not None:
                    pos = pos + 1
        # num_tokens^alpha from one table: a CPU pow over a tensor rounds by where an element sits (vectorised
        # blocks vs the scalar tail), so a score would depend on the batch's layout
        len_pen = torch.arange(T_max + 1, device=d).clamp(min=1).float() ** alpha
        return self._collect(cp, css, *self._best_finished(self._pool(fin, cp, B, N, C, len_pen), B, R, Cl))

    def _pool(self, fin, cp: Compiled, B: int, N: int, C: int, len_pen) -> list:
        """Every step's finished candidates read out of the step tables at once: [B, P, ...] columns (sequence,
        log-prob, S, tokens, all satisfied, clause flags, matched literals, phrase occurrences), P the candidates
        pooled over the steps, step-major within a prompt."""
        gi = torch.cat([f[0] for f in fin], 1)  # [B, P]: index into a step's N * C candidates
        step = torch.cat([torch.full_like(f[0], t) for t, f in enumerate(fin)], 1)
        mask = torch.cat([f[1] for f in fin], 1).reshape(-1)
        flat = (step * (N * C) + gi).reshape(-1)  # into the steps' candidate tables laid end to end
        tokc = _take(torch.cat([f[3].reshape(-1) for f in fin]), flat)
        seq = _take(torch.cat([f[2] for f in fin]), (step * N + gi // C).reshape(-1))
        seq.scatter_(1, step.reshape(-1, 1), tokc[:, None])  # the finishing token at its step
        n_tok = (step.reshape(-1) + 1) - _take(self.is_eos_v, tokc).long()
        lpn = _take(torch.cat([f[4].reshape(-1) for f in fin]), flat)
        S = torch.where(mask, lpn / _take(len_pen, n_tok), NEG)
        allf = _take(torch.cat([f[5].reshape(-1) for f in fin]), flat)
        cols = [c.reshape(B, -1, *c.shape[1:]) for c in (seq, lpn, S, n_tok, allf)]
        rows = [torch.cat([f[6][j] for f in fin], 1) for j in range(len(fin[0][6]))]  # sat, cmatch[, ph_occ][, cbad]
        if cp.has_order:  # a positive literal met at a rank its positions forbid did not satisfy the clause
            rows[1] = torch.where(rows.pop(), -1, rows[1])
        return cols + rows + ([] if cp.ph_track_occ else [torch.zeros_like(tokc).reshape(B, -1, 1)])

    @staticmethod
    def _best_finished(cols, B, R, Cl):
        """The R best pooled finished hypotheses per prompt, ranked by (all satisfied, number of satisfied
        clauses, S): the best partial results of an unsatisfiable set are those that satisfy the most clauses."""
        seq, lpn, S, n_tok, allf, satf = cols[:6]
        key = S.double() + (allf.double() * float(Cl + 1) + satf.sum(-1).double()) * 1e9
        top = key.topk(min(R, key.shape[1]), dim=1).indices
        return [c.gather(1, top.reshape(*top.shape, *([1] * (c.dim() - 2))).expand(*top.shape, *c.shape[2:]))
                for c in cols]

    def _ban_ngrams(self, lp, hist, n):
        t = hist.shape[1]
        win = hist.unfold(1, n, 1)  # [N, t-n+1, n]
        last = hist[:, t - n + 1:]
        match = (win[:, :, :-1] == last[:, None, :]).all(-1)
        # windows that do not match write into a spare last column, so no token id (0 included) is touched
        ban = torch.zeros(lp.shape[0], lp.shape[1] + 1, dtype=torch.bool, device=lp.device)
        ban.scatter_(1, torch.where(match, win[:, :, -1], lp.shape[1]), True)
        return lp.masked_fill(ban[:, :-1], NEG)

    def _collect(self, cp, css, fin_seq, fin_lp, fin_S, fin_n, fin_all, fin_sat, fin_cmatch, fin_phocc):
        # one transfer per buffer, then plain Python lists (no per-element tensor reads)
        seq, lpv, Sv, nv, allv, satv, cmv, phv, phg = (x.tolist() for x in (
            fin_seq, fin_lp, fin_S, fin_n, fin_all, fin_sat, fin_cmatch, fin_phocc, cp.ph_gidx))
        out = []
        for b, cs in enumerate(css):
            nc, nd = cp.n_clauses[b]
            lits = cp.lits[b]
            ph_of = {g: k for k, g in enumerate(phg[b]) if g >= 0}
            rows = [r for r in range(len(Sv[b])) if math.isfinite(Sv[b][r])]
            if any(allv[b][r] for r in rows):  # satisfying results exist: return only those
                rows = [r for r in rows if allv[b][r]]
            gens = []
            for r in rows:
                n = nv[b][r]
                text = self.tok.decode(seq[b][r][:n], skip_special_tokens=True).strip()
                satisfied = [bool(x) for x in satv[b][r][: nc + nd]]
                matched = []
                for ci in range(nc + nd):
                    m = cmv[b][r][ci]
                    if not satisfied[ci]:
                        matched.append(None)
                    elif m >= 0:
                        matched.append(lits[m].text)
                    else:  # satisfied because a negative literal is absent
                        absent = [li.text for k, li in enumerate(lits) if li.clause == ci and not li.positive
                                  and (k not in ph_of or phv[b][r][ph_of[k]] == 0)]
                        matched.append(f"NOT {absent[0]}" if absent else None)
                gens.append(Generation(text=text, score=Sv[b][r], logprob=lpv[b][r], num_tokens=n,
                                       satisfied=satisfied, all_satisfied=bool(allv[b][r]), matched=matched))
            out.append(gens)
        return out


__all__ = ["DecodingConfig", "Generation", "NeuroLogicDecoder", "ConstraintError"]
