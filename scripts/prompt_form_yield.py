#!/usr/bin/env python
"""Yield of true generics per prompt form, relational phrase and prompt kind, measured on labelled generations.

The labelled set (``i2d2/data/annotations/generics_gemma.jsonl``) asks every (noun, phrase) pair in two forms
drawn in rotation, so forms are compared on the same concepts. The choice is made on the critic's train + dev
concepts (the same ``grouped_split3`` as critic training, so the test concepts choose nothing) and confirmed on
the test concepts. Yield = share of judged statements (``dont_know`` left out) labelled ``true``; with it, the
true statements per prompt (distinct after near-duplicate removal).

    python scripts/prompt_form_yield.py            # prints tables, writes i2d2/data/annotations/prompt_form_yield.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def table(rows, key) -> dict:
    out = {}
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(str(r.get(key) or "–"), []).append(r)
    for g, rs in sorted(groups.items()):
        ys = [r["y"] for r in rs]
        prompts = {r.get("prompt") for r in rs} | set()
        labels = Counter(r["label"] for r in rs)
        out[g] = {"n": len(rs), "yield": sum(ys) / len(ys), "true_per_prompt": sum(ys) / max(1, len(prompts)),
                  "n_prompts": len(prompts), "labels": dict(labels.most_common())}
    return out


def markdown(name: str, t: dict) -> str:
    lines = [f"| {name} | judged | true share (yield) | true per prompt | top labels |", "|---|---|---|---|---|"]
    for g, v in sorted(t.items(), key=lambda kv: -kv[1]["yield"]):
        top = ", ".join(f"{k} {c}" for k, c in list(v["labels"].items())[:3])
        lines.append(f"| {g} | {v['n']} | {v['yield']:.3f} | {v['true_per_prompt']:.2f} | {top} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--labels", default=str(ROOT / "i2d2" / "data" / "annotations" / "generics_gemma.jsonl"))
    ap.add_argument("--out", default=str(ROOT / "i2d2" / "data" / "annotations" / "prompt_form_yield.json"))
    args = ap.parse_args(argv)

    import numpy as np
    from critics.data import grouped_split3, load_annotations
    from i2d2.io import write_text
    from i2d2.prompts import PROMPT_FORMS, phrase_number
    from i2d2.schemas import CriticConfig, defaults

    DEFAULTS = defaults(CriticConfig)

    rows = load_annotations([args.labels])
    y = np.array([r["y"] for r in rows])
    tr, dev, te = grouped_split3([r["concept"] for r in rows], y, DEFAULTS["dev_fraction"], DEFAULTS["test_fraction"],
                                 DEFAULTS["seed"])
    choose = [rows[i] for i in np.r_[tr, dev]]
    confirm = [rows[i] for i in te]
    labels_name = Path(args.labels).resolve()
    labels_name = str(labels_name.relative_to(ROOT)) if labels_name.is_relative_to(ROOT) else str(labels_name)
    result = {"labels": labels_name, "split": "critics.data.grouped_split3 with i2d2.schemas.CriticConfig defaults",
              "choose": {"n": len(choose)}, "confirm": {"n": len(confirm)}}
    # The forms are compared on the phrases that leave the noun's number open (modal verbs: "can", "may be"): a form
    # is a choice only there. Over every phrase a form's yield mixes in the phrases that force it ("is" takes the
    # singular forms only, and "is" prompts yield well), which favours whichever forms those phrases allow.
    import yaml

    modal = yaml.safe_load((ROOT / "conf" / "data" / "generics.yaml").read_text())["modal_verbs"]
    free = {r.get("relation") for r in rows if r.get("kind") == "noun" and r.get("relation")
            and phrase_number(r["relation"], modal) == "any"}
    parts = {}
    for name, part in (("choose", choose), ("confirm", confirm)):
        nouns = [r for r in part if r.get("kind") == "noun"]
        goals = [r for r in part if r.get("kind") == "goal"]
        plain = [r for r in nouns if not r.get("related")]  # a required related concept is a confound of its own
        parts[name] = plain
        result[name].update(by_form_free=table([r for r in plain if r.get("relation") in free], "form"),
                            by_form=table(plain, "form"), by_relation=table(plain, "relation"),
                            by_goal_prefix=table(goals, "relation"),
                            by_kind=table(
                                [{**r, "kind": "related" if r.get("related") else r.get("kind")} for r in part], "kind"))
    # the recommendation, from the choose split only. Forms: by yield where the phrase leaves the choice open (a
    # form never asked there, e.g. bare_singular, after them in its overall order). Phrases: each measured in the
    # form the recommended order gives it (the first of them among its judged rows: the label set asks every
    # (noun, phrase) pair in forms drawn in rotation), kept when that yield is at least the mean over every phrase so
    # measured (with >= 30 judged statements). Goal prefixes: at least the mean of goal prompts.
    c = result["choose"]
    order = [f for f, _ in sorted(c["by_form_free"].items(), key=lambda kv: -kv[1]["yield"])]
    order += [f for f, _ in sorted(c["by_form"].items(), key=lambda kv: -kv[1]["yield"]) if f not in order]
    # the label set never asks a bare singular (a mass noun's only bare form, "Generally, honey is"): it follows its
    # generic counterpart, the bare plural, rather than leave mass nouns to "The honey is"
    for f in PROMPT_FORMS:
        twin = f.replace("bare_singular", "bare_plural")
        if f not in order and twin != f and twin in order:
            order.insert(order.index(twin) + 1, f)
    for name in ("choose", "confirm"):
        chosen = []
        for rel in sorted({r.get("relation") for r in parts["choose"]}):
            forms = {r.get("form") for r in parts["choose"] if r.get("relation") == rel}
            first = next((f for f in order if f in forms), None)
            chosen += [r for r in parts[name] if r.get("relation") == rel and r.get("form") == first]
        result[name]["by_relation_in_chosen_form"] = table(chosen, "relation")
        result[name]["chosen_form_mean"] = sum(r["y"] for r in chosen) / max(1, len(chosen))
    for name in ("choose", "confirm"):
        print(f"\n## {name} ({'train + dev' if name == 'choose' else 'test'} concepts, n={result[name]['n']})\n")
        for key in ("by_form_free", "by_form", "by_relation_in_chosen_form", "by_relation", "by_goal_prefix",
                    "by_kind"):
            print(markdown(key[3:], result[name][key]) + "\n")
    mean = {k: v["yield"] for k, v in c["by_kind"].items()}
    result["recommend"] = {
        "prompt_forms": order,
        "relations": [r for r, v in sorted(c["by_relation_in_chosen_form"].items(), key=lambda kv: -kv[1]["yield"])
                      if v["n"] >= 30 and v["yield"] >= c["chosen_form_mean"]],
        "goal_prefixes": [g for g, v in sorted(c["by_goal_prefix"].items(), key=lambda kv: -kv[1]["yield"])
                          if v["n"] >= 30 and v["yield"] >= mean["goal"]]}
    print("recommended (from train + dev concepts):", json.dumps(result["recommend"]))
    write_text(args.out, json.dumps(result, indent=1) + "\n")  # atomic: by default the bundled file is replaced
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
