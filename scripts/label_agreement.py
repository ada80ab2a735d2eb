#!/usr/bin/env python
"""How far two maintainers' labels agree, and where a critic stands between chance and a second person.

Reads the bundled label set and its blind second pass (``i2d2/data/annotations/generics_gemma*.jsonl``), keeps the
statements both judged (``--sample``: one part of the second pass), drops ``dont_know`` and prints, for the seven
labels and for valid/invalid (only ``true`` is valid, as for the critic):

  * agreement and Cohen's kappa;
  * the second labeller used as a (yes/no) ranker of the first one's labels: precision, recall and AP. This is the
    AP a person gets; a critic's AP is read against it;
  * with ``--scores`` (a critic's ``test_scores.jsonl``, written by every critic fit): only the statements it scored
    (its test split), and the critic's AP against the first labels, against the second labels and on the statements
    both label alike.

  python scripts/label_agreement.py --scores runs/i2d2/iter_0/critic/test_scores.jsonl

The comparatives labels (the paper's six; only ``True`` valid, ``Too unfamiliar to judge`` left out, as for the
knowledge discriminator) and their blind second pass:

  python scripts/label_agreement.py --comparatives [--scores <run>/iter_0/critic/test_scores.jsonl]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
ANNOTATIONS = ROOT / "i2d2" / "data" / "annotations"
COMPARATIVES = ROOT / "i2d2" / "data" / "comparatives"
# (first labels, second pass, the valid label, the label neither trains nor evaluates) of each bundled label set
LABEL_SETS = {
    "generics": (ANNOTATIONS / "generics_gemma.jsonl", ANNOTATIONS / "generics_gemma.second_pass.jsonl", "true",
                 "dont_know"),
    "comparatives": (COMPARATIVES / "annotations_gemma.jsonl", COMPARATIVES / "annotations_gemma.second_pass.jsonl",
                     "True", "Too unfamiliar to judge"),
}


def paired_labels(first_path: Path, second_path: Path, sample: str | None) -> list[tuple[str, str, str]]:
    """(statement, first label, second label) for every statement of the second pass (of ``sample``)."""
    from i2d2.io import read_jsonl

    first = {r["statement"]: r["label"] for r in read_jsonl(first_path, required=("statement", "label"))}
    second = read_jsonl(second_path, required=("statement", "label"))
    samples = sorted({str(r.get("sample")) for r in second})
    if sample and sample not in samples:  # else nothing is left to compare and sklearn fails on empty arrays
        raise SystemExit(f"--sample {sample!r}: {second_path} has no such sample (it has {', '.join(samples)})")
    out = []
    for n, r in enumerate(second, 1):
        if sample and r.get("sample") != sample:
            continue
        if r["statement"] not in first:
            raise SystemExit(f"{second_path}:{n}: statement not in {first_path}: {r['statement']!r}")
        out.append((r["statement"], first[r["statement"]], r["label"]))
    return out


def critic_scores(path: Path) -> dict[str, float]:
    """A critic's scores by statement, as its test_scores.jsonl spells them (``agreement`` also looks a statement up
    by its canonical form, for a critic that reads canonical statements: ``critic.canonicalize``)."""
    from i2d2.io import read_jsonl

    return {r["statement"]: float(r["critic_score"]) for r in read_jsonl(path, required=("statement", "critic_score"))}


def agreement(pairs, scores: dict[str, float] | None = None, valid: str = "true", left_out: str = "dont_know") -> dict:
    """Agreement of the (statement, first, second) label ``pairs``, ``left_out`` by either dropped; ``valid`` is the
    one label a critic keeps."""
    from sklearn.metrics import average_precision_score, cohen_kappa_score

    pairs = [p for p in pairs if left_out not in (p[1], p[2])]
    if scores is not None:  # the statements the critic scored: its test split
        from critics.train import canonical_statement

        pairs = [p for p in pairs if p[0] in scores or canonical_statement(p[0]) in scores]
        if not pairs:
            raise SystemExit("--scores scored none of the twice-judged statements: pass the test_scores.jsonl of a "
                             "critic trained on the default split")
    a = np.array([p[1] == valid for p in pairs])
    b = np.array([p[2] == valid for p in pairs])
    out = {
        "n": len(pairs), "n_labels": len({p[1] for p in pairs} | {p[2] for p in pairs}), "valid_rate_first": float(a.mean()), "valid_rate_second": float(b.mean()),
        "agreement_labels": float(np.mean([p[1] == p[2] for p in pairs])),
        "kappa_labels": float(cohen_kappa_score([p[1] for p in pairs], [p[2] for p in pairs])),
        "agreement_valid": float((a == b).mean()), "kappa_valid": float(cohen_kappa_score(a, b)),
        "second_precision": float((a & b).sum() / max(b.sum(), 1)), "second_recall": float((a & b).sum() / max(a.sum(), 1)),
        "second_n_valid": int(b.sum()),  # the statements the second labeller keeps: what its precision is over
        "second_ap": float(average_precision_score(a, b.astype(float))),
    }
    if scores is not None:
        from critics.train import canonical_statement

        s = np.array([scores.get(p[0], scores.get(canonical_statement(p[0]))) for p in pairs])
        same = a == b
        out.update(critic_ap_first=float(average_precision_score(a, s)),
                   critic_ap_second=float(average_precision_score(b, s)),
                   critic_ap_agreed=float(average_precision_score(a[same], s[same])), n_agreed=int(same.sum()))
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--comparatives", action="store_true",
                    help="the comparatives label set (i2d2/data/comparatives) instead of the generics one")
    ap.add_argument("--first", type=Path, default=None, help="default: the chosen label set's labels")
    ap.add_argument("--second", type=Path, default=None, help="default: the chosen label set's second pass")
    ap.add_argument("--sample", default=None, help="only this part of the second pass (random | test_split)")
    ap.add_argument("--scores", type=Path, default=None, help="a critic's test_scores.jsonl")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    first, second, valid, left_out = LABEL_SETS["comparatives" if args.comparatives else "generics"]
    try:  # a missing file or a broken row (DataError, naming file:line) was a traceback
        pairs = paired_labels(args.first or first, args.second or second, args.sample)
        scores = critic_scores(args.scores) if args.scores else None
    except (ValueError, OSError) as e:
        ap.error(str(e))
    res = agreement(pairs, scores, valid, left_out)
    print(f"{res['n']} statements judged twice ({args.sample or 'all samples'}); valid rate {res['valid_rate_first']:.3f}"
          f" / {res['valid_rate_second']:.3f}")
    print(f"{res['n_labels']} labels:  agreement {res['agreement_labels']:.3f}  kappa {res['kappa_labels']:.3f}")
    print(f"valid/invalid: agreement {res['agreement_valid']:.3f}  kappa {res['kappa_valid']:.3f}")
    print(f"second labeller as a ranker of the first's labels: precision {res['second_precision']:.3f} "
          f"({res['second_n_valid']} of {res['n']} kept), recall {res['second_recall']:.3f}, AP {res['second_ap']:.3f}")
    if "critic_ap_first" in res:
        print(f"critic AP: vs first labels {res['critic_ap_first']:.3f}, vs second {res['critic_ap_second']:.3f}, "
              f"on the {res['n_agreed']} statements both label alike {res['critic_ap_agreed']:.3f}")
    return res


if __name__ == "__main__":
    main()
