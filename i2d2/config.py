"""Hydra/OmegaConf glue: resolvers used by conf/, and the shared run set-up."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parent.parent
CONF_DIR = ROOT / "conf"


def conf_path(rel: str) -> str:
    """Absolute path of a file under conf/ (e.g. the DeepSpeed JSON a trainer option names)."""
    path = CONF_DIR / rel
    if not path.exists():
        raise FileNotFoundError(f"conf file {rel!r} not found under {CONF_DIR}")
    return str(path)


def wandb_mode() -> str:
    """'online' only when the user configured W&B; a run never waits on the network otherwise."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    netrc = Path.home() / ".netrc"
    if netrc.exists() and "api.wandb.ai" in netrc.read_text(errors="ignore"):
        return "online"
    return "offline"


def register_resolvers() -> None:
    for name, fn in {"i2d2.conf_path": conf_path, "i2d2.wandb_mode": wandb_mode}.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)


register_resolvers()


def setup_run(cfg) -> None:
    """Process-wide settings every entry point wants: seeds, quiet libraries, offline hubs."""
    import lightning as L

    # Model hubs are unreachable on our machines; users with a hub can set HF_HUB_OFFLINE=0.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s %(name)s] %(message)s", datefmt="%H:%M:%S")
    for noisy in ("httpx", "urllib3", "filelock", "datasets", "DeepSpeed"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    L.seed_everything(int(cfg.seed), workers=True, verbose=False)
