"""What a test that starts Lightning's distributed strategies in the pytest process must clean up, and what a run
launched from a test must not inherit.

Lightning and DeepSpeed set rank variables in the process (RANK, LOCAL_RANK, NODE_RANK, WORLD_SIZE, MASTER_*) and
the seed their strategies re-seed from (PL_GLOBAL_SEED, PL_SEED_WORKERS), and may leave a process group open. With
them a later ``ddp_fork`` test in the same process failed to connect its ranks (gloo: connection refused), and a
launched run would take a stale rank, port or seed."""

from __future__ import annotations

import contextlib
import os
import sys

import torch

PROCESS_VARS = ("MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK", "PL_GLOBAL_SEED",
                "PL_SEED_WORKERS")


def launch_env(**extra: str) -> dict:
    """The environment for a run launched as a user would (``python -m i2d2.train ...``): this process's without
    PROCESS_VARS and without a fault point, offline, one thread per process, then ``extra``. String hashing stays
    random, as a user's rerun (a new process) has it."""
    env = {k: v for k, v in os.environ.items() if k not in PROCESS_VARS and k != "I2D2_FAULT_AT"}
    env.update(WANDB_MODE="offline", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               OMP_NUM_THREADS="1")
    env.update(extra)
    return env


@contextlib.contextmanager
def restored_process_state():
    """Run a block that fits with a distributed strategy in this process; afterwards no process group is open
    (DeepSpeed's own groups included) and ``os.environ`` is as the block found it."""
    env = dict(os.environ)
    try:
        yield
    finally:
        try:
            ds_comm = sys.modules.get("deepspeed.comm")
            if ds_comm is not None and ds_comm.is_initialized():
                ds_comm.destroy_process_group()
            if torch.distributed.is_initialized():
                torch.distributed.destroy_process_group()
        finally:
            os.environ.clear()
            os.environ.update(env)
