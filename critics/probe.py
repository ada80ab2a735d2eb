"""A probe critic: a frozen LM's hidden states + logistic regression (``critic.kind: probe``).

Measured on the labelled Gemma generations (test concepts), a fine-tuned MiniLM critic barely clears the surface-only
floor (AP 0.56 vs 0.52) and moves 0.18 under meaning-preserving rewrites, while a linear probe on a middle layer of the
generator's own LM reaches AP ~0.71 (README: "Which critic"). The features of a statement are the mean over its tokens
and the last token's state of layer ``layer`` (concatenated); the regression strength ``C`` is chosen on dev.

The model folder holds ``critic_meta.json`` (``kind: probe``, the LM name, layer, max_length) and ``probe.safetensors``
(standardisation and regression weights): no pickles.
"""

from __future__ import annotations

import inspect
import logging
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from i2d2.lightning_setup import resolve_device

log = logging.getLogger(__name__)

WEIGHTS = "probe.safetensors"


@torch.no_grad()
def lm_features(model, tok, texts: Sequence[str], layer: int, batch_size: int = 32, max_length: int = 64,
                progress: bool = True) -> np.ndarray:
    """``[mean over tokens ‖ last token]`` of hidden layer ``layer`` for each text, float32 (n, 2 * hidden)."""
    texts = [str(t) for t in texts]
    device = next(model.parameters()).device
    side = tok.padding_side
    tok.padding_side = "right"
    was_training = model.training
    model.eval()
    hidden = model.config.get_text_config().hidden_size
    out = np.zeros((len(texts), 2 * hidden), dtype=np.float32)
    order = np.argsort([len(t) for t in texts], kind="stable")
    # only hidden states are read: the LM head's logits for one position, not every token (Gemma's 262k-word head
    # costs more than its body, and [batch, tokens, 262k] floats are gigabytes)
    head_kw = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
    try:
        for start in tqdm(range(0, len(texts), batch_size), desc="critic features", disable=not progress,
                          total=(len(texts) + batch_size - 1) // batch_size):
            idx = order[start:start + batch_size]
            enc = tok([texts[i] for i in idx], return_tensors="pt", padding=True, truncation=True,
                      max_length=max_length).to(device)
            h = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], output_hidden_states=True,
                      **head_kw).hidden_states[layer].float()
            mask = enc["attention_mask"].unsqueeze(-1).to(h.dtype)
            mean = (h * mask).sum(1) / mask.sum(1).clamp(min=1)
            last = h[torch.arange(len(idx), device=device), enc["attention_mask"].sum(1) - 1]
            out[idx] = torch.cat([mean, last], -1).cpu().numpy()
    finally:
        tok.padding_side = side
        model.train(was_training)
    return out


class ProbeCritic:
    """A saved probe critic: ``score(texts)`` -> P(valid)."""

    def __init__(self, model_dir: str | Path, meta: dict, lm=None, device: str | None = None):
        from safetensors.numpy import load_file

        from i2d2.models import load_causal_lm

        w = load_file(str(Path(model_dir) / WEIGHTS))
        self.mean, self.scale, self.coef, self.intercept = w["mean"], w["scale"], w["coef"], float(w["intercept"][0])
        self.meta = meta
        self.model, self.tok = lm if lm is not None else load_causal_lm(meta["lm"])
        self.model = self.model.to(device or resolve_device(None))

    def features(self, texts, batch_size: int = 32, progress: bool = True) -> np.ndarray:
        return lm_features(self.model, self.tok, texts, int(self.meta["layer"]), batch_size,
                           int(self.meta["max_length"]), progress)

    def score_features(self, X: np.ndarray) -> np.ndarray:
        z = (X - self.mean) / self.scale @ self.coef + self.intercept
        return (1.0 / (1.0 + np.exp(-z))).astype(np.float32)

    def score(self, texts, batch_size: int = 32, progress: bool = True) -> np.ndarray:
        if len(texts) == 0:
            return np.zeros(0, dtype=np.float32)
        return self.score_features(self.features(texts, batch_size, progress))


def positive_scores(model, X: np.ndarray) -> np.ndarray:
    """A fitted scikit-learn classifier's score for the positive class: P(y = 1), or its decision value where it
    gives no probabilities (an SVM): either ranks for AP."""
    return model.predict_proba(X)[:, 1] if hasattr(model, "predict_proba") else model.decision_function(X)


def best_on_dev(make, grid, X: np.ndarray, ys: np.ndarray, train_idx, dev_idx):
    """Fit ``make(setting)`` on the train rows of ``X`` for every setting of ``grid``; return (dev AP, setting,
    fitted model) of the first best on dev, and every setting's (setting, dev AP)."""
    from critics.metrics import average_precision

    best, tried = None, []
    for g in grid:
        m = make(g).fit(X[train_idx], ys[train_idx])
        ap = average_precision(ys[dev_idx], positive_scores(m, X[dev_idx]))
        tried.append((g, ap))
        if best is None or ap > best[0]:
            best = (ap, g, m)
    return best, tried


def probe_classifier(cfg: dict):
    """The probe's classifier for a ``probe_C`` value (``C -> LogisticRegression``), as ``fit_probe`` fits it."""
    from sklearn.linear_model import LogisticRegression

    return lambda C: LogisticRegression(C=float(C), max_iter=5000, random_state=int(cfg["seed"]))


def probe_lm_features(cfg: dict, texts: Sequence[str], device: str | None = None):
    """The probe's LM (``probe_lm``, on ``device``) and its features of ``texts`` as the critic reads them (layer
    ``probe_layer``, ``eval_batch_size``, ``max_length``): (features, model, tokenizer)."""
    from i2d2.models import load_causal_lm

    model, tok = load_causal_lm(cfg["probe_lm"])
    model = model.to(device or resolve_device(None))
    X = lm_features(model, tok, texts, int(cfg["probe_layer"]), int(cfg["eval_batch_size"]), int(cfg["max_length"]))
    return X, model, tok


def fit_probe(cfg: dict, texts: Sequence[str], ys: np.ndarray, train_idx, dev_idx, model_dir: Path,
              device: str | None = None) -> float:
    """Features of every labelled text, logistic regression on train for each ``probe_C``, the C with the best dev
    AP kept; written atomically to ``model_dir``. Returns the seconds it took."""
    from safetensors.numpy import save_file
    from sklearn.preprocessing import StandardScaler

    from i2d2.io import atomic_dir, write_json

    t0 = time.time()
    layer = int(cfg["probe_layer"])
    X, _, _ = probe_lm_features(cfg, texts, device)
    sc = StandardScaler().fit(X[train_idx])
    Xs = sc.transform(X)
    (ap, C, clf), tried = best_on_dev(probe_classifier(cfg), cfg["probe_C"], Xs, ys, train_idx, dev_idx)
    for c, a in tried:
        log.info("critic probe: C=%g dev AP %.4f", float(c), a)
    C = float(C)
    with atomic_dir(model_dir) as tmp:
        save_file({"mean": sc.mean_.astype(np.float32), "scale": sc.scale_.astype(np.float32),
                   "coef": clf.coef_[0].astype(np.float32), "intercept": clf.intercept_.astype(np.float32)},
                  str(tmp / WEIGHTS))
        write_json(tmp / "critic_meta.json", {
            "kind": "probe", "lm": cfg["probe_lm"], "layer": layer, "max_length": int(cfg["max_length"]), "C": C,
            "canonicalize": bool(cfg["canonicalize"]),
            # no timings here: the model folder's bytes are an input fingerprint (metrics.json has fit_seconds)
            "best_score": ap, "monitor": "dev AP", "label_map": cfg.get("label_map")})
    log.info("critic probe: layer %d, C=%g (dev AP %.4f), %d features, %.0fs", layer, C, ap, X.shape[1],
             time.time() - t0)
    return time.time() - t0
