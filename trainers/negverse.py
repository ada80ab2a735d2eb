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


class NegVerseModule(L.LightningModule):
    def __init__(self, lm: NegVerseLM, lr: float = 0.03, new_token_lr: float = 0.003, weight_decay: float = 0.0,
                 warmup_steps: int = 10, total_steps: int | None = None):
        super().__init__()
        self.lm = lm
        self.lr, self.new_token_lr, self.weight_decay = lr, new_token_lr, weight_decay
        self.warmup_steps, self.total_steps = warmup_steps, total_steps
        self.strict_loading = False  # checkpoints hold only the trainable tensors (see on_save_checkpoint)
        self.save_hyperparameters(ignore=["lm"])
        self.loss_history: list[float] = []

    def training_step(self, batch, batch_idx):
        loss = self.lm.loss(batch["input_ids"], batch["attention_mask"], batch["labels"])
        self.log("train/loss", loss, prog_bar=True, batch_size=batch["input_ids"].shape[0])
        self.loss_history.append(float(loss.detach()))
        return loss

    def validation_step(self, batch, batch_idx):
        loss = self.lm.loss(batch["input_ids"], batch["attention_mask"], batch["labels"])
        self.log("val/loss", loss, prog_bar=True, batch_size=batch["input_ids"].shape[0])
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


def make_loader(tok, examples: list[dict], batch_size: int, max_length: int, shuffle: bool, seed: int = 0):
    """Tokenised examples (loss mask on the answers), right-padded with the real pad token."""
    rows = [r for r in (encode(tok, e["prompt"], e["target"], max_length) for e in examples) if r]
    if not rows:
        raise ValueError("no training example fits max_length; raise task.train.max_length")
    g = torch.Generator().manual_seed(seed)
    return DataLoader(rows, batch_size=batch_size, shuffle=shuffle, generator=g if shuffle else None,
                      collate_fn=partial(collate, pad_id=tok.pad_token_id, side="right")), len(examples) - len(rows)
