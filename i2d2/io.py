"""Data I/O shared by every stage: atomic writes, validated readers, stage fingerprints.

Every stage reads the previous stage's files and writes its own. Writes go to a temporary file in
the same directory and are renamed into place, so a killed run never leaves a half-written file that
a restart would take for finished work.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import shutil
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator


class DataError(ValueError):
    """Bad input, with the file and line (or field) it came from."""


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success rename it over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # A unique name created with open(): unlike mkstemp, the file gets the user's umask permissions.
    tmp = path.parent / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    open(tmp, "x").close()
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary directory next to ``path``; on success it replaces ``path`` (an old one is moved aside
    and removed only after the rename), so a reader never sees a half-written folder."""
    import shutil

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    tmp.mkdir()
    try:
        yield tmp
        old = None
        if path.exists():
            old = path.parent / f".{path.name}.{uuid.uuid4().hex[:8]}.old"
            os.replace(path, old)
        os.replace(tmp, path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_text(path: str | os.PathLike, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def write_json(path: str | os.PathLike, obj: Any) -> Path:
    return write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def write_jsonl(path: str | os.PathLike, rows: Iterable[dict]) -> Path:
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False, default=_json_default) + "\n")
    return Path(path)


def _json_default(o):
    if hasattr(o, "item"):  # numpy / torch scalars
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    return str(o)


def load_state_dict(path: str | os.PathLike) -> dict:
    """The ``state_dict`` of a Lightning / DeepSpeed checkpoint, read with ``weights_only=True``: tensors and plain
    containers only, so a run folder can never make us execute pickled code. Anything else fails naming the file."""
    import pickle

    import torch

    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError) as e:
        raise DataError(f"{path}: not a loadable weights-only checkpoint ({str(e).splitlines()[0]})") from None
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        raise DataError(f"{path}: checkpoint has no 'state_dict'")
    return ckpt["state_dict"]


def read_json(path: str | os.PathLike):
    """Parse a JSON file; a syntax error raises DataError naming file:line."""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise DataError(f"{path}:{e.lineno}: invalid JSON ({e.msg})") from None


def iter_jsonl(path: str | os.PathLike) -> Iterator[tuple[int, dict | None, str | None]]:
    """``(line number, object, None)`` for each good line, ``(line number, None, problem)`` for a bad one."""
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as e:
                yield lineno, None, str(e)
                continue
            yield (lineno, row, None) if isinstance(row, dict) else (lineno, None, "expected a JSON object")


def read_jsonl(path: str | os.PathLike, required: Iterable[str] = (), on_error: str = "raise",
               errors: list | None = None) -> list[dict]:
    """Read JSON lines; a broken line or a missing required field raises DataError naming file:line.

    ``on_error='skip'`` skips bad lines instead and appends their messages to ``errors``.
    """
    path = Path(path)
    rows = []
    for lineno, row, problem in iter_jsonl(path):
        if problem is None:
            missing = [k for k in required if k not in row or row[k] in (None, "")]
            problem = f"missing field(s) {', '.join(missing)}" if missing else None
        if problem is not None:
            msg = f"{path}:{lineno}: {problem}"
            if on_error == "raise":
                raise DataError(msg)
            if errors is not None:
                errors.append(msg)
            continue
        rows.append(row)
    return rows


def read_csv(path: str | os.PathLike, required: Iterable[str] = ()) -> list[dict]:
    path = Path(path)
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [k for k in required if k not in (reader.fieldnames or [])]
        if missing:
            raise DataError(f"{path}:1: header lacks column(s) {', '.join(missing)}")
        return [dict(r, _line=i) for i, r in enumerate(reader, 2)]


def write_csv(path: str | os.PathLike, rows: list[dict], columns: list[str] | None = None) -> Path:
    columns = columns or (list(rows[0]) if rows else [])
    with atomic_path(path) as tmp, open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    return Path(path)


# ----------------------------------------------------------------------------- stage bookkeeping

def fingerprint(*parts: Any) -> str:
    """A stable hash of configs (dicts, strings) and input files (Path objects hash their content)."""
    h = hashlib.sha256()
    for p in parts:
        if isinstance(p, Path):
            if p.is_dir():
                for q in sorted(p.rglob("*")):
                    if q.is_file() and not q.name.startswith("."):
                        h.update(str(q.relative_to(p)).encode())
                        h.update(_file_digest(q).encode())
            elif p.exists():
                h.update(_file_digest(p).encode())
            else:
                h.update(b"<missing>")
        else:
            h.update(json.dumps(p, sort_keys=True, default=str).encode())
        h.update(b"\x00")
    return h.hexdigest()[:16]


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


DONE = "_DONE.json"
STARTED = "_STARTED.json"


def stage_done(out_dir: str | os.PathLike, fp: str) -> dict | None:
    """The summary a finished stage left in ``out_dir``, if it finished with the same fingerprint."""
    marker = Path(out_dir) / DONE
    if marker.exists():
        info = json.loads(marker.read_text())
        if info.get("fingerprint") == fp:
            return info.get("summary", {})
    return None


def mark_done(out_dir: str | os.PathLike, fp: str, summary: dict | None = None) -> None:
    write_json(Path(out_dir) / DONE, {"fingerprint": fp, "summary": summary or {}})


def run_stage(out_dir: str | os.PathLike, fp: str, fn: Callable[[Path], dict | None], name: str = "") -> dict:
    """Run ``fn(out_dir)`` unless ``out_dir`` already holds a finished run with fingerprint ``fp``.

    A stage whose inputs or config changed gets a new fingerprint and is redone; ``fn`` itself is
    responsible for resuming from finished units (shards, checkpoints) inside ``out_dir``.
    """
    import logging

    out_dir = Path(out_dir)
    done = stage_done(out_dir, fp)
    if done is not None:
        logging.getLogger(__name__).info("stage %s: already finished in %s, skipping", name or out_dir.name, out_dir)
        return done
    started = out_dir / STARTED
    if started.exists() and json.loads(started.read_text()).get("fingerprint") != fp:
        # Finished or partial work from other inputs/config is stale: start the stage afresh.
        logging.getLogger(__name__).info("stage %s: inputs changed, redoing it", name or out_dir.name)
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(started, {"fingerprint": fp})
    summary = fn(out_dir) or {}
    mark_done(out_dir, fp, summary)
    return summary
