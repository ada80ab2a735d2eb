"""A probe critic: a frozen LM's hidden states + logistic regression (``critic.kind: probe``).

Measured on the labelled Gemma generations (test concepts), a fine-tuned MiniLM critic barely clears the surface-only
floor (AP 0.56 vs 0.52) and moves 0.18 under meaning-preserving rewrites, while a linear probe on a middle layer of the
generator's own LM reaches AP ~0.71 (README: "Which critic"). The features of a statement are the mean over its tokens
and the last token's state of layer ``layer`` (concatenated); the regression strength ``C`` is chosen on dev.

With ``critic.probe_context.examples`` > 0 (the default preset: 16) every statement is read after a few-shot
context of labelled train-split statements, and the features are the statement's own states (mean ‖ last) and the
state at the trailing "Judgement:" (``context_features``); the context is run once and its KV cache reused.

The model folder holds ``critic_meta.json`` (``kind: probe``, the LM name, layer, max_length, the context text) and
``probe.safetensors`` (standardisation and regression weights): no pickles.
"""

from __future__ import annotations

import copy
import inspect
import logging
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from i2d2.lightning_setup import resolve_device
from i2d2.progress import progress as progress_log

log = logging.getLogger(__name__)

WEIGHTS = "probe.safetensors"


def check_layer(model, layer) -> None:
    """Refuse a ``critic.probe_layer`` the LM does not have (hidden_states holds num_hidden_layers + 1 entries)."""
    n = model.config.get_text_config().num_hidden_layers + 1
    for x in ([layer] if isinstance(layer, int) else layer):
        if not -n <= int(x) < n:
            raise ValueError(f"critic.probe_layer: {x} is not a layer of the probe LM (0 = embeddings .. {n - 1})")


@torch.no_grad()
def lm_features(model, tok, texts: Sequence[str], layer: int, batch_size: int = 32, max_length: int = 64,
                progress: bool = True) -> np.ndarray:
    """``[mean over tokens ‖ last token]`` of hidden layer ``layer`` for each text, float32 (n, 2 * hidden)."""
    check_layer(model, layer)
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
        for start in progress_log(range(0, len(texts), batch_size), desc="critic features", disable=not progress, logger=log,
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


def context_examples(rows: Sequence[dict], texts: Sequence[str], train_idx, examples: int, not_true: Sequence[str],
                     seed: int, max_words: int, label_map: dict | None = None) -> list[int]:
    """Indices (into ``rows``) of a few-shot context's ``examples``: half true and half drawn in turn from the
    ``not_true`` labels (empty: every invalid label of ``label_map``, by name), all from ``train_idx``, at most
    ``max_words`` words, one per concept, drawn with ``seed``. True and not-true alternate (an odd seed starts with a
    not-true one). Too few candidates is a ValueError naming ``critic.probe_context``."""
    from critics.data import label_mapping, normalize_label

    mapping = label_mapping(label_map)
    present = {rows[i]["label"] for i in train_idx}
    labels = list(dict.fromkeys(normalize_label(x) for x in not_true)) or sorted(
        k for k, v in mapping.items() if v == 0 and k in present)
    if not labels:
        raise ValueError("critic.probe_context: the train split has no statement with a label the label map makes "
                         "invalid, so the context would show true examples only")
    for lab in labels:
        if mapping.get(lab) != 0:
            raise ValueError(f"critic.probe_context.not_true: {lab!r} is not a label the label map makes invalid")
    n_true, n_other = examples // 2, examples - examples // 2
    want = {lab: n_other // len(labels) + (k < n_other % len(labels)) for k, lab in enumerate(labels)}
    rng = np.random.default_rng(seed)
    pool = [i for i in train_idx if len(texts[i].split()) <= max_words]
    rng.shuffle(pool)
    used, picked = set(), {}
    for label, n in [("true", n_true)] + list(want.items()):
        got = []
        for i in pool:
            if len(got) == n:
                break
            if (rows[i]["y"] == 1 if label == "true" else rows[i]["label"] == label) \
                    and rows[i]["concept"] not in used:
                got.append(int(i))
                used.add(rows[i]["concept"])
        if len(got) < n:
            raise ValueError(f"critic.probe_context: only {len(got)} train statements labelled {label!r} of at most "
                             f"{max_words} words and unused concepts, {n} wanted")
        picked[label] = got
    bad = [picked[b][j] for j in range(max(want.values(), default=0)) for b in labels if j < len(picked[b])]
    first, second = (picked["true"], bad) if seed % 2 == 0 else (bad, picked["true"])
    out = [x for pair in zip(first, second) for x in pair]
    return out + first[len(second):] + second[len(first):]


def context_text(instruction: str, statements: Sequence[str], truths: Sequence[bool]) -> str:
    """The context before each statement: the instruction, then each example as
    "Statement: ...\\nJudgement: true|false" followed by a blank line."""
    return instruction + "".join(f"Statement: {s}\nJudgement: {'true' if t else 'false'}\n\n"
                                 for s, t in zip(statements, truths))


def context_ids(tok, context: str) -> list[int]:
    """Token ids of the context: the LM's BOS (where it has one), then the text."""
    bos = [tok.bos_token_id] if tok.bos_token_id is not None else []
    return bos + tok(context, add_special_tokens=False)["input_ids"]


def item_ids(tok, statement: str, max_length: int = 64) -> tuple[list[int], int]:
    """Token ids of "Statement: <s>\\nJudgement:" (the statement cut to ``max_length`` tokens) and the number of
    the statement's own tokens; they start after "Statement:"."""
    head = tok("Statement:", add_special_tokens=False)["input_ids"]
    body = tok(" " + statement, add_special_tokens=False)["input_ids"][:max_length]
    tail = tok("\nJudgement:", add_special_tokens=False)["input_ids"]
    return head + body + tail, len(body)


def lm_body(model):
    """The transformer body of a causal LM (its states, no vocabulary head) and the keyword its forward takes the
    KV cache by (``i2d2.models.cache_keyword``)."""
    from i2d2.models import cache_keyword

    base = model.model if hasattr(model, "model") else model.base_model
    return base, cache_keyword(base.forward)


def check_context_length(model, tok, context_tokens: int, max_length: int) -> None:
    """Refuse a context after which a statement of ``max_length`` tokens would not fit the LM: past a sliding window
    the local layers drop context tokens, past the positions the LM has it fails. Checked for the longest statement
    the critic may read, so that a critic that fitted never refuses a longer generation when it scores."""
    longest = context_tokens + len(item_ids(tok, "")[0]) + max_length
    text_cfg = model.config.get_text_config()
    for what, limit in (("sliding window", getattr(text_cfg, "sliding_window", None)),
                        ("positions", getattr(text_cfg, "max_position_embeddings", None))):
        if limit and longest > limit:
            raise ValueError(f"critic.probe_context: the context ({context_tokens} tokens) and a statement of up to "
                             f"critic.max_length={max_length} tokens take {longest}, over the LM's {limit} {what}; "
                             "use fewer or shorter examples or a smaller max_length")


@torch.no_grad()
def context_features(model, tok, prefix: Sequence[int], texts: Sequence[str], layer: int | Sequence[int],
                     batch_size: int = 32, max_length: int = 64, progress: bool = True, final_state: bool = False):
    """Each text read after the context ``prefix`` (token ids) as "Statement: <s>\\nJudgement:": layer ``layer``'s
    ``[mean over the statement's tokens ‖ its last token ‖ the state at "Judgement:"]``, float32 (n, 3 * hidden).
    The prefix runs once; each batch copies its KV cache. ``final_state``: also the top layer's (normed) state at
    "Judgement:" (n, hidden), which the LM head reads. A list of layers gives each one's features side by side,
    from one forward (experiments comparing layers)."""
    texts = [str(t) for t in texts]
    device = next(model.parameters()).device
    hidden = model.config.get_text_config().hidden_size
    items = [item_ids(tok, t, max_length) for t in texts]
    n_head = len(tok("Statement:", add_special_tokens=False)["input_ids"])
    P = len(prefix)
    check_layer(model, layer)
    check_context_length(model, tok, P, max_length)
    was_training = model.training
    model.eval()
    from i2d2.models import output_cache

    base, cache_kw = lm_body(model)
    layers = [layer] if isinstance(layer, int) else [int(x) for x in layer]
    out = np.zeros((len(texts), 3 * hidden * len(layers)), dtype=np.float32)
    top = np.zeros((len(texts), hidden), dtype=np.float32) if final_state else None
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    try:
        o = base(input_ids=torch.tensor([list(prefix)], device=device), use_cache=True)
        prefix_cache = output_cache(o)
        order = np.argsort([len(ids) for ids, _ in items], kind="stable")
        for start in progress_log(range(0, len(texts), batch_size), desc="critic features (in context)", logger=log,
                                  disable=not progress, total=(len(texts) + batch_size - 1) // batch_size):
            idx = order[start:start + batch_size]
            lens = torch.tensor([len(items[i][0]) for i in idx], device=device)
            n_stmt = torch.tensor([items[i][1] for i in idx], device=device)
            B, L = len(idx), max(len(items[i][0]) for i in idx)  # from the host lists: no device sync
            ids = torch.nn.utils.rnn.pad_sequence([torch.tensor(items[i][0]) for i in idx], batch_first=True,
                                                  padding_value=pad).to(device)
            pos = torch.arange(L, device=device)
            # right padding after the context: every real token sits at P + its offset
            mask = torch.cat([torch.ones(B, P, dtype=torch.long, device=device),
                              (pos < lens[:, None]).long()], 1)
            cache = copy.deepcopy(prefix_cache)
            cache.batch_repeat_interleave(B)
            o = base(input_ids=ids, attention_mask=mask, use_cache=True, output_hidden_states=True,
                     **{cache_kw: cache})
            rows = torch.arange(B, device=device)
            in_stmt = ((pos >= n_head) & (pos < n_head + n_stmt[:, None])).unsqueeze(-1).float()
            feats = []
            for h in (o.hidden_states[x].float() for x in layers):
                mean = (h * in_stmt).sum(1) / n_stmt[:, None].clamp(min=1)
                feats += [mean, h[rows, n_head + n_stmt - 1], h[rows, lens - 1]]
            out[idx] = torch.cat(feats, -1).cpu().numpy()
            if final_state:
                top[idx] = o.last_hidden_state.float()[rows, lens - 1].cpu().numpy()
    finally:
        model.train(was_training)
    return (out, top) if final_state else out


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
        if self.meta.get("context") is not None:
            return context_features(self.model, self.tok, context_ids(self.tok, self.meta["context"]), texts,
                                    int(self.meta["layer"]), batch_size, int(self.meta["max_length"]), progress)
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


def probe_context(cfg: dict, rows: Sequence[dict], texts: Sequence[str], train_idx) -> tuple[str | None, list[int]]:
    """The few-shot context of ``cfg["probe_context"]`` drawn from the train rows ``train_idx``: (its text, the
    example rows), or (None, []) when ``examples`` is 0 (the plain probe)."""
    pc = cfg["probe_context"]
    if not int(pc["examples"]):
        return None, []
    ex = context_examples(rows, texts, train_idx, int(pc["examples"]), list(pc["not_true"]), int(pc["seed"]),
                          int(pc["max_words"]), cfg.get("label_map"))
    return context_text(pc["instruction"], [texts[i] for i in ex], [rows[i]["y"] == 1 for i in ex]), ex


def probe_lm_features(cfg: dict, texts: Sequence[str], device: str | None = None, context: str | None = None):
    """The probe's LM (``probe_lm``, on ``device``) and its features of ``texts`` as the critic reads them (layer
    ``probe_layer``, ``eval_batch_size``, ``max_length``; after ``context``, a ``probe_context`` text, if given):
    (features, model, tokenizer)."""
    from i2d2.models import load_causal_lm

    model, tok = load_causal_lm(cfg["probe_lm"])
    model = model.to(device or resolve_device(None))
    layer, bs, max_length = int(cfg["probe_layer"]), int(cfg["eval_batch_size"]), int(cfg["max_length"])
    if context is None:
        X = lm_features(model, tok, texts, layer, bs, max_length)
    else:
        X = context_features(model, tok, context_ids(tok, context), texts, layer, bs, max_length)
    return X, model, tok


def fit_probe(cfg: dict, rows: Sequence[dict], texts: Sequence[str], ys: np.ndarray, train_idx, dev_idx,
              model_dir: Path, device: str | None = None) -> float:
    """Features of every labelled text (after the ``probe_context``, whose examples then leave the training rows),
    logistic regression on train for each ``probe_C``, the C with the best dev AP kept; written atomically to
    ``model_dir``. Returns the seconds it took."""
    from safetensors.numpy import save_file
    from sklearn.preprocessing import StandardScaler

    from i2d2.io import atomic_dir, write_json

    t0 = time.time()
    layer = int(cfg["probe_layer"])
    context, examples = probe_context(cfg, rows, texts, train_idx)
    if context is not None:
        log.info("critic probe: %d train statements as context (left out of the fit):\n%s", len(examples), context)
        shown = {texts[i] for i in examples}  # by text: a duplicate of an example leaves the fit too
        train_idx = np.asarray(train_idx)[[texts[i] not in shown for i in train_idx]]
    X, _, _ = probe_lm_features(cfg, texts, device, context)
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
            # the context's examples leave the fit: n_fit is the train rows fitted
            **({"context": context, "context_examples": len(examples), "n_fit": int(len(train_idx))}
               if context is not None else {}),
            # no timings here: the model folder's bytes are an input fingerprint (metrics.json has fit_seconds)
            "best_score": ap, "monitor": "dev AP", "label_map": cfg.get("label_map")})
    log.info("critic probe: layer %d, C=%g (dev AP %.4f), %d features, %.0fs", layer, C, ap, X.shape[1],
             time.time() - t0)
    return time.time() - t0
