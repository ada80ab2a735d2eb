"""Callbacks every fit gets (added by ``i2d2.lightning_setup.build_trainer``): namespaced hyper-parameters and
progress lines in the log files."""

from __future__ import annotations

import logging
import time

import lightning.pytorch as pl

log = logging.getLogger(__name__)


class NamespacedHparams(pl.Callback):
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


class ProgressLog(pl.Callback):
    """One log line every ``every_n_steps`` optimizer steps (default: the Trainer's ``log_every_n_steps``) and at
    the end of each epoch: progress reaches log files and non-tty jobs, not only a tqdm bar."""

    def __init__(self, name: str = "fit", every_n_steps: int | None = None):
        self.name, self.every_n_steps = name, every_n_steps
        self._t0, self._last = 0.0, -1

    def on_train_start(self, trainer, pl_module) -> None:
        self._t0 = time.time()

    def _metrics(self, trainer) -> str:
        return " ".join(f"{k}={float(v):.4g}" for k, v in sorted(trainer.callback_metrics.items())
                        if getattr(v, "numel", lambda: 1)() == 1)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        every = self.every_n_steps or max(1, int(trainer.log_every_n_steps or 50))
        step = trainer.global_step
        if step == self._last or step % every or not trainer.is_global_zero:
            return
        self._last = step
        total = trainer.estimated_stepping_batches
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        loss = f" loss={float(loss):.4g}" if loss is not None and getattr(loss, "numel", lambda: 1)() == 1 else ""
        log.info("%s: epoch %d step %d/%s%s %s (%.0fs)", self.name, trainer.current_epoch, step,
                 total if total != float("inf") else "?", loss, self._metrics(trainer), time.time() - self._t0)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if trainer.is_global_zero:
            log.info("%s: epoch %d done at step %d %s (%.0fs)", self.name, trainer.current_epoch, trainer.global_step,
                     self._metrics(trainer), time.time() - self._t0)
