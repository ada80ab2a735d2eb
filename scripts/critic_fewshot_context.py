"""Experiment: does few-shot in-context conditioning help the probe critic?  (It led to ``critic.probe_context``:
the default critic is this script's k16 stmt|judge, drawn by the same code, critics/probe.py.)

Reads the I2D2 critic's labelled data and splits exactly as ``critics.train.train_critic`` does (default ``critic``
config: ``complete_only``, ``canonicalize``, concepts grouped into train / dev / test). Each variant puts a short
instruction and k labelled examples drawn from the TRAIN split only (true generics and not-true ones of each kind:
vague, episodic, ad_copy, false; written "Statement: ...\\nJudgement: true|false") before every statement, as

  <bos>instruction + examples  Statement: <s>\\nJudgement:

and reads, from one forward pass per statement (the prefix is run once and its KV cache copied over each batch):

  stmt         layer-``probe_layer`` states of the statement's own tokens: mean ‖ last token (the probe's pooling)
  judge        the layer-``probe_layer`` state at the trailing "Judgement:" (its last token, ":")
  stmt|judge   both concatenated
  LM margin    logit(" true") - logit(" false") at that position, the LM's own verdict: a ranker with no training

The first three get the probe's fit (standardised, logistic regression, C chosen on dev; the example statements are
left out of the fit). The plain probe (``critics.probe.lm_features``, no context; ``critic.probe_context.examples=0``)
is reproduced alongside. A
variant is picked by dev AP only; test AP of every row is printed, and test chose nothing. Before the variants, two
statements are checked against a forward of prefix + statement without the cache.

  python scripts/critic_fewshot_context.py [--limit N] [--variants k8a,k8b,k16]
  # ~19 min on 1 CPU thread for the 2,911 statements (plain probe ~7 min, each variant ~3 min); --limit 20 ~1 min

Variants: k8a / k8b = 4 true + one each of vague, episodic, ad_copy, false (two seeded draws); k16 = 8 true + two of
each. Measured (test 608 statements, 26 % true): the plain probe reads dev 0.706 / test 0.622; dev picks k16
stmt|judge, dev 0.712 / test 0.669 (stmt|judge of the other two: dev 0.701 / 0.691, test 0.653 / 0.661). Its dev gain
(+0.006, 90 % concept-bootstrap interval -0.025..+0.043) is within noise, so the choice over the plain probe is a
coin flip on dev; its test gain (+0.039 median, -0.016..+0.078) is not significant either, and 0.85 stays far away.
The LM's own margin logit(" true") - logit(" false") ranks near the base rate (test AP 0.27-0.30).

``--cv`` replaces that dev pick, too small to trust, with grouped K-fold cross-validation on train + dev together
(groups = concepts, 5 folds; the 16 k16 example rows leave every variant's rows; test is never used to choose):

  python scripts/critic_fewshot_context.py --cv [--drop-example-concepts] [--shuffle-seed S] [--cache-dir DIR]
  # first run ~13 min on 1 CPU thread (features: plain 441 s, k16 195 s, k0 150 s), cached in DIR (default:
  # runs/critic_fewshot_features, git-ignored) as features_{plain,k16,k0}.npz, keyed by LM, layer, prefix and
  # texts; a rerun ~20 s (fits only)

Variants: the plain probe, k16 stmt / judge / stmt|judge, and k0 stmt|judge (the instruction line, no examples: a
control for the template). For every C of ``probe_C``: scaler + logistic regression fitted on 4 folds, AP on the
fifth; each variant's C is the best mean CV AP; then test AP of each, fitted on all train + dev rows at that C, is
printed as description only. Measured (2,287 statements, 253 concepts; GroupKFold's fixed partition):

  variant          C      CV AP (± sd over folds)  folds > plain  test AP (descriptive)
  plain            0.003  0.693 ± 0.067            -              0.643
  k16 stmt         0.003  0.711 ± 0.048            4/5            0.648
  k16 judge        0.01   0.683 ± 0.068            1/5            0.676
  k16 stmt|judge   0.003  0.715 ± 0.055            4/5            0.685
  k0 stmt|judge    0.003  0.695 ± 0.059            2/5            0.646

k16 stmt|judge minus plain, per fold: +0.044 +0.047 -0.004 +0.005 +0.020 (mean +0.022); the k0 control is level
with plain (+0.002), so the gain comes from the examples, not the template. ``--layers 8,10,12,14,16`` adds k16
stmt|judge read at those layers (one forward, cached as features_k16_layers.npz): CV AP 0.705 / 0.714 / 0.715 /
0.697 / 0.690, so probe_layer 12 stays. ``--second-draw`` adds k16s2 (another seed's 16 examples) alone and side by
side with k16; both draws' examples leave the pool, so the folds differ: plain 0.717, k16 stmt|judge 0.750, k16s2
0.746 (5 of 5 folds above plain each), both side by side 0.748: the gain does not hinge on one draw, and a second
context adds nothing. ``--concept-mean`` tries concept-aware features (every labelled statement of a concept stands
for the generations the loop scores together): k16 stmt|judge beside its concept's mean vector reads CV AP 0.695
(1/5 folds above k16), beside itself centred on that mean 0.687 (1/5), centred alone 0.560: knowing what the
concept's other statements look like does not help. Five shuffled partitions (seeds 0-4) give
mean gains +0.025 / +0.032 / +0.019 / +0.010 / +0.023 with 3, 5, 4, 5, 4 of 5 folds above 0; CV picks k16
stmt|judge on every partition. With the examples' whole concepts also left out (--drop-example-concepts, 2,082
statements) the gain is +0.030, 5 of 5 folds: no leak through the examples' concepts. A small gain, in the same
direction on 25 of 30 folds; the folds share their training rows, so they are not independent draws.

``--contexts k20,k32,k64`` adds larger contexts (stmt|judge), drawn as ``critic.probe_context.examples=20 / 32 / 64``
would draw them (seed 0, as k16), each compared fold by fold with k16 stmt|judge under a rule set before they were
measured: one replaces k16 only if it beats k16 on at least 4 of 5 folds and by more than 0.01 mean CV AP. Their
examples leave every variant's rows too, so k16's figures move a little. A context after which a ``max_length``
statement would not fit the LM is refused before any features (exit 2), as the critic refuses it: on the packaged
Gemma 3 270M (a 512-token sliding window) k16 takes 352 + 7 + 64 = 423 tokens, k20 434 + 71 = 505, and k32 (677) and
k64 (1,307) do not fit. Measured (2,274 statements once k20's 20 example rows are out; 2026-11-29): k16 stmt|judge
CV AP 0.717, k20 0.718; k20 minus k16 per fold +0.014 +0.022 -0.001 -0.016 -0.016 (mean +0.000, 2 of 5 above 0), so
the rule is not met and k16 stays (critics/EXPERIMENTS.md, "Few-shot context"). k20's features took 194 s.
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

from critics.probe import (lm_body, check_context_length, context_examples, context_features, context_ids,  # noqa: E402
                           context_text, item_ids)

# name: (examples, seed of the draw), drawn as critic.probe_context draws them (critics.probe.context_examples: half
# true, the rest in turn from probe_context.not_true); k0: the instruction alone, a control for the template.
# k20 / k32 / k64: larger contexts, the draw of critic.probe_context.examples=20 / 32 / 64 (seed 0, as k16); on the
# packaged Gemma 3 270M only k20 fits (its 512-token sliding window), and the others are refused before any features
VARIANTS = {"k8a": (8, 0), "k8b": (8, 1), "k16": (16, 0), "k16s2": (16, 2), "k0": (0, 0),
            "k20": (20, 0), "k32": (32, 0), "k64": (64, 0)}
DEFAULT_VARIANTS = "k8a,k8b,k16"
# --contexts: a larger context replaces k16 only if its CV AP beats k16's on at least this share of the folds (4 of
# 5) and by more than ADOPT_MEAN on average (the rule was set before k20 / k32 / k64 were measured)
ADOPT_FOLDS, ADOPT_MEAN = 0.8, 0.01


def build_prefix(tok, c: dict, name: str, rows, texts, train_idx):
    """(prefix token ids, example row indices, prefix text) of variant ``name`` under the critic config ``c``
    (its probe_context's instruction, not_true labels and max_words; the variant's count and seed)."""
    k, seed = VARIANTS[name]
    pc = c["probe_context"]
    ex = context_examples(rows, texts, train_idx, k, list(pc["not_true"]), seed, int(pc["max_words"]),
                          c["label_map"]) if k else []
    text = context_text(pc["instruction"], [texts[i] for i in ex], [rows[i]["y"] == 1 for i in ex])
    return context_ids(tok, text), ex, text


def contexts_too_long(model, tok, c: dict, names, rows, texts, train_idx) -> list[str]:
    """One message per variant of ``names`` whose context and a statement of ``max_length`` tokens would not fit the
    LM (``critics.probe.check_context_length``, which the critic itself raises): checked before any features."""
    out = []
    for name in names:
        prefix, _, _ = build_prefix(tok, c, name, rows, texts, train_idx)
        try:
            check_context_length(model, tok, len(prefix), int(c["max_length"]))
        except ValueError as e:
            out.append(f"{name}: {e}")
    return out


def adoption(diff: np.ndarray) -> tuple[int, float, bool]:
    """(folds above 0, mean, whether the rule is met) of a larger context's per-fold CV AP minus k16's."""
    wins = int((diff > 0).sum())
    return wins, float(diff.mean()), wins >= int(np.ceil(ADOPT_FOLDS * len(diff) - 1e-9)) and diff.mean() > ADOPT_MEAN


def margin_direction(model, tok):
    """logit(" true") - logit(" false") as a direction in the top layer's (normed) state."""
    emb = model.get_output_embeddings().weight
    true, false = (tok(w, add_special_tokens=False)["input_ids"][0] for w in (" true", " false"))
    return (emb[true] - emb[false]).float().detach().cpu().numpy()


def fewshot_features(model, tok, prefix: list[int], texts, layer: int, batch_size: int, max_length: int):
    """(stmt features (n, 2h), judge features (n, h), LM margin (n,)) of each text after the cached ``prefix``
    (critics.probe.context_features, as the critic reads them)."""
    F, top = context_features(model, tok, prefix, texts, layer, batch_size, max_length, final_state=True)
    h = F.shape[1] // 3
    return F[:, :2 * h], F[:, 2 * h:], top @ margin_direction(model, tok)


@torch.no_grad()
def check_cache(model, tok, prefix, texts, layer: int, max_length: int, got) -> float:
    """Largest relative |difference| between the cached batched features of ``texts`` and a plain forward of prefix
    + item, one at a time."""
    base, _ = lm_body(model)
    w = margin_direction(model, tok)
    n_head = len(tok("Statement:", add_special_tokens=False)["input_ids"])
    worst = 0.0
    for k, t in enumerate(texts):
        ids, n = item_ids(tok, t, max_length)
        o = base(input_ids=torch.tensor([list(prefix) + ids]), output_hidden_states=True)
        h, P = o.hidden_states[layer][0].float(), len(prefix)
        a, b = P + n_head, P + n_head + n
        ref = [torch.cat([h[a:b].mean(0), h[b - 1]]).numpy(), h[-1].numpy(),
               np.array([float(o.last_hidden_state[0, -1].float().numpy() @ w)])]
        for x, y in zip(ref, (got[0][k], got[1][k], np.array([got[2][k]]))):
            worst = max(worst, float(np.abs(x - y).max() / (np.abs(x).max() + 1e-6)))
    return worst


def paired_bootstrap(y, a, b, groups, n: int = 1000, seed: int = 0):
    """5th, 50th, 95th percentiles of AP(a) - AP(b) over resamples of whole concepts (the split's unit)."""
    from critics.metrics import average_precision

    rng = np.random.default_rng(seed)
    names = np.unique(groups)
    rows = {g: np.flatnonzero(groups == g) for g in names}
    d = []
    for _ in range(n):
        idx = np.concatenate([rows[g] for g in rng.choice(names, len(names))])
        d.append(average_precision(y[idx], a[idx]) - average_precision(y[idx], b[idx]))
    return tuple(np.nanpercentile(d, [5, 50, 95]))


def cached_features(path: Path, key: str, compute):
    """Arrays of ``compute()`` (a dict of arrays), kept in ``path`` (npz) with their ``key`` and the seconds they
    took; a file whose key differs (other texts, prefix, layer or LM) is recomputed. Returns (arrays, seconds,
    whether read from the file)."""
    if path.exists():
        with np.load(path) as z:
            if str(z["key"]) == key:
                return {k: z[k] for k in z.files if k not in ("key", "seconds")}, float(z["seconds"]), True
    t0 = time.time()
    arrays = compute()
    secs = time.time() - t0
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.stem + ".tmp.npz")
    np.savez(tmp, key=np.array(key), seconds=np.array(secs), **arrays)
    tmp.replace(path)
    return arrays, secs, False


def feature_key(**parts) -> str:
    import hashlib
    import json

    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def run_cv(args, c, rows, texts, ys, tr, dv, te, full_rows, full_texts, full_tr) -> int:
    """``--cv``: grouped 5-fold cross-validation on train + dev (concepts as groups) of the plain probe, k16 (stmt,
    judge, stmt|judge) and k0 (stmt|judge); test only described, at each variant's CV-chosen C."""
    from sklearn.model_selection import GroupKFold
    from sklearn.preprocessing import StandardScaler
    from threadpoolctl import threadpool_limits

    from critics.metrics import average_precision
    from critics.probe import lm_features, positive_scores, probe_classifier
    from i2d2.lightning_setup import resolve_device
    from i2d2.models import load_causal_lm

    layer, grid = int(c["probe_layer"]), [float(x) for x in c["probe_C"]]
    cache_dir = Path(args.cache_dir)
    suffix = f"_limit{args.limit}" if args.limit else ""
    t_start = time.time()
    model, tok = load_causal_lm(c["probe_lm"])  # a few seconds; the prefixes need its tokenizer
    model = model.to(resolve_device(None)).eval()
    contexts = [v for v in dict.fromkeys(args.contexts.split(",")) if v and v not in ("k16", "k0")]
    refused = contexts_too_long(model, tok, c, contexts, full_rows, full_texts, full_tr)
    if refused:  # the critic would refuse critic.probe_context.examples=k: say so before minutes of features
        for msg in refused:
            print(f"error: --contexts: {msg}", file=sys.stderr)
        return 2

    feats, secs, note = {}, {}, {}
    X, s, hit = cached_features(
        cache_dir / f"features_plain{suffix}.npz",
        feature_key(kind="plain", lm=c["probe_lm"], layer=layer, max_length=int(c["max_length"]), texts=texts),
        lambda: {"X": lm_features(model, tok, texts, layer, int(c["eval_batch_size"]),
                                  int(c["max_length"]))})
    feats["plain (mean|last)"], secs["plain (mean|last)"] = X["X"], s
    note["plain (mean|last)"] = "cached" if hit else "computed"
    print(f"plain features: {'read from cache, ' if hit else ''}{s:.0f}s when computed", flush=True)
    example_stmts = set()
    second_draw = (("k16s2", ("stmt|judge",)),) if args.second_draw else ()
    larger = tuple((name, ("stmt|judge",)) for name in contexts)
    for name, readouts in (("k16", ("stmt", "judge", "stmt|judge")), ("k0", ("stmt|judge",))) + second_draw + larger:
        prefix, ex, text = build_prefix(tok, c, name, full_rows, full_texts, full_tr)
        example_stmts |= {full_rows[i]["statement"] for i in ex}
        print(f"\n== {name}: {len(ex)} examples, prefix {len(prefix)} tokens ==\n{text}", flush=True)
        key = feature_key(kind="fewshot", lm=c["probe_lm"], layer=layer, max_length=int(c["max_length"]),
                          prefix=prefix, texts=texts)
        F, s, hit = cached_features(
            cache_dir / f"features_{name}{suffix}.npz", key,
            lambda p=prefix: dict(zip(("S", "J", "M"), fewshot_features(model, tok, p, texts, layer, args.batch_size, int(c["max_length"])))))
        print(f"{name} features: {'read from cache, ' if hit else ''}{s:.0f}s when computed", flush=True)
        if not hit:  # the cached batched forward against a plain one, as in the dev run
            probe_idx = [int(dv[0]), int(te[-1])]
            err = check_cache(model, tok, prefix, [texts[i] for i in probe_idx], layer, int(c["max_length"]),
                              (F["S"][probe_idx], F["J"][probe_idx], F["M"][probe_idx]))
            print(f"cache check on 2 statements: largest relative difference {err:.1e}", flush=True)
            if err > 1e-3:
                raise RuntimeError(f"cached features differ from a plain forward ({err:.1e})")
        parts = {"stmt": F["S"], "judge": F["J"], "stmt|judge": np.concatenate([F["S"], F["J"]], 1)}
        for r in readouts:
            feats[f"{name} {r}"], secs[f"{name} {r}"], note[f"{name} {r}"] = parts[r], s, "cached" if hit else "computed"
    if args.second_draw:  # two contexts side by side: does a second draw of examples add what the first lacks?
        v = "k16 + k16s2 stmt|judge"
        feats[v] = np.concatenate([feats["k16 stmt|judge"], feats["k16s2 stmt|judge"]], 1)
        secs[v], note[v] = secs["k16 stmt|judge"] + secs["k16s2 stmt|judge"], note["k16s2 stmt|judge"]

    if args.concept_mean:  # concept-aware features: a statement beside the mean of its concept's statements
        F = feats["k16 stmt|judge"]
        concepts_all = np.array([r["concept"] for r in rows])
        cm = np.zeros_like(F)
        for g in np.unique(concepts_all):  # the loop scores every generation of a concept at once, so has them all
            cm[concepts_all == g] = F[concepts_all == g].mean(0)
        for v, X in (("k16 | concept mean", np.concatenate([F, cm], 1)),
                     ("k16 | centred", np.concatenate([F, F - cm], 1)), ("k16 centred only", F - cm)):
            feats[v], secs[v], note[v] = X, secs["k16 stmt|judge"], note["k16 stmt|judge"]

    if args.layers:  # k16 stmt|judge read at other layers, from one forward (the default reads probe_layer)
        layers = [int(x) for x in args.layers.split(",")]
        prefix, _, _ = build_prefix(tok, c, "k16", full_rows, full_texts, full_tr)
        key = feature_key(kind="fewshot-layers", lm=c["probe_lm"], layers=layers, max_length=int(c["max_length"]),
                          prefix=prefix, texts=texts)
        F, s, hit = cached_features(
            cache_dir / f"features_k16_layers{suffix}.npz", key,
            lambda: {"X": context_features(model, tok, prefix, texts, layers, args.batch_size, int(c["max_length"]))})
        print(f"k16 features at layers {layers}: {'read from cache, ' if hit else ''}{s:.0f}s when computed", flush=True)
        width = F["X"].shape[1] // len(layers)
        for j, layer_j in enumerate(layers):
            v = f"k16 stmt|judge L{layer_j}"
            feats[v], secs[v], note[v] = F["X"][:, j * width:(j + 1) * width], s, "cached" if hit else "computed"

    # the k16 examples leave every variant's rows (CV folds and test alike), so all are scored on the same rows;
    # --drop-example-concepts also drops the other statements of their concepts (the prompt shows one of each)
    concepts = np.array([r["concept"] for r in rows])
    example_concepts = {r["concept"] for r in full_rows if r["statement"] in example_stmts}
    out = ((lambda i: rows[i]["statement"] in example_stmts or concepts[i] in example_concepts)
           if args.drop_example_concepts else (lambda i: rows[i]["statement"] in example_stmts))
    pool = np.array([i for i in np.concatenate([tr, dv]) if not out(i)])
    test = np.array([i for i in te if not out(i)])
    kfold = (GroupKFold(n_splits=args.folds) if args.shuffle_seed is None  # sklearn's size-balanced partition
             else GroupKFold(n_splits=args.folds, shuffle=True, random_state=args.shuffle_seed))
    folds = list(kfold.split(pool, ys[pool], concepts[pool]))
    print(f"\nCV on train+dev: {len(pool)} statements ({len(tr) + len(dv) - len(pool)} example rows"
          f"{' and their concepts' if args.drop_example_concepts else ''} left out), "
          f"{len(np.unique(concepts[pool]))} concepts, {args.folds} grouped folds of "
          f"{[len(h) for _, h in folds]} statements ({[int(ys[pool][h].sum()) for _, h in folds]} true); "
          f"C grid {grid}; test {len(test)} statements", flush=True)

    make = probe_classifier(c)
    cv_ap, fit_s = {}, {}  # variant -> (len(grid), folds) APs; seconds of its fits
    with threadpool_limits(limits=args.threads):
        for v, F in feats.items():
            t0 = time.time()
            a = np.zeros((len(grid), len(folds)))
            for f, (fit_rows, held) in enumerate(folds):
                sc = StandardScaler().fit(F[pool[fit_rows]])
                A, B = sc.transform(F[pool[fit_rows]]), sc.transform(F[pool[held]])
                for g, C in enumerate(grid):
                    m = make(C).fit(A, ys[pool[fit_rows]])
                    a[g, f] = average_precision(ys[pool[held]], positive_scores(m, B))
            cv_ap[v], fit_s[v] = a, time.time() - t0
            print(f"{v}: CV AP by C " + " ".join(f"{C:g}:{a[g].mean():.3f}" for g, C in enumerate(grid))
                  + f" ({fit_s[v]:.0f}s of fits)", flush=True)

        best = {v: int(np.argmax(a.mean(1))) for v, a in cv_ap.items()}  # the first best mean CV AP
        test_ap = {}
        for v, F in feats.items():  # descriptive only: fitted on all train+dev rows at the CV-chosen C
            sc = StandardScaler().fit(F[pool])
            m = make(grid[best[v]]).fit(sc.transform(F[pool]), ys[pool])
            test_ap[v] = average_precision(ys[test], positive_scores(m, sc.transform(F[test])))

    ref = "plain (mean|last)"
    per_fold = {v: cv_ap[v][best[v]] for v in feats}
    print(f"\n{'variant':20s} {'C':>6s} {'CV AP mean ± sd':>17s} {'folds > plain':>13s} {'test AP':>8s} "
          f"{'features s':>11s}")
    for v in feats:
        a = per_fold[v]
        wins = "-" if v == ref else f"{int((a > per_fold[ref]).sum())}/{len(a)}"
        print(f"{v:20s} {grid[best[v]]:6g} {a.mean():9.3f} ± {a.std(ddof=1):.3f} {wins:>13s} {test_ap[v]:8.3f} "
              f"{secs[v]:7.0f} ({note[v]})")
    print("(sd over folds, ddof 1; each variant at its own CV-best C; test AP is description only, chose nothing)")
    print(f"\nper-fold CV AP (each at its CV-best C), folds 1..{len(folds)}:")
    for v in feats:
        print(f"  {v:20s} " + " ".join(f"{x:.3f}" for x in per_fold[v]))
    print(f"\nper-fold AP minus the plain probe's (each at its CV-best C), folds 1..{len(folds)}:")
    for v in feats:
        if v != ref:
            d = per_fold[v] - per_fold[ref]
            print(f"  {v:20s} " + " ".join(f"{x:+.3f}" for x in d)
                  + f"   mean {d.mean():+.3f} (sd {d.std(ddof=1):.3f}), {int((d > 0).sum())} of {len(d)} above 0")
    d = per_fold["k16 stmt|judge"] - per_fold["k0 stmt|judge"]
    print(f"  {'k16 - k0 stmt|judge':20s} " + " ".join(f"{x:+.3f}" for x in d)
          + f"   mean {d.mean():+.3f} (sd {d.std(ddof=1):.3f}), {int((d > 0).sum())} of {len(d)} above 0")
    chosen = max(feats, key=lambda v: per_fold[v].mean())
    print(f"\nchosen by CV: {chosen} (CV AP {per_fold[chosen].mean():.3f}); plain probe {per_fold[ref].mean():.3f}")
    if contexts:
        print(f"\nlarger contexts against k16 stmt|judge (CV AP {per_fold['k16 stmt|judge'].mean():.3f}); rule: "
              f"beats it on >= {ADOPT_FOLDS:.0%} of the folds and by > {ADOPT_MEAN} mean")
        met = []
        for name in contexts:
            v = f"{name} stmt|judge"
            d = per_fold[v] - per_fold["k16 stmt|judge"]
            wins, mean, ok = adoption(d)
            met += [v] if ok else []
            print(f"  {v:20s} CV AP {per_fold[v].mean():.3f}; minus k16 per fold " + " ".join(f"{x:+.3f}" for x in d)
                  + f"   mean {mean:+.3f}, {wins} of {len(d)} above 0: rule {'met' if ok else 'not met'}"
                  + f" (features {secs[v]:.0f}s, fits {fit_s[v]:.0f}s)")
        best_met = max(met, key=lambda v: per_fold[v].mean()) if met else None
        print(f"decision: {best_met + ' replaces k16' if best_met else 'k16 stays the default'}")
    print(f"\n{time.time() - t_start:.0f}s in all (features computed or read, fits, test description)")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=0, help="only the first N statements of each split (a smoke run)")
    ap.add_argument("--variants", default=DEFAULT_VARIANTS, help=f"comma-separated, of {list(VARIANTS)}")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cv", action="store_true",
                    help="grouped K-fold CV on train+dev instead of the dev pick (plain, k16, k0; --variants unused)")
    ap.add_argument("--folds", type=int, default=5, help="--cv: number of concept-grouped folds")
    ap.add_argument("--second-draw", action="store_true",
                    help="--cv: also k16s2 (another seed's 16 examples) alone and side by side with k16")
    ap.add_argument("--concept-mean", action="store_true",
                    help="--cv: also k16 stmt|judge beside its concept's mean feature, centred on it, and centred only")
    ap.add_argument("--contexts", default="",
                    help="--cv: also these larger contexts' stmt|judge (of k20,k32,k64), each compared fold by fold "
                         "with k16 stmt|judge; one that would not fit the LM is refused before any features")
    ap.add_argument("--layers", default="", help="--cv: also k16 stmt|judge read at these layers, e.g. 8,10,12,14,16")
    ap.add_argument("--cache-dir", default=str(ROOT / "runs" / "critic_fewshot_features"), help="--cv: where features_*.npz are kept (reruns only fit)")
    ap.add_argument("--drop-example-concepts", action="store_true",
                    help="--cv: also leave out every statement of the k16 examples' concepts (a leak check)")
    ap.add_argument("--shuffle-seed", type=int, default=None,
                    help="--cv: a shuffled grouped partition with this seed (default: GroupKFold's fixed one)")
    args = ap.parse_args(argv)
    # checked before the features (minutes): an unknown variant used to end in KeyError after the plain probe's
    unknown = [v for v in args.variants.split(",") if v and v not in VARIANTS]
    if unknown:
        ap.error(f"--variants: unknown {unknown}; choose from {list(VARIANTS)}")
    unknown = [v for v in args.contexts.split(",") if v and v not in VARIANTS]
    if unknown:
        ap.error(f"--contexts: unknown {unknown}; choose from {list(VARIANTS)}")
    if args.folds < 2:
        ap.error(f"--folds must be >= 2, got {args.folds}")
    if args.layers and not all(x.strip().isdigit() for x in args.layers.split(",")):
        ap.error(f"--layers: expected comma-separated layer numbers (e.g. 8,10,12), got {args.layers!r}")
    torch.set_num_threads(args.threads)

    from hydra import compose, initialize_config_dir
    from sklearn.preprocessing import StandardScaler

    from critics.metrics import average_precision
    from critics.probe import best_on_dev, lm_features, positive_scores, probe_classifier
    from i2d2.lightning_setup import resolve_device
    from i2d2.models import load_causal_lm
    from critics.train import critic_config, labelled_splits

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = compose(config_name="train")
    c = critic_config(cfg.critic)
    rows, texts, ys, (tr, dv, te), _ = labelled_splits(c, list(c["seed_annotations"]))
    full_rows, full_texts, full_tr = rows, texts, np.asarray(tr)  # examples come from the whole train split
    if args.limit:  # a smoke run: the first N statements of each split
        parts = [np.asarray(x[:args.limit]) for x in (tr, dv, te)]
        keep = np.concatenate(parts)
        rows, texts, ys = [rows[i] for i in keep], [texts[i] for i in keep], ys[keep]
        tr, dv, te = np.split(np.arange(len(keep)), np.cumsum([len(x) for x in parts])[:2])
    layer = int(c["probe_layer"])
    print(f"{len(texts)} statements ({len(tr)} train / {len(dv)} dev / {len(te)} test), layer {layer}, "
          f"test base rate {ys[te].mean():.2f}", flush=True)
    if args.cv:
        return run_cv(args, c, rows, texts, ys, tr, dv, te, full_rows, full_texts, full_tr)

    scores = {}  # (variant, readout) -> scores of every statement (dev and test rows filled)

    def fit(F, train, key):  # the default critic's fit (critics.probe.fit_probe) on other features
        Fs = StandardScaler().fit(F[train]).transform(F)
        (ap_dev, C, clf), _ = best_on_dev(probe_classifier(c), c["probe_C"], Fs, ys, train, dv)
        scores[key] = positive_scores(clf, Fs)
        return ap_dev, average_precision(ys[te], scores[key][te]), float(C)

    results = []  # (variant, readout, dev AP, test AP, C, seconds of features)
    # the LM first (a few seconds), so that a context too long for it is refused before the plain probe's features
    model, tok = load_causal_lm(c["probe_lm"])
    model = model.to(resolve_device(None)).eval()
    refused = contexts_too_long(model, tok, c, [v for v in args.variants.split(",") if v], full_rows, full_texts,
                                full_tr)
    if refused:
        for msg in refused:
            print(f"error: --variants: {msg}", file=sys.stderr)
        return 2
    t0 = time.time()  # the plain probe's features, as critics.probe.probe_lm_features reads them
    X = lm_features(model, tok, texts, layer, int(c["eval_batch_size"]), int(c["max_length"]))
    secs = time.time() - t0
    results.append(("none (plain probe)", "mean|last", *fit(X, tr, ("none (plain probe)", "mean|last")), secs))
    print(f"plain probe: dev {results[-1][2]:.3f} test {results[-1][3]:.3f} ({secs:.0f}s)", flush=True)

    for name in [v for v in args.variants.split(",") if v]:
        prefix, ex, text = build_prefix(tok, c, name, full_rows, full_texts, full_tr)
        print(f"\n== {name}: {len(ex)} examples, prefix {len(prefix)} tokens ==\n{text}", flush=True)
        ex_stmts = {full_rows[i]["statement"] for i in ex}
        train = np.array([i for i in tr if rows[i]["statement"] not in ex_stmts])  # the examples leave the fit
        t0 = time.time()
        S, J, M = fewshot_features(model, tok, prefix, texts, layer, args.batch_size, int(c["max_length"]))
        secs = time.time() - t0
        probe_idx = [int(dv[0]), int(te[-1])]
        err = check_cache(model, tok, prefix, [texts[i] for i in probe_idx], layer, int(c["max_length"]),
                          (S[probe_idx], J[probe_idx], M[probe_idx]))
        print(f"cache check on 2 statements: largest relative difference {err:.1e}", flush=True)
        if err > 1e-3:
            raise RuntimeError(f"cached features differ from a plain forward ({err:.1e})")
        for readout, F in (("stmt", S), ("judge", J), ("stmt|judge", np.concatenate([S, J], 1))):
            results.append((name, readout, *fit(F, train, (name, readout)), secs))
            print(f"{name} {readout}: dev {results[-1][2]:.3f} test {results[-1][3]:.3f}", flush=True)
        scores[(name, "LM margin (no fit)")] = M
        results.append((name, "LM margin (no fit)", average_precision(ys[dv], M[dv]),
                        average_precision(ys[te], M[te]), float("nan"), secs))
        print(f"{name} LM margin: dev {results[-1][2]:.3f} test {results[-1][3]:.3f}", flush=True)

    print(f"\n{'context':20s} {'readout':20s} {'dev AP':>7s} {'test AP':>8s} {'C':>6s} {'features s':>10s}")
    for v, r, d, t, C, s in results:
        print(f"{v:20s} {r:20s} {d:7.3f} {t:8.3f} {C:6g} {s:10.0f}")
    best = max(results, key=lambda x: x[2])
    print(f"\nchosen on dev: {best[0]} / {best[1]} (dev {best[2]:.3f}, test {best[3]:.3f}); plain probe test "
          f"{results[0][3]:.3f}; test base rate {ys[te].mean():.2f}")
    concepts = np.array([r["concept"] for r in rows])
    for split, idx in (("dev", dv), ("test", te)):
        lo, mid, hi = paired_bootstrap(ys[idx], scores[best[:2]][idx], scores[results[0][:2]][idx], concepts[idx])
        print(f"{split} AP gain of the chosen over the plain probe, concepts resampled (1,000 draws): median "
              f"{mid:+.3f}, 90% interval [{lo:+.3f}, {hi:+.3f}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
