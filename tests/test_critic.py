"""Critic: annotation reading, grouped split, δ selection, filter, tiny critic training + scoring."""

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from critics.data import (ANNOTATION_DIR, LoadReport, aggregate_votes, grouped_split, load_annotations,
                          normalize_label)
from critics.metrics import (average_precision, choose_delta, cut_at_recall, precision_at_recall, precision_at_top,
                             precision_recall_at)
from i2d2.filtering import filter_and_write, threshold_filter
from i2d2.io import DataError, read_jsonl

SEED = Path(__file__).parent / "fixtures" / "generics_seed_handwritten.jsonl"  # the old hand-written seed set


def _jsonl(path, lines):
    path.write_text("\n".join(l if isinstance(l, str) else json.dumps(l) for l in lines) + "\n")
    return path


# ----------------------------------------------------------------------------- seed data

def test_seed_set_covers_every_kind_and_many_concepts():
    rows = [json.loads(l) for l in SEED.read_text().splitlines()]
    assert len(rows) >= 400
    assert len({r["concept"] for r in rows}) >= 60
    kinds = {r["kind"] for r in rows}
    assert {"valid", "false", "vague", "garbled", "narrative", "too_specific", "dont_know"} <= kinds
    loaded = load_annotations([SEED])  # every label is known to the default map
    assert 0.3 < np.mean([r["y"] for r in loaded]) < 0.7


# ----------------------------------------------------------------------------- labels

def test_label_normalisation_covers_both_papers_schemes(tmp_path):
    assert normalize_label("(Generally) True") == "true"
    assert normalize_label("Don't Know") == "dont_know"
    assert normalize_label("Huh???") == "huh"
    assert normalize_label("Too vague to judge") == "too_vague_to_judge"
    p = _jsonl(tmp_path / "a.jsonl", [
        {"statement": "Dogs bark.", "label": "(Generally) True", "concept": "dog"},
        {"statement": "Dogs fly.", "label": "False", "concept": "dog"},
        {"statement": "Dogs are a thing.", "label": "Huh???", "concept": "dog"},
        {"statement": "Dogs descend from wolves.", "label": "Don't know", "concept": "dog"},
        {"statement": "Compared to cats, dogs are louder.", "label": "True", "concept": "cat|dog"},
        {"statement": "Compared to cats, dogs are nicer.", "label": "Too subjective to judge", "concept": "cat|dog"},
        {"statement": "Compared to cats, dogs have more.", "label": "Too vague to judge", "concept": "cat|dog"},
        {"statement": "Compared to cats, dogs have more alleles.", "label": "Too unfamiliar to judge", "concept": "cat|dog"},
        {"statement": "Compared to cats, dogs always on.", "label": "Invalid", "concept": "cat|dog"},
    ])
    report = LoadReport()
    rows = load_annotations([p], report=report)
    assert [r["y"] for r in rows] == [1, 0, 0, 1, 0, 0, 0]
    assert report.dropped == {"dont_know": 1, "too_unfamiliar_to_judge": 1}
    # the mapping is configurable: a config names what it changes over the defaults (one key from the command line,
    # ++critic.label_map.dont_know=0, keeps every other label), here "don't know" counted invalid instead of dropped
    rows = load_annotations([p], label_map={"Don't know": 0})
    assert [r["y"] for r in rows] == [1, 0, 0, 0, 1, 0, 0, 0]
    rows = load_annotations([p], label_map={"dont_know": 0, "too_unfamiliar_to_judge": 0, "true": 0})
    assert len(rows) == 9 and sum(r["y"] for r in rows) == 0
    rows = load_annotations([p], label_map={"true": 1, "false": 0, "huh": 0, "dont_know": 0,
                                            "too_subjective_to_judge": 0, "too_vague_to_judge": 0,
                                            "too_unfamiliar_to_judge": 0, "invalid": 0})
    assert len(rows) == 9 and sum(r["y"] for r in rows) == 2


def test_majority_vote_aggregation(tmp_path):
    assert aggregate_votes(["true", "True", "false"]) == "true"
    assert aggregate_votes(["true", "false", "garbled"]) is None
    assert aggregate_votes(["Huh???", "huh", "true"]) == "huh"
    p = tmp_path / "votes.csv"
    with open(p, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["statement", "label", "concept", "votes"])
        w.writerow(["Owls hunt at night.", "", "owl", "true|true|false"])
        w.writerow(["Owls are made of glass.", "", "owl", "false|false|don't know"])
        w.writerow(["Owls are owls of the.", "", "owl", "true|false|garbled"])
        w.writerow(["Owls can swim.", "false", "owl", "true|true|true"])  # an explicit label wins
    report = LoadReport()
    rows = load_annotations([p], report=report)
    assert [(r["statement"], r["y"]) for r in rows] == [
        ("Owls hunt at night.", 1), ("Owls are made of glass.", 0), ("Owls can swim.", 0)]
    assert report.no_majority == 1


def test_unknown_labels_and_broken_rows_reported_with_line_numbers(tmp_path):
    p = _jsonl(tmp_path / "bad.jsonl", [
        {"statement": "Cows eat grass.", "label": "true", "concept": "cow"},
        {"statement": "Cows fly.", "label": "false", "concept": "cow"},
        '{"statement": "broken json", "label": ',
        {"statement": "Cows moo.", "label": "true", "concept": "cow"},
        {"statement": "Cows are purple.", "label": "maybe", "concept": "cow"},
        {"statement": "Cows give milk.", "label": "true"},
        {"statement": "Cows vote.", "votes": ["false", "nope"], "concept": "cow"},
    ])
    with pytest.raises(DataError, match=r"bad\.jsonl:3: broken row"):
        load_annotations([p])
    report = LoadReport()
    rows = load_annotations([p], on_error="skip", report=report)
    assert [r["statement"] for r in rows] == ["Cows eat grass.", "Cows fly.", "Cows moo."]
    assert [e.split(": ")[0].rsplit(":", 1)[1] for e in report.errors] == ["3", "5", "6", "7"]
    assert "unknown label 'maybe'" in report.errors[1] and "concept" in report.errors[2]
    assert "nope" in report.errors[3]
    # CSV: line numbers count the header as line 1
    c = tmp_path / "bad.csv"
    c.write_text("statement,label,concept\nCows eat grass.,true,cow\nCows fly.,sorta,cow\n")
    with pytest.raises(DataError, match=r"bad\.csv:3: unknown label 'sorta'"):
        load_annotations([c])
    c.write_text("statement,label\nCows eat grass.,true\n")
    with pytest.raises(DataError, match=r"bad\.csv:1: header lacks column\(s\) concept"):
        load_annotations([c])


def test_later_annotation_file_overrides_earlier(tmp_path):
    a = _jsonl(tmp_path / "a.jsonl", [{"statement": "Frogs can jump.", "label": "false", "concept": "frog"},
                                      {"statement": "Frogs are green.", "label": "true", "concept": "frog"}])
    b = _jsonl(tmp_path / "b.jsonl", [{"statement": "frogs can jump", "label": "true", "concept": "frog"}])
    report = LoadReport()
    rows = load_annotations([a, b], report=report)
    assert len(rows) == 2 and report.duplicates == 1
    assert {r["statement"]: r["y"] for r in rows}["frogs can jump"] == 1


# ----------------------------------------------------------------------------- split

def test_grouped_split_leaks_no_concept():
    rows = load_annotations([SEED])
    concepts = [r["concept"] for r in rows]
    ys = [r["y"] for r in rows]
    for seed in range(5):
        tr, va = grouped_split(concepts, ys, val_fraction=0.2, seed=seed)
        assert sorted(np.r_[tr, va].tolist()) == list(range(len(rows)))
        assert not {concepts[i] for i in tr} & {concepts[i] for i in va}
        assert {ys[i] for i in va} == {0, 1} and {ys[i] for i in tr} == {0, 1}
        assert 0.1 < len(va) / len(rows) < 0.3


# ----------------------------------------------------------------------------- metrics and δ

Y = np.array([1, 1, 1, 0, 1, 0, 1, 0, 0, 1, 0, 0])
S = np.array([.95, .9, .85, .8, .75, .7, .65, .6, .55, .5, .45, .4])


def test_choose_delta_reaches_requested_precision_with_most_recall():
    for target in (0.5, 0.6, 0.7, 0.75, 0.8, 0.9, 1.0):
        d = choose_delta(Y, S, target)
        assert d["reached"] and d["precision"] >= target
        # brute force: no threshold reaching the target keeps more valid statements
        best = max(precision_recall_at(Y, S, t)[1] for t in np.r_[S - 1e-9, 1.0]
                   if (precision_recall_at(Y, S, t)[0] or 0.0) >= target)
        assert d["recall"] == pytest.approx(best)
    # worked example: keeping the top 3 gives precision 1.0; top 5 gives 0.8 (recall 4/6); top 7 gives 5/7
    d = choose_delta(Y, S, 0.8)
    assert d["delta"] == pytest.approx(0.725) and d["n_kept"] == 5 and d["recall"] == pytest.approx(4 / 6)
    assert choose_delta(Y, S, 1.0)["delta"] == pytest.approx(0.825)
    # ties: a threshold can only cut between distinct scores
    d = choose_delta([1, 1, 0, 1], [0.9, 0.5, 0.5, 0.1], 0.9)
    assert d["n_kept"] == 1 and d["delta"] == pytest.approx(0.7)
    # unreachable target: fall back to the most precise cut and say so
    d = choose_delta([0, 1, 1], [0.9, 0.5, 0.4], 0.95)
    assert not d["reached"] and d["precision"] == pytest.approx(2 / 3)


def test_precision_at_recall_and_ap():
    assert precision_at_recall(Y, S, 0.8) == pytest.approx(5 / 7)  # top 7 reach recall 5/6 >= 0.8
    assert precision_at_recall(Y, S, 1.0) == pytest.approx(6 / 10)
    assert average_precision([1, 0, 1, 0], [0.9, 0.8, 0.7, 0.1]) == pytest.approx((1 + 2 / 3) / 2)


def test_cut_at_recall_is_the_cut_precision_at_recall_reads():
    # the cut chosen on one set is a δ for the filter's rule ``score > δ``: on the same rows it reproduces
    # precision_at_recall, and applied to other rows it is what a filter run at that recall gets
    for r in (0.5, 0.8, 1.0):
        p, rec, _ = precision_recall_at(Y, S, cut_at_recall(Y, S, r))
        assert p == pytest.approx(precision_at_recall(Y, S, r)) and rec >= r - 1e-12
    assert cut_at_recall([0, 0], [0.4, 0.3], 0.8) is None
    # a cut picked on dev, applied to test rows ranked worse: the test's own best cut is better than what it gets
    cut = cut_at_recall([1, 1, 0, 0], [0.9, 0.8, 0.3, 0.2], 0.8)
    assert 0.3 < cut < 0.8
    assert precision_recall_at([1, 0, 1, 0], [0.9, 0.85, 0.2, 0.1], cut)[:2] == (0.5, 0.5)


def test_threshold_filter_keeps_scores_above_delta(tmp_path):
    rows = [{"generation": f"g{i}", "prompt_id": i} for i in range(5)]
    kept, dropped = threshold_filter(rows, np.array([0.9, 0.5, 0.2, 0.51, 0.5]), 0.5)
    assert [r["prompt_id"] for r in kept] == [0, 3] and [r["prompt_id"] for r in dropped] == [1, 2, 4]
    assert kept[0]["critic_score"] == pytest.approx(0.9) and "critic_score" not in rows[0]
    with pytest.raises(ValueError, match="5 rows but 4 scores"):
        threshold_filter(rows, [0.1] * 4, 0.5)
    summary = filter_and_write(rows, [0.9, 0.5, 0.2, 0.51, 0.5], 0.5, tmp_path / "filtered")
    assert summary["n_kept"] == 2 and summary["n_dropped"] == 3
    assert [r["generation"] for r in read_jsonl(tmp_path / "filtered" / "kept.jsonl")] == ["g0", "g3"]
    assert not list((tmp_path / "filtered").glob(".*tmp"))


# ----------------------------------------------------------------------------- training and scoring

@pytest.fixture(scope="module")
def tiny_critic(tmp_path_factory):
    from omegaconf import OmegaConf

    from critics.train import train_critic
    from i2d2.models import tiny_model

    out = tmp_path_factory.mktemp("critic")
    from i2d2.schemas import CriticConfig

    cfg = OmegaConf.structured(CriticConfig)  # the shipped defaults (conf/critic/minilm.yaml adds nothing else)
    cfg.merge_with({"name": "tiny:roberta", "max_epochs": 3, "lr": 1e-3, "patience": 0, "batch_size": 32})
    trainer_cfg = {"_target_": "lightning.Trainer", "accelerator": "cpu", "devices": 1,
                   "enable_progress_bar": False, "enable_model_summary": False, "log_every_n_steps": 2}
    res = train_critic(cfg, [SEED], out, trainer_cfg, lm=tiny_model("gpt2"))
    return cfg, trainer_cfg, out, res


def test_tiny_critic_trains_and_writes_outputs(tiny_critic):
    import pandas as pd

    cfg, _, out, res = tiny_critic
    for f in ("pr_curve.png", "score_histogram.png", "perplexity_histogram.png", "dev_scores.jsonl",
              "test_scores.jsonl", "probe_scores.jsonl", "metrics.json", "split.json", "model/config.json",
              "model/critic_meta.json", "epochs/pr_curve.png"):
        assert (out / f).exists(), f
    assert not (out / "checkpoints").exists()  # removed once the model folder is in place
    assert (out / "pr_curve.png").read_bytes()[:4] == b"\x89PNG"
    assert res["n_train"] + res["n_dev"] + res["n_test"] == 440
    split = json.loads((out / "split.json").read_text())
    tr, dev, te = (set(split[f"{k}_concepts"]) for k in ("train", "dev", "test"))
    assert not (tr & dev or tr & te or dev & te)
    # the critic learnt something: training loss went down and it ranks test statements above chance
    log = pd.read_csv(next(out.glob("logs/*/metrics.csv")))
    epoch_loss = log["train/loss_epoch"].dropna().to_numpy()
    assert len(epoch_loss) == 3 and epoch_loss[-1] < epoch_loss[0]
    assert res["ap"] > res["test_valid_rate"] + 0.05
    # δ comes from dev alone; every reported number is that of score > δ on test
    dev = read_jsonl(out / "dev_scores.jsonl")
    d = choose_delta([r["y"] for r in dev], [r["critic_score"] for r in dev], cfg.target_precision)
    assert res["delta"] == pytest.approx(d["delta"]) and res["sources"]["delta"] == "dev"
    test = read_jsonl(out / "test_scores.jsonl")
    assert {r["concept"] for r in test} == te and not {r["concept"] for r in dev} & te
    y = np.array([r["y"] for r in test])
    s = np.array([r["critic_score"] for r in test])
    p, r, n = precision_recall_at(y, s, res["delta"])
    assert (p, r, n) == (res["precision"], pytest.approx(res["recall"]), res["n_kept_test"])
    # precision at the target recall as a filter gets it: the cut from dev, its numbers from test
    cut = cut_at_recall([r["y"] for r in dev], [r["critic_score"] for r in dev], cfg.target_recall)
    assert res["recall_cut"] == pytest.approx(cut)
    p, r, n = precision_recall_at(y, s, cut)
    assert (res["recall_cut_precision"], res["recall_cut_recall"], res["recall_cut_n_kept"]) == (p, r, n)
    # p_at_r, its cut picked on test, comes with that cut's recall and rows kept (it was a precision alone)
    p, r, n = precision_recall_at(y, s, cut_at_recall(y, s, cfg.target_recall))
    assert (res["p_at_r"], res["p_at_r_recall"], res["p_at_r_n_kept"]) == (pytest.approx(p), r, n)
    assert r >= cfg.target_recall and "test" in res["sources"]["p_at_r_recall, p_at_r_n_kept"]
    # dev_* are read on the rows that chose δ and the checkpoint, and say so
    assert res["sources"]["dev_*"] == "dev, the split that chose the checkpoint and δ"
    assert res["ap"] == pytest.approx(average_precision(y, s))
    assert res["ap_perplexity"] == pytest.approx(average_precision(y, -np.log([v["perplexity"] for v in test])))
    # the surface floor and the probes are measured every time
    assert 0.0 <= res["surface_ap"] <= 1.0 and res["probe_n"] >= 100 and res["probe_shift"] is not None


def test_tiny_critic_scores_and_is_reused(tiny_critic):
    from critics.scoring import score_texts
    from critics.train import train_critic

    cfg, trainer_cfg, out, res = tiny_critic
    val = read_jsonl(out / "test_scores.jsonl")
    texts = [r["statement"] for r in val]
    scores = score_texts(res["model_dir"], texts, batch_size=7, progress=False)
    assert scores.shape == (len(texts),) and ((scores >= 0) & (scores <= 1)).all()
    np.testing.assert_allclose(scores, [r["critic_score"] for r in val], atol=1e-5)
    one = score_texts(res["model_dir"], texts[:3][::-1], batch_size=1, progress=False)  # order-independent
    np.testing.assert_allclose(one, scores[:3][::-1], atol=1e-5)
    # scoring cuts a statement where the critic was trained to (critic_meta.json's max_length), not at a fixed 64
    import json
    import shutil

    from critics.scoring import load_critic, score_model

    short = out / "model_max4"
    shutil.copytree(res["model_dir"], short, dirs_exist_ok=True)
    meta = json.loads((short / "critic_meta.json").read_text())
    (short / "critic_meta.json").write_text(json.dumps(dict(meta, max_length=4)))
    long_text = ["Bicycles can carry a rider and some luggage over long distances on paved and unpaved roads."]
    model, tok = load_critic(short)
    cut = score_model(model, tok, long_text, max_length=4, progress=False)
    assert not np.allclose(cut, score_model(model, tok, long_text, max_length=64, progress=False), atol=1e-6)
    np.testing.assert_allclose(score_texts(short, long_text, progress=False), cut, atol=1e-6)
    # a finished model folder is reused: no second fit, same numbers; δ can be set directly
    cfg2 = cfg.copy()
    cfg2.delta = 0.5
    again = train_critic(cfg2, [SEED], out, trainer_cfg)
    assert again["fit_seconds"] is None and again["ap"] == pytest.approx(res["ap"])
    assert again["delta"] == 0.5 and again["ap_perplexity"] is None


def test_critic_config_rejects_unknown_keys():
    from critics.train import critic_config

    with pytest.raises(ValueError, match="unknown key"):
        critic_config({"name": "tiny:roberta", "learning_rate": 1e-3})


def test_killed_fit_resumes_from_last_checkpoint(tmp_path, caplog):
    import logging
    import shutil

    from critics.train import train_critic

    small = tmp_path / "small.jsonl"
    small.write_text("".join(SEED.read_text().splitlines(keepends=True)[:120]))
    cfg = {"name": "tiny:roberta", "max_epochs": 1, "lr": 1e-3, "patience": 0, "batch_size": 32,
           "keep_checkpoints": True, "min_examples": 10}
    trainer_cfg = {"_target_": "lightning.Trainer", "accelerator": "cpu", "devices": 1,
                   "enable_progress_bar": False, "enable_model_summary": False, "log_every_n_steps": 1}
    out = tmp_path / "critic"
    train_critic(cfg, [small], out, trainer_cfg)
    assert (out / "checkpoints" / "last.ckpt").exists() and (out / "checkpoints" / "best.ckpt").exists()
    shutil.rmtree(out / "model")  # as if the run died after epoch 1, before the model folder was written
    with caplog.at_level(logging.INFO, logger="critics.train"):
        res = train_critic({**cfg, "max_epochs": 2}, [small], out, trainer_cfg)
    assert "resuming training from" in caplog.text
    meta = json.loads((out / "model" / "critic_meta.json").read_text())
    assert meta["epochs_trained"] == 2 and res["n_train"] + res["n_dev"] + res["n_test"] <= 120
    import pandas as pd

    second = pd.read_csv(out / "logs" / "version_1" / "metrics.csv")
    assert set(second["epoch"].dropna().astype(int)) == {1}  # only the missing epoch was trained


def test_lora_critic_trains_adapters_and_saves_a_merged_classifier(tmp_path):
    import torch
    from safetensors.torch import load_file

    from critics.train import train_critic
    from i2d2.models import tiny_model

    small = tmp_path / "small.jsonl"
    small.write_text("".join(SEED.read_text().splitlines(keepends=True)[:160]))
    cfg = {"name": "tiny:roberta", "max_epochs": 1, "lr": 1e-2, "patience": 0, "batch_size": 16, "min_examples": 10,
           "monitor": "val/ap", "lora": {"enabled": True, "r": 4, "alpha": 8, "target_modules": ["query", "value"]}}
    trainer_cfg = {"_target_": "lightning.Trainer", "accelerator": "cpu", "devices": 1,
                   "enable_progress_bar": False, "enable_model_summary": False, "log_every_n_steps": 1}
    res = train_critic(cfg, [small], tmp_path / "critic", trainer_cfg)
    model_dir = tmp_path / "critic" / "model"
    assert json.loads((model_dir / "critic_meta.json").read_text())["lora"] is True
    assert not list(model_dir.glob("adapter_*"))  # a plain classifier: the adapters are merged into the body
    saved = load_file(str(model_dir / "model.safetensors"))
    base = tiny_model("roberta")[0].state_dict()
    # adapted projections changed (merged B @ A), everything else in the body is the frozen start, the head trained
    q = "roberta.encoder.layer.0.attention.self.query.weight"
    assert not torch.allclose(saved[q], base[q])
    for k in ("roberta.embeddings.word_embeddings.weight", "roberta.encoder.layer.0.attention.self.key.weight",
              "roberta.encoder.layer.0.output.dense.weight"):
        assert torch.equal(saved[k], base[k]), k
    assert not torch.allclose(saved["classifier.out_proj.weight"], base["classifier.out_proj.weight"])
    # the merged classifier scores dev as the adapted model did in training (val/ap of the kept epoch)
    meta = json.loads((model_dir / "critic_meta.json").read_text())
    assert meta["monitor"] == "val/ap" and res["dev_ap"] == pytest.approx(meta["best_score"], abs=1e-5)
    with pytest.raises(ValueError, match=r"critic\.lora\.rank: Key .rank. not in .LoraConfig."):
        train_critic({**cfg, "lora": {"enabled": True, "rank": 4}}, [small], tmp_path / "bad", trainer_cfg)


def test_critic_cli_trains_the_configured_critic_alone(tmp_path, capsys):
    from critics.train import main

    small = tmp_path / "small.jsonl"
    small.write_text("".join(SEED.read_text().splitlines(keepends=True)[:120]))
    common = ["critic=tiny", f"critic.seed_annotations=[{small}]", "critic.max_epochs=1", "critic.min_examples=10",
              "+trainer.enable_progress_bar=false"]
    assert main(["--out", str(tmp_path / "c"), *common]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    saved = json.loads((tmp_path / "c" / "metrics.json").read_text())
    assert printed["ap"] == pytest.approx(saved["ap"]) and printed["n_test"] == saved["n_test"] > 0
    assert printed["fit_seconds"] is not None
    # the same config again: the finished critic is reused; another config in the same folder is refused
    assert main(["--out", str(tmp_path / "c"), *common]) == 0
    again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert again["ap"] == printed["ap"] and again["fit_seconds"] == printed["fit_seconds"]
    mtime = (tmp_path / "c" / "metrics.json").stat().st_mtime_ns
    assert main(["--out", str(tmp_path / "c"), *common, "critic.lr=0.01"]) == 2
    assert "holds other work" in capsys.readouterr().err
    assert (tmp_path / "c" / "metrics.json").stat().st_mtime_ns == mtime
    assert main(["--out", str(tmp_path / "bad"), *common, "critic.lora.rank=4"]) == 2
    assert "critic.lora.rank" in capsys.readouterr().err and not (tmp_path / "bad" / "model").exists()


def test_critic_cli_refuses_a_bad_model_name_or_out_before_the_folder_is_touched(tmp_path, capsys):
    """A misspelt critic.name failed after the labels were split into --out (its _STARTED.json and split.json): the
    corrected command was then refused, the folder holding "other work"."""
    from critics.train import main

    out = tmp_path / "c"
    for bad in ("critic.name=tiny:robertaa", "critic.probe_lm=nonexistent", f"critic.name={tmp_path}/no_model"):
        assert main(["--out", str(out), "critic=tiny", bad]) == 2
        err = capsys.readouterr().err
        assert f"(set by {bad.split('=')[0]})" in err and "Traceback" not in err, err
        assert not out.exists()
    (tmp_path / "notes.txt").write_text("kept\n")  # --out a file, or inside one: a NotADirectoryError traceback
    for where in ("notes.txt", "notes.txt/c"):
        assert main(["--out", str(tmp_path / where), "critic=tiny"]) == 2
        assert f"error: --out: must name a folder, but {tmp_path}/notes.txt is a file" in capsys.readouterr().err
    assert (tmp_path / "notes.txt").read_text() == "kept\n"


def test_critic_cli_reads_the_labels_before_the_folder_is_touched(tmp_path, capsys):
    """A bad label row failed inside the stage, after --out held this config's _STARTED.json: once the file was
    corrected (a new fingerprint), the same command was refused, the folder holding "other work"."""
    from critics.train import main

    lines = SEED.read_text().splitlines(keepends=True)[:120]
    labels = tmp_path / "small.jsonl"
    labels.write_text("".join(lines[:4]) + '{"statement": "Owls hoot.", "concept": "owl", "label": "maybe"}\n')
    out = tmp_path / "c"
    common = ["critic=tiny", f"critic.seed_annotations=[{labels}]", "critic.max_epochs=1", "critic.min_examples=10",
              "+trainer.enable_progress_bar=false"]
    assert main(["--out", str(out), *common]) == 2
    assert f"error: critic.seed_annotations: {labels}:5: unknown label 'maybe'" in capsys.readouterr().err
    assert not out.exists()
    labels.write_text("".join(lines))
    assert main(["--out", str(out), *common]) == 0 and (out / "model").is_dir()


def test_critic_cli_says_what_is_wrong_with_an_override(tmp_path, capsys):
    # only Hydra's first line was printed: "Error merging override critic.lr=abc", not what it expected
    from critics.train import main

    for bad, said in (("critic.lr=abc", "Value 'abc' of type 'str' could not be converted to Float"),
                      ("critic.lrr=1", "Key 'lrr' not in 'CriticConfig'")):
        assert main(["--out", str(tmp_path / "c"), bad]) == 2
        assert said in capsys.readouterr().err
    assert main(["--out", str(tmp_path / "c"), "critic.name=nope"]) == 2  # a check's message whole: the known names
    assert "packaged:minilm" in capsys.readouterr().err and not (tmp_path / "c").exists()


def test_lora_critic_checkpoints_hold_only_trained_weights_and_resume(tmp_path, caplog):
    import logging
    import shutil

    import torch

    from critics.train import train_critic

    small = tmp_path / "small.jsonl"
    small.write_text("".join(SEED.read_text().splitlines(keepends=True)[:120]))
    cfg = {"name": "tiny:roberta", "max_epochs": 1, "lr": 1e-2, "patience": 0, "batch_size": 16, "min_examples": 10,
           "monitor": "val/ap", "keep_checkpoints": True, "probes": False,
           "lora": {"enabled": True, "r": 4, "alpha": 8, "target_modules": ["query", "value"]}}
    trainer_cfg = {"_target_": "lightning.Trainer", "accelerator": "cpu", "devices": 1,
                   "enable_progress_bar": False, "enable_model_summary": False, "log_every_n_steps": 1}
    out = tmp_path / "critic"
    train_critic(cfg, [small], out, trainer_cfg)
    for name in ("last.ckpt", "best.ckpt"):
        keys = set(torch.load(out / "checkpoints" / name, map_location="cpu", weights_only=False)["state_dict"])
        assert keys and all("lora_" in k or "classifier" in k for k in keys), sorted(keys)[:5]
        assert not any("embeddings" in k or k.endswith("key.weight") for k in keys)
    shutil.rmtree(out / "model")  # as if the run died after epoch 1
    with caplog.at_level(logging.INFO, logger="critics.train"):
        res = train_critic({**cfg, "max_epochs": 2}, [small], out, trainer_cfg)
    assert "resuming training from" in caplog.text
    meta = json.loads((out / "model" / "critic_meta.json").read_text())
    assert meta["epochs_trained"] == 2 and res["dev_ap"] == pytest.approx(meta["best_score"], abs=1e-5)


def test_critic_fingerprint_ignores_settings_that_cannot_change_the_critic():
    from critics.train import fingerprint_view
    from i2d2.schemas import CriticConfig, defaults

    for kind in ("finetune", "probe"):
        base = dict(defaults(CriticConfig), kind=kind)
        same = [{"keep_checkpoints": True}, {"ckpt_every_n_steps": 10}]
        same += [{"lr": 5e-5}, {"max_epochs": 9}] if kind == "probe" else [{"probe_layer": 6}, {"probe_C": [1.0]}]
        for change in same:
            assert fingerprint_view({**base, **change}) == fingerprint_view(base), (kind, change)
        used = [{"seed": 7}, {"label_map": {"dont_know": 0}}]
        used += [{"probe_layer": 6}] if kind == "probe" else [{"lr": 5e-5}]
        for change in used:
            assert fingerprint_view({**base, **change}) != fingerprint_view(base), (kind, change)


def test_probe_layer_outside_the_lm_is_refused_before_features():
    from critics.probe import check_layer, lm_features
    from i2d2.models import tiny_model

    model, tok = tiny_model("gpt2")
    n = model.config.num_hidden_layers + 1  # hidden_states: the embeddings, then every block
    check_layer(model, [0, n - 1, -1])
    with pytest.raises(ValueError, match=rf"critic\.probe_layer: {n} is not a layer of the probe LM \(0 = embeddings \.\. {n - 1}\)"):
        lm_features(model, tok, ["Dogs bark."], n, progress=False)


def test_train_critic_without_a_trainer_config(tmp_path):
    """``train_critic(cfg, paths, out_dir)`` as the README writes it: a fine-tuned critic then fits with the default
    trainer (``DEFAULT_TRAINER``), as ``build_trainer`` reads a None config; the schedule's step count used to raise
    AttributeError on None."""
    from critics.train import train_critic

    small = tmp_path / "small.jsonl"
    small.write_text("".join(SEED.read_text().splitlines(keepends=True)[:120]))
    cfg = {"name": "tiny:roberta", "max_epochs": 1, "lr": 1e-3, "patience": 0, "batch_size": 32, "min_examples": 10}
    res = train_critic(cfg, [small], tmp_path / "critic")
    assert (tmp_path / "critic" / "model" / "critic_meta.json").is_file()
    assert res["n_train"] > 0 and res["ap"] is not None


def test_a_nan_score_is_refused_not_a_nan_delta():
    """A NaN compares False with everything: choose_delta put it past the last cut and returned δ = NaN ("reached"),
    under which the filter's ``score <= δ`` dropped nothing, so every scored generation was kept."""
    nan = float("nan")
    for call in (lambda: choose_delta([1, 1], [0.9, nan], 0.5), lambda: cut_at_recall([1, 1, 0], [0.9, nan, 0.2], 1.0),
                 lambda: precision_at_recall([1, 0], [nan, 0.2]), lambda: precision_at_top([1, 0, 1], [0.9, nan, 0.8], 0.3),
                 lambda: precision_recall_at([1, 0], [nan, 0.2], 0.5), lambda: average_precision([1, 0], [nan, 0.2])):
        with pytest.raises(ValueError, match="1 of 2 scores are NaN|1 of 3 scores are NaN"):
            call()


def test_no_rows_give_no_cut_not_an_index_error():
    """``_cuts`` of no rows ended in an IndexError, so the documented answers never came: precision_at_recall's None
    (it now reads the cuts first, to refuse a NaN score, and stopped returning None for an empty split),
    cut_at_recall's None and choose_delta's error naming the cause."""
    assert precision_at_recall([], []) is None and cut_at_recall([], [], 0.8) is None
    with pytest.raises(ValueError, match="at least one scored example"):
        choose_delta([], [], 0.5)
