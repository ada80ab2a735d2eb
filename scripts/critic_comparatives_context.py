"""Experiment: does a comparatives few-shot context help the NeuroComparatives discriminator's probe?

The discriminator (``task=comparatives``, ``task.filters.discriminator.critic``) is the I2D2 probe critic (Gemma 3 270M
layer 12, logistic regression) trained on the labelled Gemma comparatives, with ``probe_context: {examples: 0}``
because the default instruction speaks of generics. This script compares, by grouped K-fold cross-validation on the
critic's train + dev rows only (test is used for nothing in the choice), the plain probe against the probe reading
each comparative after a comparatives context: ``INSTRUCTION`` (written from i2d2/data/comparatives/GUIDE.md) and k
labelled examples drawn by the critic's own code (``critics.probe.probe_context``: half true, the rest in turn from
``not_true``, one per entity pair) from the CV TRAINING fold only. ``not_true`` is left empty, so the draw takes every
label the comparatives label map makes invalid (false, invalid, too_subjective_to_judge, too_vague_to_judge). The
examples leave every variant's fit in that fold (by text, as ``critics.probe.fit_probe`` drops them); the held-out
fold shares no entity with them (folds are grouped by ``critics.data.split_groups``, the critic's own grouping).

Variants (the features of critic=gemma_probe, all at ``probe_layer``):

  plain          mean ‖ last token of the bare statement (the discriminator today)
  k0             the instruction alone, no examples (a control for the template), stmt|judge
  k8, k16        the instruction and 8 / 16 examples, stmt|judge (the statement's states ‖ the state at "Judgement:")
  surface        ``critics.surface.SurfaceClassifier`` on the same folds: the surface-only floor, in CV

For each partition (``critic.seed`` = each of ``--seeds``: the critic's train / dev / test split moves with it, and
so do the train + dev rows the CV runs on) and each C of ``probe_C``: scaler + logistic regression on the training
folds, AP on the held-out one; each variant's C is its best mean CV AP in that partition (as
scripts/critic_fewshot_context.py --cv does). Reported: per-fold AP, mean AP minus the held-out base rate, wins over
the plain probe per fold, and the decision under the rule set before measuring (``adoption``): a context becomes the
comparatives default only if it beats the plain probe on at least 4 of 5 folds in most partitions (more than half)
AND by more than 0.02 mean CV AP over all partitions' folds AND its mean CV AP clears the surface-only classifier's on
the same folds. Where the critic's own draw refuses a context in a training fold (too few short examples of a
label from unused entity pairs: the comparatives have few short ``invalid`` rows), that fold's AP is nan, it counts
as no win, and the context is not adoptable as it stands (the critic would refuse to train on such a split).
``--describe-test`` then prints test AP (description only: fitted on train + dev at the CV-chosen C,
context drawn from the critic's train split as the critic draws it), after the decision.

  python scripts/critic_comparatives_context.py [--seeds 0,1,2,3] [--ks 8,16] [--folds 5] [--describe-test]
  # features cached in --cache-dir (default runs/critic_comparatives_context, git-ignored); --limit N: a smoke run
  # on the first N rows of each split (tests/test_scripts_audit.py runs it on the tiny Gemma)

Measured numbers and the decision: critics/EXPERIMENTS.md, "NeuroComparatives discriminator".
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from critic_fewshot_context import cached_features, feature_key  # noqa: E402

# the comparatives labelling guide (i2d2/data/comparatives/GUIDE.md) in two sentences, in the form of the generics
# instruction (i2d2/schemas.py ProbeContextConfig.instruction)
INSTRUCTION = ("Each statement compares two things. It is judged true when the comparison is correct in general or a "
               "widely held view, and false when it is wrong, incoherent or cut off, not a comparison between the two, "
               "too vague to judge, or a personal opinion.\n\n")
# the rule, set before measuring: >= ADOPT_FOLDS of the folds above plain in more than half the partitions, mean gain
# over every partition's folds > ADOPT_MEAN, and mean CV AP above the surface-only classifier's
ADOPT_FOLDS, ADOPT_MEAN = 0.8, 0.02


def adoption(diffs: np.ndarray, ap: np.ndarray, surface: np.ndarray) -> dict:
    """The rule on a context's per-partition, per-fold CV AP minus the plain probe's (``diffs``, (partitions, folds)),
    its CV AP (``ap``) and the surface classifier's on the same folds (``surface``)."""
    diffs, ap, surface = (np.atleast_2d(np.asarray(x, dtype=float)) for x in (diffs, ap, surface))
    need = int(np.ceil(ADOPT_FOLDS * diffs.shape[1] - 1e-9))
    wins = (diffs > 0).sum(1)  # a fold where the context could not be drawn (nan) is no win
    partitions_won = int((wins >= need).sum())
    drawn = int(np.isfinite(diffs).sum())
    mean = float(np.nanmean(diffs)) if drawn else float("nan")
    surface_drawn = float(surface[np.isfinite(diffs)].mean()) if drawn else float("nan")
    ap_mean = float(np.nanmean(ap)) if drawn else float("nan")
    # a context the critic's own code cannot draw from every training fold would make the critic refuse to train
    # on such a split, so it is not adoptable as it stands
    ok = (drawn == diffs.size and partitions_won * 2 > len(diffs) and mean > ADOPT_MEAN and ap_mean > surface_drawn)
    return {"wins": wins.tolist(), "partitions_won": partitions_won, "mean_gain": mean, "ap": ap_mean,
            "surface": surface_drawn, "drawn": drawn, "folds": int(diffs.size), "adopt": bool(ok)}


def context_cfg(c: dict, k: int) -> dict:
    """The critic config ``c`` with a comparatives context of ``k`` examples (critic.probe_context keys)."""
    pc = {"examples": int(k), "not_true": [], "seed": 0, "max_words": 14, "instruction": INSTRUCTION}
    return {**c, "probe_context": pc}


def draw(c: dict, k: int, rows, texts, train_idx):
    """(context text, example rows) drawn from ``train_idx`` by the critic's own code; k = 0: the instruction alone."""
    from critics.probe import probe_context

    if k == 0:
        return INSTRUCTION, []
    return probe_context(context_cfg(c, k), rows, texts, train_idx)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0,1,2,3", help="critic.seed of each partition")
    ap.add_argument("--ks", default="8,16", help="context sizes (even, >= 2)")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--limit", type=int, default=0, help="only the first N statements of each split (a smoke run)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cache-dir", default=str(ROOT / "runs" / "critic_comparatives_context"))
    ap.add_argument("--describe-test", action="store_true",
                    help="after the decision, print test AP (description only) of each variant per partition")
    ap.add_argument("--overrides", nargs="*", default=[], help="extra Hydra overrides (e.g. critic.probe_lm=...)")
    args = ap.parse_args(argv)
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        ks = [int(k) for k in args.ks.split(",") if k.strip()]
    except ValueError:
        ap.error("--seeds / --ks: comma-separated integers")
    if not seeds or any(k < 2 or k % 2 for k in ks):
        ap.error("--seeds must name at least one seed; --ks must be even integers >= 2")
    if args.folds < 2:
        ap.error(f"--folds must be >= 2, got {args.folds}")
    torch.set_num_threads(args.threads)

    from hydra import compose, initialize_config_dir
    from sklearn.model_selection import GroupKFold
    from sklearn.preprocessing import StandardScaler
    from threadpoolctl import threadpool_limits

    from critics.data import split_groups
    from critics.metrics import average_precision
    from critics.probe import (check_context_length, context_features, context_ids, lm_features, positive_scores,
                               probe_classifier)
    from critics.surface import SurfaceClassifier
    from critics.train import critic_config, labelled_splits
    from i2d2.lightning_setup import resolve_device
    from i2d2.models import load_causal_lm
    from i2d2.recipes.comparatives import annotation_paths, critic_cfg

    t_start = time.time()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = compose(config_name="train", overrides=["task=comparatives", *args.overrides])
    base = critic_cfg(cfg)
    paths = annotation_paths(cfg)
    model, tok = load_causal_lm(base["probe_lm"])
    model = model.to(resolve_device(None)).eval()
    c0 = critic_config({**base, "seed": seeds[0]})
    layer, grid, L = int(c0["probe_layer"]), [float(x) for x in c0["probe_C"]], int(c0["max_length"])
    make = probe_classifier(c0)
    cache_dir = Path(args.cache_dir)
    names = ["plain", "k0"] + [f"k{k}" for k in ks]
    feat_secs: dict = {}

    def features(kind: str, prefix, texts):
        """Features of ``texts`` (plain, or stmt|judge after ``prefix``), cached by LM, layer, prefix and texts."""
        key = feature_key(kind=kind, lm=base["probe_lm"], layer=layer, max_length=L, prefix=prefix, texts=texts)
        path = cache_dir / f"features_{key[:16]}.npz"
        if prefix is None:
            comp = lambda: {"X": lm_features(model, tok, texts, layer, args.batch_size, L)}  # noqa: E731
        else:
            check_context_length(model, tok, len(prefix), L)  # as the critic refuses a context that does not fit
            comp = lambda: {"X": context_features(model, tok, prefix, texts, layer, args.batch_size, L,  # noqa: E731
                                                  progress=False)}
        X, s, hit = cached_features(path, key, comp)
        feat_secs[kind] = feat_secs.get(kind, 0.0) + (0.0 if hit else s)
        return X["X"]

    res = {}  # seed -> {variant: (len(grid), folds) AP}, base rates, surface per fold
    for seed in seeds:
        c = critic_config({**base, "seed": seed})
        rows, texts, ys, (tr, dv, te), _ = labelled_splits(c, paths)
        if args.limit:
            parts = [np.asarray(x[:args.limit]) for x in (tr, dv, te)]
            keep = np.concatenate(parts)
            rows, texts, ys = [rows[i] for i in keep], [texts[i] for i in keep], ys[keep]
            tr, dv, te = np.split(np.arange(len(keep)), np.cumsum([len(x) for x in parts])[:2])
        pool = np.concatenate([tr, dv])
        groups = np.array(split_groups([r["concept"] for r in rows]))
        folds = list(GroupKFold(n_splits=args.folds).split(pool, ys[pool], groups[pool]))
        P = features("plain", None, [texts[i] for i in pool])
        K0 = features("k0", context_ids(tok, INSTRUCTION), [texts[i] for i in pool])
        a = {v: np.zeros((len(grid), len(folds))) for v in names}
        surf, base_rate, n_ex = np.zeros(len(folds)), np.zeros(len(folds)), {}
        print(f"\n== critic.seed={seed}: {len(pool)} train+dev statements ({int(ys[pool].sum())} true), "
              f"{len(set(groups[pool]))} entity groups, {args.folds} grouped folds of {[len(h) for _, h in folds]} "
              f"({[int(ys[pool][h].sum()) for _, h in folds]} true); test {len(te)} (unused)", flush=True)
        for f, (fit, held) in enumerate(folds):
            fit_rows = pool[fit]
            feats = {"plain": P, "k0": K0}
            shown = set()
            for k in ks:
                try:
                    text, ex = draw(c, k, rows, texts, fit_rows)
                except ValueError as e:  # the critic's own draw refuses: too few short examples of a label
                    print(f"fold {f + 1}: k{k} cannot be drawn from this training fold ({e}); its AP is nan here",
                          flush=True)
                    n_ex[(f, k)] = (0, 0)
                    continue
                shown |= {texts[i] for i in ex}
                prefix = context_ids(tok, text)
                feats[f"k{k}"] = features(f"k{k}", prefix, [texts[i] for i in pool])
                n_ex[(f, k)] = (len(ex), len(prefix))
            # every context's examples leave every variant's fit in this fold: the same rows fitted and scored
            fit_keep = np.array([j for j in fit if texts[pool[j]] not in shown])
            y_fit, y_held = ys[pool[fit_keep]], ys[pool[held]]
            base_rate[f] = y_held.mean()
            with threadpool_limits(limits=args.threads):
                for v in names:
                    if v not in feats:
                        a[v][:, f] = np.nan
                        continue
                    F = feats[v]
                    sc = StandardScaler().fit(F[fit_keep])
                    A, B = sc.transform(F[fit_keep]), sc.transform(F[held])
                    for g, C in enumerate(grid):
                        a[v][g, f] = average_precision(y_held, positive_scores(make(C).fit(A, y_fit), B))
                sc_model = SurfaceClassifier(seed=seed).fit([rows[i] for i in pool[fit_keep]], y_fit)
                surf[f] = average_precision(y_held, sc_model.score([rows[i] for i in pool[held]]))
            print(f"fold {f + 1}: fit {len(fit_keep)} (examples out: "
                  + ", ".join(f"k{k} {n_ex[(f, k)][0]} rows / {n_ex[(f, k)][1]} tokens" for k in ks)
                  + f"), held {len(held)}, base rate {base_rate[f]:.3f}", flush=True)
        res[seed] = {"ap": a, "surface": surf, "base": base_rate, "split": (rows, texts, ys, tr, dv, te, c)}

    # each variant at its CV-best C in each partition
    best = {seed: {v: int(np.nanargmax(np.nanmean(r["ap"][v], 1))) for v in names} for seed, r in res.items()}
    per = {seed: {v: res[seed]["ap"][v][best[seed][v]] for v in names} for seed in seeds}
    bestC = {seed: {v: grid[best[seed][v]] for v in names} for seed in seeds}
    print(f"\nCV AP per fold (each variant at its CV-best C in its partition); AP - base = mean over folds of the "
          f"fold's AP minus its held-out base rate; wins = folds above the plain probe")
    print(f"{'seed':>4s} {'variant':8s} {'C':>6s} {'per fold':36s} {'mean':>6s} {'AP-base':>8s} {'wins':>5s}")
    for seed in seeds:
        r = res[seed]
        for v in names + ["surface"]:
            x = r["surface"] if v == "surface" else per[seed][v]
            wins = "-" if v == "plain" else f"{int((x > per[seed]['plain']).sum())}/{len(x)}"
            C = "" if v == "surface" else f"{bestC[seed][v]:g}"
            print(f"{seed:>4d} {v:8s} {C:>6s} {' '.join(f'{y:.3f}' for y in x):36s} {np.nanmean(x):6.3f} "
                  f"{np.nanmean(x - r['base']):+8.3f} {wins:>5s}")
        print(f"{seed:>4d} {'base':8s} {'':>6s} {' '.join(f'{y:.3f}' for y in r['base']):36s} {r['base'].mean():6.3f}")
    print(f"\nrule (set before measuring): >= {ADOPT_FOLDS:.0%} of folds above plain in more than half the partitions, "
          f"mean gain > {ADOPT_MEAN}, mean CV AP above the surface classifier's on the same folds")
    decision = {}
    for v in names[1:]:
        d = np.array([per[s][v] - per[s]["plain"] for s in seeds])
        out = adoption(d, np.array([per[s][v] for s in seeds]), np.array([res[s]["surface"] for s in seeds]))
        decision[v] = out
        print(f"  {v:6s} minus plain: mean {out['mean_gain']:+.3f}; folds above 0 per partition {out['wins']} "
              f"({out['partitions_won']} of {len(seeds)} partitions at >= "
              f"{int(np.ceil(ADOPT_FOLDS * args.folds - 1e-9))}"
              f"); CV AP {out['ap']:.3f} vs surface {out['surface']:.3f} on the same folds; drawn in {out['drawn']} of "
              f"{out['folds']} folds: rule {'met' if out['adopt'] else 'not met'}")
    plain_ap = float(np.mean([per[s]["plain"] for s in seeds]))
    print(f"  plain CV AP {plain_ap:.3f}, base rate {np.mean([res[s]['base'] for s in seeds]):.3f}")
    met = [f"k{k}" for k in ks if decision[f"k{k}"]["adopt"]]
    chosen = max(met, key=lambda v: decision[v]["ap"]) if met else None
    print("decision: " + (f"{chosen} becomes the comparatives default" if chosen
                          else "no context adopted; the default stays examples: 0"))
    print("feature seconds computed this run: " + ", ".join(f"{k} {s:.0f}" for k, s in feat_secs.items()), flush=True)

    if args.describe_test:  # after the decision; description only
        print("\ntest AP (description only, read after the decision; fitted on train + dev at each variant's "
              "CV-best C; contexts drawn from the critic's train split as the critic draws them)")
        for seed in seeds:
            rows, texts, ys, tr, dv, te, c = res[seed]["split"]
            pool = np.concatenate([tr, dv])
            out = [f"seed {seed}: base rate {ys[te].mean():.3f}"]
            for v in names:
                if v == "plain":
                    X, shown = features("plain", None, texts), set()
                else:
                    try:
                        text, ex = draw(c, int(v[1:]), rows, texts, tr)
                    except ValueError:
                        out.append(f"{v} not drawable from the train split")
                        continue
                    X, shown = features(v, context_ids(tok, text), texts), {texts[i] for i in ex}
                keep = np.array([i for i in pool if texts[i] not in shown])
                sc = StandardScaler().fit(X[keep])
                m = make(bestC[seed][v]).fit(sc.transform(X[keep]), ys[keep])
                out.append(f"{v} {average_precision(ys[te], positive_scores(m, sc.transform(X[te]))):.3f}")
            s_m = SurfaceClassifier(seed=seed).fit([rows[i] for i in pool], ys[pool])
            out.append(f"surface {average_precision(ys[te], s_m.score([rows[i] for i in te])):.3f}")
            print("  " + ", ".join(out), flush=True)
    print(f"\n{time.time() - t_start:.0f}s in all")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
