"""Score statements with a trained critic: P(valid) for each text, batched, length-sorted, with a progress bar."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from critics.critic import VALID


@functools.lru_cache(maxsize=2)
def _load(model_dir: str, mtime: float):
    from i2d2.models import load_classifier

    model, tok = load_classifier(model_dir, num_labels=2)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return model.to(device).eval(), tok


def load_critic(model_dir: str | os.PathLike):
    """``(model, tokenizer)`` of a critic directory written by ``train_critic`` (cached per directory)."""
    path = Path(model_dir)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"{path} is not a critic model directory (no config.json); train one with "
                                "critics.train.train_critic")
    return _load(str(path.resolve()), (path / "config.json").stat().st_mtime)


@torch.no_grad()
def score_model(model, tokenizer, texts: Sequence[str], batch_size: int = 64, max_length: int = 64,
                progress: bool = True) -> np.ndarray:
    """P(valid) of each text under an in-memory classifier (label index 1 = valid)."""
    texts = [str(t) for t in texts]
    out = np.zeros(len(texts), dtype=np.float32)
    if not texts:
        return out
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    side = tokenizer.padding_side
    tokenizer.padding_side = "right"
    try:
        order = np.argsort([len(t) for t in texts], kind="stable")  # similar lengths per batch
        for start in tqdm(range(0, len(texts), batch_size), desc="critic", disable=not progress,
                          total=(len(texts) + batch_size - 1) // batch_size):
            idx = order[start:start + batch_size]
            enc = tokenizer([texts[i] for i in idx], padding=True, truncation=True, max_length=max_length,
                            return_tensors="pt")
            enc = {k: v.to(device) for k, v in enc.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
            logits = model(**enc).logits.float()
            out[idx] = logits.softmax(-1)[:, VALID].cpu().numpy()
    finally:
        tokenizer.padding_side = side
        model.train(was_training)
    return out


def score_texts(model_dir: str | os.PathLike, texts: Sequence[str], batch_size: int = 64,
                max_length: int = 64, progress: bool = True) -> np.ndarray:
    """P(valid) of each text under the critic saved in ``model_dir``; shape ``(len(texts),)``."""
    model, tok = load_critic(model_dir)
    return score_model(model, tok, texts, batch_size=batch_size, max_length=max_length, progress=progress)
