"""Entry point: ``python -m i2d2.train [task=...] iteration=k [key=value ...]``.

Thin on purpose: compose the config, set the run up, hand it to the task's recipe
(``cfg.task.recipe``, a function ``run(cfg)`` under ``i2d2/recipes/``).
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from i2d2 import config  # noqa: F401  (registers the ${i2d2.*} resolvers before Hydra composes)


@hydra.main(version_base="1.3", config_path="../conf", config_name="train")
def main(cfg: DictConfig):
    config.setup_run(cfg)
    recipe = hydra.utils.get_method(cfg.task.recipe)
    return recipe(cfg)


if __name__ == "__main__":
    main()
