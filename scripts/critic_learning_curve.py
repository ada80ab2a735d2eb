#!/usr/bin/env python
"""Experiment: would more labels lift the default critic?  Its learning curve on the labelled generations.

The default critic (``critics.train.train_critic`` with the default ``critic`` config: logistic regression on
Gemma's layer-``probe_layer`` features) is fit on a random share of the training *concepts* (25 / 50 / 75 / 100 %,
several draws each, every statement of a drawn concept kept), C chosen on dev each time; dev and test are the
default splits and test chose nothing.  Prints test AP (mean and range over draws) per share and the slope over the
last doubling of the training data.

Run before few-shot context became the default (``critic.probe_context``): it reads the plain probe's features
(no context), as its numbers in critics/EXPERIMENTS.md were measured.

  python scripts/critic_learning_curve.py [--draws 5]     # ~10 min on 2 CPU cores (the features take most)

critics/EXPERIMENTS.md has the numbers.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--draws", type=int, default=5, help="random concept subsets per share (the full set: one)")
    args = ap.parse_args(argv)

    import numpy as np
    from sklearn.preprocessing import StandardScaler

    from critics.metrics import average_precision
    from critics.probe import best_on_dev, positive_scores, probe_classifier, probe_lm_features
    from critics.train import default_critic_data

    c, rows, texts, ys, (tr, dv, te) = default_critic_data()
    X, _, _ = probe_lm_features(c, texts)
    concepts = np.array([r["concept"] for r in rows])
    train_concepts = np.array(sorted(set(concepts[tr])))
    tr = np.asarray(tr)
    print(f"{len(texts)} statements ({len(tr)} train over {len(train_concepts)} concepts / {len(dv)} dev / "
          f"{len(te)} test, {ys[te].mean():.0%} of test true)")
    print(f"{'train share':>11s} {'concepts':>8s} {'statements':>10s} {'test AP mean':>12s} {'range':>13s}")
    rng = np.random.default_rng(0)
    means = {}
    for share in (0.25, 0.5, 0.75, 1.0):
        aps, sizes = [], []
        for _ in range(1 if share == 1.0 else args.draws):
            keep = rng.choice(train_concepts, size=max(2, round(share * len(train_concepts))), replace=False)
            sub = tr[np.isin(concepts[tr], keep)]
            if len(set(ys[sub])) < 2:
                continue
            # the default critic's scaler and C grid (critics.probe.fit_probe), fit on this subset alone
            Xs = StandardScaler().fit(X[sub]).transform(X)
            (_, _, m), _ = best_on_dev(probe_classifier(c), c["probe_C"], Xs, ys, sub, dv)
            aps.append(average_precision(ys[te], positive_scores(m, Xs[te])))
            sizes.append(len(sub))
        means[share] = float(np.mean(aps))
        print(f"{share:>11.0%} {len(keep):>8d} {np.mean(sizes):>10.0f} {means[share]:>12.3f} "
              f"{min(aps):>6.3f}-{max(aps):.3f}")
    print(f"test AP gain from 50 % to 100 % of the training concepts: {means[1.0] - means[0.5]:+.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
