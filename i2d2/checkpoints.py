"""Checkpoints that can tell whether they are intact, and a resume that falls back when one is not.

Every Lightning checkpoint goes through :class:`VerifiedCheckpointIO` (installed by
``i2d2.lightning_setup.build_trainer``):

* save: the checkpoint is serialised in memory, written to a temporary file beside its target and renamed into
  place, so a kill during a save never leaves a half-written ``last.ckpt``; its size and SHA-256 go to
  ``<name>.integrity.json``; the checkpoint it replaces is kept as ``<name>.prev`` (with its record), so there
  is always a previous good one to fall back to;
* load: size and hash are checked against the record before ``torch.load`` (a mismatch is a DataError naming
  the file, never an unpickling crash deep in Lightning);
* :func:`pick_resume` chooses what a killed fit resumes from: the newest intact checkpoint, else the previous
  one, else nothing (the stage's training restarts); damaged files are renamed ``*.damaged`` and the log says
  which one was used and why.

A checkpoint without a record (written before this existed) is accepted when its zip structure and CRCs are
sound. DeepSpeed checkpoints (directories) are written whole by ``lightning_setup._AtomicDeepSpeedSave`` and
checked by ``lightning_setup.resume_checkpoint`` instead, with :func:`deepspeed_problem` (and moved aside by
:func:`quarantine`).
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import shutil
import zipfile
from pathlib import Path
from typing import Any

from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from i2d2.io import DataError, atomic_path, file_digest, write_json

log = logging.getLogger(__name__)

RECORD = ".integrity.json"
PREVIOUS = ".prev"
DAMAGED = ".damaged"


def record_path(path: str | os.PathLike) -> Path:
    return Path(f"{path}{RECORD}")


def previous_path(path: str | os.PathLike) -> Path:
    return Path(f"{path}{PREVIOUS}")


def problem(path: str | os.PathLike) -> str | None:
    """Why the checkpoint file at ``path`` cannot be trusted, or None when it is intact.

    With a record: size, then SHA-256. Without one (an older run): the zip container torch writes must open
    and its CRCs must match, which catches truncation and flipped bytes."""
    import json

    path = Path(path)
    if not path.is_file():
        return "missing"
    rec = record_path(path)
    if rec.exists():
        try:
            want = json.loads(rec.read_text())
            size, sha = int(want["size"]), str(want["sha256"])
        except FileNotFoundError:  # moved aside by another rank, with its checkpoint
            return "missing"
        except (ValueError, KeyError, TypeError):
            return f"its integrity record {rec.name} is damaged"
        try:
            have = path.stat().st_size
            if have != size:
                return f"size {have} bytes, {size} recorded at save time (truncated or overwritten)"
            if file_digest(path) != sha:
                return "content does not match the SHA-256 recorded at save time"
        except FileNotFoundError:  # moved aside by another rank while this one read it
            return "missing"
        return None
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        return f"not a readable checkpoint ({e})"
    return f"CRC error in {bad}" if bad else None


def deepspeed_problem(path: str | os.PathLike) -> str | None:
    """Why the DeepSpeed checkpoint directory ``path`` cannot be trusted, or None when it looks intact.

    Lightning saves under one fixed tag (``checkpoint``), so DeepSpeed rewrites the same files in place on every save
    and ``latest`` stays from the previous one: a kill during a save leaves ``latest`` beside a half-written file.
    So ``latest`` must name a folder in it whose ``.pt`` files are all sound torch zips (CRCs checked)."""
    path = Path(path)
    try:
        tag = (path / "latest").read_text().strip()
    except OSError as e:
        return f"its 'latest' file cannot be read ({e})"
    if not tag or not (path / tag).is_dir():
        return f"'latest' names {tag!r}, which is not a folder in it"
    for f in sorted((path / tag).rglob("*.pt")):
        why = problem(f)
        if why is not None:
            return f"{f.relative_to(path)}: {why}"
    return None


def verify(path: str | os.PathLike) -> None:
    """Raise DataError naming ``path`` when the checkpoint is not intact."""
    why = problem(path)
    if why is not None:
        raise DataError(f"{path}: damaged checkpoint: {why}")


def quarantine(path: str | os.PathLike, why: str) -> None:
    """Move a damaged checkpoint (a file and its record, or a DeepSpeed directory) aside as ``*.damaged``."""
    path = Path(path)
    if path.is_dir():  # os.replace cannot replace a directory moved aside earlier
        shutil.rmtree(f"{path}{DAMAGED}", ignore_errors=True)
    # every rank of a DDP fit picks its resume point: another rank may have moved the file (or its record) already
    try:
        os.replace(path, f"{path}{DAMAGED}")
    except FileNotFoundError:
        return
    log.warning("checkpoint %s is damaged (%s): moved aside to %s%s", path, why, path.name, DAMAGED)
    try:
        os.replace(record_path(path), f"{path}{DAMAGED}{RECORD}")
    except FileNotFoundError:
        pass


def pick_resume(path: str | os.PathLike) -> str | None:
    """The checkpoint a killed fit resumes from: ``path`` if intact, else the one it replaced, else None
    (start the training afresh). Damaged candidates are moved aside, so a later save cannot rotate them into
    the fallback slot; every decision is logged."""
    path = Path(path)
    for cand in (path, previous_path(path)):
        if not cand.exists():
            continue
        why = problem(cand)
        if why is None:
            if cand != path:
                log.warning("resuming from the previous checkpoint %s (the newest one was damaged or missing)", cand)
            return str(cand)
        quarantine(cand, why)
    if any(Path(f"{c}{DAMAGED}").exists() for c in (path, previous_path(path))):
        log.warning("no intact checkpoint left in %s: this training restarts from the beginning", path.parent)
    return None


class VerifiedCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` with atomic saves, an integrity record per file, the previous file kept, and
    loads that check the record first (see the module docstring)."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options=None) -> None:
        if storage_options is not None or "://" in str(path):  # remote storage: Lightning's own path
            return super().save_checkpoint(checkpoint, path, storage_options)
        import torch

        path = Path(path)
        buf = io.BytesIO()
        torch.save(checkpoint, buf)
        data = buf.getbuffer()
        record = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        with atomic_path(path) as tmp:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            if path.exists():  # keep the last good one until the new one is in place
                # its record first: a kill between the two renames leaves it unrecorded (checked by its CRCs), where
                # the other order left it under the record of the one before, so it was quarantined as damaged
                if record_path(path).exists():
                    os.replace(record_path(path), record_path(previous_path(path)))
                os.replace(path, previous_path(path))
            write_json(record_path(path), record)  # before the rename: an existing file always has its record

    def load_checkpoint(self, path, map_location=lambda storage, loc: storage, weights_only=None):
        if "://" not in str(path) and Path(path).is_file():
            verify(path)
        return super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)

    def remove_checkpoint(self, path) -> None:
        super().remove_checkpoint(path)
        if "://" not in str(path):
            for extra in (record_path(path), previous_path(path), record_path(previous_path(path))):
                Path(extra).unlink(missing_ok=True)
