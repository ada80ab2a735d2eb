"""Per-tokenizer tables: the surface string of every token and how it moves the word automaton.

Computed once per (tokenizer, head size) with a single pass over the vocabulary and cached.
"""

from __future__ import annotations

import re
import weakref
from dataclasses import dataclass

import torch

_PIECE_RE = re.compile(r"[^\W_]+|\s+|.", re.UNICODE | re.DOTALL)
_BYTE_RE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
MAX_INNER = 8  # tokens holding more complete words than this inside them are never generated


def _bytes_decoder():
    """Inverse of GPT-2's byte -> printable-unicode map (the 'Ġ' = space convention)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def token_strings(tok, size: int) -> tuple[list[str], str]:
    """Surface text of each id < size, with word-initial markers turned into a leading space.

    Returns ``(strings, style)``; style is 'bytelevel', 'metaspace' or 'decode'.  Special tokens and ids the
    tokenizer does not know (a head larger than the tokenizer) get ''.
    """
    n = len(tok)
    pieces = tok.convert_ids_to_tokens(list(range(n)))
    dec = getattr(getattr(tok, "backend_tokenizer", None), "decoder", None)
    dname = type(dec).__name__ if dec is not None else ""
    sample = [p for p in pieces[: min(n, 5000)] if isinstance(p, str)]
    if "ByteLevel" in dname or (not dname and sum(p.startswith("Ġ") for p in sample) > 10):
        style = "bytelevel"
    elif "Metaspace" in dname or "Sequence" in dname and sum(p.startswith("▁") for p in sample) > 10 \
            or sum(p.startswith("▁") for p in sample) > 10:
        style = "metaspace"
    else:
        style = "decode"
    out = [""] * size
    special = set(tok.all_special_ids)
    bd = _bytes_decoder() if style == "bytelevel" else None
    for i, p in enumerate(pieces[:size]):
        if i in special or p is None:
            continue
        if style == "bytelevel":
            try:
                out[i] = bytes(bd[c] for c in p).decode("utf-8", errors="replace")
            except KeyError:  # added tokens outside the byte alphabet
                out[i] = p
        elif style == "metaspace":
            m = _BYTE_RE.match(p)
            if m:
                b = int(m.group(1), 16)
                out[i] = chr(b) if b < 128 else "\ufffd"
            else:
                out[i] = p.replace("▁", " ")
        else:
            out[i] = tok.decode([i])
    return out, style


@dataclass
class TokenTables:
    """Tensor features of every id in the model head (on CPU; moved to the device by the decoder).

    Word-automaton view of a token: if it holds no separator it only extends the pending word (``lead``
    is then the whole token).  Otherwise it completes the pending word extended by ``lead``, emits every
    complete word inside it (``inner``), and leaves ``tail`` as the new pending word.
    """

    strings: list[str]
    style: str
    frag_ids: dict  # fragment string -> id (0 = '')
    empty: torch.Tensor  # [V] bool, token adds no text
    has_sep: torch.Tensor  # [V] bool
    lead: torch.Tensor  # [V] long frag id
    tail: torch.Tensor  # [V] long frag id
    inner: torch.Tensor  # [V, I] long frag ids (0 = none)
    banned: torch.Tensor  # [V] bool: never generated (unknown ids, specials except EOS, too many inner words)
    eos_ids: list
    n_tok: int

    @property
    def num_frags(self) -> int:
        return len(self.frag_ids)


_CACHE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def token_tables(tok, head_size: int | None = None, eos_ids=()) -> TokenTables:
    size = max(head_size or 0, len(tok))
    eos_all = sorted({int(e) for e in eos_ids if e is not None} | ({tok.eos_token_id} - {None}))
    per_tok = _CACHE.setdefault(tok, {})
    key = (size, tuple(eos_all))
    if key in per_tok:
        return per_tok[key]
    strings, style = token_strings(tok, size)
    frag = {"": 0}

    def fid(s):
        i = frag.get(s)
        if i is None:
            i = frag[s] = len(frag)
        return i

    V = size
    empty = torch.zeros(V, dtype=torch.bool)
    has_sep = torch.zeros(V, dtype=torch.bool)
    lead = torch.zeros(V, dtype=torch.long)
    tail = torch.zeros(V, dtype=torch.long)
    inner_rows = []
    banned = torch.zeros(V, dtype=torch.bool)
    max_inner = 0
    for i, s in enumerate(strings):
        if not s:
            empty[i] = True
            continue
        ps = _PIECE_RE.findall(s)
        if len(ps) == 1 and (ps[0][0].isalnum() and ps[0][0] != "_"):
            lead[i] = fid(s)
            continue
        has_sep[i] = True
        k = 0
        if ps[0][0].isalnum() and ps[0][0] != "_":
            lead[i] = fid(ps[0])
            k = 1
        rest = ps[k:]
        if rest and rest[-1][0].isalnum() and rest[-1][0] != "_":
            tail[i] = fid(rest[-1])
            rest = rest[:-1]
        inn = [fid(p) for p in rest if not p.isspace()]
        if len(inn) > MAX_INNER:
            banned[i] = True
            inn = inn[:MAX_INNER]
        if inn:
            inner_rows.append((i, inn))
            max_inner = max(max_inner, len(inn))
    inner = torch.zeros(V, max(max_inner, 1), dtype=torch.long)
    for i, inn in inner_rows:
        inner[i, : len(inn)] = torch.tensor(inn)
    n = len(tok)
    banned[n:] = True  # head rows beyond the tokenizer decode to nothing
    eos = tok.eos_token_id
    for s in tok.all_special_ids:
        if s not in eos_all and s < V:
            banned[s] = True
    for eos in eos_all:  # EOS ends the text: it completes the pending word like a separator
        if eos >= V:
            continue
        empty[eos] = False
        has_sep[eos] = True
        lead[eos] = 0
        tail[eos] = 0
        inner[eos] = 0
        banned[eos] = False
    for c in "abcdefghijklmnopqrstuvwxyz":  # single chars are always fragments (trie building looks them up)
        fid(c)
    tables = TokenTables(strings, style, frag, empty, has_sep, lead, tail, inner, banned, eos_all, n)
    per_tok[key] = tables
    return tables
