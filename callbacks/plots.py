"""Reusable plots for rankers/classifiers: PR curves (several systems on one axis, as in I2D2 Fig. 6/7)
and score histograms split by gold label. Files are written atomically; ``log_png`` sends them to W&B.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from i2d2.io import atomic_path


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def plot_pr_curves(curves: Mapping[str, tuple[Sequence[int], Sequence[float]]], path: str | Path,
                   title: str = "Precision-recall", marks: Mapping[str, tuple[float, float]] | None = None) -> dict:
    """Draw one PR curve per system: ``curves[name] = (y_true, scores)`` (higher score = more likely valid).

    ``marks[label] = (recall, precision)`` adds labelled points (e.g. the chosen threshold δ).
    Returns ``{name: average precision}``; the legend shows the same numbers.
    """
    from sklearn.metrics import average_precision_score, precision_recall_curve

    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 4.5))
    aps, colors = {}, {}
    for name, (y, s) in curves.items():
        y, s = np.asarray(y), np.asarray(s, dtype=float)
        if len(set(y.tolist())) < 2:
            continue
        p, r, _ = precision_recall_curve(y, s)
        aps[name] = float(average_precision_score(y, s))
        colors[name] = ax.step(r, p, where="post", label=f"{name} (AP={aps[name]:.3f})")[0].get_color()
    # the base rate is each curve's own (the iterations of a run are measured on different statements): one grey
    # line when they agree, else one line per curve in its colour
    rates = {name: float(np.mean(y)) for name, (y, _) in curves.items() if len(y)}
    if len(set(rates.values())) == 1:
        rate = next(iter(rates.values()))
        ax.axhline(rate, color="grey", ls=":", lw=1, label=f"base rate ({rate:.2f})")
    else:
        for name, rate in rates.items():
            ax.axhline(rate, color=colors.get(name, "grey"), ls=":", lw=1, label=f"base rate of {name} ({rate:.2f})")
    for label, (rec, prec) in (marks or {}).items():
        ax.plot([rec], [prec], "o", color="black")
        ax.annotate(label, (rec, prec), textcoords="offset points", xytext=(5, 5), fontsize=8)
    ax.set_xlabel("Recall")
    ax.set_ylabel("Precision")
    ax.set_xlim(0, 1.01)
    ax.set_ylim(0, 1.02)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    _save(fig, path)
    return aps


def plot_score_histogram(scores: Sequence[float], labels: Sequence[int] | None, path: str | Path,
                         delta: float | None = None, title: str = "Score distribution", bins: int = 20,
                         xlabel: str = "score", names: tuple[str, str] = ("invalid", "valid")) -> None:
    """Histogram of scores, one colour per gold label (if given), with the threshold δ as a line."""
    plt = _plt()
    scores = np.asarray(scores, dtype=float)
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    lo, hi = (float(scores.min()), float(scores.max())) if len(scores) else (0.0, 1.0)
    edges = np.linspace(lo, hi if hi > lo else lo + 1, bins + 1)
    if labels is None:
        ax.hist(scores, bins=edges, alpha=0.7, label="all")
    else:
        labels = np.asarray(labels)
        for value, name, color in ((0, names[0], "tab:red"), (1, names[1], "tab:green")):
            ax.hist(scores[labels == value], bins=edges, alpha=0.6, color=color, label=f"{name} (n={(labels == value).sum()})")
    if delta is not None:
        ax.axvline(delta, color="black", ls="--", lw=1, label=f"δ = {delta:.3f}")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("count")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    _save(fig, path)


def _save(fig, path):
    plt = _plt()
    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)


def log_png(logger, key: str, path: str | Path, step: int | None = None) -> None:
    """Send a PNG to the logger when it can show images (W&B); other loggers keep the file only."""
    if logger is not None and type(logger).__name__ == "WandbLogger":
        kwargs = {} if step is None else {"step": step}
        logger.log_image(key=key, images=[str(path)], **kwargs)
