#!/usr/bin/env python
"""Experiment: does another classifier on the default critic's features beat its logistic regression?

Same labelled data, splits and layer-``probe_layer`` features as the default critic (``critics.train.train_critic``
with the default ``critic`` config); each classifier's settings are chosen on dev, test chose nothing. Prints dev and
test AP of the logistic regression (the default), other linear estimators (LDA with shrinkage, a logistic regression
on the top principal components), an RBF SVM and a one-hidden-layer MLP, then the MLP's spread over seeds at its
chosen settings.

Run before few-shot context became the default (``critic.probe_context``): it reads the plain probe's features
(no context), as its numbers in critics/EXPERIMENTS.md were measured.

  python scripts/critic_nonlinear_probes.py [--seeds 4]     # ~10 min on 2 CPU cores (the features take most)

critics/EXPERIMENTS.md has the numbers: neither beats the linear probe, and the MLP varies with its seed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=4, help="MLP seeds for the spread")
    args = ap.parse_args(argv)

    from sklearn.decomposition import PCA
    from sklearn.discriminant_analysis import LinearDiscriminantAnalysis
    from sklearn.linear_model import LogisticRegression
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from sklearn.svm import SVC

    from critics.metrics import average_precision
    from critics.probe import best_on_dev, positive_scores, probe_lm_features
    from critics.train import default_critic_data

    c, _, texts, ys, (tr, dv, te) = default_critic_data()
    X, _, _ = probe_lm_features(c, texts)
    X = StandardScaler().fit(X[tr]).transform(X)

    def score(m, idx):
        return positive_scores(m, X[idx])

    print(f"{len(texts)} statements ({len(tr)} train / {len(dv)} dev / {len(te)} test)")
    print(f"{'classifier':30s} {'chosen on dev':24s} {'dev AP':>7s} {'test AP':>8s}")
    mlp_grid = [(h, a) for h in (64, 256) for a in (1e-3, 1e-1, 1.0, 10.0)]
    chosen = {}
    for name, make, grid in [
        ("logistic regression (default)", lambda C: LogisticRegression(C=C, max_iter=5000, random_state=0), c["probe_C"]),
        ("LDA, shrinkage", lambda sh: LinearDiscriminantAnalysis(solver="lsqr", shrinkage=sh),
         ["auto", 0.1, 0.3, 0.5, 0.7, 0.9]),
        ("PCA + logistic regression", lambda g: make_pipeline(PCA(g[0], random_state=0),
                                                              LogisticRegression(C=g[1], max_iter=5000, random_state=0)),
         [(k, C) for k in (16, 64, 256) for C in (0.01, 0.1, 1.0, 10.0)]),
        ("RBF SVM", lambda g: SVC(C=g[0], gamma=g[1], random_state=0),
         [(C, gm) for C in (0.3, 1, 3, 10) for gm in ("scale", 1e-4, 3e-4)]),
        ("MLP, one hidden layer", lambda g: MLPClassifier(hidden_layer_sizes=(g[0],), alpha=g[1], early_stopping=True,
                                                           max_iter=500, random_state=0), mlp_grid)]:
        (ap_dev, g, m), _ = best_on_dev(make, grid, X, ys, tr, dv)
        chosen[name] = g
        print(f"{name:30s} {g!s:24s} {ap_dev:7.3f} {average_precision(ys[te], score(m, te)):8.3f}", flush=True)
    h, a = chosen["MLP, one hidden layer"]
    for seed in range(args.seeds):
        m = MLPClassifier(hidden_layer_sizes=(h,), alpha=a, early_stopping=True, max_iter=500, random_state=seed)
        m.fit(X[tr], ys[tr])
        print(f"{f'MLP seed {seed}':30s} {'':24s} {average_precision(ys[dv], score(m, dv)):7.3f} "
              f"{average_precision(ys[te], score(m, te)):8.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
