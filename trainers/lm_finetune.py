"""Self-imitation fine-tuning of the generator (I2D2 Algorithm 1, line 8).

P_{k+1} = argmax_θ E log P(y | x) over the critic-kept generations y of prompt x: the standard conditional
LM objective, so the loss covers only the continuation tokens (and the EOS that ends the statement), never
the prompt. Full fine-tuning or LoRA (peft) by config; any Lightning trainer (cpu, gpu, ddp, DeepSpeed ZeRO-2/3).

Resume: checkpoints go to ``<work_dir>/checkpoints`` (``last.ckpt`` every ``ckpt_every_n_steps`` optimizer
steps). The batch order is a pure function of (seed, epoch, rank), the data loader is *stateful* (Lightning
saves/restores how many batches of the epoch were consumed) and the RNG state travels in the checkpoint
(i2d2/resume.py, shared with the critic, CMP and NegVerse trainers), so a
killed fine-tuning restarted with the same inputs continues from the last checkpoint and ends with the same
weights as an uninterrupted run.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
from pathlib import Path
from typing import Any, Mapping, Sequence

import lightning as L
import torch
from torch.utils.data import Dataset

from i2d2.io import atomic_dir
from i2d2.models import apply_lora
from i2d2.lightning_setup import (ModelCheckpoint, adamw_param_groups, build_trainer, check_trainer_cfg, full_weights,
                                  optimizer_steps, plain, resume_checkpoint, world_size_of)
from i2d2.schemas import FinetuneConfig, fill
from i2d2.resume import (EpochMeanLoss, EpochProgress, ResumableBatchSampler, ResumeState,  # noqa: F401 (re-exported)
                         batches_per_rank, resumable_loader, seed_fit)

log = logging.getLogger(__name__)

IGNORE = -100


# ----------------------------------------------------------------------------- data

def join_statement(prompt: str, continuation: str) -> str:
    """The full statement a prompt + continuation make (one space between, none if the prompt ends in one)."""
    prompt, continuation = prompt or "", (continuation or "").strip()
    if not prompt:
        return continuation
    if not continuation:
        return prompt
    return prompt + continuation if prompt[-1].isspace() else f"{prompt} {continuation}"


def encode_example(tokenizer, prompt: str, continuation: str, max_length: int) -> dict:
    """Token ids of prompt + continuation + EOS with labels masked (-100) on the prompt.

    The prompt is encoded with the tokenizer's special tokens (e.g. Gemma's <bos>), the continuation
    without, after the separating space, exactly as the decoder sees them at generation time.
    Over-long examples are cut from the right (the continuation keeps at least one token).
    """
    p_ids = tokenizer(prompt, add_special_tokens=True)["input_ids"] if prompt else []
    if prompt and tokenizer.bos_token_id is not None and (not p_ids or p_ids[0] != tokenizer.bos_token_id) \
            and getattr(tokenizer, "add_bos_token", False):
        p_ids = [tokenizer.bos_token_id] + p_ids
    sep = "" if (not prompt or prompt[-1].isspace()) else " "
    c_ids = tokenizer(sep + continuation.strip(), add_special_tokens=False)["input_ids"]
    if tokenizer.eos_token_id is not None:
        c_ids = c_ids + [tokenizer.eos_token_id]
    if not c_ids:
        raise ValueError(f"empty continuation for prompt {prompt!r}")
    p_ids = p_ids[: max(0, max_length - 1)]
    c_ids = c_ids[: max(1, max_length - len(p_ids))]
    return {"input_ids": p_ids + c_ids, "labels": [IGNORE] * len(p_ids) + c_ids}


class LMExamples(Dataset):
    def __init__(self, examples: list[dict]):
        self.examples = examples

    def __len__(self):
        return len(self.examples)

    def __getitem__(self, i):
        return self.examples[i]


class RightPadCollator:
    """Right-pads input ids (pad id), labels (-100) and builds the attention mask."""

    def __init__(self, pad_token_id: int):
        self.pad = int(pad_token_id)

    def __call__(self, batch: list[dict]) -> dict:
        n = max(len(b["input_ids"]) for b in batch)
        ids = torch.full((len(batch), n), self.pad, dtype=torch.long)
        labels = torch.full((len(batch), n), IGNORE, dtype=torch.long)
        att = torch.zeros((len(batch), n), dtype=torch.long)
        for i, b in enumerate(batch):
            m = len(b["input_ids"])
            ids[i, :m] = torch.tensor(b["input_ids"])
            labels[i, :m] = torch.tensor(b["labels"])
            att[i, :m] = 1
        return {"input_ids": ids, "attention_mask": att, "labels": labels}


class SelfImitationDataModule(L.LightningDataModule):
    """Kept (prompt, generation) rows -> prompt-masked causal-LM batches."""

    def __init__(self, rows: Sequence[Mapping], tokenizer, batch_size: int = 8, max_length: int = 64,
                 seed: int = 0, shuffle: bool = True):
        super().__init__()
        self.tokenizer, self.batch_size, self.max_length = tokenizer, int(batch_size), int(max_length)
        self.seed, self.shuffle = int(seed), shuffle
        self.examples = [encode_example(tokenizer, str(r.get("prompt", "")), str(r["generation"]), self.max_length)
                         for r in rows]
        if not self.examples:
            raise ValueError("nothing to fine-tune on: the kept set is empty")
        self.progress = EpochProgress()

    def train_dataloader(self):
        rank = self.trainer.global_rank if self.trainer is not None else 0
        world = self.trainer.world_size if self.trainer is not None else 1
        return resumable_loader(LMExamples(self.examples), self.batch_size, progress=self.progress, seed=self.seed,
                                shuffle=self.shuffle, collate_fn=RightPadCollator(self.tokenizer.pad_token_id),
                                rank=rank, world_size=world)


# ----------------------------------------------------------------------------- module

class SelfImitationModule(L.LightningModule):
    """Causal-LM loss on the continuation of each kept generation; full fine-tuning or LoRA."""

    def __init__(self, model, lr: float = 5e-5, weight_decay: float = 0.0, warmup_ratio: float = 0.0,
                 lora: Mapping | None = None, gradient_checkpointing: bool = False, total_steps: int | None = None):
        super().__init__()
        self.save_hyperparameters(ignore=["model"])
        lora = dict(lora or {})
        self.lora_enabled = bool(lora.get("enabled", False))
        if gradient_checkpointing and hasattr(model, "gradient_checkpointing_enable"):
            model.gradient_checkpointing_enable()
            model.config.use_cache = False
        if self.lora_enabled:
            model = apply_lora(model, lora, "CAUSAL_LM", where="task.finetune.lora")
        self.model = model
        # the last epoch's mean loss, kept in the checkpoint: a fit resumed after its last step runs no step, and
        # the summary still reads it
        self.train_loss = EpochMeanLoss()

    def epoch_loss(self) -> float:
        return self.train_loss.value()

    def on_save_checkpoint(self, checkpoint):
        checkpoint["epoch_loss"] = self.train_loss.checkpoint_state(self)

    def on_load_checkpoint(self, checkpoint):
        if "epoch_loss" in checkpoint:
            self.train_loss.load_state_dict(checkpoint["epoch_loss"], self.global_rank, self.trainer.world_size)

    def forward(self, **batch):
        return self.model(**batch)

    def setup(self, stage):
        # HF models load in eval mode and Lightning keeps a module's mode as it finds it. setup("fit") runs before
        # the model summary and the fit loop's mode check (a warning otherwise) read the modes, and also on a resume,
        # where on_train_epoch_start is not called mid-epoch (dropout as in the first run).
        if stage == "fit":
            self.model.train()

    def on_train_epoch_start(self):
        self.model.train()
        self.train_loss.reset(self.device)

    def on_train_epoch_end(self):
        # the whole epoch's mean over every rank, also after a mid-epoch resume (EpochMeanLoss); the epochs done as
        # a metric: a ddp_fork fit hands metrics, not the trainer's epoch count, back to the main process
        loss = self.train_loss.global_value(self.trainer.strategy)
        if not torch.isnan(loss):
            self.log("finetune/loss_epoch", loss, batch_size=1, sync_dist=False)
        self.log("finetune/epoch", float(self.current_epoch + 1), batch_size=1, reduce_fx="max")

    def training_step(self, batch, batch_idx):
        out = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])
        # optimizer steps so far, as a metric: forked DDP ranks hand metrics (not the step count) back to the main process
        self.log("finetune/step", float(self.global_step + 1), on_step=True, on_epoch=False, reduce_fx="max", batch_size=1)
        bs = batch["input_ids"].shape[0]
        self.train_loss.add(out.loss, bs)
        n_tok = (batch["labels"][:, 1:] != IGNORE).sum()
        # the step's loss under the key Lightning gave it when it also kept the epoch mean (loggers' history)
        self.log("finetune/loss_step", out.loss, prog_bar=True, on_step=True, on_epoch=False,
                 batch_size=batch["input_ids"].shape[0], sync_dist=False)
        self.log("finetune/tokens", n_tok.float(), on_step=True, reduce_fx="sum", batch_size=1)
        return out.loss

    def configure_optimizers(self):
        opt = torch.optim.AdamW(adamw_param_groups(self.model.parameters(), self.hparams.weight_decay),
                                lr=self.hparams.lr)
        # total_steps from lightning_setup.optimizer_steps, never trainer.estimated_stepping_batches (see there)
        total = max(1, int(self.hparams.total_steps or 1))
        warmup = int(round(self.hparams.warmup_ratio * total))
        from transformers import get_linear_schedule_with_warmup

        sched = get_linear_schedule_with_warmup(opt, warmup, total)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def export_model(self):
        """The plain transformers model to save (LoRA adapters merged into the base weights)."""
        if self.lora_enabled:
            return self.model.merge_and_unload()
        return self.model


# ----------------------------------------------------------------------------- driver

def finetune_trainer(trainer_cfg: Mapping, cfg: Mapping, work_dir: str | Path, logger=None,
                     callbacks: Sequence = (), progress: EpochProgress | None = None,
                     steps_per_epoch: int | None = None) -> tuple[L.Trainer, ModelCheckpoint]:
    """The Trainer of one fine-tuning (through ``i2d2.lightning_setup.build_trainer``) and its checkpoint callback:
    ``last.ckpt`` every ``ckpt_every_n_steps`` optimizer steps (a directory under DeepSpeed); ``progress``: the
    data module's, counted by ``ResumeState`` (exact resume, i2d2/resume.py). ``steps_per_epoch`` (optimizer steps
    the fit takes in an epoch, at most) caps the trainer's ``log_every_n_steps``, which counts optimizer steps: a
    kept set shorter than the interval (the CPU demo's 3 steps against 5) would otherwise log no step's loss."""
    cfg = fill(FinetuneConfig, cfg, where="task.finetune")
    every = (plain(trainer_cfg) or {}).get("log_every_n_steps")
    every = 50 if every is None else int(every)  # Lightning's default; 0 (no step logging) stays 0
    if steps_per_epoch and every > 0:
        every = max(1, min(every, int(steps_per_epoch)))
    ckpt = ModelCheckpoint(dirpath=Path(work_dir) / "checkpoints", filename="step{step}", save_last=True,
                           save_top_k=0, every_n_train_steps=max(1, cfg["ckpt_every_n_steps"]),
                           save_on_train_epoch_end=True, auto_insert_metric_name=False)
    trainer = build_trainer(trainer_cfg, micro_batch=cfg["batch_size"], max_epochs=cfg["epochs"],
                            max_steps=cfg["max_steps"], accumulate_grad_batches=cfg["accumulate_grad_batches"],
                            default_root_dir=str(work_dir), log_every_n_steps=every,
                            use_distributed_sampler=False, num_sanity_val_steps=0, limit_val_batches=0,
                            enable_model_summary=False, logger=logger if logger is not None else False,
                            callbacks=[*callbacks, ResumeState(progress, "finetune"), ckpt])
    return trainer, ckpt


def finetune(model, tokenizer, rows: Sequence[Mapping], work_dir: str | Path, model_out: str | Path,
             cfg: Mapping, trainer_cfg: Mapping, logger=None, callbacks: Sequence = (), seed: int = 0,
             meta: Mapping | None = None) -> dict:
    """Fine-tune ``model`` on kept rows (prompt, generation) and save it to ``model_out`` (save_pretrained).

    ``cfg``: i2d2.schemas.FinetuneConfig keys (missing ones take its defaults).
    Resumes from ``work_dir/checkpoints/last.ckpt`` when present (a directory under DeepSpeed); the checkpoints
    are removed once the model is saved unless ``keep_checkpoints``. Returns a summary dict.
    """
    work_dir, model_out = Path(work_dir), Path(model_out)
    tc = plain(trainer_cfg)
    check_trainer_cfg(tc)
    cfg = fill(FinetuneConfig, cfg, where="task.finetune")
    dm = SelfImitationDataModule(rows, tokenizer, batch_size=cfg["batch_size"], max_length=cfg["max_length"],
                                 seed=seed)
    batches = batches_per_rank(len(dm.examples), dm.batch_size, world_size_of(tc))  # per epoch, one rank
    total = optimizer_steps(batches, cfg["epochs"], tc, accumulate=cfg["accumulate_grad_batches"],
                            max_steps=cfg["max_steps"])
    # before the module: LoRA's adapters start random; then dropout etc. (a resumed run takes the checkpoint's state)
    seed_fit(seed)
    module = SelfImitationModule(model, lr=cfg["lr"], weight_decay=cfg["weight_decay"],
                                 warmup_ratio=cfg["warmup_ratio"], lora=cfg["lora"],
                                 gradient_checkpointing=cfg["gradient_checkpointing"], total_steps=total)
    per_epoch = min(total, math.ceil(batches / max(1, int(cfg["accumulate_grad_batches"]))))
    trainer, ckpt = finetune_trainer(tc, cfg, work_dir, logger, callbacks, dm.progress, steps_per_epoch=per_epoch)
    resume = resume_checkpoint(Path(ckpt.dirpath) / "last.ckpt", trainer)
    if resume:
        log.info("fine-tuning: resuming from %s", resume)
    trainer.fit(module, datamodule=dm, ckpt_path=resume)
    metrics = trainer.callback_metrics  # under ddp_fork what the main process gets back of the ranks' fit
    steps = max(int(trainer.global_step), int(float(metrics.get("finetune/step", 0))))
    # a fit resumed after its last step runs no epoch end: its loss is the checkpoint's (one process then)
    loss = float(metrics["finetune/loss_epoch"]) if "finetune/loss_epoch" in metrics else module.epoch_loss()
    summary = {"n_train": len(dm.examples), "steps": steps,
               "epochs": max(int(trainer.current_epoch), int(float(metrics.get("finetune/epoch", 0)))),
               "resumed_from": resume, "lora": module.lora_enabled, "train_loss": loss}
    with full_weights(trainer, module):  # ZeRO-3: every rank takes part in gathering the shards
        if trainer.is_global_zero:
            save_model(module.export_model(), tokenizer, model_out, meta={**(meta or {}), **summary})
    if trainer.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
    if trainer.is_global_zero and not cfg["keep_checkpoints"]:
        # model_out holds the result; full-model checkpoints with optimizer state are ~4x the model's size
        shutil.rmtree(ckpt.dirpath, ignore_errors=True)
    return summary


def save_model(model, tokenizer, path: str | Path, meta: Mapping | None = None) -> Path:
    """``save_pretrained`` into a temporary sibling folder, then swap it in: a kill never leaves half a model."""
    path = Path(path)
    with atomic_dir(path) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / "i2d2_meta.json").write_text(json.dumps(dict(meta or {}), indent=2, default=str) + "\n")
    return path


def read_model_meta(path: str | Path) -> dict[str, Any]:
    p = Path(path) / "i2d2_meta.json"
    return json.loads(p.read_text()) if p.exists() else {}
