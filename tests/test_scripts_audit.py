"""Regressions from an audit of scripts/ and callbacks/: each test failed before its fix.

Scripts are imported from scripts/ (as tests/test_compare_saved_models.py does) and run in-process with small
inputs; nothing here loads more than the tiny GPT-2 or computes LM features.
"""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def scripts(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))


class _WriteInterrupted(Exception):
    pass


@pytest.fixture
def interrupt_write(monkeypatch):
    """Make the atomic writer (i2d2.io.atomic_path) stop with its new content complete but not yet in place, as a
    kill there would: returns a function that arms it for one file name. A plain write never gets there."""
    import i2d2.io

    def arm(name: str):
        def fault(point):
            if point == f"write:{name}":
                raise _WriteInterrupted(point)

        monkeypatch.setattr(i2d2.io, "fault_point", fault)

    return arm


# ----------------------------------------------------------------------------- callbacks

def test_pr_curve_callback_plots_the_validation_epoch_it_names(tmp_path, monkeypatch):
    """Lightning runs a callback's on_validation_epoch_end before the module's, where CriticModule stores the
    epoch's (labels, scores): the callback drew the sanity check's scores as "epoch 0", epoch 0's as "epoch 1", and
    never the last epoch."""
    import lightning as L

    import callbacks.pr_curve as pr_curve
    from callbacks.pr_curve import PRCurveCallback

    drawn = []  # (epoch in the title, the epoch the scores came from)
    monkeypatch.setattr(pr_curve, "plot_pr_curves",
                        lambda curves, path, title: drawn.append((title, int(curves["model"][1][0]))))
    monkeypatch.setattr(pr_curve, "plot_score_histogram", lambda *a, **k: None)

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)
            self.val_result = None

        def training_step(self, batch, _):
            return self.layer(batch[0]).pow(2).mean()

        def validation_step(self, batch, _):
            pass

        def on_validation_epoch_end(self):  # as CriticModule: this epoch's labels and scores; -1 = sanity check
            source = -1 if self.trainer.sanity_checking else self.current_epoch
            self.val_result = (np.array([0, 1, 0, 1]), np.full(4, float(source)))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(2, 1)), batch_size=2)
    trainer = L.Trainer(max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=1,
                        callbacks=[PRCurveCallback(tmp_path)])
    trainer.fit(Module(), data, data)
    assert drawn == [("val PR curve (epoch 0)", 0), ("val PR curve (epoch 1)", 1)]
    with pytest.raises(ValueError, match="every_n_epochs"):
        PRCurveCallback(tmp_path, every_n_epochs=0)  # was a ZeroDivisionError at the first validation


def _base_rate_lines(monkeypatch, curves):
    import callbacks.plots as plots

    figs = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figs.append(fig))
    plots.plot_pr_curves(curves, "unused.png")
    ax = figs[0].axes[0]
    return sorted(round(float(line.get_ydata()[0]), 3) for line in ax.get_lines() if line.get_linestyle() == ":")


def test_pr_curves_show_each_curves_own_base_rate(monkeypatch):
    """The base-rate line came from the first curve alone; the report's per-iteration curves are measured on
    different statements, so the others were drawn against a base rate that was not theirs."""
    y_a, y_b = [0, 1, 1, 1], [0, 0, 0, 1]
    s = [0.1, 0.2, 0.3, 0.4]
    assert _base_rate_lines(monkeypatch, {"iteration 0": (y_a, s), "iteration 1": (y_b, s)}) == [0.25, 0.75]
    assert _base_rate_lines(monkeypatch, {"critic": (y_a, s), "surface": (y_a, s[::-1])}) == [0.75]  # one set: one line


# ----------------------------------------------------------------------------- compare_saved_models

def _save(model, tok, run: Path, it: int):
    d = run / f"iter_{it}" / "model"
    model.save_pretrained(d)
    tok.save_pretrained(d)


def test_compare_saved_models_fails_a_run_missing_an_iteration(tmp_path, tiny_gpt2, scripts, interrupt_write):
    """A run killed before its last iteration lost that row and exited 0 beside a complete run."""
    import compare_saved_models as C

    model, tok = tiny_gpt2
    for it in (0, 1):
        _save(model, tok, tmp_path / "full", it)
    _save(model, tok, tmp_path / "killed", 0)
    assert C.main([str(tmp_path / "full"), str(tmp_path / "full")]) == 0
    assert C.main([str(tmp_path / "full"), str(tmp_path / "killed")]) == 1
    assert C.main([str(tmp_path / "full"), str(tmp_path / "killed"), "--iteration", "1"]) == 1
    assert C.main([str(tmp_path / "full"), str(tmp_path / "killed"), "--iteration", "0"]) == 0

    out = tmp_path / "compare.json"  # --json is written atomically: an interrupted write leaves the old file
    out.write_text("old")
    interrupt_write("compare.json")
    with pytest.raises(_WriteInterrupted):
        C.main([str(tmp_path / "full"), "--iteration", "0", "--json", str(out)])
    assert out.read_text() == "old"


# ----------------------------------------------------------------------------- label_agreement

def test_label_agreement_names_an_unknown_sample_and_counts_the_second_labellers_kept(scripts, capsys):
    import label_agreement

    with pytest.raises(SystemExit, match=r"--sample 'randm'.*random"):  # was sklearn's "Found empty input array"
        label_agreement.main(["--sample", "randm"])
    res = label_agreement.main(["--sample", "random"])
    pairs = [p for p in label_agreement.paired_labels(label_agreement.ANNOTATIONS / "generics_gemma.jsonl",
                                                      label_agreement.ANNOTATIONS / "generics_gemma.second_pass.jsonl",
                                                      "random") if "dont_know" not in p[1:]]
    kept = sum(p[2] == "true" for p in pairs)
    assert res["second_n_valid"] == kept  # precision is over these: reported with it
    assert f"({kept} of {res['n']} kept)" in capsys.readouterr().out


def test_label_agreement_refuses_a_missing_or_broken_file_without_a_traceback(tmp_path, scripts, capsys):
    import label_agreement

    (tmp_path / "broken.jsonl").write_text('{"statement": "Dogs bark.", "critic_score": 0.5}\n{"statement": 1\n')
    for path, said in ((tmp_path / "none.jsonl", "No such file"), (tmp_path / "broken.jsonl", "broken.jsonl:2:")):
        with pytest.raises(SystemExit) as e:
            label_agreement.main(["--scores", str(path)])
        assert e.value.code == 2 and said in capsys.readouterr().err


# ----------------------------------------------------------------------------- label-set builders

def test_comparatives_labelset_refuses_zero_chunks_before_writing(tmp_path, scripts):
    """--chunks 0 wrote to_label.jsonl and sources.json, then ended in ZeroDivisionError."""
    import make_comparatives_labelset

    it = tmp_path / "run" / "iter_0"
    (it / "filtered" / "candidates").mkdir(parents=True)
    (it / "config.yaml").write_text("task: comparatives\n")
    rows = [{"statement": f"Compared to cats, dogs are {w}.", "prompt": "Compared to cats, dogs", "entity1": "cat",
             "entity2": "dog", "class": "animal"} for w in ("bigger", "louder", "friendlier")]
    (it / "filtered" / "candidates" / "kept.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "label"
    with pytest.raises(SystemExit) as e:
        make_comparatives_labelset.main(["--runs", str(tmp_path / "run"), "--out", str(out), "--chunks", "0"])
    assert e.value.code == 2 and not out.exists()


def test_generics_labelset_checks_forms_and_chunks_before_generating(tmp_path, scripts, capsys):
    """A misspelt --forms gave its nouns no prompt (and crashed in randrange on a related concept); --chunks 0 was
    a ZeroDivisionError after the whole generation."""
    import make_generics_labelset

    for bad in (["--forms", "bare_plurall"], ["--chunks", "0"]):
        with pytest.raises(SystemExit) as e:
            make_generics_labelset.main(["--out", str(tmp_path / "ls"), "--dry-run", *bad])
        assert e.value.code == 2 and bad[0] in capsys.readouterr().err
    assert not (tmp_path / "ls").exists()


# ----------------------------------------------------------------------------- argument checks of the experiments

def test_bench_decoding_checks_its_numbers_before_loading_a_model(scripts, monkeypatch, capsys):
    import bench_decoding

    monkeypatch.setattr(bench_decoding, "run_model", lambda *a: pytest.fail("a model ran with invalid arguments"))
    for bad, flag in ((["--repeats", "0"], "--repeats"), (["--batch", "0"], "--batch"),
                      (["--min-new-tokens", "5", "--max-new-tokens", "3"], "--min-new-tokens"),
                      (["--models", ""], "--models"), (["--models", "tiny:gpt2,tiny:gpt22"], "--models")):
        with pytest.raises(SystemExit) as e:
            bench_decoding.main(["--models", "tiny:gpt2", *bad])
        assert e.value.code == 2 and flag in capsys.readouterr().err


def test_fewshot_context_checks_variants_before_computing_features(scripts, monkeypatch, capsys):
    """An unknown --variants name was a KeyError after the plain probe's features (minutes of Gemma)."""
    import critics.probe
    import i2d2.models

    for where, name in ((critics.probe, "probe_lm_features"), (i2d2.models, "load_causal_lm")):
        monkeypatch.setattr(where, name, lambda *a, **k: pytest.fail("LM loaded before the arguments were checked"))
    import critic_fewshot_context

    for bad, flag in ((["--variants", "k16,k99"], "--variants"), (["--cv", "--folds", "1"], "--folds"),
                      (["--cv", "--layers", "8,,12"], "--layers"), (["--cv", "--contexts", "k20,k33"], "--contexts")):
        with pytest.raises(SystemExit) as e:
            critic_fewshot_context.main(bad)
        assert e.value.code == 2 and flag in capsys.readouterr().err


def _labelled_rows(n_concepts: int = 80):
    """(rows, texts, ys, (train, dev, test)) as critics.train.labelled_splits returns them: every concept has one
    statement of each label; the last ten concepts are dev and test."""
    labels = ["true", "false", "too_vague_to_judge", "episodic", "ad_copy"]
    rows = [{"statement": f"Thing {c} is {lab.replace('_', ' ')}.", "concept": f"c{c}", "label": lab,
             "y": int(lab == "true")} for c in range(n_concepts) for lab in labels]
    texts = [r["statement"] for r in rows]
    idx = np.arange(len(rows))
    cut = [5 * (n_concepts - 10), 5 * (n_concepts - 5)]
    return rows, texts, np.array([r["y"] for r in rows]), tuple(np.split(idx, cut))


def test_fewshot_context_larger_contexts_are_the_critics_draws_and_refused_where_they_do_not_fit(
        scripts, monkeypatch, capsys):
    """k20 / k32 / k64 are the contexts critic.probe_context.examples=20 / 32 / 64 builds (critics.probe.probe_context),
    and --cv --contexts refuses one that would not fit the LM (as the critic raises), before any features."""
    import copy

    from hydra import compose, initialize_config_dir

    import critics.probe
    import critics.train
    import i2d2.models
    from critics.probe import item_ids, probe_context
    from critics.train import critic_config

    import critic_fewshot_context as fs

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        c = critic_config(compose(config_name="train").critic)
    rows, texts, ys, (tr, dv, te) = _labelled_rows()
    model, tok = i2d2.models.tiny_model("gemma")
    prefixes = {}
    for name, k in (("k16", 16), ("k20", 20), ("k32", 32), ("k64", 64)):
        prefix, ex, text = fs.build_prefix(tok, c, name, rows, texts, tr)
        cc = copy.deepcopy(c)
        cc["probe_context"]["examples"] = k
        assert (text, ex) == probe_context(cc, rows, texts, tr) and len(ex) == k
        assert sum(ys[ex]) == k // 2 and {rows[i]["concept"] for i in ex} <= {rows[i]["concept"] for i in tr}
        prefixes[name] = len(prefix)
    # a window that takes k20's context and a max_length statement, not k32's
    window = prefixes["k20"] + len(item_ids(tok, "")[0]) + int(c["max_length"])
    assert window < prefixes["k32"]
    model.config.sliding_window = window
    model.config.max_position_embeddings = 4 * prefixes["k64"]
    assert fs.contexts_too_long(model, tok, c, ["k16", "k20"], rows, texts, tr) == []
    too_long = fs.contexts_too_long(model, tok, c, ["k20", "k32", "k64"], rows, texts, tr)
    assert [m.split(":")[0] for m in too_long] == ["k32", "k64"] and all("sliding window" in m for m in too_long)

    monkeypatch.setattr(critics.train, "labelled_splits", lambda *a, **k: (rows, texts, ys, (tr, dv, te), 0))
    monkeypatch.setattr(i2d2.models, "load_causal_lm", lambda *a, **k: (model, tok))
    for name in ("lm_features", "context_features"):
        monkeypatch.setattr(critics.probe, name, lambda *a, **k: pytest.fail("features computed before the check"))
        monkeypatch.setattr(fs, name, lambda *a, **k: pytest.fail("features computed before the check"), raising=False)
    assert fs.main(["--cv", "--contexts", "k20,k32", "--cache-dir", "unused"]) == 2
    err = capsys.readouterr().err
    assert "error: --contexts: k32: critic.probe_context: the context" in err and "k20:" not in err
    assert fs.main(["--variants", "k16,k64"]) == 2  # the dev pick too, before the plain probe's features
    assert "error: --variants: k64: " in capsys.readouterr().err


# ----------------------------------------------------------------------------- bench_filter_memory

def test_bench_filter_memory_rebuilds_its_table_for_other_concepts(tmp_path, scripts, monkeypatch):
    """The synthetic table was reused whenever --rows matched, so a run with other --concepts measured the old
    table."""
    import subprocess

    import bench_filter_memory

    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, stdout="{}\n"))
    work = tmp_path / "work"
    for n_concepts in (3, 7):
        bench_filter_memory.main(["--rows", "60", "--concepts", str(n_concepts), "--work", str(work), "--only", "arrow"])
        rows = [json.loads(line) for line in (work / "generations" / "generations.jsonl").read_text().splitlines()]
        assert len(rows) == 60 and len({r["concept"] for r in rows}) == n_concepts


# ----------------------------------------------------------------------------- atomic outputs

def test_prompt_form_yield_replaces_its_output_atomically(tmp_path, scripts, interrupt_write):
    """By default the script rewrites the bundled prompt_form_yield.json: a write cut short must leave it whole."""
    import prompt_form_yield

    out = tmp_path / "yield.json"
    out.write_text("old")
    interrupt_write("yield.json")
    with pytest.raises(_WriteInterrupted):
        prompt_form_yield.main(["--out", str(out)])
    assert out.read_text() == "old"


def test_eval_contradiction_writes_its_metrics_atomically(tmp_path, scripts, monkeypatch, interrupt_write):
    import eval_contradiction

    metrics = {"n_judged": 1, "n_scored": 1, "label_counts": {}, "cross_encoder_average_precision": None,
               "results": {}}
    monkeypatch.setattr(eval_contradiction, "evaluate", lambda judged, ce_cfg: metrics)  # no cross-encoder fit here
    judged = tmp_path / "judged.jsonl"
    judged.write_text(json.dumps({"id": "p-000", "premise": "a", "hypothesis": "b", "label": "neutral"}) + "\n")
    out = tmp_path / "metrics.json"
    out.write_text("old")
    interrupt_write("metrics.json")
    with pytest.raises(_WriteInterrupted):
        eval_contradiction.main(["eval", "--judged", str(judged), "--out", str(out)])
    assert out.read_text() == "old"


def test_eval_contradiction_flags_the_judged_set_that_chose_the_rule(tmp_path, scripts, monkeypatch, capsys):
    """eval's default judged file is the set the lexicon rule's reading was fixed from: its 'offline' precision and
    recall came out as on the fresh set, with no word that the rows chose the rule."""
    import shutil

    import eval_contradiction

    metrics = {"n_judged": 1, "n_scored": 1, "label_counts": {}, "cross_encoder_average_precision": None,
               "results": {}}
    monkeypatch.setattr(eval_contradiction, "evaluate", lambda judged, ce_cfg: metrics)  # no cross-encoder fit here
    copy = shutil.copy(eval_contradiction.JUDGED, tmp_path / "copy.jsonl")
    for judged, chose in ((eval_contradiction.JUDGED, True), (copy, True),
                          (eval_contradiction.DATA / "contradiction_pairs_2.jsonl", False)):
        out = tmp_path / "metrics.json"
        eval_contradiction.main(["eval", "--judged", str(judged), "--out", str(out)])
        got = json.loads(out.read_text())
        assert got["chose_the_rule"] is chose and ("no measurement" in got.get("note", "")) is chose, judged
        assert ("no measurement" in capsys.readouterr().err) is chose


def _critic_script_on_tiny_gemma(monkeypatch, rows, texts, ys, splits):
    """A critic experiment script's inputs: these labelled rows for the default critic's split, and the tiny Gemma
    (a window wide enough for any context, the probe read at its layer 1 of 2) for its LM."""
    import critics.train
    import i2d2.models

    model, tok = i2d2.models.tiny_model("gemma")
    model.config.sliding_window = model.config.max_position_embeddings = 4096
    monkeypatch.setattr(critics.train, "labelled_splits", lambda *a, **k: (rows, texts, ys, splits, 0))
    config = critics.train.critic_config
    monkeypatch.setattr(critics.train, "critic_config", lambda cfg: {**config(cfg), "probe_layer": 1})  # 2 layers
    monkeypatch.setattr(i2d2.models, "load_causal_lm", lambda *a, **k: (model, tok))


def test_fewshot_context_cv_compares_a_larger_context_with_k16_fold_by_fold(scripts, monkeypatch, capsys, tmp_path):
    """--cv --contexts k20 end to end on the tiny Gemma (features computed, cached, fitted): the table gives every
    variant's per-fold CV AP, and k20 is compared with k16 stmt|judge under the adoption rule."""
    import critic_fewshot_context as fs

    _critic_script_on_tiny_gemma(monkeypatch, *_labelled_rows(40))
    assert fs.main(["--cv", "--contexts", "k16,k20", "--cache-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    cached = sorted(p.name for p in tmp_path.glob("*.npz"))
    assert cached == [f"features_{v}.npz" for v in ("k0", "k16", "k20", "plain")]
    per_fold = out.split("per-fold CV AP (each at its CV-best C), folds 1..5:\n")[1].split("\n\n")[0].splitlines()
    assert [line.split()[0] for line in per_fold] == ["plain", "k16", "k16", "k16", "k0", "k20"]
    assert all(len(line.split()) == 2 + 5 and all(0 <= float(x) <= 1 for x in line.split()[2:]) for line in per_fold)
    rule = [line for line in out.splitlines() if line.startswith("  k20 stmt|judge       CV AP")]
    assert len(rule) == 1 and rule[0].count("+") + rule[0].count("-") >= 5 and "rule " in rule[0]
    decision = out.split("decision: ")[1].splitlines()[0]
    assert decision in ("k16 stays the default", "k20 stmt|judge replaces k16")
    assert ("not met" in rule[0]) == (decision == "k16 stays the default")


def test_fewshot_context_adoption_rule():
    """A larger context replaces k16 only if it beats k16 on at least 4 of 5 folds and by more than 0.01 mean."""
    from critic_fewshot_context import adoption

    assert adoption(np.array([0.02, 0.02, 0.02, 0.02, -0.01])) == (4, pytest.approx(0.014), True)
    assert not adoption(np.array([0.02, 0.02, 0.02, -0.01, -0.01]))[2]  # 3 of 5
    assert not adoption(np.array([0.01, 0.01, 0.01, 0.01, 0.01]))[2]  # mean not above 0.01


# ----------------------------------------------------------------------------- critic_comparatives_context

def _comparative_rows(n_pairs: int = 40):
    """(rows, texts, ys, (train, dev, test)) of comparatives as labelled_splits returns them: every entity pair
    ("aN | bN", entities shared by no other pair) has one statement of each of the six-label map's used labels; the
    last ten pairs are dev and test."""
    labels = ["true", "false", "too_vague_to_judge", "invalid", "too_subjective_to_judge"]
    rows = [{"statement": f"Compared to a{p}, b{p} are {lab.replace('_', ' ')}.", "concept": f"a{p} | b{p}",
             "label": lab, "y": int(lab == "true"), "prompt": f"Compared to a{p}, b{p}"}
            for p in range(n_pairs) for lab in labels]
    texts = [r["statement"] for r in rows]
    cut = [5 * (n_pairs - 10), 5 * (n_pairs - 5)]
    return rows, texts, np.array([r["y"] for r in rows]), tuple(np.split(np.arange(len(rows)), cut))


def test_comparatives_context_cv_end_to_end_on_the_tiny_gemma(scripts, monkeypatch, capsys, tmp_path):
    """scripts/critic_comparatives_context.py on the tiny Gemma (features computed and cached, probes and the surface
    classifier fitted on each grouped fold of two partitions): every variant's per-fold CV AP, the rule's verdict
    (matching ``adoption`` on the printed numbers) and the test description come out; the examples are the critic's
    own draw (critics.probe.probe_context) from each CV training fold, with the comparatives instruction."""
    import critics.probe

    import critic_comparatives_context as cc

    rows, texts, ys, splits = _comparative_rows()
    _critic_script_on_tiny_gemma(monkeypatch, rows, texts, ys, splits)
    drawn = []
    real = critics.probe.probe_context

    def spy(cfg, rows_, texts_, train_idx):
        out = real(cfg, rows_, texts_, train_idx)
        drawn.append((cfg["probe_context"], set(np.asarray(train_idx).tolist()), out))
        return out

    monkeypatch.setattr(critics.probe, "probe_context", spy)
    assert cc.main(["--seeds", "0,1", "--ks", "8,16", "--cache-dir", str(tmp_path), "--describe-test"]) == 0
    out = capsys.readouterr().out
    assert list(tmp_path.glob("features_*.npz"))
    # 2 partitions x 5 folds x 2 sizes, then 2 x 2 for the test description; each from its training rows only,
    # with the comparatives instruction and every label the map makes invalid
    assert len(drawn) == 2 * 5 * 2 + 2 * 2
    pool = set(np.concatenate(splits[:2]).tolist())
    for pc, train_idx, (text, ex) in drawn:
        assert pc["instruction"] == cc.INSTRUCTION and text.startswith(cc.INSTRUCTION) and pc["not_true"] == []
        assert set(ex) <= train_idx <= pool and len(ex) == pc["examples"] and sum(ys[ex]) == pc["examples"] // 2
        assert {rows[i]["label"] for i in ex if not ys[i]} == {"false", "too_vague_to_judge", "invalid",
                                                             "too_subjective_to_judge"}
    table = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 7 and parts[0] in ("0", "1") and parts[1] in ("plain", "k0", "k8", "k16", "surface"):
            nums = parts[3:8] if parts[1] != "surface" else parts[2:7]
            table[(int(parts[0]), parts[1])] = np.array([float(x) for x in nums])
    assert set(table) == {(s, v) for s in (0, 1) for v in ("plain", "k0", "k8", "k16", "surface")}
    assert all(((0 <= a) & (a <= 1)).all() for a in table.values())
    for v in ("k8", "k16"):
        verdict = cc.adoption(np.array([table[(s, v)] - table[(s, "plain")] for s in (0, 1)]),
                              np.array([table[(s, v)] for s in (0, 1)]),
                              np.array([table[(s, "surface")] for s in (0, 1)]))
        line = next(x for x in out.splitlines() if x.startswith(f"  {v:6s} minus plain"))
        assert line.endswith("rule met" if verdict["adopt"] else "rule not met")
    decision = out.split("decision: ")[1].splitlines()[0]
    assert decision in ("no context adopted; the default stays examples: 0", "k8 becomes the comparatives default",
                        "k16 becomes the comparatives default")
    assert len([x for x in out.splitlines() if x.startswith("  seed ") and "surface" in x]) == 2


def test_comparatives_context_adoption_rule_and_arguments(scripts):
    """The rule set before measuring: >= 4 of 5 folds above plain in most partitions, > 0.02 mean, above the surface
    floor in CV; bad arguments are refused before the LM loads."""
    from critic_comparatives_context import adoption, main

    win = np.array([[0.05, 0.05, 0.05, 0.05, -0.01]] * 4)
    ap, floor = np.full((4, 5), 0.6), np.full((4, 5), 0.5)
    assert adoption(win, ap, floor)["adopt"]
    assert not adoption(win, ap, np.full((4, 5), 0.61))["adopt"]  # under the surface floor
    assert not adoption(win / 5, ap, floor)["adopt"]  # mean 0.008
    two = np.array([[0.05, 0.05, 0.05, -0.01, -0.01]] * 2 + [[0.1] * 5] * 2)
    assert not adoption(two, ap, floor)["adopt"]  # 2 of 4 partitions at 4 of 5 folds
    assert adoption(np.array([[0.05, 0.05, 0.05, -0.01, -0.01]] + [[0.1] * 5] * 3), ap, floor)["adopt"]  # 3 of 4
    gap = win.copy()
    gap[0, 4] = np.nan  # a fold where the critic's draw refused the context: no win, and not adoptable as it stands
    out = adoption(gap, ap, floor)
    assert not out["adopt"] and out["drawn"] == 19 and out["wins"][0] == 4
    assert out["mean_gain"] == pytest.approx(0.77 / 19)
    for bad in (["--ks", "7"], ["--ks", "0"], ["--folds", "1"], ["--seeds", ""]):
        with pytest.raises(SystemExit):
            main(bad)


def test_both_label_set_scripts_share_one_labelling_round(tmp_path, scripts):
    """make_generics_labelset and make_comparatives_labelset each wrote the chunks and read the labels back in
    their own copy of the same lines (scripts/labelset_chunks.py is the one place now)."""
    import make_comparatives_labelset
    import make_generics_labelset
    from labelset_chunks import labelled_items, write_chunks

    from i2d2.io import read_jsonl, write_jsonl

    assert make_generics_labelset.write_chunks is write_chunks
    it = tmp_path / "run" / "iter_0"
    (it / "filtered" / "candidates").mkdir(parents=True)
    (it / "config.yaml").write_text("task: comparatives\n")
    rows = [{"statement": f"Compared to cats, dogs are {w}.", "prompt": "Compared to cats, dogs", "entity1": "cat",
             "entity2": "dog", "class": "animal"} for w in ("bigger", "louder", "friendlier")]
    write_jsonl(it / "filtered" / "candidates" / "kept.jsonl", rows)
    make_comparatives_labelset.main(["--runs", str(tmp_path / "run"), "--out", str(tmp_path / "nc"), "--chunks", "2"])
    with pytest.raises(SystemExit, match=rf"{tmp_path / 'nc'}: \d statements have no label yet"):
        labelled_items(tmp_path / "nc")  # what --merge reads: the chunks the script wrote, by the one reader
    items = [{"statement": f"Dogs bark {i}.", "concept": "dog", "form": "plain"} for i in range(5)]
    write_chunks(tmp_path, items, 2)
    chunks = [read_jsonl(tmp_path / "chunks" / f"chunk_{c}.jsonl") for c in range(2)]
    assert [[r["id"] for r in ch] for ch in chunks] == [[0, 1, 2], [3, 4]]
    assert all(set(r) == {"id", "statement"} for ch in chunks for r in ch)  # no form, score or prompt kind
    assert read_jsonl(tmp_path / "to_label.jsonl") == items
    write_jsonl(tmp_path / "chunks" / "chunk_0.labels.jsonl", [{"id": i, "label": "True"} for i in range(3)])
    with pytest.raises(SystemExit, match=rf"{tmp_path}: 2 statements have no label yet \(first ids: \[3, 4\]\)"):
        labelled_items(tmp_path)
    write_jsonl(tmp_path / "chunks" / "chunk_1.labels.jsonl", [{"id": 4, "label": "False"}, {"id": 3, "label": "True"}])
    assert labelled_items(tmp_path) == [(r, "False" if i == 4 else "True") for i, r in enumerate(items)]


def test_label_agreement_reads_the_comparatives_second_pass(scripts, capsys):
    """The comparatives labels' blind second pass covers every labelled statement once, with the paper's six labels;
    --comparatives measures agreement with True as the one valid label and Too unfamiliar left out, and the measure
    can fail (labels paired with another statement's agree by chance only)."""
    import label_agreement

    first, second, valid, left_out = label_agreement.LABEL_SETS["comparatives"]
    six = {"True", "False", "Invalid", "Too vague to judge", "Too subjective to judge", "Too unfamiliar to judge"}
    rows = [json.loads(line) for line in second.open()]
    assert sorted(r["statement"] for r in rows) == sorted(json.loads(line)["statement"] for line in first.open())
    assert {r["label"] for r in rows} == six and all("blind" in r["annotator"] for r in rows)
    res = label_agreement.main(["--comparatives"])
    pairs = label_agreement.paired_labels(first, second, None)
    assert res["n"] == sum(left_out not in p[1:] for p in pairs) and res["n_labels"] == 5
    assert 0.6 < res["kappa_valid"] <= 1 and res["second_n_valid"] == sum(p[2] == valid for p in pairs
                                                                          if left_out not in p[1:])
    assert "5 labels:" in capsys.readouterr().out
    shuffled = [(s, a, b) for (s, a, _), (_, _, b) in zip(pairs, pairs[1:] + pairs[:1])]
    assert abs(label_agreement.agreement(shuffled, None, valid, left_out)["kappa_valid"]) < 0.2
