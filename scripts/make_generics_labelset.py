#!/usr/bin/env python
"""Generate the statements the maintainers label for the I2D2 critic (``i2d2/data/annotations/generics_gemma.*``).

Algorithm 1 (line 6) trains the critic on labelled samples of the generator's own output, so this script runs the
default loop's generator (packaged Gemma 3 270M), constraints and decoding settings over concepts that the default
run and the fixed evaluation concepts do not use, in the loop's proportions of plain nouns, nouns with a related
concept and goals. Every (noun, relational phrase) pair is asked in two prompt forms drawn from
``--forms`` (balanced), so the labels also measure the yield of true generics per form and per phrase
(``scripts/prompt_form_yield.py``).

    python scripts/make_generics_labelset.py --out runs/labelset     # ~7 min on 2 CPU cores
    # ... label <out>/chunks/chunk_*.jsonl against GUIDE.md into chunk_*.labels.jsonl ({"id", "label"}) ...
    python scripts/make_generics_labelset.py --out runs/labelset --merge   # -> i2d2/data/annotations/generics_gemma.*

Writes ``<out>/prompts.jsonl``, ``<out>/generations/`` (resumable shards), ``<out>/to_label.jsonl`` (distinct
statements, shuffled, with their provenance) and ``<out>/generation_config.json`` (everything needed to redo it).
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from i2d2.prompts import PROMPT_FORMS  # noqa: E402
from labelset_chunks import labelled_items, write_chunks  # noqa: E402  (scripts/: the labelling round)

# bare_singular ("Broom should") only suits mass nouns; the bundled concepts are count nouns
FORMS = ["bare_plural", "indefinite", "definite", "adverb+bare_plural", "adverb+indefinite"]


def compose(overrides):
    from hydra import compose as hcompose, initialize_config_dir

    from i2d2 import config  # noqa: F401  (resolvers)

    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        return hcompose("train", overrides=overrides)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/labelset")
    ap.add_argument("--nouns", type=int, default=120, help="plain noun concepts")
    ap.add_argument("--related", type=int, default=22, help="nouns with related concepts")
    ap.add_argument("--goals", type=int, default=45)
    ap.add_argument("--relations-per-noun", type=int, default=2)
    ap.add_argument("--forms-per-pair", type=int, default=2)
    # a misspelt form would match no variant: its nouns got no prompt, silently, or a related one crashed
    ap.add_argument("--forms", nargs="+", default=FORMS, choices=PROMPT_FORMS)
    ap.add_argument("--prefixes-per-goal", type=int, default=2)
    ap.add_argument("--related-per-concept", type=int, default=1)
    ap.add_argument("--related-only", action="store_true",
                    help="nouns with related concepts get only related-concept prompts (a top-up of that kind)")
    ap.add_argument("--exclude-from", nargs="*", default=[],
                    help="to_label.jsonl files of earlier parts: their statements (and near-duplicates) are not repeated")
    ap.add_argument("--exclude-concepts", nargs="*", default=[],
                    help="jsonl files whose 'concept' values are left out (earlier label sets, confirmation sets)")
    ap.add_argument("--dry-run", action="store_true", help="count the concepts and prompts, generate nothing")
    ap.add_argument("--parts", nargs="*", default=[], help="with --merge: the part folders to join (default: --out)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--shard-size", type=int, default=16)
    ap.add_argument("--chunks", type=int, default=8, help="files to split to_label.jsonl into for labelling")
    ap.add_argument("--merge", action="store_true", help="join the labelled chunks into the bundled label set")
    ap.add_argument("--append", action="store_true",
                    help="with --merge: add the parts to the bundled label set instead of rewriting it from all parts")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides of the default run (e.g. decoding.beam_size=10)")
    args = ap.parse_args(argv)
    if args.chunks < 1:  # checked now, not after the generation it splits
        ap.error(f"--chunks must be >= 1, got {args.chunks}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    from omegaconf import OmegaConf

    from i2d2.concepts import load_concepts, load_phrases, resolve_path
    from i2d2.filtering import near_duplicates
    from i2d2.generation import generate_stage, read_generations
    from i2d2.io import read_jsonl, write_json, write_jsonl
    from i2d2.models import load_causal_lm
    from i2d2.prompts import _engine, build_constraints, goal_variants, heldout_keys, noun_variants
    from i2d2.recipes.generics import truncate
    from trainers.lm_finetune import join_statement

    out = Path(args.out)
    if args.merge:
        return merge([Path(p) for p in args.parts] or [out], append=args.append)
    cfg = compose(list(args.overrides))
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)

    # every bundled concept, minus those of the default run (the first max_concepts of each source) and the
    # fixed evaluation concepts: the critic must never have seen the concepts it is judged on
    data_all = OmegaConf.to_container(cfg.data, resolve=True)
    excluded = set()
    for name, src in data_all["sources"].items():
        if src and src.get("max_concepts"):
            one = {**data_all, "sources": {name: src}}
            excluded |= {c.text.lower() for c in load_concepts(one)}
    excluded |= heldout_keys(cfg.task.get("heldout"))
    excluded |= {str(r["concept"]).lower() for p in args.exclude_concepts for r in read_jsonl(p) if r.get("concept")}
    for src in data_all["sources"].values():
        if src:
            src["max_concepts"] = None
    pool = [c for c in load_concepts(data_all) if c.text.lower() not in excluded]
    plain = [c for c in pool if c.kind == "noun" and not c.related]
    related = [c for c in pool if c.kind == "noun" and c.related]
    goals = [c for c in pool if c.kind == "goal"]
    rng.shuffle(plain), rng.shuffle(related), rng.shuffle(goals)
    chosen = plain[:args.nouns] + related[:args.related] + goals[:args.goals]
    engine = _engine()
    rel_lists = {k: load_phrases(resolve_path(v, data_all.get("dir"))) for k, v in data_all["relations"].items()}

    rows, form_turn = [], 0
    for c in chosen:
        if c.kind == "goal":
            gv = goal_variants(c, data_all)
            todo = [(v, None) for v in rng.sample(gv, min(args.prefixes_per_goal, len(gv)))]
        else:
            todo = []
            for rel in rng.sample(rel_lists[c.relations or "general"], args.relations_per_noun):
                variants = noun_variants(c, rel, data_all, engine)
                by_form = {}
                for v in variants:
                    if v.form in args.forms and v.form not in by_form and (v.adverb in (None, "Generally", "Typically",
                                                                                       "Usually")):
                        by_form.setdefault(v.form, [])
                        by_form[v.form].append(v)
                have = [f for f in args.forms if f in by_form]
                # balanced rotation over the forms the phrase allows
                picks = [have[(form_turn + j) % len(have)] for j in range(min(args.forms_per_pair, len(have)))]
                form_turn += 1
                for f in picks:
                    todo.append((rng.choice(by_form[f]), None))
            if c.related:
                plain_prompts = todo
                if args.related_only:
                    todo = []
                for r in rng.sample(c.related, min(args.related_per_concept, len(c.related))):
                    if args.related_only:  # every (phrase, form) of this concept, with the related clause
                        todo += [(v, r) for v, _ in plain_prompts]
                    else:
                        todo.append((plain_prompts[rng.randrange(len(plain_prompts))][0], r))
        for v, rel in todo:
            rows.append(dict(prompt_id=f"L{len(rows):05d}", prompt=v.text,
                             constraints=build_constraints(v, rel, data_all["constraints"], engine),
                             concept=v.concept.text, kind=v.concept.kind, relation=v.relation, related=rel,
                             form=v.form, adverb=v.adverb, article=v.article, number=v.number))
    write_jsonl(out / "prompts.jsonl", rows)
    decoding = OmegaConf.to_container(cfg.decoding, resolve=True)
    write_json(out / "generation_config.json", {
        "script": "scripts/make_generics_labelset.py", "args": vars(args), "model": str(cfg.model.name),
        "decoding": decoding, "constraints": data_all["constraints"], "excluded_concepts": sorted(excluded),
        "n_prompts": len(rows), "n_concepts": len(chosen),
        "n_by_kind": {"noun": len(plain[:args.nouns]), "related": len(related[:args.related]),
                      "goal": len(goals[:args.goals])}})
    logging.info("%d prompts over %d concepts (pool: %d plain, %d related, %d goals)", len(rows), len(chosen),
                 len(plain), len(related), len(goals))
    if args.dry_run:
        return

    model, tok = load_causal_lm(str(cfg.model.name), cache=cfg.get("cache_dir"), dtype=cfg.model.get("dtype"))
    generate_stage(model.eval(), tok, out / "prompts.jsonl", out / "generations", decoding,
                   shard_size=args.shard_size)
    gens = read_generations(out / "generations")
    by_id = {r["prompt_id"]: r for r in rows}
    items = []
    for g in gens:
        p = by_id[g["prompt_id"]]
        statement = join_statement(p["prompt"], truncate(g.get("generation") or "", "sentence"))
        if statement == p["prompt"]:
            continue
        items.append({"statement": statement, "concept": p["concept"], "prompt": p["prompt"], "kind": p["kind"],
                      "related": p["related"], "form": p["form"], "relation": p["relation"],
                      "generation_rank": g.get("rank_in_prompt"), "all_satisfied": g.get("all_satisfied")})
    # one statement per near-duplicate cluster within a concept (case, hyphens, "happy" ~ "pleased")
    earlier = [r for p in args.exclude_from for r in read_jsonl(p)]
    both = earlier + items  # earlier parts come first and win their clusters
    rep = near_duplicates([r["statement"] for r in both], [r["concept"] for r in both],
                          order=[1.0] * len(earlier) + [0.0] * len(items))
    n_gen = len(items)
    items = [r for i, r in enumerate(items) if rep[len(earlier) + i] == len(earlier) + i]
    rng.shuffle(items)
    write_chunks(out, items, args.chunks)  # the labeller sees only id + statement: no form, score or prompt kind
    logging.info("%d distinct statements from %d generations (%d non-empty) -> %s", len(items), len(gens), n_gen,
                 out / "to_label.jsonl")


def merge(parts: list[Path], append: bool = False) -> None:
    """Join each part's ``to_label.jsonl`` with its chunk labels into ``i2d2/data/annotations/generics_gemma.jsonl``
    (+ ``generics_gemma.config.json``: the generation config of every part)."""
    import json

    from i2d2.io import read_jsonl, write_json, write_jsonl

    rows, configs = [], []
    for out in parts:
        rows += [{"statement": r["statement"], "label": label, "concept": r["concept"], "prompt": r["prompt"],
                  "kind": r["kind"], "related": r["related"], "form": r["form"], "relation": r["relation"],
                  "generation_rank": r["generation_rank"], "annotator": "maintainers", "part": out.name}
                 for r, label in labelled_items(out)]
        configs.append(json.loads((out / "generation_config.json").read_text()))
    dest = ROOT / "i2d2" / "data" / "annotations"
    if append:  # parts labelled later: the bundled rows and part configs stay as they are, first
        have = read_jsonl(dest / "generics_gemma.jsonl")
        old = json.loads((dest / "generics_gemma.config.json").read_text())
        clash = {r["part"] for r in have} & {r["part"] for r in rows}
        if clash:
            raise SystemExit(f"parts {sorted(clash)} are already in the bundled label set")
        rows, configs = have + rows, old["parts"] + configs
    write_jsonl(dest / "generics_gemma.jsonl", rows)
    excluded = sorted({c for cfg in configs for c in cfg["excluded_concepts"]})
    if append:  # a later part also excludes the earlier parts' concepts, which the set does use
        excluded = old["excluded_concepts"]
    write_json(dest / "generics_gemma.config.json", {"model": configs[0]["model"], "decoding": configs[0]["decoding"],
                                                      "excluded_concepts": excluded, "parts": configs})
    logging.info("wrote %d labelled statements to %s", len(rows), dest / "generics_gemma.jsonl")


if __name__ == "__main__":
    main()
