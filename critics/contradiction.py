"""Pairwise contradiction / entailment scorers for the NeuroComparatives contradiction filter (§2.3.3).

Interface: ``scorer.scores(premises, hypotheses) -> (p_contradiction, p_entailment)`` (arrays, one per
ordered pair) and ``scorer.matrix(texts) -> (C, E)``, the ``n x n`` matrices over all ordered pairs of
``texts`` (diagonal 0). Filters threshold these (paper: contradiction 0.99, entailment 0.85).

* ``NLIScorer(name)``: any MNLI-style sequence classifier that ``i2d2.models.load_classifier`` resolves
  (e.g. ``roberta-large-mnli`` where a hub is reachable, or a local directory). Label indices come from
  the model's ``id2label`` (contradiction / entailment) or an explicit ``label_indices``.
* ``ComparativeDirectionScorer``: the offline default. It reads each statement's comparative claims
  as (attribute, direction) — ``more X`` / ``less X`` / ``fewer X``, and comparative adjectives placed
  on attribute scales (cheaper = less cost, more expensive = more cost; conf/wordlists/comparatives.yaml
  ``scales``) — and scores two statements as contradicting (1.0) when they put the subject at opposite
  ends of a shared attribute and as entailing (1.0) when they agree on one; otherwise 0 for both.

``load_contradiction_scorer(name)``: ``offline`` (default) or a classifier name.
"""

from __future__ import annotations

import logging
import re
from typing import Sequence

import numpy as np

log = logging.getLogger(__name__)


FUNCTION_WORDS = frozenset("of than to the a an and or in on at for with by as it its".split())


class PairwiseScorer:
    """Base: ``matrix`` from ``scores`` over all ordered pairs; subclasses may vectorise ``matrix``."""

    def scores(self, premises: Sequence[str], hypotheses: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def matrix(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        n = len(texts)
        C, E = np.zeros((n, n)), np.zeros((n, n))
        if n < 2:
            return C, E
        i, j = np.where(~np.eye(n, dtype=bool))
        c, e = self.scores([texts[k] for k in i], [texts[k] for k in j])
        C[i, j], E[i, j] = c, e
        return C, E


class NLIScorer(PairwiseScorer):
    """An MNLI-style classifier (premise, hypothesis) -> P(contradiction), P(entailment)."""

    def __init__(self, name: str, batch_size: int = 32, max_length: int = 128, label_indices: dict | None = None,
                 device: str | None = None):
        from i2d2.lightning_setup import resolve_device
        from i2d2.models import load_classifier

        self.model, self.tok = load_classifier(name, num_labels=3)
        self.model.eval()
        self.device = device or resolve_device(None)
        self.model.to(self.device)
        self.batch_size, self.max_length = batch_size, max_length
        if label_indices is None:
            id2label = {int(k): str(v).lower() for k, v in (self.model.config.id2label or {}).items()}
            found = {}
            for idx, lab in id2label.items():
                for key in ("contradiction", "entailment"):
                    if lab.startswith(key[:6]):
                        found[key] = idx
            if set(found) != {"contradiction", "entailment"}:
                raise ValueError(
                    f"NLI model {name!r} has labels {id2label}; cannot find 'contradiction' and 'entailment'. "
                    "Pass label_indices={'contradiction': i, 'entailment': j} (filters.contradiction.label_indices).")
            label_indices = found
        self.ci, self.ei = int(label_indices["contradiction"]), int(label_indices["entailment"])

    def scores(self, premises, hypotheses):
        import torch
        from tqdm.auto import tqdm

        c, e = np.zeros(len(premises)), np.zeros(len(premises))
        with torch.no_grad():
            for s in tqdm(range(0, len(premises), self.batch_size), desc="nli", disable=len(premises) < 512):
                enc = self.tok(list(premises[s:s + self.batch_size]), list(hypotheses[s:s + self.batch_size]),
                               return_tensors="pt", padding=True, truncation=True, max_length=self.max_length)
                probs = torch.softmax(self.model(**enc.to(self.device)).logits.float(), -1).cpu().numpy()
                c[s:s + len(probs)], e[s:s + len(probs)] = probs[:, self.ci], probs[:, self.ei]
        return c, e


class ComparativeDirectionScorer(PairwiseScorer):
    """Offline contradiction detector for comparatives about one entity pair (same subject and object)."""

    def __init__(self, scales: dict[str, tuple[list[str], list[str]]] | None = None,
                 comparatives: Sequence[str] | None = None):
        if scales is None or comparatives is None:
            from i2d2.comparatives.wordlists import load_wordlists

            wl = load_wordlists()
            scales = wl.scales if scales is None else scales
            comparatives = wl.comparatives if comparatives is None else comparatives
        # phrase -> list of (scale, +1/-1); a phrase may sit on several scales (harder: hardness, difficulty)
        self.lexicon: dict[str, list[tuple[str, int]]] = {}
        for scale, (up, down) in scales.items():
            for words, sign in ((up, 1), (down, -1)):
                for w in words:
                    self.lexicon.setdefault(w.lower(), []).append((scale, sign))
        quant = {"more": 1, "less": -1, "fewer": -1}
        self.quantifiers = quant
        words = sorted(set(map(str.lower, comparatives)) | {p for p in self.lexicon if " " not in p}
                       - set(quant), key=len, reverse=True)
        multi = sorted((p for p in self.lexicon if " " in p), key=len, reverse=True)
        alts = [re.escape(p) for p in multi] + [rf"(?:more|less|fewer)\s+[a-z][a-z-]*"] + [re.escape(w) for w in words]
        self.pattern = re.compile(r"\b(" + "|".join(alts) + r")\b")

    def claims(self, text: str) -> set[tuple[str, int]]:
        """The (attribute, direction) claims a statement makes."""
        out = set()
        for m in self.pattern.finditer(text.lower()):
            phrase = m.group(1)
            if phrase in self.lexicon:
                out.update(self.lexicon[phrase])
                continue
            first, _, rest = phrase.partition(" ")
            if first in self.quantifiers and rest:
                rest = rest.strip()
                if rest in FUNCTION_WORDS:  # "more of an impact", "less than": no attribute named
                    continue
                if rest in self.lexicon:  # "less cheaper"-style doubles: flip the adjective's direction
                    out.update((s, -d if first != "more" else d) for s, d in self.lexicon[rest])
                else:
                    out.add((rest, self.quantifiers[first]))
            else:
                out.add((phrase, 1))
        return out

    def _claim_matrix(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        claims = [self.claims(t) for t in texts]
        keys = sorted({k for c in claims for k, _ in c})
        col = {k: i for i, k in enumerate(keys)}
        up = np.zeros((len(texts), len(keys)), dtype=np.float32)
        down = np.zeros_like(up)
        for r, cl in enumerate(claims):
            for k, d in cl:
                (up if d > 0 else down)[r, col[k]] = 1.0
        return up, down

    def matrix(self, texts):
        n = len(texts)
        if n == 0:
            return np.zeros((0, 0)), np.zeros((0, 0))
        up, down = self._claim_matrix(texts)
        opposite = (up @ down.T + down @ up.T) > 0
        same = (up @ up.T + down @ down.T) > 0
        off = ~np.eye(n, dtype=bool)
        return (opposite & off).astype(float), (same & ~opposite & off).astype(float)

    def scores(self, premises, hypotheses):
        texts = list(premises) + list(hypotheses)
        up, down = self._claim_matrix(texts)
        n = len(premises)
        pu, pd_, hu, hd = up[:n], down[:n], up[n:], down[n:]
        opposite = ((pu * hd).sum(1) + (pd_ * hu).sum(1)) > 0
        same = ((pu * hu).sum(1) + (pd_ * hd).sum(1)) > 0
        return opposite.astype(float), (same & ~opposite).astype(float)


def load_contradiction_scorer(name: str = "offline", **kwargs) -> PairwiseScorer:
    """``offline`` -> ComparativeDirectionScorer(scales=..., comparatives=...); else NLIScorer(name, ...)."""
    if name in (None, "", "offline", "comparative-direction"):
        return ComparativeDirectionScorer(kwargs.get("scales"), kwargs.get("comparatives"))
    nli_keys = {k: v for k, v in kwargs.items() if k in ("batch_size", "max_length", "label_indices", "device")}
    return NLIScorer(name, **nli_keys)
