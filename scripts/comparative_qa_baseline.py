"""How much an LM knows of the labelled comparatives, as ComparativeQA (NeuroComparatives §4.1).

    python scripts/comparative_qa_baseline.py [--model packaged:gemma3-270m] [--shots 0 5]   # ~2 min per shot count

Builds the benchmark the recipe scores (``task.qa.benchmark``: one item per comparative judged true in the
bundled labels, the answer its subject) and, as a control, the same items from the comparatives judged false,
whose "answer" is the entity the generator made the subject. An LM that knows comparatives picks the subject
more often for the true ones than for the false ones; one that only prefers the wording it generated picks it
alike. Prints accuracy on each, with the share answered A (option-position bias). ``--seed`` balances the answer
key (which half lists the answer as A); the recipe balances with the run's seed (``seed``, 1234 by default), so its
figure matches this script's with ``--seed 1234``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="packaged:gemma3-270m")
    ap.add_argument("--labels", type=Path, default=None, help="labelled comparatives (default: the bundled set)")
    ap.add_argument("--shots", type=int, nargs="+", default=[0])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    from critics.data import load_annotations
    from i2d2.comparatives.qa import benchmark_qa
    from i2d2.comparatives.qa_eval import QAEvalConfig, evaluate_qa
    from i2d2.models import load_causal_lm
    from i2d2.recipes.comparatives import SEED_ANNOTATIONS

    path = args.labels or SEED_ANNOTATIONS
    # true rows are the benchmark; false rows (only "False", not vague / subjective) the control
    rows = load_annotations([path], {"true": 1, "false": 0, "too_vague_to_judge": None,
                                     "too_subjective_to_judge": None, "too_unfamiliar_to_judge": None,
                                     "invalid": None})
    sets = {"judged true (the benchmark)": benchmark_qa(rows, seed=args.seed),
            "judged false (control)": benchmark_qa([{**r, "y": 1 - r["y"]} for r in rows], seed=args.seed)}
    model, tok = load_causal_lm(args.model)
    model.eval()
    print(f"{args.model} on {path.name}")
    print(f"{'shots':>5s}  {'items':<28s} {'n':>4s} {'picks the subject':>17s} {'answers A':>9s}")
    for shots in args.shots:
        for name, items in sets.items():
            if not items:
                print(f"{shots:>5d}  {name:<28s}    0  (no such rows in {path.name})")
                continue
            m, _ = evaluate_qa(model, tok, items, QAEvalConfig(shots=shots, seed=args.seed), where=name)
            print(f"{shots:>5d}  {name:<28s} {m['n']:>4d} {m['accuracy']:>17.3f} {m['predicted_A_share']:>9.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
