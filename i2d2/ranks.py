"""Which rank this process is, and the rank processes it launched: what the entry point, the fault points and the
I2D2 recipe's launcher share. Plain ``os``, no torch: the entry point reads the rank before anything heavy loads."""

from __future__ import annotations

import os

# the rank processes this one launched (subprocess.Popen; i2d2.recipes.generics.launch): rank 0's SIGTERM handler
# (i2d2.train) passes the signal on to them. `kill <pid>` of the command a user started reached rank 0 alone, which
# exited 143, and the other ranks failed with a traceback (or, in a fit, every rank hung).
LAUNCHED_RANKS: list = []


def launched_rank() -> int:
    """This process's rank as its launcher set it (Lightning's subprocess launcher, torchrun, SLURM); 0 alone."""
    for var in ("RANK", "SLURM_PROCID"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return int(os.environ.get("NODE_RANK", 0) or 0) + int(os.environ.get("LOCAL_RANK", 0) or 0)
