"""How much of what the threshold filter keeps is knowledge, and how much knowledge it drops: a blind audit of one
iteration's filter output, judged by a person against i2d2/data/annotations/GUIDE.md.

    python scripts/kept_set_audit.py export --run-dir runs/i2d2 --iteration 0 --rejected 150 --out blind.csv
    # label blind.csv's `label` column against GUIDE.md (true / false / vague / episodic / ad_copy / garbled / dont_know)
    python scripts/kept_set_audit.py score --run-dir runs/i2d2 --iteration 0 --labels blind_done.csv [--labels second.csv]
    # the bundled audit (key and labels in one file; a field other than `label` after a colon):
    python scripts/kept_set_audit.py score --key i2d2/data/annotations/kept_audit_fresh.jsonl \
        --labels i2d2/data/annotations/kept_audit_fresh.jsonl --labels i2d2/data/annotations/kept_audit_fresh.jsonl:label_1

`export` draws every kept statement and a uniform random sample of the dropped ones (whatever dropped them), one row
per distinct statement, shuffled together, and writes only item id, statement and an empty label: the labeller cannot
tell kept from dropped or see a score. The key (which row is which, its drop reason and critic score, how many rows
that reason dropped and how many generations the filter saw) goes to `<run>/iter_k/audit/key.jsonl`. `score` maps the labels back and prints, each beside its count:
- precision of the kept set (share judged true, Wilson 95 % interval) and its yield (kept of all generations);
- per drop reason: the sampled share judged true and the estimated number of true statements it dropped;
- the filter's estimated recall: true kept / (true kept + estimated true dropped), a near-duplicate of a kept
  statement not counted as dropped knowledge;
- the critic's AP over the statements it ranked (every one with a critic score: kept, and dropped by δ or by a rule
  applied after scoring, i.e. all but the unfinished), each dropped row weighted by its
  inverse sampling rate, so that the figure is the population's and not the sample's, and its precision / recall
  at a few score thresholds over the same population (the critic alone, without the de-duplication and caps).
`--by-concept` adds the kept set per concept (true of judged), names the concepts none of whose kept statements was
judged true, and, with `--run-dir`, each concept's mean critic score over all its scored generations and how well
that mean ranks the concepts' kept precision (Spearman): can a concept-level score tell the concepts the model gets
wrong?
A second `--labels` file (another person's blind labels of the same export) adds the agreement (Cohen's kappa on the
valid / invalid reading). `dont_know` rows are left out, as the critic leaves them out: of the precision and the
shares, and of the true counts on the kept and the dropped side alike (a sampled row stands for total / sampled).
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import numpy as np
from sklearn.metrics import average_precision_score, cohen_kappa_score

from i2d2.io import read_csv, read_jsonl, read_table, write_csv, write_jsonl
from i2d2.labels import label_mapping, normalize_label, normalize_statement
from i2d2.metrics import wilson_interval

THRESHOLDS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8)  # the critic's precision / recall printed at these scores
NOT_LOST = {"duplicate"}  # a near-duplicate of a kept statement: its knowledge is kept, so recall does not count it


def _filtered(run_dir: Path, iteration: int) -> Path:
    folder = run_dir / f"iter_{iteration}" / "filtered"
    if not (folder / "kept").exists() or not (folder / "dropped").exists():
        sys.exit(f"{folder}: no finished filter stage (kept/ and dropped/ tables) to audit")
    return folder


def population(run_dir: Path, iteration: int) -> tuple[list[dict], int]:
    """(every distinct statement the filter saw: kept (drop_reason None) or dropped with its reason, the number of
    generations it saw). A statement both kept and dropped (a duplicate) counts as kept."""
    folder = _filtered(run_dir, iteration)
    rows, n_generations = {}, 0
    for name in ("kept", "dropped"):
        table = read_table(folder / name)
        n_generations += len(table)
        for r in table.to_list():
            key = normalize_statement(r["statement"])
            if key in rows:
                continue
            rows[key] = {"statement": r["statement"], "concept": r["concept"], "kept": name == "kept",
                         "drop_reason": None if name == "kept" else str(r["drop_reason"]),
                         "critic_score": r.get("critic_score")}
    return list(rows.values()), n_generations


def export(args) -> None:
    run_dir, out = Path(args.run_dir), Path(args.out)
    rows, n_generations = population(run_dir, args.iteration)
    rng = np.random.default_rng(args.seed)
    kept = [r for r in rows if r["kept"]]
    dropped = [r for r in rows if not r["kept"]]
    pick = rng.choice(len(dropped), size=min(args.rejected, len(dropped)), replace=False) if dropped else []
    drawn = kept + [dropped[i] for i in sorted(pick)]
    order = rng.permutation(len(drawn))
    key, blind = [], []
    n_dropped = Counter(r["drop_reason"] for r in dropped)
    for j, i in enumerate(order):
        r = drawn[i]
        item = f"a{j:04d}"
        blind.append({"item_id": item, "statement": r["statement"], "label": ""})
        key.append({**r, "item_id": item, "reason_total": n_dropped[r["drop_reason"]] if not r["kept"] else None,
                    "n_generations": n_generations, "n_dropped": len(dropped)})
    key_path = run_dir / f"iter_{args.iteration}" / "audit" / "key.jsonl"
    write_jsonl(key_path, key)
    write_csv(out, blind, columns=["item_id", "statement", "label"])
    print(f"{out}: {len(blind)} statements ({len(kept)} kept, {len(pick)} of {len(dropped)} dropped), shuffled; "
          f"key: {key_path}")


def _labels(spec: str, key_ids: set[str]) -> dict[str, str]:
    """``{item_id: label}`` from a labelled export (CSV or JSONL); ``PATH:FIELD`` reads another column than ``label``.
    Labels are kept as written (lower case) for the counts, and checked against GUIDE.md's."""
    head, sep, field = spec.rpartition(":")
    path, field = (Path(head), field) if sep and "/" not in field else (Path(spec), "label")
    rows = read_jsonl(path) if path.suffix == ".jsonl" else read_csv(path, required=["item_id", field])
    out = {}
    for n, r in enumerate(rows, 2 if path.suffix != ".jsonl" else 1):
        item, label = str(r.get("item_id", "")), str(r.get(field, "")).strip().lower()
        if item not in key_ids:
            sys.exit(f"{path}:{n}: item_id {item!r} is not in this audit's key")
        if normalize_label(label) not in label_mapping(None):
            sys.exit(f"{path}:{n}: {field} {r.get(field)!r} is not a label of GUIDE.md")
        out[item] = label
    missing = key_ids - set(out)
    if missing:
        sys.exit(f"{path}: {len(missing)} items have no label (e.g. {sorted(missing)[0]})")
    return out


def _rate(k: int, n: int) -> str:
    if n == 0:
        return "– (n 0)"
    lo, hi = wilson_interval(k, n)
    return f"{k / n:.3f} [{lo:.2f}, {hi:.2f}] ({k} of {n})"


def score(args) -> None:
    if (args.key is None) == (args.run_dir is None):
        sys.exit("score: give --run-dir (its audit/key.jsonl) or --key, not both")
    key_path = Path(args.key) if args.key else Path(args.run_dir) / f"iter_{args.iteration}" / "audit" / "key.jsonl"
    key = read_jsonl(key_path)
    by_id = {r["item_id"]: r for r in key}
    sets = [_labels(p, set(by_id)) for p in args.labels]
    mapping = label_mapping(None)
    valid = {label: mapping[normalize_label(label)] for labels in sets for label in labels.values()}
    labels = sets[0]
    n_gen = key[0]["n_generations"]
    judged = [(by_id[i], valid[l]) for i, l in labels.items() if valid[l] is not None]
    kept = [y for r, y in judged if r["kept"]]
    n_kept_all = sum(r["kept"] for r in key)
    print(f"audit {key_path}: {len(key)} statements labelled "
          f"({sum(normalize_label(l) == 'dont_know' for l in labels.values())} dont_know left out)")
    print(f"kept: precision {_rate(sum(kept), len(kept))}; yield {n_kept_all} kept of {n_gen} generations "
          f"({n_kept_all / n_gen:.3f})")
    print("kept labels: " + ", ".join(f"{k} {v}" for k, v in Counter(
        labels[i] for i, r in by_id.items() if r["kept"]).most_common()))
    totals = {r["drop_reason"]: r["reason_total"] for r in key if not r["kept"]}  # distinct statements per reason
    # a sampled row stands for total / sampled rows of its reason, dont_know or not: dont_know is left out on both
    # sides alike (a kept one is no true kept statement, so a dropped one is no true dropped statement)
    n_sampled = Counter(r["drop_reason"] for r in key if not r["kept"])
    est_true_dropped = 0.0
    for reason, total in sorted(totals.items()):
        ys = [y for r, y in judged if r["drop_reason"] == reason]
        est = sum(ys) * total / n_sampled[reason]
        est_true_dropped += 0.0 if reason in NOT_LOST else est
        print(f"dropped for {reason}: true {_rate(sum(ys), len(ys))} of the sample; {total} dropped in all, "
              f"~{est:.1f} true")
    n_dropped = int(key[0].get("n_dropped", 0))
    unsampled = n_dropped - sum(totals.values())
    if unsampled > 0:  # a reason too rare to be drawn: its statements are not in the recall below
        print(f"dropped for reasons the sample did not draw: {unsampled} (left out of the recall)")
    true_kept = sum(kept)
    if n_dropped and not totals:  # no dropped row to estimate from: 1.000 would claim the filter lost nothing
        print(f"filter recall (estimated): unknown (none of the {n_dropped} dropped statements was drawn; "
              "export with --rejected > 0)")
    elif true_kept + est_true_dropped > 0:
        print(f"filter recall (estimated): {true_kept / (true_kept + est_true_dropped):.3f} "
              f"({true_kept} true kept, ~{est_true_dropped:.1f} true dropped, duplicates of kept ones not counted)")
    # what the critic ranked: every row with a score. Only unfinished generations go unscored; the empty ones, unmet
    # constraints and repeated list items are dropped after the critic passed them (their scores are above δ)
    ranked = [(r, y) for r, y in judged if r["critic_score"] is not None]
    if ranked and 0 < sum(y for _, y in ranked) < len(ranked):
        w = [1.0 if r["kept"] else totals[r["drop_reason"]] / n_sampled[r["drop_reason"]] for r, _ in ranked]
        ap = average_precision_score([y for _, y in ranked], [r["critic_score"] for r, _ in ranked], sample_weight=w)
        base = np.average([y for _, y in ranked], weights=w)
        print(f"critic AP over the statements it ranked (weighted to the population): {ap:.3f} "
              f"(base rate {base:.3f}, {len(ranked)} labelled)")
        # the critic alone at other thresholds, over the same weighted population (no de-dup or caps): what another
        # δ would trade, described here and chosen by nothing
        ys, ss, ws = (np.array(v, dtype=float) for v in zip(*[(y, r["critic_score"], wi)
                                                               for (r, y), wi in zip(ranked, w)]))
        for t in THRESHOLDS:
            above = ss >= t
            if (ws * above).sum() > 0:
                print(f"critic score >= {t:.2f}: precision {(ws * ys * above).sum() / (ws * above).sum():.3f}, "
                      f"recall {(ws * ys * above).sum() / (ws * ys).sum():.3f}, ~{(ws * above).sum():.0f} statements "
                      f"({int(above.sum())} labelled)")
    if args.by_concept:
        _by_concept([(r, y) for r, y in judged if r["kept"]],
                    _concept_mean_scores(Path(args.run_dir), args.iteration) if args.run_dir else None)
    for path, other in zip(args.labels[1:], sets[1:]):
        both = [(valid[labels[i]], valid[other[i]]) for i in labels if valid[labels[i]] is not None
                and valid[other[i]] is not None]
        if not both:
            print(f"agreement with {path}: nothing to compare (no item that both label other than dont_know)")
            continue
        a, b = zip(*both)
        agree = np.mean([x == y for x, y in both])
        # both labellers in one class: chance agreement is 1 and kappa 0/0 (sklearn's nan)
        kappa = "undefined (one class)" if len(set(a) | set(b)) < 2 else f"{cohen_kappa_score(a, b):.3f}"
        print(f"agreement with {path}: {agree:.3f} on {len(both)} items, Cohen's kappa {kappa}")


def _concept_mean_scores(run_dir: Path, iteration: int) -> dict[str, float]:
    """Each concept's mean critic score over every generation of it the critic scored (all rows, not the sample)."""
    scores: dict[str, list[float]] = {}
    for name in ("kept", "dropped"):
        for r in read_table(_filtered(run_dir, iteration) / name).to_list():
            if r.get("critic_score") is not None:
                scores.setdefault(r["concept"], []).append(float(r["critic_score"]))
    return {c: float(np.mean(v)) for c, v in scores.items()}


def _by_concept(kept: list[tuple[dict, int]], mean_score: dict[str, float] | None) -> None:
    by: dict[str, list[int]] = {}
    for r, y in kept:
        by.setdefault(r["concept"], []).append(y)
    print(f"kept set by concept ({len(by)} concepts; true of judged"
          + (", mean critic score of all its scored generations)" if mean_score else ")"))
    for c in sorted(by, key=lambda c: (sum(by[c]) / len(by[c]), c)):
        print(f"  {c}: {sum(by[c])} of {len(by[c])}" + (f", mean score {mean_score[c]:.3f}" if mean_score else ""))
    wrong = sorted(c for c, ys in by.items() if not any(ys))
    print(f"concepts with no kept statement judged true: {len(wrong)} ({', '.join(wrong) or 'none'}), "
          f"{sum(len(by[c]) for c in wrong)} kept rows")
    if mean_score and len(by) > 2:
        from scipy.stats import spearmanr
        rho = spearmanr([mean_score[c] for c in by], [sum(by[c]) / len(by[c]) for c in by]).statistic
        print(f"concept mean score vs its kept precision: Spearman {rho:.3f} over {len(by)} concepts")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export", help="blind sample of kept + dropped statements")
    e.add_argument("--run-dir", required=True)
    e.add_argument("--iteration", type=int, default=0)
    e.add_argument("--rejected", type=int, default=150, help="dropped statements drawn at random")
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--out", required=True)
    s = sub.add_parser("score", help="precision, yield, recall and AP from the labelled export")
    s.add_argument("--run-dir", help="the run whose export was labelled (its iter_k/audit/key.jsonl)")
    s.add_argument("--key", help="or the key file itself (the bundled audit: key and labels in one file)")
    s.add_argument("--iteration", type=int, default=0)
    s.add_argument("--labels", action="append", required=True,
                   help="labelled export, PATH or PATH:FIELD (repeat for a second person: adds their agreement)")
    s.add_argument("--by-concept", action="store_true",
                   help="the kept set's precision per concept (with --run-dir: beside its mean critic score)")
    args = p.parse_args(argv)
    (export if args.cmd == "export" else score)(args)


if __name__ == "__main__":
    main()
