"""CMP training: a tiny-model multi-task step lowers the loss; the recipe runs end to end and resumes."""

import json

import lightning as L
import pytest
import torch

from i2d2.cmp.data import load_quintuples
from i2d2.cmp.tasks import Collator, ExampleBuilder, eos_id, generate, make_truncator, mask_token_for
from i2d2.cmp.textualize import TemplateRealiser
from i2d2.models import load_seq2seq
from trainers.cmp import CMPModule, MixedTaskBatches, TaskBatches, per_task_sizes, train_loader


def summed_val_loss(module, batches):
    module.model.eval()
    with torch.no_grad():
        per = {}
        for task, exs in batches:
            b = module.collator([e.source for e in exs], [e.target for e in exs])
            per.setdefault(task, []).append(float(module.task_loss(b)))
    return sum(sum(v) / len(v) for v in per.values())


@pytest.mark.parametrize("arch", ["bart", "t5"])
def test_tiny_multitask_training_lowers_loss(arch):
    torch.manual_seed(0)
    model, tok = load_seq2seq(f"tiny:{arch}")
    qs = [q for q in load_quintuples() if q.category == "planet"][:12]
    summaries = dict(zip([q.id for q in qs], TemplateRealiser()(qs)))
    b = ExampleBuilder(summaries, mask_token_for(tok), trunc=make_truncator(tok, 48))
    tasks = ["qa", "qag", "sum", "ti"]
    coll = Collator(tok, eos_id(model, tok), 128, 64)
    module = CMPModule(model, tok, coll, lr=3e-3, warmup_ratio=0.0, total_steps=12, tasks=tasks)
    ds = MixedTaskBatches(qs, b, tasks, per_task_sizes(8, tasks), num_steps=12, seed=0)
    step0 = module.collate_train(ds[0])
    assert set(step0) == set(tasks) and all(v["labels"].shape[0] == 2 for v in step0.values())
    assert (step0["qa"]["labels"][:, 0] != -100).all()  # targets start with real tokens
    fixed = TaskBatches(qs[:4], b, tasks, batch_size=8).items
    before = summed_val_loss(module, fixed)
    trainer = L.Trainer(max_steps=12, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, train_loader(module, ds))
    after = summed_val_loss(module, fixed)
    assert trainer.global_step == 12
    assert after < before - 1.0, (before, after)
    # the loss is the plain sum of the task losses
    module.model.eval()
    with torch.no_grad():
        parts = [float(module.task_loss(v)) for v in step0.values()]
        module.log = lambda *a, **k: None  # outside a Trainer loop
        assert float(module.training_step(step0, 0)) == pytest.approx(sum(parts), rel=1e-5)
    outs = generate(model, tok, [e.source for e in fixed[0][1][:3]], batch_size=2, max_new_tokens=4)
    assert len(outs) == 3 and all(isinstance(o, str) for o in outs)


def test_recipe_runs_end_to_end_and_resumes(tmp_path):
    from hydra import compose, initialize_config_dir

    from i2d2.config import CONF_DIR
    from i2d2.recipes.cmp import run

    overrides = ["task=cmp", "task.model=tiny:t5", "logger=csv", f"run_dir={tmp_path}", "trainer.log_every_n_steps=1",
                 "task.pretrain.max_steps=2", "task.pretrain.val_every=1", "task.pretrain.val_max_per_task=4",
                 "task.pretrain.batch_size=4", "task.eval.limit=2", "task.eval.max_new_tokens=4",
                 "task.downstream.datasets=[hotpotqa,diffen]", "task.downstream.shots=[0,2]",
                 "task.downstream.models=[pretrained]", "task.downstream.finetune.steps=1",
                 "task.downstream.finetune.dev_size=1", "task.downstream.finetune.eval_every=1",
                 "task.downstream.seeds=[0]", "task.downstream.lr_grid=[1e-4]",
                 "task.downstream.allow_fewer_shots=true",
                 "task.keep_checkpoints=true"]
    from i2d2.recipes.cmp import BUNDLED

    diffen = tmp_path / "user_diffen_dev.jsonl"  # a user's copy of an evaluation file
    diffen.write_text((BUNDLED / "fixtures" / "diffen_dev.jsonl").read_text())
    overrides.append(f"data.downstream.diffen.eval_path={diffen}")
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    summary = run(cfg)
    pre = summary["pretrain"]
    assert pre["steps"] == 2 and set(pre["final"]) == {"val/loss", "val/loss_qa", "val/loss_qag", "val/loss_sum",
                                                       "val/loss_ti"}
    assert (tmp_path / "pretrain" / "model" / "config.json").exists()
    assert (tmp_path / "pretrain" / "checkpoints" / "last.ckpt").exists()
    assert set(summary["zero_shot"]) == {"base", "pretrained", "constant"} and summary["zero_shot"]["base"]["n"] == 10
    assert summary["zero_shot"]["constant"]["answer"] in ("yes", "no")
    assert set(summary["downstream"]) == {"hotpotqa_pretrained_k0", "hotpotqa_pretrained_k2",
                                          "diffen_pretrained_k0", "diffen_pretrained_k2"}
    assert "rougeL" in summary["downstream"]["diffen_pretrained_k0"]["metrics"]
    assert summary["downstream"]["diffen_pretrained_k2"]["k_used"] == 1  # 2 items, 1 held out as dev
    assert all(r["smoke"] for r in summary["downstream"].values())
    preds = [json.loads(x) for x in (tmp_path / "eval" / "predictions_pretrained.jsonl").read_text().splitlines()]
    assert len(preds) == 10 and {"question", "answer", "prediction", "template"} <= set(preds[0])
    report = (tmp_path / "report.md").read_text()
    assert "Zero-shot synthetic comparative QA on unseen entities" in report
    assert "## Downstream" not in report and "## Smoke checks on bundled fixtures (not results)" in report
    # W&B off: the zero-shot sample tables are the eval stage's outputs, in its folder (they were written at the top
    # of run_dir, undocumented and outside any _DONE record)
    samples = {f"cmp_zero_shot_{m}_samples.csv" for m in ("base", "pretrained")}
    eval_done = json.loads((tmp_path / "eval" / "_DONE.json").read_text())
    assert samples <= set(eval_done["outputs"]) and not list(tmp_path.glob("*.csv"))
    # an eval/ finished before they moved there (no tables in it) is reused as is
    for name in samples:
        (tmp_path / "eval" / name).unlink()
        del eval_done["outputs"][name]
    (tmp_path / "eval" / "_DONE.json").write_text(json.dumps(eval_done))
    # a finished stage is reused as is
    mtime = (tmp_path / "pretrain" / "model" / "config.json").stat().st_mtime
    eval_mtime = (tmp_path / "eval" / "predictions_base.jsonl").stat().st_mtime_ns
    assert run(cfg)["pretrain"]["steps"] == 2
    assert (tmp_path / "pretrain" / "model" / "config.json").stat().st_mtime == mtime
    assert (tmp_path / "eval" / "predictions_base.jsonl").stat().st_mtime_ns == eval_mtime
    # an interrupted stage resumes the fit from checkpoints/last.ckpt (already at max_steps: no new steps)
    (tmp_path / "pretrain" / "_DONE.json").unlink()
    (tmp_path / "eval" / "_DONE.json").unlink()
    assert run(cfg)["pretrain"]["steps"] == 2
    assert (tmp_path / "pretrain" / "initial_val.json").exists()
    # an edited evaluation file is a new input: the downstream stage is redone on its rows (the path is the same)
    n_before = summary["downstream"]["diffen_pretrained_k0"]["metrics"]["n"]
    diffen.write_text(diffen.read_text().splitlines(keepends=True)[0])
    assert n_before > 1 and run(cfg)["downstream"]["diffen_pretrained_k0"]["metrics"]["n"] == 1


def test_data_to_text_realiser_plugs_in_by_config():
    import hydra

    from i2d2.cmp.data import Quintuple
    from i2d2.cmp.textualize import Seq2SeqRealiser

    q = Quintuple("Mars", "Venus", "planet type", "terrestrial planet", "terrestrial planet", "Mars is a terrestrial "
                  "planet.", "Venus is a terrestrial planet.")
    assert Seq2SeqRealiser.linearise(q) == ("<H> Mars <R> planet type <T> terrestrial planet "
                                            "<H> Venus <R> planet type <T> terrestrial planet")
    r = hydra.utils.instantiate({"_target_": "i2d2.cmp.textualize.Seq2SeqRealiser", "model": "tiny:t5",
                                 "max_new_tokens": 4, "num_beams": 1})
    out = r([q, q])
    assert len(out) == 2 and out[0] == out[1] and isinstance(out[0], str)
