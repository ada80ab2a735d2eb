#!/usr/bin/env python
"""Benchmark: plain transformers beam search vs the tensorized NeuroLogic decoder, same model/batch/beam.

Settings timed per model (one process, warm-up first):
  plain     model.generate(num_beams=beam)                           (the reference, ratio 1.0)
  nl-none   NeuroLogicDecoder, no constraints
  nl-i2d2   I2D2 A.1.4: count(function words) <= 1, count(connectives) = 0, NOT concept, NOT relational phrase
  nl-nc     NeuroComparatives A.2/A.3: aux verb and adverb clauses (ordered 1-2), Table 9 negatives (= 0),
            dynamic top-5 comparative clause over Table 8 (ordered 3); beta 1.25, sat tolerance 3 and the
            prune factor of conf/decoding/comparatives.yaml (500); the others prune at the schema's 50

  python scripts/bench_decoding.py                      # tiny:gpt2 and tiny:gpt2-124m, beam 10 x 30, batch 8
  python scripts/bench_decoding.py --gemma --device cuda --batch 32
  python scripts/bench_decoding.py --profile --models tiny:gpt2   # where a step's time goes (see below)
  python scripts/bench_decoding.py --models tiny:gpt2 --repeats 12 --cpu-time --threads 1 --against HEAD~3
        # this checkout's decoder side by side with i2d2/decoding as of a git revision, rounds interleaved

--against REV also times each constrained setting with the decoder of REV (nl-*@REV, loaded from git into a
scratch package) in the same rounds, and prints this decoder's time over REV's: best round over best round and the
median of the rounds' paired ratios. A version-to-version change is then measured on one machine in one spell,
which a shared machine's drift between runs (±10 % on the toy model) would otherwise swamp.

--profile prints, per setting, per decoding step (one model forward): operator calls (top-level aten ops from
torch.profiler), of them the compute ops (all but view-only ops such as view / reshape / expand / slice, which launch
nothing: the CPU proxy for kernel launches), CUDA kernels (on a GPU), host syncs (aten::_local_scalar_dense,
i.e. .item() / bool() / int() on a tensor, plus aten::nonzero, which waits for the device) and ms per step (from
a separate run without the profiler).  The plain beam-search step is the floor.
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

I2D2_PROMPTS = [  # (prompt, concept, relational phrase)
    ("A bicycle can", "bicycle", "can"), ("Dogs are", "dogs", "are"), ("A knife is used for", "knife", "is used for"),
    ("Ovens have", "ovens", "have"), ("Generally, trains are", "trains", "are"),
    ("Typically, birds can", "birds", "can"), ("A refrigerator keeps", "refrigerator", "keeps"),
    ("Usually, people need", "people", "need"),
]
NC_PAIRS = [("cherries", "peaches"), ("cars", "motorcycles"), ("apples", "oranges"), ("hammers", "screwdrivers"),
            ("buses", "trains"), ("chairs", "sofas"), ("knives", "machetes"), ("bicycles", "skateboards")]


def _yaml(path):
    import yaml

    p = ROOT / path
    return yaml.safe_load(p.read_text()) if p.exists() else {}


def i2d2_sets(n):
    from i2d2.decoding import Clause, ConstraintSet, CountConstraint, Literal

    c = (_yaml("conf/data/generics.yaml").get("constraints") or {})
    fw = c.get("function_words") or ["in", "on", "of", "for", "at", "anybody", "it", "one", "the", "a", "that", "or",
                                     "got", "do"]
    conn = c.get("connectives") or ["without", "between", "he", "they", "she", "my", "more", "much", "and", "when",
                                    "while", "although", "not", "as", "because", "since", "however", "therefore",
                                    "this", "there", "here", "the following", "by now", "into"]
    prompts, sets = [], []
    for i in range(n):
        p, concept, rel = I2D2_PROMPTS[i % len(I2D2_PROMPTS)]
        prompts.append(p)
        sets.append(ConstraintSet(
            clauses=[Clause([Literal(concept, False)], name="no_concept"), Clause([Literal(rel, False)], name="no_rel")],
            counts=[CountConstraint([str(w) for w in fw], 1, name="function_words"),
                    CountConstraint([str(w) for w in conn], 0, name="connectives")]))
    return prompts, sets


def nc_sets(n):
    from i2d2.decoding import Clause, ConstraintSet, CountConstraint, DynamicClause, Literal

    w = _yaml("conf/wordlists/comparatives.yaml")
    aux = w.get("aux_verbs") or ["have", "need", "may", "are", "would"]
    adv = w.get("adverbs") or ["typically", "often", "always", "generally", "normally"]
    comps = w.get("comparatives") or ["bigger", "smaller", "heavier", "lighter", "cheaper", "faster", "slower"]
    negs = w.get("negatives") or {"pronouns": ["I", "you", "he", "they", "she", "we"],
                                  "connectives": ["and", "because", "than", "while", "however"]}
    prompts, sets = [], []
    for i in range(n):
        a, b = NC_PAIRS[i % len(NC_PAIRS)]
        prompts.append(f"Compared to {a}, {b}")
        sets.append(ConstraintSet(
            clauses=[Clause([Literal(str(aux[i % len(aux)]))], positions=[1, 2], name="aux"),
                     Clause([Literal(str(adv[i % len(adv)]))], positions=[1, 2], name="adverb")],
            counts=[CountConstraint([str(x) for x in v], 0, name=f"neg:{k}") for k, v in negs.items()],
            dynamic=[DynamicClause([str(x) for x in comps], top_k=5, positions=[3], name="comparative")]))
    return prompts, sets


def decoder_at(rev: str):
    """``i2d2/decoding`` as of git revision ``rev``, importable beside this checkout's: its files are read with
    ``git show`` into a scratch package whose own imports are renamed (the rest, e.g. ``i2d2.schemas``, is shared)."""
    git = ["git", "-C", str(ROOT)]
    ls = subprocess.run(git + ["ls-tree", "--name-only", rev, "i2d2/decoding/"], capture_output=True, text=True)
    files = ls.stdout.split() if ls.returncode == 0 else []
    if not files:
        raise SystemExit(f"--against {rev}: no i2d2/decoding/ at that revision {ls.stderr.strip()}".rstrip())
    name = "_decoding_at_" + "".join(c if c.isalnum() else "_" for c in rev)
    pkg = Path(tempfile.mkdtemp(prefix="bench_decoding_")) / name
    pkg.mkdir()
    for f in files:
        if f.endswith(".py"):
            src = subprocess.run(git + ["show", f"{rev}:{f}"], check=True, capture_output=True, text=True).stdout
            (pkg / Path(f).name).write_text(src.replace("i2d2.decoding", name))
    sys.path.insert(0, str(pkg.parent))
    return importlib.import_module(name)


def run_model(name, args, out_rows):
    import torch

    from i2d2.decoding import ConstraintSet, DecodingConfig, NeuroLogicDecoder
    from i2d2.models import load_causal_lm

    model, tok = load_causal_lm(name)
    model = model.to(args.device).eval()
    B, K, T = args.batch, args.beam, args.max_new_tokens
    cfg = DecodingConfig(beam_size=K, num_return=K, max_new_tokens=T, min_new_tokens=args.min_new_tokens,
                         length_penalty=0.1, prune_factor=50, sat_tolerance=2, beta=0.0, batch_size=B,
                         early_stopping=True)
    nc_pf = int(_yaml("conf/decoding/comparatives.yaml")["prune_factor"])  # the NC preset's, read from its file
    nc_cfg = DecodingConfig(**{**cfg.__dict__, "beta": 1.25, "sat_tolerance": 3, "prune_factor": nc_pf})
    dec = NeuroLogicDecoder(model, tok, cfg)
    dec_nc = NeuroLogicDecoder(model, tok, nc_cfg)
    ip, iset = i2d2_sets(B)
    npr, nset = nc_sets(B)

    def plain(prompts):
        enc = tok(prompts, return_tensors="pt", padding=True).to(args.device)
        with torch.inference_mode():
            model.generate(**enc, num_beams=K, num_return_sequences=K, max_new_tokens=T,
                           min_new_tokens=args.min_new_tokens, length_penalty=0.1, early_stopping=True,
                           do_sample=False, pad_token_id=tok.pad_token_id)

    runs = [
        ("plain", lambda: plain(ip), None),
        ("nl-none", lambda: dec.decode(ip, [ConstraintSet()] * B), None),
        ("nl-i2d2", lambda: dec.decode(ip, iset), iset),
        ("nl-nc", lambda: dec_nc.decode(npr, nset), nset),
    ]
    if args.against:  # the same settings with REV's decoder (constraints as their JSON form, which it reads)
        old = decoder_at(args.against)
        odec, odec_nc = old.NeuroLogicDecoder(model, tok, cfg), old.NeuroLogicDecoder(model, tok, nc_cfg)
        iset_d, nset_d = [c.to_dict() for c in iset], [c.to_dict() for c in nset]
        runs += [
            (f"nl-none@{args.against}", lambda: odec.decode(ip, [{}] * B), None),
            (f"nl-i2d2@{args.against}", lambda: odec.decode(ip, iset_d), iset),
            (f"nl-nc@{args.against}", lambda: odec_nc.decode(npr, nset_d), nset),
        ]

    def sync():
        if str(args.device).startswith("cuda"):
            torch.cuda.synchronize()

    # warm-up (allocator, kernels, token tables) on a short run of each kind
    decoders = [dec, dec_nc] + ([odec, odec_nc] if args.against else [])
    saved = [d.cfg.max_new_tokens for d in decoders]
    for d in decoders:
        d.cfg.max_new_tokens = 3
    for _, fn, _ in runs[1:]:
        fn()
    enc = tok(ip[:2], return_tensors="pt", padding=True).to(args.device)
    with torch.inference_mode():
        model.generate(**enc, num_beams=K, max_new_tokens=3, do_sample=False, pad_token_id=tok.pad_token_id)
    for d, n in zip(decoders, saved):
        d.cfg.max_new_tokens = n
    if args.profile:
        for label, fn, _ in runs:
            out_rows.append(profile_setting(name, label, fn, model, args, sync))
        return
    # on a shared CPU the process's own CPU time is steadier than wall time (other jobs' load does not count)
    clock = time.process_time if args.cpu_time else time.perf_counter
    # settings interleaved round by round (plain, none, i2d2, nc, plain, ...): a slow spell of a shared machine then
    # hits every setting of a round alike instead of one setting's whole series; each setting keeps its best round
    # ... and the median over rounds of each round's own ratio, which a slow spell spanning a round leaves alone
    best, last, rounds = {}, {}, {}
    for _ in range(args.repeats):
        for label, fn, _ in runs:
            sync()
            t0 = clock()
            last[label] = fn()
            sync()
            dt = clock() - t0
            best[label] = min(best.get(label, dt), dt)
            rounds.setdefault(label, []).append(dt)
    base = best["plain"]
    med = {label: statistics.median(t / p for t, p in zip(rounds[label], rounds["plain"])) for label in rounds}
    for label, _, sets in runs:
        res, sat = last[label], None
        if sets is not None and res:
            flat = [g for gens in res for g in gens]
            sat = sum(g.all_satisfied for g in flat) / max(len(flat), 1)
        row = {"model": name, "setting": label, "device": str(args.device), "batch": B, "beam": K,
               "new_tokens": T, "seconds": round(best[label], 3),
               "clock": "cpu" if args.cpu_time else "wall", "ratio": round(best[label] / base, 3),
               "ratio_median_of_rounds": round(med[label], 3),
               "all_satisfied": None if sat is None else round(sat, 3)}
        out_rows.append(row)
        print(f"{name:20s} {label:{label_width(args)}s} {best[label]:8.2f} s   x{best[label] / base:5.2f}   x{med[label]:5.2f}"
              + ("" if sat is None else f"   all-satisfied {sat:.0%}"), flush=True)
    for label in [r[0] for r in runs[1:4]] if args.against else []:
        ref = f"{label}@{args.against}"
        pair = statistics.median(a / b for a, b in zip(rounds[label], rounds[ref]))
        out_rows.append({"model": name, "setting": label, "against": args.against,
                         "ratio_to_against": round(best[label] / best[ref], 3), "ratio_to_against_median": round(pair, 3)})
        print(f"{name:20s} {label:{label_width(args)}s} this checkout / {args.against}: x{best[label] / best[ref]:5.3f} (best rounds), "
              f"x{pair:5.3f} (median of paired rounds)", flush=True)
    del model, dec, dec_nc


def label_width(args) -> int:
    """Width of the setting column: the longest label, nl-i2d2@REV with --against."""
    return max(8, len(f"nl-i2d2@{args.against}") if args.against else 0)


SYNC_OPS = ("aten::_local_scalar_dense", "aten::nonzero")
# ops that make a new view of existing memory: no kernel runs on a GPU and no data is touched on a CPU (reshape /
# flatten of a non-contiguous tensor copies, and that copy is then not counted: compute ops are a slight undercount)
VIEW_OPS = frozenset(f"aten::{n}" for n in (
    "view", "reshape", "_reshape_alias", "expand", "expand_as", "as_strided", "unsqueeze", "squeeze", "permute",
    "transpose", "t", "slice", "select", "alias", "unflatten", "flatten", "view_as", "unbind", "split", "chunk",
    "narrow", "detach", "lift_fresh"))


def profile_setting(name, label, fn, model, args, sync):
    """One row of the --profile table: per-step operator calls, CUDA kernels, host syncs and ms."""
    from torch.profiler import ProfilerActivity, profile

    forwards = []
    hook = model.register_forward_pre_hook(lambda *a: forwards.append(1))
    try:
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        wall = time.perf_counter() - t0
        steps = len(forwards)
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if str(args.device).startswith("cuda") else [])
        with profile(activities=acts) as prof:
            fn()
            sync()
    finally:
        hook.remove()
    events = prof.events()
    top = [e for e in events if e.name.startswith("aten::") and e.device_type.name == "CPU"
           and not (e.cpu_parent is not None and e.cpu_parent.name.startswith("aten::"))]
    ops = len(top)
    views = sum(1 for e in top if e.name in VIEW_OPS)
    syncs = sum(1 for e in events if e.name in SYNC_OPS)
    kernels = sum(1 for e in events if e.device_type.name == "CUDA")
    row = {"model": name, "setting": label, "device": str(args.device), "steps": steps,
           "ops_per_step": round(ops / steps, 1), "compute_ops_per_step": round((ops - views) / steps, 1),
           "syncs_per_step": round(syncs / steps, 2),
           "kernels_per_step": round(kernels / steps, 1) if kernels else None,
           "ms_per_step": round(1e3 * wall / steps, 2)}
    kern = "-" if not kernels else row["kernels_per_step"]
    print(f"{name:20s} {label:{label_width(args)}s} {steps:6d} {row['ops_per_step']:10.1f} {row['compute_ops_per_step']:10.1f} "
          f"{kern:>10} {row['syncs_per_step']:8.2f} "
          f"{row['ms_per_step']:9.2f}",
          flush=True)
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="tiny:gpt2,tiny:gpt2-124m", help="comma-separated model names")
    ap.add_argument("--gemma", action="store_true", help="also benchmark packaged:gemma3-270m")
    ap.add_argument("--device", default="cuda" if _cuda() else "cpu")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--beam", type=int, default=10)
    ap.add_argument("--max-new-tokens", type=int, default=30)
    ap.add_argument("--min-new-tokens", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1, help="timed rounds, the settings interleaved in each (each setting's minimum is reported)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    ap.add_argument("--cpu-time", action="store_true",
                    help="time with the process's CPU time instead of wall time (shared machines; use --threads 1)")
    ap.add_argument("--against", default=None, metavar="REV",
                    help="also time the constrained settings with i2d2/decoding as of this git revision, side by side")
    ap.add_argument("--profile", action="store_true",
                    help="per setting: operator calls, CUDA kernels, host syncs and ms per decoding step")
    args = ap.parse_args(argv)
    # checked before any model loads: --repeats 0 used to end in KeyError: 'plain' after the warm-up
    for flag in ("batch", "beam", "max_new_tokens", "repeats"):
        if getattr(args, flag) < 1:
            ap.error(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if not 0 <= args.min_new_tokens <= args.max_new_tokens:
        ap.error(f"--min-new-tokens must be between 0 and --max-new-tokens ({args.max_new_tokens}), "
                 f"got {args.min_new_tokens}")
    if not [m for m in args.models.split(",") if m] and not args.gemma:
        ap.error("--models names no model (and no --gemma): nothing to benchmark")
    sys.path.insert(0, str(ROOT))
    from i2d2.models import check_model_name

    for m in (m for m in args.models.split(",") if m):  # a misspelt one was a traceback, after the models before it
        try:
            check_model_name(m, "causal LM", "--models")
        except ValueError as e:
            ap.error(str(e))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    names = [m for m in args.models.split(",") if m] + (["packaged:gemma3-270m"] if args.gemma else [])
    print(f"device={args.device} threads={torch.get_num_threads()} batch={args.batch} beam={args.beam} "
          f"new_tokens={args.max_new_tokens}")
    if args.profile:
        print(f"{'model':20s} {'setting':{label_width(args)}s} {'steps':>6s} {'ops/step':>10s} {'compute':>10s} {'kern/step':>10s} {'syncs/st':>8s} "
              f"{'ms/step':>9s}")
    else:
        clock = "cpu time" if args.cpu_time else "wall"
        print(f"{'model':20s} {'setting':{label_width(args)}s} {clock:>10s}   ratio to plain beam search: best times, median of rounds")
    rows = []
    for n in names:
        run_model(n, args, rows)
    if args.json:
        from i2d2.io import write_json

        write_json(args.json, rows)
    return rows


def _cuda():
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


if __name__ == "__main__":
    main()
