"""CMP evaluation protocol: entity splits, k-shot refusal, smoke labels, dev selection, seeds and the lr grid,
the separator and case handling of the default model."""

import pytest
import torch

from i2d2.cmp.data import Quintuple, load_quintuples, split_leaks, split_quintuples
from i2d2.cmp.evaluation import selection_metric, task_scores
from i2d2.recipes.cmp_runners import dev_and_pool, run_downstream, shot_count
from i2d2.cmp.tasks import resolve_separator, tokenizer_lowercases, untrained_parts
from i2d2.models import load_seq2seq

FIXTURES = "i2d2/data/cmp/fixtures"


def _entities(qs):
    return {e for q in qs for e in (q.e1, q.e2)}


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_entity_split_shares_no_entity_document_or_fact(seed):
    qs = load_quintuples()
    splits = split_quintuples(qs, 0.2, 0.2, seed)
    train = splits["train"]
    for held in ("validation", "test"):
        assert splits[held]
        assert not _entities(splits[held]) & _entities(train)
        assert not {d for q in splits[held] for d in (q.doc1, q.doc2)} & {d for q in train for d in (q.doc1, q.doc2)}
        facts = [{(q.e1, q.property, q.v1) for q in qs} | {(q.e2, q.property, q.v2) for q in qs}
                 for qs in (splits[held], train)]
        assert not facts[0] & facts[1]
    assert split_leaks(splits) == {s: {"entity": [], "document": [], "fact": []} for s in ("validation", "test")}
    assert sum(len(v) for v in splits.values()) == len(qs)  # every quintuple is in a split or dropped
    # every category holds unseen test entities
    assert {q.category for q in splits["test"]} == {q.category for q in qs}


def test_split_follows_fractions_and_seed_and_ignores_split_fields():
    qs = load_quintuples()
    a, b = split_quintuples(qs, 0.2, 0.2, 0), split_quintuples(qs, 0.2, 0.2, 1)
    assert _entities(a["test"]) != _entities(b["test"])
    bigger = split_quintuples(qs, 0.25, 0.25, 0)
    assert len(bigger["test"]) > len(a["test"]) and len(bigger["train"]) < len(a["train"])
    fixed = [Quintuple(**{**q.__dict__, "split": "train"}) for q in qs]  # fields that would leak everything
    assert [q.id for q in split_quintuples(fixed, 0.2, 0.2, 0)["test"]] == [q.id for q in a["test"]]
    with pytest.raises(ValueError, match="val_fraction"):
        split_quintuples(qs, 1.2, 0.1)


def test_shared_document_or_fact_drops_the_held_out_quintuple():
    def q(i, e1, e2, d1, d2, v1="a", v2="b"):
        return Quintuple(e1, e2, "p", v1, v2, d1, d2, id=f"q{i}", category="c")

    # 'Big Apple' and 'New York' are one city under two names: same document
    rows = [q(i, f"E{i}", f"E{i + 1}", f"E{i} is a.", f"E{i + 1} is b.") for i in range(0, 40, 2)]
    rows.append(q(99, "Big Apple", "E0b", "E0 is a.", "E0b is b."))
    for seed in range(20):
        splits = split_quintuples(rows, 0.3, 0.3, seed)
        assert split_leaks(splits)["test"]["document"] == [] and split_leaks(splits)["validation"]["document"] == []
        if "E0 is a." in {x.doc1 for x in splits["train"]}:
            assert rows[-1] not in splits["test"] + splits["validation"]


def test_split_by_field_keeps_rows_and_reports_leaks():
    qs = load_quintuples()[:30]
    marked = [Quintuple(**{**q.__dict__, "split": "test" if i % 3 == 0 else "train"}) for i, q in enumerate(qs)]
    splits = split_quintuples(marked, by="field")
    assert len(splits["test"]) == 10 and not splits["dropped"]
    assert split_leaks(splits)["test"]["entity"]  # the released-style split shares entities: reported
    with pytest.raises(ValueError, match="no 'split' field"):
        split_quintuples(qs, by="field")


def _fixture(name="hotpotqa", fmt="hotpotqa", task="qa", train="hotpotqa_train.json", ev="hotpotqa_dev.json"):
    from pathlib import Path

    return {"name": name, "format": fmt, "task": task, "eval_path": Path(FIXTURES) / ev,
            "train_path": Path(FIXTURES) / train}


def test_k_shot_with_too_few_training_items_refuses_unless_asked():
    dev, pool, where = dev_and_pool(_fixture(), "qa", dev_size=1)
    assert len(dev) == 1 and len(pool) == 2 and "held out of" in where
    assert not {x.id for x in dev} & {x.id for x in pool}
    with pytest.raises(ValueError, match=r"k=100 shots asked but its training pool holds only 2.*allow_fewer_shots"):
        shot_count(100, len(pool), "hotpotqa")
    assert shot_count(100, len(pool), "hotpotqa", allow_fewer=True) == 2
    assert shot_count("full", len(pool), "hotpotqa") == 2 and shot_count(1, len(pool), "hotpotqa") == 1
    with pytest.raises(ValueError, match="dev_size=100"):
        dev_and_pool(_fixture(), "qa", dev_size=100)
    protocol = {"seeds": [0], "lr_grid": [1e-4], "finetune": {"steps": 1, "batch_size": 2, "dev_size": 1}}

    def never_loaded():
        raise AssertionError("the refusal comes before any model is loaded")

    with pytest.raises(ValueError, match="k=100"):
        run_downstream(never_loaded, _fixture(), 100, {}, protocol)


def test_recipe_refuses_k_shot_before_pretraining(tmp_path):
    from hydra import compose, initialize_config_dir

    from i2d2.config import CONF_DIR
    from i2d2.recipes.cmp import check_downstream_settings, downstream_dataset

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["task=cmp", "task.downstream.shots=[0,100]",
                                          "task.downstream.finetune.dev_size=1", f"run_dir={tmp_path}"])
    with pytest.raises(ValueError, match="hotpotqa: k=100 shots asked"):
        check_downstream_settings(cfg)
    assert downstream_dataset(cfg, "hotpotqa")["smoke"] is True
    cfg.data.downstream.hotpotqa.eval_path = str(tmp_path / "dev.json")
    cfg.data.downstream.hotpotqa.train_path = str(tmp_path / "train.json")
    assert downstream_dataset(cfg, "hotpotqa")["smoke"] is False


def _run(dataset, model, k, smoke, metrics, std=None, **kw):
    return {"dataset": dataset, "eval_file": f"/x/{dataset}_dev.json", "n_eval": 1487, "model": model, "k": k,
            "metrics": metrics, "std": std, "n_seeds": 3 if std else 1, "smoke": smoke, **kw}


def test_report_keeps_smoke_fixtures_out_of_the_headline_table():
    from i2d2.recipes.cmp import _report

    real = _run("hotpotqa", "pretrained", "100", False, {"em": 30.0, "f1": 41.5, "n": 1487},
                {"em": 1.0, "f1": 2.25}, lr=3e-5, dev_by_lr={"1e-05": 1, "3e-05": 2, "0.0001": 1}, k_used=100,
                n_dev=100)
    smoke = _run("diffen", "base", "0", True, {"rouge2": 1.0, "rougeL": 9.0, "n": 3})
    text = _report({"downstream": {"hotpotqa_pretrained_k100": real, "diffen_base_k0": smoke},
                    "pretrain": {"untrained_at_start": ["bert.encoder.layer.*.crossattention"],
                                 "tokenizer_lowercases": True, "separator": "[DOC]"},
                    "model": "packaged:minilm"})
    head, smoke_part = text.split("## Smoke checks on bundled fixtures (not results)")
    assert "hotpotqa (hotpotqa_dev.json, 1487) | pretrained | 100-shot (100 train, dev 100) | em 30.00 ± 1.00, " \
           "f1 41.50 ± 2.25 | 3 | 3e-05" in head
    assert "diffen" not in head and "diffen (diffen_dev.json, 1487) | base | zero-shot" in smoke_part
    assert "crossattention are randomly initialised" in head and "bleu_uncased" in head


def test_report_flags_a_model_that_does_not_beat_the_constant_answer():
    from i2d2.recipes.cmp import _report

    zs = {"base": {"em": 0.0, "f1": 0.0, "n": 405, "n_distinct_predictions": 300, "top_prediction": "the " * 30,
                   "top_prediction_share": 0.02},
          "pretrained": {"em": 25.68, "f1": 25.68, "n": 405, "n_distinct_predictions": 1, "top_prediction": "no",
                         "top_prediction_share": 1.0},
          "constant": {"em": 25.68, "f1": 25.68, "n": 405, "answer": "no"}}
    text = _report({"zero_shot": zs})
    assert "Warning: pretrained does not beat always answering 'no'** (F1 25.68 against 25.68); it answers 'no' " \
           "to 100.0% of the questions" in text and "Warning: base does not beat always answering 'no'** (F1 0.00 " \
           "against 25.68)." in text  # a 2 % answer is not named
    assert "| pretrained | 25.68 | 25.68 | 405 | 1 ('no', 100.0%) |" in text and "| 300 ('the the the the" in text
    assert "the…', 2.0%) |" in text and "| constant ('no') | 25.68 | 25.68 | 405 | – |" in text
    zs["pretrained"].update(f1=40.0, n_distinct_predictions=30, top_prediction_share=0.3)
    assert "Warning: pretrained" not in _report({"zero_shot": zs})
    # above the constant by a little, but one answer nearly always; a '|' in an answer stays inside its cell
    zs["pretrained"].update(f1=25.70, top_prediction="a|b", top_prediction_share=404 / 405)
    text = _report({"zero_shot": zs})
    assert "Warning: pretrained nearly always gives one answer**: it answers 'a\\|b' to 99.8% of the questions" in text


def test_bleu_is_labelled_uncased_for_case_folding_tokenizers():
    preds, refs = ["which city is larger, paris or rome?"], [["Which city is larger, Paris or Rome?"]]
    cased, uncased = task_scores("qg", preds, refs), task_scores("qg", preds, refs, lowercase=True)
    assert set(cased) == {"bleu", "rougeL", "n"} and set(uncased) == {"bleu_uncased", "rougeL", "n"}
    assert uncased["bleu_uncased"] == pytest.approx(100.0) and cased["bleu"] < 50
    assert selection_metric("qg", True) == "bleu_uncased" and selection_metric("qa") == "f1"
    assert selection_metric("sum") == "rougeL"


def test_dev_selection_restores_the_best_checkpoint():
    import lightning as L

    from i2d2.recipes.cmp_runners import downstream_examples
    from i2d2.cmp.downstream import load_downstream
    from i2d2.cmp.tasks import Collator, eos_id
    from trainers.cmp import CMPModule, DevSelection, ExampleSteps, train_loader

    torch.manual_seed(0)
    model, tok = load_seq2seq("tiny:t5")
    exs = downstream_examples(load_downstream(f"{FIXTURES}/hotpotqa_train.json", "hotpotqa", "qa"))
    weights, scores = {}, iter([0.0, 1.0, 5.0, 2.0])

    def score(m):  # made-up dev scores; remember the weights each was given for
        value = next(scores)
        weights[value] = m.lm_head.weight.detach().clone()
        return value

    sel = DevSelection(score, every=2)
    module = CMPModule(model, tok, Collator(tok, eos_id(model, tok), 128, 16), lr=1e-2, warmup_ratio=0.0,
                       total_steps=6, tasks=["qa"], callbacks=[sel])
    trainer = L.Trainer(max_steps=6, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, train_loader(module, ExampleSteps(exs, 2, 6)))
    assert [s for s, _ in sel.history] == [0, 2, 4, 6] and sel.best_step == 4 and sel.best == 5.0
    assert torch.equal(model.lm_head.weight, weights[5.0]) and not torch.equal(weights[5.0], weights[2.0])


def test_k_shot_runs_every_seed_and_learning_rate_and_reports_mean_std():
    protocol = {"seeds": [0, 1], "lr_grid": [1e-3, 1e-4], "allow_fewer_shots": False,
                "finetune": {"steps": 2, "batch_size": 2, "max_target_length": 8, "eval_every": 1, "dev_size": 1}}

    def loader():
        model, tok = load_seq2seq("tiny:bart")
        return model, tok, resolve_separator(model, tok)

    res = run_downstream(loader, _fixture(), 2, {"_target_": "lightning.Trainer", "accelerator": "cpu",
                                                 "enable_progress_bar": False}, protocol, max_source_length=128,
                         progress=False)
    assert len(res["runs"]) == 4 and {(r["lr"], r["seed"]) for r in res["runs"]} == {(a, b) for a in (1e-3, 1e-4)
                                                                                     for b in (0, 1)}
    assert res["lr"] in (1e-3, 1e-4) and res["n_seeds"] == 2 and res["k_used"] == 2 and res["n_dev"] == 1
    assert set(res["std"]) == {"em", "f1"} and res["selection_metric"] == "f1" and res["n_eval"] == 4
    chosen = [r["metrics"]["f1"] for r in res["runs"] if r["lr"] == res["lr"]]
    assert res["metrics"]["f1"] == pytest.approx(sum(chosen) / 2)
    best = max(res["dev_by_lr"].values())
    assert res["dev_by_lr"][str(res["lr"])] == best


def test_separator_is_never_eos():
    model, tok = load_seq2seq("tiny:bart")
    assert resolve_separator(model, tok) == "[SEP]"  # plain text to BART: Table 2's separator
    assert untrained_parts(model) == [] and not tokenizer_lowercases(tok)


@pytest.mark.slow
def test_minilm_gets_a_dedicated_separator_and_reports_untrained_cross_attention():
    from i2d2.cmp.tasks import Collator, eos_id

    model, tok = load_seq2seq("packaged:minilm")
    eos = eos_id(model, tok)
    with pytest.raises(ValueError, match="end-of-sequence"):
        resolve_separator(model, tok, "[SEP]")
    sep = resolve_separator(model, tok)
    assert sep == "[DOC]" and eos not in tok(sep, add_special_tokens=False)["input_ids"]
    labels = Collator(tok, eos)(["x"], [f"doc one {sep} doc two"])["labels"][0].tolist()
    assert labels.count(eos) == 1 and labels[-1] == eos  # EOS only at the end of the infilling target
    assert model.encoder.get_input_embeddings().num_embeddings == len(tok)
    assert tokenizer_lowercases(tok)
    assert any("crossattention" in p for p in untrained_parts(model))


def test_seed_aggregate_mean_and_std(tmp_path):
    import json

    from i2d2.cmp.aggregate import markdown, zero_shot_table
    from i2d2.io import DataError

    dirs = []
    for seed, em in enumerate([10.0, 20.0, 30.0]):
        d = tmp_path / f"s{seed}"
        d.mkdir()
        split = {"by": "entity", "train": 850, "validation": 81, "test": 81, "dropped": 1671,
                 "entities": {"train": 90, "validation": 30, "test": 30}}
        (d / "report.json").write_text(json.dumps({"seed": seed, "splits": split, "zero_shot": {
            "pretrained": {"em": em, "f1": em + 5, "n": 405}, "constant": {"em": 4.0, "f1": 4.0, "n": 405,
                                                                           "answer": "no"}}}))
        dirs.append(d)
    from i2d2.cmp.aggregate import load_reports

    table = zero_shot_table(load_reports(dirs))
    assert table["pretrained"]["em"] == (20.0, 10.0, 3) and table["constant"]["f1"] == (4.0, 0.0, 3)
    assert "| pretrained | 20.00 ± 10.00 | 25.00 ± 10.00 | 3 |" in markdown(load_reports(dirs))
    with pytest.raises(DataError, match="no CMP report"):
        load_reports([tmp_path / "missing"])
    # one run has no spread (not 0.00); the same run twice, two runs of one seed, or another task's run: refused
    assert zero_shot_table(load_reports(dirs[:1]))["pretrained"]["em"] == (10.0, None, 1)
    assert "| pretrained | 10.00 ± – | 15.00 ± – | 1 |" in markdown(load_reports(dirs[:1]))
    with pytest.raises(DataError, match="given twice"):
        load_reports([dirs[0], dirs[1], dirs[0]])
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "report.json").write_text(json.dumps({"seed": 1, "kept": 3}))
    with pytest.raises(DataError, match="not a CMP run's report"):
        load_reports([dirs[0], tmp_path / "other"])
    (tmp_path / "again").mkdir()
    (tmp_path / "again" / "report.json").write_text((dirs[1] / "report.json").read_text())
    with pytest.raises(DataError, match="same seed"):
        load_reports([dirs[1], tmp_path / "again"])


def test_seed_aggregate_command_refuses_bad_runs_with_one_line(tmp_path, capsys):
    """``python -m i2d2.cmp.aggregate`` (the README's command) on a run without a report or two runs of one seed
    printed a DataError traceback; it now prints one ``error:`` line and exits 2, as the other CLIs."""
    import json

    from i2d2.cmp.aggregate import main

    assert main([str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "no CMP report" in err
    d = tmp_path / "s0"
    d.mkdir()
    (d / "report.json").write_text(json.dumps({"seed": 0, "splits": {"train": 1, "test": 1, "entities": {"test": 1}},
                                               "zero_shot": {"pretrained": {"em": 1.0, "f1": 2.0, "n": 3}}}))
    (tmp_path / "again").mkdir()
    (tmp_path / "again" / "report.json").write_text((d / "report.json").read_text())
    capsys.readouterr()
    assert main([str(d), str(tmp_path / "again")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "same seed" in err and "Traceback" not in err
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "report.json").write_text("{")
    capsys.readouterr()
    assert main([str(tmp_path / "broken")]) == 2
    assert f"error: {tmp_path / 'broken' / 'report.json'}: " in capsys.readouterr().err  # names the file
    assert main([str(d)]) == 0 and "| pretrained | 1.00 ± – | 2.00 ± – | 1 |" in capsys.readouterr().out
