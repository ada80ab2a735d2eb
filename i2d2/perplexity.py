"""LM perplexity in batches: prompt selection (I2D2 A.1.1, NeuroComparatives prompt filter) and the
critic's perplexity baseline."""

from __future__ import annotations

import logging
import math

import numpy as np
import torch

from i2d2.progress import progress as progress_log
from i2d2.schemas import PERPLEXITY_UNITS as UNITS  # what a perplexity is normalised by (per=)

log = logging.getLogger(__name__)


@torch.no_grad()
def sequence_nll(model, tokenizer, texts: list[str], batch_size: int = 16, prefixes: list[str] | None = None,
                 progress: bool = False, desc: str = "perplexity") -> tuple[np.ndarray, np.ndarray]:
    """Summed negative log-likelihood of each text (of the part after its prefix) and its token count.

    The first token is conditioned on BOS where the tokenizer adds one; texts are right-padded here so
    that positions line up for every architecture.
    """
    device = next(model.parameters()).device
    nll = np.zeros(len(texts))
    ntok = np.zeros(len(texts), dtype=np.int64)
    side = tokenizer.padding_side
    tokenizer.padding_side = "right"
    try:
        order = np.argsort([-len(t) for t in texts])  # similar lengths per batch: less padding
        for start in progress_log(range(0, len(texts), batch_size), desc=desc, disable=not progress, logger=log):
            idx = order[start:start + batch_size]
            batch = [texts[i] for i in idx]
            enc = tokenizer(batch, return_tensors="pt", padding=True)
            ids, att = enc["input_ids"].to(device), enc["attention_mask"].to(device)
            if tokenizer.bos_token_id is not None and not bool((ids[:, 0] == tokenizer.bos_token_id).all()):
                bos = torch.full((ids.shape[0], 1), tokenizer.bos_token_id, device=device)
                ids, att = torch.cat([bos, ids], 1), torch.cat([torch.ones_like(bos), att], 1)
            logits = model(input_ids=ids, attention_mask=att).logits[:, :-1].float()
            target = ids[:, 1:]
            mask = att[:, 1:].clone()
            if prefixes is not None:
                lead = int(tokenizer.bos_token_id is not None and bool(ids[0, 0] == tokenizer.bos_token_id))
                for row, i in enumerate(idx):  # only the continuation counts, not the prefix tokens
                    n_prefix = len(tokenizer(prefixes[i], add_special_tokens=False)["input_ids"])
                    mask[row, : max(0, lead + n_prefix - 1)] = 0
            lp = torch.log_softmax(logits, -1).gather(-1, target.unsqueeze(-1)).squeeze(-1)
            nll[idx] = (-(lp * mask).sum(1)).cpu().numpy()
            ntok[idx] = mask.sum(1).cpu().numpy()
    finally:
        tokenizer.padding_side = side
    return nll, ntok


def perplexity(model, tokenizer, texts: list[str], batch_size: int = 16, per: str = "word",
               prefixes: list[str] | None = None, progress: bool = False) -> np.ndarray:
    """exp(NLL / n) with n = tokens (``per='token'``) or whitespace words (``per='word'``, I2D2's unit)."""
    if per not in UNITS:  # anything else was silently per word
        raise ValueError(f"perplexity per must be one of {'|'.join(UNITS)}, got {per!r}")
    nll, ntok = sequence_nll(model, tokenizer, texts, batch_size, prefixes, progress)
    if per == "token":
        n = np.maximum(ntok, 1)
    else:
        conts = texts if prefixes is None else [t[len(p):] if t.startswith(p) else t for t, p in zip(texts, prefixes)]
        n = np.array([max(1, len(t.split())) for t in conts])
    with np.errstate(over="ignore"):
        return np.exp(np.minimum(nll / n, math.log(np.finfo(np.float64).max) - 1))
