"""Experiment tracking for stages that are not Lightning fits (generation, filtering, reports).

``cfg.logger`` is one Lightning logger config (``_target_``), a list of them, or a dict of named ones
(``logger=wandb_csv``; not ``logger=[wandb,csv]``, which Hydra merges into one config and the entry point refuses);
every stage and every fit logs to all of them. The resolved Hydra config goes to
every logger as hyper-parameters, so a W&B run (or CSV hparams.yaml) holds the decoding and task keys.
Tables and images go to W&B as tables/images; without W&B they become files. ``log_artifacts: true`` in a
W&B logger config (opt-in) uploads kept sets and models as W&B artifacts.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, ListConfig, OmegaConf

log = logging.getLogger(__name__)

ARTIFACTS_KEY = "log_artifacts"  # ours, not a Lightning logger argument: taken out before instantiation


def _logger_cfgs(cfg_logger) -> list[dict]:
    """The logger configs ``cfg.logger`` describes: one (``_target_``), a list, or a dict of named ones."""
    if cfg_logger is None:
        return []
    node = OmegaConf.to_container(cfg_logger, resolve=True) if isinstance(cfg_logger, (DictConfig, ListConfig)) \
        else cfg_logger
    if isinstance(node, dict) and "_target_" in node:
        items = [node]
    elif isinstance(node, dict):
        items = list(node.values())
    elif isinstance(node, list):
        items = node
    else:
        raise ValueError(f"logger: expected a logger config, a list or a dict of them, got {node!r}")
    for i, item in enumerate(items):
        if not isinstance(item, dict) or "_target_" not in item:
            raise ValueError(f"logger[{i}]: a logger config needs _target_ (or null for none), got {item!r}")
    return [dict(item) for item in items if item["_target_"] is not None]


def build_logger(cfg_logger, config: DictConfig | None = None):
    """The Lightning logger(s) ``cfg.logger`` describes: None (``logger=none``), one logger, or a list of them
    (what ``lightning.Trainer(logger=...)`` takes). With ``config`` (the run's Hydra config) its resolved form
    is logged to every logger as hyper-parameters."""
    loggers = []
    for item in _logger_cfgs(cfg_logger):
        artifacts = bool(item.pop(ARTIFACTS_KEY, False))
        if str(item["_target_"]).endswith("WandbLogger") and not (item.get("id") or item.get("version")):
            item["id"] = _wandb_run_id(item)
        logger = hydra.utils.instantiate(item)
        logger._i2d2_artifacts = artifacts
        loggers.append(logger)
    if config is not None:
        log_config(loggers, config)
    return None if not loggers else loggers[0] if len(loggers) == 1 else loggers


def _wandb_run_id(item: dict) -> str | None:
    """The W&B run id of this run name in this run folder, kept in ``<save_dir>/wandb/<name>.run_id``: a rerun after
    a kill continues the same W&B run (WandbLogger resumes with ``resume="allow"``) instead of opening a second one
    with a new random id. The first writer wins (``os.link`` never replaces), so every rank reads the same id."""
    import os
    import re
    import uuid

    if not item.get("save_dir"):
        return None
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", str(item.get("name") or "run"))
    path = Path(item["save_dir"]) / "wandb" / f"{name}.run_id"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
        tmp.write_text(uuid.uuid4().hex[:8])
        try:
            os.link(tmp, path)  # complete or absent, never replaced
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    return path.read_text().strip()


def as_list(logger) -> list:
    return [] if logger is None or logger is False else list(logger) if isinstance(logger, (list, tuple)) else [logger]


def flat_config(config: DictConfig) -> dict[str, Any]:
    """The resolved config as ``{"decoding/beam_size": 3, "task/filter/delta": None, ...}`` (the hydra node
    excluded): namespaced keys, so that no fit's hyper-parameters overwrite them."""
    plain = OmegaConf.to_container(config, resolve=True)
    plain.pop("hydra", None)
    out: dict[str, Any] = {}

    def walk(prefix: str, node):
        if isinstance(node, dict) and node:
            for k, v in node.items():
                walk(f"{prefix}/{k}" if prefix else str(k), v)
        else:
            out[prefix] = node

    walk("", plain)
    return out


def log_config(loggers, config: DictConfig) -> None:
    """Send the run's resolved config to every logger (W&B: the run config; CSV: hparams.yaml)."""
    flat = flat_config(config)
    for logger in as_list(loggers):
        logger.log_hyperparams(flat)


def is_wandb(logger) -> bool:
    return type(logger).__name__ == "WandbLogger"


class Tracker:
    def __init__(self, logger=None, out_dir: str | Path | None = None):
        self.logger = logger  # what lightning.Trainer(logger=...) takes: None, one logger or a list
        self.loggers = as_list(logger)
        self.out_dir = Path(out_dir) if out_dir else None

    @property
    def wandb(self):
        return next((lg for lg in self.loggers if is_wandb(lg)), None)

    @property
    def is_wandb(self) -> bool:
        return self.wandb is not None

    def log_metrics(self, metrics: dict, step: int | None = None) -> None:
        for logger in self.loggers:
            logger.log_metrics({k: float(v) for k, v in metrics.items()}, step=step)

    def log_table(self, key: str, columns: list[str], rows: list[list], out_dir: str | Path | None = None) -> None:
        """To W&B, else as ``<key with _ for />.csv`` in ``out_dir`` (a stage's own folder, among its outputs), or
        the tracker's folder when not given."""
        out_dir = Path(out_dir) if out_dir else self.out_dir
        if self.is_wandb:
            self.wandb.log_table(key=key, columns=columns, data=rows)
        elif out_dir is not None:
            from i2d2.io import write_csv

            write_csv(out_dir / f"{key.replace('/', '_')}.csv", [dict(zip(columns, r)) for r in rows], columns)

    def log_image(self, key: str, path: str | Path) -> None:
        if self.is_wandb:
            self.wandb.log_image(key=key, images=[str(path)])

    def log_artifact(self, name: str, path: str | Path, kind: str) -> bool:
        """Upload a file or folder as a W&B artifact when the W&B logger opted in (``log_artifacts: true``)."""
        logger = self.wandb
        if logger is None or not getattr(logger, "_i2d2_artifacts", False) or not Path(path).exists():
            return False
        import wandb

        art = wandb.Artifact(name, type=kind)
        (art.add_dir if Path(path).is_dir() else art.add_file)(str(path))
        logger.experiment.log_artifact(art)
        return True

    def finish(self) -> None:
        # Lightning's CSV logger buffers rows until its fit saves them: what the run logs after its last fit (the
        # evaluation, the report's numbers) is written here, or it would never reach metrics.csv
        for logger in self.loggers:
            if not is_wandb(logger):
                logger.save()
        if self.is_wandb:
            import wandb

            wandb.finish()


# ----------------------------------------------------------------------------- the recipe skeleton's tracking

@contextmanager
def tracked_run(cfg, out_dir: str | Path | None, *, loggers: bool = True) -> Iterator[Tracker]:
    """The tracker of one recipe run (every recipe opens it the same way): ``cfg.logger``'s loggers with the
    resolved config logged to each, tables/images written under ``out_dir`` when W&B is off, and W&B finished
    on the way out, after an error too. ``loggers=False`` (a rank that does not log) gives a Tracker with none."""
    tracker = Tracker(build_logger(cfg.get("logger"), config=cfg) if loggers else None, out_dir)
    try:
        yield tracker
    finally:
        tracker.finish()


def scalars(summary: Mapping, prefix: str = "") -> dict[str, float]:
    """The numbers of a nested summary as flat ``prefix/a/b`` metrics (booleans, strings and None left out)."""
    out: dict[str, float] = {}
    for k, v in summary.items():
        key = f"{prefix}/{k}" if prefix else str(k)
        if isinstance(v, Mapping):
            out.update(scalars(v, key))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[key] = float(v)
    return out


def split_named(key: str, splits: Mapping[str, str]) -> str:
    """``key`` (``a/b/c``) with its last part named by the split that measured it: ``a/b/<split>_c`` where a pattern
    of ``splits`` (``fnmatch``, ``*`` spans ``/``) matches the part above it or a part above that."""
    from fnmatch import fnmatch

    parent, _, leaf = key.rpartition("/")
    for part, split in splits.items():
        if fnmatch(parent, part) or fnmatch(parent, f"{part}/*"):
            return f"{parent}/{split}_{leaf}"
    return key


def publish_report(out_dir: str | Path, summary: Mapping, markdown: str, tracker: Tracker | None = None,
                   prefix: str = "report", logged_by_stages: Collection[str] = (),
                   splits: Mapping[str, str] | None = None) -> Path:
    """Every recipe's end: ``report.json`` (the numbers) and ``report.md`` (for a person) in ``out_dir``, written
    atomically; the numbers to every logger under ``prefix/``, except the parts of the summary (``a`` or ``a/b``)
    in ``logged_by_stages``, which its stages logged under their own names; the report's path in the log.
    ``splits``: the parts measured on a labelled split (``{"zero_shot": "test"}``): their numbers are logged as
    ``<part>/.../<split>_<name>`` (``split_named``), so that the logged name says which split measured them."""
    from i2d2.io import write_json, write_text

    out_dir = Path(out_dir)
    write_json(out_dir / "report.json", summary)
    path = write_text(out_dir / "report.md", markdown)
    if tracker is not None:
        skip = tuple(f"{prefix}/{part}/" for part in logged_by_stages)
        named = {f"{prefix}/{part}" if prefix else part: split for part, split in (splits or {}).items()}
        tracker.log_metrics({split_named(k, named): v for k, v in scalars(summary, prefix).items()
                             if not f"{k}/".startswith(skip)})
    log.info("report: %s", path)
    return path
