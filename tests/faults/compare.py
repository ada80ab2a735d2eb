"""Comparing two runs' artifacts: what must be identical, and what is ignored and why.

IGNORED (never the result of the computation, always different between two runs):
  * wall-clock numbers: keys ending in ``_s``/``_seconds`` or named ``fit_s``/``train_seconds``/``fit_seconds``
    (timings), ``*time*``/``started``/``finished`` (timestamps);
  * per-process bookkeeping: ``steps_this_session``, ``resumed_from`` (say whether/where *this* process resumed),
    ``prompts_decoded_now``, ``shards_decoded``, ``shards_skipped`` (how much of the generation *this* process did),
    ``_LOCK.json`` (holder pid/host), ``_STARTED.json`` (a marker of the attempt, the fingerprint is in _DONE),
    ``report/timings.json`` (seconds per stage);
  * log folders: ``logs/``, ``lightning_logs/``, ``wandb/``, ``.hydra/``, ``*.log`` (timestamps, pids, paths);
  * ``checkpoints/`` (removed once a stage is done; left over only by a killed run, where they are its resume
    state) and ``*.damaged`` / ``.*.tmp`` files (quarantined damage and a killed writer's temporary file);
  * plots (``*.png``: matplotlib embeds no timestamp but its rasteriser output is not part of the contract);
  * absolute paths of the two run folders, which differ by construction (replaced by ``<run>``).
Everything else (tables, weights, configs, reports, markers' summaries) must match byte for byte, numbers exactly.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

IGNORED_KEYS = {"fit_s", "fit_seconds", "train_seconds", "steps_this_session", "resumed_from", "seconds",
                "elapsed_s", "wall_s", "prompts_decoded_now", "shards_decoded", "shards_skipped"}
IGNORED_PARTS = {"logs", "lightning_logs", "wandb", ".hydra", "checkpoints", "epochs"}
IGNORED_NAMES = {"_LOCK.json", "_STARTED.json", ".i2d2.lock", "timings.json"}
IGNORED_SUFFIXES = (".png", ".log", ".damaged", ".tmp", ".integrity.json", ".prev")


def ignored_key(key: str) -> bool:
    return key in IGNORED_KEYS or key.endswith("_seconds") or key.endswith("_s") or "time" in key


def assert_same_numbers(a, b, ignore=frozenset(), where="") -> None:
    """Recursive equality of two summaries: numbers exactly (NaN == NaN), ignoring ``ignore`` and timing keys."""
    if isinstance(a, dict) and isinstance(b, dict):
        keys = {k for k in set(a) | set(b) if k not in ignore and not ignored_key(str(k))}
        for k in sorted(keys, key=str):
            assert k in a and k in b, f"{where}.{k}: present in one run only"
            assert_same_numbers(a[k], b[k], ignore, f"{where}.{k}")
    elif isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        assert len(a) == len(b), f"{where}: {len(a)} vs {len(b)} items"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_numbers(x, y, ignore, f"{where}[{i}]")
    elif isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def compared_files(run_dir: Path) -> dict[str, Path]:
    """Every artifact of a run that must be reproduced, by path relative to the run folder."""
    out = {}
    for p in sorted(Path(run_dir).rglob("*")):
        rel = p.relative_to(run_dir)
        if not p.is_file() or IGNORED_PARTS & set(rel.parts) or p.name in IGNORED_NAMES:
            continue
        if p.name.endswith(IGNORED_SUFFIXES) or p.name.startswith("."):
            continue
        out[rel.as_posix()] = p
    return out


def _normalised(path: Path, run_dir: Path) -> bytes:
    data = path.read_bytes()
    if path.suffix in (".json", ".jsonl", ".md", ".txt", ".yaml", ".csv", ".tsv"):
        text = data.decode("utf-8").replace(str(Path(run_dir).resolve()), "<run>").replace(str(run_dir), "<run>")
        if path.suffix == ".json":
            import json

            obj = json.loads(text)
            if path.name == "_DONE.json":  # its file hashes cover files with timings; the files are compared
                obj.pop("outputs", None)
            return json.dumps(_drop_ignored(obj), sort_keys=True).encode()
        if path.suffix == ".md":  # reports print timings
            text = re.sub(r"\d+(\.\d+)? ?(s|seconds|min)\b", "<t>", text)
        return text.encode()
    return data


def _drop_ignored(obj):
    if isinstance(obj, dict):
        return {k: _drop_ignored(v) for k, v in obj.items() if not ignored_key(str(k))}
    if isinstance(obj, list):
        return [_drop_ignored(v) for v in obj]
    return obj


def differences(ref_dir: Path, run_dir: Path) -> list[str]:
    """What differs between two runs' artifacts (empty: identical up to the ignored parts listed above)."""
    a, b = compared_files(ref_dir), compared_files(run_dir)
    diffs = [f"only in reference: {k}" for k in sorted(set(a) - set(b))]
    diffs += [f"only in rerun: {k}" for k in sorted(set(b) - set(a))]
    for k in sorted(set(a) & set(b)):
        if _normalised(a[k], ref_dir) != _normalised(b[k], run_dir):
            diffs.append(f"differs: {k}")
    return diffs
