"""Annotation round-trip: sample generations for people to label, read their labels back, accumulate them.

1. ``export_for_annotation(rows, out_path, k_per_concept=4)`` picks k statements per concept, stratified by
   critic score (one from each score quantile, so labels cover confident and doubtful statements alike),
   and writes a CSV (spreadsheets, crowd platforms) or JSONL file with an empty ``label`` column plus a
   short instructions file next to it.
2. A person fills ``label`` with one of true / false / don't know / garbled (I2D2's four choices) — or the
   6-way NeuroComparatives labels, or several annotators' labels in ``votes`` (``a|b|c``).
3. ``import_annotations(path, store_path=...)`` validates the labels (unknown ones reported with file:line)
   and merges them into the run's labels store (``{run_dir}/annotations/labels.jsonl``), de-duplicated by
   statement (the newer label wins). The next critic trains on the seed set plus the store
   (``critic_annotation_paths``).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np

from i2d2.labels import aggregate_votes, label_mapping, normalize_label, normalize_statement, parse_votes, \
    resolve_annotation_path
from i2d2.io import DataError, open_text, read_csv, read_jsonl, write_csv, write_jsonl, write_text
from i2d2.metrics import wilson_interval

log = logging.getLogger(__name__)

EXPORT_COLUMNS = ["item_id", "concept", "statement", "label", "votes", "prompt", "critic_score", "source"]
STORE_NAME = "annotations/labels.jsonl"

INSTRUCTIONS = """\
# Labelling instructions

Each row is a statement a language model wrote. Judge it against the annotation guide that ships with the
framework (i2d2/data/annotations/GUIDE.md) and write one label in the `label` column:

- `true`      - a complete statement that is true in general about the kind (exceptions are fine: "birds can fly").
- `false`     - a complete claim that is false or unreasonable in general.
- `vague`     - nothing specific to check or learn (empty, tautological, hedged into nothing).
- `episodic`  - about a particular situation, event, person, place or instance, not the kind.
- `ad_copy`   - advertising, promotion or opinion rather than a fact.
- `garbled`   - ungrammatical, cut off, repeated words, or makes no sense.
- `dont_know` - it reads like a fact, but you cannot tell whether it is true without looking it up.

The paper's four labels (true / false / don't know / garbled, "Huh???") are accepted too. Several annotators:
put their labels in `votes` separated by `|` (e.g. `true|true|false`) and leave `label` empty; the majority
label is used. Leave a row's `label` and `votes` empty to skip it. Do not edit `item_id` or `statement`.
"""

HELDOUT_STORE = "annotations/heldout_labels.jsonl"
BLIND_COLUMNS = ["item_id", "statement", "label", "votes"]
KEY_FIELDS = ("item_id", "statement", "iterations")  # a blind_key.jsonl row (concept may be empty)


def labels_store(run_dir: str | Path) -> Path:
    """Where a run accumulates imported labels across iterations."""
    return Path(run_dir) / STORE_NAME


def critic_annotation_paths(seed_annotations: Iterable[str | Path] = ("generics_gemma.jsonl",),
                            run_dir: str | Path | None = None) -> list[Path]:
    """Files the next critic trains on: the seed set(s), then the run's labels store if it exists (later wins)."""
    paths = [resolve_annotation_path(p) for p in seed_annotations]
    if run_dir is not None and labels_store(run_dir).exists():
        paths.append(labels_store(run_dir))
    return paths


def _stratified_pick(scores: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """One random index from each of ``k`` equal-size score quantile bins (all indices if n <= k)."""
    n = len(scores)
    if n <= k:
        return np.arange(n)
    order = np.argsort(scores, kind="stable")
    return np.array([rng.choice(b) for b in np.array_split(order, k)])


def _labels_of(row: Mapping) -> tuple[str, list[str]]:
    """(label, sorted votes) of an export's or a store's row, as the import normalises them."""
    raw = str(row.get("label") or "").strip()
    return normalize_label(raw) if raw else "", sorted(normalize_label(v) for v in parse_votes(row.get("votes")))


def _same_file(a, b) -> bool:
    try:
        return Path(a).resolve() == Path(b).resolve()
    except (OSError, RuntimeError, TypeError, ValueError):
        return False


def _stored_labels(stored: Iterable[Mapping | str], source: str | Path | None = None) -> dict[str, tuple | None]:
    """normalised statement -> its (label, votes) for a labels store's rows; None for a bare statement (label unknown)
    and, with ``source``, for a row imported from another file than ``source`` (a newer label that superseded the
    file's: the file's own was imported, or is not the store's to keep)."""
    return {normalize_statement(s["statement"] if isinstance(s, Mapping) else s):
            _labels_of(s) if isinstance(s, Mapping) and (source is None or not s.get("imported_from")
                                                         or _same_file(s["imported_from"], source)) else None
            for s in stored}


def _not_imported(rows: Iterable[Mapping], stored: Iterable[Mapping | str],
                  source: str | Path | None = None) -> list[Mapping]:
    """The rows of an export that carry a label or votes the store does not hold: a statement not in ``stored`` (the
    store's rows, or bare statements), or one stored from this file (``source``) with other labels (a label corrected
    after its import, which a second export over the file wiped unseen). A statement the store holds as imported from
    another file counts as imported: a later import of another file superseded it (newer label wins), and asking to
    import this file again would bring the old label back."""
    held = _stored_labels(stored, source)
    out = []
    for r in rows:
        if not (str(r.get("label") or "").strip() or str(r.get("votes") or "").strip()):
            continue
        key = normalize_statement(r["statement"])
        try:
            differs = key not in held or (held[key] is not None and _labels_of(r) != held[key])
        except ValueError:  # votes that do not parse were never imported as they are
            differs = True
        if differs:
            out.append(r)
    return out


def labels_not_imported(path: str | Path, store_path: str | Path) -> int:
    """How many labels an export file (``filtered/to_label.csv``, labelled where it lies) holds that the labels store
    ``store_path`` does not; 0 for a file that is no export."""
    path = Path(path)
    try:
        rows = (read_csv(path, required=("item_id", "statement", "label")) if path.suffix.lower() == ".csv"
                else read_jsonl(path, required=("item_id", "statement")))
    except (DataError, OSError):
        return 0
    stored = read_jsonl(store_path, required=("statement",)) if Path(store_path).exists() else []
    return len(_not_imported(rows, stored, path))


def check_export_target(out_path: str | Path, stored: Iterable[Mapping | str] = ()) -> None:
    """An export writes ``out_path`` only where that loses nothing: a file that does not exist or is empty, an
    earlier export nobody has labelled yet, or one whose labels are all in the labels store already, as they stand
    in the file (``stored``: the store's rows; imported, as the blind round does once an iteration). Exporting twice over a file
    being labelled wiped its labels, and ``--out`` naming the input (``kept.jsonl``) or a labels store replaced it
    with the sample; a DataError names the file instead."""
    out_path = Path(out_path)
    if not out_path.exists() or (out_path.is_file() and out_path.stat().st_size == 0):
        return
    try:
        rows = (read_csv(out_path, required=("item_id", "statement", "label")) if out_path.suffix.lower() == ".csv"
                else read_jsonl(out_path, required=("item_id", "statement")))  # required: non-empty; a label is empty
        if any("label" not in r for r in rows):
            raise DataError("not an export")
    except (DataError, OSError):
        raise DataError(f"--out {out_path} exists and is not an export of statements to label: an export would "
                        "replace it; choose another file") from None
    not_imported = _not_imported(rows, stored, out_path)
    if not_imported:
        raise DataError(f"--out {out_path} holds {len(not_imported)} label(s) not in the labels store (or stored "
                        "otherwise: changed after the import): an export would write over them; import it first "
                        "(`python -m i2d2.annotate import`), or choose another --out")


def export_for_annotation(rows: Sequence[dict], out_path: str | Path, k_per_concept: int = 4,
                          text_key: str = "statement", concept_key: str = "concept", score_key: str = "critic_score",
                          seed: int = 0, exclude: Iterable[Mapping | str] = (), fmt: str | None = None) -> list[dict]:
    """Write a sample of ``rows`` to label: ``k_per_concept`` statements per concept, stratified by score.

    ``rows`` need ``text_key`` and ``concept_key``; the pick is one statement per score quantile among a concept's
    rows with a ``score_key``, uniform among its rows where none has one. Statements in ``exclude`` (already labelled:
    the labels store's rows, or bare statements) and duplicates are skipped. ``fmt`` is 'csv' or 'jsonl' (default: from the suffix). Returns the exported rows.
    """
    out_path, exclude = Path(out_path), list(exclude)
    check_export_target(out_path, exclude)
    fmt = fmt or ("csv" if out_path.suffix.lower() == ".csv" else "jsonl")
    seen = set(_stored_labels(exclude))
    by_concept: dict[str, list[dict]] = {}
    for i, row in enumerate(rows):
        if row.get(score_key) is not None:
            try:
                float(row[score_key])
            except (TypeError, ValueError):
                raise DataError(f"row {i + 1}: {score_key} {row[score_key]!r} is not a number") from None
        if text_key not in row or concept_key not in row:
            raise DataError(f"row {i + 1}: needs fields {text_key!r} and {concept_key!r}, has {sorted(row)}")
        key = normalize_statement(row[text_key])
        if not key or key in seen:
            continue
        seen.add(key)
        by_concept.setdefault(str(row[concept_key]), []).append(row)
    rng = np.random.default_rng(seed)
    out = []
    for concept in sorted(by_concept):
        cands = by_concept[concept]
        # rows without a score never reached the critic (e.g. unfinished sentences the filter drops first, which
        # the critic does not train on): a concept's scored rows are sampled, the others only where none is scored
        scored = [r for r in cands if r.get(score_key) is not None]
        if scored:
            cands = scored
            picks = _stratified_pick(np.array([float(r[score_key]) for r in cands]), k_per_concept, rng)
        else:
            picks = rng.permutation(len(cands))[:k_per_concept]
        for j in sorted(picks.tolist()):
            r = cands[j]
            out.append({
                "item_id": f"{len(out):06d}", "concept": concept, "statement": str(r[text_key]).strip(),
                "label": "", "votes": "", "prompt": r.get("prompt", ""),
                "critic_score": None if r.get(score_key) is None else float(r[score_key]),
                "source": r.get("source") or r.get("prompt_id", ""),
            })
    if fmt == "csv":
        write_csv(out_path, out, EXPORT_COLUMNS)
    elif fmt == "jsonl":
        write_jsonl(out_path, out)
    else:
        raise ValueError(f"fmt must be 'csv' or 'jsonl', not {fmt!r}")
    write_text(out_path.with_name(out_path.stem + ".instructions.md"), INSTRUCTIONS)
    log.info("exported %d statements over %d concepts to %s", len(out), len(by_concept), out_path)
    return out


def _read_labelled(path: Path, required=("statement", "concept"), one_of=("label", "votes")) -> list[tuple[int, dict]]:
    """The rows of a labelled export (a CSV's header holds the ``required`` columns and one of ``one_of``). A CSV
    without a label or votes column (a file of statements, not of labels) and a file with no row at all were
    imported as 0 labels, exit code 0."""
    if path.suffix.lower() == ".csv":
        out = [(r.pop("_line"), r) for r in read_csv(path, required=required, one_of=one_of)]
        if not out:
            raise DataError(f"{path}: no rows below the header")
        return out
    out = []
    with open_text(path) as f:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                try:
                    row = json.loads(line)
                    if not isinstance(row, dict):
                        raise ValueError("expected a JSON object")
                except ValueError as e:
                    raise DataError(f"{path}:{lineno}: broken row ({e})") from None
                out.append((lineno, row))
    if not out:
        raise DataError(f"{path}: no rows (an empty file)")
    # the JSONL twin of the CSV header check: a file of statements (an export, or generations) has no row with a
    # label or votes key, and was imported as 0 labelled statements, exit code 0; an export labelled in part
    # (keys present, some values empty) still imports its labelled rows
    if one_of and not any(k in row for _, row in out for k in one_of):
        raise DataError(f"{path}: no row has a {' or '.join(repr(k) for k in one_of)} key "
                        f"(a file of statements, not of labels?)")
    return out


def import_annotations(path: str | Path, store_path: str | Path | None = None, label_map: Mapping | None = None,
                       on_error: str = "raise", errors: list | None = None, iteration: int | None = None) -> list[dict]:
    """Read a labelled export back; return the labelled rows and merge them into ``store_path`` if given.

    Labels are normalised (``"Don't Know"`` -> ``dont_know``) and must be known to ``label_map``; an unknown
    label or a broken row raises ``DataError('file:line: ...')`` or, with ``on_error='skip'``, is appended to
    ``errors``. Rows with neither label nor votes are unlabelled and skipped. Every other column comes back
    unchanged (``critic_score`` as a float).
    """
    path = Path(path)
    _refuse_blind_export(path)
    out = _checked_labels(path, _read_labelled(path), label_map, on_error, errors)
    for rec in out:
        if iteration is not None:
            rec["iteration"] = iteration
    if store_path is not None:
        merge_labels(store_path, out)
    return out


def _refuse_blind_export(path: Path) -> None:
    """A labelled ``export --blind`` file (item_id, statement, label, votes: no concept) given to the plain import
    failed on its missing concept column ("header lacks column(s) concept"), with no word of ``--blind``."""
    try:
        rows = _read_labelled(path, required=(), one_of=())
    except DataError:
        return  # not readable as rows: the import's own read says why
    keys = {k for _, row in rows for k in row}
    if "item_id" in keys and "concept" not in keys:
        raise DataError(f"{path}: a blind export (item_id, statement, label; no concept column): import it with "
                        f"`python -m i2d2.annotate import --blind --run-dir <the run it was exported from> "
                        f"--input {path}`")


def _checked_labels(path: Path, rows: Iterable[tuple[int, dict]], label_map: Mapping | None, on_error: str,
                    errors: list | None) -> list[dict]:
    """The labelled rows of ``(line, row)`` pairs read from ``path``, validated (errors name ``path:line``)."""
    known = label_mapping(label_map)
    out, unlabelled, first = [], 0, {}
    for lineno, row in rows:
        try:
            statement = str(row.get("statement") or "").strip()
            if not statement or not str(row.get("concept") or "").strip():
                raise ValueError("missing 'statement' or 'concept'")
            votes = parse_votes(row.get("votes"))
            raw = row.get("label")
            if (raw is None or str(raw).strip() == "") and not votes:
                unlabelled += 1
                continue
            label = normalize_label(raw) if raw is not None and str(raw).strip() else ""
            bad = [v for v in ([label] if label else []) + [normalize_label(v) for v in votes] if v not in known]
            if bad:
                raise ValueError(f"unknown label(s) {bad}; known: {sorted(known)}")
            score = None if row.get("critic_score") in (None, "") else float(row["critic_score"])
            # one statement labelled twice in one file (two annotators' files pasted together): the store keeps
            # one row, so a differing label would be dropped unseen; several annotators belong in `votes`
            key, labels = normalize_statement(statement), (label, sorted(normalize_label(v) for v in votes))
            if key in first:
                if first[key][1] != labels:
                    said = [lab or "|".join(vs) for lab, vs in (first[key][1], labels)]
                    raise ValueError(f"statement labelled again, differently: line {first[key][0]} says {said[0]!r}, "
                                     f"this line {said[1]!r} (several annotators: put their labels in 'votes')")
                continue  # the same labels again: one statement
            first[key] = (lineno, labels)
        except ValueError as e:
            msg = f"{path}:{lineno}: {e}"
            if on_error == "raise":
                raise DataError(msg) from None
            if errors is not None:
                errors.append(msg)
            continue
        rec = dict(row)
        rec.update(statement=statement, label=label, votes=[normalize_label(v) for v in votes])
        rec["critic_score"] = score  # a non-number fails above, naming path:line
        rec["imported_from"] = str(path)
        out.append(rec)
    log.info("imported %d labelled statements from %s (%d unlabelled skipped)", len(out), path, unlabelled)
    return out


STORE_LOCK_TIMEOUT_S = 600  # how long an import waits for another import into the same labels store


def merge_labels(store_path: str | Path, new_rows: Sequence[dict]) -> dict:
    """Merge labelled rows into the JSONL store, de-duplicated by statement (newer label wins); atomic."""
    import filelock

    store_path = Path(store_path)
    store_path.parent.mkdir(parents=True, exist_ok=True)
    # a read-modify-write: two annotators importing at once would each write the store without the other's labels,
    # so the second waits for the first (flock: released by the kernel if the holder dies)
    with filelock.FileLock(store_path.parent / f".{store_path.name}.lock", timeout=STORE_LOCK_TIMEOUT_S):
        old = read_jsonl(store_path, required=("statement",)) if store_path.exists() else []  # file:line, not KeyError
        merged: dict[str, dict] = {normalize_statement(r["statement"]): r for r in old}
        n_updated = 0
        for r in new_rows:
            key = normalize_statement(r["statement"])
            if key in merged:
                n_updated += 1
                del merged[key]
            merged[key] = r
        write_jsonl(store_path, merged.values())
    stats = {"n_total": len(merged), "n_new": len(new_rows) - n_updated, "n_updated": n_updated}
    log.info("labels store %s: %s", store_path, stats)
    return stats


# ----------------------------------------------------------------------------- blind per-iteration evaluation

def heldout_store(run_dir: str | Path) -> Path:
    """Labels of the fixed held-out concepts' generations: evaluation only, never read by a critic."""
    return Path(run_dir) / HELDOUT_STORE


def heldout_statements(run_dir: str | Path) -> list[dict]:
    """Every iteration's held-out generations (``iter_k/heldout/statements.jsonl``), with ``iteration``."""
    found = [(int(p.parent.parent.name[5:]), p) for p in Path(run_dir).glob("iter_*/heldout/statements.jsonl")
             if p.parent.parent.name[5:].isdigit()]  # iter_0.bak and the like are not iterations
    return [{**r, "iteration": k} for k, p in sorted(found) for r in read_jsonl(p)]


def _drawn_for(key_rows: Iterable[Mapping]) -> dict[str, set[int]]:
    """normalised statement -> the iterations whose blind sample drew it, over every row of a blind key."""
    drawn: dict[str, set[int]] = {}
    for r in key_rows:
        drawn.setdefault(normalize_statement(r["statement"]), set()).update(int(k) for k in r.get("iterations") or [])
    return drawn


def export_blind(run_dir: str | Path, out_path: str | Path, n_per_iteration: int = 40, seed: int = 0) -> list[dict]:
    """A shuffled sample of every iteration's held-out generations for a person to judge, blind.

    ``n_per_iteration`` distinct statements are drawn at random from each iteration, among those not yet labelled
    for it; a drawn statement that is labelled already (drawn for another iteration) is recorded as drawn for this
    one too and not exported again. The export holds only ``item_id, statement, label``: no score, iteration,
    concept or order that could tell iterations apart; ``item_id`` is a hash. The key that maps items back to the
    iterations that drew them is written next to the store (``annotations/blind_key.jsonl``): an iteration's
    accuracy counts the statements its own draws picked (``heldout_accuracy``), a random sample of it, not those
    another iteration's draw happened to share with it.
    """
    import hashlib

    run_dir, out_path = Path(run_dir), Path(out_path)
    store = heldout_store(run_dir)
    stored = read_jsonl(store, required=("statement",)) if store.exists() else []
    done = {normalize_statement(r["statement"]) for r in stored}
    check_export_target(out_path, stored)  # before the key is written
    rows = heldout_statements(run_dir)
    if not rows:
        raise DataError(f"no held-out generations under {run_dir}/iter_*/heldout/ (run an iteration first)")
    key_path = Path(run_dir) / "annotations" / "blind_key.jsonl"
    old = {r["item_id"]: r for r in read_jsonl(key_path, required=KEY_FIELDS)} if key_path.exists() else {}
    drawn = _drawn_for(old.values())
    rng = np.random.default_rng(seed)
    by_iter: dict[int, dict[str, dict]] = {}  # distinct statements of each iteration, in order
    for r in rows:
        by_iter.setdefault(int(r["iteration"]), {}).setdefault(normalize_statement(r["statement"]), r)
    items: dict[str, dict] = {}
    n_recorded = 0
    for k in sorted(by_iter):
        # a label with no key row (put into the store by hand) counts for every iteration already: drawing it
        # recorded nothing, took a slot of every export and was logged as "recorded"
        cands = [(key, r) for key, r in by_iter[k].items()
                 if not (key in done and (key not in drawn or k in drawn[key]))]
        for i in rng.permutation(len(cands))[:n_per_iteration].tolist():
            key, r = cands[i]
            if key in done:  # labelled already, for another iteration's draw: now drawn for this one too
                for row in old.values():
                    if normalize_statement(row["statement"]) == key:
                        row["iterations"] = sorted(set(row["iterations"]) | {k})
                n_recorded += 1
                continue
            item = items.setdefault(key, {"statement": r["statement"], "concept": r.get("concept", ""),
                                          "iterations": []})
            item["iterations"] = sorted(set(item["iterations"]) | {k})
    salt = f"{seed}:{len(rows)}"
    for key, item in items.items():
        item["item_id"] = hashlib.sha1(f"{salt}:{key}".encode()).hexdigest()[:12]
    order = rng.permutation(len(items)).tolist()
    shuffled = [list(items.values())[i] for i in order]
    blind = [{"item_id": it["item_id"], "statement": it["statement"], "label": "", "votes": ""} for it in shuffled]
    # the key first: a kill between the two writes left an export whose items no key held (its labels could never
    # be imported, and a second export refuses to write over them); a key holding items never exported is harmless
    for it in shuffled:
        prev = old.get(it["item_id"])
        old[it["item_id"]] = it if prev is None else {**it, "iterations": sorted(set(prev["iterations"]) | set(it["iterations"]))}
    write_jsonl(key_path, old.values())
    if out_path.suffix.lower() == ".csv":
        write_csv(out_path, blind, BLIND_COLUMNS)
    else:  # JSONL by suffix, as export_for_annotation: CSV text in a .jsonl file failed import_blind as broken rows
        write_jsonl(out_path, blind)
    write_text(out_path.with_name(out_path.stem + ".instructions.md"), INSTRUCTIONS)
    log.info("blind export: %d statements from %d iterations -> %s (key: %s)%s", len(shuffled), len(by_iter),
             out_path, key_path, f"; {n_recorded} drawn statement(s) labelled already, recorded for their iteration"
             if n_recorded else "")
    return shuffled


def import_blind(path: str | Path, run_dir: str | Path, on_error: str = "raise", errors: list | None = None) -> list[dict]:
    """Read a labelled blind export back, map each item to its iterations through the key, and merge the
    labels into the held-out store (``annotations/heldout_labels.jsonl``)."""
    key_path = Path(run_dir) / "annotations" / "blind_key.jsonl"
    if not key_path.exists():
        raise FileNotFoundError(f"{key_path} not found: export with `annotate export --blind --run-dir {run_dir}` first")
    key = {r["item_id"]: r for r in read_jsonl(key_path, required=KEY_FIELDS)}
    path = Path(path)
    raw = _read_labelled(path, required=("item_id", "label"), one_of=())
    rows, unknown = [], []
    for lineno, row in raw:
        item = key.get(str(row.get("item_id", "")).strip())
        if item is None:
            unknown.append(f"{path}:{lineno}: item_id {row.get('item_id')!r} is not in {key_path}")
        else:
            rows.append((lineno, {**row, "concept": item["concept"], "statement": item["statement"]}))
    if unknown and on_error == "raise":
        raise DataError(unknown[0])
    if errors is not None:
        errors.extend(unknown)
    labelled = _checked_labels(path, rows, None, on_error, errors)
    for r in labelled:
        r["iterations"] = key[str(r["item_id"]).strip()]["iterations"]
    merge_labels(heldout_store(run_dir), labelled)
    return labelled


def heldout_accuracy(run_dir: str | Path, label_map: Mapping | None = None, by: str | None = None) -> list[dict]:
    """Person-judged accuracy of each iteration's held-out generations (labels from the held-out store):
    ``[{iteration, n_generations, n_labelled, accuracy, ci95_low, ci95_high}]`` (a 95 % Wilson interval, which
    stays honest at an accuracy near 0 or 1 on few labels); accuracy and interval are None with no labels.
    ``by``: a field of the held-out rows (``form``: the prompt form) to break each iteration down by; each row then
    also carries that field's value."""
    store = heldout_store(run_dir)
    mapping = label_mapping(label_map)
    # which iterations drew each statement (export_blind's key): an iteration counts the labels of its own draws, a
    # random sample of it; a statement another iteration drew and this one shares is not (the sample over-weighted
    # what two iterations share, and n counted it). Labels with no key (put into the store by hand) count everywhere.
    key_path = Path(run_dir) / "annotations" / "blind_key.jsonl"
    drawn = _drawn_for(read_jsonl(key_path, required=KEY_FIELDS)) if key_path.exists() else {}
    labels = {}
    if store.exists():
        for r in read_jsonl(store, required=("statement",)):
            # a row's label, else its annotators' majority (no majority: not counted)
            y = mapping.get(normalize_label(r.get("label") or "") or aggregate_votes(r.get("votes") or []) or "")
            if y is not None:
                labels[normalize_statement(r["statement"])] = int(y)
    judged: dict[tuple, dict[str, int]] = {}
    counts: dict[tuple, int] = {}
    for r in heldout_statements(run_dir):
        group = (int(r["iteration"]),) + ((str(r.get(by) or "–"),) if by else ())
        counts[group] = counts.get(group, 0) + 1
        key = normalize_statement(r["statement"])
        y = labels.get(key)
        if y is not None and (key not in drawn or group[0] in drawn[key]):
            # once per statement, as it was drawn (export_blind draws distinct ones): a statement generated twice
            # counted twice, n_labelled exceeded the labels and the interval was narrower than they support
            judged.setdefault(group, {})[key] = y
    out = []
    for group in sorted(counts):
        ys = np.asarray(list(judged.get(group, {}).values()), dtype=float)
        acc = float(ys.mean()) if len(ys) else None
        lo, hi = wilson_interval(int(ys.sum()), len(ys)) or (None, None)
        out.append({"iteration": group[0], **({by: group[1]} if by else {}), "n_generations": counts[group],
                    "n_labelled": int(len(ys)), "accuracy": acc, "ci95_low": lo, "ci95_high": hi})
    return out
