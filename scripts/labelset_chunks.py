"""The labelling round of the bundled label sets, shared by scripts/make_generics_labelset.py and
scripts/make_comparatives_labelset.py: ``<out>/to_label.jsonl`` split into ``<out>/chunks/chunk_<c>.jsonl`` (id
and statement only: the labeller sees no score, form or prompt kind), labelled into ``chunk_<c>.labels.jsonl``
(``{"id", "label"}`` rows), and read back."""

from __future__ import annotations

from pathlib import Path


def write_chunks(out: Path, items: list[dict], n_chunks: int) -> None:
    """``items`` as ``out/to_label.jsonl`` and, split into ``n_chunks`` files of ids and statements, ``out/chunks/``."""
    from i2d2.io import write_jsonl

    write_jsonl(out / "to_label.jsonl", items)
    size = -(-len(items) // n_chunks)
    for c in range(n_chunks):
        write_jsonl(out / "chunks" / f"chunk_{c}.jsonl",
                    [{"id": i, "statement": items[i]["statement"]} for i in range(c * size, min(len(items), (c + 1) * size))])


def labelled_items(out: Path) -> list[tuple[dict, str]]:
    """Each row of ``out/to_label.jsonl`` with its label from ``out/chunks/chunk_*.labels.jsonl``; SystemExit naming
    ``out`` and the first unlabelled ids while any row has none."""
    from i2d2.io import read_jsonl

    items = read_jsonl(out / "to_label.jsonl")
    labels = {int(r["id"]): r["label"] for p in sorted((out / "chunks").glob("chunk_*.labels.jsonl"))
              for r in read_jsonl(p)}
    missing = [i for i in range(len(items)) if i not in labels]
    if missing:
        raise SystemExit(f"{out}: {len(missing)} statements have no label yet (first ids: {missing[:10]})")
    return [(r, labels[i]) for i, r in enumerate(items)]
