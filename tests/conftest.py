import os

# Tests never reach a hub or the network; W&B logs offline.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(int(os.environ.get("I2D2_TEST_THREADS", "2")))


@pytest.fixture(scope="session")
def tiny_gpt2():
    from i2d2.models import tiny_model

    return tiny_model("gpt2")


@pytest.fixture(scope="session")
def tiny_llama():
    from i2d2.models import tiny_model

    return tiny_model("llama")


@pytest.fixture(scope="session")
def gemma():
    """The packaged Gemma 3 270M (converted once into the user cache, then ~7 s to load)."""
    from i2d2.models import load_causal_lm

    return load_causal_lm("packaged:gemma3-270m")
