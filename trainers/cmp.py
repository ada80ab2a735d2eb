"""CMP multi-task seq2seq pre-training as a LightningModule (§3.3).

Every training step holds examples of each enabled task (Table 2) and optimises the summed loss
L = L_QA + L_QAG + L_SUM + L_TI (each the token-mean cross-entropy of its task's examples in the
step). Validation reports each task's loss and their sum (``val/loss``, used to pick the checkpoint
as in the paper's A.2).
"""

from __future__ import annotations

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from i2d2.cmp.data import Quintuple
from i2d2.cmp.tasks import TASKS, Collator, ExampleBuilder, _seed
from i2d2.lightning_setup import adamw_param_groups
from i2d2.resume import EpochProgress, resumable_loader, single_item


class MixedTaskBatches(Dataset):
    """Item ``i`` is training step ``i``: for each task, ``per_task`` examples drawn from random
    quintuples with a seed fixed by (seed, i), so a resumed run sees the same data stream.
    Text-infilling corruptions are re-drawn per step (dynamic masking)."""

    def __init__(self, quintuples: list[Quintuple], builder: ExampleBuilder, tasks: list[str], per_task: dict,
                 num_steps: int, seed: int = 0):
        if not quintuples:
            raise ValueError("no training quintuples")
        self.q, self.builder, self.tasks, self.per_task = quintuples, builder, list(tasks), per_task
        self.num_steps, self.seed = num_steps, seed

    def __len__(self):
        return self.num_steps

    def __getitem__(self, i):
        rng = np.random.default_rng(_seed("train", self.seed, i))
        out = {}
        for task in self.tasks:
            idx = rng.integers(len(self.q), size=self.per_task[task])
            out[task] = [self.builder.sample(self.q[j], task, rng, seed=_seed(self.seed, i, j)) for j in idx]
        return out


class TaskBatches(Dataset):
    """Fixed single-task batches (validation): every example of every quintuple, chunked per task."""

    def __init__(self, quintuples: list[Quintuple], builder: ExampleBuilder, tasks: list[str], batch_size: int,
                 max_per_task: int | None = None, seed: int = 0):
        self.items = []
        for task in tasks:
            exs = [e for q in quintuples for e in builder.examples(q, task, seed=seed)]
            if max_per_task and len(exs) > max_per_task:
                keep = np.random.default_rng(_seed("val", task, seed)).choice(len(exs), max_per_task, replace=False)
                exs = [exs[k] for k in sorted(keep)]
            self.items += [(task, exs[i:i + batch_size]) for i in range(0, len(exs), batch_size)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]

    def counts(self) -> dict[str, int]:
        """Examples per task: the n behind each validation loss."""
        out: dict[str, int] = {}
        for task, exs in self.items:
            out[task] = out.get(task, 0) + len(exs)
        return out


class CMPModule(L.LightningModule):
    def __init__(self, model, tokenizer, collator: Collator, lr: float = 3e-5, warmup_ratio: float = 0.01,
                 weight_decay: float = 0.0, total_steps: int = 1000, tasks: list[str] = TASKS,
                 callbacks: list | None = None):
        super().__init__()
        self.model, self.tokenizer, self.collator = model, tokenizer, collator
        self.lr, self.warmup_ratio, self.weight_decay, self.total_steps = lr, warmup_ratio, weight_decay, total_steps
        self.tasks = list(tasks)
        self._val: dict[str, list[float]] = {}
        self._callbacks = list(callbacks or [])
        self.save_hyperparameters(ignore=["model", "tokenizer", "collator", "callbacks"])

    def configure_callbacks(self):
        """Callbacks that belong to this fit (e.g. ``DevSelection``), added to whatever trainer runs it."""
        return self._callbacks

    # batches -------------------------------------------------------------------------------------
    def collate_train(self, item: dict) -> dict:
        return {t: self.collator([e.source for e in exs], [e.target for e in exs]) for t, exs in item.items() if exs}

    def collate_val(self, item) -> tuple[str, dict]:
        task, exs = item
        return task, self.collator([e.source for e in exs], [e.target for e in exs])

    def task_loss(self, batch: dict) -> torch.Tensor:
        return self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                          labels=batch["labels"]).loss

    # steps ---------------------------------------------------------------------------------------
    def setup(self, stage):
        # from_pretrained returns eval-mode models; training wants dropout on (set before Lightning's model summary
        # and mode check read the modes)
        if stage == "fit":
            self.model.train()

    def training_step(self, batch: dict, batch_idx: int):
        losses = {t: self.task_loss(b) for t, b in batch.items()}
        loss = torch.stack(list(losses.values())).sum()
        n = sum(b["input_ids"].shape[0] for b in batch.values())
        for t, v in losses.items():
            self.log(f"train/loss_{t}", v.detach(), batch_size=n)
        self.log("train/loss", loss.detach(), prog_bar=True, batch_size=n)
        return loss

    def on_validation_epoch_start(self):
        self._val = {}

    def validation_step(self, batch, batch_idx: int):
        task, tensors = batch
        loss = self.task_loss(tensors)
        n_tok = int((tensors["labels"] != -100).sum())
        self._val.setdefault(task, []).append((float(loss) * n_tok, n_tok))
        return loss

    def on_validation_epoch_end(self):
        per_task = {t: sum(a for a, _ in v) / max(1, sum(n for _, n in v)) for t, v in self._val.items()}
        for t, v in per_task.items():
            self.log(f"val/loss_{t}", v, sync_dist=True)
        if per_task:
            self.log("val/loss", sum(per_task.values()), prog_bar=True, sync_dist=True)
        self.last_val = {f"val/loss_{t}": v for t, v in per_task.items()} | {"val/loss": sum(per_task.values())}

    def configure_optimizers(self):
        from transformers import get_linear_schedule_with_warmup

        opt = torch.optim.AdamW(adamw_param_groups(self.model.parameters(), self.weight_decay), lr=self.lr)
        warm = int(round(self.warmup_ratio * self.total_steps))
        sched = get_linear_schedule_with_warmup(opt, warm, max(self.total_steps, warm + 1))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class DevSelection(L.Callback):
    """Checkpoint selection on a dev set (A.3): before training, every ``every`` steps and at the last
    step, ``score(model) -> float`` (higher is better: F1, BLEU, ROUGE-L) is measured and a copy of
    the best weights kept; when the fit ends the best weights are put back. ``history`` lists
    (step, score)."""

    def __init__(self, score, every: int):
        if every < 1:
            raise ValueError(f"dev evaluation interval must be >= 1 step, got {every}")
        self.score, self.every = score, every
        self.best, self.best_step, self.history, self._state = float("-inf"), None, [], None

    def _check(self, module, step: int):
        value = float(self.score(module.model))
        module.model.train()  # scoring generates in eval mode
        self.history.append((step, value))
        if value > self.best:
            self.best, self.best_step = value, step
            self._state = {k: v.detach().clone() for k, v in module.model.state_dict().items()}

    def on_train_start(self, trainer, pl_module):
        self._check(pl_module, 0)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        checked = self.history and self.history[-1][0] == step  # gradient accumulation: same step again
        if not checked and (step % self.every == 0 or step >= trainer.max_steps):
            self._check(pl_module, step)

    def on_train_end(self, trainer, pl_module):
        if self._state is not None:
            pl_module.model.load_state_dict(self._state)
        pl_module.model.eval()


def per_task_sizes(batch_size: int, tasks: list[str], mix: dict | None = None) -> dict:
    """Split a step's ``batch_size`` over the tasks in proportion to ``mix`` (default: equally),
    at least one example each and ``batch_size`` in all (one each when the batch is smaller than that)."""
    w = np.array([float((mix or {}).get(t, 1.0)) for t in tasks])
    if (w <= 0).any():
        raise ValueError(f"task.mix weights must be positive, got {dict(zip(tasks, w))}")
    raw = batch_size * w / w.sum()
    sizes = np.maximum(1, np.floor(raw).astype(int))
    while sizes.sum() < batch_size:  # hand out the remainder by largest fractional part
        sizes[np.argmax(raw - sizes)] += 1
    # the minimum of one made the step larger than the batch: take back from the task most over its share
    while sizes.sum() > max(batch_size, len(tasks)):
        sizes[np.argmax(np.where(sizes > 1, sizes - raw, -np.inf))] -= 1
    return dict(zip(tasks, sizes.tolist()))


def train_loader(module: CMPModule, dataset: MixedTaskBatches, num_workers: int = 0,
                 progress: EpochProgress | None = None) -> DataLoader:
    """Item i is step i. With ``progress`` (and ``i2d2.resume.ResumeState`` among the callbacks) a resumed fit
    continues at the step after its checkpoint instead of replaying the epoch from step 0."""
    if progress is not None:
        return resumable_loader(dataset, 1, progress=progress, shuffle=False,
                                collate_fn=single_item(module.collate_train))
    return DataLoader(dataset, batch_size=None, shuffle=False, collate_fn=module.collate_train, num_workers=num_workers)


def val_loader(module: CMPModule, dataset: TaskBatches, num_workers: int = 0) -> DataLoader:
    return DataLoader(dataset, batch_size=None, shuffle=False, collate_fn=module.collate_val, num_workers=num_workers)


class ExampleSteps(Dataset):
    """Step ``i`` = ``batch_size`` examples drawn (seeded by i) from a fixed example list, grouped by task
    (few-shot fine-tuning on downstream data)."""

    def __init__(self, examples: list, batch_size: int, num_steps: int, seed: int = 0):
        if not examples:
            raise ValueError("no fine-tuning examples")
        self.examples, self.batch_size, self.num_steps, self.seed = examples, batch_size, num_steps, seed

    def __len__(self):
        return self.num_steps

    def __getitem__(self, i):
        rng = np.random.default_rng(_seed("ft", self.seed, i))
        n = min(self.batch_size, len(self.examples))
        out: dict[str, list] = {}
        for j in rng.permutation(len(self.examples))[:n]:
            out.setdefault(self.examples[j].task, []).append(self.examples[j])
        return out
