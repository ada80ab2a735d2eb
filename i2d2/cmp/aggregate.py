"""Mean ± std of CMP zero-shot results over runs that differ only in ``seed`` (each seed draws its own
unseen-entity split and its own pre-training data order).

    for s in 0 1 2; do python -m i2d2.train task=cmp seed=$s run_dir=runs/cmp_s$s; done
    python -m i2d2.cmp.aggregate runs/cmp_s0 runs/cmp_s1 runs/cmp_s2
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from i2d2.io import DataError


def load_reports(run_dirs) -> list[dict]:
    reports, seen = [], {}
    for d in run_dirs:
        path = Path(d) / "report.json"
        if not path.exists():
            raise DataError(f"{path}: no CMP report (has the run finished?)")
        if path.resolve() in seen:
            raise DataError(f"{d}: given twice (also as {seen[path.resolve()]})")
        seen[path.resolve()] = d
        try:
            report = json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError) as e:  # the bare JSON message named no file
            raise DataError(f"{path}: not a readable report ({e})") from None
        missing = [k for k in ("zero_shot", "splits") if not isinstance(report, dict) or k not in report]
        if missing:
            raise DataError(f"{path}: not a CMP run's report (no {', '.join(missing)}); task=cmp writes one")
        reports.append(report)
    seeds = [r["seed"] for r in reports if r.get("seed") is not None]  # older reports name no seed
    if len(set(seeds)) < len(seeds):
        raise DataError(f"runs with the same seed {seeds}: the spread over seeds needs one run per seed")
    return reports



def zero_shot_table(reports: list[dict]) -> dict:
    """{model: {metric: (mean, std, n_runs)}} for EM and F1 of every zero-shot candidate."""
    models = [m for m in reports[0]["zero_shot"] if all(m in r["zero_shot"] for r in reports)]
    out = {}
    for m in models:
        out[m] = {}
        for metric in ("em", "f1"):
            v = np.array([r["zero_shot"][m][metric] for r in reports], dtype=float)
            out[m][metric] = (float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else None, len(v))
    return out


def markdown(reports: list[dict]) -> str:
    seeds = [r.get("seed") for r in reports]
    sizes = [r["splits"] for r in reports]
    n_test = [r["zero_shot"][next(iter(r["zero_shot"]))]["n"] for r in reports]
    # 'unseen entities' only where no run's test split shares an entity, document or fact with its training split
    shared = [sum(s["shared_with_train"]["test"].values()) for s in sizes if "shared_with_train" in s]
    where = (f"the test split (entities, documents and facts shared with training: {shared})" if any(shared)
             else "unseen entities")
    lines = [f"Zero-shot synthetic comparative QA on {where}, seeds {seeds}: "
             f"train quintuples {[s['train'] for s in sizes]}, test quintuples {[s['test'] for s in sizes]} "
             f"({[s['entities']['test'] for s in sizes]} {'' if any(shared) else 'unseen '}test entities), "
             f"QA items scored {n_test}.",
             "", "| model | EM (mean ± std) | F1 (mean ± std) | runs |", "|---|---|---|---|"]
    for m, v in zero_shot_table(reports).items():
        answers = {r["zero_shot"][m].get("answer") for r in reports} - {None}
        name = f"{m} ({'/'.join(map(repr, sorted(answers)))})" if answers else m
        em, f1 = (f"{v[k][0]:.2f} ± " + ("–" if v[k][1] is None else f"{v[k][1]:.2f}") for k in ("em", "f1"))
        lines.append(f"| {name} | {em} | {f1} | {v['em'][2]} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dirs", nargs="+")
    args = ap.parse_args(argv)
    try:  # a missing or foreign report, a seed twice: one line naming it, exit status 2, as the other CLIs
        reports = load_reports(args.run_dirs)
    except (DataError, OSError, ValueError) as e:  # ValueError: a report.json that is not JSON
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(markdown(reports), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
