"""Score statements with a trained critic: P(valid) for each text, batched, length-sorted, with a progress bar."""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from critics.critic import VALID
from i2d2.progress import progress as progress_log

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=2)
def _load(model_dir: str, mtime: float, device: str):
    import json

    meta_path = Path(model_dir) / "critic_meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    if meta.get("kind") == "probe":
        from critics.probe import ProbeCritic

        return ProbeCritic(model_dir, meta, device=device)
    from i2d2.models import load_classifier

    model, tok = load_classifier(model_dir, num_labels=2)
    model.i2d2_critic_meta = meta
    return model.to(device).eval(), tok


def critic_meta(critic) -> dict:
    """The ``critic_meta.json`` of a loaded critic ({} for a bare classifier folder)."""
    if hasattr(critic, "meta"):
        return critic.meta
    return getattr(critic[0], "i2d2_critic_meta", {})


def load_critic(model_dir: str | os.PathLike, device: str | None = None):
    """A critic directory written by ``train_critic`` (cached per directory): ``(model, tokenizer)`` for a
    fine-tuned classifier, a ``critics.probe.ProbeCritic`` for ``kind: probe``. ``device``: where it runs,
    ``i2d2.lightning_setup.resolve_device(cfg.trainer)``; None: CUDA when present."""
    from i2d2.lightning_setup import resolve_device

    path = Path(model_dir)
    marker = path / "critic_meta.json"
    if not (path / "config.json").exists() and not marker.exists():
        raise FileNotFoundError(f"{path} is not a critic model directory (no config.json or critic_meta.json); "
                                "train one with critics.train.train_critic")
    return _load(str(path.resolve()), (marker if marker.exists() else path / "config.json").stat().st_mtime,
                 device or resolve_device(None))


def score_loaded(critic, texts: Sequence[str], batch_size: int = 64, max_length: int | None = None,
                 progress: bool = True) -> np.ndarray:
    """P(valid) of each text under a critic returned by ``load_critic`` (canonicalised and cut to ``max_length``
    tokens as it was trained: None reads critic_meta.json's ``max_length``)."""
    from critics.data import canonical_statement

    if critic_meta(critic).get("canonicalize"):
        texts = [canonical_statement(t) for t in texts]
    if hasattr(critic, "score"):
        return critic.score(list(texts), batch_size=min(batch_size, 32), progress=progress)
    model, tok = critic
    max_length = int(max_length or critic_meta(critic).get("max_length") or 64)
    return score_model(model, tok, texts, batch_size=batch_size, max_length=max_length, progress=progress)


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
        for start in progress_log(range(0, len(texts), batch_size), desc="critic", disable=not progress, logger=log,
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
                max_length: int | None = None, progress: bool = True, device: str | None = None) -> np.ndarray:
    """P(valid) of each text under the critic saved in ``model_dir`` (on ``device``, see ``load_critic``);
    shape ``(len(texts),)``."""
    return score_loaded(load_critic(model_dir, device), texts, batch_size=batch_size, max_length=max_length,
                        progress=progress)
