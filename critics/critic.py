"""The supervised critic (I2D2 §2.3; NeuroComparatives' knowledge discriminator, §2.3.4 / App. B).

A binary sequence classifier (label 1 = valid statement) fine-tuned with cross-entropy. Validation keeps
the epoch's P(valid) scores and logs loss, average precision and precision at a target recall (the
early-stopping metric NeuroComparatives monitors, P@R=0.8).
"""

from __future__ import annotations

from typing import Mapping

import lightning as L
import numpy as np
import torch
from torchmetrics.classification import BinaryAveragePrecision, BinaryPrecisionAtFixedRecall

from i2d2.models import apply_lora, load_classifier
from i2d2.resume import EpochMeanLoss

VALID = 1
ID2LABEL = {0: "invalid", 1: "valid"}


class CriticModule(L.LightningModule):
    def __init__(self, name: str = "packaged:minilm", lr: float = 5e-5, weight_decay: float = 0.01,
                 warmup_ratio: float = 0.1, target_recall: float = 0.8, dropout: float | None = None,
                 total_steps: int = 1, lora: Mapping | None = None, model=None, tokenizer=None):
        super().__init__()
        self.save_hyperparameters(ignore=["model", "tokenizer"])
        if model is None:
            model, tokenizer = load_classifier(name, num_labels=2)
        if dropout is not None:  # the body's dropout; LoRA's own comes from lora.dropout (its layers are added below)
            for m in model.modules():
                if isinstance(m, torch.nn.Dropout):
                    m.p = float(dropout)
        self.lora_enabled = bool((lora or {}).get("enabled", False))
        if self.lora_enabled:  # adapters on the body; peft trains the classification head in full
            model = apply_lora(model, lora, "SEQ_CLS", where="critic.lora")
        self.model, self.tokenizer = model, tokenizer
        # with LoRA a checkpoint holds only what trains (on_save_checkpoint): the frozen body comes from `name`
        self.strict_loading = not self.lora_enabled
        self.model.config.id2label = dict(ID2LABEL)
        self.model.config.label2id = {v: k for k, v in ID2LABEL.items()}
        self.val_ap = BinaryAveragePrecision()
        self.val_p_at_r = BinaryPrecisionAtFixedRecall(min_recall=target_recall)
        self._val_scores: list[torch.Tensor] = []
        self._val_labels: list[torch.Tensor] = []
        self.val_result: tuple[np.ndarray, np.ndarray] | None = None  # (labels, scores) of the last val epoch
        self.train_loss = EpochMeanLoss()

    def setup(self, stage):
        # from_pretrained returns eval mode and Lightning keeps submodule modes: train with dropout on, set before
        # Lightning's model summary and mode check read the modes
        if stage == "fit":
            self.model.train()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None):
        kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            kwargs["token_type_ids"] = token_type_ids
        return self.model(**kwargs, labels=labels)

    def on_train_epoch_start(self):
        self.train_loss.reset(self.device)

    def on_train_epoch_end(self):
        loss = self.train_loss.global_value(self.trainer.strategy)  # every rank's batches (EpochMeanLoss)
        if not torch.isnan(loss):  # the whole epoch's mean, also after a mid-epoch resume
            self.log("train/loss_epoch", loss, batch_size=1)

    def training_step(self, batch, batch_idx):
        out = self(**batch)
        self.train_loss.add(out.loss, len(batch["labels"]))
        # the step's loss under the key Lightning gave it when it also kept the epoch mean (loggers' history)
        self.log("train/loss_step", out.loss, prog_bar=True, on_step=True, on_epoch=False, batch_size=len(batch["labels"]))
        return out.loss

    def validation_step(self, batch, batch_idx):
        out = self(**batch)
        p_valid = out.logits.float().softmax(-1)[:, VALID]
        y = batch["labels"]
        self.val_ap.update(p_valid, y)
        self.val_p_at_r.update(p_valid, y)
        self._val_scores.append(p_valid.detach().cpu())
        self._val_labels.append(y.detach().cpu())
        self.log("val/loss", out.loss, prog_bar=True, on_epoch=True, batch_size=len(y), sync_dist=True)

    def on_validation_epoch_start(self):
        self._val_scores, self._val_labels = [], []

    def on_validation_epoch_end(self):
        precision, _ = self.val_p_at_r.compute()
        self.log("val/ap", self.val_ap.compute(), prog_bar=True, sync_dist=True)
        self.log("val/p_at_r", precision, prog_bar=True, sync_dist=True)
        self.val_ap.reset()
        self.val_p_at_r.reset()
        if self._val_scores:
            self.val_result = (torch.cat(self._val_labels).numpy(), torch.cat(self._val_scores).numpy())

    def predict_step(self, batch, batch_idx):
        batch = {k: v for k, v in batch.items() if k != "labels"}
        return self(**batch).logits.float().softmax(-1)[:, VALID]

    def _trained(self) -> set[str]:
        return {n for n, p in self.named_parameters() if p.requires_grad}

    def on_load_checkpoint(self, checkpoint):
        if "epoch_loss" in checkpoint:
            self.train_loss.load_state_dict(checkpoint["epoch_loss"], self.global_rank, self.trainer.world_size)

    def on_save_checkpoint(self, checkpoint):
        checkpoint["epoch_loss"] = self.train_loss.checkpoint_state(self)
        if self.lora_enabled:  # a 7B body would otherwise be written whole every ckpt_every_n_steps
            trained = self._trained()
            checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if k in trained}

    def load_weights(self, state: dict) -> None:
        """Load a checkpoint's weights; with LoRA only the trained ones are there, and every one of them must be."""
        if not self.lora_enabled:
            self.load_state_dict(state)
            return
        missing = sorted(self._trained() - set(state))
        if missing:
            raise ValueError(f"critic checkpoint lacks trained weights {missing[:3]}{' ...' if len(missing) > 3 else ''}")
        self.load_state_dict(state, strict=False)

    def export_model(self):
        """The plain transformers classifier to save (LoRA adapters merged into the body)."""
        return self.model.merge_and_unload() if self.lora_enabled else self.model

    def configure_optimizers(self):
        from transformers import get_linear_schedule_with_warmup

        from i2d2.lightning_setup import adamw_param_groups

        opt = torch.optim.AdamW(adamw_param_groups(self.model.parameters(), self.hparams.weight_decay),
                                lr=self.hparams.lr)
        # computed by the caller (lightning_setup.optimizer_steps): trainer.estimated_stepping_batches would
        # stop Lightning from restoring the train loader's position on resume
        total = max(1, int(self.hparams.total_steps))
        sched = get_linear_schedule_with_warmup(opt, int(self.hparams.warmup_ratio * total), total)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
