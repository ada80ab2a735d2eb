"""The wheel is the product: build it, install it into a fresh virtual environment and run the console scripts from a
directory outside the checkout, so nothing can come from the source tree (the configs under conf/ included)."""

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

pytestmark = pytest.mark.package

REPO = Path(__file__).resolve().parents[1]
# what the wheel is built from: the checkout without tests, scripts, runs, virtual environments or build leftovers
NOT_SHIPPED = shutil.ignore_patterns(".*", "tests", "scripts", "runs", "build", "dist", "*.egg-info", "__pycache__",
                                     "outputs", "wandb", "lightning_logs", "venv")
SMALL_LABELS = REPO / "tests" / "fixtures" / "generics_seed_handwritten.jsonl"  # a quick critic for the smoke run


def _run(cmd, **kw):
    out = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600, **kw)
    assert out.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{out.stdout[-3000:]}\n{out.stderr[-5000:]}"
    return out


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """A fresh venv holding only the i2d2 wheel; the dependencies (torch, ...) come from the test venv's
    site-packages through a path entry, which (unlike a site dir) does not run its .pth files, so the editable
    install of the checkout stays invisible."""
    tmp = tmp_path_factory.mktemp("wheel")
    shutil.copytree(REPO, tmp / "src", ignore=NOT_SHIPPED)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    _run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", tmp / "dist", tmp / "src"])
    wheel = next((tmp / "dist").glob("i2d2-*.whl"))
    _run([sys.executable, "-m", "venv", "--without-pip", tmp / "venv"])
    py = tmp / "venv" / "bin" / "python"
    site = Path(_run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    deps = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (site / "_test_deps.pth").write_text("".join(f"{d}\n" for d in deps))
    _run([*pip, "--python", py, "install", "--no-deps", "--no-index", wheel])
    return tmp / "venv" / "bin"


def _env(bin_dir):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", WANDB_MODE="offline", HF_HUB_OFFLINE="1")
    return env


def test_wheel_holds_configs_data_and_console_scripts(venv):
    for script in ("i2d2-train", "i2d2-generate", "i2d2-negate", "i2d2-annotate"):
        assert (venv / script).exists(), script
    out = _run([venv / "python", "-c", "import i2d2.config as c, i2d2.comparatives.wordlists as w, i2d2.negverse.cues as n;"
                "print(c.CONF_DIR); print(w.DEFAULT_PATH.is_file(), n.DEFAULT_LEXICON.is_file())"],
               cwd=venv.parent, env=_env(venv)).stdout.split()
    conf = Path(out[0])
    assert conf.is_relative_to(venv.parent) and conf.name == "_conf", conf  # the wheel's copy, not the checkout
    assert out[1:] == ["True", "True"]
    for f in ("train.yaml", "experiment/smoke.yaml", "deepspeed/zero2.json", "negverse/affixal_pairs.tsv"):
        assert (conf / f).is_file(), f
    assert (conf.parent / "data" / "annotations" / "generics_gemma.jsonl").is_file()
    _run([venv / "i2d2-negate", "--help"], cwd=venv.parent, env=_env(venv))
    _run([venv / "i2d2-annotate", "--help"], cwd=venv.parent, env=_env(venv))


def test_train_from_outside_the_checkout(venv, tmp_path):
    env = _env(venv)
    job = _run([venv / "i2d2-train", "--cfg", "job", "iteration=2"], cwd=tmp_path, env=env).stdout
    assert "iteration: 2" in job and "recipe: i2d2.recipes.generics.run" in job
    assert str(REPO) not in job  # every path the config resolves comes from the installed package
    _run([venv / "i2d2-train", "experiment=smoke", "run_dir=run", f"critic.seed_annotations=[{SMALL_LABELS}]"],
         cwd=tmp_path, env=env)
    it = tmp_path / "run" / "iter_0"
    assert (it / "model" / "model.safetensors").is_file() and (it / "report.md").is_file()
