"""Self-imitation fine-tuning: prompt-masked LM loss, LoRA, atomic save, resume after a kill, config errors."""

import copy

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from i2d2.models import load_causal_lm, tiny_model
from process_env import restored_process_state
from trainers.lm_finetune import (IGNORE, ResumableBatchSampler, RightPadCollator, SelfImitationDataModule, encode_example, finetune,
                                  join_statement)

ROWS = [{"prompt": p, "generation": g} for p, g in [
    ("Dogs are", "loyal animals."), ("A hammer can", "drive nails into wood."), ("Cats have", "sharp claws."),
    ("Rain is", "water falling from clouds."), ("Bread can", "be baked in an oven."), ("Birds can", "fly high."),
    ("Trees have", "green leaves."), ("Coffee is", "a bitter drink."), ("Ice is", "frozen water."),
    ("Snow is", "cold and white."),
]]
CFG = dict(lr=5e-3, epochs=2, batch_size=2, accumulate_grad_batches=1, max_length=32, ckpt_every_n_steps=1)
CPU = dict(_target_="lightning.Trainer", accelerator="cpu", devices=1, precision="32-true", max_epochs=1,
           log_every_n_steps=1, enable_checkpointing=True, enable_progress_bar=False)


def test_loss_only_on_continuation_and_eos():
    _, tok = tiny_model("gpt2")
    ex = encode_example(tok, "Dogs are", "loyal animals.", max_length=32)
    n_prompt = len(tok("Dogs are")["input_ids"])
    assert ex["labels"][:n_prompt] == [IGNORE] * n_prompt
    cont = ex["labels"][n_prompt:]
    assert IGNORE not in cont and cont[-1] == tok.eos_token_id
    assert tok.decode(cont[:-1]) == " loyal animals."
    assert tok.decode(ex["input_ids"][:-1]) == join_statement("Dogs are", "loyal animals.") == "Dogs are loyal animals."
    short = encode_example(tok, "Dogs are", "loyal animals that bark at night.", max_length=5)
    assert len(short["input_ids"]) == 5 and short["labels"][-1] != IGNORE


def test_sampler_shards_cover_everything_and_skip():
    shards = [list(ResumableBatchSampler(10, 2, seed=3, rank=r, world_size=2)) for r in range(2)]
    flat = [i for s in shards for b in s for i in b]
    assert sorted(flat) == list(range(10)) and len(shards[0]) == len(shards[1]) == 3
    s = ResumableBatchSampler(10, 2, seed=3)
    full = list(s)
    s.skip(0, 2)
    assert list(s) == full[2:] and list(s) == full  # skip applies once
    s.set_epoch(1)
    assert list(s) != full  # a new order every epoch


def _weights(path):
    model, _ = load_causal_lm(str(path))
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_finetune_saves_loadable_model_and_learns(tmp_path):
    model, tok = tiny_model("gpt2")
    dm = SelfImitationDataModule(ROWS, tok, batch_size=10, max_length=32)
    coll = RightPadCollator(tok.pad_token_id)(dm.examples)
    model.eval()
    with torch.no_grad():
        before = model(**coll).loss.item()
    summary = finetune(model, tok, ROWS, tmp_path / "work", tmp_path / "model", {**CFG, "epochs": 3}, CPU, seed=0)
    assert summary["steps"] == 15 and summary["n_train"] == 10
    new, tok2 = load_causal_lm(str(tmp_path / "model"))
    new.eval()
    with torch.no_grad():
        after = new(**coll).loss.item()
    assert after < before - 0.5
    assert tok2.padding_side == "left" and len(tok2) == len(tok)
    assert not list(tmp_path.glob(".model.*"))  # the atomic save left no temporary folder


def test_lora_merges_into_plain_model(tmp_path):
    base, tok = tiny_model("gpt2")
    ref = copy.deepcopy(base.state_dict())
    cfg = {**CFG, "epochs": 1, "lora": {"enabled": True, "r": 4, "alpha": 8, "dropout": 0.0, "target_modules": None}}
    finetune(base, tok, ROWS, tmp_path / "work", tmp_path / "model", cfg, CPU)
    w = _weights(tmp_path / "model")
    assert not any("lora" in k for k in w)
    assert not torch.allclose(w["transformer.h.0.attn.c_attn.weight"], ref["transformer.h.0.attn.c_attn.weight"])
    assert torch.allclose(w["transformer.h.0.mlp.c_fc.weight"], ref["transformer.h.0.mlp.c_fc.weight"])  # frozen


class Kill(Callback):
    def __init__(self, at_step):
        self.at_step = at_step

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step == self.at_step:
            raise RuntimeError("simulated kill")


class EpochLosses(Callback):
    """The logged epoch-mean losses, as loggers get them (read at the next epoch's start and at the end)."""

    def __init__(self):
        self.seen = []

    def _read(self, trainer):
        v = trainer.callback_metrics.get("finetune/loss_epoch")
        if v is not None:
            self.seen.append(float(v))

    def on_train_epoch_start(self, trainer, *args):
        self._read(trainer)

    def on_train_end(self, trainer, *args):
        self._read(trainer)


def test_killed_finetune_resumes_to_same_weights(tmp_path):
    model, tok = tiny_model("gpt2")
    assert not model.training  # as loaded: the module must switch dropout on, also when resuming mid-epoch
    seen_a, seen_b = EpochLosses(), EpochLosses()
    a = finetune(copy.deepcopy(model), tok, ROWS, tmp_path / "a", tmp_path / "a_model", CFG, CPU, seed=1,
                 callbacks=[seen_a])
    with pytest.raises(RuntimeError, match="simulated kill"):
        finetune(copy.deepcopy(model), tok, ROWS, tmp_path / "b", tmp_path / "b_model", CFG, CPU, seed=1,
                 callbacks=[Kill(7)])
    assert (tmp_path / "b" / "checkpoints" / "last.ckpt").exists() and not (tmp_path / "b_model").exists()
    summary = finetune(copy.deepcopy(model), tok, ROWS, tmp_path / "b", tmp_path / "b_model", CFG, CPU, seed=1,
                       callbacks=[seen_b])
    assert summary["resumed_from"] and summary["steps"] == 10
    wa, wb = _weights(tmp_path / "a_model"), _weights(tmp_path / "b_model")
    for k in wa:
        assert torch.allclose(wa[k], wb[k], atol=1e-6), k
    # the killed epoch's logged mean covers all of its batches, as the uninterrupted run's does (Lightning's own
    # on_epoch mean restarts at the resume: it covered steps 8-10 only)
    assert len(seen_a.seen) == 2 and seen_b.seen[-1] == pytest.approx(seen_a.seen[-1], abs=1e-5)
    assert summary["train_loss"] == pytest.approx(a["train_loss"], abs=1e-5) == pytest.approx(seen_a.seen[-1])


def test_deepspeed_on_cpu_fails_clearly(tmp_path):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from i2d2.config import CONF_DIR

    model, tok = tiny_model("gpt2")
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["trainer=deepspeed_stage3"])
    with pytest.raises(RuntimeError, match="DeepSpeed.*needs a CUDA GPU"):
        finetune(model, tok, ROWS, tmp_path / "w", tmp_path / "m", CFG, OmegaConf.to_container(cfg.trainer, resolve=True))


def test_log_interval_capped_at_an_epoch(tmp_path):
    """A kept set shorter than log_every_n_steps (which counts optimizer steps) still logs its step losses."""
    from trainers.lm_finetune import finetune_trainer

    tc = {**CPU, "log_every_n_steps": 5}
    assert finetune_trainer(tc, CFG, tmp_path / "a", steps_per_epoch=3)[0].log_every_n_steps == 3
    assert finetune_trainer(tc, CFG, tmp_path / "b", steps_per_epoch=40)[0].log_every_n_steps == 5
    assert finetune_trainer(tc, CFG, tmp_path / "c")[0].log_every_n_steps == 5
    assert finetune_trainer({**CPU, "log_every_n_steps": 0}, CFG, tmp_path / "d",
                            steps_per_epoch=3)[0].log_every_n_steps == 0  # no step logging stays off

    class Seen(Callback):
        def on_fit_start(self, trainer, pl_module):
            self.every = trainer.log_every_n_steps

    model, tok = tiny_model("gpt2")
    for accumulate, max_steps, every in [(1, -1, 3), (2, -1, 2), (1, 2, 2)]:  # 6 rows of batch 2: 3 batches
        seen = Seen()
        finetune(model, tok, ROWS[:6], tmp_path / f"w{accumulate}{max_steps}", tmp_path / f"m{accumulate}{max_steps}",
                 {**CFG, "epochs": 1, "accumulate_grad_batches": accumulate, "max_steps": max_steps}, tc,
                 callbacks=[seen])
        assert seen.every == every, (accumulate, max_steps, seen.every)


def test_epoch_log_line_carries_the_epoch_mean_loss(tmp_path, caplog):
    """The 'epoch N done' line is written after the module's epoch-end hook, which logs the epoch's mean loss."""
    import logging

    model, tok = tiny_model("gpt2")
    with caplog.at_level(logging.INFO, logger="i2d2.lightning_setup"):
        summary = finetune(model, tok, ROWS, tmp_path / "w", tmp_path / "m", CFG, CPU, seed=0)
    done = [r.getMessage() for r in caplog.records if " done at step " in r.getMessage()]
    assert [m.split(" done")[0] for m in done] == ["fit: epoch 0", "fit: epoch 1"]
    assert f"finetune/loss_epoch={summary['train_loss']:.4g} " in done[-1]


def test_seed_holds_under_a_strategy_that_reseeds_at_setup(tmp_path, monkeypatch):
    """DDP-family strategies (DDP, DeepSpeed, FSDP) re-seed at setup from the last ``seed_everything`` of the process
    (Lightning's reset_seed, from PL_GLOBAL_SEED). The fine-tuning's own seed must be the one they restore: else its
    dropout followed whichever fit seeded last, the critic's in an uninterrupted loop and the run's in one resumed
    after the critic stage (a resumed ZeRO-2 run's next iteration differed on an H100)."""
    import lightning as L

    ddp = {**CPU, "strategy": "ddp", "devices": 1}
    model, tok = tiny_model("gpt2")
    assert model.config.resid_pdrop > 0  # dropout draws from the RNG: a different seed gives other weights
    with restored_process_state():  # Lightning leaves RANK, LOCAL_RANK, MASTER_* and PL_GLOBAL_SEED behind
        L.seed_everything(7, verbose=False)  # the run's seed (i2d2.config.setup_run)
        finetune(copy.deepcopy(model), tok, ROWS, tmp_path / "a", tmp_path / "a_model", CFG, ddp, seed=1)
        L.seed_everything(0, verbose=False)  # a critic fitted earlier in the process
        finetune(copy.deepcopy(model), tok, ROWS, tmp_path / "b", tmp_path / "b_model", CFG, ddp, seed=1)
    wa, wb = _weights(tmp_path / "a_model"), _weights(tmp_path / "b_model")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_progress_log_writes_a_finished_epoch_when_the_fit_then_fails(caplog):
    import logging
    from types import SimpleNamespace

    from i2d2.lightning_setup import ProgressLog

    trainer = SimpleNamespace(current_epoch=0, global_step=5, is_global_zero=True,
                              callback_metrics={"finetune/loss_epoch": torch.tensor(0.5)})
    progress = ProgressLog("fit")
    progress.on_train_start(trainer, None)
    progress.on_train_epoch_end(trainer, None)  # e.g. the epoch-end checkpoint then fails to save
    line = ["fit: epoch 0 done at step 5 finetune/loss_epoch=0.5"]
    with caplog.at_level(logging.INFO, logger="i2d2.lightning_setup"):
        progress.on_exception(trainer, None, OSError("disk full"))  # Lightning then skips on_train_end
        assert [r.getMessage().split(" (")[0] for r in caplog.records] == line
        progress.on_train_end(trainer, None)
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == line  # written once


def test_lora_start_does_not_depend_on_what_ran_before(tmp_path):
    """LoRA's adapters start random: the fit seeds before building them, so a run whose earlier stages were skipped
    (resumed) fine-tunes to the same weights as one that ran them."""
    model, tok = tiny_model("gpt2")
    cfg = {**CFG, "epochs": 1, "lora": {"enabled": True, "r": 4, "alpha": 8, "dropout": 0.0, "target_modules": None}}
    for i, history in enumerate((0, 1)):
        torch.manual_seed(history)  # whatever drew from the RNG earlier in the process
        finetune(copy.deepcopy(model), tok, ROWS, tmp_path / f"w{i}", tmp_path / f"m{i}", cfg, CPU, seed=3)
    wa, wb = _weights(tmp_path / "m0"), _weights(tmp_path / "m1")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def _without_dropout(model):
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    return model


def test_ddp_epoch_loss_is_the_mean_over_every_rank(tmp_path, monkeypatch):
    """Each DDP rank sees its own half of the epoch: the reported loss is the mean over all of it, as one process
    computes it. With lr 0, no dropout and batches of one, every example's loss is fixed, so the two must agree. Under
    ddp_fork the main process got NaN (the ranks' running sums stay in the workers) and 0 epochs."""
    model, tok = tiny_model("gpt2")
    cfg = {**CFG, "lr": 0.0, "epochs": 1, "batch_size": 1, "weight_decay": 0.0}
    one = finetune(_without_dropout(copy.deepcopy(model)), tok, ROWS, tmp_path / "a", tmp_path / "a_model", cfg, CPU)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # forked workers run single-threaded (OpenMP)
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with restored_process_state():
            two = finetune(_without_dropout(copy.deepcopy(model)), tok, ROWS, tmp_path / "b", tmp_path / "b_model", cfg,
                           {**CPU, "strategy": "ddp_fork", "devices": 2})
    finally:
        torch.set_num_threads(n)
    assert (one["epochs"], one["steps"]) == (1, 10) and (two["epochs"], two["steps"]) == (1, 5)
    assert two["train_loss"] == pytest.approx(one["train_loss"], rel=1e-5)


def test_epoch_loss_state_gives_each_rank_its_own_share():
    from i2d2.resume import EpochMeanLoss

    state = {"sum": torch.tensor(3.0), "n": 2, "per_rank": torch.tensor([[3.0, 2.0], [5.5, 3.0]], dtype=torch.float64)}
    loss = EpochMeanLoss()
    loss.load_state_dict(state, rank=1, world_size=2)
    assert (loss.sum.dtype, float(loss.sum), loss.n) == (torch.float32, 5.5, 3)
    loss.load_state_dict(state, rank=0, world_size=3)  # another world size: rank 0's, as a checkpoint without shares
    assert (float(loss.sum), loss.n) == (3.0, 2)
