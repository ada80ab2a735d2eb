"""Per-tokenizer tables: the surface string of every token and how it moves the word automaton.

Computed once per (tokenizer, head size) with a single pass over the vocabulary and cached.
"""

from __future__ import annotations

import re
import weakref
from dataclasses import dataclass

import numpy as np
import torch

_PIECE_RE = re.compile(r"[^\W_]+|\s+|.", re.UNICODE | re.DOTALL)
_BYTE_RE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
_CONTROL_RE = re.compile(r"^(<[^<>\s]+>|\[[^\[\]\s]+\])$")  # <end_of_turn>, <unused7>, [MASK], ...
MAX_INNER = 8  # tokens holding more complete words than this inside them are never generated
# A byte of an incomplete UTF-8 sequence (one character split over byte-fallback / byte-level tokens) is
# carried in token strings as a private-use character; ``byte_letters`` turns it into a letter.
_RAW_BYTE = 0xF700
# Letters standing for the bytes 0x80-0xFF in the automaton (Latin Extended-B: all are word characters).
_BYTE_LETTER = 0x180 - 0x80


def byte_letters(text: str) -> str:
    """The automaton's spelling of ``text``: every non-ASCII letter/digit and every raw byte becomes the
    letters of its UTF-8 bytes.  "café" spelled 'caf' + 'é' and 'caf' + <0xC3> + <0xA9> then read the same,
    and a character split over tokens stays inside its word instead of separating it."""
    if text.isascii():
        return text
    out = []
    for ch in text:
        o = ord(ch)
        if _RAW_BYTE + 0x80 <= o <= _RAW_BYTE + 0xFF:
            out.append(chr(o - _RAW_BYTE + _BYTE_LETTER))
        elif o >= 0x80 and ch.isalnum():
            out.extend(chr(b + _BYTE_LETTER) for b in ch.encode("utf-8"))
        else:
            out.append(ch)
    return "".join(out)


# Placeholder for a punctuation mark completed by a later token (the token's variant rows): a one-char word no literal
# spells, so it separates words and breaks phrases as the mark itself does.
_MARK = "\ue000"
_MISSING = -(1 << 40)  # a value below every code point: "no character completes here"


def _utf8_parts(s: str):
    """UTF-8 view of a token string: the 6-bit values of its leading continuation bytes (which complete a character
    an earlier token started), and ``(start, bits, missing)`` of the character it leaves incomplete at its end
    (``None`` if it ends on a character boundary or is all continuation bytes)."""
    cont = []
    if s.isascii():
        return cont, None
    for ch in s:
        o = ord(ch) - _RAW_BYTE
        if not 0x80 <= o < 0xC0:
            break
        cont.append(o - 0x80)
    j = len(s)
    while j > len(cont) and 0x80 <= ord(s[j - 1]) - _RAW_BYTE < 0xC0:
        j -= 1
    lead = ord(s[j - 1]) - _RAW_BYTE if j > len(cont) else -1
    if not 0xC2 <= lead <= 0xF4:
        return cont, None
    need = 1 if lead < 0xE0 else 2 if lead < 0xF0 else 3
    have = s[j:]
    if len(have) >= need:
        return cont, None
    bits = lead & (0x1F, 0x0F, 0x07)[need - 1]
    for ch in have:
        bits = bits * 64 + ord(ch) - _RAW_BYTE - 0x80
    return cont, (j - 1, bits, need - len(have))


_CHAR_CLASS = None


def char_class() -> torch.Tensor:
    """[0x110000] int8 per code point: 0 a word character (it extends the word), 1 a space (ends it), 2 any other
    character (ends it and is a one-char word), as ``_PIECE_RE`` splits text.  U+0000 reads 0: it is where a step
    that completes no character looks."""
    global _CHAR_CLASS
    if _CHAR_CLASS is None:
        every = "".join(map(chr, range(0x110000)))  # one regex pass over all code points (0.3 s, not a 2 s loop)
        cls = np.full(0x110000, 2, dtype=np.int8)
        cls[[m.start() for m in re.finditer(r"[^\W_]", every)]] = 0  # the word pieces of _PIECE_RE
        cls[[m.start() for m in re.finditer(r"\s", every)]] = 1
        cls[0] = 0
        _CHAR_CLASS = torch.from_numpy(cls)
    return _CHAR_CLASS


def _decode_bytes(raw: bytes) -> str:
    """UTF-8 text of a token's bytes; bytes of a character the token holds only part of become raw-byte chars."""
    text = raw.decode("utf-8", errors="surrogateescape")
    return "".join(chr(ord(c) - 0xDC00 + _RAW_BYTE) if 0xDC80 <= ord(c) <= 0xDCFF else c for c in text)


def control_token_ids(tok) -> set:
    """Ids the model may emit but that are no text: special tokens and added control tokens such as Gemma's
    ``<end_of_turn>`` / ``<unusedN>`` (added tokens flagged special, or spelled like a tag)."""
    ids = set(tok.all_special_ids)
    for i, at in getattr(tok, "added_tokens_decoder", {}).items():
        if getattr(at, "special", False) or _CONTROL_RE.match(str(getattr(at, "content", at))):
            ids.add(int(i))
    return ids


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
    tokenizer does not know (a head larger than the tokenizer) get ''.  Bytes of a character that a token
    holds only part of are raw-byte characters (see ``byte_letters``).
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
    special = control_token_ids(tok)
    bd = _bytes_decoder() if style == "bytelevel" else None
    for i, p in enumerate(pieces[:size]):
        if i in special or p is None:
            continue
        if style == "bytelevel":
            try:
                out[i] = _decode_bytes(bytes(bd[c] for c in p))
            except KeyError:  # added tokens outside the byte alphabet
                out[i] = p
        elif style == "metaspace":
            m = _BYTE_RE.match(p)
            if m:
                b = int(m.group(1), 16)
                out[i] = chr(b) if b < 128 else chr(_RAW_BYTE + b)
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
    # [3V]: rows [0, V) the token; [V, 2V) / [2V, 3V) the token when its leading UTF-8 continuation bytes complete
    # a space / a punctuation mark an earlier token started (it then ends the word before that mark)
    has_sep: torch.Tensor  # [3V] bool
    lead: torch.Tensor  # [3V] long frag id
    tail: torch.Tensor  # [3V] long frag id
    inner: torch.Tensor  # [3V, I] long frag ids (0 = none)
    banned: torch.Tensor  # [V] bool: never generated (unknown ids, specials except EOS, too many inner words)
    eos_ids: list
    n_tok: int
    before: torch.Tensor  # [3V] frag: of a token ending in an incomplete character, the word's text before it
    utf8: torch.Tensor  # [V, 4, 5] how a token moves the pending character (see token_tables)
    split_chars: bool  # some token completes a character another token started

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

    def view(s):
        """(has_sep, lead, tail, inner fragments) of a byte_letters spelling (see TokenTables)."""
        ps = _PIECE_RE.findall(s)
        if len(ps) == 1 and (ps[0][0].isalnum() and ps[0][0] != "_"):
            return False, s, "", []
        k = 1 if ps[0][0].isalnum() and ps[0][0] != "_" else 0
        rest = ps[k:]
        tail = rest.pop() if rest and rest[-1][0].isalnum() and rest[-1][0] != "_" else ""
        return True, ps[0] if k else "", tail, [p for p in rest if not p.isspace()]

    def word_before(s, start):
        """The pending word's text before the incomplete character at ``start``: its node is where the word
        ends if that character turns out to be punctuation."""
        hs, lead, tail, _ = view(byte_letters(s[:start]) + "x")  # 'x': the character, whatever it is
        return (tail if hs else lead)[:-1]

    V = size
    empty = torch.zeros(V, dtype=torch.bool)
    # rows [0, V): the token; [V, 2V) / [2V, 3V): the token when its leading continuation bytes complete a space /
    # a punctuation mark (the word before it then ends there: the rows read the bytes as ' ' / _MARK)
    has_sep = torch.zeros(3 * V, dtype=torch.bool)
    lead = torch.zeros(3 * V, dtype=torch.long)
    tail = torch.zeros(3 * V, dtype=torch.long)
    before = torch.zeros(3 * V, dtype=torch.long)  # frag: the word's text before an incomplete last character
    # utf8[i, k] for a hypothesis whose pending character lacks k continuation bytes (k = 0: none pending):
    # (mul, add, cont, carry, missing) - the character so far reads x = bits * mul + add (< 0: none completes);
    # the new pending bits are x * cont + carry and ``missing`` bytes are then lacking (see the decoder's _events)
    utf8 = torch.zeros(V, 4, 5, dtype=torch.long)
    utf8[:, :, 1] = _MISSING
    inner_rows = []
    banned = torch.zeros(V, dtype=torch.bool)
    max_inner = 0
    completes = torch.zeros(V, dtype=torch.bool)  # tokens with their own variant rows
    for i, raw in enumerate(strings):
        if not raw:
            empty[i] = True
            continue
        cont, part = _utf8_parts(raw)
        if part is not None:
            utf8[i, :, 3], utf8[i, :, 4] = part[1], part[2]
        if cont:
            val = 0
            for k in range(1, 4):
                if k <= len(cont):  # the pending character completes here
                    val = val * 64 + cont[k - 1]
                    utf8[i, k, :2] = torch.tensor([64 ** k, val])
                elif len(cont) == len(raw):  # all continuation bytes: the character is still incomplete
                    utf8[i, k] = torch.tensor([64 ** len(cont), val + _MISSING, 1, -_MISSING, k - len(cont)])
        for r, s in enumerate([raw, " " + raw[len(cont):], _MARK + raw[len(cont):]] if cont else [raw]):
            j = r * V + i
            hs, ld, tl, inn = view(byte_letters(s))
            has_sep[j], lead[j], tail[j] = hs, fid(ld), fid(tl)
            if part is not None:
                before[j] = fid(word_before(s, part[0] - len(raw) + len(s)))
            if len(inn) > MAX_INNER:
                banned[i] = True
                inn = inn[:MAX_INNER]
            if inn:
                inner_rows.append((j, [fid(p) for p in inn]))
                max_inner = max(max_inner, len(inn))
        if cont:
            completes[i] = True
    inner = torch.zeros(3 * V, max(max_inner, 1), dtype=torch.long)
    for i, inn in inner_rows:
        inner[i, : len(inn)] = torch.tensor(inn)
    same = ~completes
    for x in (has_sep, lead, tail, before, inner):  # a token that completes no character reads its own row
        for r in (1, 2):
            x[r * V: (r + 1) * V][same] = x[:V][same]
    n = len(tok)
    banned[n:] = True  # head rows beyond the tokenizer decode to nothing
    for s in control_token_ids(tok):  # never generated, unless they end the text (below)
        if s < V:
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
    tables = TokenTables(strings, style, frag, empty, has_sep, lead, tail, inner, banned, eos_all, n, before, utf8,
                         bool(completes.any()))
    per_tok[key] = tables
    return tables
