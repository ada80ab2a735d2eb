"""End-to-end: ``python -m i2d2.train task=comparatives`` with tiny models (shared decoder, generation
stage and critic), stage counts, resume, metrics and the QA export."""

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from i2d2.config import CONF_DIR, ConfigError
from i2d2.io import read_jsonl

TINY = ["task=comparatives", "experiment=smoke", "logger=csv"]  # conf/experiment/smoke/comparatives.yaml


def _cfg(tmp_path, *extra):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("train", overrides=TINY + [f"run_dir={tmp_path}", *extra])


def test_task_config_composes_with_paper_settings():
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["task=comparatives"])
    d = cfg.decoding
    assert (d.beam_size, d.length_penalty, d.no_repeat_ngram_size, d.beta, d.sat_tolerance) == (15, 0.1, 3, 1.25, 3)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        base = compose("train")
    assert set(d) == set(base.decoding)  # same keys as conf/decoding/i2d2.yaml
    f = cfg.task.filters
    assert (f.contradiction.contradiction_threshold, f.contradiction.entailment_threshold, f.contradiction.k) == (0.99, 0.85, 5)
    assert dict(f.discriminator.cuts) == {"nc_xl": 1.0, "nc_l": 0.5, "nc_s": 0.2}
    assert cfg.data.prompt_filter.drop_fraction == 0.3 and cfg.task.recipe == "i2d2.recipes.comparatives.run"


def test_recipe_end_to_end_with_tiny_models(tmp_path):
    from i2d2.recipes.comparatives import run

    cfg = _cfg(tmp_path)
    run(cfg)
    it = Path(tmp_path) / "iter_0"
    prompts = read_jsonl(it / "prompts" / "prompts.jsonl")
    assert len(prompts) == 2 * 2 and all(p["prompt"].startswith("Compared to ") for p in prompts)
    pairs = read_jsonl(it / "prompts" / "pairs.jsonl")
    assert sum(p["kept"] for p in pairs) == round(0.7 * len(pairs) + 0.49)  # worst 30% by perplexity dropped
    stages = json.loads((it / "filtered" / "stage_counts.json").read_text())["stages"]
    counts = {s["stage"]: s for s in stages}
    order = ["generated", "candidates", "dedup", "groups", "contradiction", "discriminator"]
    assert [s["stage"] for s in stages] == order
    assert counts["generated"]["out"] == len(read_jsonl(it / "generations" / "generations.jsonl"))
    for a, b in zip(order[1:], order[2:]):
        assert counts[b]["in"] == counts[a]["out"] and counts[b]["out"] <= counts[b]["in"]
    disc = counts["discriminator"]
    assert disc["nc_xl"] == counts["contradiction"]["out"] and disc["nc_s"] <= disc["nc_l"] <= disc["nc_xl"]
    metrics = json.loads((it / "metrics.json").read_text())
    assert set(metrics["nc_xl"]) >= {"n"} and "critic" in metrics
    # per pass: its prompts and what each stage kept of them, adding up to the stage totals
    by_pass = metrics["passes"]
    assert len(by_pass) == 2 and sum(r["prompts"] for r in by_pass) == len(prompts)
    gens = read_jsonl(it / "generations" / "generations.jsonl")
    assert sum(r["generations"] for r in by_pass) == len(gens)
    assert sum(r["satisfied"] for r in by_pass) == sum(bool(g["all_satisfied"]) for g in gens)
    for s in order[1:5]:
        assert sum(r[s] for r in by_pass) == counts[s]["out"], s
    assert "## Per pass" in (it / "report.md").read_text()
    assert f"| {by_pass[0]['pass']} | {by_pass[0]['prompts']} | {by_pass[0]['generations']} |" in (
        it / "report.md").read_text()
    # each cut's precision on the critic's test split, which the report shows beside the floor and the base rate
    cuts = metrics["critic"]["cuts_test"]
    assert set(cuts) == {"nc_xl", "nc_l", "nc_s"} and cuts["nc_xl"]["n_kept"] == metrics["critic"]["n_test"]
    assert cuts["nc_xl"]["precision"] == pytest.approx(metrics["critic"]["test_valid_rate"])
    lo, hi = cuts["nc_s"]["ci95"]
    assert lo <= cuts["nc_s"]["precision"] <= hi and f"; {lo:.2f}–{hi:.2f})" in (it / "report.md").read_text()
    assert "## Discriminator" in (it / "report.md").read_text()
    assert (it / "report.md").exists() and (it / "comparative_qa.jsonl").exists()
    qa = read_jsonl(it / "comparative_qa.jsonl")
    for q in qa:
        assert q["text"].startswith("Question: Which of the following ") and q["answer"] in ("A", "B")
    # §4.3: the exported QA is scored (by the generator here) with its answer balance
    ev = metrics["comparative_qa"]
    assert ev["n"] == len(qa) and ev["balanced"] and ev["model_is_generator"] and ev["model"] == cfg.model.name
    # §4.1: the same LM on the benchmark built from the bundled labels' true comparatives
    from critics.data import load_annotations
    from i2d2.recipes.comparatives import SEED_ANNOTATIONS, critic_cfg

    bench = metrics["comparative_qa_benchmark"]
    n_true = sum(r["y"] for r in load_annotations([SEED_ANNOTATIONS], critic_cfg(cfg)["label_map"]))
    assert bench["n"] == n_true == len(read_jsonl(it / "qa_benchmark" / "items.jsonl")) > 200
    assert bench["balanced"] and bench["labels"] == [SEED_ANNOTATIONS.name]
    assert f"accuracy **{bench['accuracy']:.3f}**" in (it / "report.md").read_text()
    assert len(read_jsonl(it / "qa_eval" / "predictions.jsonl")) == len(qa)
    assert "(the generator, on QA from its own output): accuracy" in (it / "report.md").read_text() or not qa
    # per-stage counts also in the tracker's CSV metrics
    logged = "".join(p.read_text() for p in Path(tmp_path).rglob("metrics.csv"))
    assert "filter/dedup/in" in logged and "filter/contradiction/out" in logged
    # the discriminator logs its wall time like the other filter stages
    assert "filter/discriminator/seconds" in logged and counts["discriminator"]["seconds"] >= 0
    # W&B off: each stage's table is in its folder, among its _DONE outputs; the report's beside report.md; none at
    # the top of run_dir (outside any stage's record)
    assert not list(Path(tmp_path).glob("*.csv"))
    tables = {"prompts": "prompts_pairs.csv", "generations": "generation_samples.csv",
              "critic": "critic_test_scores.csv"}
    for stage, table in tables.items():
        assert table in json.loads((it / stage / "_DONE.json").read_text())["outputs"], stage
    assert {f"comparatives_{t}.csv" for t in ("stage_counts", "passes", "samples")} <= {p.name for p in it.glob("*.csv")}
    # a stage finished before its table moved into its folder (none recorded there) is still reused
    done = json.loads((it / "prompts" / "_DONE.json").read_text())
    (it / "prompts" / "prompts_pairs.csv").unlink()
    del done["outputs"]["prompts_pairs.csv"]
    (it / "prompts" / "_DONE.json").write_text(json.dumps(done))

    # a second run finds every stage finished and redoes none of them
    def stage_files():
        return {p: p.stat().st_mtime_ns for d in ("prompts", "generations", "filtered", "critic")
                for p in (it / d).rglob("*.jsonl")}
    before = stage_files()
    assert len(before) >= 8
    run(cfg)
    assert stage_files() == before
    # ... and keeps what the stages took when they ran next to its own near-zero seconds
    again = json.loads((it / "metrics.json").read_text())
    assert again["earlier_timings_s"] == [metrics["timings_s"]]
    assert again["timings_s"]["generation"] <= metrics["timings_s"]["generation"]


def test_a_filter_stage_logs_its_wall_time_under_its_own_name(tmp_path):
    # the stages' seconds reached no logger once the report stopped logging comparatives/counts/<stage>/* (each
    # stage logs its counts as filter/<stage>/*), only the invocation's comparatives/timings_s/<stage>
    from i2d2.io import write_jsonl
    from i2d2.recipes.comparatives import _filter_stage

    class Tracker:
        def __init__(self):
            self.logged = {}

        def log_metrics(self, metrics, step=None):
            self.logged.update(metrics)

    write_jsonl(tmp_path / "in.jsonl", [{"text": "Cats are smaller than dogs."}, {"text": "x"}])
    tracker = Tracker()
    summary = _filter_stage("groups", tmp_path / "in.jsonl", tmp_path / "groups", {}, lambda df: df.head(1), tracker)
    assert tracker.logged == {"filter/groups/in": 2, "filter/groups/out": 1,
                              "filter/groups/seconds": summary["seconds"]}


def test_pass_counts_counts_each_pass_and_names_a_bad_line(tmp_path):
    from i2d2.io import DataError, write_jsonl
    from i2d2.recipes.comparatives import pass_counts

    write_jsonl(tmp_path / "p.jsonl", [{"pass": 0}, {"pass": 0}, {"pass": 1}])
    write_jsonl(tmp_path / "g.jsonl", [{"pass": 0, "all_satisfied": True}, {"pass": 1, "all_satisfied": False},
                                       {"pass": 1, "all_satisfied": True}])
    write_jsonl(tmp_path / "d.jsonl", [{"pass": 1}])
    rows = pass_counts(tmp_path / "p.jsonl", tmp_path / "g.jsonl", {"dedup": tmp_path / "d.jsonl"},
                       [("have", "typically"), ("need", "often")])
    assert rows == [{"pass": "have typically", "prompts": 2, "generations": 1, "satisfied": 1, "dedup": 0},
                    {"pass": "need often", "prompts": 1, "generations": 2, "satisfied": 1, "dedup": 1}]
    (tmp_path / "d.jsonl").write_text('{"pass": 1}\n{"text": "no pass"}\n')
    with pytest.raises(DataError, match=r"d\.jsonl:2: missing field\(s\) pass"):
        pass_counts(tmp_path / "p.jsonl", tmp_path / "g.jsonl", {"dedup": tmp_path / "d.jsonl"},
                    [("have", "typically"), ("need", "often")])


def test_one_discriminator_labels_file_given_as_a_string_is_one_path(tmp_path):
    # task.filters.discriminator.annotations=labels.jsonl (not [labels.jsonl]) was iterated one character a path:
    # "task.filters.discriminator.annotations: t not found" for a file that exists
    from i2d2.recipes.comparatives import annotation_paths

    labels = tmp_path / "labels.jsonl"
    labels.write_text("")
    assert annotation_paths(_cfg(tmp_path / "run", f"task.filters.discriminator.annotations={labels}")) == [labels]
    assert annotation_paths(_cfg(tmp_path / "run", f"task.filters.discriminator.annotations=[{labels}]")) == [labels]
    with pytest.raises(FileNotFoundError, match=r"annotations: .*nope\.jsonl not found"):
        annotation_paths(_cfg(tmp_path / "run", f"task.filters.discriminator.annotations={tmp_path / 'nope.jsonl'}"))


def test_a_labels_file_the_benchmark_cannot_read_fails_at_start_naming_its_line(tmp_path):
    from i2d2.io import DataError
    from i2d2.recipes.comparatives import check_config

    labels = tmp_path / "labels.jsonl"
    labels.write_text(json.dumps({"statement": "Compared to rakes, shears are generally sharper.", "label": "True",
                                  "concept": "rake | shear"}) + "\n")  # no prompt: its entities cannot be split
    cfg = _cfg(tmp_path / "run", f"task.filters.discriminator.annotations=[{labels}]")
    with pytest.raises(DataError, match=r"labels\.jsonl:1: a ComparativeQA benchmark item needs its prompt"):
        check_config(cfg)
    # without the benchmark the file is the discriminator's business: one row is too few to train it on
    with pytest.raises(ConfigError, match=r"^task\.filters\.discriminator\.annotations: only 1 usable"):
        check_config(_cfg(tmp_path / "run", f"task.filters.discriminator.annotations=[{labels}]",
                          "task.qa.benchmark=false"))
    with pytest.raises(ConfigError, match=r"^task\.qa\.benchmark: must be true or false, got 'maybe'"):
        check_config(_cfg(tmp_path / "run", "task.qa.benchmark=maybe"))
