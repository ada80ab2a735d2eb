"""The README's Python examples run as written (given the names their prose leaves to the reader)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def python_block_after(heading: str) -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(heading)
    m = re.compile(r"```python\n(.*?)```", re.S).search(text, start)
    assert m is not None, f"no python block after {heading!r}"
    return m.group(1)


def test_constrained_decoding_example_runs():
    """It used to ask for the comparative at position 3 after a single ordered clause: ConstraintError."""
    from types import SimpleNamespace

    from i2d2.models import load_causal_lm

    model, tokenizer = load_causal_lm("tiny:gpt2")
    ns = {"model": model, "tokenizer": tokenizer, "comparatives": ["faster", "cheaper", "lighter", "safer"],
          "cfg": SimpleNamespace(decoding={"beam_size": 4, "num_return": 2, "max_new_tokens": 8, "batch_size": 1})}
    exec(compile(python_block_after("## Constrained decoding"), "README.md", "exec"), ns)
    gens = ns["gens"]
    assert gens and all(isinstance(g.text, str) for g in gens)
    assert [c for c in ns["cs"].dynamic][0].positions == [2]


def test_cmp_data_to_text_realiser_override_composes_and_builds():
    """The README's override for a data-to-text realiser: the template realiser's ``phrases`` used to reach
    Seq2SeqRealiser (TypeError). The overrides are read from the README line itself."""
    import shlex

    import hydra
    from hydra import compose, initialize_config_dir

    from i2d2.cmp.textualize import Seq2SeqRealiser
    from i2d2.config import CONF_DIR

    text = (ROOT / "README.md").read_text()
    m = re.search(r"`(task\.summary\.realiser\._target_=[^`]+)`", text)
    assert m is not None
    overrides = shlex.split(m.group(1).replace("<dir>", "tiny:t5"))
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["task=cmp", "logger=none", *overrides])
    realiser = hydra.utils.instantiate(cfg.task.summary.realiser)
    assert isinstance(realiser, Seq2SeqRealiser)
