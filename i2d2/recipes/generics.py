"""I2D2's self-imitation loop (i2d2.txt §2.4, Algorithm 1): ``python -m i2d2.train iteration=k``.

Iteration k, in ``{run_dir}/iter_{k}/``:

  prompt_scores/  P_0's perplexity of every prompt variant, one share per rank (ppl-rank<r>.npz; iteration 0)
  prompts/      the prompt pool (built once, with P_0, in iteration 0) and the prompts of this iteration
  generations/  NeuroLogic generations of P_k (shards; resumable; split over ranks under DDP), table/ (Arrow)
                and generations.jsonl (readable export)
  critic/       the critic Ω trained on the labels available (seed set + the run's labels store), or a
                pointer to an earlier iteration's critic when the labels did not change (task.critic.refresh)
  critic_scores/  the critic's P(valid) of every finished generation, one share per rank (scores-rank<r>.npz)
  filtered/     kept/ / dropped/ / scores/ (Arrow tables; kept.jsonl: readable export): critic score > δ
                (+ constraints satisfied, de-duplicated);
                to_label.csv: a stratified sample to label for the next critic (python -m i2d2.annotate)
  finetune/     Lightning checkpoints of the fine-tuning (resumable)
  model/        P_{k+1} in save_pretrained format (written atomically)
  report/ + report.md, config.yaml

P_0 is ``model.name``; P_k (k > 0) is ``iter_{k-1}/model``. Every stage runs through ``i2d2.io.run_stage``
with a fingerprint of its inputs: a finished stage is skipped on restart, an unfinished one resumes from its
last finished unit, a stage whose inputs changed is redone.

Multi-process: ``trainer=ddp`` (or DeepSpeed) with several devices relaunches the command once per rank
(Lightning's launcher) before the first stage; prompt perplexity, generation, critic scoring and fine-tuning then
run on every rank, the other stages on rank 0 while the other ranks wait for its result. Fork-based strategies
(``trainer.strategy=ddp_fork``) keep one main process and fork the ranks for those four stages.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from omegaconf import DictConfig, OmegaConf

from i2d2.lightning_setup import plain as _plain  # config node -> plain dicts/lists
from i2d2.config import ConfigError, is_int, is_num, need, need_counts
from i2d2.concepts import data_files
from i2d2.io import DONE, DamagedOutputError, DataError, fingerprint, in_run, iteration_model_dir, mark_done, named, \
    model_fingerprint, prepare_stage, read_json, read_jsonl, read_table, run_relative, run_stage, stage_done, \
    verified_iteration_model, write_json, write_jsonl, write_text

log = logging.getLogger(__name__)

FORK_STRATEGIES = ("ddp_fork", "ddp_notebook", "ddp_spawn")
REFRESH = ("new_labels", "always", "never")
SAMPLING = ("fixed", "fresh")
FILTER_FORMAT = 8  # 2: unfinished generations dropped before the critic, near-duplicates; 3: max_per_concept;
# 4: kept/, dropped/, scores/ Arrow tables (kept.jsonl: export), read from generations/table; 5: near-duplicates
# also by content words (filtering.content_key: word order, article, number, modal); lists repeating an item dropped;
# 6: max_per_frame; 7: a list repeating its first item dropped ("cut wood, wood"), near-duplicate ratios cut exactly
# (not rounded to integers first); 8: a trailing ellipsis ("..." or "…") is unfinished, and "..." no sentence end
# to truncate at
# The output format version of each stage, part of its fingerprint: bump one when what the stage writes changes,
# so that a run folder written by an older version redoes that stage instead of reading the old format.
STAGE_FORMAT = {"prompt_scores": 1, "prompts": 1, "generation": 2, "critic": 1, "critic_scores": 1, "filter": FILTER_FORMAT, "heldout": 1,
                "finetune": 1}
TASK_KEYS = {"name", "recipe", "max_prompts", "prompt_sampling", "critic", "filter", "finetune", "report", "annotation",
             "heldout"}


class MissingIterationError(FileNotFoundError):
    """iteration=k asked for, but iteration k-1's model is not in run_dir."""


# ----------------------------------------------------------------------------- configuration checks

def _get(cfg, dotted: str, default=None):
    v = OmegaConf.select(cfg, dotted, default=default) if isinstance(cfg, DictConfig) else cfg.get(dotted, default)
    return default if v is None else v


def check_config(cfg: DictConfig) -> None:
    """Fail before any work, naming the field, for settings the loop cannot run."""
    from i2d2.lightning_setup import check_trainer_cfg
    from i2d2.schemas import DecodingConfig

    it, n = cfg.get("iteration"), cfg.get("num_iterations", 1)
    need(is_int(it) and it >= 0, "iteration", f"must be an integer >= 0, got {it!r}")
    need(is_int(n) and n >= 1, "num_iterations", f"must be an integer >= 1, got {n!r}")
    # iteration k starts from iteration k-1's model: say so now, not after the lock and the loggers
    generator = generator_name(cfg, it)
    t = cfg.task
    unknown = sorted(set(t) - TASK_KEYS)
    need(not unknown, "task", f"unknown key(s) {unknown} in conf/task/i2d2.yaml; known: {sorted(TASK_KEYS)}")
    mp = t.get("max_prompts")
    need(mp is None or (isinstance(mp, int) and mp >= 1), "task.max_prompts", f"must be null or an integer >= 1, got {mp!r}")
    need(t.get("prompt_sampling", "fixed") in SAMPLING, "task.prompt_sampling", f"must be one of {SAMPLING}")
    need(_get(t, "critic.refresh", "new_labels") in REFRESH, "task.critic.refresh",
         f"must be one of {REFRESH}, got {_get(t, 'critic.refresh')!r}")
    d = _get(t, "filter.delta")
    need(d is None or (isinstance(d, (int, float)) and 0.0 <= d < 1.0), "task.filter.delta",
         f"must be null (use the critic's δ) or a number in [0, 1), got {d!r}")
    need(_get(t, "filter.truncate", "sentence") in ("none", "newline", "sentence"), "task.filter.truncate",
         f"must be none, newline or sentence, got {_get(t, 'filter.truncate')!r}")
    r = OmegaConf.select(t, "filter.near_duplicate_ratio", default=90)
    need(is_num(r) and 0 < r <= 100, "task.filter.near_duplicate_ratio",
         f"must be a rapidfuzz ratio in (0, 100] (100: exact duplicates only), got {r!r}")
    need_counts(cfg, "data.perplexity.batch_size", "data.perplexity.chunk_size", "data.generation.shard_size",
                null_ok=True)
    try:  # the concept sources are read after the LM has loaded: a misspelt one fails here, naming its key
        from i2d2.concepts import check_sources
        from i2d2.prompts import check_prompt_config, heldout_concepts

        check_sources(cfg.data)
        check_prompt_config(cfg.data)
        if t.get("heldout"):  # a bad held-out concept or list failed in the held-out stage, after generation and the critic
            rel, lists = t.heldout.get("relations") or "genericskb", cfg.data.get("relations") or {}
            if any(c.kind == "noun" for c in heldout_concepts(t.heldout)) and rel not in lists:
                raise ValueError(f"task.heldout.relations: {rel!r} is not a relational-phrase list of data.relations "
                                 f"({', '.join(lists)})")
    except (ValueError, FileNotFoundError) as e:
        raise ConfigError(str(e)) from None
    for key in ("max_per_frame", "max_per_concept"):
        v = _get(t, f"filter.{key}")
        need(v is None or (is_int(v) and v >= 1), f"task.filter.{key}",
             f"must be null (no limit) or an integer >= 1, got {v!r}")
    if t.get("heldout"):
        v = OmegaConf.select(t, "heldout.prompts_per_concept", default=2)  # a null is refused, not defaulted
        need(is_int(v) and v >= 1, "task.heldout.prompts_per_concept",
             f"must be an integer >= 1, got {v!r}")
    v = OmegaConf.select(t, "annotation.k_per_concept", default=4)
    need(is_int(v) and v >= 0, "task.annotation.k_per_concept",
         f"must be an integer >= 0 (0: none), got {v!r}")
    for key, default, least in (("samples", 10, 0), ("self_bleu_sample", 200, 2)):  # -3 was taken as "all but 3"
        v = OmegaConf.select(t, f"report.{key}", default=default)
        need(is_int(v) and v >= least, f"task.report.{key}", f"must be an integer >= {least}, got {v!r}")
    for key, default in (("mnr_fraction", 0.3), ("mnr_bleu", 0.85)):
        v = OmegaConf.select(t, f"report.{key}", default=default)
        need(is_num(v) and 0 < v <= 1, f"task.report.{key}",
             f"must be in (0, 1], got {v!r}")
    try:
        from i2d2.schemas import CriticConfig, fill

        critic = fill(CriticConfig, cfg.critic, where="critic")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    # the critic stage runs after generation: its labelled data are read and split here first (a fraction of a
    # second), so a missing, broken or too small file fails now, naming its line, not after generation; so does a
    # probe's few-shot context without enough candidates
    from critics.probe import probe_context
    from critics.train import checked_labels

    _, (rows, texts, _, (train_idx, _, _), _) = checked_labels(critic, list(critic["seed_annotations"]), cfg.run_dir)
    if critic["kind"] == "probe" and critic["probe_context"]["examples"]:
        try:  # its message names critic.probe_context
            probe_context(critic, rows, texts, train_idx)
        except ValueError as e:
            raise ConfigError(str(e)) from None
    # types and key names: i2d2/schemas.py (checked at composition); here the ranges
    ft = t.finetune
    need(ft.lr > 0, "task.finetune.lr", f"must be > 0, got {ft.lr!r}")
    for key in ("epochs", "batch_size", "accumulate_grad_batches", "max_length", "ckpt_every_n_steps"):
        need(ft[key] >= 1, f"task.finetune.{key}", f"must be >= 1, got {ft[key]!r}")
    # max_steps=0 is Lightning's "no step": P_{k+1} was saved as P_k, unchanged, as if fine-tuned
    need(ft.max_steps == -1 or ft.max_steps >= 1, "task.finetune.max_steps",
         f"must be -1 (no cap) or an integer >= 1, got {ft.max_steps!r}")
    need(0 <= ft.warmup_ratio < 1, "task.finetune.warmup_ratio", f"must be in [0, 1), got {ft.warmup_ratio!r}")
    need(ft.weight_decay >= 0, "task.finetune.weight_decay", f"must be >= 0, got {ft.weight_decay!r}")
    need(not ft.lora.enabled or ft.lora.r >= 1, "task.finetune.lora.r", f"must be >= 1, got {ft.lora.r!r}")
    need(not ft.lora.enabled or 0 <= ft.lora.dropout < 1, "task.finetune.lora.dropout",
         f"must be in [0, 1), got {ft.lora.dropout!r}")
    if ft.lora.enabled:  # target_modules against the generator's modules (its skeleton, no weights read)
        from i2d2.models import check_lora_targets

        try:
            check_lora_targets(generator, ft.lora, "task.finetune.lora", cfg.get("cache_dir"))
        except ValueError as e:
            raise ConfigError(str(e)) from None
    try:
        DecodingConfig(**OmegaConf.to_container(cfg.decoding, resolve=True))
    except (TypeError, ValueError) as e:
        raise ConfigError(f"decoding.{e}") from None
    try:
        check_trainer_cfg(OmegaConf.to_container(cfg.trainer, resolve=True))
    except RuntimeError as e:
        raise ConfigError(str(e)) from None
    check_strategy(OmegaConf.to_container(cfg.trainer, resolve=True))


def generator_name(cfg: DictConfig, k: int) -> str:
    """P_k: the configured base LM for k = 0, else the model iteration k-1 wrote (its files as the fine-tuning stage
    recorded them: a truncated safetensors failed in transformers, naming no file)."""
    if k == 0:  # another run's iter_j/model given as model.name: checked at start-up (models.check_model_folder)
        return str(cfg.model.name)
    try:
        prev = verified_iteration_model(cfg.run_dir, k - 1)
    except DamagedOutputError as e:  # the marker is what makes the model checked: without it, loaded as it is
        raise MissingIterationError(
            f"iteration={k} starts from iteration {k - 1}'s model: {e.damage}. If it was damaged, run "
            f"`python -m i2d2.train iteration={k - 1}` again with the same run_dir (its fine-tuning is redone). If "
            f"you replaced {e.folder} on purpose, delete {e.marker} and run iteration={k} again: the folder is then "
            f"used unchecked (rerunning iteration {k - 1} would redo its fine-tuning over your model)") from None
    except DataError as e:
        raise MissingIterationError(f"iteration={k} starts from iteration {k - 1}'s model: {e}. Run "
                                    f"`python -m i2d2.train iteration={k - 1}` again with the same run_dir "
                                    "(its fine-tuning is redone)") from None
    if prev is None:
        have = sorted(p.parent.parent.name for p in Path(cfg.run_dir).glob("iter_*/model/config.json"))
        raise MissingIterationError(
            f"iteration={k} starts from iteration {k - 1}'s model, but {iteration_model_dir(cfg.run_dir, k - 1)} "
            f"does not exist (run_dir={cfg.run_dir}; finished iterations there: {have or 'none'}). "
            f"Run `python -m i2d2.train iteration={k - 1}` first with the same run_dir, or set iteration/run_dir.")
    return str(prev)


# ----------------------------------------------------------------------------- ranks

@dataclass
class Ranks:
    rank: int = 0
    world: int = 1
    mode: str = "single"   # single | fork (ranks forked per stage) | subprocess (whole command per rank)

    @property
    def zero(self) -> bool:
        return self.rank == 0


def check_strategy(tc: dict) -> None:
    """A trainer config asking for several processes names a strategy the loop can launch ranks with (read by
    ``check_config`` too: ``trainer.devices=[0,1]`` with the default ``strategy: auto`` was refused only here, once
    the run had started)."""
    from i2d2.lightning_setup import is_deepspeed, strategy_name, world_size_of

    world, name = world_size_of(tc), strategy_name(tc)
    if world > 1 and not (name in FORK_STRATEGIES or name.startswith("ddp") or is_deepspeed(tc)):
        raise ConfigError(f"trainer.strategy={name!r} with {world} devices (trainer.devices={tc.get('devices')!r}): "
                          "the loop supports ddp, ddp_fork, ddp_spawn and DeepSpeed strategies")


def launch(cfg: DictConfig) -> Ranks:
    """Start the ranks a multi-device trainer config asks for (see the module docstring)."""
    from i2d2.lightning_setup import strategy_name, world_size_of

    tc = OmegaConf.to_container(cfg.trainer, resolve=True)
    world = world_size_of(tc)
    if world == 1:
        return Ranks()
    check_strategy(tc)
    if strategy_name(tc) in FORK_STRATEGIES:
        return Ranks(0, world, "fork")
    import torch.distributed as dist
    from lightning.fabric import Fabric

    if not (dist.is_available() and dist.is_initialized()):
        fabric = Fabric(accelerator=tc.get("accelerator", "auto"), devices=tc.get("devices", 1),
                        num_nodes=int(tc.get("num_nodes", 1) or 1), strategy="ddp")
        fabric.launch()  # re-runs this command once per extra rank; initialises the process group
        from i2d2.ranks import LAUNCHED_RANKS

        LAUNCHED_RANKS[:] = getattr(fabric.strategy.launcher, "procs", ())  # i2d2.train passes a SIGTERM on to them
    return Ranks(dist.get_rank(), dist.get_world_size(), "subprocess")


def _forked(cfg, ranks: Ranks, worker: Callable, *args):
    """Run ``worker(fabric, *args)`` on ``ranks.world`` forked ranks (``trainer.strategy=ddp_fork``); rank 0's result."""
    from lightning.fabric import Fabric

    tc = _plain(cfg.trainer)
    fabric = Fabric(accelerator=tc.get("accelerator", "cpu"), devices=ranks.world, strategy=tc["strategy"])
    return fabric.launch(worker, *args)


def _barrier(ranks: Ranks) -> None:
    if ranks.mode == "subprocess":
        import torch.distributed as dist

        dist.barrier()


def _wait_for(out_dir: Path, fp: str, poll: float = 2.0) -> dict:
    """Non-zero ranks wait (without a collective timeout) for rank 0 to finish a rank-0 stage."""
    failed = out_dir / "_FAILED.json"
    ppid = os.getppid()
    while True:
        done = stage_done(out_dir, fp)
        if done is not None:
            return done
        if failed.exists() and json.loads(failed.read_text()).get("fingerprint") == fp:
            raise RuntimeError(f"rank 0 failed in stage {out_dir}: {json.loads(failed.read_text()).get('error')}")
        if os.getppid() != ppid:
            raise RuntimeError("the launching process exited; stopping this rank")
        time.sleep(poll)


def stage(ranks: Ranks, out_dir: Path, fp: str, fn: Callable[[Path], dict | None], name: str,
          all_ranks: bool = False, outputs: tuple = ()) -> dict:
    """``run_stage`` with ranks: rank-0 stages make the others wait; all-rank stages run ``fn`` everywhere.
    The stage's format version joins its fingerprint; ``outputs`` outside ``out_dir`` are removed before a run."""
    out_dir = Path(out_dir)
    fp = fingerprint(fp, named("format version", STAGE_FORMAT[name]))
    if ranks.mode != "subprocess":
        return run_stage(out_dir, fp, fn, name, outputs)
    if not all_ranks:
        if not ranks.zero:
            return _wait_for(out_dir, fp)
        try:
            return run_stage(out_dir, fp, fn, name, outputs)
        except BaseException as e:
            write_json(out_dir / "_FAILED.json", {"fingerprint": fp, "error": repr(e)})
            raise
    _barrier(ranks)
    done = stage_done(out_dir, fp)
    if done is not None:
        return done
    if ranks.zero:
        prepare_stage(out_dir, fp, name, outputs)
    _barrier(ranks)
    summary = fn(out_dir) or {}
    _barrier(ranks)
    if ranks.zero:
        mark_done(out_dir, fp, summary, outputs)
    _barrier(ranks)
    return stage_done(out_dir, fp) or summary  # rank 0's summary on every rank


# ----------------------------------------------------------------------------- the stages

_model_id = model_fingerprint  # a local model folder's bytes, else its name


def _share_done(path: Path, mine: np.ndarray) -> bool:
    """A rank's share file from an earlier, killed attempt at the same stage inputs: kept when it covers ``mine``
    (the stage's fingerprint holds the inputs and the number of ranks)."""
    if not path.exists():
        return False
    try:
        return np.array_equal(np.load(path)["position"], mine)
    except Exception:  # a damaged file is scored again
        return False


def _check_shares(d: Path, name: str, n: int) -> dict:
    """The summary of an all-ranks scoring stage, after checking that the shares cover positions 0..n-1."""
    files = sorted(d.glob(f"{name}-rank*.npz"))
    got = int(sum(len(np.load(p)["position"]) for p in files))
    if got != n:
        raise RuntimeError(f"{d}: the {len(files)} {name}-rank*.npz shares hold {got} scores for {n} items")
    return {"n_scored": got, "ranks": len(files)}


def _write_share(path: Path, mine: np.ndarray, scores: np.ndarray) -> None:
    from i2d2.io import atomic_path

    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, position=mine, score=scores)


def ppl_share(model, tok, texts: list[str], out_dir: Path, ppl_cfg: dict, rank: int = 0, world: int = 1) -> int:
    """One rank's share of the prompt-perplexity pass: variants ``rank, rank + world, ...`` scored (resumable chunk
    by chunk) and saved as ``ppl-rank<r>.npz`` (positions, perplexities). Returns how many it scored."""
    from i2d2.prompts import score_texts

    mine = np.arange(rank, len(texts), world)
    if _share_done(out_dir / f"ppl-rank{rank}.npz", mine):
        return len(mine)
    ppl = score_texts(model, tok, [texts[i] for i in mine], out_dir / f".work-rank{rank}",
                      batch_size=int(ppl_cfg.get("batch_size") or 32), per=ppl_cfg.get("per") or "word",
                      chunk=int(ppl_cfg.get("chunk_size") or 1024), progress=rank == 0)
    _write_share(out_dir / f"ppl-rank{rank}.npz", mine, ppl)
    shutil.rmtree(out_dir / f".work-rank{rank}", ignore_errors=True)
    return len(mine)


def _ppl_worker(fabric, model, tok, texts, out_dir, ppl_cfg):
    """One rank of a forked prompt-perplexity stage (Fabric passes itself first)."""
    return ppl_share(model.to(fabric.device).eval(), tok, texts, out_dir, ppl_cfg, fabric.global_rank,
                     fabric.world_size)


def prompt_scores_stage(cfg, it_dir: Path, texts: list[str], lm, ranks: Ranks) -> Path | None:
    """P_0's per-word perplexity of the prompt variants ``texts`` (20M at the paper's scale), split over the ranks
    like generation; the prompts stage reads the joined shares (``read_shares``). None when there is nothing to
    score (``prompt_selection=forms`` without a threshold)."""
    if not texts:
        return None
    out = it_dir / "prompt_scores"
    ppl_cfg = _plain(_get(cfg.data, "perplexity") or {})
    # what the scores depend on: the texts, the unit, the model and the number of shares (not the threshold)
    fp = fingerprint("prompt_scores", named("prompt variants", texts),
                     named("perplexity per", ppl_cfg.get("per") or "word"),
                     named("model", _model_id(str(cfg.model.name))), named("ranks", ranks.world),
                     *_dtype_part(cfg, str(cfg.model.name)))

    def fn(d: Path) -> dict:
        model, tok = lm()
        if ranks.mode == "fork":
            _forked(cfg, ranks, _ppl_worker, model, tok, texts, d, ppl_cfg)
        else:
            ppl_share(model.to(_device(cfg)).eval(), tok, texts, d, ppl_cfg,
                      ranks.rank if ranks.mode == "subprocess" else 0, ranks.world if ranks.mode == "subprocess" else 1)
        _barrier(ranks)
        return _check_shares(d, "ppl", len(texts))

    stage(ranks, out, fp, fn, "prompt_scores", all_ranks=True)
    return out


def _dtype_part(cfg, name: str) -> list:
    """A fingerprint part: ``model.dtype`` where it changes what the LM computes (a bfloat16 model decodes, scores
    perplexity and fine-tunes otherwise than a float32 one); none for the default float32 (a run from before keeps
    its fingerprints) and for tiny:* models, which load in float32 whatever it says."""
    dtype = _get(cfg.model, "dtype")
    return [] if str(dtype) in ("None", "float32", "torch.float32") or str(name).startswith("tiny:") \
        else [named("model config", {"dtype": str(dtype)})]


def _heldout_overlap(cfg_data, held: set[str]) -> list:
    """A fingerprint part: the held-out concepts the data sources also list (left out of the loop's prompts); none
    when there is no overlap, so that a pool built without any keeps its fingerprint."""
    from i2d2.concepts import load_concepts

    overlap = sorted(held & {c.text.lower() for c in load_concepts(cfg_data)}) if held else []
    return [named("heldout overlap", {"heldout_excluded": overlap})] if overlap else []


def prompts_stage(cfg, k: int, it_dir: Path, lm, tracker, ranks: Ranks) -> tuple[Path, dict]:
    from i2d2.prompts import build_generic_prompts, heldout_keys, prompt_candidates

    out = it_dir / "prompts"
    held = heldout_keys(cfg.task.get("heldout"))  # never prompted, kept, labelled or fine-tuned on in the loop
    pool0 = Path(cfg.run_dir) / "iter_0" / "prompts" / "all.jsonl"
    sampling = cfg.task.get("prompt_sampling", "fixed")
    max_prompts = cfg.task.get("max_prompts")
    scored = cand = None
    if k == 0:
        # the concept and phrase files' bytes, not only their paths: an edited concepts.txt is a new input
        fp = fingerprint("prompts", named("data config", _plain(cfg.data)), *data_files(cfg.data),
                         named("model", _model_id(str(cfg.model.name))), named("max_prompts", max_prompts),
                         named("prompt_sampling", sampling), named("seed", int(cfg.seed)),
                         *_heldout_overlap(cfg.data, held),
                         *_dtype_part(cfg, str(cfg.model.name)))
        if stage_done(out, fingerprint(fp, STAGE_FORMAT["prompts"])) is None:  # a built pool needs no scores
            cand = prompt_candidates(cfg.data, exclude=held)  # on every rank: each scores its share of the same variants
            scored = prompt_scores_stage(cfg, it_dir, cand.to_score(), lm, ranks)
    else:
        if not pool0.exists():
            raise MissingIterationError(f"iteration {k} reuses iteration 0's prompt pool, but {pool0} is missing")
        fp = fingerprint("prompts", pool0, named("max_prompts", max_prompts), named("prompt_sampling", sampling),
                         named("seed", int(cfg.seed)),
                         named("fresh prompts for iteration", k if sampling == "fresh" else 0))

    def fn(d: Path) -> dict:
        info: dict = {}
        if k == 0:
            ppl = read_shares(scored, "ppl") if scored is not None else None
            info = build_generic_prompts(cfg.data, None, None, d / "all.jsonl", tracker=tracker, candidates=cand, ppl=ppl)
        else:
            shutil.copyfile(pool0, d / "all.jsonl")
        pool = read_jsonl(d / "all.jsonl", required=("prompt_id", "prompt", "constraints"))
        rng = np.random.default_rng(int(cfg.seed) + (k if sampling == "fresh" else 0))
        rows = sample_prompts(pool, max_prompts, rng)
        write_jsonl(d / "prompts.jsonl", rows)
        how = ("the whole pool" if len(rows) == len(pool) else f"task.max_prompts={max_prompts}, "
               + ("drawn afresh each iteration" if sampling == "fresh" else "the same draw each iteration"))
        log.info("prompts: iteration %d decodes %d of the pool's %d prompts (%s), %d concepts", k, len(rows),
                 len(pool), how, len({r.get("concept") for r in rows}))
        return {"n_pool": len(pool), "n_prompts": len(rows),
                "n_concepts": len({r.get("concept") for r in rows}), **{f"build_{a}": b for a, b in info.items()
                                                                       if isinstance(b, (int, float))}}

    summary = stage(ranks, out, fp, fn, "prompts")
    return out / "prompts.jsonl", summary


def sample_prompts(pool: list[dict], max_prompts: int | None, rng: np.random.Generator) -> list[dict]:
    """``max_prompts`` prompts spread over the concepts: concepts in random order, one prompt per concept
    per round (random within a concept), so that no concept with many templates crowds out the others.
    Returned in pool order."""
    if max_prompts is None or len(pool) <= max_prompts:
        return list(pool)
    by_concept: dict[str, list[int]] = {}
    for i, p in enumerate(pool):
        by_concept.setdefault(str(p.get("concept", "")), []).append(i)
    queues = [list(rng.permutation(v)) for _, v in sorted(by_concept.items())]
    queues = [queues[j] for j in rng.permutation(len(queues))]
    chosen: list[int] = []
    while len(chosen) < max_prompts:
        for q in queues:
            if q and len(chosen) < max_prompts:
                chosen.append(int(q.pop()))
    return [pool[i] for i in sorted(chosen)]


def _gen_worker(fabric, model, tok, prompts_path, out_dir, decoding, shard_size, sample_rows):
    """One rank of a forked generation stage (Fabric passes itself first)."""
    from i2d2.generation import generate_stage

    model = model.to(fabric.device).eval()
    return generate_stage(model, tok, prompts_path, out_dir, decoding, shard_size=shard_size,
                          rank=fabric.global_rank, world_size=fabric.world_size, sample_rows=sample_rows)


def generation_stage(cfg, it_dir: Path, prompts_path: Path, model_key: str, lm, tracker, ranks: Ranks) -> dict:
    from i2d2.generation import generate_stage, warn_if_older_decoder

    out = it_dir / "generations"
    shard = int(_get(cfg.data, "generation.shard_size", 64))
    sample_rows = int(_get(cfg.data, "generation.sample_rows", 20))
    decoding = _plain(cfg.decoding)
    fp = fingerprint("generation", prompts_path, named("decoding config", decoding), named("shard_size", shard),
                     named("model", model_key), *_dtype_part(cfg, lm.name))

    def fn(d: Path) -> dict:
        model, tok = lm()
        if ranks.mode == "fork":
            _forked(cfg, ranks, _gen_worker, model, tok, prompts_path, d, decoding, shard, sample_rows)
            if not (d / "generations.jsonl").exists():
                raise RuntimeError(f"forked generation finished without {d / 'generations.jsonl'}")
            summary = json.loads((d / "generation_summary.json").read_text())
            if tracker is not None:
                tracker.log_metrics({f"generation/{k}": summary[k] for k in (
                    "n_prompts", "n_generations", "constraint_satisfaction_rate", "prompts_per_s")})
            return summary
        device = _device(cfg)
        model.to(device).eval()
        summary = generate_stage(model, tok, prompts_path, d, decoding, tracker=tracker if ranks.zero else None,
                                 shard_size=shard, sample_rows=sample_rows,
                                 rank=ranks.rank if ranks.mode == "subprocess" else None,
                                 world_size=ranks.world if ranks.mode == "subprocess" else None)
        if not summary.get("complete", True):
            raise RuntimeError(f"generation incomplete in {d}: {summary}")
        return summary

    summary = stage(ranks, out, fp, fn, "generation", all_ranks=True)
    if ranks.zero:
        warn_if_older_decoder(out)
    return summary


def _device(cfg) -> str:
    from i2d2.lightning_setup import resolve_device

    return resolve_device(cfg.trainer)


def critic_trainer(cfg, ranks: Ranks) -> dict:
    """The critic's trainer: one device in a single main process (fork strategies included), plain DDP over
    the launched ranks otherwise (a small classifier needs no DeepSpeed; every rank must join its collectives)."""
    from i2d2.lightning_setup import is_deepspeed, single_device_trainer

    tc = _plain(cfg.trainer)
    out = single_device_trainer(tc)
    if ranks.mode == "subprocess":
        out.update(devices=tc.get("devices"), num_nodes=tc.get("num_nodes", 1) or 1,
                   strategy="ddp" if is_deepspeed(tc) else tc.get("strategy", "ddp"))
    return out


def _warn_unimported_labels(run_dir, k: int) -> None:
    """An earlier iteration's ``to_label.csv`` labelled where it lies but not imported trains no critic: the next
    iteration said only "labels unchanged ... reusing its critic"."""
    from i2d2.annotation import labels_not_imported, labels_store

    store = labels_store(run_dir)
    for j in range(k):
        path = Path(run_dir) / f"iter_{j}" / "filtered" / "to_label.csv"
        n = labels_not_imported(path, store) if path.exists() else 0
        if n:
            log.warning("critic: %s holds %d label(s) not in the labels store, so this critic does not learn from "
                        "them: import them first (python -m i2d2.annotate import --input %s --store %s)",
                        path, n, path, store)


def critic_stage(cfg, k: int, it_dir: Path, model_key: str, lm, tracker, ranks: Ranks) -> dict:
    from critics.train import FIT_ARGS, fingerprint_view, log_critic_metrics, train_critic
    from i2d2.annotation import critic_annotation_paths
    from i2d2.lightning_setup import fit_settings

    out = it_dir / "critic"
    paths = critic_annotation_paths(list(_get(cfg.critic, "seed_annotations", ["generics_gemma.jsonl"])), cfg.run_dir)
    view = fingerprint_view(_plain(cfg.critic))
    # what the fit runs under (accumulate_grad_batches, gradient_clip_val, precision, ranks): a critic trained with
    # other settings was reused, in this iteration and the next; a probe is fitted without a trainer
    fit = [] if view.get("kind") == "probe" else [fit_settings(critic_trainer(cfg, ranks), FIT_ARGS)]
    labels_fp = fingerprint("critic", *paths, named("critic config", view),
                            *[named("trainer settings", f) for f in fit])
    policy = _get(cfg.task, "critic.refresh", "new_labels")
    _warn_unimported_labels(cfg.run_dir, k)
    source = None  # the iteration whose critic to reuse
    if k > 0 and policy != "always":
        for j in range(k - 1, -1, -1):
            prev = Path(cfg.run_dir) / f"iter_{j}" / "critic"
            marker = prev / DONE
            if not marker.exists():
                continue
            try:  # what it was trained on; a damaged marker (a traceback here) says nothing: that critic is not reused
                info = json.loads(marker.read_text())["summary"]
                info.get("labels_fingerprint")
            except (ValueError, TypeError, KeyError, AttributeError):
                # an earlier iteration's critic may still be reused (as past a missing marker): the next lines say
                log.warning("critic: %s is damaged: iteration %d's critic cannot be reused", marker, j)
                continue
            if policy == "never" or info.get("labels_fingerprint") == labels_fp:
                source = (j, info)
            break
    # a critic trained here also reports P_k's perplexity as the baseline ranker (ap_perplexity): which LM that is,
    # is an input too (a run folder continued with another model.name must not keep the old model's baseline)
    trained_by = [named("baseline ranker", {"perplexity_baseline": model_key}), *_dtype_part(cfg, lm.name)] \
        if source is None else []
    fp = fingerprint(labels_fp, named("critic refresh", policy),  # a reused critic by its weights
                     named("reused critic", None if source is None else in_run(source[1]["model_dir"], cfg.run_dir)),
                     *trained_by)

    def fn(d: Path) -> dict:
        if source is not None:
            j, info = source
            for f in ("metrics.json", "dev_scores.jsonl", "test_scores.jsonl", "probe_scores.jsonl", "pr_curve.png",
                      "score_histogram.png"):
                src = Path(cfg.run_dir) / f"iter_{j}" / "critic" / f
                if src.exists():
                    shutil.copyfile(src, d / f)
            log.info("critic: labels unchanged since iteration %d (task.critic.refresh=%s): reusing its critic", j, policy)
            reused = {**info, "reused_from": j if info.get("reused_from") is None else info["reused_from"]}
            if tracker is not None:  # this iteration's run records its critic's numbers under critic/ as a fit's
                log_critic_metrics(tracker, reused)
            return reused
        summary = train_critic(cfg.critic, paths, d, trainer_cfg=critic_trainer(cfg, ranks), tracker=tracker,
                               lm=lm() if ranks.zero else None)  # P_k's perplexity: the baseline ranker
        # recorded relative to run_dir (the run folder can move); read back with in_run
        files = {key: run_relative(summary[key], cfg.run_dir) for key in ("model_dir", "pr_curve", "score_histogram")
                 if summary.get(key)}
        return {**summary, **files, "labels_fingerprint": labels_fp,
                "annotation_paths": [run_relative(p, cfg.run_dir) for p in paths], "reused_from": None}

    # under a launched DDP run every rank joins the critic's fit (Lightning/torchmetrics collectives)
    return stage(ranks, out, fp, fn, "critic", all_ranks=source is None)


# not the last dot of an ellipsis ("loyal... and"): as "…", it does not end the sentence (filtering.ends_sentence)
_SENTENCE_END = re.compile(r"(?<!\.)[.!?](?=\s|$)")


def truncate(text: str, mode: str = "sentence") -> str:
    """A generic is one statement: keep the first line (``newline``) or the first sentence (``sentence``)."""
    if mode == "none":
        return text
    if mode not in ("newline", "sentence"):
        raise ConfigError(f"task.filter.truncate must be none|newline|sentence, got {mode!r}")
    text = text.strip().split("\n", 1)[0].strip()
    if mode == "sentence":
        m = _SENTENCE_END.search(text)
        if m:
            text = text[:m.end()]
    return text


SCORE_CHUNK = 65536  # statements per critic call: the filter never holds every statement in one Python list
DROP_REASONS = ("unfinished", "critic", "empty", "constraints", "duplicate", "concept_cap", "repeated_item", "frame_cap")


def _prepare_batch(batch: dict, mode: str) -> dict:
    """Truncate a batch of generations to one statement and join each to its prompt (a ``datasets.map`` fn)."""
    from i2d2.filtering import ends_sentence
    from trainers.lm_finetune import join_statement

    gens = [g or "" for g in batch["generation"]]
    cut = [truncate(g, mode) for g in gens]
    prompts = batch.get("prompt") or [""] * len(gens)
    return {"generation": cut, "generation_raw": [g if c != g else None for g, c in zip(gens, cut)],
            "statement": [join_statement(p or "", c) for p, c in zip(prompts, cut)],
            "_finished": [not c or ends_sentence(c) for c in cut]}


def _column(ds, name: str):
    """One column of a ``datasets.Dataset`` as a pyarrow ChunkedArray (no Python object per row)."""
    return ds.with_format("arrow").select_columns([name])[:][name]


def _cap_per_group(scores: np.ndarray, groups: np.ndarray, cap: int) -> np.ndarray:
    """Mask of the rows within the ``cap`` best-scored of their group (integer codes: the concept, or the frame;
    ties: earlier rows)."""
    order = np.lexsort((np.arange(len(scores)), -scores, groups))  # by group, best first within it
    c = groups[order]
    starts = np.flatnonzero(np.r_[True, c[1:] != c[:-1]])
    rank_in_group = np.arange(len(c)) - np.repeat(starts, np.diff(np.r_[starts, len(c)]))
    keep = np.zeros(len(scores), dtype=bool)
    keep[order[rank_in_group < cap]] = True
    return keep


def filter_generations(gens_dir: Path, d: Path, score: Callable[[list[str]], np.ndarray], delta: float, fcfg: dict,
                       tracker=None, num_proc: int | None = None) -> tuple[dict, Any, Any]:
    """The filter over the generation table of the stage folder ``gens_dir``: truncate, drop unfinished, critic score > δ, empty,
    constraints, a list that repeats an item, near-duplicates, per-frame cap, per-concept cap. Rows stay in Arrow (memory-mapped); only per-row numbers and
    the kept statements are held in memory. Writes ``kept/``, ``dropped/``, ``scores/`` tables and ``kept.jsonl``;
    returns (summary, kept, dropped)."""
    from i2d2.filtering import near_duplicates, write_filtered
    from i2d2.io import save_table

    if np.isnan(delta):  # every score <= NaN is False: the critic would drop nothing
        raise ValueError("filter: δ is NaN (the critic's summary.json or task.filter.delta)")
    work = d / ".work"  # map() caches: hidden from fingerprints, removed at the end
    ds, scored = finished_statements(gens_dir, work, fcfg.get("truncate", "sentence"),
                                     bool(fcfg.get("require_sentence_end", True)), num_proc)
    n = len(ds)
    finished = np.zeros(n, dtype=bool)
    finished[scored] = True
    texts = ds.select_columns(["statement"]).select(scored)
    scores = np.concatenate([np.asarray(score(b["statement"]), dtype=float).reshape(-1)
                             for b in texts.iter(batch_size=SCORE_CHUNK)] or [np.zeros(0)])
    if len(scores) != len(scored):
        raise RuntimeError(f"critic returned {len(scores)} scores for {len(scored)} statements")
    if np.isnan(scores).any():
        raise ValueError(f"filter: {int(np.isnan(scores).sum())} critic scores are NaN")
    critic_score = np.full(n, np.nan)
    critic_score[scored] = scores
    reason = np.full(n, -1, dtype=np.int8)  # index into DROP_REASONS, -1: kept
    reason[~finished] = 0
    reason[scored[scores <= delta]] = 1
    empty = pc.equal(pc.utf8_length(_column(ds, "generation")), 0).to_numpy(zero_copy_only=False)
    reason[(reason < 0) & empty] = 2
    accepted = int((reason < 0).sum())
    if fcfg.get("require_constraints", True) and "all_satisfied" in ds.column_names:
        unsat = pc.fill_null(pc.equal(_column(ds, "all_satisfied"), False), False).to_numpy(zero_copy_only=False)
        reason[(reason < 0) & unsat] = 3
    n_unsat = int((reason == 3).sum())
    # the statements still in play, read once; every later step works on a subset of these rows
    pool = np.flatnonzero(reason < 0)
    pool_text = _column(ds.select(pool), "statement").to_pylist()

    def statements(idx: np.ndarray) -> list[str]:
        return [pool_text[j] for j in np.searchsorted(pool, idx)]

    if fcfg.get("drop_repeated_items", True):  # a list that names an item twice: labelled garbled every time
        from i2d2.filtering import repeats_list_item

        looped = np.array([repeats_list_item(t) for t in pool_text], dtype=bool)
        reason[pool[looped]] = 6
    # concepts as integer codes (case folded, as near_duplicates groups them): no Python string per row
    concepts = (pc.utf8_lower(pc.cast(_column(ds, "concept"), pa.string())) if "concept" in ds.column_names
                else pa.chunked_array([pa.array([""] * n, pa.string())]))
    encoded = pc.fill_null(concepts, "").combine_chunks().dictionary_encode()
    concept_code, concept_names = encoded.indices.to_numpy(), encoded.dictionary.to_pylist()
    duplicate_src = np.full(n, -1)
    if fcfg.get("dedupe", True):  # one statement per near-duplicate cluster of a concept, the best-scored
        idx = np.flatnonzero(reason < 0)
        rep = near_duplicates(statements(idx), concept_code[idx].tolist(),
                              threshold=float(fcfg.get("near_duplicate_ratio", 90)), order=critic_score[idx],
                              by_content=bool(fcfg.get("dedupe_by_content", True)))
        dup = np.flatnonzero(rep != np.arange(len(idx)))
        reason[idx[dup]] = 4
        duplicate_src[idx[dup]] = idx[rep[dup]]
    frame_cap = fcfg.get("max_per_frame")
    if frame_cap:  # one template filled in for many concepts must not become what P_{k+1} imitates everywhere
        from i2d2.filtering import frame_key

        idx = np.flatnonzero(reason < 0)
        frames = [frame_key(t, concept_names[c]) for t, c in zip(statements(idx), concept_code[idx])]
        codes = np.unique(np.array(frames, dtype=object), return_inverse=True)[1].reshape(-1)
        reason[idx[~_cap_per_group(critic_score[idx], codes, int(frame_cap))]] = 7
    cap = fcfg.get("max_per_concept")
    if cap:  # balance: one concept's template must not dominate what P_{k+1} imitates
        idx = np.flatnonzero(reason < 0)
        reason[idx[~_cap_per_group(critic_score[idx], concept_code[idx], int(cap))]] = 5
    ds = ds.remove_columns(["_finished"])
    duplicate_of = pc.take(_column(ds, "statement"), pa.array(duplicate_src, mask=duplicate_src < 0))
    ds = (ds.add_column("critic_score", pa.array(critic_score, mask=np.isnan(critic_score)))
          .add_column("drop_reason", pa.DictionaryArray.from_arrays(pa.array(reason, mask=reason < 0),
                                                                    pa.array(DROP_REASONS)).cast(pa.string()))
          .add_column("duplicate_of", duplicate_of.combine_chunks()))
    kept = ds.select(np.flatnonzero(reason < 0)).remove_columns(["drop_reason", "duplicate_of"])
    dropped = ds.select(np.flatnonzero(reason >= 0))
    summary = write_filtered(d, kept, dropped, delta=delta, tracker=tracker)
    save_table(d / "scores", ds.select(scored).select_columns(
        [c for c in ("prompt_id", "rank_in_prompt", "critic_score") if c in ds.column_names]))
    summary.update(accepted_rate=accepted / n if n else 0.0, n_dropped_constraints=n_unsat,
                   n_dropped_unfinished=int((reason == 0).sum()), n_dropped_concept_cap=int((reason == 5).sum()),
                   n_truncated=n - _column(ds, "generation_raw").null_count, n_empty=int(empty.sum()),
                   n_dropped_duplicates=int((reason == 4).sum()), n_dropped_repeated_items=int((reason == 6).sum()),
                   n_dropped_frame_cap=int((reason == 7).sum()))
    from i2d2.io import read_table

    kept, dropped = read_table(d / "kept"), read_table(d / "dropped")  # the saved tables, not the work cache
    shutil.rmtree(work, ignore_errors=True)
    return summary, kept, dropped


def finished_statements(gens_dir: Path, work: Path, mode: str, require_end: bool = True, num_proc: int | None = None):
    """The generation table with each row truncated to one statement (``_prepare_batch``), cached in ``work``, and
    the indices of the rows the critic scores, in the order the filter reads them: those that end a sentence
    (``require_end``; a generation cut off by max_new_tokens is not a statement), else all."""
    from i2d2.generation import generations_table

    work.mkdir(parents=True, exist_ok=True)
    ds = generations_table(gens_dir).map(_prepare_batch, batched=True, batch_size=1000, num_proc=num_proc,
                                         fn_kwargs={"mode": mode}, cache_file_name=str(work / "prepared.arrow"),
                                         desc="filter: truncate")
    if not require_end:
        return ds, np.arange(len(ds))
    return ds, np.flatnonzero(_column(ds, "_finished").to_numpy(zero_copy_only=False))


def score_share(gens_dir: Path, out_dir: Path, critic_dir: Path, mode: str, require_end: bool, batch_size: int,
                device: str, rank: int = 0, world: int = 1) -> int:
    """One rank's share of the critic scoring: finished statements ``rank, rank + world, ...`` scored and saved as
    ``scores-rank<r>.npz`` (row positions among the finished statements, P(valid)). Returns how many finished
    statements there are in all (every rank's shares together must cover them)."""
    from critics.scoring import score_texts

    ds, finished = finished_statements(gens_dir, out_dir / f".work-rank{rank}", mode, require_end)
    mine = np.arange(rank, len(finished), world)
    if _share_done(out_dir / f"scores-rank{rank}.npz", mine):
        shutil.rmtree(out_dir / f".work-rank{rank}", ignore_errors=True)
        return len(finished)
    texts = ds.select_columns(["statement"]).select(finished[mine])
    scores = np.concatenate([np.asarray(score_texts(critic_dir, b["statement"], batch_size=batch_size, device=device,
                                                    progress=rank == 0), dtype=float).reshape(-1)
                             for b in texts.iter(batch_size=SCORE_CHUNK)] or [np.zeros(0)])
    _write_share(out_dir / f"scores-rank{rank}.npz", mine, scores)
    shutil.rmtree(out_dir / f".work-rank{rank}", ignore_errors=True)
    return len(finished)


def _score_worker(fabric, gens_dir, out_dir, critic_dir, mode, require_end, batch_size):
    """One rank of a forked scoring stage (Fabric passes itself first)."""
    return score_share(gens_dir, out_dir, critic_dir, mode, require_end, batch_size, str(fabric.device),
                       fabric.global_rank, fabric.world_size)


def read_shares(scores_dir: Path, name: str = "scores") -> np.ndarray:
    """The scores every rank wrote into ``<name>-rank<r>.npz`` (positions, scores), joined in position order."""
    parts = [np.load(p) for p in sorted(Path(scores_dir).glob(f"{name}-rank*.npz"))]
    n = sum(len(p["position"]) for p in parts)
    out = np.full(n, np.nan)
    covered = np.zeros(n, dtype=bool)
    for p in parts:
        out[p["position"]] = p["score"]
        covered[p["position"]] = True
    if not covered.all():
        raise RuntimeError(f"{scores_dir}: the ranks' {name} files do not cover every position")
    return out


def scores_stage(cfg, it_dir: Path, critic: dict, ranks: Ranks) -> dict:
    """Critic scores of every finished generation, split over the ranks like generation (issue: the 16M-row
    paper scale would otherwise score on rank 0 alone); the filter reads them (``read_shares``)."""
    out, gens = it_dir / "critic_scores", it_dir / "generations"
    mode = str(_get(cfg.task.filter, "truncate", "sentence"))
    require_end = bool(_get(cfg.task.filter, "require_sentence_end", True))
    critic_dir = in_run(critic["model_dir"], cfg.run_dir)
    fp = fingerprint("critic_scores", gens / "table", critic_dir, named("truncate", mode),
                     named("require_sentence_end", require_end), named("ranks", ranks.world))
    batch_size = int(_get(cfg.critic, "eval_batch_size", 64))

    def fn(d: Path) -> dict:
        if ranks.mode == "fork":
            n = _forked(cfg, ranks, _score_worker, gens, d, critic_dir, mode, require_end, batch_size)
        else:
            n = score_share(gens, d, critic_dir, mode, require_end, batch_size, _device(cfg),
                            ranks.rank if ranks.mode == "subprocess" else 0,
                            ranks.world if ranks.mode == "subprocess" else 1)
        _barrier(ranks)
        return _check_shares(d, "scores", int(n))

    return stage(ranks, out, fp, fn, "critic_scores", all_ranks=True)


def filter_stage(cfg, k: int, it_dir: Path, critic: dict, tracker, ranks: Ranks) -> dict:
    from i2d2.annotation import export_for_annotation, labels_store

    out = it_dir / "filtered"
    gens = it_dir / "generations"
    fcfg = _plain(cfg.task.filter)
    delta = float(fcfg["delta"]) if fcfg.get("delta") is not None else float(critic["delta"])
    acfg = _plain(cfg.task.get("annotation") or {})
    # the critic's weights, not its path; the format version changes when the stage's output format does;
    # num_proc changes the speed, not the result
    critic_dir = in_run(critic["model_dir"], cfg.run_dir)
    fp = fingerprint("filter", gens / "table", critic_dir, named("delta", delta),
                     named("filter config", {a: b for a, b in fcfg.items() if a != "num_proc"}),
                     named("annotation config", acfg))
    # to_label.csv is labelled where it lies (its name asks for it): the stage folder is removed when the stage is
    # redone (inputs changed) or an output of it changed, and the labels themselves change the file, so a rerun
    # deleted them with a one-line warning. Every rank reads the file: none waits for a rank 0 that stopped here.
    from i2d2.annotation import labels_not_imported

    n_labels = labels_not_imported(out / "to_label.csv", labels_store(cfg.run_dir))
    if n_labels:
        raise DataError(
            f"{out / 'to_label.csv'} holds {n_labels} label(s) not in the labels store {labels_store(cfg.run_dir)}; "
            "running the filter stage again would remove them with its folder. Import them first (python -m "
            f"i2d2.annotate import --input {out / 'to_label.csv'} --store {labels_store(cfg.run_dir)}) or move the "
            "file out of the run, then run again")

    def fn(d: Path) -> dict:
        scores, pos = read_shares(it_dir / "critic_scores"), [0]  # scored by every rank (scores_stage), in filter order

        def precomputed(texts):
            pos[0] += len(texts)
            return scores[pos[0] - len(texts):pos[0]]

        summary, kept, dropped = filter_generations(gens, d, precomputed, delta, fcfg, tracker=tracker,
                                                    num_proc=fcfg.get("num_proc"))
        summary["delta_source"] = "task.filter.delta" if fcfg.get("delta") is not None else "critic"
        # the stage's result in the log file too (it said nothing until the iteration's last line)
        # counted in Arrow: the dropped table is memory-mapped, and at the paper's scale its column as Python
        # strings is hundreds of MB
        reasons = {c["values"].as_py(): c["counts"].as_py()
                   for c in pc.value_counts(dropped.data.column("drop_reason"))} if len(dropped) else {}
        log.info("filter: %d generations -> %d kept (%.3f) at δ=%.3f; critic-accepted rate %.3f; dropped: %s",
                 summary["n_in"], summary["n_kept"], summary["keep_rate"], delta, summary["accepted_rate"],
                 ", ".join(f"{reasons.get(r, 0)} {r}" for r in DROP_REASONS))
        k_per = int(acfg.get("k_per_concept", 4))
        if k_per > 0:
            import datasets

            store = labels_store(cfg.run_dir)
            exclude = read_jsonl(store) if store.exists() else []  # the store's rows: statements and labels
            cols = [c for c in ("statement", "concept", "critic_score", "prompt", "prompt_id", "source")
                    if c in kept.column_names]
            both = datasets.concatenate_datasets([kept.select_columns(cols), dropped.select_columns(cols)])
            rows = (dict(zip(cols, vals)) for b in both.iter(batch_size=10_000) for vals in zip(*(b[c] for c in cols)))
            exported = export_for_annotation(rows, d / "to_label.csv", k_per_concept=k_per,
                                             seed=int(cfg.seed) + k, exclude=exclude)
            summary["n_to_label"] = len(exported)
        write_json(d / "summary.json", summary)
        return summary

    return stage(ranks, out, fp, fn, "filter")


def heldout_stage(cfg, k: int, it_dir: Path, model_key: str, lm, tracker, ranks: Ranks) -> dict:
    """P_k's generations for the fixed held-out concepts (``task.heldout``), unfiltered: what a person judges
    blind (``annotate export --blind``) to measure accuracy per iteration. Prompts are built once, with P_0, in
    iteration 0 and reused. Independent of the critic (the report scores them as a proxy); no critic trains on
    these concepts."""
    from i2d2.generation import generate_stage, read_generations, warn_if_older_decoder
    from i2d2.prompts import build_generic_prompts, heldout_concepts
    from i2d2.recipes.generics_report import diversity
    from trainers.lm_finetune import join_statement

    hcfg = _plain(cfg.task.get("heldout") or {})
    if not (hcfg.get("nouns") or hcfg.get("goals")):
        return {}
    out = it_dir / "heldout"
    prompts0 = Path(cfg.run_dir) / "iter_0" / "heldout" / "prompts.jsonl"
    decoding = _plain(cfg.decoding)
    mode = _get(cfg.task, "filter.truncate", "sentence")
    source = (named("data config", _plain(cfg.data)), *data_files(cfg.data),
              named("base model", _model_id(str(cfg.model.name)))) if k == 0 else (prompts0,)
    fp = fingerprint("heldout", named("heldout config", hcfg), *source, named("decoding config", decoding),
                     named("model", model_key), named("truncate", mode), named("seed", int(cfg.seed)),
                     *_dtype_part(cfg, lm.name))

    def fn(d: Path) -> dict:
        model, tok = lm()
        if k == 0:
            build_generic_prompts(cfg.data, model, tok, d / "pool.jsonl", concepts=heldout_concepts(hcfg),
                                  what="held-out prompts")
            pool = read_jsonl(d / "pool.jsonl")
            n = len({p["concept"] for p in pool}) * int(hcfg.get("prompts_per_concept", 2))
            write_jsonl(d / "prompts.jsonl", sample_prompts(pool, n, np.random.default_rng(int(cfg.seed))))
            log.info("held-out prompts: %d of the pool's %d (task.heldout.prompts_per_concept=%s), the same every "
                     "iteration", min(n, len(pool)), len(pool), hcfg.get("prompts_per_concept", 2))
        else:
            if not prompts0.exists():
                raise MissingIterationError(f"iteration {k} reuses iteration 0's held-out prompts, but {prompts0} is missing")
            shutil.copyfile(prompts0, d / "prompts.jsonl")
        model.to(_device(cfg)).eval()
        generate_stage(model, tok, d / "prompts.jsonl", d / "generations", decoding,
                       shard_size=int(_get(cfg.data, "generation.shard_size", 64)), rank=0, world_size=1)
        prompts = {p["prompt_id"]: p for p in read_jsonl(d / "prompts.jsonl")}
        rows = []
        for g in read_generations(d / "generations"):
            p = prompts[g["prompt_id"]]
            text = truncate(g.get("generation") or "", mode)
            rows.append({"prompt_id": g["prompt_id"], "concept": p["concept"], "prompt": p["prompt"],
                         "form": p.get("form"), "generation": text, "statement": join_statement(p["prompt"], text),
                         "rank_in_prompt": g.get("rank_in_prompt"), "all_satisfied": g.get("all_satisfied")})
        write_jsonl(d / "statements.jsonl", rows)
        rcfg = _plain(cfg.task.get("report") or {})
        div = diversity(rows, int(rcfg.get("self_bleu_sample", 200)), int(cfg.seed),
                        float(rcfg.get("mnr_fraction", 0.3)), float(rcfg.get("mnr_bleu", 0.85)))
        summary = {"n_prompts": len(prompts), "n_concepts": len({p["concept"] for p in prompts.values()}),
                   "n_generations": len(rows), "self_bleu": div["self_bleu"], "distinct_fraction": div["distinct_fraction"]}
        if tracker is not None:
            # self_bleu: the report's heldout_self_bleu, measured again with the report's settings
            tracker.log_metrics({f"heldout/{a}": b for a, b in summary.items() if b is not None and a != "self_bleu"})
        return summary

    summary = stage(ranks, out, fp, fn, "heldout")
    if ranks.zero:
        warn_if_older_decoder(out / "generations", stage_dir=out)  # the held-out stage is what to redo
    return summary


def finetune_stage(cfg, k: int, it_dir: Path, model_key: str, lm, logger, ranks: Ranks) -> dict:
    from i2d2.lightning_setup import fit_settings
    from trainers.lm_finetune import finetune

    out = it_dir / "finetune"
    kept_path = it_dir / "filtered" / "kept.jsonl"
    ft = _plain(cfg.task.finetune)
    tc = _plain(cfg.trainer)
    result_keys = {k_: v for k_, v in ft.items() if k_ not in ("keep_checkpoints", "ckpt_every_n_steps")}
    fp = fingerprint("finetune", kept_path, named("finetune config", result_keys),
                     named("trainer settings", fit_settings(tc)),
                     named("model", model_key), named("seed", int(cfg.seed)), *_dtype_part(cfg, lm.name))

    def fn(d: Path) -> dict:
        rows = read_jsonl(kept_path, required=("generation",))
        if not rows:
            raise DataError(
                f"iteration {k}: no generation passed the filter ({kept_path} is empty), so there is nothing to "
                "fine-tune on. Lower task.filter.delta, raise task.max_prompts, or set task.filter.require_constraints=false.")
        model, tok = lm()
        return finetune(model, tok, rows, d, iteration_model_dir(cfg.run_dir, k), ft, tc, logger=logger,
                        seed=int(cfg.seed) + k,
                        meta={"iteration": k, "base_model": model_key if not Path(model_key).exists() else None,
                              "trained_from": run_relative(lm.name, cfg.run_dir)})

    # P_{k+1} lives outside finetune/: a redo removes it first, so iteration k+1 never starts from a stale model
    return stage(ranks, out, fp, fn, "finetune", all_ranks=True, outputs=(iteration_model_dir(cfg.run_dir, k),))


def report_stage(cfg, k: int, it_dir: Path, gen: dict, critic: dict, filt: dict, ft: dict, prompts: dict,
                 held: dict, generator: str, tracker) -> dict:
    from critics.data import load_annotations
    from i2d2.annotation import heldout_accuracy, labels_store
    from i2d2.recipes.generics_report import HELDOUT_KEYS, diversity, human_eval, human_labels, write_report

    rcfg = _plain(cfg.task.get("report") or {})
    kept = read_jsonl(it_dir / "filtered" / "kept.jsonl")
    dropped = read_table(it_dir / "filtered" / "dropped").to_list()
    everything = kept + dropped
    sample = int(rcfg.get("self_bleu_sample", 200))
    seed = int(cfg.seed) + k
    div_kept = diversity(kept, sample, seed, float(rcfg.get("mnr_fraction", 0.3)), float(rcfg.get("mnr_bleu", 0.85)))
    # Self-BLEU rises with the number of texts each is compared with: all generations are sampled to the kept sample's
    # size, or "kept 0.593 against all 0.910" (25 texts against 197) read as diversity the filter added (0.55-0.66 at 25)
    div_all = diversity(everything, max(2, min(sample, div_kept["self_bleu_n"])), seed, float(rcfg.get("mnr_fraction", 0.3)),
                        float(rcfg.get("mnr_bleu", 0.85)))
    store = labels_store(cfg.run_dir)
    human = None
    if store.exists():
        labels = human_labels(load_annotations([store], _get(cfg.critic, "label_map"), on_error="skip"))
        # the critic trained on the store too: its PR on these labels is measured on its test concepts only
        split = in_run(critic["model_dir"], cfg.run_dir).parent / "split.json" if critic.get("model_dir") else None
        test_concepts = set(read_json(split).get("test_concepts", [])) if split and split.exists() else set()
        human = human_eval(everything, labels, float(filt["delta"]), test_concepts)
    if human is not None and human["y"]:
        pr = {"source": "human labels", "y": human["y"], "scores": human["scores"]}
    else:
        test = it_dir / "critic" / "test_scores.jsonl"
        test = read_jsonl(test) if test.exists() else []
        pr = {"source": "critic test split (labelled generations of test concepts)", "y": [int(r["y"]) for r in test],
              "scores": [float(r["critic_score"]) for r in test]}
    # the critic's test precision / recall at the δ the filter used: the critic's own (chosen on dev, or set by
    # critic.delta), or task.filter.delta, at which they are recomputed from the critic's test scores
    delta = float(filt["delta"])
    at_delta = {"source": (critic.get("sources") or {}).get("delta", "dev"), "precision": critic.get("precision"),
                "recall": critic.get("recall"), "n_kept": critic.get("n_kept_test")}
    if filt.get("delta_source") == "task.filter.delta":
        from critics.metrics import precision_recall_at

        test_path = in_run(critic["model_dir"], cfg.run_dir).parent / "test_scores.jsonl"
        test_rows = read_jsonl(test_path) if test_path.exists() else []
        pr_at = (precision_recall_at([int(r["y"]) for r in test_rows], [float(r["critic_score"]) for r in test_rows],
                                     delta) if test_rows else (None, None, None))
        at_delta = {"source": "task.filter.delta", **dict(zip(("precision", "recall", "n_kept"), pr_at))}
    n_gen = int(gen.get("n_generations", len(everything)))
    acc = next((r for r in heldout_accuracy(cfg.run_dir) if r["iteration"] == k), {})  # person-judged, blind
    held = dict(held)
    held_rows = read_jsonl(it_dir / "heldout" / "statements.jsonl") if held else []
    if held_rows:  # Self-BLEU with this report's task.report settings, as the kept and all-generation figures (the
        # heldout stage's own summary keeps the settings it ran with: changing them does not redo its generation)
        held["self_bleu"] = diversity(held_rows, sample, int(cfg.seed), float(rcfg.get("mnr_fraction", 0.3)),
                                      float(rcfg.get("mnr_bleu", 0.85)))["self_bleu"]
    if held_rows:  # the critic's opinion of the held-out generations: a proxy, next to what a person judged
        from critics.scoring import score_texts
        from i2d2.filtering import ends_sentence

        # counted as the loop's accepted rate is (filter_generations): a generation cut off before a sentence end
        # (task.filter.require_sentence_end) or empty is never accepted, whatever the critic would score it; the
        # held-out rate scored the cut-off ones too, so the two "critic-accepted" rates measured different things
        require_end = bool(_get(cfg.task.filter, "require_sentence_end", True))
        ok = np.array([bool(r.get("generation")) and (not require_end or ends_sentence(r["generation"]))
                       for r in held_rows], dtype=bool)
        s = np.zeros(len(held_rows))
        if ok.any():
            s[ok] = score_texts(in_run(critic["model_dir"], cfg.run_dir), [r["statement"] for r, o in zip(held_rows, ok) if o],
                                batch_size=int(_get(cfg.critic, "eval_batch_size", 64)), device=_device(cfg))
        held["critic_accepted_rate_proxy"] = float(np.mean(ok & (s > float(filt["delta"]))))
    metrics = {
        "iteration": k, "generator": run_relative(generator, cfg.run_dir),  # paths: relative to run_dir
        "next_model": run_relative(iteration_model_dir(cfg.run_dir, k), cfg.run_dir),
        "n_prompts": int(gen.get("n_prompts", prompts.get("n_prompts", 0))), "n_generations": n_gen,
        "constraint_satisfaction_rate": float(gen.get("constraint_satisfaction_rate", float("nan"))),
        "prompts_per_s": gen.get("prompts_per_s"),
        "critic_model": critic.get("model_dir"), "critic_reused_from": critic.get("reused_from"),
        "critic_ap": critic.get("ap"), "critic_ap_perplexity": critic.get("ap_perplexity"),
        "critic_precision": at_delta["precision"], "critic_recall": at_delta["recall"],
        "critic_n_kept_test": at_delta["n_kept"], "critic_n_test": critic.get("n_test"),
        "critic_delta": critic.get("delta"),
        "critic_n_test_concepts": critic.get("n_test_concepts"), "critic_surface_ap": critic.get("surface_ap"),
        "critic_surface_auc_gap": critic.get("surface_auc_gap"), "critic_probe_shift": critic.get("probe_shift"),
        "critic_probe_shift_read": critic.get("probe_shift_read"),
        "critic_probe_ap": critic.get("probe_ap"), "critic_dev_precision": critic.get("dev_precision"),
        "delta": delta, "delta_source": at_delta["source"], "accepted_rate": float(filt["accepted_rate"]),
        "kept_fraction": float(filt["keep_rate"]), "n_kept": int(filt["n_kept"]),
        "n_dropped_constraints": filt.get("n_dropped_constraints"), "n_dropped_duplicates": filt.get("n_dropped_duplicates"),
        "human_accuracy": None if human is None else human["human_accuracy"],
        "human_n_labelled": None if human is None else human["n_labelled"],
        "human_precision_at_delta": None if human is None else human["human_precision_at_delta"],  # test concepts
        "self_bleu_kept": div_kept["self_bleu"], "self_bleu_all": div_all["self_bleu"],
        "self_bleu_kept_n": div_kept["self_bleu_n"], "self_bleu_all_n": div_all["self_bleu_n"],
        "unique_estimate": div_kept["unique_estimate"], "unique_per_concept": div_kept["unique_per_concept"],
        "unique_estimate_all": div_all["unique_estimate"], "distinct_fraction_all": div_all["distinct_fraction"],
        "mnr_kept": div_kept["mnr"],
        "finetune_n_train": ft.get("n_train"), "finetune_steps": ft.get("steps"), "finetune_loss": ft.get("train_loss"),
        "n_to_label": filt.get("n_to_label"),
        "heldout_n_generations": held.get("n_generations"), "heldout_self_bleu": held.get("self_bleu"),
        "heldout_critic_accepted_rate_proxy": held.get("critic_accepted_rate_proxy"),
        **{key: acc.get(src) for key, src in HELDOUT_KEYS.items()},
        "n_dropped_frame_cap": filt.get("n_dropped_frame_cap"), "n_dropped_concept_cap": filt.get("n_dropped_concept_cap"),
    }
    out = write_report(it_dir, Path(cfg.run_dir), metrics, kept, dropped, pr, tracker=tracker,
                       n_samples=int(rcfg.get("samples", 10)), seed=seed)
    return {**metrics, **out}


# ----------------------------------------------------------------------------- driver

class _LazyLM:
    """Loads P_k at most once per iteration, only if a stage that is not finished needs it."""

    def __init__(self, cfg, name: str):
        self.cfg, self.name, self._lm = cfg, name, None

    def __call__(self):
        if self._lm is None:
            from i2d2.models import load_causal_lm

            self._lm = load_causal_lm(self.name, cache=self.cfg.get("cache_dir"), dtype=_get(self.cfg.model, "dtype"))
        return self._lm


def _iteration_cfg(cfg: DictConfig, k: int) -> DictConfig:
    c = cfg.copy()
    OmegaConf.set_struct(c, False)
    c.iteration = k
    return c


def run_iteration(cfg: DictConfig, k: int, ranks: Ranks) -> dict:
    from i2d2.tracking import tracked_run

    cfg = _iteration_cfg(cfg, k)
    it_dir = Path(cfg.run_dir) / f"iter_{k}"
    generator = generator_name(cfg, k)
    if ranks.zero:
        it_dir.mkdir(parents=True, exist_ok=True)
        write_text(it_dir / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
    # every logger gets the resolved config (decoding, task, model, critic keys), namespaced apart from the fits' hparams
    with tracked_run(cfg, it_dir / "report", loggers=ranks.zero or ranks.mode == "subprocess") as tracking:
        return _iteration(cfg, k, ranks, it_dir, generator, tracking.logger, tracking if ranks.zero else None)


def _iteration(cfg: DictConfig, k: int, ranks: Ranks, it_dir: Path, generator: str, logger, tracker) -> dict:
    t0 = time.time()
    lm = _LazyLM(cfg, generator)
    model_key = _model_id(generator)
    log.info("iteration %d: generator P_%d = %s", k, k, generator)
    timings = {}

    cpu = {}

    def timed(name, f):
        s, c = time.time(), time.process_time()
        r = f()
        timings[name] = round(time.time() - s, 1)
        cpu[name] = round(time.process_time() - c, 1)  # this process's CPU seconds (all its threads)
        return r

    prompts_path, prompts = timed("prompts", lambda: prompts_stage(cfg, k, it_dir, lm, tracker, ranks))
    gen = timed("generation", lambda: generation_stage(cfg, it_dir, prompts_path, model_key, lm, tracker, ranks))
    critic = timed("critic", lambda: critic_stage(cfg, k, it_dir, model_key, lm, tracker, ranks))
    timed("critic_scores", lambda: scores_stage(cfg, it_dir, critic, ranks))
    filt = timed("filter", lambda: filter_stage(cfg, k, it_dir, critic, tracker, ranks))
    held = timed("heldout", lambda: heldout_stage(cfg, k, it_dir, model_key, lm, tracker, ranks))
    ft = timed("finetune", lambda: finetune_stage(cfg, k, it_dir, model_key, lm, logger, ranks))
    if ranks.zero:  # opt-in (log_artifacts: true in the W&B logger config)
        tracker.log_artifact(f"kept-iter{k}", it_dir / "filtered" / "kept", "dataset")
        tracker.log_artifact(f"model-iter{k}", iteration_model_dir(cfg.run_dir, k), "model")
    result: dict = {"iteration": k}
    if ranks.zero:
        result = timed("report", lambda: report_stage(cfg, k, it_dir, gen, critic, filt, ft, prompts, held, generator,
                                                      tracker))
        result["seconds"] = round(time.time() - t0, 1)
        result["stage_seconds"] = timings
        # this invocation's seconds; earlier invocations' stay under "earlier" (a rerun that finds every stage
        # finished takes ~0 s a stage and must not erase what the stages took when they ran)
        tpath = it_dir / "report" / "timings.json"
        old = json.loads(tpath.read_text(encoding="utf-8")) if tpath.exists() else None
        earlier = [] if old is None else old.pop("earlier", []) + [old]
        write_json(tpath, {"wall_seconds": {"total": result["seconds"], **timings},
                           "cpu_seconds": {"total": round(sum(cpu.values()), 1), **cpu}, "earlier": earlier})
        ap = result["critic_ap"]
        log.info("iteration %d done in %.0fs: %d generations, accepted rate %.3f, kept %d (%.3f), critic AP %s, "
                 "δ=%.3f (%s); report: %s", k, result["seconds"], result["n_generations"], result["accepted_rate"],
                 result["n_kept"], result["kept_fraction"], "–" if ap is None else f"{ap:.3f}", result["delta"],
                 result["delta_source"], result["report"])
    _barrier(ranks)
    return result


def run(cfg: DictConfig) -> list[dict]:
    """Run iterations ``cfg.iteration`` .. ``cfg.iteration + cfg.num_iterations - 1``."""
    check_config(cfg)
    generator_name(cfg, int(cfg.iteration))  # a missing previous iteration fails before anything starts
    ranks = launch(cfg)
    return [run_iteration(cfg, k, ranks) for k in range(int(cfg.iteration), int(cfg.iteration) + int(cfg.num_iterations))]
