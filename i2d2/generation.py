"""The I2D2 generation stage: NeuroLogic decoding over every prompt (i2d2.txt §2.2, A.1.4).

Prompts are cut into shards of ``shard_size`` in file order; shard ``i`` belongs to rank ``i % world_size``,
so under DDP the ranks decode disjoint shard sets whose union is the whole prompt file. A finished shard is
one file, ``shard-00000.jsonl``, written atomically; a restarted run with the same inputs skips the shards it
finds and so ends with exactly the rows an uninterrupted run writes. When all shards exist, rank 0 (or,
without torch.distributed, whichever call finds them all) concatenates them in prompt order into the stage
table ``table/`` (Arrow shards, one per decoding shard, memory-mapped by ``read_generations``) and into
``generations.jsonl``, its human-readable export.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import shutil
import time
from contextlib import contextmanager
from pathlib import Path

from i2d2.config import plain
from i2d2.io import DataError, atomic_dir, atomic_path, file_digest, fingerprint, read_jsonl, read_table, write_arrow, write_json, \
    write_jsonl, write_text
from i2d2.progress import LoggedBar

log = logging.getLogger(__name__)

FINGERPRINT_FILE = "_generation_fingerprint.txt"
UNION = "generations.jsonl"  # human-readable export
TABLE = "table"  # the stage table (Arrow): what the next stages read
ROW_FIELDS = ["prompt_id", "prompt", "generation", "score", "logprob", "num_tokens", "satisfied", "all_satisfied",
              "matched", "rank_in_prompt", "constraint_names"]


def shard_path(out_dir: Path, index: int) -> Path:
    return Path(out_dir) / f"shard-{index:05d}.jsonl"


def shard_finished(out_dir: Path, index: int, remove: bool = True) -> bool:
    """A shard counts as decoded when it exists and matches the size and SHA-256 its ``.meta.json`` recorded
    (written after the shard): a shard damaged after the fact, or one whose meta a kill prevented, is decoded
    again (same prompts, same config: the same rows) instead of breaking the union or being half counted.
    ``remove``: delete such a shard; only its own rank may (another rank may be between writing it and its meta)."""
    path = shard_path(out_dir, index)
    meta = path.with_suffix(".meta.json")
    if not path.exists():
        return False
    try:
        info = json.loads(meta.read_text())
        ok = info["size"] == path.stat().st_size and info["sha256"] == file_digest(path)
    except (OSError, ValueError, KeyError, TypeError):
        ok = False
    if not ok and remove:
        log.warning("generation: %s does not match its record %s (damaged, or a kill came between them): "
                    "decoding it again", path.name, meta.name)
        path.unlink(missing_ok=True)
    return ok


def shard_indices(n_prompts: int, shard_size: int, rank: int, world_size: int) -> list[int]:
    """The shards rank ``rank`` owns: ``i % world_size == rank``."""
    if shard_size < 1:
        raise ValueError(f"shard_size must be >= 1, got {shard_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside world_size {world_size}")
    return [i for i in range(math.ceil(n_prompts / shard_size)) if i % world_size == rank]


def _dist():
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def _rank_world(rank, world_size):
    dist = _dist()
    if rank is None:
        rank = dist.get_rank() if dist else 0
    if world_size is None:
        world_size = dist.get_world_size() if dist else 1
    return int(rank), int(world_size)


def _constraint_names(cs_dict: dict) -> list[str | None]:
    """Names of the clauses then dynamic clauses: the order of ``Generation.satisfied``."""
    return [c.get("name") for c in cs_dict.get("clauses", [])] + [c.get("name") for c in cs_dict.get("dynamic", [])]


def _rows_for(prompt_rows: list[dict], generations) -> list[dict]:
    out = []
    for p, gens in zip(prompt_rows, generations):
        prov = {k: v for k, v in p.items() if k not in ROW_FIELDS and k != "constraints"}
        names = _constraint_names(p["constraints"])
        for j, g in enumerate(gens):
            out.append(dict(
                prompt_id=p["prompt_id"], prompt=p["prompt"], generation=g.text, score=float(g.score),
                logprob=float(g.logprob), num_tokens=int(g.num_tokens), satisfied=[bool(s) for s in g.satisfied],
                all_satisfied=bool(g.all_satisfied), matched=list(g.matched), rank_in_prompt=j,
                constraint_names=names, **prov,
            ))
    return out


def _check_fingerprint(out_dir: Path, fp: str, may_clean: bool) -> None:
    """Shards from other prompts/config are stale: remove them (the fingerprint file says which)."""
    marker = out_dir / FINGERPRINT_FILE
    if marker.exists() and marker.read_text().strip() == fp:
        return
    if not may_clean:
        return
    stale = sorted(out_dir.glob("shard-*.jsonl")) + sorted(out_dir.glob("shard-*.meta.json"))
    if marker.exists() and stale:
        log.info("generation: prompts or decoding config changed, removing %d stale shard files in %s",
                 len(stale), out_dir)
    for f in stale + [out_dir / UNION, out_dir / "generation_summary.json"]:
        f.unlink(missing_ok=True)
    if (out_dir / TABLE).is_dir():
        shutil.rmtree(out_dir / TABLE)
    write_text(marker, fp + "\n")


def generate_stage(model, tokenizer, prompts_path: Path, out_dir: Path, decoding_cfg: dict, tracker=None,
                   shard_size: int = 64, rank: int | None = None, world_size: int | None = None,
                   sample_rows: int = 20, model_key=None) -> dict:
    """Decode every prompt of ``prompts_path`` with NeuroLogic decoding; see the module docstring.

    ``model_key``: what identifies the model in the shards' fingerprint (its weights); default: the path it was
    loaded from, enough inside a stage whose own fingerprint holds the weights.

    Returns ``n_prompts``, ``n_generations``, ``constraint_satisfaction_rate`` (share of generations with
    every constraint satisfied) and ``prompts_per_s`` (decoding throughput over the finished shards) plus
    bookkeeping (``complete``, ``shards_decoded``, ``shards_skipped``). Until every rank's shards exist the
    counts cover this rank's shards only (``complete: False``).
    """
    from i2d2.decoding import ConstraintError, ConstraintSet, DecodingConfig, NeuroLogicDecoder, validate

    prompts_path, out_dir = Path(prompts_path), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rank, world = _rank_world(rank, world_size)
    dist = _dist()
    use_barrier = dist is not None and world == dist.get_world_size()
    cfg = dict(plain(decoding_cfg) or {})
    try:
        config = DecodingConfig(**cfg)
    except TypeError as e:
        raise ValueError(f"decoding config: {e} (keys: {', '.join(cfg)})") from None

    prompts = read_jsonl(prompts_path, required=("prompt_id", "prompt", "constraints"))
    if not prompts:
        raise DataError(f"{prompts_path}: no prompts")
    ids = [p["prompt_id"] for p in prompts]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise DataError(f"{prompts_path}: duplicate prompt_id {dup!r}")
    from i2d2 import decoding

    fp = fingerprint(prompts_path, cfg, int(shard_size), f"decoder-output-{decoding.OUTPUT_REVISION}",
                     getattr(getattr(model, "config", None), "_name_or_path", "") if model_key is None else model_key)
    _check_fingerprint(out_dir, fp, may_clean=(rank == 0 or not use_barrier))
    if use_barrier:
        dist.barrier()

    mine = shard_indices(len(prompts), shard_size, rank, world)
    todo = [i for i in mine if not shard_finished(out_dir, i)]
    n_mine = sum(len(prompts[i * shard_size:(i + 1) * shard_size]) for i in mine)
    n_done = n_mine - sum(len(prompts[i * shard_size:(i + 1) * shard_size]) for i in todo)
    if todo:
        log.info("generation rank %d/%d: %d of its %d shards to decode (%d finished earlier)",
                 rank, world, len(todo), len(mine), len(mine) - len(todo))
    # parse and check the constraints of every prompt this call decodes before spending time on any of them
    sets, checked = {}, set()
    encode = functools.lru_cache(maxsize=None)(lambda t: tuple(tokenizer(t, add_special_tokens=False)["input_ids"]))
    for i in todo:
        for p in prompts[i * shard_size:(i + 1) * shard_size]:
            where = f"{prompts_path}: prompt {p['prompt_id']}"
            try:
                cs = ConstraintSet.from_dict(p["constraints"])
                validate(cs, encode, where=where, checked=checked)  # word lists repeat across prompts: checked once
            except ConstraintError as e:
                raise DataError(f"bad constraints: {e}") from None
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                raise DataError(f"{where}: bad constraints: {e!r}") from None
            sets[p["prompt_id"]] = cs
    decoder = NeuroLogicDecoder(model, tokenizer, config) if todo else None
    # progress lines reach the log file too (a terminal's bar does not): hours at the paper's scale
    bar = LoggedBar(total=n_mine, initial=n_done, unit="prompt", desc=f"generate [rank {rank}/{world}]",
                    position=rank if world > 1 else None, dynamic_ncols=True, logger=log, min_seconds=0.0)
    t_call, n_call = time.time(), 0
    for i in todo:
        chunk = prompts[i * shard_size:(i + 1) * shard_size]
        t0 = time.time()
        gens = decoder.decode([p["prompt"] for p in chunk], [sets[p["prompt_id"]] for p in chunk])
        if len(gens) != len(chunk):
            raise RuntimeError(f"decoder returned {len(gens)} results for {len(chunk)} prompts")
        seconds = time.time() - t0
        rows = _rows_for(chunk, gens)
        write_jsonl(shard_path(out_dir, i), rows)  # atomic: the shard exists only once complete
        write_json(shard_path(out_dir, i).with_suffix(".meta.json"),  # after it: what shard_finished checks
                   {"prompts": len(chunk), "generations": len(rows), "seconds": round(seconds, 3), "rank": rank,
                    "size": shard_path(out_dir, i).stat().st_size, "sha256": file_digest(shard_path(out_dir, i))})
        n_call += len(chunk)
        bar.update(len(chunk))
    bar.close()
    call_seconds = time.time() - t_call

    if use_barrier:
        dist.barrier()
    all_shards = range(math.ceil(len(prompts) / shard_size))
    complete = all(shard_finished(out_dir, i, remove=i % world == rank) for i in all_shards)
    counted = list(all_shards) if complete else [i for i in mine if shard_finished(out_dir, i)]
    n_gen, n_sat, samples = 0, 0, []
    writer = rank == 0 or not use_barrier
    sample_every = max(1, len(prompts) // max(1, sample_rows))
    position = {pid: k for k, pid in enumerate(ids)}
    with _maybe_union(out_dir, complete and writer) as (union, table):
        for i in counted:
            with open(shard_path(out_dir, i)) as f:
                shard_rows = []
                for line in f:
                    if union is not None:
                        union.write(line)
                    row = json.loads(line)
                    if table is not None:
                        shard_rows.append(row)
                    n_gen += 1
                    n_sat += bool(row["all_satisfied"])
                    if row["rank_in_prompt"] == 0 and position[row["prompt_id"]] % sample_every == 0 \
                            and len(samples) < sample_rows:
                        samples.append(row)
            if table is not None and shard_rows:
                write_arrow(table / f"shard-{i:05d}.arrow", shard_rows)
    metas = [shard_path(out_dir, i).with_suffix(".meta.json") for i in counted]
    metas = [json.loads(m.read_text()) for m in metas if m.exists()]
    dec_seconds = sum(m["seconds"] for m in metas)
    summary = dict(
        n_prompts=len(prompts) if complete else n_mine, n_generations=n_gen,
        constraint_satisfaction_rate=n_sat / n_gen if n_gen else 0.0,
        prompts_per_s=sum(m["prompts"] for m in metas) / dec_seconds if dec_seconds > 0 else 0.0,
        complete=complete, rank=rank, world_size=world, shards=len(all_shards), shards_decoded=len(todo),
        shards_skipped=len(mine) - len(todo), prompts_decoded_now=n_call,
        call_prompts_per_s=n_call / call_seconds if n_call and call_seconds > 0 else 0.0,
        decoder_output_revision=decoding.OUTPUT_REVISION,
    )
    if complete and writer:
        write_json(out_dir / "generation_summary.json", summary)
        log.info("generation: %d prompts -> %d generations, %.1f%% satisfy every constraint, %.2f prompts/s",
                 len(prompts), n_gen, 100 * summary["constraint_satisfaction_rate"], summary["prompts_per_s"])
        if tracker is not None:
            tracker.log_metrics({f"generation/{k}": summary[k] for k in (
                "n_prompts", "n_generations", "constraint_satisfaction_rate", "prompts_per_s")})
            cols = ["prompt_id", "prompt", "generation", "score", "all_satisfied", "concept"]
            tracker.log_table("generation/samples", cols, [[r.get(c) for c in cols] for r in samples], out_dir)
    return summary


@contextmanager
def _maybe_union(out_dir: Path, enabled: bool):
    """(an open file that becomes generations.jsonl, a folder that becomes the table), both atomically on
    success, or (None, None)."""
    if not enabled:
        yield None, None
        return
    with atomic_dir(out_dir / TABLE) as table, atomic_path(out_dir / UNION) as tmp, open(tmp, "w") as f:
        yield f, table


def generations_table(out_dir: Path):
    """The stage table of a finished generation stage, memory-mapped (a ``datasets.Dataset``)."""
    return read_table(Path(out_dir) / TABLE, columns=["prompt_id", "generation"])


def warn_if_older_decoder(out_dir: Path, stage_dir: Path | None = None) -> bool:
    """A finished generation stage is reused by its stage fingerprint (prompts, decoding config, model), which does
    not name the decoder's output revision: re-decoding every earlier run after each decoder fix would be the
    other choice. Say so when the generations were written by another revision than this decoder's (or before
    revisions were recorded), naming the folder to delete to decode them again: ``stage_dir``, the finished stage
    that holds ``out_dir`` (``out_dir`` itself by default). True when it warned."""
    from i2d2 import decoding

    path = Path(out_dir) / "generation_summary.json"
    try:
        rev = json.loads(path.read_text(encoding="utf-8")).get("decoder_output_revision")
    except (OSError, ValueError):
        return False
    if rev == decoding.OUTPUT_REVISION:
        return False
    log.warning("%s: reused generations written by %s; this decoder is output revision %d (i2d2.decoding."
                "OUTPUT_REVISION). Delete %s to decode them again with it.", out_dir,
                "a decoder that did not record its revision (older, or revision 3 before it was recorded)"
                if rev is None else f"decoder output revision {rev}",
                decoding.OUTPUT_REVISION, stage_dir or out_dir)
    return True


def read_generations(out_dir: Path) -> list[dict]:
    """The rows of a finished generation stage as dicts (small tables: held-out sets, comparatives)."""
    out_dir = Path(out_dir)
    if not (out_dir / TABLE).is_dir():  # a stage written before the Arrow table
        return read_jsonl(out_dir / UNION, required=("prompt_id", "generation"))
    return generations_table(out_dir).to_list()


__all__ = ["generate_stage", "shard_indices", "shard_path", "read_generations", "generations_table", "ROW_FIELDS",
           "warn_if_older_decoder"]
