"""The self-imitation loop end to end with tiny models: two iterations, stage skipping/redoing, kill-and-resume
inside generation and inside fine-tuning, 2-process DDP generation, on-demand generation, config errors."""

import contextlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir

from i2d2.config import CONF_DIR, setup_run
from i2d2.io import read_jsonl, read_table
from i2d2.models import tiny_model
from i2d2.recipes import generics
from i2d2.recipes.generics import ConfigError, MissingIterationError, run
from process_env import launch_env

pytestmark = pytest.mark.integration

SMOKE = ["experiment=smoke"]  # conf/experiment/smoke.yaml + smoke/i2d2.yaml: tiny models, a few prompts


def make_cfg(run_dir, *extra, name="train"):
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose(name, overrides=[*SMOKE, f"run_dir={run_dir}", *extra])
    setup_run(cfg)
    return cfg


def weights(path):
    from safetensors.torch import load_file

    return load_file(str(Path(path) / "model.safetensors"))


def gen_rows(run_dir, k):
    return read_jsonl(Path(run_dir) / f"iter_{k}" / "generations" / "generations.jsonl")


def strip(rows):
    return [{k: v for k, v in r.items() if k != "critic_score"} for r in rows]


@contextlib.contextmanager
def one_thread():
    """Forked DDP workers run single-threaded (more threads in a forked child can deadlock OpenMP); runs
    compared with them use one thread too, since the thread count changes float summation order."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


@pytest.fixture(scope="module", autouse=True)
def _single_threaded():
    # every run in this module is compared with the baseline, so all use the DDP workers' thread count
    with one_thread():
        yield


@pytest.fixture(scope="module")
def baseline(tmp_path_factory, _single_threaded):
    """Iterations 0 and 1 in one command (num_iterations=2)."""
    run_dir = tmp_path_factory.mktemp("loop") / "run"
    return run_dir, run(make_cfg(run_dir, "num_iterations=2"))


def test_two_iterations_chain_models_and_report(baseline):
    run_dir, (r0, r1) = baseline
    assert r0["generator"] == "tiny:gpt2"
    assert r1["generator"] == "iter_0/model"  # P_1 is iteration 0's output (paths in a run: relative to run_dir)
    meta1 = json.loads((run_dir / "iter_1" / "model" / "i2d2_meta.json").read_text())
    assert meta1["trained_from"] == "iter_0/model" and meta1["iteration"] == 1
    w_base = tiny_model("gpt2")[0].state_dict()
    w0, w1 = weights(run_dir / "iter_0" / "model"), weights(run_dir / "iter_1" / "model")
    key = "transformer.h.0.attn.c_attn.weight"
    assert not torch.allclose(w0[key], w_base[key]) and not torch.allclose(w1[key], w0[key])
    # P_1 generated iteration 1's statements: same prompts, different model, different text
    g0, g1 = gen_rows(run_dir, 0), gen_rows(run_dir, 1)
    assert [r["prompt_id"] for r in g0] == [r["prompt_id"] for r in g1]
    assert [r["generation"] for r in g0] != [r["generation"] for r in g1]
    # the critic was trained once and reused (labels unchanged)
    assert r0["critic_reused_from"] is None and r1["critic_reused_from"] == 0
    for k, r in enumerate((r0, r1)):
        it = run_dir / f"iter_{k}"
        for part in ("prompts/prompts.jsonl", "generations/generations.jsonl", "critic/metrics.json",
                     "filtered/kept.jsonl", "filtered/to_label.csv", "model/config.json", "config.yaml", "report.md",
                     "report/metrics.json"):
            assert (it / part).exists(), part
        assert f"iteration: {k}" in (it / "config.yaml").read_text()
        assert r["n_generations"] == 6 * 3 and 0 <= r["constraint_satisfaction_rate"] <= 1
        assert r["accepted_rate"] == pytest.approx(
            sum(s["critic_score"] > r["delta"] for s in read_table(it / "filtered" / "scores")) / 18)
        assert r["n_kept"] == len(read_jsonl(it / "filtered" / "kept.jsonl")) > 0
        assert 0 <= r["self_bleu_kept"] <= 1 and r["unique_estimate"] > 0 and 0 < r["critic_ap"] <= 1
    # every critic number in the report is the test split's; δ is the dev split's
    from critics.metrics import average_precision, choose_delta

    test = read_jsonl(run_dir / "iter_0" / "critic" / "test_scores.jsonl")
    dev = read_jsonl(run_dir / "iter_0" / "critic" / "dev_scores.jsonl")
    rep = json.loads((run_dir / "iter_0" / "report" / "metrics.json").read_text())
    assert rep["critic_ap"] == pytest.approx(average_precision([t["y"] for t in test], [t["critic_score"] for t in test]))
    assert rep["critic_n_test"] == len(test) and rep["critic_surface_ap"] is not None
    crit = json.loads((run_dir / "iter_0" / "critic" / "metrics.json").read_text())
    assert crit["delta"] == pytest.approx(choose_delta([t["y"] for t in dev], [t["critic_score"] for t in dev],
                                                       0.9)["delta"])
    # the held-out concepts were generated in every iteration, unfiltered
    for k in (0, 1):
        held = read_jsonl(run_dir / f"iter_{k}" / "heldout" / "statements.jsonl")
        assert {h["concept"] for h in held} == {"umbrella", "ladder", "plant a tree"}
    md = (run_dir / "iter_1" / "report.md").read_text()
    assert "## All iterations" in md and "| 0 | 18 |" in md and "| 1 | 18 |" in md
    # the smoke preset sets task.filter.delta (0.0): the report says so, and its precision / recall at δ are the
    # critic's test split's at that δ, not at the critic's own dev δ
    assert "critic AP — test split" in md and "δ — set by task.filter.delta (not chosen on data) | 0.000 |" in md
    from critics.metrics import precision_recall_at

    assert rep["delta"] == 0.0 and rep["delta_source"] == "task.filter.delta" and rep["critic_delta"] == crit["delta"]
    p, r, n = precision_recall_at([t["y"] for t in test], [t["critic_score"] for t in test], 0.0)
    assert (rep["critic_precision"], rep["critic_recall"], rep["critic_n_kept_test"]) == (pytest.approx(p), pytest.approx(r), n)
    assert n != crit["n_kept_test"]  # the critic's own δ keeps another number: the two must not be mixed
    assert (run_dir / "iter_1" / "report" / "pr_curves.png").stat().st_size > 1000
    assert len(r1["pr_aps"]) == 2  # one curve per iteration on the same plot


def test_blind_import_writes_person_judged_accuracy_into_the_reports(baseline, tmp_path, capsys):
    """The labels arrive after the iterations wrote their reports: import --blind re-renders them."""
    import csv
    import shutil

    from i2d2.annotate import main as annotate

    run_dir = tmp_path / "run"
    shutil.copytree(baseline[0], run_dir)
    before = (run_dir / "iter_1" / "report.md").read_text()
    assert "| **person-judged accuracy, held-out concepts (blind)** | – |" in before
    assert annotate(["export", "--blind", "--run-dir", str(run_dir), "--out", str(tmp_path / "b.csv"), "--n", "100"]) == 0
    with open(tmp_path / "b.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    for i, r in enumerate(rows):  # any labels do: the test checks where they land, not what they say
        r["label"] = "true" if i % 2 == 0 else "garbled"
    with open(tmp_path / "done.csv", "w", newline="") as f:
        w = csv.DictWriter(f, ["item_id", "statement", "label", "votes"])
        w.writeheader()
        w.writerows(rows)
    assert annotate(["import", "--blind", "--run-dir", str(run_dir), "--input", str(tmp_path / "done.csv")]) == 0
    assert "person-judged accuracy written into" in capsys.readouterr().out
    from i2d2.annotation import heldout_accuracy

    acc = {r["iteration"]: r for r in heldout_accuracy(run_dir)}
    assert set(acc) == {0, 1} and all(a["n_labelled"] == a["n_generations"] > 0 for a in acc.values())
    for k in (0, 1):
        m = json.loads((run_dir / f"iter_{k}" / "report" / "metrics.json").read_text())
        assert m["heldout_accuracy"] == pytest.approx(acc[k]["accuracy"]) and m["heldout_n_labelled"] == acc[k]["n_labelled"]
        md = (run_dir / f"iter_{k}" / "report.md").read_text()
        assert (f"| **person-judged accuracy, held-out concepts (blind)** | {acc[k]['accuracy']:.3f} (95 % CI "
                f"{acc[k]['ci95_low']:.3f}–{acc[k]['ci95_high']:.3f}, n={acc[k]['n_labelled']}) |") in md
        assert acc[k]["ci95_low"] < acc[k]["accuracy"] < acc[k]["ci95_high"]
    after = (run_dir / "iter_1" / "report.md").read_text()
    # the table of all iterations carries both accuracies; the rest of the report (samples, numbers) is unchanged
    assert f"| {acc[0]['accuracy']:.3f} |" in after.split("## All iterations")[1]
    changed = [(a, b) for a, b in zip(before.splitlines(), after.splitlines()) if a != b]
    # the prompt forms table gains its held-out accuracy per form (the last column; the rest of each row stays)
    form_rows = [(a, b) for a, b in changed if a.startswith("| adverb+") or a.startswith("| goal")]
    assert form_rows and all(a.rsplit("|", 2)[0] == b.rsplit("|", 2)[0] and a.endswith("| – |") for a, b in form_rows)
    assert len(before.splitlines()) == len(after.splitlines()) and len(changed) - len(form_rows) == 3, changed


def test_heldout_critic_accepted_rate_counts_cut_off_generations_as_the_loop_does_and_self_bleu_compares_equal_sizes(baseline, tmp_path, monkeypatch):
    """The report's two critic-accepted rates are one measure: the loop's counts a generation cut off before a
    sentence end (task.filter.require_sentence_end) as not accepted, unscored; the held-out rate scored those too
    and counted each above δ as accepted."""
    import shutil

    import critics.scoring
    from i2d2.filtering import ends_sentence
    from i2d2.io import DONE, write_jsonl

    run_dir = tmp_path / "run"
    shutil.copytree(baseline[0], run_dir)
    cfg = make_cfg(run_dir, "task.filter.require_sentence_end=true")
    it = run_dir / "iter_0"
    held = read_jsonl(it / "heldout" / "statements.jsonl")
    for h in held[::2]:  # the tiny model never ends a sentence: half of its generations now do
        h.update(generation=h["generation"].rstrip(".") + ".", statement=h["statement"].rstrip(".") + ".")
    for h in held[1::2]:
        h.update(generation=h["generation"].rstrip("."), statement=h["statement"].rstrip("."))
    write_jsonl(it / "heldout" / "statements.jsonl", held)
    done = {name: json.loads((it / name / DONE).read_text())["summary"]
            for name in ("generations", "critic", "filtered", "finetune", "prompts", "heldout")}
    scored = []
    monkeypatch.setattr(critics.scoring, "score_texts",
                        lambda model_dir, texts, **kw: scored.extend(texts) or np.ones(len(texts)))  # all above δ
    r = generics.report_stage(cfg, 0, it, done["generations"], done["critic"], done["filtered"], done["finetune"],
                              done["prompts"], done["heldout"], "tiny:gpt2", None)
    finished = [h for h in held if h["generation"] and ends_sentence(h["generation"])]
    assert 0 < len(finished) < len(held)  # some cut off, some not: the case this checks
    assert r["heldout_critic_accepted_rate_proxy"] == pytest.approx(len(finished) / len(held))
    assert sorted(scored) == sorted(h["statement"] for h in finished)  # the cut-off ones are not even scored
    # Self-BLEU grows with the texts compared: all generations' is measured on a sample the kept sample's size
    n_kept, n_all = r["n_kept"], r["n_generations"]
    assert 2 <= n_kept < n_all <= int(cfg.task.report.self_bleu_sample)  # the case checked: fewer kept than made
    assert r["self_bleu_kept_n"] == r["self_bleu_all_n"] == n_kept
    md = (it / "report.md").read_text()
    assert f"Self-BLEU of all generations (a sample of {n_kept}, the kept sample's size)" in md


def test_labels_typed_into_to_label_csv_are_not_removed_with_the_filter_stage(baseline, tmp_path, caplog):
    """filtered/to_label.csv asks to be labelled where it lies; a labelled file no longer matched the stage's record
    of its outputs, so the next run removed the stage folder, labels and all ("changed since the stage finished")."""
    import csv
    import logging
    import re
    import shutil

    from i2d2.annotate import main as annotate
    from i2d2.io import DONE, DataError

    run_dir = tmp_path / "run"
    shutil.copytree(baseline[0], run_dir)
    cfg = make_cfg(run_dir)
    it = run_dir / "iter_0"
    path = it / "filtered" / "to_label.csv"
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows
    rows[0]["label"] = "true"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    critic = json.loads((it / "critic" / DONE).read_text())["summary"]
    with pytest.raises(DataError, match=r"to_label\.csv holds 1 label\(s\) not in the labels store.*i2d2\.annotate import"):
        generics.filter_stage(cfg, 0, it, critic, None, generics.Ranks())
    assert path.read_text().count(",true,") == 1  # the label is still there
    # the next iteration's critic cannot learn from it: it says so (it said only "labels unchanged ... reusing")
    with caplog.at_level(logging.WARNING, logger="i2d2.recipes.generics"):
        generics._warn_unimported_labels(run_dir, 1)
    assert any(f"critic: {path} holds 1 label(s) not in the labels store" in r.getMessage() for r in caplog.records)
    caplog.clear()
    store = run_dir / "annotations" / "labels.jsonl"
    assert annotate(["import", "--input", str(path), "--store", str(store)]) == 0
    with caplog.at_level(logging.WARNING, logger="i2d2.recipes.generics"):
        generics._warn_unimported_labels(run_dir, 1)
    assert not caplog.records
    with caplog.at_level(logging.INFO, logger="i2d2.recipes.generics"):
        summary = generics.filter_stage(cfg, 0, it, critic, None, generics.Ranks())  # imported: the stage may be redone
    # its result reaches the log file: counts that add up to the generations
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("filter: "))
    assert line.startswith(f"filter: {summary['n_in']} generations -> {summary['n_kept']} kept")
    dropped = [int(n) for n in re.findall(r"(\d+) [a-z_]+(?:,|$)", line.split("dropped: ")[1])]
    assert len(dropped) == len(generics.DROP_REASONS) and sum(dropped) == summary["n_in"] - summary["n_kept"]
    assert rows[0]["statement"] not in path.read_text()  # exported again without what the store holds


def test_a_redone_filter_stage_names_the_changed_delta(baseline, tmp_path, caplog):
    """A stage redone because its inputs changed says which, by name: here task.filter.delta, in the filter's
    fingerprint as the threshold (the part named delta) and as a key of task.filter (the filter config; the smoke
    preset sets it to 0.0): the same change, listed once."""
    import logging
    import shutil

    from i2d2.io import DONE

    run_dir = tmp_path / "run"
    shutil.copytree(baseline[0], run_dir)
    it = run_dir / "iter_0"
    critic = json.loads((it / "critic" / DONE).read_text())["summary"]
    with caplog.at_level(logging.INFO, logger="i2d2.io"):
        generics.filter_stage(make_cfg(run_dir, "task.filter.delta=0.5"), 0, it, critic, None, generics.Ranks())
    line = next(r.getMessage() for r in caplog.records if "inputs changed" in r.getMessage())
    assert line.startswith("stage filter: inputs changed (delta: 0.0 -> 0.5), redoing it (removing ")


def test_rerun_skips_finished_stages_and_redoes_changed_ones(baseline, monkeypatch):
    run_dir, _ = baseline
    it = run_dir / "iter_1"
    gen_mtime = (it / "generations" / "generations.jsonl").stat().st_mtime_ns
    model_mtime = (it / "model" / "model.safetensors").stat().st_mtime_ns
    import i2d2.generation

    monkeypatch.setattr(i2d2.generation, "generate_stage", lambda *a, **k: pytest.fail("finished generation redone"))
    first = json.loads((it / "report" / "timings.json").read_text())
    run(make_cfg(run_dir, "iteration=1"))
    assert (it / "model" / "model.safetensors").stat().st_mtime_ns == model_mtime
    # the rerun's own (near-zero) seconds come first; what the stages took when they ran is kept
    timings = json.loads((it / "report" / "timings.json").read_text())
    assert timings["earlier"][-1] == {k: v for k, v in first.items() if k != "earlier"}
    assert timings["wall_seconds"]["finetune"] < first["wall_seconds"]["finetune"]
    # a changed filter threshold redoes the filter and the fine-tuning, not the generation
    scores = sorted(x["critic_score"] for x in read_table(it / "filtered" / "scores"))
    delta = round(scores[len(scores) // 2] - 1e-6, 7)  # keeps about half
    r = run(make_cfg(run_dir, "iteration=1", f"task.filter.delta={delta}"))[0]
    assert (it / "generations" / "generations.jsonl").stat().st_mtime_ns == gen_mtime
    assert (it / "model" / "model.safetensors").stat().st_mtime_ns != model_mtime
    kept = read_jsonl(it / "filtered" / "kept.jsonl")
    assert r["delta"] == delta and 0 < len(kept) < len(scores) and all(x["critic_score"] > delta for x in kept)


def test_kill_inside_generation_and_finetune_then_resume(baseline, tmp_path, monkeypatch):
    base_dir, _ = baseline
    from i2d2.decoding import NeuroLogicDecoder
    from trainers.lm_finetune import SelfImitationModule

    run_dir = tmp_path / "run"
    cfg = make_cfg(run_dir)
    real_decode, calls = NeuroLogicDecoder.decode, []

    def dying_decode(self, *a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("killed in generation")
        return real_decode(self, *a, **k)

    monkeypatch.setattr(NeuroLogicDecoder, "decode", dying_decode)
    with pytest.raises(RuntimeError, match="killed in generation"):
        run(cfg)
    gdir = run_dir / "iter_0" / "generations"
    assert (gdir / "shard-00000.jsonl").exists() and not (gdir / "generations.jsonl").exists()

    real_step, steps = SelfImitationModule.training_step, []
    # killed in the last step, after a checkpoint of the one before (ckpt_every_n_steps: 1)
    base_steps = json.loads((base_dir / "iter_0" / "model" / "i2d2_meta.json").read_text())["steps"]
    assert base_steps >= 2

    def dying_step(self, batch, batch_idx):
        steps.append(1)
        if len(steps) == base_steps:
            raise RuntimeError("killed in fine-tuning")
        return real_step(self, batch, batch_idx)

    monkeypatch.setattr(SelfImitationModule, "training_step", dying_step)
    with pytest.raises(RuntimeError, match="killed in fine-tuning"):
        run(cfg)
    # the restart decoded only the 2 unfinished shards of 3, then the held-out concepts' 2 shards
    assert len(calls) == 2 + 2 + 2
    assert (run_dir / "iter_0" / "finetune" / "checkpoints" / "last.ckpt").exists()
    assert not (run_dir / "iter_0" / "model").exists()

    monkeypatch.setattr(SelfImitationModule, "training_step", real_step)
    r = run(cfg)[0]
    assert r["finetune_steps"] == json.loads((base_dir / "iter_0" / "model" / "i2d2_meta.json").read_text())["steps"]
    meta = json.loads((run_dir / "iter_0" / "model" / "i2d2_meta.json").read_text())
    assert meta["resumed_from"].endswith("last.ckpt")
    assert strip(gen_rows(run_dir, 0)) == strip(gen_rows(base_dir, 0))  # same rows as the uninterrupted run
    wa, wb = weights(base_dir / "iter_0" / "model"), weights(run_dir / "iter_0" / "model")
    for k in wa:
        assert torch.allclose(wa[k], wb[k], atol=1e-5), k


def test_ddp_two_processes_split_generation(baseline, tmp_path, monkeypatch):
    base_dir, _ = baseline
    run_dir = tmp_path / "ddp"
    # a threshold no prompt reaches: the prompt perplexity pass runs (split over the ranks) and drops nothing
    cfg = make_cfg(run_dir, "trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2",
                   "trainer.strategy=ddp_fork", "data.perplexity.threshold=1e30")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # Lightning then leaves the workers' thread count alone
    r = run(cfg)[0]
    gdir = run_dir / "iter_0" / "generations"
    ranks = {json.loads(m.read_text())["rank"] for m in gdir.glob("shard-*.meta.json")}
    assert ranks == {0, 1}
    # the prompt variants' perplexities were scored on both ranks, into the same prompt pool
    shares = sorted(p.name for p in (run_dir / "iter_0" / "prompt_scores").glob("ppl-rank*.npz"))
    assert shares == ["ppl-rank0.npz", "ppl-rank1.npz"]
    pool = read_jsonl(run_dir / "iter_0" / "prompts" / "all.jsonl")
    assert [{**r, "perplexity": None} for r in pool] == read_jsonl(base_dir / "iter_0" / "prompts" / "all.jsonl")
    from i2d2.models import load_causal_lm
    from i2d2.perplexity import perplexity

    model, tok = load_causal_lm(cfg.model.name)
    one_process = perplexity(model.eval(), tok, [r["prompt"] for r in pool], batch_size=32)
    assert [r["perplexity"] for r in pool] == pytest.approx(one_process, rel=1e-4)
    # the critic scored on both ranks too, and the filter kept what the single-process run kept
    shares = sorted(p.name for p in (run_dir / "iter_0" / "critic_scores").glob("scores-rank*.npz"))
    assert shares == ["scores-rank0.npz", "scores-rank1.npz"]
    assert read_table(run_dir / "iter_0" / "filtered" / "kept")["statement"] == \
        read_table(base_dir / "iter_0" / "filtered" / "kept")["statement"]
    rows = gen_rows(run_dir, 0)
    keys = [(x["prompt_id"], x["rank_in_prompt"]) for x in rows]
    assert len(keys) == len(set(keys))  # no duplicates
    prompt_ids = [p["prompt_id"] for p in read_jsonl(run_dir / "iter_0" / "prompts" / "prompts.jsonl")]
    assert sorted({x["prompt_id"] for x in rows}) == sorted(prompt_ids)  # no losses
    # identical to the single-process run (whose prompts carry no perplexity)
    assert [{**x, "perplexity": None} for x in strip(rows)] == strip(gen_rows(base_dir, 0))
    assert (run_dir / "iter_0" / "model" / "config.json").exists() and r["finetune_steps"] >= 1


def test_ddp_relaunched_ranks_train_the_critic_on_their_shards(tmp_path):
    # trainer=ddp relaunches the command per rank and the critic fits under DDP: Lightning refused its resumable
    # loader ("can't inject a (distributed) sampler into your batch sampler") until the loader sharded itself
    import math
    import re
    import subprocess
    import sys

    from omegaconf import OmegaConf

    root = Path(__file__).resolve().parents[1]
    # a ddp_fork test earlier in this process leaves MASTER_PORT etc. behind: the launch picks its own (launch_env)
    r = subprocess.run([sys.executable, "-m", "i2d2.train", "experiment=smoke", "trainer=ddp", "trainer.accelerator=cpu",
                        "trainer.devices=2", f"run_dir={tmp_path}"], cwd=root, capture_output=True, text=True,
                       timeout=600, env=launch_env())
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    done = json.loads((tmp_path / "iter_0" / "critic" / "_DONE.json").read_text())["summary"]
    batch = OmegaConf.load(tmp_path / "iter_0" / "config.yaml").critic.batch_size
    steps = [int(m) for m in re.findall(r"critic: epoch 0 done at step (\d+)", r.stdout + r.stderr)]
    assert steps and set(steps) == {math.ceil(math.ceil(done["n_train"] / 2) / batch)}  # each rank: its half
    assert (tmp_path / "iter_0" / "model" / "model.safetensors").exists()


def test_generate_command_prints_scored_generics(baseline, capsys):
    from i2d2.generate import GenerateError, generate

    run_dir, _ = baseline
    cfg = make_cfg(run_dir, "generate.concepts=[violin,board games]", "generate.iteration=1", "generate.top_k=2",
                   name="generate")
    rows = generate(cfg)
    out = capsys.readouterr().out
    assert f"# model: {run_dir / 'iter_1' / 'model'}" in out and "== violin ==" in out and "== board games ==" in out
    assert {r["concept"] for r in rows} == {"violin", "board games"}
    assert all(0 <= r["critic_score"] <= 1 for r in rows)
    with pytest.raises(GenerateError, match="generate.iteration=7"):
        generate(make_cfg(run_dir, "generate.concepts=[violin]", "generate.iteration=7", name="generate"))
    with pytest.raises(GenerateError, match="generate.concepts"):
        generate(make_cfg(run_dir, "generate.concepts=['a\tb']", name="generate"))


@pytest.mark.parametrize("sig,code,said", [(None, 130, "interrupted"), ("TERM", 143, "terminated (SIGTERM)")])
def test_generate_command_ctrl_c_exits_130_naming_what_is_kept_and_releases_its_lock(tmp_path, monkeypatch, capsys,
                                                                                     sig, code, said):
    import signal

    import i2d2.generate as gen
    from i2d2.io import RunLock

    def stopped(cfg):
        if sig is None:
            raise KeyboardInterrupt
        # what the signal would run (os.kill would end pytest itself where the command installs no handler)
        handler = signal.getsignal(signal.SIGTERM)
        assert callable(handler), "SIGTERM ends i2d2.generate at once: no message, no lock released"
        handler(signal.SIGTERM, None)

    before = signal.getsignal(signal.SIGTERM)

    monkeypatch.setattr(gen, "generate", stopped)
    out = tmp_path / "out"
    critic = tmp_path / "critic"  # start-up checks the critic folder exists (a trained one is not needed here)
    critic.mkdir()
    (critic / "critic_meta.json").write_text("{}")
    cfg = make_cfg(tmp_path / "run", "generate.concepts=[violin]", f"generate.out_dir={out}", "generate.iteration=null",
                   f"generate.critic={critic}", name="generate")
    with pytest.raises(SystemExit) as e:
        gen.hydra_main.__wrapped__(cfg)  # the function under @hydra.main, on the composed config
    assert e.value.code == code
    assert signal.getsignal(signal.SIGTERM) == before  # the command's handler is not left behind
    err = capsys.readouterr().err
    assert f"{said}: i2d2.generate; generation shards finished so far are in {out}" in err and "Traceback" not in err
    RunLock(out).acquire().release()  # released: a rerun can take it

def test_missing_previous_iteration_and_bad_config(tmp_path):
    with pytest.raises(MissingIterationError, match=r"iter_1/model.*iteration=1"):
        run(make_cfg(tmp_path / "empty", "iteration=2"))
    bad = {
        "task.finetune.lr=-1": "task.finetune.lr",
        "task.critic.refresh=sometimes": "task.critic.refresh",
        "task.filter.delta=1.5": "task.filter.delta",
        "+task.max_promts=3": "unknown key",
        "decoding.beam_size=0": "decoding.beam_size",
        "iteration=-1": "iteration",
        "trainer=deepspeed_stage2": "DeepSpeed.*needs a CUDA GPU",
        # ranges that once passed silently (a ratio of 150 switched near-duplicates off, a cap of 0 meant no cap)
        "task.filter.near_duplicate_ratio=150": "task.filter.near_duplicate_ratio",
        "task.filter.max_per_concept=0": "task.filter.max_per_concept",
        "task.filter.max_per_frame=0": "task.filter.max_per_frame",
        "task.heldout.prompts_per_concept=0": "task.heldout.prompts_per_concept",
        "critic.target_precision=1.5": "critic.target_precision",
        "critic.delta=1": "critic.delta",
        "critic.test_fraction=0.9": "critic.dev_fraction \\+ critic.test_fraction",
    }
    for override, msg in bad.items():
        with pytest.raises(ConfigError, match=msg):
            generics.check_config(make_cfg(tmp_path / "x", override))


def test_rank_shares_are_kept_when_finished_and_must_cover_every_item(tmp_path):
    """A rank whose share survived a kill keeps it (its positions match); a stage is only marked done when the
    shares cover every item (a share missing, e.g. from a rank that died, is an error, not a short table)."""
    from i2d2.recipes.generics import _check_shares, _share_done, read_shares

    def share(rank, pos):
        np.savez(tmp_path / f"ppl-rank{rank}.npz", position=np.array(pos), score=np.array(pos, dtype=float) / 10)

    share(0, [0, 2])
    assert _share_done(tmp_path / "ppl-rank0.npz", np.array([0, 2]))
    assert not _share_done(tmp_path / "ppl-rank0.npz", np.array([0, 3]))  # another split: scored again
    assert not _share_done(tmp_path / "ppl-rank1.npz", np.array([1, 3]))
    with pytest.raises(RuntimeError, match="hold 2 scores for 4 items"):
        _check_shares(tmp_path, "ppl", 4)
    share(1, [1, 3])
    assert _check_shares(tmp_path, "ppl", 4) == {"n_scored": 4, "ranks": 2}
    assert read_shares(tmp_path, "ppl").tolist() == [0.0, 0.1, 0.2, 0.3]


@pytest.mark.integration
def test_a_run_whose_filter_keeps_nothing_stops_with_one_line_in_the_terminal_and_the_log(tmp_path):
    """No generation passed the filter, so iteration 0 has nothing to fine-tune on: a mid-run DataError. It ended in
    a Hydra traceback (exit 1) whose last line held the advice, and the run's train.log stopped without a word of
    why. Now: exit 1, one ``error:`` line naming the key to change, the reason at the end of train.log, and the
    stages before it kept (a rerun with a lower delta resumes from them)."""
    import subprocess
    import sys

    from process_env import launch_env

    run = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "i2d2.train", *SMOKE, f"run_dir={run}", "task.filter.delta=0.99"],
                       capture_output=True, text=True, timeout=600, env=launch_env(),
                       cwd=Path(__file__).resolve().parent.parent)
    assert r.returncode == 1, r.stderr[-3000:]
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("error: iteration 0: no generation passed the filter") and "task.filter.delta" in last
    (log,) = run.glob("hydra/*/train.log")
    assert "run stopped: DataError: iteration 0: no generation passed the filter" in log.read_text().splitlines()[-1]
    assert (run / "iter_0" / "filtered" / "_DONE.json").exists() and (run / "iter_0" / "critic" / "_DONE.json").exists()
