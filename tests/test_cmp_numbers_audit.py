"""Audit of the numbers the CMP recipe reports: a per-template score carries its count, the pre-training validation
loss is labelled as the number that picked the checkpoint (with its example counts), the zero-shot table is called
'on unseen entities' only where the test split shares nothing with training and says when the pre-trained model was
trained on this very task, and a downstream setting whose checkpoint / learning-rate selection or fine-tuning would
read evaluation items is refused."""

import json
from pathlib import Path

import pytest

from i2d2.cmp.data import load_quintuples, split_quintuples

FIXTURES = Path("i2d2/data/cmp/fixtures")
PROTOCOL = {"seeds": [0], "lr_grid": [1e-4], "finetune": {"steps": 1, "batch_size": 2, "dev_size": 1}}


def _never_loaded():
    raise AssertionError("the refusal comes before any model is loaded")


def _splits(seed=1234):
    return split_quintuples(load_quintuples(), 0.2, 0.2, seed)


# ---------------------------------------------------------------- zero-shot synthetic QA: counts per template

def test_per_template_scores_carry_their_counts(monkeypatch):
    import i2d2.recipes.cmp_runners as runners
    from i2d2.cmp.tasks import ExampleBuilder

    test = _splits()["test"][:12]
    monkeypatch.setattr(runners, "generate", lambda model, tok, sources, *a, **k: ["no"] * len(sources))
    metrics, rows = runners.evaluate_synthetic_qa(None, None, test, ExampleBuilder({}, "<mask>"), progress=False)
    templates = {r["template"] for r in rows}
    assert len(templates) >= 5  # both branches of Table 1 occur
    for t in templates:  # an EM / F1 per template had no count beside it (metrics.json, the tracker)
        assert metrics[f"{t}/n"] == sum(r["template"] == t for r in rows)
    assert sum(metrics[f"{t}/n"] for t in templates) == metrics["n"] == len(rows) == 5 * len(test)


# ---------------------------------------------------------------- pre-training: the selection split is named

def test_validation_batches_count_their_examples():
    from i2d2.cmp.tasks import ExampleBuilder
    from trainers.cmp import TaskBatches

    val = _splits()["validation"][:10]
    summaries = {q.id: "s" for q in val}
    ds = TaskBatches(val, ExampleBuilder(summaries, "<mask>"), ["qa", "sum", "ti"], 4, max_per_task=7)
    assert ds.counts() == {"qa": 7, "sum": 7, "ti": 7}
    assert TaskBatches(val, ExampleBuilder(summaries, "<mask>"), ["qa", "sum"], 4).counts() == {"qa": 50, "sum": 10}


def test_report_says_the_validation_loss_picked_the_checkpoint():
    from i2d2.recipes.cmp import _report

    pre = {"initial": {"val/loss_qa": 5.0, "val/loss": 9.0}, "final": {"val/loss_qa": 1.0, "val/loss": 3.0},
           "steps": 160, "val_examples": {"qa": 32}}
    text = _report({"pretrain": pre})
    assert "the split that picked the checkpoint" in text and "not a held-out estimate" in text
    assert "validation examples per task: qa 32." in text
    del pre["val_examples"]  # a run from before the counts were kept still reports
    assert "the split that picked the checkpoint" in _report({"pretrain": pre})


def test_pretrain_summary_counts_the_validation_examples(tmp_path):
    from test_cmp_negverse_audit import _cmp_cfg, _cmp_inputs  # tests/ is on sys.path (pytest prepend mode)

    from i2d2.recipes.cmp import pretrain

    cfg = _cmp_cfg(tmp_path, "task.pretrain.max_steps=1", "task.pretrain.val_every=1")
    splits, summaries = _cmp_inputs(cfg)
    out = pretrain(cfg, splits, summaries, tmp_path / "pretrain", None)
    assert out["val_examples"] == {"qa": 4, "qag": 4, "sum": 4, "ti": 4}  # val_max_per_task=4
    assert json.loads((tmp_path / "pretrain" / "metrics.json").read_text())["val_examples"] == out["val_examples"]


# ---------------------------------------------------------------- what the zero-shot table is called

def _zs():
    return {"pretrained": {"em": 30.0, "f1": 35.0, "n": 405, "n_distinct_predictions": 40, "top_prediction": "no",
                           "top_prediction_share": 0.3},
            "constant": {"em": 25.68, "f1": 25.68, "n": 405, "answer": "no"}}


def _split_info(shared: int, by="field"):
    zero = {"entity": 0, "document": 0, "fact": 0}
    return {"by": by, "train": 20, "validation": 5, "test": 10, "dropped": 0,
            "entities": {"train": 12, "validation": 4, "test": 6},
            "shared_with_train": {"validation": zero, "test": {**zero, "entity": shared}}}


def test_zero_shot_table_is_on_unseen_entities_only_when_nothing_is_shared(tmp_path):
    from i2d2.cmp.aggregate import load_reports, markdown
    from i2d2.recipes.cmp import _report

    leaky = _report({"zero_shot": _zs(), "splits": _split_info(5), "seed": 0})
    assert "unseen entities" not in leaky and "## Zero-shot synthetic comparative QA on the test split" in leaky
    assert "entities, documents and facts shared with training: 5" in leaky
    clean = _report({"zero_shot": _zs(), "splits": _split_info(0, by="entity"), "seed": 0})
    assert "## Zero-shot synthetic comparative QA on unseen entities" in clean
    for name, shared in (("a", 5), ("b", 0)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "report.json").write_text(json.dumps({"seed": shared, "splits": _split_info(shared),
                                                                 "zero_shot": _zs()}))
    text = markdown(load_reports([tmp_path / "a", tmp_path / "b"]))
    assert "unseen" not in text and "shared with training: [5, 0]" in text


def test_zero_shot_table_says_when_qa_was_a_pretraining_task():
    from i2d2.recipes.cmp import _report

    text = _report({"zero_shot": _zs(), "tasks": ["qa", "qag", "sum", "ti"]})
    assert "zero-shot only in its entities" in text
    assert "zero-shot only in its entities" not in _report({"zero_shot": _zs(), "tasks": ["sum", "ti"]})


# ---------------------------------------------------------------- downstream: selection never reads eval rows

def _fixture(**kw):
    return {"name": "hotpotqa", "format": "hotpotqa", "task": "qa", "eval_path": FIXTURES / "hotpotqa_dev.json",
            "train_path": FIXTURES / "hotpotqa_train.json", **kw}


def test_dev_set_holding_evaluation_items_is_refused():
    # dev_path = the evaluation file: checkpoint and learning rate were picked on the rows they were reported on
    with pytest.raises(ValueError, match=r"dev .* 4 of the 4 evaluation items"):
        run_downstream_(_fixture(dev_path=FIXTURES / "hotpotqa_dev.json"), 1)


def test_training_pool_holding_evaluation_items_is_refused(tmp_path):
    rows = json.loads((FIXTURES / "hotpotqa_train.json").read_text())
    rows.append(json.loads((FIXTURES / "hotpotqa_dev.json").read_text())[2])
    train = tmp_path / "train.json"
    train.write_text(json.dumps(rows))
    with pytest.raises(ValueError, match=r"train_path .* 1 of the 4 evaluation items"):
        run_downstream_(_fixture(train_path=train), 1)


def test_disjoint_fixtures_pass_the_check():
    from i2d2.recipes.cmp_runners import check_eval_disjoint, dev_and_pool
    from i2d2.cmp.downstream import load_downstream

    for name, fmt, task, ev, tr in (("hotpotqa", "hotpotqa", "qa", "hotpotqa_dev.json", "hotpotqa_train.json"),
                                    ("2wikiqg", "2wiki", "qg", "2wiki_dev.json", "2wiki_train.json"),
                                    ("diffen", "diffen", "sum", "diffen_dev.jsonl", "diffen_train.jsonl")):
        ds = {"name": name, "format": fmt, "task": task, "eval_path": FIXTURES / ev, "train_path": FIXTURES / tr}
        dev, pool, _ = dev_and_pool(ds, task, 1)
        check_eval_disjoint(ds, load_downstream(ds["eval_path"], fmt, task), dev, pool)  # no error


def test_recipe_refuses_a_dev_path_on_evaluation_items_before_pretraining(tmp_path):
    from hydra import compose, initialize_config_dir

    from i2d2.config import CONF_DIR
    from i2d2.recipes.cmp import check_downstream_settings

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["task=cmp", "task.downstream.shots=[0,1]",
                                          "task.downstream.datasets=[hotpotqa]",
                                          "+data.downstream.hotpotqa.dev_path=bundled:fixtures/hotpotqa_dev.json",
                                          f"run_dir={tmp_path}"])
    with pytest.raises(ValueError, match="hotpotqa: the dev items"):
        check_downstream_settings(cfg)
    cfg.task.downstream.shots = [0]  # zero-shot reads no dev set: nothing to refuse
    check_downstream_settings(cfg)


def run_downstream_(ds, k):
    from i2d2.recipes.cmp_runners import run_downstream

    return run_downstream(_never_loaded, ds, k, {}, PROTOCOL)


def test_readme_count_of_held_out_names_inside_training_documents():
    # the README's "no test entity in a training quintuple" holds; their names can still occur in training documents
    import re

    splits = _splits(1234)
    test = sorted({e for q in splits["test"] for e in (q.e1, q.e2)})
    train_quints = {e for q in splits["train"] for e in (q.e1, q.e2)}
    text = " ".join(d for q in splits["train"] for d in (q.doc1, q.doc2)).lower()
    named = [e for e in test if re.search(r"(?<!\w)" + re.escape(e.lower()) + r"(?!\w)", text)]
    assert len(test) == 33 and not set(test) & train_quints
    assert named == ["Amazon", "Seine", "flute"]
