"""The bundled CMP corpus, generated from hand-written entity facts (i2d2/data/cmp/entities.json).

Each entity has a category, property values and two hand-written sentences; its document is the
intro sentence, one sentence per property (the category's sentence template) and a closing sentence.
Quintuples pair two entities of the same category on the same property (criteria 1 and 2 of §3.2.2;
the category plays the role of Wikidata's 'instance of'), the documents are cut to the 10-sentence
segment holding the linked sentence (§3.2.3). Rows carry no ``split`` field: the recipe splits by
entity with ``data.val_fraction`` / ``data.test_fraction`` / ``seed`` (``i2d2.cmp.data.split_quintuples``),
and an entity split keeps only pairs whose entities fall on the same side, so the bundled corpus holds
every pair (``--n`` samples fewer).

    python -m i2d2.cmp.corpus --out i2d2/data/cmp/corpus.jsonl
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
from pathlib import Path

from i2d2.cmp.data import BUNDLED, Quintuple, write_quintuples
from i2d2.cmp.textualize import segment_for
from i2d2.io import DataError, read_text, write_json


def article(word: str) -> str:
    return "an" if word[:1].lower() in "aeiou" else "a"


def fill(template: str, e: str, v: str) -> str:
    out = template.format(e=e, v=v, a=article(v))
    return out[0].upper() + out[1:]


def load_facts(path: str | Path | None = None) -> dict:
    path = Path(path) if path else BUNDLED / "entities.json"
    facts = json.loads(read_text(path))
    cats = facts["categories"]
    for i, ent in enumerate(facts["entities"]):
        where = f"{path}: entities[{i}] ({ent.get('name')!r})"
        if ent.get("category") not in cats:
            raise DataError(f"{where}: unknown category {ent.get('category')!r}")
        missing = set(cats[ent["category"]]["properties"]) - set(ent["facts"])
        if missing:
            raise DataError(f"{where}: no value for {', '.join(sorted(missing))}")
    return facts


def document(ent: dict, facts: dict) -> str:
    props = facts["categories"][ent["category"]]["properties"]
    sents = [ent["intro"]] + [fill(t, ent["name"], ent["facts"][p]) for p, t in props.items()]
    if ent.get("extra"):
        sents.append(ent["extra"])
    return " ".join(sents)


def phrases(facts: dict) -> dict:
    """Realiser verb phrases keyed 'category|property'."""
    return {f"{c}|{p}": ph for c, spec in facts["categories"].items() for p, ph in spec["phrases"].items()}


def build_corpus(n: int | None = None, seed: int = 0, same_share: float = 0.4,
                 facts: dict | None = None) -> list[Quintuple]:
    """Quintuples over every same-category entity pair and property; with ``n``, a sample of ``n``
    of them, ``same_share`` of which have v1 = v2."""
    facts = facts or load_facts()
    rng = random.Random(seed)
    docs = {e["name"]: document(e, facts) for e in facts["entities"]}
    same, diff = [], []
    by_cat = itertools.groupby(sorted(facts["entities"], key=lambda e: e["category"]), key=lambda e: e["category"])
    for cat, ents in by_cat:
        ents = list(ents)
        for prop in facts["categories"][cat]["properties"]:
            for a, b in itertools.combinations(ents, 2):
                if rng.random() < 0.5:
                    a, b = b, a
                v1, v2 = a["facts"][prop], b["facts"][prop]
                d1 = segment_for(docs[a["name"]], a["name"], prop, v1)
                d2 = segment_for(docs[b["name"]], b["name"], prop, v2)
                if d1 is None or d2 is None:
                    raise DataError(f"no sentence of the {a['name']!r}/{b['name']!r} documents states {prop!r}")
                q = dict(e1=a["name"], e2=b["name"], property=prop, v1=v1, v2=v2, doc1=d1, doc2=d2, category=cat,
                         source="i2d2-cmp-facts")
                (same if v1 == v2 else diff).append(q)
    if n is None:
        rows = same + diff
    else:
        rng.shuffle(same)
        rng.shuffle(diff)
        k_same = min(len(same), round(n * same_share))
        rows = same[:k_same] + diff[: n - k_same]
    rows.sort(key=lambda r: (r["category"], r["property"], r["e1"], r["e2"]))
    return [Quintuple(id=f"{r['category'].replace(' ', '_')}-{i:04d}", **r) for i, r in enumerate(rows)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=None, help="sample this many quintuples (default: every pair)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(BUNDLED / "corpus.jsonl"))
    args = ap.parse_args(argv)
    facts = load_facts()
    quints = build_corpus(args.n, args.seed, facts=facts)
    write_quintuples(args.out, quints)
    write_json(BUNDLED / "property_phrases.json", phrases(facts))
    for p in (Path(args.out), BUNDLED / "property_phrases.json"):  # package data: readable by all
        p.chmod(0o644)
    print(f"wrote {len(quints)} quintuples to {args.out} ({sum(q.same for q in quints)} with v1 = v2)")


if __name__ == "__main__":
    main()
