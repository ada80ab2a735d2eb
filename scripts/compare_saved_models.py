#!/usr/bin/env python
"""Reload the language models that runs saved and compare them: did each strategy save the model it trained?

For every ``iter_<k>/model`` of the given run folders (same experiment, e.g. ``trainer=deepspeed_stage2`` against
``_stage3``): the parameter count against the model's config (a ZeRO-3 run that saved its shards un-gathered fails
here), whether every weight is finite, how far fine-tuning moved the weights from the starting model (``--start``;
a save of the untrained model moves < 1e-3, bf16 rounding alone ~1e-4), and the largest weight and next-token
log-probability difference against the same iteration of the first run folder (the reference). Exit status 1 when
a model does not load, is incomplete, not finite or not trained, or a run folder has no saved model (or none of an
iteration that another run folder, or ``--iteration``, has).
From iteration 1 on each run fine-tunes on its own generations, so across trainers compare ``--iteration 0``; runs
of one trainer (a killed and resumed run against an uninterrupted one) compare at every iteration.

  python scripts/compare_saved_models.py runs/zero2 runs/zero3 runs/gpu --start tiny:gpt2 --iteration 0
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["A bicycle can", "Dogs are", "Compared to apples, oranges"]
UNTRAINED = 1e-3  # largest weight change from the start below which a saved model counts as not fine-tuned


def _load(path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(path)


def _next_token_logprobs(model, tok):
    import torch

    with torch.no_grad():
        rows = [model(**tok(p, return_tensors="pt")).logits[0, -1].float().log_softmax(-1) for p in PROMPTS]
    return torch.stack(rows)


def _max_diff(a: dict, b: dict) -> float:
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def compare(run_dirs: list[Path], start: str | None = None, iteration: int | None = None) -> list[dict]:
    import torch
    from transformers import AutoModelForCausalLM

    from i2d2.models import load_causal_lm

    start_sd = load_causal_lm(start)[0].state_dict() if start else None
    ref = {}
    rows = []
    for run in run_dirs:
        for mdir in sorted(run.glob("iter_*/model"), key=lambda p: int(p.parent.name.split("_")[1])):
            it = mdir.parent.name
            if iteration is not None and it != f"iter_{iteration}":
                continue
            try:
                model, tok = _load(mdir)
            except Exception as e:  # noqa: BLE001 - a model saved wrongly (e.g. ZeRO-3 shards) is the finding
                rows.append({"run": str(run), "iteration": it, "error": f"{type(e).__name__}: {e}"[:500]})
                continue
            sd = model.state_dict()
            expected = sum(p.numel() for p in AutoModelForCausalLM.from_config(model.config).parameters())
            row = {"run": str(run), "iteration": it, "params": sum(p.numel() for p in model.parameters()),
                   "params_expected": expected, "finite": all(bool(torch.isfinite(v).all()) for v in sd.values()),
                   "moved_from_start": _max_diff(sd, start_sd) if start_sd is not None else None}
            row["trained"] = None if start_sd is None else row["moved_from_start"] > UNTRAINED
            lp = _next_token_logprobs(model, tok)
            if it in ref:
                row["max_weight_diff_vs_ref"] = _max_diff(sd, ref[it][0])
                row["max_logprob_diff_vs_ref"] = float((lp - ref[it][1]).abs().max())
            else:
                ref[it] = (sd, lp)
            rows.append(row)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path, help="run folders; the first is the reference")
    ap.add_argument("--start", default=None, help="the model the runs started from (e.g. tiny:gpt2)")
    ap.add_argument("--iteration", type=int, default=None, help="only iter_<k> (default: every iteration)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    missing = [r for r in args.runs if not any(r.glob("iter_*/model"))]
    for r in missing:  # a failed run loses its own row, not the others'
        print(f"{str(r):28s} no iter_*/model: skipped")
    rows = compare([r for r in args.runs if r not in missing], args.start, args.iteration)
    # a run that saved fewer iterations than the others (killed before its last one) has no row to fail there
    expected = {r["iteration"] for r in rows} | ({f"iter_{args.iteration}"} if args.iteration is not None else set())
    incomplete = [(run, it) for run in args.runs if run not in missing for it in sorted(expected)
                  if not (run / it / "model").is_dir()]
    for run, it in incomplete:
        print(f"{str(run):28s} {it:7s} no saved model")
    for r in rows:
        if "error" in r:
            print(f"{r['run']:28s} {r['iteration']:7s} does not load: {r['error']}")
            continue
        vs = ("reference" if "max_weight_diff_vs_ref" not in r else
              f"vs reference: weights {r['max_weight_diff_vs_ref']:.3g}, log-probs {r['max_logprob_diff_vs_ref']:.3g}")
        moved = "" if r["moved_from_start"] is None else (f"  moved from start {r['moved_from_start']:.3g}"
                                                          + ("" if r["trained"] else " (NOT TRAINED)"))
        print(f"{r['run']:28s} {r['iteration']:7s} params {r['params']:>11,d} (config {r['params_expected']:,d})  "
              f"finite {r['finite']}{moved}  {vs}")
    if args.json:
        from i2d2.io import write_text

        write_text(args.json, json.dumps(rows, indent=1))
    bad = [r for r in rows if "error" in r or r["params"] != r["params_expected"] or not r["finite"]
           or r["trained"] is False]
    return 1 if bad or missing or incomplete or not rows else 0


if __name__ == "__main__":
    raise SystemExit(main())
