"""One place that turns a ``trainer`` config into a Lightning Trainer, and the training helpers every fit shares.

``build_trainer`` is the only trainer factory: the generator fine-tuning (trainers/lm_finetune.py), the critic
(critics/train.py), CMP pre-training and few-shot runs and NegVerse prompt tuning all go through it, so a
``trainer=...`` option behaves the same everywhere:

* the strategy receives plain containers (``_convert_="all"``): DeepSpeed asserts its config is a ``dict``;
* a DeepSpeed JSON (conf/deepspeed/zero*.json) gets a numeric micro-batch (the caller's batch size where the
  JSON says ``"auto"``), the bf16 / fp16 section the trainer precision implies (a contradicting section is an
  error naming the file), and the trainer's ``gradient_clip_val`` as ``gradient_clipping`` (DeepSpeed clips);
* ``bf16`` falls back to fp16 mixed precision on a GPU without bf16.
* a fit bounded by ``max_steps`` (``max_epochs=-1``) gets a progress bar that names its step budget, not
  Lightning's ``Epoch 0/-2`` (``StepLimitedRichProgressBar``).

Also here: ``resolve_device`` (inference device from ``trainer.accelerator``), ``adamw_param_groups`` (the one
no-decay rule), ``resume_checkpoint`` (DeepSpeed checkpoints are directories) and ``full_weights`` (ZeRO-3
parameters gathered before ``save_pretrained``).
"""

from __future__ import annotations

import json
import logging
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint as _LightningModelCheckpoint, RichProgressBar
from lightning.pytorch.trainer.connectors.signal_connector import _SignalConnector
from lightning.pytorch.utilities.rank_zero import rank_prefixed_message

from i2d2.config import plain  # noqa: F401  (re-exported: the recipes call lightning_setup.plain)

log = logging.getLogger(__name__)

# What a missing trainer config means (critic training called without one): Lightning's own defaults, one device.
DEFAULT_TRAINER = {"_target_": "lightning.Trainer", "accelerator": "auto", "devices": 1}
GPU_ACCELERATORS = ("gpu", "cuda")


# ----------------------------------------------------------------------------- reading a trainer config

def strategy_name(trainer_cfg: Mapping) -> str:
    s = trainer_cfg.get("strategy", "auto")
    if isinstance(s, Mapping):
        return str(s.get("_target_", "")).rsplit(".", 1)[-1]
    return str(s)


def is_deepspeed(trainer_cfg: Mapping) -> bool:
    return "deepspeed" in strategy_name(trainer_cfg).lower()


class ModelCheckpoint(_LightningModelCheckpoint):
    """Lightning's ModelCheckpoint, resumable in a run folder that moved (the project's run folders can move).

    Its state holds absolute paths (``dirpath``, ``best_model_path``, ``best_k_models``); resumed from a folder
    that is no longer where the checkpoint was written, Lightning drops the best score so far (any later
    validation became "best", overwriting a better epoch's ``best.ckpt``) and keeps ``best_model_path`` pointing
    into the old folder (a critic or CMP model read from there, or from nowhere). Paths under the old ``dirpath`` are
    moved under the new one before Lightning reads the state. Same class name: the same state key in checkpoints."""

    def load_state_dict(self, state_dict: dict) -> None:
        old, new = state_dict.get("dirpath"), self.dirpath
        if old and new and os.path.normpath(str(old)) != os.path.normpath(str(new)):
            old = os.path.normpath(str(old))

            def moved(p):
                if not p or os.path.commonpath([old, os.path.normpath(str(p))]) != old:
                    return p
                return os.path.join(new, os.path.relpath(os.path.normpath(str(p)), old))

            state_dict = {**state_dict, "dirpath": new,
                          **{k: moved(state_dict.get(k)) for k in ("best_model_path", "kth_best_model_path",
                                                                   "last_model_path") if k in state_dict},
                          "best_k_models": {moved(k): v for k, v in (state_dict.get("best_k_models") or {}).items()}}
        super().load_state_dict(state_dict)


DISPLAY_KEYS = ("log_every_n_steps", "enable_progress_bar", "enable_model_summary")


def fit_settings(trainer_cfg: Mapping, set_by_fit: Iterable[str] = ()) -> dict:
    """The trainer config as a stage fingerprint part: everything that can change what a fit learns (precision,
    accumulate_grad_batches, gradient_clip_val, devices, strategy...), not how its progress is shown.
    ``set_by_fit``: the Trainer arguments the fit passes ``build_trainer`` itself (``max_epochs`` from its own
    config...), which replace the config's: a config value the fit never reads must not redo it."""
    skip = {*DISPLAY_KEYS, *set_by_fit}
    return {k: v for k, v in plain(trainer_cfg).items() if k not in skip}


def check_trainer_cfg(trainer_cfg: Mapping, where: str = "trainer") -> None:
    """Fail early, naming the field, for trainer settings this machine cannot run."""
    accel = str(trainer_cfg.get("accelerator", "auto"))
    if is_deepspeed(trainer_cfg) and not torch.cuda.is_available():
        raise RuntimeError(
            f"{where}.strategy is DeepSpeed ({strategy_name(trainer_cfg)}), which needs a CUDA GPU, and none is "
            "available here. Use trainer=cpu (or trainer=ddp for several CPU processes), or run on a GPU machine.")
    if accel in GPU_ACCELERATORS and not torch.cuda.is_available():
        raise RuntimeError(f"{where}.accelerator={accel} but no CUDA GPU is available; use trainer=cpu or trainer=ddp.")


def resolve_precision(trainer_cfg: Mapping) -> str:
    """bf16 where the hardware has it: bf16 requested on a GPU without bf16 falls back to fp16 mixed."""
    p = str(trainer_cfg.get("precision", "32-true"))
    if "bf16" in p and torch.cuda.is_available() and not torch.cuda.is_bf16_supported():
        log.warning("precision %s requested but this GPU has no bf16; using 16-mixed", p)
        return "16-mixed"
    return p


def single_device_trainer(trainer_cfg: Mapping) -> dict:
    """The trainer config on one device in this process (no strategy, no DeepSpeed; the precision the hardware
    has): what a small classifier's fit uses outside a multi-process launch. Under DeepSpeed the gradient clipping
    is the one the LM fine-tuning gets (``deepspeed_config``: the JSON's ``gradient_clipping``, else the trainer's
    ``gradient_clip_val``), so that the critic trains alike under ``trainer=gpu`` and ``trainer=deepspeed_stage2``
    (on the H100 it trained unclipped under DeepSpeed and test AP 0.430 against 0.440)."""
    out = {k: v for k, v in dict(trainer_cfg).items() if k not in ("strategy", "devices", "num_nodes")}
    strategy = trainer_cfg.get("strategy")
    if is_deepspeed(trainer_cfg) and isinstance(strategy, Mapping):  # a registry name ("deepspeed_stage_2") has no JSON
        clip = read_deepspeed_json(strategy.get("config")).get("gradient_clipping")
        if clip is not None:
            out["gradient_clip_val"] = float(clip) or None  # 0 in DeepSpeed: no clipping
    listed = listed_gpus(trainer_cfg.get("devices"))  # the GPU inference uses too (resolve_device), not GPU 0
    return {**out, "precision": resolve_precision(trainer_cfg), "devices": [listed[0]] if listed else 1,
            "strategy": "auto"}


def world_size_of(trainer_cfg: Mapping) -> int:
    """Processes the trainer config asks for (devices x nodes; ``auto`` counts the visible GPUs). A key not given
    has Lightning's default: ``devices="auto"``, ``accelerator="auto"``."""
    devices = trainer_cfg.get("devices", "auto")
    listed = listed_gpus(devices)  # [0, 2], "0,1" or "1," (Lightning: the GPU with index 1, alone)
    if listed is not None:
        n = len(listed)
    elif str(devices) in ("auto", "-1"):  # -1 is an int where YAML gives it
        on_gpus = str(trainer_cfg.get("accelerator", "auto")) in ("gpu", "cuda", "auto")
        n = max(1, torch.cuda.device_count()) if on_gpus else 1
    elif isinstance(devices, int) or str(devices).isdigit():
        n = int(devices)
    else:
        n = 1
    return max(1, n) * int(trainer_cfg.get("num_nodes", 1) or 1)


def check_one_process(trainer_cfg: Mapping, task: str) -> None:
    """For the recipes that run in one process: a trainer config asking for several fails at start-up, naming the
    key, instead of racing ranks over the run folder (or Lightning refusing the resumable loaders) mid-run."""
    n = world_size_of(plain(trainer_cfg))
    if n > 1:
        raise ValueError(f"trainer.devices: task={task} runs in one process, and this trainer config asks for {n} "
                         f"(devices={plain(trainer_cfg).get('devices')!r}, num_nodes={plain(trainer_cfg).get('num_nodes', 1)!r}); "
                         "set trainer.devices=1 (the I2D2 loop, task=i2d2, is the one that runs on several)")


def listed_gpus(devices: Any) -> list[int] | None:
    """The GPU indices a ``trainer.devices`` value names, as Lightning reads it: a list, or a string with a comma
    ("1," is the GPU with index 1, alone); None for a count or ``auto`` (the first GPUs)."""
    if isinstance(devices, (list, tuple)):
        return [int(d) for d in devices]
    if isinstance(devices, str) and "," in devices:
        return [int(d) for d in devices.split(",") if d.strip()]
    return None


def resolve_device(trainer_cfg: Mapping | None) -> str:
    """The torch device inference (generation, scoring, probes) runs on, as ``trainer.accelerator`` says:
    ``cpu`` stays on the CPU even where CUDA is present; ``gpu``/``cuda``/``auto`` take CUDA when there is one
    (this rank's GPU in a multi-process run, the one ``trainer.devices`` lists where it names GPUs); ``mps`` the
    Apple GPU."""
    tc = plain(trainer_cfg or {})
    accel = str(tc.get("accelerator", "auto"))
    if accel == "cpu":
        return "cpu"
    if accel == "mps":
        return "mps"
    if accel not in ("auto", *GPU_ACCELERATORS):
        raise ValueError(f"trainer.accelerator={accel!r}: inference supports cpu, gpu, cuda, mps and auto")
    if not torch.cuda.is_available():
        if accel in GPU_ACCELERATORS:
            raise RuntimeError(f"trainer.accelerator={accel} but no CUDA GPU is available; use trainer=cpu.")
        return "cpu"
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    rank = int(os.environ.get("LOCAL_RANK", 0)) if distributed else 0
    listed = listed_gpus(tc.get("devices"))
    if listed:  # Lightning trains rank r on the r-th GPU listed
        return f"cuda:{listed[rank]}"
    return f"cuda:{rank}" if distributed else "cuda"


# ----------------------------------------------------------------------------- DeepSpeed

PRECISION_SECTIONS = ("bf16", "fp16")


def _precision_section(precision: str) -> str | None:
    """The DeepSpeed section a Lightning precision flag needs (None: fp32, neither section enabled)."""
    if precision.startswith("bf16"):
        return "bf16"
    if precision.startswith("16"):
        return "fp16"
    return None


def read_deepspeed_json(config: Any, where: str = "trainer.strategy.config") -> dict:
    """A DeepSpeed config as a plain dict: ``config`` is a path to a JSON file, a mapping or None (empty)."""
    if isinstance(config, (str, os.PathLike)):
        path = Path(config)
        if not path.is_file():
            raise FileNotFoundError(f"{where}: DeepSpeed config {path} not found")
        try:
            config = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
    conf = plain(config or {})
    if not isinstance(conf, dict):
        raise TypeError(f"{where}: a DeepSpeed config must be a JSON object or a path to one, got {type(conf).__name__}")
    return conf


def deepspeed_config(config: Any, precision: str, micro_batch: int | None, gradient_clip_val: float | None = None,
                     where: str = "trainer.strategy.config") -> dict:
    """The DeepSpeed config dict a strategy gets: the JSON file (or dict) ``config`` with a numeric
    ``train_micro_batch_size_per_gpu`` (``micro_batch`` where the JSON says ``"auto"`` or nothing), the precision
    section of ``precision`` enabled, and gradient clipping from the trainer where the JSON sets none."""
    source = f"{where} ({config})" if isinstance(config, (str, os.PathLike)) else where
    conf = read_deepspeed_json(config, where)

    micro = conf.get("train_micro_batch_size_per_gpu", "auto")
    if micro == "auto":
        if micro_batch is None:
            raise ValueError(f"{source}: train_micro_batch_size_per_gpu is 'auto' but this fit names no batch size; "
                             "set a number in the JSON")
        micro = micro_batch
    if isinstance(micro, bool) or not isinstance(micro, int) or micro < 1:
        raise ValueError(f"{source}: train_micro_batch_size_per_gpu must be a positive integer or 'auto', got {micro!r}")
    conf["train_micro_batch_size_per_gpu"] = micro

    want = _precision_section(precision)
    for section in PRECISION_SECTIONS:
        enabled = bool((conf.get(section) or {}).get("enabled", False))
        if enabled and section != want:
            raise ValueError(f"{source}: '{section}' is enabled but trainer.precision={precision}; delete the "
                             f"'{section}' section (the trainer precision sets it) or change trainer.precision")
        if section == want:
            conf[section] = {**(conf.get(section) or {}), "enabled": True}
        else:
            conf[section] = {"enabled": False}

    if "gradient_clipping" not in conf and gradient_clip_val:
        conf["gradient_clipping"] = float(gradient_clip_val)
    return conf


def uses_deepspeed(trainer) -> bool:
    from lightning.pytorch.strategies import DeepSpeedStrategy

    return isinstance(trainer.strategy, DeepSpeedStrategy)


def zero_stage(trainer) -> int:
    """The ZeRO stage of a trainer's strategy (0 when it is not DeepSpeed)."""
    if not uses_deepspeed(trainer):
        return 0
    return int((trainer.strategy.config or {}).get("zero_optimization", {}).get("stage", 0))


@contextmanager
def full_weights(trainer, module: torch.nn.Module, modifier_rank: int | None = None) -> Iterator[None]:
    """Inside the block every parameter of ``module`` holds its full tensor, also under ZeRO-3 (which keeps one
    shard per rank): what ``save_pretrained`` needs. ``modifier_rank``: the rank whose in-block changes (e.g. a
    ``load_state_dict``) are kept on every rank; None: read only. Under ZeRO-3 a collective: every rank enters."""
    if zero_stage(trainer) != 3:
        yield
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=modifier_rank):
        yield


def is_deepspeed_checkpoint(path: Path) -> bool:
    """DeepSpeed writes a checkpoint as a directory (one shard per rank); the ``latest`` tag file comes last."""
    return path.is_dir() and (path / "latest").is_file()


PARTIAL = ".partial"  # a DeepSpeed checkpoint directory being written
REPLACED = ".prev"  # the one it replaces, between the two renames of a save


class _AtomicDeepSpeedSave:
    """DeepSpeed checkpoints written whole or not at all. DeepSpeed writes a checkpoint as several files (model
    states, then each rank's optimizer shard, then ``latest``) under one fixed tag, over the previous checkpoint's
    files: a kill between two of them left the new model states beside the old optimizer shards, every file sound,
    and the resume read the mix. So every rank writes into ``<path>.partial`` and, once all have, rank 0 moves the
    finished directory into place (the old one aside as ``<path>.prev`` for the moment between the two renames,
    then deleted: keeping it would double a ZeRO checkpoint's disk use). ``resume_checkpoint`` falls back to
    ``<path>.prev`` when a kill came between the renames."""

    def save_checkpoint(self, checkpoint: dict, filepath, storage_options=None) -> None:
        import shutil

        path = Path(self.broadcast(str(filepath)))
        partial, replaced = Path(f"{path}{PARTIAL}"), Path(f"{path}{REPLACED}")
        if self.is_global_zero:
            shutil.rmtree(partial, ignore_errors=True)  # what a killed save left
        self.barrier("deepspeed_checkpoint_start")
        super().save_checkpoint(checkpoint, partial, storage_options)  # ends with a barrier over every rank
        if self.is_global_zero:
            if path.exists():
                shutil.rmtree(replaced, ignore_errors=True)
                os.replace(path, replaced)
            os.replace(partial, path)
            shutil.rmtree(replaced, ignore_errors=True)
        self.barrier("deepspeed_checkpoint_done")


_ATOMIC_CLASSES: dict = {}


def atomic_deepspeed(strategy_cfg: Mapping):
    """The DeepSpeed strategy a ``trainer.strategy`` config names (DeepSpeedStrategy, or a subclass of it), built
    as a subclass with ``_AtomicDeepSpeedSave``'s saves."""
    import hydra

    cls = hydra.utils.get_class(str(strategy_cfg["_target_"]))
    if cls not in _ATOMIC_CLASSES:
        _ATOMIC_CLASSES[cls] = type(f"Atomic{cls.__name__}", (_AtomicDeepSpeedSave, cls), {})
    kwargs = hydra.utils.instantiate({k: v for k, v in strategy_cfg.items() if k != "_target_"}, _convert_="all")
    return _ATOMIC_CLASSES[cls](**kwargs)


def resume_checkpoint(path: str | os.PathLike, trainer) -> str | None:
    """The checkpoint (``ckpt_path``) from which ``trainer`` resumes a killed fit, or None to start afresh.

    DeepSpeed checkpoints are directories, other strategies' single files; one written by the other kind of
    strategy cannot be resumed (the optimizer state is laid out differently) and is an error naming it."""
    from i2d2.checkpoints import pick_resume

    path, deepspeed = Path(path), uses_deepspeed(trainer)
    if not path.exists() and deepspeed and is_deepspeed_checkpoint(Path(f"{path}{REPLACED}")):
        path = Path(f"{path}{REPLACED}")  # a kill between a save's two renames (_AtomicDeepSpeedSave)
        log.warning("resuming from %s: the checkpoint that replaced it was not moved into place", path)
    if not path.exists():
        return None if deepspeed else pick_resume(path)  # a kill between a save's renames leaves <path>.prev
    if path.is_dir():
        if not deepspeed:
            raise ValueError(f"{path} is a DeepSpeed checkpoint but this trainer is not DeepSpeed: resume with the "
                             "trainer that wrote it, or delete it to start this fit afresh")
        if not is_deepspeed_checkpoint(path):
            log.warning("%s is an incomplete DeepSpeed checkpoint (no 'latest' file): starting afresh", path)
            return None
        from i2d2.checkpoints import deepspeed_problem, quarantine

        why = deepspeed_problem(path)  # a kill during a later save leaves 'latest' beside a half-written file
        if why is not None:
            quarantine(path, why)
            log.warning("no intact checkpoint left in %s: this training restarts from the beginning", path.parent)
            return None
        return str(path)
    if deepspeed:
        raise ValueError(f"{path} is a single-file checkpoint of a non-DeepSpeed run: resume with the trainer that "
                         "wrote it, or delete it to start this DeepSpeed fit afresh")
    return pick_resume(path)  # size/hash checked: a damaged newest checkpoint falls back to the previous one


def checkpoint_weights(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The LightningModule state dict in a checkpoint: a file (read weights-only, ``i2d2.io.load_state_dict``)
    or a DeepSpeed directory (its ZeRO shards merged into full fp32 tensors by DeepSpeed's own reader)."""
    from i2d2.io import load_state_dict

    path = Path(path)
    if not path.is_dir():
        return load_state_dict(path)
    if not is_deepspeed_checkpoint(path):
        raise FileNotFoundError(f"{path} is a directory but not a complete DeepSpeed checkpoint (no 'latest' file)")
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    state = get_fp32_state_dict_from_zero_checkpoint(str(path))
    prefix = "_forward_module."  # checkpoints of Lightning < 2.1 name the wrapper
    return {k[len(prefix):] if k.startswith(prefix) else k: v for k, v in state.items()}


# ----------------------------------------------------------------------------- the factory

def build_trainer(trainer_cfg: Any, *, micro_batch: int | None = None, where: str = "trainer", **overrides):
    """A ``lightning.Trainer`` from a ``trainer`` config (conf/trainer/*.yaml; None: ``DEFAULT_TRAINER``).

    ``micro_batch``: the per-device batch size of this fit (fills a DeepSpeed ``"auto"`` micro-batch).
    ``overrides``: Trainer arguments of this fit (max_steps, callbacks, logger, ...); ``precision``,
    ``gradient_clip_val`` and ``accumulate_grad_batches`` given here replace the config's before the DeepSpeed
    config is derived from them.
    """
    import hydra

    tc = plain(trainer_cfg) if trainer_cfg is not None else dict(DEFAULT_TRAINER)
    if not isinstance(tc, dict) or "_target_" not in tc:
        raise ValueError(f"{where}: a trainer config needs _target_ (e.g. lightning.Trainer), got {tc!r}")
    for key in ("precision", "gradient_clip_val", "accumulate_grad_batches"):
        if key in overrides:
            tc[key] = overrides.pop(key)
    check_trainer_cfg(tc, where)
    tc["precision"] = resolve_precision(tc)
    deepspeed = is_deepspeed(tc)
    if deepspeed:
        strategy = dict(tc["strategy"])
        strategy["config"] = deepspeed_config(strategy.get("config"), tc["precision"], micro_batch,
                                              tc.pop("gradient_clip_val", None), f"{where}.strategy.config")
        tc["strategy"] = atomic_deepspeed(strategy)
    if not deepspeed and "plugins" not in overrides and not tc.get("plugins"):
        from i2d2.checkpoints import VerifiedCheckpointIO

        overrides["plugins"] = [VerifiedCheckpointIO()]  # atomic saves with integrity records (i2d2/checkpoints.py)
    # every fit: hyper-parameters under a namespace, progress lines in the log files (below)
    name = where.split()[0] if where != "trainer" else None
    given = overrides.get("callbacks") or []
    given = list(given if isinstance(given, (list, tuple)) else [given])
    overrides["callbacks"] = [*given, NamespacedHparams(name), ProgressLog(name or "fit"), *_progress_bar(tc, overrides, given)]
    trainer = hydra.utils.instantiate(tc, _convert_="all", **overrides)
    if hasattr(trainer, "_signal_connector"):
        trainer._signal_connector = _StepSyncedSigterm(trainer)
    return trainer


class _StepSyncedSigterm(_SignalConnector):
    """Lightning's SIGTERM handling in a fit, less its broadcast of the flag from inside the signal handler: that
    collective runs wherever each rank happens to be when its signal comes, so a rank signalled alone or before the
    others is one collective ahead of them, and every rank hung (``kill`` of rank 0, even with the signal passed on to
    the other ranks: ``i2d2.ranks.LAUNCHED_RANKS``). Each rank still stops at the end of its step on its own flag, and the
    training loop broadcasts rank 0's flag before every step, at the same point on every rank."""

    def _sigterm_notifier_fn(self, signum, frame) -> None:
        log.info(rank_prefixed_message(f"Received SIGTERM: {signum}", self.trainer.local_rank))
        if not self.received_sigterm and self.trainer.strategy.launcher is not None:
            self.trainer.strategy.launcher.kill(signum)
        self.received_sigterm = True

    def teardown(self) -> None:
        """Restores the handlers, then stops a fit whose SIGTERM no loop acted on. Lightning reads the flag after a step
        and after an epoch but not after the last step: a SIGTERM while the fit wound down (``on_train_end``, the last
        checkpoint, the strategy's teardown) was swallowed, ``fit()`` returned as if nothing had happened and the run
        went on to its next stage. It raises Lightning's SIGTERMException here, as the loop would have (a fit that did
        raise it, or any other error, is already unwinding: its status is INTERRUPTED)."""
        super().teardown()
        from lightning.pytorch.trainer.states import TrainerStatus
        from lightning.pytorch.utilities.exceptions import SIGTERMException

        if self.received_sigterm and self.trainer.state.status == TrainerStatus.RUNNING:
            raise SIGTERMException


def _progress_bar(tc: Mapping, overrides: Mapping, given: list) -> list:
    """The progress bar Lightning would add by itself (Rich where it is installed), as ``StepLimitedRichProgressBar``;
    none where the fit turns the bar off or brings its own."""
    from lightning.pytorch.callbacks.progress import ProgressBar
    from lightning.pytorch.utilities.imports import _RICH_AVAILABLE

    enabled = overrides.get("enable_progress_bar", tc.get("enable_progress_bar", True))
    if not _RICH_AVAILABLE or enabled is False or any(isinstance(c, ProgressBar) for c in given):
        return []
    return [StepLimitedRichProgressBar()]


# ----------------------------------------------------------------------------- optimizer

def optimizer_steps(batches_per_epoch: int, epochs: int, trainer_cfg: Mapping | None, accumulate: int | None = None,
                    max_steps: int = -1) -> int:
    """Optimizer steps a fit will take (``batches_per_epoch`` on one rank), for a learning-rate schedule
    (``trainer_cfg`` None: ``DEFAULT_TRAINER``, as ``build_trainer`` reads it).

    Every module is given this before ``fit`` instead of asking ``trainer.estimated_stepping_batches``: that
    property builds the train loader before a checkpoint is restored, and Lightning then never restores the
    loader's position, so a resumed fit would replay the epoch from its first batch (i2d2/resume.py)."""
    import math

    if trainer_cfg is None:
        trainer_cfg = DEFAULT_TRAINER
    accum = int(accumulate if accumulate is not None else trainer_cfg.get("accumulate_grad_batches", 1) or 1)
    total = math.ceil(int(batches_per_epoch) / accum) * max(1, int(epochs))
    return max(1, min(total, int(max_steps)) if int(max_steps) > 0 else total)


def adamw_param_groups(params: Iterable[torch.nn.Parameter], weight_decay: float, **group_opts) -> list[dict]:
    """AdamW parameter groups with the one no-decay rule: weight decay on matrices (projections, embeddings),
    none on vectors and scalars (biases, norm gains), whatever a model calls them. Frozen parameters are left
    out; ``group_opts`` (e.g. ``lr``) go into both groups; empty groups are dropped."""
    trainable = [p for p in params if p.requires_grad]
    groups = [{"params": [p for p in trainable if p.ndim >= 2], "weight_decay": float(weight_decay), **group_opts},
              {"params": [p for p in trainable if p.ndim < 2], "weight_decay": 0.0, **group_opts}]
    return [g for g in groups if g["params"]]


# ----------------------------------------------------------------------------- callbacks every fit gets

class NamespacedHparams(L.Callback):
    """Log the LightningModule's hyper-parameters under ``fit/{namespace}/`` (default namespace: the module's class
    name) instead of at the top level, so that the fine-tuning's ``lr`` does not overwrite the critic's in the run
    config (both fits share the iteration's run) nor the run's own config keys (``critic/lr``, ``task/...``)."""

    def __init__(self, namespace: str | None = None):
        self.namespace = namespace

    def setup(self, trainer, pl_module, stage: str) -> None:  # before Lightning logs the module's hparams
        ns = f"fit/{self.namespace or type(pl_module).__name__}"
        pl_module._log_hyperparams = False
        if trainer.loggers and pl_module.hparams:
            flat = {f"{ns}/{k}": v if isinstance(v, (int, float, str, bool, type(None))) else str(v)
                    for k, v in pl_module.hparams.items()}
            for logger in trainer.loggers:
                logger.log_hyperparams(flat)


class ProgressLog(L.Callback):
    """One log line every ``every_n_steps`` optimizer steps (default: the Trainer's ``log_every_n_steps``) and at
    the end of each epoch: progress reaches log files and non-tty jobs, not only a tqdm bar."""

    def __init__(self, name: str = "fit", every_n_steps: int | None = None):
        self.name, self.every_n_steps = name, every_n_steps
        self._t0, self._last = 0.0, -1
        self._val_step: int | None = None  # the step of this fit's last validation
        self._ended: tuple[int, int, float] | None = None  # (epoch, step, seconds) of an epoch not yet written

    def on_train_start(self, trainer, pl_module) -> None:
        self._t0, self._ended, self._val_step = time.time(), None, None

    def on_validation_end(self, trainer, pl_module) -> None:
        if not getattr(trainer, "sanity_checking", False):
            self._val_step = trainer.global_step

    def _metrics(self, trainer) -> str:
        # a validation's metrics stay in callback_metrics until the next one: each line after it repeated
        # val/loss=16.53 from step 80 to 160 as if measured there, so the step they were measured at is named
        when = "" if self._val_step is None else f" (validation at step {self._val_step})"
        return " ".join(f"{k}={float(v):.4g}" for k, v in sorted(trainer.callback_metrics.items())
                        if getattr(v, "numel", lambda: 1)() == 1) + when

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        every = self.every_n_steps or max(1, int(trainer.log_every_n_steps or 50))
        step = trainer.global_step
        if step == self._last or step % every or not trainer.is_global_zero:
            return
        self._last = step
        total = trainer.estimated_stepping_batches
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        # automatic optimization hands callbacks the step's loss divided by accumulate_grad_batches (the share it
        # backpropagates); the line reports the loss training_step returned
        scale = max(1, int(trainer.accumulate_grad_batches or 1)) if getattr(pl_module, "automatic_optimization", True) else 1
        loss = f" loss={float(loss) * scale:.4g}" if loss is not None and getattr(loss, "numel", lambda: 1)() == 1 else ""
        log.info("%s: epoch %d step %d/%s%s %s (%.0fs)", self.name, trainer.current_epoch, step,
                 total if total != float("inf") else "?", loss, self._metrics(trainer), time.time() - self._t0)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        # written once the epoch's metrics are all in: callbacks' epoch-end hooks run before the module's, which
        # logs the epoch's mean loss (i2d2.resume.EpochMeanLoss)
        self._ended = (trainer.current_epoch, trainer.global_step, time.time() - self._t0)

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._write_ended(trainer)

    def on_train_end(self, trainer, pl_module) -> None:
        self._write_ended(trainer)

    def on_exception(self, trainer, pl_module, exception) -> None:
        self._write_ended(trainer)  # an epoch that finished before the failure still gets its line

    def _write_ended(self, trainer) -> None:
        if self._ended is not None and trainer.is_global_zero:
            log.info("%s: epoch %d done at step %d %s (%.0fs)", self.name, *self._ended[:2], self._metrics(trainer),
                     self._ended[2])
        self._ended = None


class StepLimitedRichProgressBar(RichProgressBar):
    """Lightning's Rich bar, whose epoch description reads ``Epoch 0/<max_epochs - 1>``: a fit bounded by
    ``max_steps`` (``max_epochs=-1``: NegVerse prompt tuning, CMP pre-training and few-shot fits) showed
    ``Epoch 0/-2``. Such a fit's bar names its step budget instead: ``Epoch 0 (of a 300-step fit)``."""

    def _get_train_description(self, current_epoch: int) -> str:
        max_epochs = self.trainer.max_epochs
        if max_epochs is not None and max_epochs >= 0:
            return super()._get_train_description(current_epoch)
        steps = self.trainer.max_steps
        text = f"Epoch {current_epoch}" + (f" (of a {steps}-step fit)" if steps and steps > 0 else "")
        return f"{text:{len(self.validation_description)}}"  # padded as Lightning pads it (no flicker)
