"""Recipes for tests of the entry point (``task.recipe=tests.entry_point_recipe.<function>``): ``open_group`` opens a
one-rank process group, as Lightning's DDP and DeepSpeed strategies do, and leaves it open; at exit it records whether
the group was still open. ``wait_for_interrupt`` waits for a Ctrl-C."""

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


def wait_for_interrupt(cfg):
    """Prints "ready" and waits for the test's SIGINT (Ctrl-C) or SIGTERM, outside (``+task.fit=false``) or inside a
    Lightning fit, which turns the KeyboardInterrupt into ``sys.exit(1)`` and a SIGTERM into its SIGTERMException at
    the end of the step."""
    import time

    if not cfg.task.get("fit"):
        print("ready", flush=True)
        time.sleep(120)
        return []
    import lightning as L
    import torch

    class Wait(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Linear(1, 1)

        def training_step(self, batch, i):
            print("ready", flush=True)
            for _ in range(1200):  # a step that ends once a SIGTERM is in (Lightning stops the fit after the step)
                time.sleep(0.1)
                if self.trainer.received_sigterm:
                    break

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    L.Trainer(accelerator="cpu", max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
              enable_model_summary=False).fit(Wait(), torch.utils.data.DataLoader(torch.zeros(2, 1)))
    return []


def sigterm_in_fit_teardown(cfg):
    """A fit built by ``build_trainer`` that gets a SIGTERM after its last step, while it tears down (``on_train_end``:
    Lightning checks its SIGTERM flag after a step and an epoch, not after the last one), then a next stage that
    writes ``next_stage.txt`` in the run folder and, with ``+task.fail_after=true``, fails with a real error."""
    import os
    import signal
    import time

    import lightning as L
    import torch

    from i2d2.lightning_setup import build_trainer

    class SignalAtTrainEnd(L.Callback):
        def on_train_end(self, trainer, pl_module):
            os.kill(os.getpid(), signal.SIGTERM)  # a `kill` of the run while the fit winds down
            time.sleep(0.5)  # the handler runs here, in the fit

    class One(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Linear(1, 1)

        def training_step(self, batch, i):
            return self.w(batch).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    trainer = build_trainer({"_target_": "lightning.Trainer", "accelerator": "cpu", "devices": 1}, max_steps=2,
                            logger=False, enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False, callbacks=[SignalAtTrainEnd()])
    trainer.fit(One(), torch.utils.data.DataLoader(torch.zeros(4, 1), batch_size=1))
    (Path(cfg.run_dir) / "next_stage.txt").write_text("the next stage ran\n")  # what a stopped run never reaches
    if cfg.task.get("fail_after"):
        raise RuntimeError("a real error of the next stage")
    return []


def sigterm_in_a_finaliser(cfg):
    """A SIGTERM whose handler runs inside a finaliser (``__del__``, as a DataLoader iterator's, which joins its workers
    there for up to seconds): Python reports an exception raised there and carries on. Then the run goes on for 30 s
    and a next stage writes ``next_stage.txt`` in the run folder."""
    import os
    import signal
    import time

    class Finaliser:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)  # the handler runs here

    Finaliser()  # collected at once
    for _ in range(300):
        time.sleep(0.1)
    (Path(cfg.run_dir) / "next_stage.txt").write_text("the next stage ran\n")  # what a stopped run never reaches
    return []
