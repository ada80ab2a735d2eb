"""Data I/O shared by every stage: atomic writes, validated readers, stage fingerprints.

Every stage reads the previous stage's files and writes its own. Writes go to a temporary file in
the same directory and are renamed into place, so a killed run never leaves a half-written file that
a restart would take for finished work.
"""

from __future__ import annotations

import csv
import errno
import hashlib
import json
import logging
import os
import shutil
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from i2d2.faults import fault_point

log = logging.getLogger(__name__)


class DataError(ValueError):
    """Bad input, with the file and line (or field) it came from."""


class DamagedOutputError(DataError):
    """``verify_recorded``: a file under ``folder`` differs from what the stage that wrote it recorded in ``marker``.
    ``damage`` names the file; the message adds what to do when the change was deliberate (a model replaced by hand
    in place): the marker is what makes the folder checked, so deleting it loads the folder unchecked."""

    def __init__(self, damage: str, marker: Path, folder: Path):
        self.damage, self.marker, self.folder = damage, Path(marker), Path(folder)
        super().__init__(f"{damage}. If {folder} was replaced on purpose, delete {marker} to load it unchecked "
                         f"(rerunning the stage in {self.marker.parent} would still redo it and overwrite {folder})")


# ----------------------------------------------------------------------------- reading text

def text_lines(path: str | os.PathLike) -> Iterator[str]:
    """The lines of a UTF-8 text file (line ends kept, a leading BOM dropped), decoded one at a time.

    Every text input goes through here: bytes that are not UTF-8 raise DataError naming ``file:line`` and the
    column instead of a bare UnicodeDecodeError, and a large file (ConceptNet) is never held in memory whole.
    Lines are split on ``\\n`` in bytes, which never occurs inside a multi-byte UTF-8 character, so csv readers
    (``newline=''`` semantics: ``\\r\\n`` kept) can consume the result directly.
    """
    path = Path(path)
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if lineno == 1 and raw[:2] in (b"\xff\xfe", b"\xfe\xff"):
                raise DataError(f"{path}:1: file is UTF-16 (byte-order mark {raw[:2]!r}); save it as UTF-8")
            try:
                yield raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as e:
                bad = raw[e.start:e.end]
                col = len(raw[:e.start].decode("utf-8", errors="replace")) + 1
                raise DataError(f"{path}:{lineno}: not valid UTF-8 (byte(s) {bad!r} at column {col}); "
                                "save the file as UTF-8") from None


@contextmanager
def open_text(path: str | os.PathLike) -> Iterator[Iterator[str]]:
    """``with open_text(path) as f:`` in place of ``open(path)``: iterate ``f`` for lines (see text_lines)."""
    lines = text_lines(path)
    try:
        yield lines
    finally:
        lines.close()


def read_text(path: str | os.PathLike) -> str:
    """A whole (small) UTF-8 text file; bad encoding raises DataError naming ``file:line``."""
    return "".join(text_lines(path))


# ----------------------------------------------------------------------------- writing atomically

def _cannot_write(path: Path, e: OSError) -> OSError:
    """The same OSError type (PermissionError, ...) with a message naming the file we meant to write."""
    err = type(e)(e.errno, f"cannot write {path}: {e.strerror or e}")
    err.filename = str(path)
    return err


def _is_write_error(e: OSError, *paths: Path) -> bool:
    return e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS) or str(e.filename) in {str(p) for p in paths}


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success rename it over ``path``."""
    path = Path(path)
    # A unique name created with open(): unlike mkstemp, the file gets the user's umask permissions.
    tmp = path.parent / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        open(tmp, "x").close()
    except OSError as e:  # read-only run_dir, full disk: say which file, leave nothing behind
        raise _cannot_write(path, e) from None
    try:
        yield tmp
        fault_point(f"write:{path.name}")  # tests/faults: a kill with the new content complete, not yet in place
        os.replace(tmp, path)
    except OSError as e:
        if not _is_write_error(e, tmp, path):
            raise  # e.g. an input the caller failed to read: its own message is the right one
        raise _cannot_write(path, e) from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary directory next to ``path``; on success it replaces ``path`` (an old one is moved aside
    and removed only after the rename), so a reader never sees a half-written folder."""
    import shutil

    path = Path(path)
    tmp = path.parent / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    _remove_stale_siblings(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
    except OSError as e:
        raise _cannot_write(path, e) from None
    try:
        yield tmp
        fault_point(f"write:{path.name}/")
        old = None
        if path.exists():
            old = path.parent / f".{path.name}.{uuid.uuid4().hex[:8]}.old"
            os.replace(path, old)
        os.replace(tmp, path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _remove_stale_siblings(path: Path) -> None:
    """Remove what a killed ``atomic_dir`` left beside ``path``: temporary folders of dead processes (the pid is in
    the name) and moved-aside old versions once ``path`` itself exists (their replacement finished)."""
    import shutil

    if not path.parent.is_dir():
        return
    for q in path.parent.glob(f".{path.name}.*.tmp"):
        pid = q.name[len(path.name) + 2:].split(".", 1)[0]
        if pid.isdigit() and not _pid_alive(int(pid)):
            shutil.rmtree(q, ignore_errors=True)
    if path.exists():
        for q in path.parent.glob(f".{path.name}.*.old"):
            shutil.rmtree(q, ignore_errors=True)


def write_text(path: str | os.PathLike, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")  # what every reader decodes (text_lines), whatever the locale
    return Path(path)


def write_json(path: str | os.PathLike, obj: Any) -> Path:
    return write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def write_jsonl(path: str | os.PathLike, rows: Iterable[dict]) -> Path:
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
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

    from i2d2.checkpoints import verify

    verify(path)  # size/hash against the record written at save time: a truncated file names itself
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
        return json.loads(read_text(path))
    except json.JSONDecodeError as e:
        raise DataError(f"{path}:{e.lineno}: invalid JSON ({e.msg})") from None


def iter_jsonl(path: str | os.PathLike) -> Iterator[tuple[int, dict | None, str | None]]:
    """``(line number, object, None)`` for each good line, ``(line number, None, problem)`` for a bad one."""
    for lineno, line in enumerate(text_lines(path), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            yield lineno, None, str(e)
            continue
        yield (lineno, row, None) if isinstance(row, dict) else (lineno, None, "expected a JSON object")


def stream_jsonl(path: str | os.PathLike, required: Iterable[str] = (), on_error: str = "raise",
                 errors: list | None = None, hint: str = "") -> Iterator[dict]:
    """The rows of a JSON-lines file one at a time; a broken line or a missing required field (absent, null or
    empty) raises DataError naming file:line. ``on_error='skip'`` skips bad lines instead and appends their
    messages to ``errors``. ``hint``: said after a missing field (the option that names the fields, say)."""
    path = Path(path)
    for lineno, row, problem in iter_jsonl(path):
        if problem is None:
            missing = [k for k in required if k not in row or row[k] in (None, "")]
            problem = f"missing field(s) {', '.join(missing)}{f' ({hint})' if hint else ''}" if missing else None
        if problem is not None:
            msg = f"{path}:{lineno}: {problem}"
            if on_error == "raise":
                raise DataError(msg)
            if errors is not None:
                errors.append(msg)
            continue
        yield row


def read_jsonl(path: str | os.PathLike, required: Iterable[str] = (), on_error: str = "raise",
               errors: list | None = None) -> list[dict]:
    """All rows of a JSON-lines file (``stream_jsonl``, as a list)."""
    return list(stream_jsonl(path, required, on_error, errors))


def read_csv(path: str | os.PathLike, required: Iterable[str] = (), one_of: Iterable[str] = ()) -> list[dict]:
    """Rows as dicts with the line each starts on (``_line``); the header must hold every ``required`` column and,
    if ``one_of`` is given, at least one of those."""
    path = Path(path)
    reader = csv.reader(text_lines(path))
    header = next((rec for rec in reader if rec), [])  # as csv.DictReader: the first non-blank row
    missing = [k for k in required if k not in header]
    if missing:
        raise DataError(f"{path}:{reader.line_num or 1}: header lacks column(s) {', '.join(missing)}")
    one_of = list(one_of)
    if one_of and not set(one_of) & set(header):
        raise DataError(f"{path}:{reader.line_num or 1}: header needs a column {' or '.join(one_of)}, has "
                        f"{', '.join(header) or 'none'}")
    # rows as csv.DictReader makes them, with the line each starts on: counting rows named the wrong line after a
    # blank line (skipped) or a quoted field holding a newline
    rows, start = [], reader.line_num + 1
    for rec in reader:
        if rec:
            row = dict(zip(header, rec))
            if len(rec) > len(header):
                row[None] = rec[len(header):]
            row.update(dict.fromkeys(header[len(rec):]))
            rows.append(dict(row, _line=start))
        start = reader.line_num + 1
    return rows


def write_csv(path: str | os.PathLike, rows: list[dict], columns: list[str] | None = None) -> Path:
    columns = columns or (list(rows[0]) if rows else [])
    with atomic_path(path) as tmp, open(tmp, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    return Path(path)


# ----------------------------------------------------------------------------- stage bookkeeping

class Fingerprint(str):
    """A fingerprint's hex, the str every caller compares and stores, carrying a description of each part
    (``parts``: see ``fingerprint``). The stage markers record it beside the hex so that a redo can say which input
    changed; a str subclass so that the hash and every caller stay as they were (run folders keep their markers)."""

    def __new__(cls, hexdigest: str, parts: list | None = None):  # parts optional: pickle rebuilds from the hex
        self = super().__new__(cls, hexdigest)
        self.parts = parts
        return self


SMALL_PART = 4096  # a config part up to this many characters of JSON is recorded as is, a larger one by its digest


class Named:
    """A fingerprint part with a name for the redo's log line (``named``); the name is not hashed."""

    __slots__ = ("name", "value")

    def __init__(self, name: str, value: Any):
        self.name, self.value = name, value

    def __repr__(self) -> str:
        return f"named({self.name!r}, {self.value!r})"


def named(name: str, value: Any) -> Named:
    """``value`` as a part of ``fingerprint`` that a redo's log line calls ``name`` (``delta: 0.7 -> 0.75``) rather
    than by its position (``part 1.4``). The hash is that of ``value`` alone: naming a part keeps every fingerprint,
    and so every run folder's finished stages. Only a part given to ``fingerprint`` itself, not one inside a dict."""
    return Named(name, value)


def fingerprint(*parts: Any) -> Fingerprint:
    """A stable hash of configs (dicts, strings) and input files (Path objects hash their content).

    ``.parts`` describes each part, for ``prepare_stage`` to name the one that changed: ``{"value": ...}`` for a
    small config, ``{"digest": ...}`` for a large one, ``{"path": ..., "digest": ...}`` for a file or folder (digest
    None: missing), ``{"fingerprint": ..., "parts": [...]}`` for an earlier fingerprint used as a part; with
    ``"name"`` for a part given as ``named(name, value)``."""
    h = hashlib.sha256()
    described = []
    for p in parts:
        name = None
        if isinstance(p, Named):
            name, p = p.name, p.value
        if isinstance(p, Path):
            data, digest = _path_part(p)
            h.update(data)
            d = {"path": str(p), "digest": digest}
        else:
            text = json.dumps(p, sort_keys=True, default=str)
            h.update(text.encode())
            d = _describe(p, text)
        described.append({"name": str(name), **d} if name is not None else d)
        h.update(b"\x00")
    return Fingerprint(h.hexdigest()[:16], described)


def _path_part(p: Path) -> tuple[bytes, str | None]:
    """What a Path part adds to a fingerprint (its file's SHA-256, or a folder's name + SHA-256 of every file in it,
    dot files left out), and the digest recorded for it: the file's own SHA-256 (as ``sha256sum`` prints it) or
    one of the folder's list, cut to 16 hex digits; None when it is missing."""
    if p.is_dir():
        data = b"".join(str(q.relative_to(p)).encode() + file_digest(q).encode()
                        for q in sorted(p.rglob("*")) if q.is_file() and not q.name.startswith("."))
        return data, _digest(data)
    if p.exists():
        digest = file_digest(p)
        return digest.encode(), digest[:16]
    return b"<missing>", None


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def _describe(p: Any, text: str) -> dict:
    if isinstance(p, Fingerprint) and p.parts is not None:
        return {"fingerprint": str(p), "parts": p.parts}
    if len(text) <= SMALL_PART:
        return {"value": json.loads(text)}
    return {"digest": _digest(text.encode())}


def model_fingerprint(name: str) -> str:
    """A fingerprint part for a model: the bytes of its files for a local folder (a model retrained into the same
    folder is a new input); for the packaged Gemma its name and the sha256 of the installed package's GGUF (another
    package release is another model: its name alone kept finished stages of the old weights); its name for another
    packaged, a tiny or a hub model."""
    path = Path(str(name)).expanduser()
    if path.is_dir():
        return fingerprint(path)
    if str(name) == "packaged:gemma3-270m":
        from i2d2.models import gemma_source

        return f"{name}@sha256:{gemma_source()['sha256']}"
    return str(name)


def file_digest(path: Path) -> str:
    """SHA-256 hex digest of a file's bytes, read in blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


DONE = "_DONE.json"
STARTED = "_STARTED.json"


def stage_done(out_dir: str | os.PathLike, fp: str) -> dict | None:
    """The summary a finished stage left in ``out_dir``, if it finished with the same fingerprint and the files
    it wrote are still those recorded in its marker (size and SHA-256 at ``mark_done`` time). Damaged or missing
    outputs (a truncated table, a half-copied folder) make the whole stage folder be removed and redone."""
    out_dir = Path(out_dir)
    marker = out_dir / DONE
    try:
        info = json.loads(marker.read_text())
    except FileNotFoundError:
        return None
    except ValueError:
        log.warning("%s is damaged (not JSON): the stage will be redone", marker)
        return None
    if not (isinstance(info, dict) and info.get("fingerprint") == fp):
        return None
    damaged = _changed_outputs(out_dir, info.get("outputs") or {})
    if damaged:
        log.warning("stage output %s changed since the stage finished (%s): removing %s to redo the stage",
                    os.path.normpath(out_dir / damaged[0][0]), damaged[0][1], out_dir)
        shutil.rmtree(out_dir)
        return None
    return info.get("summary", {})


LOG_FOLDERS = {"logs", "lightning_logs", "wandb"}


def _output_files(out_dir: Path) -> Iterator[tuple[str, Path]]:
    for p in sorted(out_dir.rglob("*")):
        rel = p.relative_to(out_dir)
        # not markers / temp files (_*, .*), nor logger folders a tracker may still append to after the stage
        if p.is_file() and not any(part.startswith((".", "_")) or part in LOG_FOLDERS for part in rel.parts):
            yield rel.as_posix(), p


def _changed_outputs(out_dir: Path, recorded: dict) -> list[tuple[str, str]]:
    changed = []
    for rel, want in recorded.items():
        p = out_dir / rel
        if not p.is_file():
            changed.append((rel, "missing"))
        elif p.stat().st_size != want["size"]:
            changed.append((rel, f"{p.stat().st_size} bytes, {want['size']} recorded"))
        elif file_digest(p) != want["sha256"]:
            changed.append((rel, "content differs from the SHA-256 recorded"))
    return changed


_VERIFIED: dict = {}  # (marker, its stat, the checked files' stats) -> True: one hash per process, not one per call


def _stat_key(p: Path) -> tuple:
    try:
        st = p.stat()
    except OSError:
        return (str(p), None)
    return (str(p), st.st_size, st.st_mtime_ns, st.st_ino)


def verify_recorded(folder: str | os.PathLike, stage_dir: str | os.PathLike) -> bool:
    """Check the files under ``folder`` against the size + SHA-256 that the stage in ``stage_dir`` recorded when it
    finished (``mark_done``), before another stage or command loads them (an iteration's model, an adapter); raise
    DamagedOutputError (a DataError) naming the first damaged file. False when ``stage_dir`` has no marker (a folder put
    there by hand, or one whose marker was deleted to load a deliberate replacement unchecked).
    Files are matched to ``folder`` by path as recorded (not resolved: a weights file that is a link to a blob is
    still checked), and a folder already found intact in this process, unchanged since (size, mtime, inode), is not
    hashed again (start-up, the run and each iteration ask for the same model)."""
    folder, stage_dir = Path(folder), Path(stage_dir)
    marker = stage_dir / DONE
    try:
        info = json.loads(marker.read_text())
    except FileNotFoundError:
        return False
    except ValueError:
        raise DataError(f"{marker} is damaged (not JSON): {folder} cannot be checked against it (delete {marker} "
                        f"to load {folder} unchecked)") from None
    outputs = (info.get("outputs") if isinstance(info, dict) else []) or {}  # none recorded: an older marker
    if not isinstance(info, dict) or not isinstance(outputs, dict) or not all(
            isinstance(w, dict) and {"size", "sha256"} <= set(w) for w in outputs.values()):
        raise DataError(f"{marker} is damaged (no outputs record): {folder} cannot be checked against it (delete "
                        f"{marker} to load {folder} unchecked)")
    root = os.path.normpath(os.path.abspath(folder))
    mine = {rel: want for rel, want in outputs.items()
            if os.path.commonpath([root, os.path.normpath(os.path.abspath(stage_dir / rel))]) == root}
    key = (_stat_key(marker), *(_stat_key(stage_dir / rel) for rel in sorted(mine)))
    if _VERIFIED.get(key):
        return True
    damaged = _changed_outputs(stage_dir, mine)
    if damaged:
        rel, why = damaged[0]
        more = f" and {len(damaged) - 1} more file(s)" if len(damaged) > 1 else ""
        raise DamagedOutputError(f"{os.path.normpath(stage_dir / rel)} is damaged ({why}; recorded in {marker} when "
                                 f"the stage finished){more}", marker, folder)
    _VERIFIED[key] = True
    return True


def iteration_model_dir(run_dir: str | os.PathLike, k: int) -> Path:
    """Where iteration k's fine-tuning stage writes P_{k+1}: ``{run_dir}/iter_k/model`` (recorded in
    ``iter_k/finetune/_DONE.json``)."""
    return Path(run_dir) / f"iter_{k}" / "model"


def verified_iteration_model(run_dir: str | os.PathLike, k: int) -> Path | None:
    """Iteration k's model, for a command that loads it (iteration k+1, ``i2d2.generate``): its path once its files
    match what iteration k's fine-tuning stage recorded (``verify_recorded``; DataError naming the first damaged
    file), None when there is no model there (no ``config.json``) for the caller to say what to run."""
    path = iteration_model_dir(run_dir, k)
    if not (path / "config.json").exists():
        return None
    verify_model_folder(path)
    return path


def verify_model_folder(folder: str | os.PathLike) -> bool:
    """A model folder given by path (``generate.model=<run>/iter_0/model``), checked like ``verified_iteration_model``
    when it is where a fine-tuning stage wrote it: ``<parent>/finetune/_DONE.json`` records its files (DataError
    naming the first damaged one). False for a folder with no such marker beside it (one made by hand): loaded
    unchecked, as before. A link to such a folder (``latest -> run/iter_2/model``) is checked where it points: its
    own parent has no marker. ``~`` is expanded, as the loaders expand it."""
    folder = Path(str(folder)).expanduser()
    if folder.is_symlink():
        folder = Path(os.path.realpath(folder))
    return folder.is_dir() and verify_recorded(folder, folder.parent / "finetune")


def mark_done(out_dir: str | os.PathLike, fp: str, summary: dict | None = None,
              outside: Iterable[str | os.PathLike] = ()) -> None:
    """The _DONE marker: fingerprint, summary, and size + SHA-256 of every file the stage wrote (checked by
    ``stage_done`` before a finished stage is reused). ``outside``: what it wrote outside ``out_dir``
    (``iter_k/model``), recorded relative to ``out_dir`` (``../model/...``: the run folder can move), so that a
    damaged model makes the stage be redone too."""
    out_dir = Path(out_dir)
    files = list(_output_files(out_dir))
    for extra in map(Path, outside):
        found = _output_files(extra) if extra.is_dir() else [("", extra)] if extra.is_file() else []
        files += [(Path(os.path.relpath(p, out_dir)).as_posix(), p) for _, p in found]
    outputs = {rel: {"size": p.stat().st_size, "sha256": file_digest(p)} for rel, p in files}
    write_json(out_dir / DONE, {**_fingerprint_record(fp, out_dir), "summary": summary or {}, "outputs": outputs})


def run_stage(out_dir: str | os.PathLike, fp: str, fn: Callable[[Path], dict | None], name: str = "",
              outputs: Iterable[str | os.PathLike] = ()) -> dict:
    """Run ``fn(out_dir)`` unless ``out_dir`` already holds a finished run with fingerprint ``fp``.

    A stage whose inputs or config changed gets a new fingerprint and is redone; ``fn`` itself is
    responsible for resuming from finished units (shards, checkpoints) inside ``out_dir``.
    ``outputs``: what the stage writes outside ``out_dir`` (the fine-tuned ``iter_k/model``): removed before
    ``fn`` runs with new inputs, so that a failed or killed redo never leaves a previous result where the next
    stage reads it (a resumed run with the same fingerprint keeps them: they come from the same inputs).
    """
    out_dir = Path(out_dir)
    done = stage_done(out_dir, fp)
    if done is not None:
        log.info("stage %s: already finished in %s, skipping", name or out_dir.name, out_dir)
        return done
    prepare_stage(out_dir, fp, name, outputs)
    fault_point(f"stage:{name or out_dir.name}")
    summary = fn(out_dir) or {}
    fault_point(f"done:{name or out_dir.name}")
    mark_done(out_dir, fp, summary, outputs)
    # the summary as the marker holds it (keys sorted, numbers as JSON has them): what a rerun that finds the
    # stage finished gets, so a report built from it is the same bytes whether the stage ran now or before
    return json.loads(json.dumps(summary, sort_keys=True, default=str))


def stage_fingerprint(out_dir: Path) -> str | None:
    """The fingerprint of the work in ``out_dir`` (started or finished), None for an empty/new folder."""
    return _stage_marker(out_dir)[0]


def _stage_marker(out_dir: Path) -> tuple[str | None, dict]:
    """(fingerprint, marker) of the work in ``out_dir``: ``_STARTED`` first, else ``_DONE``; (None, {}) for none."""
    for marker in (STARTED, DONE):
        try:
            info = json.loads((out_dir / marker).read_text())
        except FileNotFoundError:
            continue
        except ValueError:  # a damaged marker: the work it describes cannot be trusted
            return "<damaged>", {}
        if not isinstance(info, dict):  # JSON, but not a marker's object (a truncated write's "null", "[]")
            return "<damaged>", {}
        return info.get("fingerprint"), info
    return None, {}


def _fingerprint_record(fp: str, out_dir: Path) -> dict:
    """What a marker records of ``fp``: the hex, and its parts' descriptions when ``fp`` came from ``fingerprint``."""
    parts = getattr(fp, "parts", None)
    return {"fingerprint": str(fp), **({"parts": _portable(parts, out_dir)} if parts is not None else {})}


def _portable(parts: list, out_dir: Path) -> list:
    """``parts`` with the path of an input in the run relative to the stage folder (``../generations/table``): a run
    folder records no path of where it lies, so that it can be moved and continued (``run_relative``). "In the run":
    at most three folders up (stage folders lie at most three deep in a run); anything else as given."""
    described = []
    for d in parts:
        if "path" in d:
            rel = os.path.relpath(os.path.abspath(d["path"]), os.path.abspath(out_dir))
            d = {**d, "path": d["path"] if (rel + os.sep).startswith((".." + os.sep) * 4) else Path(rel).as_posix()}
        elif "parts" in d:
            d = {**d, "parts": _portable(d["parts"], out_dir)}
        described.append(d)
    return described


def prepare_stage(out_dir: Path, fp: str, name: str = "", outputs: Iterable[str | os.PathLike] = ()) -> None:
    """Make ``out_dir`` ready for (re)running a stage with fingerprint ``fp``: work from other inputs, config or
    format version is removed (partial work with the same ``fp`` is kept to resume from), then ``_STARTED``.
    The log line of a redo names the inputs that changed (``redo_reason``)."""
    out_dir = Path(out_dir)
    old, info = _stage_marker(out_dir)
    record = _fingerprint_record(fp, out_dir)
    if old is not None and old != fp:
        reason = redo_reason(info, record) if old != "<damaged>" else ""
        log.info("stage %s: inputs changed%s, redoing it (removing %s)", name or out_dir.name,
                 f" ({reason})" if reason else "", out_dir)
        shutil.rmtree(out_dir)
    for extra in map(Path, outputs) if old != fp else ():  # resuming this very work keeps what it wrote
        if extra.exists() or extra.is_symlink():
            log.info("stage %s: removing %s before running (a previous result, not current until the stage "
                     "finishes)", name or out_dir.name, extra)
            shutil.rmtree(extra) if extra.is_dir() and not extra.is_symlink() else extra.unlink()
    _remove_leftover_temps(out_dir, name)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / STARTED, record)


MAX_CHANGES = 5  # the changes a redo's log line lists (then "and N more"): one line, whatever changed


def redo_reason(marker: dict, record: dict) -> str:
    """Which parts of the fingerprint in ``record`` (the new marker's) differ from those the earlier run recorded in
    ``marker``, for the log line of a redo: ``delta: 0.7 -> 0.75; file ../generations/table: content changed``.
    A part is called by its name (``named``), a file by its path, another part by its position (``part 1.5 config:
    delta null -> 0.5``: counted from 1, a dot goes into an earlier fingerprint used as a part); names come from
    the new record, so a marker from before parts were named reads as well. A change that repeats one already
    listed (``delta`` as a part and as a key of a config part, the same values) is listed once. Only what the hash
    holds is compared (a file's content, not its path: a run folder can move), and a marker that does not say gives
    no reason rather than a wrong one."""
    new = record.get("parts")
    if new is None:  # a fingerprint made by hand (a test's "fp"): nothing to compare with
        return ""
    old = marker.get("parts") if isinstance(marker, dict) else None
    if not isinstance(old, list):  # a run folder from before the markers recorded parts
        return "the earlier run recorded no input details"
    if len(old) != len(new):  # another version of the code: a part added (a format version) or dropped
        return f"the stage's inputs are now {len(new)} parts, were {len(old)}"
    try:
        changes = _part_changes(old, new, "part ", "")
    except (TypeError, KeyError, AttributeError):  # a marker edited by hand into another shape
        return ""
    seen, unique = set(), []
    for at, what, same in changes:
        if same is None or same not in seen:
            unique.append((at, what))
            seen.add(same)
    groups: dict[str, list[str]] = {}
    for at, what in unique[:MAX_CHANGES]:
        groups.setdefault(at, []).append(what)
    text = "; ".join(f"{at}: {', '.join(whats)}" for at, whats in groups.items())
    more = len(unique) - MAX_CHANGES
    return text + (f"; and {more} more" if more > 0 else "")


def _part_changes(old: list, new: list, at: str, prefix: str) -> list[tuple[str, str, tuple | None]]:
    """(which part, what changed, what makes it a repeat) for each part whose hashed content differs. A part is
    called ``prefix`` + its name where the new description has one, a file by its path, else ``at`` + its position.
    A value's change repeats another with the same key (a named value's key: its name) and the same values."""
    changes = []
    for i, (o, n) in enumerate(zip(old, new), 1):
        if not isinstance(o, dict):
            raise TypeError(f"{o!r} is not a part description")
        name = n.get("name")
        where = f"{prefix}{name}" if name else f"{at}{i}"
        if "parts" in o and "parts" in n:  # an earlier fingerprint: say which of its own parts changed
            if o["fingerprint"] == n["fingerprint"]:
                continue
            if isinstance(o["parts"], list) and len(o["parts"]) == len(n["parts"]):
                changes += (_part_changes(o["parts"], n["parts"], f"{where} part ", f"{where} ") if name else
                            _part_changes(o["parts"], n["parts"], f"{where}.", prefix))
            else:
                changes.append((where, f"its inputs are now {len(n['parts'])} parts, were {len(o['parts'])}", None))
        elif "path" in o and "path" in n:
            if o["digest"] != n["digest"]:
                what = "now missing" if n["digest"] is None else "new" if o["digest"] is None else "content changed"
                label = f"{where} " if name else prefix
                changes.append((f"{label}file {_shorten(n['path'], 60, tail=True)}", what, None))
        elif "value" in o and "value" in n:
            ov, nv = o["value"], n["value"]
            if isinstance(ov, dict) and isinstance(nv, dict):
                changes += [(where if name else f"{where} config", f"{key} {c}", (key, c))
                            for key, c in _value_changes(ov, nv, "")]
            else:
                changes += [(where, c, (name, c) if name else None) for _, c in _value_changes(ov, nv, "")]
        elif {k: v for k, v in o.items() if k != "name"} != {k: v for k, v in n.items() if k != "name"}:
            # a large config (digest only, on one side or both), or a part of another kind than before
            same_kind = _is_config(o) and _is_config(n)  # a config grown past SMALL_PART is the same kind of input
            changes.append((where, "changed" if same_kind else "changed (another kind of input)", None))
    return changes


def _is_config(described: dict) -> bool:
    """A config part, described by value or (past SMALL_PART) by digest: not a file, not an earlier fingerprint."""
    return "path" not in described and "parts" not in described


_ABSENT = object()


def _value_changes(old: Any, new: Any, key: str) -> list[tuple[str | None, str]]:
    """(key, ``old -> new``) for each differing leaf: dotted keys into dicts (long ones cut; None for a value that
    is not a dict), lists whole, long values cut."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [c for k in sorted(set(old) | set(new))
                for c in _value_changes(old.get(k, _ABSENT), new.get(k, _ABSENT), f"{key}.{k}" if key else k)]
    if old is not _ABSENT and new is not _ABSENT and _json(old) == _json(new):  # JSON: 1 and 1.0 or true differ
        return []
    return [(_shorten(key, 60, tail=True) if key else None, f"{_show(old)} -> {_show(new)}")]


def _json(v: Any) -> str:
    return json.dumps(v, sort_keys=True, ensure_ascii=False)


def _show(v: Any) -> str:
    return "absent" if v is _ABSENT else _shorten(_json(v), 40)


def _shorten(text: str, n: int, tail: bool = False) -> str:
    if len(text) <= n:
        return text
    return "..." + text[-(n - 3):] if tail else text[:n - 3] + "..."


def _remove_leftover_temps(out_dir: Path, name: str = "") -> None:
    """Temporary files and folders of atomic writes a killed process left behind (``.<name>.<pid>.<id>.tmp``,
    ``.<name>.<id>.old``): one writer per run_dir (RunLock), so at a stage's start none is in use."""
    if not out_dir.is_dir():
        return
    for p in sorted(out_dir.rglob(".*.tmp")) + sorted(out_dir.rglob(".*.old")):
        if p.exists():
            log.info("stage %s: removing %s left by a killed write", name or out_dir.name, p)
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()


# ----------------------------------------------------------------------------- one writer per run_dir

LOCK = ".i2d2.lock"          # held with flock (released by the kernel when the holder dies, even by SIGKILL)
LOCK_INFO = "_LOCK.json"     # who holds it: host, pid, command, start time; removed on a clean exit


class RunLockedError(RuntimeError):
    """Another live process is writing the same run_dir."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _holder(info: dict) -> str:
    return (f"pid {info.get('pid')} on host {info.get('host')} (started {info.get('started')}: "
            f"{info.get('command') or '?'})")


class RunLock:
    """An exclusive lock on a run_dir: one writer at a time, whatever launched it.

    The lock is ``flock`` on ``run_dir/.i2d2.lock`` (filelock), so a holder killed with SIGKILL releases it
    with its last file descriptor; ``_LOCK.json`` beside it names the holder (host, pid, command) for the
    message a second launch gets. Found with a dead holder (no flock held, the file left behind by a killed
    run) it is taken over with a warning. On file systems without flock (some network mounts) the fallback is
    an exclusive-create of ``_LOCK.json`` with the pid checked on this host: a lock left by a dead pid here is
    taken over with a warning; one from another host must be removed by hand (the message says so).
    """

    def __init__(self, run_dir: str | os.PathLike):
        self.run_dir = Path(run_dir)
        self.info_path = self.run_dir / LOCK_INFO
        self._flock = None
        self._held = False

    def _info(self) -> dict:
        import datetime
        import socket
        import sys

        return {"host": socket.gethostname(), "pid": os.getpid(), "command": " ".join(sys.argv),
                "started": datetime.datetime.now().isoformat(timespec="seconds")}

    def _read_info(self) -> dict | None:
        try:
            return json.loads(self.info_path.read_text())
        except (OSError, ValueError):
            return None

    def acquire(self) -> "RunLock":
        import filelock

        if self._held:  # ``with lock:`` on a lock already taken
            return self
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            lock = filelock.FileLock(self.run_dir / LOCK, timeout=0)
            lock.acquire()
        except filelock.Timeout:
            info = self._read_info()
            who = _holder(info) if info else "a process that is still starting"
            raise RunLockedError(f"run_dir {self.run_dir} is in use by {who}. Wait for it to finish, stop it, or "
                                 "choose another run_dir=...") from None
        except NotImplementedError:  # no flock on this file system
            self._acquire_by_pid()
        except OSError as e:
            raise _cannot_write(self.run_dir / LOCK, e) from None
        else:
            self._flock = lock
            stale = self._read_info()
            if stale and stale.get("pid") != os.getpid():
                log.warning("run_dir %s: taking over the lock left by %s, which is no longer running", self.run_dir,
                            _holder(stale))
            write_json(self.info_path, self._info())
        self._held = True
        return self

    def _acquire_by_pid(self) -> None:
        import socket

        for _ in range(2):
            try:
                fd = os.open(self.info_path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                info = self._read_info() or {}
                here = info.get("host") == socket.gethostname()
                if here and isinstance(info.get("pid"), int) and not _pid_alive(info["pid"]):
                    log.warning("run_dir %s: taking over the stale lock of %s (no such process)", self.run_dir,
                                _holder(info))
                    self.info_path.unlink(missing_ok=True)
                    continue
                hint = "" if here else f"; if that process is gone, delete {self.info_path}"
                raise RunLockedError(f"run_dir {self.run_dir} is in use by {_holder(info)}{hint}") from None
            with os.fdopen(fd, "w") as f:
                json.dump(self._info(), f)
            return
        raise RunLockedError(f"run_dir {self.run_dir}: could not take the lock ({self.info_path} keeps reappearing)")

    def release(self) -> None:
        if not self._held:
            return
        info = self._read_info()
        if info and info.get("pid") == os.getpid():
            self.info_path.unlink(missing_ok=True)
        if self._flock is not None:
            self._flock.release()
            self._flock = None
        self._held = False

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


# ----------------------------------------------------------------------------- paths stored inside a run

def run_relative(path: str | os.PathLike, run_dir: str | os.PathLike) -> str:
    """How a run records a path (stage summaries, markers, metrics, reports): relative to ``run_dir`` when it names
    something that exists inside it, so that the run folder can be moved and continued from any working directory;
    anything else (a bundled or user file, a model name such as ``packaged:minilm``) as given."""
    target, root = Path(path).absolute(), Path(run_dir).absolute()
    if not target.exists() or not target.resolve().is_relative_to(root.resolve()):
        return str(path)
    return target.resolve().relative_to(root.resolve()).as_posix()


def in_run(stored: str | os.PathLike, run_dir: str | os.PathLike) -> Path:
    """A path a run recorded with ``run_relative``, as a path to open: relative ones are under ``run_dir``."""
    stored = Path(stored)
    return stored if stored.is_absolute() else Path(run_dir) / stored


# ----------------------------------------------------------------------------- stage tables (Arrow)
# A stage table is a folder of Arrow IPC-stream files (the format ``datasets`` memory-maps): either a
# ``save_to_disk`` folder or ``shard-*.arrow`` files written one at a time. Reading never loads rows into Python.

def _nulls_as_strings(table):
    """Columns that are all null in this piece (a provenance field no prompt set, an empty ``matched`` list) get
    the string type, so that pieces written separately concatenate into one schema."""
    import pyarrow as pa

    def fix(t):
        if pa.types.is_null(t):
            return pa.string()
        if pa.types.is_list(t) and pa.types.is_null(t.value_type):
            return pa.list_(pa.string())
        return t

    return table.cast(pa.schema([pa.field(f.name, fix(f.type)) for f in table.schema]))


def write_arrow(path: str | os.PathLike, rows: list[dict]) -> Path:
    """One table shard: ``rows`` as an Arrow IPC-stream file, written atomically."""
    import pyarrow as pa

    table = _nulls_as_strings(pa.Table.from_pylist(rows))
    with atomic_path(path) as tmp, pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table, max_chunksize=1000)
    return Path(path)


def save_table(path: str | os.PathLike, table, max_shard_size: str = "500MB") -> Path:
    """A ``datasets.Dataset`` (or a pyarrow Table) saved with ``save_to_disk`` into a folder replaced atomically."""
    import datasets

    ds = table if isinstance(table, datasets.Dataset) else datasets.Dataset(_nulls_as_strings(table))
    # an empty table gets one (empty) shard: datasets 4.x saves zero rows as zero shards and then cannot load them
    shards = {"num_shards": 1} if len(ds) == 0 else {"max_shard_size": max_shard_size}
    with atomic_dir(path) as tmp:
        ds.save_to_disk(str(tmp), **shards)
        _content_fingerprint(tmp)
    return Path(path)


def _content_fingerprint(folder: Path) -> None:
    """Replace the ``_fingerprint`` that ``datasets`` drew at random for an in-memory table by a hash of the saved
    Arrow files, so the same rows give the same folder bytes (a resumed run must equal an uninterrupted one)."""
    state_path = Path(folder) / "state.json"
    state = json.loads(state_path.read_text(encoding="utf-8"))
    h = hashlib.sha256()
    for f in state.get("_data_files", []):
        h.update(file_digest(Path(folder) / f["filename"]).encode())
    state["_fingerprint"] = h.hexdigest()[:16]
    state_path.write_text(json.dumps(state, indent=2, sort_keys=True), encoding="utf-8")


def read_table(path: str | os.PathLike, columns: list[str] | None = None):
    """A stage table as a memory-mapped ``datasets.Dataset`` (rows stay on disk until asked for)."""
    import datasets

    path = Path(path)
    if (path / "state.json").exists():
        ds = datasets.load_from_disk(str(path))
    else:
        shards = sorted(path.glob("shard-*.arrow"))
        if not shards:
            raise DataError(f"{path}: not a stage table (no state.json, no shard-*.arrow files)")
        ds = datasets.concatenate_datasets([datasets.Dataset.from_file(str(p)) for p in shards])
    if columns is not None:
        missing = sorted(set(columns) - set(ds.column_names))
        if missing:
            raise DataError(f"{path}: table lacks column(s) {missing}; has {ds.column_names}")
    return ds


def export_jsonl(path: str | os.PathLike, ds, batch_size: int = 10_000) -> Path:
    """A table as human-readable JSONL (atomically), streamed in batches."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for batch in ds.iter(batch_size=batch_size):
            cols = list(batch)
            for vals in zip(*(batch[c] for c in cols)):
                f.write(json.dumps(dict(zip(cols, vals)), ensure_ascii=False, default=_json_default) + "\n")
    return Path(path)
