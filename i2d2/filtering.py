"""Apply the critic: keep generations whose critic score exceeds δ (I2D2 Algorithm 1, line 7)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from i2d2.io import write_json, write_jsonl


def threshold_filter(rows: Sequence[dict], scores, delta: float) -> tuple[list[dict], list[dict]]:
    """Split ``rows`` into (kept, dropped) by ``score > delta``; every returned row gets ``critic_score``.

    Rows are copied (the inputs are not modified); order is preserved within each side.
    """
    scores = np.asarray(scores, dtype=float).reshape(-1)
    if len(scores) != len(rows):
        raise ValueError(f"threshold_filter: {len(rows)} rows but {len(scores)} scores")
    if np.isnan(scores).any():
        raise ValueError(f"threshold_filter: {int(np.isnan(scores).sum())} scores are NaN")
    keep = scores > float(delta)
    kept, dropped = [], []
    for row, s, k in zip(rows, scores.tolist(), keep.tolist()):
        (kept if k else dropped).append({**row, "critic_score": s})
    return kept, dropped


def write_filtered(out_dir: str | Path, kept: Sequence[dict], dropped: Sequence[dict], delta: float | None = None,
                   tracker=None) -> dict:
    """Write ``kept.jsonl`` / ``dropped.jsonl`` (atomically) and ``summary.json``; return the summary."""
    out_dir = Path(out_dir)
    write_jsonl(out_dir / "kept.jsonl", kept)
    write_jsonl(out_dir / "dropped.jsonl", dropped)
    n = len(kept) + len(dropped)
    summary = {"n_in": n, "n_kept": len(kept), "n_dropped": len(dropped),
               "keep_rate": len(kept) / n if n else 0.0, "delta": delta}
    write_json(out_dir / "summary.json", summary)
    if tracker is not None:
        tracker.log_metrics({f"filter/{k}": v for k, v in summary.items() if v is not None})
    return summary


def filter_and_write(rows: Sequence[dict], scores, delta: float, out_dir: str | Path, tracker=None) -> dict:
    """``threshold_filter`` then ``write_filtered``."""
    kept, dropped = threshold_filter(rows, scores, delta)
    return write_filtered(out_dir, kept, dropped, delta=delta, tracker=tracker)
