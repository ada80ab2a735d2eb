"""A recipe for tests of the entry point (``task.recipe=tests.entry_point_recipe.open_group``): it opens a one-rank
process group, as Lightning's DDP and DeepSpeed strategies do, and leaves it open; at exit it records whether the
group was still open."""

import atexit
import json
from pathlib import Path


def open_group(cfg):
    import torch.distributed as dist

    run_dir = Path(cfg.run_dir)
    dist.init_process_group("gloo", init_method=f"file://{run_dir / 'store'}", rank=0, world_size=1)

    def record():
        (run_dir / "group_at_exit.json").write_text(json.dumps({"open": dist.is_initialized()}))

    atexit.register(record)
    return []
