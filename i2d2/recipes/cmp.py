"""CMP recipe: ``python -m i2d2.train task=cmp``.

Stages (each under ``{run_dir}/``, skipped when finished with the same inputs, resumable inside):
  textualize/   summaries of every quintuple from the configured realiser (summaries.jsonl)
  pretrain/     multi-task pre-training (Lightning fit, resumes from checkpoints/last.ckpt); the
                checkpoint with the lowest validation loss is saved to pretrain/model (save_pretrained)
  eval/         zero-shot held-out synthetic comparative QA, pre-trained vs. the same model without
                pre-training (EM / F1 per template)
  downstream/   zero-/few-shot runners on the configured HotpotQA / 2Wiki / CocoTrip / Diffen files
and a ``report.json`` / ``report.md`` with the numbers.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

from i2d2.cmp.data import BUNDLED, Quintuple, load_quintuples, split_quintuples
from i2d2.cmp.runners import evaluate_synthetic_qa, run_downstream
from i2d2.cmp.tasks import TASKS, Collator, ExampleBuilder, eos_id, make_truncator, mask_token_for
from i2d2.cmp.textualize import cut_documents, qa_pairs
from i2d2.io import fingerprint, load_state_dict, read_jsonl, run_stage, write_json, write_jsonl, write_text
from i2d2.models import load_seq2seq
from i2d2.tracking import Tracker, build_logger

log = logging.getLogger(__name__)
PROMPT_RESERVE = 64  # source tokens kept for the prompt and question; the rest is split over D1 and D2


def resolve_path(p: str | None) -> Path | None:
    """``bundled:<rel>`` names a file shipped under i2d2/data/cmp/; anything else is a path."""
    if p in (None, "", "bundled"):
        return None
    p = str(p)
    return BUNDLED / p[len("bundled:"):] if p.startswith("bundled:") else Path(p).expanduser()


def _container(x):
    return OmegaConf.to_container(x, resolve=True) if isinstance(x, DictConfig) else x


def _builder(tok, t: DictConfig, summaries: dict) -> ExampleBuilder:
    pre = t.pretrain
    budget = max(16, (int(pre.max_source_length) - PROMPT_RESERVE) // 2)
    inf = t.infilling
    return ExampleBuilder(summaries, inf.mask_token or mask_token_for(tok), sep=t.sep, mask_ratio=float(inf.mask_ratio),
                          poisson_lambda=float(inf.poisson_lambda), trunc=make_truncator(tok, budget))


def textualize(quints: list[Quintuple], realiser_cfg, out_dir: Path) -> dict:
    realiser = hydra.utils.instantiate(realiser_cfg)
    texts = realiser(quints)
    write_jsonl(out_dir / "summaries.jsonl", [{"id": q.id, "summary": s} for q, s in zip(quints, texts)])
    return {"n": len(texts)}


def pretrain(cfg: DictConfig, splits: dict, summaries: dict, out_dir: Path, logger) -> dict:
    from lightning.pytorch.callbacks import ModelCheckpoint

    from trainers.cmp import CMPModule, MixedTaskBatches, TaskBatches, per_task_sizes, train_loader, val_loader

    t, pre = cfg.task, cfg.task.pretrain
    tasks = list(t.tasks)
    model, tok = load_seq2seq(t.model)
    builder = _builder(tok, t, summaries)
    coll = Collator(tok, eos_id(model, tok), int(pre.max_source_length), int(pre.max_target_length))
    accum = int(cfg.trainer.get("accumulate_grad_batches", 1) or 1)
    steps = int(pre.max_steps)
    module = CMPModule(model, tok, coll, lr=float(pre.lr), warmup_ratio=float(pre.warmup_ratio),
                       weight_decay=float(pre.weight_decay), total_steps=steps, tasks=tasks)
    sizes = per_task_sizes(int(pre.batch_size), tasks, _container(t.get("mix")))
    log.info("CMP pre-training %s on %d quintuples: tasks %s, per-step examples %s, %d steps",
             t.model, len(splits["train"]), tasks, sizes, steps)
    train_ds = MixedTaskBatches(splits["train"], builder, tasks, sizes, steps * accum, seed=int(cfg.seed))
    val_ds = TaskBatches(splits["validation"], builder, tasks, int(pre.eval_batch_size),
                         max_per_task=pre.get("val_max_per_task"), seed=int(cfg.seed))
    ckpt_dir = out_dir / "checkpoints"
    ckpt = ModelCheckpoint(dirpath=ckpt_dir, filename="best", monitor="val/loss", mode="min", save_top_k=1,
                           save_last=True)
    trainer = hydra.utils.instantiate(
        cfg.trainer, max_steps=steps, max_epochs=-1, logger=logger if logger is not None else False,
        callbacks=[ckpt], default_root_dir=str(out_dir), val_check_interval=min(int(pre.val_every), steps) * accum,
        check_val_every_n_epoch=None, num_sanity_val_steps=0, enable_checkpointing=True)
    initial_path = out_dir / "initial_val.json"
    if initial_path.exists():  # resumed run: the untrained model's loss was measured already
        initial = json.loads(initial_path.read_text())
    else:
        trainer.validate(module, val_loader(module, val_ds), verbose=False)
        initial = module.last_val
        write_json(initial_path, initial)
    last = ckpt_dir / "last.ckpt"
    t0 = time.time()
    trainer.fit(module, train_loader(module, train_ds), val_loader(module, val_ds),
                ckpt_path=str(last) if last.exists() else None)
    train_s = time.time() - t0
    if ckpt.best_model_path:
        state = load_state_dict(ckpt.best_model_path)
        module.load_state_dict(state)
    trainer.validate(module, val_loader(module, val_ds), verbose=False)
    final = module.last_val
    tmp = out_dir / ".model.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    shutil.rmtree(out_dir / "model", ignore_errors=True)
    os.replace(tmp, out_dir / "model")
    if not t.get("keep_checkpoints", False):
        shutil.rmtree(ckpt_dir, ignore_errors=True)
    summary = {"initial": initial, "final": final, "steps": int(trainer.global_step), "train_seconds": train_s,
               "best_checkpoint": Path(ckpt.best_model_path).name if ckpt.best_model_path else None,
               "per_step_examples": sizes}
    write_json(out_dir / "metrics.json", summary)
    return summary


def zero_shot_eval(cfg, splits, summaries, model_dir: Path, out_dir: Path, tracker: Tracker) -> dict:
    t, ev = cfg.task, cfg.task.eval
    held_out = splits["test"]
    if ev.get("limit"):
        held_out = held_out[: int(ev.limit)]
    candidates = {"pretrained": lambda: load_seq2seq(str(model_dir))}
    if ev.get("compare_base", True):
        candidates = {"base": lambda: load_seq2seq(t.model), **candidates}
    out = {}
    for name, loader in candidates.items():
        model, tok = loader()
        metrics, rows = evaluate_synthetic_qa(model, tok, held_out, _builder(tok, t, summaries),
                                              int(ev.batch_size), int(t.pretrain.max_source_length),
                                              int(ev.max_new_tokens))
        write_jsonl(out_dir / f"predictions_{name}.jsonl", rows)
        out[name] = metrics
        tracker.log_metrics({f"cmp/zero_shot_{name}/{k}": v for k, v in metrics.items()})
        tracker.log_table(f"cmp/zero_shot_{name}_samples", ["template", "question", "answer", "prediction"],
                          [[r["template"], r["question"], r["answer"], r["prediction"]] for r in rows[:50]])
        del model
    # reference point: always answering the most frequent training answer (e.g. "yes")
    from collections import Counter

    from i2d2.cmp.evaluation import qa_scores

    top = Counter(p.answer for q in splits["train"] for p in qa_pairs(q)).most_common(1)[0][0]
    refs = [p.answer for q in held_out for p in qa_pairs(q)]
    out["constant"] = {**qa_scores([top] * len(refs), refs), "answer": top}
    tracker.log_metrics({f"cmp/zero_shot_constant/{k}": v for k, v in out["constant"].items() if k != "answer"})
    write_json(out_dir / "metrics.json", out)
    return out


def downstream(cfg, model_dir: Path, out_dir: Path, tracker: Tracker) -> dict:
    t, d = cfg.task, cfg.task.downstream
    loaders = {"pretrained": lambda: load_seq2seq(str(model_dir)), "base": lambda: load_seq2seq(t.model)}
    results = {}
    for key in d.datasets:
        if key not in cfg.data.downstream:
            raise KeyError(f"task.downstream.datasets names {key!r}, not in data.downstream "
                           f"({', '.join(cfg.data.downstream)})")
        ds = _container(cfg.data.downstream[key])
        ds = {**ds, "name": key, "eval_path": resolve_path(ds["eval_path"]),
              "train_path": resolve_path(ds.get("train_path"))}
        for which in d.models:
            for k in d.shots:
                unit = out_dir / f"{key}_{which}_k{k}.json"
                if unit.exists():  # finished unit of a resumed stage
                    results[unit.stem] = json.loads(unit.read_text())["metrics"]
                    continue
                metrics, rows = run_downstream(loaders[which], ds, int(k), cfg.trainer, _container(d.finetune),
                                               seed=int(cfg.seed), max_source_length=int(t.pretrain.max_source_length))
                write_json(unit, {"metrics": metrics, "predictions": rows})
                results[unit.stem] = metrics
                tracker.log_metrics({f"cmp/downstream/{unit.stem}/{m}": v for m, v in metrics.items()})
    return results


def _report(summary: dict) -> str:
    lines = ["# CMP run report", ""]
    pre = summary.get("pretrain", {})
    if pre:
        lines += ["## Pre-training (validation loss, summed over tasks)", "",
                  "| | " + " | ".join(pre["final"]) + " |", "|---" * (len(pre["final"]) + 1) + "|",
                  "| before | " + " | ".join(f"{pre['initial'].get(k, float('nan')):.3f}" for k in pre["final"]) + " |",
                  "| after | " + " | ".join(f"{v:.3f}" for v in pre["final"].values()) + " |", "",
                  f"{pre['steps']} steps in {pre['train_seconds']:.0f} s", ""]
    zs = summary.get("zero_shot", {})
    if zs:
        lines += ["## Zero-shot held-out synthetic comparative QA", "", "| model | EM | F1 | n |", "|---|---|---|---|"]
        lines += [f"| {m}{' (' + repr(v['answer']) + ')' if 'answer' in v else ''} | {v['em']:.2f} | {v['f1']:.2f} "
                  f"| {v['n']} |" for m, v in zs.items()]
        lines.append("")
    ds = summary.get("downstream", {})
    if ds:
        lines += ["## Downstream", "", "| run | metrics |", "|---|---|"]
        lines += [f"| {k} | " + ", ".join(f"{m}={v}" if m == "n" else f"{m}={v:.2f}" for m, v in r.items()) + " |"
                  for k, r in ds.items()]
    return "\n".join(lines) + "\n"


def run(cfg: DictConfig) -> dict:
    t = cfg.task
    bad = [x for x in t.tasks if x not in TASKS]
    if bad or not t.tasks:
        raise ValueError(f"task.tasks must be a non-empty subset of {list(TASKS)}, got {list(t.tasks)}")
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    logger = build_logger(cfg.logger)
    tracker = Tracker(logger, run_dir)
    write_text(run_dir / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))

    corpus = resolve_path(cfg.data.corpus) or BUNDLED / "corpus.jsonl"
    quints = cut_documents(load_quintuples(corpus, check_links=bool(cfg.data.check_links)), int(t.segment_sentences))
    splits = split_quintuples(quints, float(cfg.data.val_fraction), float(cfg.data.test_fraction), int(cfg.seed))
    log.info("CMP corpus %s: %s", corpus, {k: len(v) for k, v in splits.items()})
    if not splits["validation"] or not splits["test"]:
        raise ValueError(f"{corpus}: need validation and test quintuples (got {len(splits['validation'])}, "
                         f"{len(splits['test'])}); adjust data.val_fraction / data.test_fraction")

    realiser_cfg = _container(t.summary.realiser)
    fp_text = fingerprint(corpus, realiser_cfg)
    run_stage(run_dir / "textualize", fp_text, lambda d: textualize(quints, realiser_cfg, d), "textualize")
    summaries = {r["id"]: r["summary"] for r in read_jsonl(run_dir / "textualize" / "summaries.jsonl")}

    summary = {"corpus": str(corpus), "splits": {k: len(v) for k, v in splits.items()}, "tasks": list(t.tasks)}
    fp_pre = fingerprint(fp_text, t.model, list(t.tasks), _container(t.get("mix")), _container(t.pretrain),
                         _container(t.infilling), t.sep, int(cfg.seed), float(cfg.data.val_fraction),
                         float(cfg.data.test_fraction))
    summary["pretrain"] = run_stage(run_dir / "pretrain", fp_pre,
                                    lambda d: pretrain(cfg, splits, summaries, d, logger), "pretrain")
    pre = summary["pretrain"]
    tracker.log_metrics({f"cmp/pretrain_{when}/{k}": v for when in ("initial", "final") for k, v in pre[when].items()})
    model_dir = run_dir / "pretrain" / "model"

    fp_eval = fingerprint(fp_pre, _container(t.eval))
    summary["zero_shot"] = run_stage(run_dir / "eval", fp_eval,
                                     lambda d: zero_shot_eval(cfg, splits, summaries, model_dir, d, tracker), "eval")
    if t.downstream.datasets:
        fp_ds = fingerprint(fp_pre, _container(t.downstream), _container(cfg.data.downstream))
        summary["downstream"] = run_stage(run_dir / "downstream", fp_ds,
                                          lambda d: downstream(cfg, model_dir, d, tracker), "downstream")
    write_json(run_dir / "report.json", summary)
    write_text(run_dir / "report.md", _report(summary))
    log.info("CMP report: %s\n%s", run_dir / "report.md", _report(summary))
    tracker.finish()
    return summary
