"""Lightning callback: PR curve and score histogram of the validation set after every validation epoch.

Works with any LightningModule that keeps its last validation epoch's gold labels and scores as numpy
arrays in an attribute (default ``val_result = (labels, scores)``; ``CriticModule`` does). The images go to
``dirpath`` and, with a W&B logger, to W&B under ``{prefix}/pr_curve`` and ``{prefix}/score_histogram``.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L

from callbacks.plots import log_png, plot_pr_curves, plot_score_histogram


class PRCurveCallback(L.Callback):
    def __init__(self, dirpath: str | Path, attr: str = "val_result", prefix: str = "val", name: str = "model",
                 every_n_epochs: int = 1, keep_all: bool = False):
        if int(every_n_epochs) < 1:
            raise ValueError(f"PRCurveCallback: every_n_epochs must be >= 1, got {every_n_epochs!r}")
        self.dirpath = Path(dirpath)
        self.attr, self.prefix, self.name = attr, prefix, name
        self.every_n_epochs, self.keep_all = every_n_epochs, keep_all
        self.last_paths: dict[str, Path] = {}

    # on_validation_end, not on_validation_epoch_end: Lightning calls a callback's epoch-end hook before the module's,
    # where the module stores this epoch's (labels, scores); read there, the plot showed the epoch before
    def on_validation_end(self, trainer, pl_module):
        if trainer.sanity_checking or not trainer.is_global_zero:
            return
        result = getattr(pl_module, self.attr, None)
        if result is None or (trainer.current_epoch + 1) % self.every_n_epochs:
            return
        labels, scores = result
        suffix = f"_epoch{trainer.current_epoch}" if self.keep_all else ""
        pr = self.dirpath / f"pr_curve{suffix}.png"
        hist = self.dirpath / f"score_histogram{suffix}.png"
        epoch = trainer.current_epoch
        plot_pr_curves({self.name: (labels, scores)}, pr, title=f"{self.prefix} PR curve (epoch {epoch})")
        plot_score_histogram(scores, labels, hist, title=f"{self.prefix} scores (epoch {epoch})", xlabel="P(valid)")
        for key, path in (("pr_curve", pr), ("score_histogram", hist)):
            for logger in getattr(trainer, "loggers", None) or [trainer.logger]:  # every logger: W&B need not be first
                log_png(logger, f"{self.prefix}/{key}", path)
            self.last_paths[key] = path
