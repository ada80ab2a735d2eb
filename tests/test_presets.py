"""Presets (conf/experiment/): experiment=smoke for every task, experiment=paper_<task> with the papers' numbers."""

import pytest
from hydra import compose, initialize_config_dir

from i2d2.config import CONF_DIR

TASKS = ("i2d2", "comparatives", "negverse", "cmp")


def _compose(*overrides):
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return compose("train", overrides=list(overrides))


@pytest.mark.parametrize("task", TASKS)
def test_smoke_is_tiny_for_every_task_and_only_touches_that_task(task):
    cfg = _compose(f"task={task}", "experiment=smoke")
    plain = _compose(f"task={task}")
    assert cfg.task.name == task and cfg.task.keys() == plain.task.keys()  # no other task's keys leak in
    assert (cfg.model.name, cfg.critic.name, cfg.logger._target_) == ("tiny:gpt2", "tiny:roberta", None)
    assert cfg.trainer.enable_progress_bar is False and cfg.critic.max_epochs == 1
    tiny = {"i2d2": lambda c: (c.task.max_prompts, c.decoding.beam_size, c.task.heldout.nouns) == (6, 3, ["umbrella", "ladder"]),
            "comparatives": lambda c: (c.task.max_passes, c.data.max_pairs, c.decoding.beam_size) == (2, 2, 4),
            "negverse": lambda c: (c.task.train.max_steps, c.task.prompt.num_virtual_tokens) == (3, 2),
            "cmp": lambda c: (c.task.model, c.task.pretrain.max_steps) == ("tiny:t5", 2)}
    assert tiny[task](cfg) and not tiny[task](plain)


def test_command_line_wins_over_a_preset():
    cfg = _compose("experiment=smoke", "decoding.beam_size=5", "model=gemma3_270m")
    assert cfg.decoding.beam_size == 5 and cfg.model.name == "packaged:gemma3-270m" and cfg.task.max_prompts == 6


def test_paper_presets_carry_the_papers_numbers():
    i2d2 = _compose("experiment=paper_i2d2")  # i2d2.txt §2.1-2.3, §3.3, App. A.3
    d = i2d2.decoding
    assert i2d2.task.name == "i2d2" and i2d2.model.name == "gpt2-xl" and i2d2.num_iterations == 3
    assert (d.batch_size, d.beam_size, d.num_return, d.max_new_tokens, d.min_new_tokens, d.length_penalty) == \
        (32, 10, 10, 30, 2, 0.1)
    assert (i2d2.critic.name, i2d2.critic.batch_size, i2d2.critic.lr, i2d2.critic.max_epochs) == ("roberta-large", 64, 1e-4, 5)
    assert i2d2.data.perplexity.threshold == 250 and i2d2.data.prompt_selection == "perplexity"
    assert len(i2d2.data.goal_prefixes) == 4 and i2d2.task.max_prompts is None

    nc = _compose("experiment=paper_comparatives")  # neurocomparatives.txt §2.2-2.3, §3, App. A-B
    d = nc.decoding
    assert nc.task.name == "comparatives" and nc.model.name == "gpt2-xl" and nc.task.max_passes is None
    assert (d.beam_size, d.num_return, d.length_penalty, d.no_repeat_ngram_size, d.beta, d.sat_tolerance) == \
        (15, 10, 0.1, 3, 1.25, 3)
    assert (nc.critic.name, nc.critic.lr, nc.critic.batch_size, nc.critic.dropout) == ("roberta-large-mnli", 5e-6, 32, 0.1)
    disc = nc.task.filters.discriminator
    assert (disc.critic.max_epochs, disc.critic.patience) == (50, 5) and dict(disc.cuts) == {"nc_xl": 1.0, "nc_l": 0.5,
                                                                                               "nc_s": 0.2}
    assert nc.task.filters.contradiction.scorer == "roberta-large-mnli" and nc.data.max_pairs is None

    cmp = _compose("experiment=paper_cmp")  # cmp-comparative-pretraining.txt Table 8, §4.2, App. A.2-A.3
    p = cmp.task.pretrain
    assert cmp.task.name == "cmp" and cmp.task.model == "facebook/bart-base" and list(cmp.task.downstream.shots) == [0, 100]
    assert (p.batch_size, p.lr, p.warmup_ratio, p.max_source_length, p.max_steps) == (192, 3e-5, 0.01, 512, 70000)
    assert cmp.task.downstream.finetune.batch_size == 64

    neg = _compose("experiment=paper_negverse")  # negverse.txt Fig. 4
    assert neg.task.name == "negverse" and (neg.task.masking.max_blanks, neg.task.masking.max_variants) == (2, 6)
