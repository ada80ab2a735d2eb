"""Tracking: the resolved config reaches every logger (a W&B offline run folder holds the decoding and task keys),
several loggers at once, fits' hyper-parameters namespaced, progress lines in the logs."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir

from i2d2.config import CONF_DIR, setup_run
from i2d2.tracking import Tracker, build_logger, flat_config


def _cfg(run_dir, *overrides):
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=[f"run_dir={run_dir}", *overrides])
    setup_run(cfg)
    return cfg


def _wandb_records(path: Path):
    """The protobuf records of a W&B transaction log (``run-<id>.wandb``): a 7-byte header (``:W&B``, magic,
    version) then LevelDB-log blocks of 32 KiB whose records carry crc32 (4), length (2, LE), type (1)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, block, pos, pending = path.read_bytes(), 32768, 7, b""
    assert data[:4] == b":W&B", path
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # block trailer padding
            pos += left
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 0 and length == 0:
            continue
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):  # FULL or LAST: a whole record
            rec = pb.Record()
            rec.ParseFromString(pending)
            yield rec


def _offline_config(run_dir: Path, wait_s: float = 60.0) -> dict:
    """The config W&B recorded in the (single) offline run folder under run_dir: ``{key: value}`` (the run's
    config record, then every config update, as ``wandb sync`` would upload them). W&B's service process writes
    the log after ``wandb.finish()`` returns, so on a busy machine the file is read again (up to ``wait_s``) until
    it ends with the run's exit record; a missing file or a half-written record reads as "not yet" (the suite once
    read the log before its config records were there)."""
    from google.protobuf.message import DecodeError

    runs = sorted(Path(run_dir).glob("wandb/offline-run-*"))
    assert len(runs) == 1, runs
    deadline = time.monotonic() + wait_s
    while True:
        config: dict = {}
        exited = False
        try:
            for rec in _wandb_records(next(runs[0].glob("run-*.wandb"))):
                exited |= rec.HasField("exit")
                items = (rec.run.config.update if rec.HasField("run") else rec.config.update
                         if rec.HasField("config") else [])
                for item in items:
                    config[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
        except (StopIteration, AssertionError, DecodeError):  # no log yet, no header yet, a record cut short
            pass
        if exited or time.monotonic() > deadline:
            return config
        time.sleep(0.5)


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")


def test_config_reaches_every_logger(tmp_path):
    cfg = _cfg(tmp_path, "logger=wandb_csv", "critic=minilm", "decoding.beam_size=7", "task.max_prompts=11",
               "task.filter.delta=0.25")
    logger = build_logger(cfg.logger, config=cfg)
    assert [type(lg).__name__ for lg in logger] == ["WandbLogger", "CSVLogger"]  # several loggers at once
    tracker = Tracker(logger, tmp_path / "report")
    tracker.log_metrics({"filter/n_kept": 3})
    logger[1].save()
    tracker.finish()
    got = _offline_config(tmp_path)
    assert got["decoding/beam_size"] == 7 and got["task/max_prompts"] == 11 and got["task/filter/delta"] == 0.25
    assert got["critic/target_precision"] == 0.9 and got["model/name"] == str(cfg.model.name)
    assert got["task/finetune/lr"] == cfg.task.finetune.lr
    hparams = yaml.safe_load(next(tmp_path.glob("logs/version_*/hparams.yaml")).read_text())
    assert hparams["decoding/beam_size"] == 7 and hparams["task/max_prompts"] == 11


def test_logger_config_shapes(tmp_path):
    assert build_logger(None) is None
    cfg = _cfg(tmp_path, "logger=csv")
    assert type(build_logger(cfg.logger)).__name__ == "CSVLogger"  # one logger: itself, not a list
    both = build_logger([dict(cfg.logger), dict(cfg.logger, name="logs2")])
    assert len(both) == 2
    with pytest.raises(ValueError, match=r"logger\[0\].*_target_"):
        build_logger([{"save_dir": str(tmp_path)}])
    flat = flat_config(cfg)
    assert "hydra" not in {k.split("/")[0] for k in flat} and flat["decoding/beam_size"] == cfg.decoding.beam_size


def test_artifacts_are_opt_in(tmp_path):
    cfg = _cfg(tmp_path, "logger=wandb")
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "x.arrow").write_text("x")
    tracker = Tracker(build_logger(cfg.logger))
    assert not tracker.log_artifact("kept-iter0", tmp_path / "kept", "dataset")  # off by default
    tracker.finish()
    cfg = _cfg(tmp_path / "b", "logger=wandb", "logger.log_artifacts=true")
    tracker = Tracker(build_logger(cfg.logger))
    assert tracker.log_artifact("kept-iter0", tmp_path / "kept", "dataset")
    tracker.finish()


@pytest.mark.integration
def test_iteration_logs_config_namespaced_hparams_and_progress(tmp_path, caplog):
    from i2d2.recipes.generics import run

    caplog.set_level(logging.INFO, logger="i2d2.lightning_setup")
    cfg = _cfg(tmp_path, "experiment=smoke", "logger=wandb_csv", "decoding.beam_size=3", "trainer.log_every_n_steps=1")
    assert cfg.logger.wandb._target_.endswith("WandbLogger")  # the command line beats the preset's logger=none
    run(cfg)
    got = _offline_config(tmp_path)
    assert got["decoding/beam_size"] == 3 and got["task/max_prompts"] == cfg.task.max_prompts
    assert got["model/name"] == str(cfg.model.name)
    # the fits' hparams under their own names: the fine-tuning's lr no longer overwrites the critic's
    assert "lr" not in got and got["critic/lr"] == cfg.critic.lr
    fits = {k.split("/")[1] for k in got if k.startswith("fit/") and k.endswith("/lr")}
    assert "critic" in fits and len(fits) == 2, fits
    finetune = next(f for f in fits if f != "critic")
    assert got[f"fit/{finetune}/lr"] == cfg.task.finetune.lr != got["fit/critic/lr"]
    lines = [r.getMessage() for r in caplog.records if r.name == "i2d2.lightning_setup"]
    assert any(m.startswith("critic: epoch") for m in lines) and any(" step " in m for m in lines)
    _assert_logged_once_and_tables_by_stage(tmp_path, "i2d2")  # this smoke run serves the names test too
    # the report leaves out what a stage logged, by the stage's name: each such name is one the stages logged
    from i2d2.recipes.generics_report import LOGGED_BY_STAGE

    report = json.loads((tmp_path / "iter_0" / "report" / "metrics.json").read_text())
    missing = {v for k, v in LOGGED_BY_STAGE.items() if report.get(k) is not None} - _logged_names(tmp_path)[0]
    assert not missing, missing


@pytest.mark.parametrize("task", ["cmp", "negverse", "comparatives"])
def test_every_recipe_opens_the_same_tracker(tmp_path, task):
    """The recipe skeleton (i2d2.tracking.tracked_run): each task's resolved config reaches its loggers, and the
    tracker is closed after an error; publish_report writes report.json / report.md and logs the numbers."""
    from i2d2.tracking import publish_report, tracked_run

    cfg = _cfg(tmp_path, f"task={task}", "logger=csv")
    with pytest.raises(RuntimeError, match="boom"):
        with tracked_run(cfg, tmp_path / "out") as tracker:
            publish_report(tmp_path / "out", {"n": 3, "nested": {"p": 0.5, "name": "x"}, "flag": True}, "# r\n",
                           tracker, prefix=task)
            tracker.logger.save()
            raise RuntimeError("boom")
    hparams = yaml.safe_load(next(tmp_path.glob("logs/version_*/hparams.yaml")).read_text())
    assert hparams["task/name"] == task and hparams["run_dir"] == str(tmp_path)
    metrics = (next(tmp_path.glob("logs/version_*/metrics.csv"))).read_text()
    assert f"{task}/n" in metrics and f"{task}/nested/p" in metrics and "flag" not in metrics
    assert json.loads((tmp_path / "out" / "report.json").read_text())["n"] == 3
    assert (tmp_path / "out" / "report.md").read_text() == "# r\n"


def test_a_report_names_the_split_of_the_parts_measured_on_one(tmp_path):
    """CMP logged its zero-shot QA (test split) as cmp/zero_shot/<model>/f1: publish_report's ``splits`` names it."""
    from i2d2.tracking import publish_report

    class Recorder:
        metrics = {}

        def log_metrics(self, metrics, step=None):
            self.metrics.update(metrics)

    summary = {"zero_shot": {"base": {"f1": 0.5, "by_t": {"f1": 0.25}}}, "zero_shot_n": 3,
               "downstream": {"u_k0": {"metrics": {"f1": 0.75}, "n_eval": 4}}}
    publish_report(tmp_path, summary, "# r\n", Recorder(), prefix="cmp",
                   splits={"zero_shot": "test", "downstream/*/metrics": "test"})
    assert Recorder.metrics == {"cmp/zero_shot/base/test_f1": 0.5, "cmp/zero_shot/base/by_t/test_f1": 0.25,
                                "cmp/zero_shot_n": 3, "cmp/downstream/u_k0/metrics/test_f1": 0.75,
                                "cmp/downstream/u_k0/n_eval": 4}
    assert json.loads((tmp_path / "report.json").read_text()) == summary  # the record keeps its keys


def test_metrics_logged_after_the_last_fit_reach_the_csv_when_the_run_finishes(tmp_path):
    # Lightning's CSV logger buffers rows until a fit saves them; a recipe's evaluation and report numbers come after
    cfg = _cfg(tmp_path / "run", "logger=csv")
    tracker = Tracker(build_logger(cfg.logger, config=cfg), tmp_path)
    tracker.log_metrics({"negverse/eval/keep_rate": 0.25}, step=0)
    tracker.finish()
    csv_files = list((tmp_path / "run").rglob("metrics.csv"))
    assert len(csv_files) == 1 and "negverse/eval/keep_rate" in csv_files[0].read_text().splitlines()[0]


def _logged_names(run_dir: Path, wait_s: float = 60.0) -> tuple[set[str], set[str]]:
    """(scalar metric names, table and media names) of the W&B offline run(s) under run_dir, read once each log ends
    with its exit record (W&B's service writes it after ``wandb.finish()`` returns)."""
    from google.protobuf.message import DecodeError

    deadline = time.monotonic() + wait_s
    while True:
        keys, exited = set(), []
        for log_path in sorted(Path(run_dir).glob("wandb/offline-run-*/run-*.wandb")):
            done = False
            try:
                for rec in _wandb_records(log_path):
                    done |= rec.HasField("exit")
                    keys |= {item.key or "/".join(item.nested_key)
                             for item in (rec.history.item if rec.HasField("history") else [])}
            except (AssertionError, DecodeError):
                pass
            exited.append(done)
        if (exited and all(exited)) or time.monotonic() > deadline:
            # a table or an image is recorded as its fields: <name>/_type, <name>/path, ...
            media = {k.rsplit("/", 1)[0] for k in keys if k.endswith("/_type")}
            metrics = {k for k in keys if not k.startswith("_") and not any(k.startswith(f"{m}/") for m in media)}
            return metrics, media
        time.sleep(0.5)


# one quantity that a recipe logged under two names: (the name it keeps, the second name it no longer logs)
ALIASES = {
    "i2d2": [("filter/kept_fraction", "filter/keep_rate"), ("filter/kept_fraction", "report/kept_fraction"),
             ("filter/n_kept", "report/n_kept"), ("filter/delta", "report/delta"),
             ("generation/n_prompts", "report/n_prompts"), ("generation/n_generations", "report/n_generations"),
             ("generation/constraint_satisfaction_rate", "report/constraint_satisfaction_rate"),
             ("generation/prompts_per_s", "report/prompts_per_s"), ("critic/test_ap", "report/critic_ap"),
             ("critic/test_surface_ap", "report/critic_surface_ap"), ("critic/probe_shift", "report/critic_probe_shift"),
             ("heldout/n_generations", "report/heldout_n_generations"),
             ("report/heldout_self_bleu", "heldout/self_bleu")],
    "comparatives": [("filter/dedup/out", "comparatives/counts/dedup/out"), ("critic/test_ap", "comparatives/critic/ap"),
                     ("filter/dedup/seconds", "comparatives/counts/dedup/seconds"),
                     ("filter/contradiction/seconds", "comparatives/counts/contradiction/seconds"),
                     ("filter/discriminator/seconds", "comparatives/counts/discriminator/seconds"),
                     ("critic/test_precision_nc_l", "comparatives/critic/cuts_test/nc_l/precision"),
                     ("qa/accuracy", "comparatives/comparative_qa/accuracy"),
                     ("qa_benchmark/accuracy", "comparatives/comparative_qa_benchmark/accuracy"),
                     ("comparatives/nc_xl/n", "nc_xl/n")],
    "cmp": [("cmp/pretrain/final/val/loss", "cmp/pretrain_final/val/loss"),
            ("cmp/zero_shot/base/test_f1", "cmp/zero_shot_base/f1"),
            ("cmp/zero_shot/constant/test_f1", "cmp/zero_shot_constant/f1"),
            ("cmp/downstream/hotpotqa_pretrained_k0/metrics/test_f1", "cmp/downstream/hotpotqa_pretrained_k0/f1")],
    "negverse": [("negverse/train/val_loss", "val/loss")],
}
# tables: <stage>/<what>, the stage named as its metrics name it
TABLES = {
    "i2d2": {"prompts/samples", "generation/samples", "critic/test_scores", "report/samples", "report/iterations",
             "report/prompt_forms"},
    "comparatives": {"prompts/pairs", "generation/samples", "critic/test_scores", "comparatives/stage_counts",
                     "comparatives/passes", "comparatives/samples"},
    "cmp": {"cmp/zero_shot/base/samples", "cmp/zero_shot/pretrained/samples"},
    "negverse": {"negverse/eval/negations"},
}


@pytest.mark.integration
@pytest.mark.parametrize("task", ["comparatives", "cmp", "negverse"])  # i2d2: in the test of its logged config
def test_a_recipe_logs_each_quantity_under_one_name_and_tables_by_stage(tmp_path, task):
    import importlib

    cfg = _cfg(tmp_path, f"task={task}", "experiment=smoke", "logger=wandb")
    importlib.import_module(f"i2d2.recipes.{task}").run(cfg)
    _assert_logged_once_and_tables_by_stage(tmp_path, task)


# numbers measured on labelled rows: {the name they had before they named their split: the name they have now,
# <stage>/<split>_<what>} (critic/ap and critic/dev_ap side by side read as one split for another)
SPLIT_PREFIXES = ("train_", "dev_", "test_", "probe_", "heldout_")
_CRITIC = {"critic/ap": "critic/test_ap", "critic/p_at_r": "critic/test_p_at_r",
           "critic/surface_ap": "critic/test_surface_ap", "critic/surface_auc_test": "critic/test_surface_auc",
           "critic/surface_auc_train": "critic/train_surface_auc"}
LABELLED = {
    "i2d2": {**_CRITIC, "critic/precision": "critic/test_precision", "critic/recall": "critic/test_recall",
             "critic/n_kept_test": "critic/test_n_kept",
             "critic/recall_cut_precision": "critic/test_recall_cut_precision",
             "report/critic_precision": "report/test_critic_precision",
             "report/critic_recall": "report/test_critic_recall",
             "report/critic_n_kept_test": "report/test_critic_n_kept"},
    "comparatives": _CRITIC,
    "cmp": {f"{stage}/{name}": f"{stage}/test_{name}" for stage, name in (
        ("cmp/zero_shot/base", "f1"), ("cmp/zero_shot/pretrained", "em"), ("cmp/zero_shot/constant", "f1"),
        ("cmp/zero_shot/base/both_value", "f1"), ("cmp/downstream/hotpotqa_pretrained_k0/metrics", "f1"),
        ("cmp/downstream/diffen_pretrained_k2/metrics", "rougeL"))},
    "negverse": {},
}


# the critic's numbers that no split measures: split sizes, settings, timings
UNSPLIT = {"delta", "target_recall", "fit_seconds", "n_train", "n_train_fit", "n_dev", "n_test", "n_test_concepts",
           "n_unfinished_left_out"}


def _assert_labelled_metrics_name_their_split(metrics: set[str], task: str) -> None:
    for old, new in LABELLED[task].items():
        assert old not in metrics and new in metrics, (old, new)
    # and whatever else the critic logs
    unnamed = {m for m in metrics if m.startswith("critic/") and m.count("/") == 1
               and m.split("/")[1] not in UNSPLIT and not m.split("/")[1].startswith(SPLIT_PREFIXES)}
    assert not unnamed, unnamed
    if task == "comparatives":  # its cuts keep fractions: the cut at δ, never applied, is not logged as if it were
        assert not {"critic/delta", "critic/test_precision", "critic/test_recall", "critic/dev_precision"} & metrics


def _assert_logged_once_and_tables_by_stage(run_dir: Path, task: str) -> None:
    metrics, media = _logged_names(run_dir)
    _assert_labelled_metrics_name_their_split(metrics, task)
    for kept, alias in ALIASES[task]:
        assert kept in metrics and alias not in metrics, (kept, alias)
    images = {"critic/pr_curve", "critic/score_histogram", "critic_val/pr_curve", "critic_val/score_histogram",
              "report/pr_curves_all_iterations"}
    assert media - images == TABLES[task]
    for table in TABLES[task]:  # the stage prefix is one its metrics use
        assert any(m.startswith(table.rsplit("/", 1)[0] + "/") for m in metrics), table
