"""One trainer factory (i2d2.lightning_setup.build_trainer) for every fit, DeepSpeed configs that DeepSpeed accepts,
the device helper, the AdamW groups, resuming from DeepSpeed checkpoint directories and ZeRO-3 saves.

The configuration tests build the Trainer through the fine-tuning's own code path (``trainers.lm_finetune.finetune``
up to ``trainer.fit``) from the composed Hydra config, with CUDA availability faked: Lightning constructs the
strategy without touching a GPU. The last tests really run DeepSpeed ZeRO-2/3 on the CPU (DeepSpeed has a CPU
accelerator; Lightning refuses it, so a test-only subclass skips that check); they carry the ``deepspeed`` marker.
"""

import copy
import json
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.accelerators import CUDAAccelerator
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, SingleDeviceStrategy

import i2d2.lightning_setup as S
import trainers.lm_finetune as F
from i2d2.models import tiny_model
from process_env import launch_env, restored_process_state

ROWS = [{"prompt": p, "generation": g} for p, g in [
    ("Dogs are", "loyal animals."), ("A hammer can", "drive nails into wood."), ("Cats have", "sharp claws."),
    ("Rain is", "water falling from clouds."), ("Bread can", "be baked in an oven."), ("Birds can", "fly high."),
    ("Trees have", "green leaves."), ("Coffee is", "a bitter drink."),
]]


def compose(*overrides):
    from hydra import compose as hydra_compose, initialize_config_dir

    from i2d2.config import CONF_DIR

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return hydra_compose("train", overrides=list(overrides))


@pytest.fixture
def fake_cuda(monkeypatch):
    """Two bf16-capable CUDA devices, as far as torch and Lightning's accelerator checks can tell."""
    import lightning.fabric.accelerators.cuda as fabric_cuda

    # DeepSpeed picks its accelerator once per process: let it see the real machine, not the fake CUDA
    deepspeed_accelerator = pytest.importorskip("deepspeed.accelerator")
    deepspeed_accelerator.get_accelerator()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    monkeypatch.setattr(fabric_cuda, "num_cuda_devices", lambda: 2)
    monkeypatch.setattr(CUDAAccelerator, "is_available", staticmethod(lambda: True))
    monkeypatch.setattr(CUDAAccelerator, "auto_device_count", staticmethod(lambda: 2))


class _Built(Exception):
    pass


def trainer_of_loop(monkeypatch, cfg, tmp_path) -> L.Trainer:
    """The Trainer ``finetune`` builds for the loop's ``task.finetune`` / ``trainer`` config (stopped at fit)."""
    def stop(trainer, *args, **kwargs):
        raise _Built(trainer)

    monkeypatch.setattr(L.Trainer, "fit", stop)
    model, tok = tiny_model("gpt2")
    with pytest.raises(_Built) as built:
        F.finetune(model, tok, ROWS, tmp_path / "w", tmp_path / "m", S.plain(cfg.task.finetune), S.plain(cfg.trainer))
    return built.value.args[0]


def assert_plain(node, where="config"):
    assert type(node) in (dict, list, str, int, float, bool, type(None)), f"{where} is a {type(node).__name__}"
    for k, v in (node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()):
        assert_plain(v, f"{where}.{k}")


@pytest.mark.parametrize("option,stage", [("deepspeed_stage2", 2), ("deepspeed_stage3", 3)])
def test_deepspeed_trainer_gets_a_plain_config_deepspeed_accepts(fake_cuda, monkeypatch, tmp_path, option, stage):
    cfg = compose(f"trainer={option}")
    trainer = trainer_of_loop(monkeypatch, cfg, tmp_path)
    assert isinstance(trainer.strategy, DeepSpeedStrategy)
    conf = trainer.strategy.config
    assert type(conf) is dict
    assert_plain(conf)
    assert conf["zero_optimization"]["stage"] == stage == S.zero_stage(trainer)
    micro = conf["train_micro_batch_size_per_gpu"]
    assert isinstance(micro, int) and micro == cfg.task.finetune.batch_size
    assert trainer.precision == cfg.trainer.precision == "bf16-mixed"
    assert conf["bf16"] == {"enabled": True} and conf["fp16"] == {"enabled": False}
    assert conf["gradient_clipping"] == 1.0  # from the JSON: DeepSpeed clips, the trainer does not
    assert trainer.gradient_clip_val is None
    assert trainer.num_devices == 2


def test_deepspeed_precision_follows_a_gpu_without_bf16(fake_cuda, monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    trainer = trainer_of_loop(monkeypatch, compose("trainer=deepspeed_stage2"), tmp_path)
    conf = trainer.strategy.config
    assert trainer.precision == "16-mixed"
    assert conf["fp16"]["enabled"] is True and conf["bf16"] == {"enabled": False}


def test_deepspeed_json_that_contradicts_the_precision_names_the_file(fake_cuda, monkeypatch, tmp_path):
    bad = tmp_path / "zero2_fp16.json"
    bad.write_text(json.dumps({"zero_optimization": {"stage": 2}, "fp16": {"enabled": True},
                               "train_micro_batch_size_per_gpu": "auto"}))
    cfg = compose("trainer=deepspeed_stage2", f"trainer.strategy.config={bad}")
    with pytest.raises(ValueError, match=r"zero2_fp16\.json.*'fp16' is enabled but trainer.precision=bf16-mixed"):
        trainer_of_loop(monkeypatch, cfg, tmp_path)


def test_deepspeed_micro_batch_needs_a_number():
    with pytest.raises(ValueError, match="'auto' but this fit names no batch size"):
        S.deepspeed_config({"train_micro_batch_size_per_gpu": "auto"}, "32-true", None)
    with pytest.raises(ValueError, match="positive integer"):
        S.deepspeed_config({"train_micro_batch_size_per_gpu": "8"}, "32-true", 4)
    assert S.deepspeed_config({"train_micro_batch_size_per_gpu": 3}, "32-true", 8)["train_micro_batch_size_per_gpu"] == 3


def test_ddp_trainer_from_the_loop(fake_cuda, monkeypatch, tmp_path):
    cfg = compose("trainer=ddp")
    trainer = trainer_of_loop(monkeypatch, cfg, tmp_path)
    assert type(trainer.strategy) is DDPStrategy
    assert trainer.num_devices == 2 and trainer.strategy.root_device.type == "cuda"
    assert trainer.precision == cfg.trainer.precision == "32-true"
    assert trainer.gradient_clip_val == 1.0
    assert trainer.accumulate_grad_batches == cfg.task.finetune.accumulate_grad_batches


def test_gpu_trainer_from_the_loop(fake_cuda, monkeypatch, tmp_path):
    cfg = compose("trainer=gpu")
    trainer = trainer_of_loop(monkeypatch, cfg, tmp_path)
    assert isinstance(trainer.strategy, SingleDeviceStrategy)
    assert trainer.strategy.root_device == torch.device("cuda", 0)
    assert trainer.precision == cfg.trainer.precision == "bf16-mixed"
    assert trainer.max_epochs == cfg.task.finetune.epochs


@pytest.mark.parametrize("mode", ["single", "subprocess"])
def test_critic_trains_alike_under_every_gpu_trainer(fake_cuda, mode):
    # the critic never runs under DeepSpeed; its trainer must still clip as the DeepSpeed JSON says (on the H100 it
    # trained unclipped under trainer=deepspeed_stage2, clipped under trainer=gpu: two critics)
    from i2d2.recipes.generics import Ranks, critic_trainer

    ranks = Ranks(0, 2, mode)
    built = {o: critic_trainer(compose(f"trainer={o}"), ranks) for o in ("gpu", "deepspeed_stage2", "deepspeed_stage3")}
    for option, tc in built.items():
        assert tc["gradient_clip_val"] == 1.0, option
        assert tc["precision"] == "bf16-mixed", option
        assert "deepspeed" not in str(tc["strategy"]).lower(), option
    ds = {"_target_": "lightning.Trainer", "strategy": {"_target_": "lightning.pytorch.strategies.DeepSpeedStrategy",
                                                        "config": {"gradient_clipping": 0.5}}}
    # the clipping the LM fine-tuning gets: the JSON's, else the trainer's
    for given in (None, 2.0):
        tc = {**ds, "gradient_clip_val": given}
        lm_clip = S.deepspeed_config(tc["strategy"]["config"], "32-true", 1, given)["gradient_clipping"]
        assert S.single_device_trainer(tc)["gradient_clip_val"] == lm_clip == 0.5
    no_json_clip = {**ds, "strategy": {**ds["strategy"], "config": {}}, "gradient_clip_val": 2.0}
    assert S.single_device_trainer(no_json_clip)["gradient_clip_val"] == 2.0
    assert S.single_device_trainer({**ds, "strategy": "deepspeed_stage_2"})["strategy"] == "auto"
    trainer = S.build_trainer(built["deepspeed_stage2"] | {"accelerator": "cpu"}, logger=False)
    assert trainer.gradient_clip_val == 1.0


def test_world_size_reads_lightning_device_strings():
    assert [S.world_size_of({"accelerator": "gpu", "devices": d}) for d in ("1,", "0,1", "0, 1,", 3, [0, 2])] == [1, 2, 2, 3, 2]
    assert S.world_size_of({"devices": 2, "num_nodes": 2}) == 4
    S.check_one_process({"accelerator": "gpu", "devices": "1,"}, "negverse")  # the GPU with index 1: one process
    with pytest.raises(ValueError, match="trainer.devices: task=negverse runs in one process"):
        S.check_one_process({"accelerator": "gpu", "devices": "0,1"}, "negverse")


def test_critic_and_default_trainers_come_from_the_factory():
    trainer = S.build_trainer(None, max_epochs=2, logger=False, enable_progress_bar=False)
    assert trainer.max_epochs == 2 and trainer.num_devices == 1
    with pytest.raises(ValueError, match="needs _target_"):
        S.build_trainer({"accelerator": "cpu"})


# ----------------------------------------------------------------------------- device helper

@pytest.mark.parametrize("option,device", [("cpu", "cpu"), ("gpu", "cuda"), ("ddp", "cuda")])
def test_device_follows_trainer_accelerator_when_cuda_is_present(fake_cuda, option, device):
    assert S.resolve_device(compose(f"trainer={option}").trainer) == device


def test_device_without_cuda():
    assert not torch.cuda.is_available()
    assert S.resolve_device({"accelerator": "auto"}) == S.resolve_device(None) == "cpu"
    with pytest.raises(RuntimeError, match="trainer.accelerator=gpu but no CUDA GPU"):
        S.resolve_device({"accelerator": "gpu"})
    with pytest.raises(ValueError, match="tpu"):
        S.resolve_device({"accelerator": "tpu"})


# ----------------------------------------------------------------------------- optimizer groups

def test_adamw_groups_decay_matrices_only():
    net = torch.nn.Sequential(torch.nn.Embedding(5, 4), torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    net[0].weight.requires_grad_(False)
    groups = S.adamw_param_groups(net.parameters(), 0.1, lr=1e-3)
    decay, no_decay = groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert [p.shape for p in decay["params"]] == [torch.Size([4, 4])]  # the frozen embedding is left out
    assert {id(p) for p in no_decay["params"]} == {id(net[1].bias), id(net[2].weight), id(net[2].bias)}
    assert all(g["lr"] == 1e-3 for g in groups)
    assert S.adamw_param_groups([net[1].bias], 0.1) == [{"params": [net[1].bias], "weight_decay": 0.0}]


def test_finetune_module_uses_the_groups():
    model, _ = tiny_model("gpt2")
    module = F.SelfImitationModule(model, lr=1e-3, weight_decay=0.05, total_steps=4)
    opt = module.configure_optimizers()["optimizer"]
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.05 and all(p.ndim >= 2 for p in decay["params"])
    assert no_decay["weight_decay"] == 0.0 and all(p.ndim < 2 for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


# ----------------------------------------------------------------------------- checkpoints

def test_resume_checkpoint_kinds(fake_cuda, tmp_path):
    plain_trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False)
    ds_trainer = S.build_trainer(compose("trainer=deepspeed_stage2").trainer, micro_batch=2, logger=False)
    assert S.resume_checkpoint(tmp_path / "none.ckpt", plain_trainer) is None
    file_ckpt = tmp_path / "last.ckpt"
    torch.save({"state_dict": {}}, file_ckpt)
    assert S.resume_checkpoint(file_ckpt, plain_trainer) == str(file_ckpt)
    with pytest.raises(ValueError, match="single-file checkpoint of a non-DeepSpeed run"):
        S.resume_checkpoint(file_ckpt, ds_trainer)
    ds_ckpt = tmp_path / "ds" / "last.ckpt"
    (ds_ckpt / "checkpoint").mkdir(parents=True)
    assert S.resume_checkpoint(ds_ckpt, ds_trainer) is None  # killed while writing: no 'latest' yet
    (ds_ckpt / "latest").write_text("checkpoint")
    assert S.resume_checkpoint(ds_ckpt, ds_trainer) == str(ds_ckpt)
    with pytest.raises(ValueError, match="is a DeepSpeed checkpoint but this trainer is not DeepSpeed"):
        S.resume_checkpoint(ds_ckpt, plain_trainer)


# ----------------------------------------------------------------------------- DeepSpeed for real, on the CPU

class CPUDeepSpeed(DeepSpeedStrategy):
    """Test-only: Lightning's DeepSpeedStrategy with its CUDA-only checks skipped (DeepSpeed runs on its CPU
    accelerator, one process, gloo)."""

    def setup_environment(self):
        DDPStrategy.setup_environment(self)

    @property
    def root_device(self):
        return torch.device("cpu", 0)  # DeepSpeed wants a device index


@pytest.fixture
def cpu_deepspeed(monkeypatch):
    import lightning.pytorch.strategies.deepspeed as lightning_deepspeed

    pytest.importorskip("deepspeed")
    monkeypatch.setattr(lightning_deepspeed, "_validate_device_index_selection", lambda devices: None)
    monkeypatch.setattr(F, "check_trainer_cfg", lambda *a, **k: None)
    monkeypatch.setattr(S, "check_trainer_cfg", lambda *a, **k: None)
    with restored_process_state():  # later tests see neither DeepSpeed's groups nor its rank variables
        yield


def cpu_zero_trainer(tmp_path, stage: int) -> dict:
    from i2d2.config import conf_path

    ds = json.loads(Path(conf_path(f"deepspeed/zero{stage}.json")).read_text())
    # partition every parameter (the tiny model's tensors are all under the default persistence threshold)
    ds["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    path = tmp_path / f"zero{stage}.json"
    path.write_text(json.dumps(ds))
    return {"_target_": f"{__name__}.CPUDeepSpeed", "config": str(path)}


class Kill(L.Callback):
    def __init__(self, at_step):
        self.at_step = at_step

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step == self.at_step:
            raise RuntimeError("simulated kill")


@pytest.mark.deepspeed
@pytest.mark.parametrize("stage", [2, 3])
def test_zero_run_saves_full_weights_and_resumes_from_its_directory(cpu_deepspeed, tmp_path, stage):
    from safetensors.torch import load_file

    tc = {"_target_": "lightning.Trainer", "accelerator": "cpu", "devices": 1, "precision": "32-true",
          "strategy": cpu_zero_trainer(tmp_path, stage), "gradient_clip_val": 1.0, "enable_progress_bar": False}
    ft = dict(lr=5e-3, epochs=2, batch_size=2, max_length=32, ckpt_every_n_steps=1)
    model, tok = tiny_model("gpt2")
    F.finetune(copy.deepcopy(model), tok, ROWS, tmp_path / "a", tmp_path / "a_model", ft, tc, seed=1)
    with pytest.raises(RuntimeError, match="simulated kill"):
        F.finetune(copy.deepcopy(model), tok, ROWS, tmp_path / "b", tmp_path / "b_model", ft, tc, seed=1,
                   callbacks=[Kill(5)])
    last = tmp_path / "b" / "checkpoints" / "last.ckpt"
    assert last.is_dir() and (last / "latest").is_file()
    state = S.checkpoint_weights(last)  # what CMP and the critic reload their best checkpoint with
    assert state["model.transformer.h.0.mlp.c_fc.weight"].shape == model.transformer.h[0].mlp.c_fc.weight.shape
    summary = F.finetune(copy.deepcopy(model), tok, ROWS, tmp_path / "b", tmp_path / "b_model", ft, tc, seed=1)
    assert summary["resumed_from"] == str(last) and summary["steps"] == 8
    wa, wb = load_file(tmp_path / "a_model" / "model.safetensors"), load_file(tmp_path / "b_model" / "model.safetensors")
    ref = model.state_dict()
    for k in wa:  # full tensors (ZeRO-3 without the gather writes 0-element shards), trained, resumed exactly
        assert wa[k].shape == ref[k].shape, k
        assert torch.allclose(wa[k], wb[k], atol=1e-6), k
    assert not torch.allclose(wa["transformer.h.0.mlp.c_fc.weight"], ref["transformer.h.0.mlp.c_fc.weight"])


@pytest.mark.deepspeed
@pytest.mark.parametrize("stage", [2, 3])
def test_a_kill_between_two_deepspeed_shard_writes_resumes_from_the_last_whole_checkpoint(cpu_deepspeed, monkeypatch,
                                                                                          tmp_path, stage):
    """DeepSpeed writes the model states, then the optimizer shards, then ``latest``, over the previous files: a
    kill in between left step-5 weights beside step-4 optimizer state, every file sound, and the resume read the
    mix. Saves now go to ``last.ckpt.partial`` and are moved into place whole."""
    from deepspeed.runtime.engine import DeepSpeedEngine
    from safetensors.torch import load_file

    tc = {"_target_": "lightning.Trainer", "accelerator": "cpu", "devices": 1, "precision": "32-true",
          "strategy": cpu_zero_trainer(tmp_path, stage), "gradient_clip_val": 1.0, "enable_progress_bar": False}
    ft = dict(lr=5e-3, epochs=2, batch_size=2, max_length=32, ckpt_every_n_steps=1)
    model, tok = tiny_model("gpt2")
    F.finetune(copy.deepcopy(model), tok, ROWS, tmp_path / "a", tmp_path / "a_model", ft, tc, seed=1)

    saves = {"n": 0}
    zero_save = DeepSpeedEngine._save_zero_checkpoint

    def killed_on_the_fifth(self, *a, **k):  # the model states of this save are written; its shards are not
        saves["n"] += 1
        if saves["n"] == 5:
            raise RuntimeError("simulated kill")
        return zero_save(self, *a, **k)

    monkeypatch.setattr(DeepSpeedEngine, "_save_zero_checkpoint", killed_on_the_fifth)
    with pytest.raises(RuntimeError, match="simulated kill"):
        F.finetune(copy.deepcopy(model), tok, ROWS, tmp_path / "b", tmp_path / "b_model", ft, tc, seed=1)
    monkeypatch.setattr(DeepSpeedEngine, "_save_zero_checkpoint", zero_save)
    last = tmp_path / "b" / "checkpoints" / "last.ckpt"
    assert (last / "latest").is_file() and Path(f"{last}.partial").is_dir()  # the whole step-4 one, the torn one
    summary = F.finetune(copy.deepcopy(model), tok, ROWS, tmp_path / "b", tmp_path / "b_model", ft, tc, seed=1)
    assert summary["resumed_from"] == str(last) and summary["steps"] == 8
    wa, wb = load_file(tmp_path / "a_model" / "model.safetensors"), load_file(tmp_path / "b_model" / "model.safetensors")
    for k in wa:
        assert torch.allclose(wa[k], wb[k], atol=1e-6), k
    assert not list((tmp_path / "b" / "checkpoints").glob("*.partial"))  # the next save cleared it


def test_a_deepspeed_save_killed_between_its_renames_resumes_from_the_replaced_one(tmp_path):
    from i2d2.lightning_setup import resume_checkpoint

    class T:  # resume_checkpoint asks only whether the trainer is DeepSpeed
        strategy = object.__new__(__import__("lightning.pytorch.strategies", fromlist=["x"]).DeepSpeedStrategy)

    last = tmp_path / "last.ckpt"
    prev = Path(f"{last}.prev")
    (prev / "checkpoint").mkdir(parents=True)
    (prev / "latest").write_text("checkpoint")
    assert resume_checkpoint(last, T()) == str(prev)
    assert resume_checkpoint(tmp_path / "other.ckpt", T()) is None


def test_the_entry_point_closes_the_process_group_a_strategy_left_open(tmp_path):
    # Lightning's DDP/DeepSpeed strategies open a process group and never close it; torch then warns at exit
    # ("destroy_process_group() was not called"), as every DeepSpeed run on the H100 did. The recipe here opens
    # one and leaves it open, as they do; at exit the group must be closed.
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, "-m", "i2d2.train", "experiment=smoke", f"run_dir={tmp_path}",
                        "task.recipe=tests.entry_point_recipe.open_group"], cwd=root, capture_output=True, text=True,
                       timeout=300, env=launch_env())
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((tmp_path / "group_at_exit.json").read_text()) == {"open": False}


@pytest.mark.parametrize("limits,shown", [({"max_steps": 3, "max_epochs": -1}, "Epoch 0 (of a 3-step fit)"),
                                          ({"max_epochs": 1}, "Epoch 0/0")])
def test_progress_bar_of_a_step_limited_fit_names_its_steps(capsys, limits, shown):
    from lightning.pytorch.demos.boring_classes import BoringModel

    trainer = S.build_trainer({"_target_": "lightning.Trainer", "accelerator": "cpu", "devices": 1}, logger=False,
                              enable_checkpointing=False, enable_model_summary=False, limit_train_batches=3,
                              limit_val_batches=0, **limits)
    trainer.fit(BoringModel())
    out = capsys.readouterr().out
    assert shown in out and "/-2" not in out
    quiet = S.build_trainer(None, logger=False, enable_progress_bar=False, max_steps=3)
    assert quiet.progress_bar_callback is None
