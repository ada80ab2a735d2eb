"""Experiment: does contrasting each statement with a twin of opposite truth help the default probe critic?

Reads a critic's labelled data and splits exactly as ``critics.train.train_critic`` does, builds each statement's
contrast c(s) and fits the probe's logistic regression (C chosen on dev) on: layer-``probe_layer`` states h(s) (the
default critic), h(s) - h(c(s)), both concatenated, h(s) with h(c(s)), and h(s) with the log-probability margin
log P(s) - log P(c(s)).  Prints dev and test AP of each (test chose nothing).

Run before few-shot context became the default (``critic.probe_context``): it reads the plain probe's features
(no context), as its numbers in critics/EXPERIMENTS.md were measured.

  --task generics      the I2D2 critic (default ``critic`` config); c(s) = s negated by a spaCy rule ("not" after the
                       main clause's first auxiliary or copula, else do/does/did + the root verb's lemma)
  --task comparatives  the NeuroComparatives discriminator (``task=comparatives``: its labels and overrides); c(s) = s
                       with the two entities swapped ("Compared to A, B ..." -> "Compared to B, A ..."): a true
                       comparative's twin is false, so a model that knows the ordering scores the pair apart

  python scripts/critic_contrast_pairs.py [--task generics|comparatives] [--limit N]
  # generics ~30 min on 2 CPU cores for the 2,911 statements; comparatives ~6 min for the 708

critics/EXPERIMENTS.md has the numbers (generics and the discriminator); none of these
beat the plain probe on test by more than the run-to-run spread.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def negate(doc) -> str | None:
    """The statement with its main clause negated, or None where the rule finds no auxiliary or finite verb."""
    root = next((t for t in doc if t.dep_ == "ROOT"), None)
    if root is None:
        return None
    aux = sorted([t for t in root.children if t.dep_ in ("aux", "auxpass") and t.i < root.i]
                 + ([root] if root.pos_ == "AUX" or root.lemma_ == "be" else []), key=lambda t: t.i)
    words = [t.text_with_ws for t in doc]
    if aux:
        a = aux[0]
        words[a.i] = a.text + ("not" if a.lower_ == "can" else " not") + a.whitespace_
        return "".join(words)
    do = {"VBZ": "does", "VBP": "do", "VBD": "did"}.get(root.tag_) if root.pos_ == "VERB" else None
    if do is None:
        return None
    words[root.i] = f"{do} not {root.lemma_}" + root.whitespace_
    return "".join(words)


def swap_entities(row: dict) -> str | None:
    """The comparative with its two entities swapped, or None where the prompt is not "Compared to A, B"."""
    m = re.match(r"^Compared to (.+?), (.+)$", row.get("prompt") or "")
    if m is None or not row["statement"].startswith(row["prompt"]):
        return None
    return f"Compared to {m.group(2)}, {m.group(1)}" + row["statement"][len(row["prompt"]):]


@torch.no_grad()
def sentence_logprob(model, tok, texts, batch_size=16) -> np.ndarray:
    """Sum of token log-probabilities of each text (its first token given)."""
    out = np.zeros(len(texts))
    side, tok.padding_side = tok.padding_side, "right"
    try:
        from tqdm.auto import tqdm

        for s in tqdm(range(0, len(texts), batch_size), desc="log P", unit="batch"):  # the slow part: full-vocab logits
            enc = tok(texts[s:s + batch_size], return_tensors="pt", padding=True)
            ids, am = enc["input_ids"], enc["attention_mask"]
            logits = model(input_ids=ids, attention_mask=am).logits[:, :-1].float()
            tl = logits.gather(2, ids[:, 1:, None])[..., 0] - logits.logsumexp(-1)
            out[s:s + batch_size] = (tl * am[:, 1:]).sum(1).numpy()
    finally:
        tok.padding_side = side
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", choices=("generics", "comparatives"), default="generics")
    ap.add_argument("--limit", type=int, default=0, help="only the first N statements of each split (a smoke run)")
    args = ap.parse_args(argv)

    from hydra import compose, initialize_config_dir
    from sklearn.preprocessing import StandardScaler

    from critics.metrics import average_precision
    from critics.probe import best_on_dev, lm_features, positive_scores, probe_classifier, probe_lm_features
    from critics.train import critic_config, labelled_splits
    from i2d2.labels import canonical_statement
    from i2d2.models import load_spacy

    comparatives = args.task == "comparatives"
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = compose(config_name="train", overrides=["task=comparatives"] if comparatives else [])
    if comparatives:
        from i2d2.recipes.comparatives import annotation_paths, critic_cfg

        c = critic_config(critic_cfg(cfg))
        paths = annotation_paths(cfg)
    else:
        c = critic_config(cfg.critic)
        paths = list(c["seed_annotations"])
    rows, texts, ys, (tr, dv, te), _ = labelled_splits(c, paths)
    if args.limit:  # a smoke run: the first N statements of each split
        parts = [np.asarray(x[:args.limit]) for x in (tr, dv, te)]
        keep = np.concatenate(parts)
        rows, texts, ys = [rows[i] for i in keep], [texts[i] for i in keep], ys[keep]
        tr, dv, te = np.split(np.arange(len(keep)), np.cumsum([len(x) for x in parts])[:2])
    if comparatives:  # the twin reads as the critic reads (canonicalised like texts)
        twins = [swap_entities(r) for r in rows]
        twins = [canonical_statement(w) if w is not None and c["canonicalize"] else w for w in twins]
    else:
        twins = [negate(d) for d in load_spacy().pipe(texts)]
    neg_texts = [n if n is not None else t for n, t in zip(twins, texts)]
    cs = "swap s" if comparatives else "not s"
    print(f"{len(texts)} statements ({len(tr)} train / {len(dv)} dev / {len(te)} test), "
          f"{sum(n is not None for n in twins)} with a twin; e.g. {texts[0]!r} -> {neg_texts[0]!r}", flush=True)

    X, model, tok = probe_lm_features(c, texts)
    Xn = lm_features(model, tok, neg_texts, int(c["probe_layer"]), int(c["eval_batch_size"]), int(c["max_length"]))
    margin = (sentence_logprob(model, tok, texts) - sentence_logprob(model, tok, neg_texts))[:, None]

    def fit(F):  # the default critic's fit (critics.probe.fit_probe) on other features
        Fs = StandardScaler().fit(F[tr]).transform(F)
        (ap_dev, _, clf), _ = best_on_dev(probe_classifier(c), c["probe_C"], Fs, ys, tr, dv)
        return ap_dev, average_precision(ys[te], positive_scores(clf, Fs[te]))

    print(f"{'features':36s} {'dev AP':>7s} {'test AP':>8s}")
    for name, F in [("h(s)  (the default critic)", X), (f"h(s) - h({cs})", X - Xn),
                    (f"h(s) | h(s) - h({cs})", np.concatenate([X, X - Xn], 1)),
                    (f"h(s) | h({cs})", np.concatenate([X, Xn], 1)),
                    (f"h(s) | log P(s) - log P({cs})", np.concatenate([X, margin], 1))]:
        ap_dev, ap_test = fit(F)
        print(f"{name:36s} {ap_dev:7.3f} {ap_test:8.3f}", flush=True)
    print(f"{f'log P(s) - log P({cs}) alone':36s} {average_precision(ys[dv], margin[dv, 0]):7.3f} "
          f"{average_precision(ys[te], margin[te, 0]):8.3f}   (base rate {ys[te].mean():.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
