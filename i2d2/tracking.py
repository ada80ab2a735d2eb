"""Experiment tracking for stages that are not Lightning fits (generation, filtering, reports).

Wraps the Lightning logger built from ``cfg.logger`` so that every stage logs to the same W&B run
(or CSV folder). Tables and images go to W&B as tables/images; with CSV they become files.
"""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig


def build_logger(cfg_logger: DictConfig | None):
    """The Lightning logger ``cfg.logger`` describes, or None for ``logger=none``."""
    if cfg_logger is None or cfg_logger.get("_target_") is None:
        return None
    return hydra.utils.instantiate(cfg_logger)


class Tracker:
    def __init__(self, logger=None, out_dir: str | Path | None = None):
        self.logger = logger
        self.out_dir = Path(out_dir) if out_dir else None

    @property
    def is_wandb(self) -> bool:
        return type(self.logger).__name__ == "WandbLogger"

    def log_metrics(self, metrics: dict, step: int | None = None) -> None:
        if self.logger is not None:
            self.logger.log_metrics({k: float(v) for k, v in metrics.items()}, step=step)

    def log_table(self, key: str, columns: list[str], rows: list[list]) -> None:
        if self.is_wandb:
            self.logger.log_table(key=key, columns=columns, data=rows)
        elif self.out_dir is not None:
            from i2d2.io import write_csv

            write_csv(self.out_dir / f"{key.replace('/', '_')}.csv", [dict(zip(columns, r)) for r in rows], columns)

    def log_image(self, key: str, path: str | Path) -> None:
        if self.is_wandb:
            self.logger.log_image(key=key, images=[str(path)])

    def finish(self) -> None:
        if self.is_wandb:
            import wandb

            wandb.finish()
