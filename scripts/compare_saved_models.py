#!/usr/bin/env python
"""Reload the language models that runs saved and compare them: did each strategy save the model it trained?

For every ``iter_<k>/model`` of the given run folders (same experiment, e.g. ``trainer=gpu`` against
``trainer=deepspeed_stage2`` and ``_stage3``): the parameter count against the model's config (a ZeRO-3 run that
saved its shards un-gathered fails here), whether every weight is finite, how far fine-tuning moved the weights
from the starting model, and the largest weight and next-token log-probability difference against the same
iteration of the first run folder (the reference). Prints a table and writes ``--json``.

  python scripts/compare_saved_models.py runs/gpu runs/zero2 runs/zero3 --start tiny:gpt2 --json compare.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["A bicycle can", "Dogs are", "Compared to apples, oranges"]


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


def compare(run_dirs: list[Path], start: str | None = None) -> list[dict]:
    import torch
    from transformers import AutoModelForCausalLM

    from i2d2.models import load_causal_lm

    start_sd = load_causal_lm(start)[0].state_dict() if start else None
    ref = {}
    rows = []
    for run in run_dirs:
        for mdir in sorted(run.glob("iter_*/model"), key=lambda p: int(p.parent.name.split("_")[1])):
            it = mdir.parent.name
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
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    missing = [str(r) for r in args.runs if not any(r.glob("iter_*/model"))]
    if missing:
        raise SystemExit(f"compare_saved_models: no iter_*/model under {', '.join(missing)}")
    rows = compare(args.runs, args.start)
    for r in rows:
        if "error" in r:
            print(f"{r['run']:28s} {r['iteration']:7s} does not load: {r['error']}")
            continue
        vs = ("reference" if "max_weight_diff_vs_ref" not in r else
              f"vs reference: weights {r['max_weight_diff_vs_ref']:.3g}, log-probs {r['max_logprob_diff_vs_ref']:.3g}")
        moved = "" if r["moved_from_start"] is None else f"  moved from start {r['moved_from_start']:.3g}"
        print(f"{r['run']:28s} {r['iteration']:7s} params {r['params']:>11,d} (config {r['params_expected']:,d})  "
              f"finite {r['finite']}{moved}  {vs}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    bad = [r for r in rows if "error" in r or r["params"] != r["params_expected"] or not r["finite"]]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
