"""Peak RSS of the I2D2 filter stage: JSONL rows loaded whole (the code at ``--old-ref``, the last commit before the
Arrow tables) vs the Arrow stage tables (the working tree), on one synthetic generations table.

    python scripts/bench_filter_memory.py --rows 1000000 --work /tmp/bench_filter

Builds ``--rows`` generation rows with the fields and lengths the generation stage writes (25 fields, ~700 bytes
of JSON a row, ``--concepts`` concepts, 3 generations per prompt), once as ``generations.jsonl`` (what the old
filter read) and once as the Arrow table ``table/`` (what the new one reads). Each path then runs the real
``filter_stage`` of its version (truncation, unfinished drop, threshold, near-duplicates, per-concept cap, the
annotation export, the written outputs) in its own subprocess; ``ru_maxrss`` of that subprocess is the figure.

The critic is a stand-in: ``critics.scoring.score_texts`` is replaced by a hash of each statement mapped to
[0, 1) (CRC-32 / 2**32) with δ = 0.5, so that model inference neither costs time nor memory and both paths keep
exactly the same rows.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
import types
import zlib
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
WORDS = ("long", "history", "life", "span", "legs", "seat", "back", "wood", "metal", "people", "used", "often", "made",
         "of", "to", "sit", "on", "in", "homes", "offices", "four", "a", "the", "are", "can", "be", "found", "many",
         "different", "shapes", "sizes", "colors", "comfortable", "useful", "for", "resting", "after", "work", "day")
FORMS = ("adverb+bare_plural", "bare_plural", "indefinite_singular", "relation")
RELATIONS = ("have", "are", "can", "is used for", "is capable of")


def synthetic_rows(start: int, n: int, n_concepts: int, rng: np.random.Generator) -> list[dict]:
    """``n`` generation rows numbered from ``start`` in the generation stage's row format (3 per prompt)."""
    rows = []
    for i in range(start, start + n):
        p = i // 3
        concept = f"concept{p % n_concepts}"
        rel = RELATIONS[p % len(RELATIONS)]
        words = rng.choice(WORDS, size=int(rng.integers(3, 16))).tolist()
        text = " ".join(words) + ("." if rng.random() < 0.9 else "")  # 10% cut off by max_new_tokens
        if rng.random() < 0.2:
            text += " " + " ".join(rng.choice(WORDS, size=5).tolist()) + "."  # a second sentence to truncate
        ok = bool(rng.random() < 0.8)
        rows.append({
            "prompt_id": f"p{p:07d}", "prompt": f"Generally, {concept}s {rel}", "generation": text,
            "score": float(-rng.random() * 10), "logprob": float(-rng.random() * 12), "num_tokens": len(words) + 1,
            "satisfied": [True, ok, True], "all_satisfied": ok, "matched": [f"NOT {concept}s", f"NOT {concept}" if ok
                                                                           else None, f"NOT {rel}"],
            "rank_in_prompt": i % 3, "constraint_names": [f"no_concept:{concept}s", f"no_concept:{concept}",
                                                          f"no_relation:{rel}"],
            "concept": concept, "kind": "noun", "template": f"Generally, {{concept}} {rel}", "surface": f"{concept}s",
            "relation": rel, "related": None, "perplexity": None, "adverb": "Generally", "article": None,
            "number": "pl", "form": FORMS[p % len(FORMS)], "source": f"noun_phrases.txt:{p % n_concepts + 1}",
        })
    return rows


def build(work: Path, n_rows: int, n_concepts: int, chunk: int = 50_000) -> None:
    from i2d2.io import write_arrow

    gens = work / "generations"
    (gens / "table").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    with open(gens / "generations.jsonl", "w") as f:
        for s, start in enumerate(range(0, n_rows, chunk)):
            rows = synthetic_rows(start, min(chunk, n_rows - start), n_concepts, rng)
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
            write_arrow(gens / "table" / f"shard-{s:05d}.arrow", rows)
    # written last, so a killed build is redone; both sizes, so a table built for other --concepts is not reused
    (gens / "built.json").write_text(json.dumps(built_for(n_rows, n_concepts)))


def built_for(n_rows: int, n_concepts: int) -> dict:
    """What ``build`` records of the table it built (``generations/built.json``)."""
    return {"rows": n_rows, "concepts": n_concepts}


def stand_in_scores(model_dir, texts, **_) -> np.ndarray:
    return np.fromiter((zlib.crc32(t.encode()) for t in texts), dtype=np.float64, count=len(texts)) / 2 ** 32


OLD_REF = "e7d03d7"  # the last commit whose filter read generations.jsonl whole


def head_module(name: str, path: str, ref: str = OLD_REF) -> types.ModuleType:
    """``path`` as it is at git ``ref``, imported under ``name`` (the code before the Arrow tables)."""
    src = subprocess.run(["git", "show", f"{ref}:{path}"], cwd=ROOT, check=True, capture_output=True, text=True).stdout
    mod = types.ModuleType(name)
    mod.__file__ = str(ROOT / path)
    sys.modules[name] = mod
    exec(compile(src, f"{ref}:{path}", "exec"), mod.__dict__)
    return mod


def run_one(version: str, work: Path, num_proc: int | None, old_ref: str = OLD_REF) -> dict:
    """One filter stage in this process (call in a fresh subprocess: ru_maxrss is per process)."""
    from omegaconf import OmegaConf

    import critics.scoring
    from i2d2.recipes.generics import Ranks

    critics.scoring.score_texts = stand_in_scores
    if version == "jsonl":
        sys.modules["i2d2.filtering"] = head_module("i2d2.filtering", "i2d2/filtering.py", old_ref)
        generics = head_module("i2d2_generics_old", "i2d2/recipes/generics.py", old_ref)
    else:
        from i2d2.recipes import generics
    run_dir = work / version
    shutil.rmtree(run_dir, ignore_errors=True)  # a finished stage would be skipped
    it_dir = run_dir / "iter_0"
    it_dir.mkdir(parents=True, exist_ok=True)
    if not (it_dir / "generations").exists():
        (it_dir / "generations").symlink_to(work / "generations")
    task = OmegaConf.load(ROOT / "conf" / "task" / "i2d2.yaml")
    filt = {**OmegaConf.to_container(task.task.filter, resolve=False), "delta": 0.5}
    if version == "arrow":
        filt["num_proc"] = num_proc
    cfg = OmegaConf.create({"run_dir": str(run_dir), "seed": 0, "trainer": {"accelerator": "cpu"},
                            "critic": {"eval_batch_size": 64},
                            "task": {"filter": filt, "annotation": {"k_per_concept": 4}}})
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.time()
    critic = {"model_dir": str(work / "no-critic"), "delta": 0.5}
    if version == "arrow":  # the critic scores every statement in a stage of its own (split over ranks), then filter
        generics.scores_stage(cfg, it_dir, critic, Ranks())
    summary = generics.filter_stage(cfg, 0, it_dir, critic, None, Ranks())
    return {"version": version, "rows": json.loads((work / "generations" / "built.json").read_text())["rows"],
            "seconds": round(time.time() - t0, 1), "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF)
                                                                      .ru_maxrss / 1024),
            "rss_before_filter_mb": round(rss0 / 1024), "n_kept": summary["n_kept"], "n_in": summary["n_in"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--concepts", type=int, default=5000)
    ap.add_argument("--work", type=Path, default=Path("/tmp/bench_filter"))
    ap.add_argument("--num-proc", type=int, default=None, help="the Arrow path's map(num_proc)")
    ap.add_argument("--old-ref", default=OLD_REF, help="git commit of the JSONL filter (default: %(default)s)")
    ap.add_argument("--only", choices=("jsonl", "arrow"), help="run one path only")
    ap.add_argument("--child", choices=("jsonl", "arrow"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(run_one(args.child, args.work, args.num_proc, args.old_ref)))
        return 0
    marker = args.work / "generations" / "built.json"
    if not marker.exists() or json.loads(marker.read_text()) != built_for(args.rows, args.concepts):
        shutil.rmtree(args.work, ignore_errors=True)
        t0 = time.time()
        build(args.work, args.rows, args.concepts)
        print(f"built {args.rows} rows in {time.time() - t0:.0f}s: generations.jsonl "
              f"{(args.work / 'generations' / 'generations.jsonl').stat().st_size / 2**20:.0f} MiB", file=sys.stderr)
    results = []
    for version in [args.only] if args.only else ["jsonl", "arrow"]:
        cmd = [sys.executable, __file__, "--child", version, "--work", str(args.work), "--old-ref", args.old_ref]
        if args.num_proc:
            cmd += ["--num-proc", str(args.num_proc)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(json.dumps(results[-1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
