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


# Keys the README names in backticks that are not config keys: metric names and the misspelt key of an error example.
NOT_CONFIG_KEYS = {"critic.cuts_test", "task.finetune.lrr"}


def readme_config_keys(text: str) -> set[str]:
    """Dotted config keys in the README's backticks: ``task.filter.{a,b}`` and ``task.x|y`` name each alternative;
    an added key (``+key=...``) and a removed one (``~key``) are left out."""
    def expand(key):
        m = re.search(r"\{([^{}]+)\}", key)
        if m:
            return [k for alt in m.group(1).split(",") for k in expand(key[:m.start()] + alt.strip() + key[m.end():])]
        head, _, last = key.rpartition(".")
        return [f"{head}.{alt}" for alt in last.split("|")] if "|" in last else [key]

    keys = set()
    for span in re.findall(r"`([^`\n]+)`", text):
        for tok in span.split():
            tok = tok.strip("'\",;:()")
            if tok.startswith(("+", "~")):
                continue
            key = tok.split("=")[0].rstrip(".")
            if re.fullmatch(r"(task|data|critic|decoding|trainer|model|logger|generate)(\.[\w{},|]+)+", key):
                keys.update(k for k in expand(key) if k not in NOT_CONFIG_KEYS)
    return keys


def test_every_config_key_the_readme_names_exists():
    """A key the README names (``task.filter.max_per_frame``, ``data.perplexity.{threshold,per,batch_size}``) is in
    the composed config of some task (or of ``i2d2.generate``, or a trainer option): a renamed or removed key left
    in the README sends a reader to an override Hydra refuses."""
    from hydra import compose, initialize_config_dir
    from omegaconf import DictConfig

    from i2d2.config import CONF_DIR

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfgs = [compose("train", overrides=[f"task={t}", "trainer=ddp" if t == "i2d2" else "trainer=cpu"])
                for t in ("i2d2", "comparatives", "cmp", "negverse")] + [compose("generate")]

    def has(cfg, key):
        node = cfg
        for part in key.split("."):
            if not isinstance(node, DictConfig) or part not in node:
                return False
            node = node._get_node(part)
            node = node if isinstance(node, DictConfig) else None
        return True

    keys = readme_config_keys((ROOT / "README.md").read_text())
    assert len(keys) > 100  # the extraction still finds the README's keys
    missing = sorted(k for k in keys if not any(has(c, k) for c in cfgs))
    assert not missing, f"README names config keys no composed config has: {missing}"


def test_every_repository_path_the_readme_names_exists():
    """Files and folders the README names by their path in the checkout (``conf/wordlists/uncountable_nouns.txt``,
    ``scripts/prompt_form_yield.py``, ``tests/faults/compare.py``) exist."""
    text = (ROOT / "README.md").read_text()
    paths = set()
    for span in re.findall(r"`([^`\n]+)`", text) + re.findall(r"\]\(([^)\s]+)\)", text):
        for tok in re.split(r"[\s,]+", span):
            tok = tok.strip("'\";:()")
            if re.match(r"(conf|scripts|tests|critics|trainers|callbacks|i2d2)/[\w./-]*$", tok) and "*" not in tok:
                paths.add(tok.rstrip("/"))
    assert len(paths) > 30
    # where the wheel puts conf/ (setup.py): in an installed package, not in a clean checkout
    built = {"i2d2/_conf"}
    missing = sorted(p for p in paths - built if not (ROOT / p).exists())
    assert not missing, f"README names paths that do not exist in the checkout: {missing}"
