"""Lightning module for NegVerse prompt tuning (frozen causal LM, peft virtual tokens, answer-only loss)."""

from __future__ import annotations

import math
from functools import partial

import lightning as L
import torch
from torch.utils.data import DataLoader

from i2d2.lightning_setup import adamw_param_groups
from i2d2.negverse.formatting import collate, encode
from i2d2.negverse.model import NegVerseLM
from i2d2.resume import EpochProgress, resumable_loader


class NegVerseModule(L.LightningModule):
    def __init__(self, lm: NegVerseLM, lr: float = 0.03, new_token_lr: float = 0.003, weight_decay: float = 0.0,
                 warmup_steps: int = 10, total_steps: int | None = None):
        super().__init__()
        self.lm = lm
        self.lr, self.new_token_lr, self.weight_decay = lr, new_token_lr, weight_decay
        self.warmup_steps, self.total_steps = warmup_steps, total_steps
        self.strict_loading = False  # checkpoints hold only the trainable tensors (see on_save_checkpoint)
        self.save_hyperparameters(ignore=["lm"])
        self.loss_history: list[float] = []  # every step's loss, also those before a resume (in the checkpoint)
        self.steps_this_session = 0

    def setup(self, stage):
        # the base model loads in eval mode; as in standard prompt tuning it trains with its dropout on (its
        # weights stay frozen), set before Lightning's model summary and mode check read the modes. Generation
        # loads the adapter afresh, in eval mode.
        if stage == "fit":
            self.lm.train()

    def training_step(self, batch, batch_idx):
        loss = self.lm.loss(batch["input_ids"], batch["attention_mask"], batch["labels"])
        self.log("train/loss", loss, prog_bar=True, batch_size=batch["input_ids"].shape[0])
        self.loss_history.append(float(loss.detach()))
        self.steps_this_session += 1
        return loss

    def validation_step(self, batch, batch_idx):
        loss = self.lm.loss(batch["input_ids"], batch["attention_mask"], batch["labels"])
        # the recipe validates once, after the fit: the number reaches the loggers as negverse/train/val_loss (the
        # report), so here it only goes back to the caller (trainer.validate's result)
        self.log("val/loss", loss, prog_bar=True, logger=False, batch_size=batch["input_ids"].shape[0])
        return loss

    def configure_optimizers(self):
        prompt = [self.lm.prompt_weight()]
        new = [p for p in (self.lm.new_in, self.lm.new_out) if p is not None and p.requires_grad]
        groups = adamw_param_groups(prompt, self.weight_decay, lr=self.lr)
        groups += adamw_param_groups(new, self.weight_decay, lr=self.new_token_lr)
        opt = torch.optim.AdamW(groups)
        total = self.total_steps or self.trainer.estimated_stepping_batches
        warm = max(1, self.warmup_steps)

        def schedule(step):  # linear warm-up then cosine decay to 10%
            if step < warm:
                return (step + 1) / warm
            frac = min(1.0, (step - warm) / max(1, total - warm))
            return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def on_save_checkpoint(self, checkpoint):
        keep = {f"lm.{k}" for k in self.lm.trainable_state()}
        checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if k in keep}
        checkpoint["negverse_loss_history"] = list(self.loss_history)  # the summary's loss numbers survive a resume

    def on_load_checkpoint(self, checkpoint):
        self.loss_history = list(checkpoint.get("negverse_loss_history", []))


def make_loader(tok, examples: list[dict], batch_size: int, max_length: int, shuffle: bool, seed: int = 0,
                progress: EpochProgress | None = None):
    """Tokenised examples (loss mask on the answers), right-padded with the real pad token. With ``progress``
    the training loader of an exactly resumable fit (i2d2/resume.py: order by (seed, epoch), position restored
    from the checkpoint); without, a plain ordered loader that never draws from the global RNG."""
    rows = [r for r in (encode(tok, e["prompt"], e["target"], max_length) for e in examples) if r]
    if not rows:
        raise ValueError("no training example fits max_length; raise task.train.max_length")
    coll = partial(collate, pad_id=tok.pad_token_id, side="right")
    if progress is not None:
        loader = resumable_loader(rows, batch_size, progress=progress, seed=seed, shuffle=shuffle, collate_fn=coll)
    else:
        loader = DataLoader(rows, batch_size=batch_size, shuffle=shuffle, collate_fn=coll,
                            generator=torch.Generator().manual_seed(seed))
    return loader, len(examples) - len(rows)
