"""An earlier stage's model or adapter, damaged after its stage finished (a truncated copy, a full disk), is refused
naming the damaged file before anything loads it; transformers' own error named no file."""

import pytest

from i2d2.io import DataError, mark_done


def _finished_iteration(run_dir, k=0):
    """iter_k/model as the fine-tuning stage leaves it: the files, recorded in iter_k/finetune/_DONE.json."""
    from i2d2.models import tiny_model

    model, tok = tiny_model("gpt2")
    model_dir = run_dir / f"iter_{k}" / "model"
    model.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    (run_dir / f"iter_{k}" / "finetune").mkdir(parents=True)
    mark_done(run_dir / f"iter_{k}" / "finetune", "fp", {}, outside=[model_dir])
    return model_dir


def _finished_adapter(tmp_path, base_model="nonexistent"):
    """train/adapter as the NegVerse train stage leaves it: its files, recorded in train/_DONE.json."""
    adapter = tmp_path / "train" / "adapter"
    adapter.mkdir(parents=True)
    (adapter / "negverse.json").write_text(f'{{"base_model": "{base_model}"}}')
    (adapter / "adapter_model.safetensors").write_bytes(b"0" * 1000)
    mark_done(tmp_path / "train", "fp", {})
    return adapter


def _truncate(path):
    path.write_bytes(path.read_bytes()[:100])


def test_verify_recorded_names_the_damaged_file(tmp_path):
    from i2d2.io import verify_recorded

    model_dir = _finished_iteration(tmp_path)
    assert verify_recorded(model_dir, model_dir.parent / "finetune") is True
    assert verify_recorded(tmp_path / "elsewhere", tmp_path / "elsewhere") is False  # no marker: a folder put by hand
    _truncate(model_dir / "model.safetensors")
    with pytest.raises(DataError, match=r"iter_0/model/model\.safetensors is damaged \(100 bytes, \d+ recorded"):
        verify_recorded(model_dir, model_dir.parent / "finetune")


def test_next_iteration_refuses_a_damaged_model_at_start_up(tmp_path):
    from hydra import compose, initialize_config_dir

    from i2d2.config import CONF_DIR
    from i2d2.recipes.generics import MissingIterationError, generator_name

    model_dir = _finished_iteration(tmp_path)
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["model=tiny_gpt2", f"run_dir={tmp_path}", "iteration=1"])
    assert generator_name(cfg, 1) == str(model_dir)
    _truncate(model_dir / "model.safetensors")
    with pytest.raises(MissingIterationError, match=r"iteration 0's model: .*model\.safetensors is damaged.*"
                                                    r"iteration=0` again"):
        generator_name(cfg, 1)


def test_generate_refuses_a_damaged_iteration_model(tmp_path):
    from omegaconf import OmegaConf

    from i2d2.generate import GenerateError, resolve_model

    model_dir = _finished_iteration(tmp_path)
    cfg = OmegaConf.create({"run_dir": str(tmp_path), "model": {"name": "tiny:gpt2"},
                            "generate": {"model": None, "iteration": -1}})
    assert resolve_model(cfg) == (str(model_dir), 0)
    (model_dir / "config.json").write_text((model_dir / "config.json").read_text() + " ")
    with pytest.raises(GenerateError, match=r"generate\.iteration=0: .*config\.json is damaged"):
        resolve_model(cfg)


def test_loading_a_damaged_folder_names_it(tmp_path):
    from i2d2.models import load_causal_lm

    model_dir = _finished_iteration(tmp_path)
    _truncate(model_dir / "model.safetensors")
    with pytest.raises(DataError, match=rf"cannot load the causal LM in {model_dir}"):
        load_causal_lm(str(model_dir))


def test_a_damaged_negverse_adapter_is_refused_before_the_base_model_loads(tmp_path):
    from i2d2.negverse.model import NegVerseLM

    adapter = _finished_adapter(tmp_path)
    _truncate(adapter / "adapter_model.safetensors")
    with pytest.raises(DataError, match=r"train/adapter/adapter_model\.safetensors is damaged"):
        NegVerseLM.load(adapter)


def test_a_weights_file_linked_to_a_blob_is_still_checked(tmp_path):
    # the files were filtered by their resolved path: a model.safetensors that is a link (HF-cache layout, dedup'd
    # storage) resolved outside the folder and was never checked, though stage_done refused it
    import shutil

    from i2d2.io import verify_recorded

    model_dir = _finished_iteration(tmp_path)
    blob = tmp_path / "blob.safetensors"
    shutil.move(model_dir / "model.safetensors", blob)
    (model_dir / "model.safetensors").symlink_to(blob)
    mark_done(tmp_path / "iter_0" / "finetune", "fp", {}, outside=[model_dir])
    assert verify_recorded(model_dir, model_dir.parent / "finetune")
    _truncate(blob)
    with pytest.raises(DataError, match=r"model\.safetensors is damaged"):
        verify_recorded(model_dir, model_dir.parent / "finetune")


@pytest.mark.parametrize("marker", ["[]", '{"outputs": {"../model/config.json": {}}}', "{"])
def test_a_malformed_marker_is_a_data_error_not_a_traceback(tmp_path, marker):
    from i2d2.io import verify_recorded

    model_dir = _finished_iteration(tmp_path)
    done = model_dir.parent / "finetune" / "_DONE.json"
    done.write_text(marker)
    with pytest.raises(DataError, match=r"_DONE\.json is damaged") as e:
        verify_recorded(model_dir, model_dir.parent / "finetune")
    assert f"delete {done} to load {model_dir} unchecked" in str(e.value)  # the way out, as for a replaced model
    done.unlink()
    assert not verify_recorded(model_dir, model_dir.parent / "finetune")


def test_a_link_to_a_run_model_is_checked_where_it_points(tmp_path):
    # generate.model=latest with latest -> run/iter_0/model: the link's own parent has no finetune marker, so the
    # folder was loaded unchecked
    from i2d2.io import verify_model_folder

    model_dir = _finished_iteration(tmp_path / "run")
    link = tmp_path / "latest"
    link.symlink_to(model_dir, target_is_directory=True)
    assert verify_model_folder(link)
    _truncate(model_dir / "model.safetensors")
    with pytest.raises(DataError, match=r"iter_0/model/model\.safetensors is damaged"):
        verify_model_folder(link)


def test_start_up_hashes_the_previous_model_once_per_process(tmp_path, monkeypatch):
    # check_config (run by i2d2.train and again by run()), generator_name and the LoRA check each hashed it
    import i2d2.io as io
    from i2d2.io import verify_recorded

    model_dir = _finished_iteration(tmp_path)
    calls = []
    real = io.file_digest
    monkeypatch.setattr(io, "file_digest", lambda p: calls.append(p) or real(p))
    for _ in range(3):
        assert verify_recorded(model_dir, model_dir.parent / "finetune")
    n = len(calls)
    assert n == len(list(p for p in model_dir.iterdir() if p.is_file()))
    _truncate(model_dir / "model.safetensors")  # changed since: checked again
    with pytest.raises(DataError):
        verify_recorded(model_dir, model_dir.parent / "finetune")


def test_one_helper_finds_and_verifies_an_iteration_model(tmp_path, monkeypatch):
    # the path of iteration k's model and its check against iter_k/finetune/_DONE.json were written out twice, in
    # generics.generator_name and generate.resolve_model; both now ask i2d2.io.verified_iteration_model
    import i2d2.io as io
    import i2d2.recipes.generics as generics
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from i2d2.config import CONF_DIR
    from i2d2.generate import resolve_model
    from i2d2.io import verified_iteration_model

    assert verified_iteration_model(tmp_path, 0) is None  # no model there: the caller says what to run
    model_dir = _finished_iteration(tmp_path)
    assert verified_iteration_model(tmp_path, 0) == model_dir
    calls = []
    real = io.verified_iteration_model
    spy = lambda run_dir, k: calls.append(k) or real(run_dir, k)  # noqa: E731
    monkeypatch.setattr(io, "verified_iteration_model", spy)
    monkeypatch.setattr(generics, "verified_iteration_model", spy)
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["model=tiny_gpt2", f"run_dir={tmp_path}", "iteration=1"])
    assert generics.generator_name(cfg, 1) == str(model_dir)
    gcfg = OmegaConf.create({"run_dir": str(tmp_path), "model": {"name": "tiny:gpt2"},
                             "generate": {"model": None, "iteration": 0}})
    assert resolve_model(gcfg) == (str(model_dir), 0)
    assert calls == [0, 0]
    _truncate(model_dir / "model.safetensors")
    with pytest.raises(DataError, match=r"iter_0/model/model\.safetensors is damaged"):
        real(tmp_path, 0)


@pytest.mark.parametrize("key", ["generate.model", "model.name"])
def test_generate_checks_a_run_model_given_as_a_folder(tmp_path, key):
    # generate.model=<run>/iter_0/model (or model.name=... with no generate.iteration) loaded the folder unchecked:
    # a truncated safetensors was transformers' error, naming no file. A folder with no marker loads as before.
    import shutil

    from omegaconf import OmegaConf

    from i2d2.generate import GenerateError, resolve_model

    model_dir = _finished_iteration(tmp_path / "run")
    by_hand = tmp_path / "mine"
    shutil.copytree(model_dir, by_hand)

    def cfg(folder):
        gen = {"model": str(folder) if key == "generate.model" else None, "iteration": None}
        name = str(folder) if key == "model.name" else "tiny:gpt2"
        return OmegaConf.create({"run_dir": str(tmp_path / "other"), "model": {"name": name}, "generate": gen})

    assert resolve_model(cfg(model_dir)) == (str(model_dir), None)
    _truncate(model_dir / "model.safetensors")
    _truncate(by_hand / "model.safetensors")
    with pytest.raises(GenerateError, match=rf"{key}=.*iter_0/model: .*iter_0/model/model\.safetensors is damaged"):
        resolve_model(cfg(model_dir))
    assert resolve_model(cfg(by_hand)) == (str(by_hand), None)  # no finetune/_DONE.json beside it: unchecked


def test_a_model_replaced_on_purpose_gets_advice_naming_the_marker(tmp_path):
    # a model replaced by hand in place under its old finetune marker was refused as "damaged", with only the advice
    # to rerun the previous iteration (which fine-tunes over the replacement). Still refused; the message now also
    # says that deleting the marker (named) loads the folder unchecked, and that the marker is all that checks it.
    import json

    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from i2d2.config import CONF_DIR
    from i2d2.generate import GenerateError, resolve_model
    from i2d2.recipes.generics import MissingIterationError, generator_name

    model_dir = _finished_iteration(tmp_path)
    marker = tmp_path / "iter_0" / "finetune" / "_DONE.json"
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "n_layer": 1}))  # another model, same place
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["model=tiny_gpt2", f"run_dir={tmp_path}", "iteration=1"])
    with pytest.raises(MissingIterationError) as e:
        generator_name(cfg, 1)
    msg = str(e.value)
    assert "config.json is damaged" in msg and "iteration=0` again" in msg
    assert f"replaced {model_dir} on purpose, delete {marker} and run iteration=1 again" in msg
    assert "rerunning iteration 0 would redo its fine-tuning" in msg
    gcfg = OmegaConf.create({"run_dir": str(tmp_path), "model": {"name": "tiny:gpt2"},
                             "generate": {"model": None, "iteration": 0}})
    with pytest.raises(GenerateError, match=rf"on purpose, delete {marker} to load it unchecked"):
        resolve_model(gcfg)
    marker.unlink()
    assert generator_name(cfg, 1) == str(model_dir)  # the marker was all that made it checked
    assert resolve_model(gcfg) == (str(model_dir), 0)


def test_a_replaced_negverse_adapter_gets_the_same_advice(tmp_path):
    from i2d2.io import DamagedOutputError
    from i2d2.negverse.model import NegVerseLM

    adapter = _finished_adapter(tmp_path)
    (adapter / "adapter_model.safetensors").write_bytes(b"1" * 1000)
    marker = tmp_path / "train" / "_DONE.json"
    with pytest.raises(DamagedOutputError, match=rf"If {adapter} was replaced on purpose, delete {marker} to load it"):
        NegVerseLM.load(adapter)


def _damage_bin(d):  # the weights as a truncated pytorch_model.bin (torch.load's zip reader fails)
    import torch

    from i2d2.models import tiny_model

    (d / "model.safetensors").unlink()
    torch.save(tiny_model("gpt2")[0].state_dict(), d / "pytorch_model.bin")
    _truncate(d / "pytorch_model.bin")


def _set_json(name, **changes):
    def damage(d):
        import json

        (d / name).write_text(json.dumps({**json.loads((d / name).read_text()), **changes}))
    return damage


@pytest.mark.parametrize("damage", [
    lambda d: _truncate(d / "model.safetensors"),                             # SafetensorError
    lambda d: (d / "model.safetensors").write_bytes(b"x" * 5000),            # SafetensorError
    lambda d: (d / "config.json").write_text("{\"model_type\": "),           # OSError (not valid JSON)
    lambda d: (d / "config.json").write_text("{\"n_embd\": 8}"),             # ValueError (no model_type)
    _set_json("config.json", vocab_size="abc"),                               # StrictDataclassFieldValidationError
    _set_json("config.json", n_embd=128),                                     # RuntimeError: ignore_mismatched_sizes
    lambda d: (d / "tokenizer.json").write_text("{}"),                       # KeyError 'added_tokens'
    lambda d: (d / "tokenizer_config.json").write_text("{"),                 # JSONDecodeError
    lambda d: (d / "tokenizer_config.json").write_text("[]"),                # AttributeError
    _damage_bin,                                                              # RuntimeError: PytorchStreamReader
], ids=["truncated-safetensors", "garbage-safetensors", "truncated-config", "config-no-model-type",
        "config-bad-value", "config-other-shapes", "tokenizer-json-shape", "tokenizer-config-truncated",
        "tokenizer-config-shape", "truncated-bin"])
def test_unreadable_model_files_are_a_data_error(tmp_path, damage):
    from i2d2.models import load_causal_lm

    model_dir = _finished_iteration(tmp_path)
    damage(model_dir)
    with pytest.raises(DataError, match=rf"cannot load the causal LM in {model_dir}"):
        load_causal_lm(str(model_dir))


@pytest.mark.parametrize("error", [
    lambda: __import__("torch").OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    lambda: RuntimeError("CUDA error: an illegal memory access was encountered"),
    lambda: MemoryError()], ids=["oom", "cuda", "memory"])
def test_out_of_memory_or_a_device_error_while_loading_is_not_cannot_load(tmp_path, monkeypatch, error):
    # the loader caught every Exception from a local folder and called it "cannot load the causal LM in <folder>":
    # running out of GPU memory read as damaged files. Only errors about the files are wrapped now.
    import transformers

    from i2d2.models import load_causal_lm

    model_dir = _finished_iteration(tmp_path)
    raised = error()

    def fail(*a, **k):
        raise raised

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fail)
    with pytest.raises(type(raised)) as e:
        load_causal_lm(str(model_dir))
    assert e.value is raised


# ----------------------------------------------------------------------------- the commands

def _files(root):
    """Every file under a run folder with its bytes, but Hydra's per-command log folder and the run_dir lock file
    (what any launch writes, failed or not)."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.relative_to(root).parts[0] != "hydra" and p.name != ".i2d2.lock"}


def test_train_next_iteration_on_a_damaged_model_exits_2_naming_the_file(tmp_path):
    # python -m i2d2.train iteration=1 on a run whose iter_0/model/model.safetensors was truncated: one `error:` line
    # naming the file, exit 2, at start-up; the run folder is left as it was (no iter_1, iter_0 untouched)
    import subprocess
    import sys
    from pathlib import Path

    from process_env import launch_env

    run = tmp_path / "run"
    model_dir = _finished_iteration(run)
    _truncate(model_dir / "model.safetensors")
    before = _files(run)
    r = subprocess.run([sys.executable, "-m", "i2d2.train", "iteration=1", f"run_dir={run}", "model=tiny_gpt2",
                        "critic=tiny", "logger=none"], capture_output=True, text=True, timeout=120, env=launch_env(),
                       cwd=Path(__file__).resolve().parent.parent)
    assert r.returncode == 2, r.stderr[-3000:]
    assert f"error: iteration=1 starts from iteration 0's model: {model_dir}/model.safetensors is damaged" in r.stderr
    assert "Traceback" not in r.stderr
    assert _files(run) == before


def test_negate_with_a_damaged_adapter_exits_2_naming_the_file(tmp_path, capsys):
    from i2d2.negate import main

    adapter = _finished_adapter(tmp_path, "tiny:gpt2")
    _truncate(adapter / "adapter_model.safetensors")
    assert main(["The shop is open.", "--adapter", str(adapter)]) == 2
    err = capsys.readouterr().err
    assert f"error: {adapter}/adapter_model.safetensors is damaged (100 bytes, 1000 recorded" in err
    assert f"delete {tmp_path / 'train' / '_DONE.json'}" in err


@pytest.mark.parametrize("task", ["i2d2", "comparatives"])
def test_another_runs_model_as_the_base_lm_is_checked(tmp_path, task):
    # model.name=<other run>/iter_0/model for iteration=0 was loaded unchecked (a truncated safetensors failed in
    # transformers, naming no file); now checked at start-up against that run's fine-tuning record, naming model.name
    from hydra import compose, initialize_config_dir

    from i2d2.config import CONF_DIR, ConfigError
    from i2d2.train import check_start

    model_dir = _finished_iteration(tmp_path / "other")
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=[f"task={task}", f"model.name={model_dir}", f"run_dir={tmp_path / 'run'}",
                                          "iteration=0"])
    check_start(cfg)
    _truncate(model_dir / "model.safetensors")
    with pytest.raises(ConfigError, match=rf"model\.name: {model_dir}/model\.safetensors is damaged"):
        check_start(cfg)
