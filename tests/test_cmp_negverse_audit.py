"""Regression tests from an audit of the CMP and NegVerse recipes: the pre-training's last steps are scored, a step
holds task.pretrain.batch_size examples, the zero-shot 'base' model does not depend on the RNG state, and bad NegVerse
inputs are refused by name (before training) instead of failing after it or with the wrong advice."""

import json
import re

import pytest
import torch

from i2d2.config import CONF_DIR, ConfigError


def _cfg(*overrides):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return compose("train", overrides=list(overrides))


def _cmp_cfg(tmp_path, *overrides):
    return _cfg("task=cmp", "task.model=tiny:t5", "logger=none", f"run_dir={tmp_path}", "task.keep_checkpoints=true",
                "task.pretrain.batch_size=4", "task.pretrain.val_max_per_task=4", "task.eval.limit=2",
                "+trainer.enable_progress_bar=false", "+trainer.enable_model_summary=false", *overrides)


def _cmp_inputs(cfg):
    from i2d2.cmp.data import BUNDLED, load_quintuples
    from i2d2.cmp.textualize import TemplateRealiser, cut_documents
    from i2d2.recipes.cmp import make_splits

    quints = cut_documents(load_quintuples(BUNDLED / "corpus.jsonl"), int(cfg.task.segment_sentences))
    splits, _ = make_splits(cfg, quints, BUNDLED / "corpus.jsonl")
    return splits, dict(zip([q.id for q in quints], TemplateRealiser()(quints)))


def test_pretrain_scores_the_steps_after_the_last_validation(tmp_path):
    # max_steps 3, val_every 2: step 3 was never validated, so best.ckpt (step 2) was always saved as the model
    from i2d2.io import load_state_dict
    from i2d2.recipes.cmp import pretrain

    cfg = _cmp_cfg(tmp_path, "task.pretrain.max_steps=3", "task.pretrain.val_every=2", "task.pretrain.lr=3e-3")
    splits, summaries = _cmp_inputs(cfg)
    out = pretrain(cfg, splits, summaries, tmp_path / "pretrain", None)
    assert out["steps"] == 3
    best = torch.load(tmp_path / "pretrain" / "checkpoints" / "best.ckpt", map_location="cpu", weights_only=False)
    assert best["global_step"] == 2
    # the final weights score better than step 2's and are the ones saved
    assert out["final"]["val/loss"] < float(best["callbacks"][next(k for k in best["callbacks"] if "Checkpoint" in k)]
                                             ["best_model_score"])
    assert out["best_checkpoint"] is None
    step2 = load_state_dict(tmp_path / "pretrain" / "checkpoints" / "best.ckpt")
    from i2d2.models import load_seq2seq

    saved, _ = load_seq2seq(str(tmp_path / "pretrain" / "model"))
    name = "lm_head.weight"
    assert not torch.equal(saved.state_dict()[name], step2[f"model.{name}"])


def test_per_step_examples_are_the_batch_size():
    from trainers.cmp import per_task_sizes

    tasks = ["qa", "qag", "sum", "ti"]
    # the minimum of one example per task made this step 13 examples for a batch of 12
    sizes = per_task_sizes(12, tasks, {"qa": 20.0, "qag": 1.0, "sum": 1.0, "ti": 1.0})
    assert sum(sizes.values()) == 12 and min(sizes.values()) == 1 and sizes["qa"] == 9
    assert per_task_sizes(12, tasks, {"qa": 5.0, "qag": 5.0, "sum": 1.0, "ti": 1.0}) == \
        {"qa": 5, "qag": 5, "sum": 1, "ti": 1}
    assert per_task_sizes(192, tasks, {"qa": 5.0, "qag": 5.0, "sum": 1.0, "ti": 1.0}) == \
        {"qa": 80, "qag": 80, "sum": 16, "ti": 16}
    assert per_task_sizes(5, tasks, {"qa": 100.0, "qag": 100.0, "sum": 1.0, "ti": 1.0}) == \
        {"qa": 1, "qag": 2, "sum": 1, "ti": 1}
    assert per_task_sizes(2, tasks) == dict.fromkeys(tasks, 1)  # a batch below one per task: one each, as before


@pytest.mark.parametrize("override, key", [("task.pretrain.val_every=0", "task.pretrain.val_every"),
                                           ("task.pretrain.max_steps=0", "task.pretrain.max_steps")])
def test_cmp_check_config_refuses_before_anything_loads(tmp_path, override, key):
    # val_every=0 was a ZeroDivisionError traceback from Lightning after the initial validation
    from i2d2.recipes.cmp import check_config

    check_config(_cmp_cfg(tmp_path))
    with pytest.raises(ConfigError, match=key):
        check_config(_cmp_cfg(tmp_path, override))


@pytest.mark.parametrize("override, message", [
    # accepted at start-up: lr -1 and warmup_ratio 3 trained without a word, a length of 0 failed in the tokenizer
    ("task.pretrain.lr=-1", r"task\.pretrain\.lr: must be > 0, got -1"),
    ("task.pretrain.lr=0", r"task\.pretrain\.lr: must be > 0, got 0"),
    ("task.pretrain.weight_decay=-0.1", r"task\.pretrain\.weight_decay: must be >= 0, got -0\.1"),
    ("task.pretrain.warmup_ratio=3", r"task\.pretrain\.warmup_ratio: must be in \[0, 1\), got 3"),
    ("task.pretrain.warmup_ratio=-0.1", r"task\.pretrain\.warmup_ratio: must be in \[0, 1\), got -0\.1"),
    ("task.pretrain.max_source_length=0", r"task\.pretrain\.max_source_length: must be an integer >= 1, got 0"),
    ("task.pretrain.max_target_length=1", r"task\.pretrain\.max_target_length: must be an integer >= 2 \(one token"),
    ("task.pretrain.val_max_per_task=0", r"task\.pretrain\.val_max_per_task: must be null \(the default\) or an "
                                         r"integer >= 1, got 0"),
    ("task.eval.max_new_tokens=0", r"task\.eval\.max_new_tokens: must be an integer >= 1, got 0"),
    # checked only in the first stage (make_splits), after the run lock and the tracker had started
    ("data.val_fraction=1.5", r"data\.val_fraction: must be in \(0, 1\), got 1\.5"),
    ("data.test_fraction=0", r"data\.test_fraction: must be in \(0, 1\), got 0"),
    ("data.val_fraction=0.8", r"data\.val_fraction \+ data\.test_fraction: must be < 1 \(training keeps the rest\), "
                              r"got 1\.0"),
    ("data.split_by=entities", r"data\.split_by: must be entity \(held-out entities\) or field .*got 'entities'"),
    # the downstream fine-tuning's: read only when the first fine-tuned setting began (a length of 0 or 1 kept no
    # target token to learn; dev_size 0.5 was read as 0 items, 1.5 as 1, -3 refused only with no dev_path)
    ("task.downstream.finetune.max_target_length=0",
     r"^task\.downstream\.finetune\.max_target_length: must be an integer >= 2 \(one token is the end of sequence\), "
     r"got 0$"),
    ("task.downstream.finetune.max_target_length=1", r"^task\.downstream\.finetune\.max_target_length: .*got 1$"),
    ("task.downstream.finetune.dev_size=0", r"^task\.downstream\.finetune\.dev_size: must be an integer >= 1, got 0$"),
    ("task.downstream.finetune.dev_size=0.5", r"^task\.downstream\.finetune\.dev_size: must be an integer >= 1, "
                                              r"got 0\.5$"),
    ("task.downstream.finetune.dev_size=1.5", r"^task\.downstream\.finetune\.dev_size: .*got 1\.5$"),
    ("task.downstream.finetune.batch_size=0", r"^task\.downstream\.finetune\.batch_size: must be an integer >= 1"),
])
def test_cmp_pretrain_and_data_values_are_refused_at_start_up(tmp_path, override, message):
    from i2d2.recipes.cmp import check_config

    tuned = ["task.downstream.shots=[0,2]", "task.downstream.allow_fewer_shots=true"]  # finetune.* is read
    with pytest.raises(ConfigError, match=message):
        check_config(_cmp_cfg(tmp_path, override, *tuned))
    if override.startswith("task.downstream.finetune."):  # zero-shot alone (the default) never reads finetune.*
        check_config(_cmp_cfg(tmp_path, override, "task.downstream.shots=[0]"))


@pytest.mark.parametrize("shots", ["[0]", "[0,2]"])
def test_cmp_missing_downstream_file_is_refused_at_start_up_naming_its_key(tmp_path, shots):
    # zero-shot alone (the default) checked no downstream file: a missing eval_path failed after pre-training
    from i2d2.recipes.cmp import check_config

    missing = tmp_path / "nope.json"
    with pytest.raises(ConfigError, match=rf"^data\.downstream\.hotpotqa\.eval_path: downstream file "
                                          rf"{re.escape(str(missing))} not found"):
        check_config(_cmp_cfg(tmp_path, f"task.downstream.shots={shots}", "task.downstream.allow_fewer_shots=true",
                              f"data.downstream.hotpotqa.eval_path={missing}"))


def test_cmp_missing_corpus_is_refused_at_start_up(tmp_path):
    # was a DataError from load_quintuples in the first stage, after the run directory and the tracker were set up
    from i2d2.recipes.cmp import check_config

    missing = tmp_path / "nope.jsonl"
    with pytest.raises(ConfigError, match=rf"data\.corpus: quintuple file {re.escape(str(missing))} not found"):
        check_config(_cmp_cfg(tmp_path, f"data.corpus={missing}"))
    with pytest.raises(ConfigError, match=r"data\.corpus: quintuple file .*nope\.jsonl not found"):
        check_config(_cmp_cfg(tmp_path, "data.corpus=bundled:nope.jsonl"))
    # the split fractions are not read by a split_by=field run: any number is taken there (on a corpus whose rows
    # have their split: the bundled one has none, which check_config refuses for split_by=field)
    from i2d2.cmp.data import BUNDLED

    rows = [json.loads(r) for r in (BUNDLED / "corpus.jsonl").read_text(encoding="utf-8").splitlines()[:30]]
    fielded = tmp_path / "fielded.jsonl"
    fielded.write_text("".join(json.dumps({**r, "split": ("train", "validation", "test")[i % 3]}) + "\n"
                               for i, r in enumerate(rows)), encoding="utf-8")
    check_config(_cmp_cfg(tmp_path, "data.split_by=field", "data.val_fraction=0", f"data.corpus={fielded}"))
    with pytest.raises(ConfigError, match=r"data\.corpus: data\.split_by=field but 2683 quintuple"):
        check_config(_cmp_cfg(tmp_path, "data.split_by=field"))


def test_cmp_malformed_or_too_small_corpus_is_refused_at_start_up(tmp_path):
    # a broken row, or a corpus too small to split, was a traceback from the first stage, after the run lock and
    # the tracker had started (the run folder was left with a lock, a config and a W&B run)
    from i2d2.cmp.data import BUNDLED
    from i2d2.recipes.cmp import check_config

    rows = (BUNDLED / "corpus.jsonl").read_text(encoding="utf-8").splitlines()[:3]
    small = tmp_path / "small.jsonl"
    small.write_text("\n".join(rows) + "\n", encoding="utf-8")
    broken = tmp_path / "broken.jsonl"
    broken.write_text("\n".join(rows) + '\n{"e1": "x"}\nnot json\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"(?s)data\.corpus: .*{re.escape(str(broken))}:4: missing field 'e2'"
                                          rf".*{re.escape(str(broken))}:5: invalid JSON"):
        check_config(_cmp_cfg(tmp_path, f"data.corpus={broken}"))
    with pytest.raises(ConfigError, match=r"data\.corpus: .*need validation and test quintuples"):
        check_config(_cmp_cfg(tmp_path, f"data.corpus={small}"))


def test_zero_shot_base_model_does_not_depend_on_the_rng_state(tmp_path, monkeypatch):
    # packaged:minilm draws its cross-attention at random when loaded: the 'base' row of the zero-shot table came
    # from whatever state the RNG was in (after pre-training in a fresh run, before it in a rerun)
    import i2d2.recipes.cmp as rec
    from i2d2.models import tiny_model

    def warm_started(name):  # a tiny model with a part drawn from the caller's RNG state, as a warm start leaves it
        fresh = torch.randn(8)
        model, tok = tiny_model("t5")  # (seeds itself)
        with torch.no_grad():
            model.lm_head.weight[0, :8] = fresh
        return model, tok

    seen = []

    def fake_eval(model, *a, **k):
        seen.append(model.lm_head.weight.detach().clone())
        return {"em": 0.0, "f1": 0.0, "n": 1}, [{"template": "t", "question": "q", "answer": "a", "prediction": "b"}]

    class Tracker:
        def log_metrics(self, *a, **k):
            pass

        log_table = log_metrics

    monkeypatch.setattr(rec, "load_seq2seq", warm_started)
    monkeypatch.setattr(rec, "evaluate_synthetic_qa", fake_eval)
    cfg = _cmp_cfg(tmp_path, "task.eval.compare_base=true")
    splits, summaries = _cmp_inputs(cfg)
    bases = []
    for state in (1, 2):
        torch.manual_seed(state)
        seen.clear()
        rec.zero_shot_eval(cfg, splits, summaries, tmp_path / "model", tmp_path / f"eval{state}", Tracker())
        bases.append(seen[0])  # base first, then pretrained
    assert torch.equal(bases[0], bases[1])
    # the downstream zero-shot base is the same model
    seen.clear()
    monkeypatch.setattr(rec, "run_downstream", lambda loader, *a, **k: seen.append(loader()[0].lm_head.weight) or
                        {"metrics": {}, "model": "base"})
    rec.downstream(_cmp_cfg(tmp_path, "task.downstream.models=[base]", "task.downstream.datasets=[hotpotqa]"),
                   tmp_path / "model", tmp_path / "ds")
    assert torch.equal(seen[0], bases[0])


# ----------------------------------------------------------------------------- NegVerse


def _nv_cfg(tmp_path, *overrides):
    pairs = tmp_path / "pairs.tsv"
    if not pairs.exists():
        pairs.write_text("She likes apples.\tShe doesn't like apples.\tverbal\n"
                         "Everyone came.\tNobody came.\tnon_verbal\n"
                         "The child was happy.\tThe child was unhappy.\taffixal\n"
                         "He reads books.\tHe never reads books.\tverbal\n")
    ev = tmp_path / "eval.txt"
    if not ev.exists():
        ev.write_text("The dog is hungry.\n")
    return _cfg("task=negverse", "model=tiny_gpt2", "logger=none", f"run_dir={tmp_path / 'run'}", f"data.pairs={pairs}",
                "data.use_rules=false", f"data.eval_sentences={ev}", "task.prompt.num_virtual_tokens=2",
                "task.train.val_fraction=0.3", "task.train.batch_size=2",
                "+trainer.enable_progress_bar=false", "+trainer.enable_model_summary=false", *overrides)


def test_negverse_empty_eval_file_is_refused_before_training(tmp_path):
    # it was found only after training, as a traceback not naming the file: "negate: no sentences to negate"
    from i2d2.recipes.negverse import check_config

    check_config(_nv_cfg(tmp_path))
    (tmp_path / "eval.txt").write_text("# to do\n\n")
    with pytest.raises(ConfigError, match=r"data.eval_sentences: .*eval.txt holds no sentences"):
        check_config(_nv_cfg(tmp_path))
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        check_config(_nv_cfg(tmp_path, f"data.eval_sentences={tmp_path / 'missing.txt'}"))


@pytest.mark.parametrize("key", ["eval_sentences", "affirmatives", "pairs"])
def test_negverse_a_data_file_that_is_no_path_is_refused_naming_its_key(tmp_path, key):
    # data.eval_sentences=3 was 'error: expected str, bytes or os.PathLike object, not int', naming no key
    from i2d2.recipes.negverse import check_config

    with pytest.raises(ConfigError, match=rf"^data\.{key}: must be a file path, or null for the bundled .*, got 3$"):
        check_config(_nv_cfg(tmp_path, f"data.{key}=3", "data.use_rules=true"))


@pytest.mark.parametrize("override, message", [
    # silently accepted: a negative weight decay pushed the prompt away from zero, warmup_steps=-1 was read as 1
    ("task.train.weight_decay=-1", r"task\.train\.weight_decay: must be >= 0, got -1"),
    ("task.train.warmup_steps=-1", r"task\.train\.warmup_steps: must be an integer >= 0, got -1"),
    ("task.train.warmup_steps=2.5", r"task\.train\.warmup_steps: must be an integer >= 0, got 2\.5"),
])
def test_negverse_train_values_are_refused_at_start_up(tmp_path, override, message):
    from i2d2.recipes.negverse import check_config

    check_config(_nv_cfg(tmp_path, "task.train.warmup_steps=0", "task.train.weight_decay=0.01"))  # both allowed
    with pytest.raises(ConfigError, match=message):
        check_config(_nv_cfg(tmp_path, override))


@pytest.mark.parametrize("key", ["eval_sentences", "affirmatives", "pairs"])
def test_a_missing_negverse_data_file_is_refused_naming_its_key(tmp_path, key):
    # was "error: NegVerse data file <path> not found": which of the three keys named it was left to guess
    from i2d2.recipes.negverse import check_config

    missing = tmp_path / "nope.txt"
    with pytest.raises(FileNotFoundError, match=rf"data\.{key}: NegVerse data file {re.escape(str(missing))} not found"):
        check_config(_nv_cfg(tmp_path, f"data.{key}={missing}", "data.use_rules=true"))  # affirmatives: read with rules


def test_negverse_cue_lexicon_is_read_at_start_up(tmp_path):
    # a missing lexicon was found by the evaluation stage, after training, as a FileNotFoundError traceback
    from i2d2.recipes.negverse import check_config

    missing = tmp_path / "cues.yaml"
    path = re.escape(str(missing))
    with pytest.raises(ConfigError, match=rf"task\.cue_lexicon: negation cue lexicon {path} not found"):
        check_config(_nv_cfg(tmp_path, f"task.cue_lexicon={missing}"))
    missing.write_text("verbal: [not]\n")  # a lexicon without its other sections
    with pytest.raises(ConfigError, match=rf"task\.cue_lexicon: {path}: missing top-level field 'non_verbal'"):
        check_config(_nv_cfg(tmp_path, f"task.cue_lexicon={missing}"))
    missing.write_text("verbal: [not\n")  # not YAML
    with pytest.raises(ConfigError, match=rf"task\.cue_lexicon: while parsing .*{path}"):
        check_config(_nv_cfg(tmp_path, f"task.cue_lexicon={missing}"))


@pytest.fixture(scope="module")
def nlp():
    from i2d2.models import load_spacy

    return load_spacy("packaged:spacy-sm")


def test_negverse_no_training_examples_names_the_pairs_file(tmp_path, nlp):
    # was "no training example fits max_length; raise task.train.max_length" from the training stage
    from i2d2.io import DataError
    from i2d2.recipes.negverse import data_stage

    (tmp_path / "pairs.tsv").write_text("# nothing yet\n")
    with pytest.raises(DataError, match=r"pairs.tsv: no training examples \(0 pair"):
        data_stage(_nv_cfg(tmp_path), nlp, tmp_path / "data")


def test_negverse_epoch_schedule_counts_optimizer_steps(tmp_path, nlp, monkeypatch):
    # with gradient accumulation the cosine schedule's length was the number of batches, twice the optimiser steps
    # here, so the learning rate never decayed past the middle of its schedule
    import trainers.negverse as tn
    from i2d2.recipes.negverse import data_stage, train_stage

    totals = []

    class Module(tn.NegVerseModule):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            totals.append(k["total_steps"])

    monkeypatch.setattr(tn, "NegVerseModule", Module)
    cfg = _nv_cfg(tmp_path, "task.train.max_steps=-1", "task.train.epochs=2", "trainer.accumulate_grad_batches=2")
    data_stage(cfg, nlp, tmp_path / "data")
    out = train_stage(cfg, tmp_path / "data", tmp_path / "train", None)
    assert out["steps"] >= 2 and totals == [out["steps"]]


def test_negverse_eval_metrics_reach_the_logger_once(tmp_path, nlp, monkeypatch):
    # eval_stage logged every metric as negverse/<k> and publish_report again as negverse/eval/<k>: two columns each
    import i2d2.negverse.metrics as nm
    import i2d2.negverse.pipeline as pipe
    from i2d2.negverse.model import NegVerseLM
    from i2d2.recipes.negverse import eval_stage
    from i2d2.tracking import Tracker

    row = {"original": "The dog is hungry.", "negation": "The dog is not hungry.", "negation_type": "verbal",
           "masked": "[BLANK]", "lev_distance": 0.1}
    monkeypatch.setattr(NegVerseLM, "load", classmethod(lambda cls, *a, **k: None))
    monkeypatch.setattr(pipe, "negate", lambda *a, **k: ([row], [], {"n_kept": 1, "keep_rate": 0.5}))
    monkeypatch.setattr(nm, "negation_metrics", lambda kept, nlp: {"n": 1})

    class Recorder:
        def __init__(self):
            self.keys = []

        def log_metrics(self, metrics, step=None):
            self.keys += list(metrics)

    tracker = Tracker(Recorder())
    tracker.log_table = lambda *a, **k: None
    eval_stage(_nv_cfg(tmp_path), nlp, tmp_path / "adapter", tmp_path / "eval", tracker)
    assert tracker.loggers[0].keys == []


def test_negverse_pairs_tsv_given_as_eval_sentences_is_refused(tmp_path):
    # it was read as sentences like 'She likes apples.\tShe doesn't like apples.\tverbal' and trained and evaluated
    # on: the held-out check compared whole lines, so these training pairs passed as held-out sentences
    from i2d2.config import ConfigError
    from i2d2.negverse.data import read_sentences
    from i2d2.recipes.negverse import check_config

    cfg = _nv_cfg(tmp_path, f"data.eval_sentences={tmp_path / 'pairs.tsv'}")
    with pytest.raises(ConfigError, match=r"^data\.eval_sentences: .*pairs.tsv:1: a tab in a one-sentence-a-line file"):
        check_config(cfg)
    # a trailing tab, or a line of whitespace, is no second column: such files were read before the check came
    (tmp_path / "ev.txt").write_text("The dog is hungry.\t\n\t\nShe likes tea.\n")
    assert read_sentences(tmp_path / "ev.txt") == ["The dog is hungry.", "She likes tea."]


def test_negverse_report_names_the_eval_file_and_flags_the_bundled_one_however_given(tmp_path, monkeypatch):
    # the note that the filters were written from the bundled sentences depended on data.eval_sentences being
    # unset: the same file given by its path was reported as a fresh measurement; the heading named no file
    import i2d2.recipes.negverse as rn
    from i2d2.negverse.data import DATA_DIR

    reports = []
    monkeypatch.setattr(rn, "run_stage", lambda out, fp, fn, name: {"n_sentences": 16})
    monkeypatch.setattr(rn, "publish_report", lambda run_dir, summary, text, *a, **k: reports.append(text))
    monkeypatch.setattr("i2d2.models.load_spacy", lambda name: None)
    for given in (str(DATA_DIR / "eval_sentences.txt"), str(tmp_path / "eval.txt")):
        rn._run(_nv_cfg(tmp_path, f"data.eval_sentences={given}"), rn.Tracker())
    assert "16 sentences of `bundled eval_sentences.txt`" in reports[0] and rn.BUNDLED_EVAL_NOTE in reports[0]
    assert f"16 sentences of `{tmp_path / 'eval.txt'}`" in reports[1] and rn.BUNDLED_EVAL_NOTE not in reports[1]
