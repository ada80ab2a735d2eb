"""Exact resume of a killed Lightning fit: the same batches and the same random numbers as an uninterrupted run.

Shared by every trainer (LM fine-tuning, critic, CMP pre-training, NegVerse prompt tuning):

* ``ResumableBatchSampler``: batch order a pure function of (seed, epoch, rank); it can skip the batches of an
  epoch that a checkpoint says were consumed;
* ``ResumableLoader``: a DataLoader Lightning treats as *stateful* (``state_dict``/``load_state_dict``), so a
  step-level checkpoint records how far into the epoch the fit was and the restored fit continues from there
  (a plain DataLoader restarts the epoch from its first batch);
* ``ResumeState``: a callback that counts the batches run in the current epoch (what the loader's state
  reports), carries the torch RNG states in the checkpoint (dropout after a resume draws what an uninterrupted
  run draws) and marks each finished step for the fault-injection hook (``i2d2.faults``).

Use: ``progress = EpochProgress()``; ``resumable_loader(dataset, ..., progress=progress)``; add
``ResumeState(progress)`` to the trainer's callbacks; save ``last.ckpt`` every N steps.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Callable, Iterator

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from i2d2.faults import fault_point

log = logging.getLogger(__name__)


class EpochProgress:
    """Batches whose training step ran in the current epoch (counted by ``ResumeState``, read at checkpoint time)."""

    def __init__(self):
        self.epoch, self.batches = 0, 0


def seed_fit(seed: int) -> None:
    """Seed a fresh fit: torch (CPU and CUDA), numpy, random, and the process's PL_GLOBAL_SEED, from which
    DDP-family strategies (DDP, DeepSpeed, FSDP) re-seed at setup (Lightning's ``reset_seed``). With
    ``torch.manual_seed`` alone that re-seed took the seed of whichever fit seeded last in the process, so a run
    resumed past an earlier fit trained on with other dropout. A resumed fit then takes the checkpoint's RNG state
    (``ResumeState``)."""
    L.seed_everything(int(seed), workers=True, verbose=False)


class EpochMeanLoss:
    """An epoch's mean training loss, weighted by batch size, that a checkpoint carries (``state_dict``): after a
    mid-epoch resume Lightning's own ``on_epoch`` mean restarts and would cover only the batches run since. The sum
    stays a tensor on the loss's device: adding to it never waits for the device."""

    def __init__(self):
        self.reset()

    def reset(self, device=None) -> None:
        self.sum, self.n = torch.zeros((), device=device), 0

    def add(self, loss: torch.Tensor, n: int) -> None:
        self.sum = self.sum.to(loss.device) + loss.detach().float() * n
        self.n += int(n)

    def value(self) -> float:
        return float(self.sum) / self.n if self.n else float("nan")

    def global_value(self, strategy) -> torch.Tensor:
        """The mean over every rank's batches: each rank sees its own share of the epoch (Lightning's sync_dist
        would average the ranks' means, weighting a short last batch as a full one). A collective: every rank
        calls it, whatever its own count."""
        both = strategy.reduce(self._sum_and_count(self.sum.device), reduce_op="sum")  # the running sum is left as it is
        return both[0] / both[1]

    def _sum_and_count(self, device) -> torch.Tensor:
        # float64: a float32 sum round-trips exactly, and a count is exact far beyond any epoch
        return torch.stack([self.sum.detach().double().to(device),
                            torch.tensor(float(self.n), dtype=torch.float64, device=device)])

    def state_dict(self) -> dict:
        return {"sum": self.sum.detach().cpu(), "n": self.n}

    def checkpoint_state(self, module) -> dict:
        """What a checkpoint carries. Rank 0 writes it and every rank resumes from it, so it holds each rank's sum
        and count (``per_rank``) for a resumed rank to take its own.
        A collective (Lightning's dump_checkpoint, which calls on_save_checkpoint, runs on every rank)."""
        return {**self.state_dict(), "per_rank": module.all_gather(self._sum_and_count(module.device)).reshape(-1, 2).cpu()}

    def load_state_dict(self, state: dict, rank: int = 0, world_size: int = 1) -> None:
        per = state.get("per_rank")
        if per is not None and per.shape[0] == world_size:  # else (another world size) rank 0's, as before
            self.sum, self.n = per[rank, 0].float(), int(per[rank, 1])
        else:
            self.sum, self.n = state["sum"], int(state["n"])


def batches_per_rank(n: int, batch_size: int, world_size: int = 1) -> int:
    """Batches each rank takes from ``n`` examples in an epoch (``ResumableBatchSampler``): what a schedule's
    total steps are counted from before the loader exists."""
    return math.ceil(math.ceil(n / max(1, int(world_size))) / int(batch_size))


class ResumableBatchSampler(Sampler[list[int]]):
    """Batches of indices in an order fixed by (seed, epoch), sharded by rank, that can skip consumed batches.

    Every rank gets the same number of batches (indices are wrapped round to a multiple of the world size,
    like DistributedSampler), so DDP ranks never wait on each other at the end of an epoch.
    """

    def __init__(self, n: int, batch_size: int, seed: int = 0, shuffle: bool = True, rank: int = 0, world_size: int = 1):
        if n <= 0:
            raise ValueError("nothing to train on: the training set is empty")
        self.n, self.batch_size, self.seed, self.shuffle = n, int(batch_size), int(seed), shuffle
        self.rank, self.world_size = int(rank), int(world_size)
        self.epoch = 0
        self._skip: tuple[int, int] | None = None  # (epoch, batches to skip in that epoch)
        self.sampler = self  # Lightning calls ``loader.batch_sampler.sampler.set_epoch(epoch)`` every epoch

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def skip(self, epoch: int, batches: int) -> None:
        self._skip = (int(epoch), int(batches))

    def _indices(self) -> list[int]:
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
            order = torch.randperm(self.n, generator=g).tolist()
        else:
            order = list(range(self.n))
        per_rank = math.ceil(self.n / self.world_size)
        order = (order * (1 + per_rank * self.world_size // max(self.n, 1)))[: per_rank * self.world_size]
        return order[self.rank::self.world_size]

    def __len__(self) -> int:
        return batches_per_rank(self.n, self.batch_size, self.world_size)

    def __iter__(self) -> Iterator[list[int]]:
        idx = self._indices()
        batches = [idx[i:i + self.batch_size] for i in range(0, len(idx), self.batch_size)]
        start = 0
        if self._skip is not None and self._skip[0] == self.epoch:  # kept until the resumed epoch comes round
            start = min(self._skip[1], len(batches))
            self._skip = None
            log.info("resuming epoch %d after %d finished batches", self.epoch, start)
        yield from batches[start:]


class ResumableLoader(DataLoader):
    """A DataLoader Lightning treats as stateful: the checkpoint records the epoch and batches consumed."""

    def __init__(self, *args, progress: EpochProgress, **kwargs):
        super().__init__(*args, **kwargs)
        self._progress = progress

    def state_dict(self) -> dict:
        return {"epoch": self._progress.epoch, "batches": self._progress.batches}

    def load_state_dict(self, state: dict) -> None:
        self.batch_sampler.skip(state["epoch"], state["batches"])
        self._progress.epoch, self._progress.batches = state["epoch"], state["batches"]


def resumable_loader(dataset: Dataset, batch_size: int, *, progress: EpochProgress, seed: int = 0,
                     shuffle: bool = True, collate_fn: Callable | None = None, rank: int = 0,
                     world_size: int = 1) -> ResumableLoader:
    """A training loader whose order depends only on (seed, epoch) and whose position a checkpoint restores.
    Its own generator seeds the (unused) worker base seed, so iterating never draws from the global RNG."""
    sampler = ResumableBatchSampler(len(dataset), batch_size, seed, shuffle, rank, world_size)
    return ResumableLoader(dataset, batch_sampler=sampler, collate_fn=collate_fn, num_workers=0,
                           generator=torch.Generator().manual_seed(int(seed)), progress=progress)


def single_item(collate: Callable) -> Callable:
    """A collate for datasets whose item is already a whole batch (CMP's step-indexed datasets) read through a
    batch sampler of size 1."""
    return lambda items: collate(items[0])


def rng_state() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class ResumeState(L.Callback):
    """Counts the batches of the current epoch for ``ResumableLoader``, carries the RNG state through the
    checkpoint, and is the ``train_step/<name>`` fault point (``I2D2_FAULT_AT=train_step:<n>`` counts the steps of
    every fit, ``train_step/finetune:<n>`` those of the fits named so) and the ``train_end/<name>`` one."""

    def __init__(self, progress: EpochProgress | None = None, name: str = "fit"):
        self.progress = progress or EpochProgress()
        self.fault_name = f"train_step/{name}"
        self.end_fault_name = f"train_end/{name}"

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if self.progress.epoch != trainer.current_epoch:
            self.progress.epoch, self.progress.batches = trainer.current_epoch, 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        # counted before the step so that the checkpoint saved at this batch's end includes it
        if self.progress.epoch != trainer.current_epoch:
            self.progress.epoch, self.progress.batches = trainer.current_epoch, 0
        self.progress.batches += 1

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        fault_point(self.fault_name)

    def on_train_end(self, trainer, pl_module) -> None:
        fault_point(self.end_fault_name)  # the fit past its last step, winding down

    def state_dict(self) -> dict:
        # Lightning writes rank 0's checkpoint and every rank reads it; under DDP the ranks' random streams differ
        # (each draws dropout masks of its own batches' shapes), so each rank's state travels. Every rank builds
        # the checkpoint's state at the same save, so the gather is safe.
        state = {"rng": rng_state()}
        if _world() > 1:
            import torch.distributed as dist

            states = [None] * dist.get_world_size()
            dist.all_gather_object(states, state["rng"])
            state["rng_per_rank"] = states
        return state

    def load_state_dict(self, state: dict) -> None:
        per_rank = state.get("rng_per_rank")
        if per_rank and len(per_rank) == _world():
            import torch.distributed as dist

            set_rng_state(per_rank[dist.get_rank()])
        elif state.get("rng"):
            set_rng_state(state["rng"])


def _world() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
