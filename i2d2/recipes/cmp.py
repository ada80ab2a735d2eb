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
import shutil
import time
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from i2d2.config import ConfigError
from i2d2.lightning_setup import plain as _container  # config node -> plain dicts/lists
from i2d2.cmp.data import BUNDLED, Quintuple, load_quintuples, split_leaks, split_quintuples
from i2d2.recipes.cmp_runners import evaluate_synthetic_qa, run_downstream
from i2d2.cmp.tasks import (TASKS, Collator, ExampleBuilder, eos_id, make_truncator, mask_token_for,
                            resolve_separator, tokenizer_lowercases, untrained_parts)
from i2d2.cmp.textualize import cut_documents, qa_pairs
from i2d2.io import atomic_dir, fingerprint, model_fingerprint, named, read_jsonl, run_stage, write_json, write_jsonl, \
    write_text
from i2d2.lightning_setup import build_trainer, checkpoint_weights, fit_settings, full_weights, resume_checkpoint
from i2d2.models import load_seq2seq
from i2d2.resume import seed_fit
from i2d2.tracking import Tracker, publish_report, tracked_run

log = logging.getLogger(__name__)
# runs in one process: python -m i2d2.train refuses a trainer config asking for several at start-up
ONE_PROCESS = True
PROMPT_RESERVE = 64  # source tokens kept for the prompt and question; the rest is split over D1 and D2


def check_config(cfg) -> None:
    """Refused by ``python -m i2d2.train`` before anything loads."""
    from i2d2.config import is_int, is_num, need, need_counts, need_one_pass

    need_one_pass(cfg, "cmp", "one pre-training / evaluation pass")
    need_counts(cfg, "task.pretrain.batch_size", "task.pretrain.eval_batch_size", "task.eval.batch_size",
                "task.pretrain.max_steps", "task.pretrain.val_every")
    r = cfg.task.infilling.mask_ratio  # 0 masks nothing (infilling becomes copying); above 1 is no share
    need(is_num(r) and 0 < r <= 1, "task.infilling.mask_ratio", f"must be in (0, 1], got {r!r}")
    lam = cfg.task.infilling.poisson_lambda  # 0 draws only empty spans: masking would never finish
    need(is_num(lam) and lam > 0, "task.infilling.poisson_lambda", f"must be > 0 (mean span length), got {lam!r}")
    seg = cfg.task.segment_sentences  # 0 divided by zero in cut_documents; < 0 cut documents at random places
    need(is_int(seg) and seg >= 1, "task.segment_sentences", f"must be an integer >= 1, got {seg!r}")
    check_tasks(cfg.task)
    check_pretrain(cfg)
    check_data(cfg)
    # a weight that names no task was never read (a misspelt one left its task at the default weight, 1);
    # a weight <= 0 failed in pre-training, after the textualize stage
    mix = _container(cfg.task.get("mix")) or {}
    need(isinstance(mix, dict), "task.mix", f"must be a map of task -> weight, got {mix!r}")
    for name, w in mix.items():
        need(name in TASKS, f"task.mix.{name}", f"not a CMP task (those: {list(TASKS)})")
        need(is_num(w) and w > 0, f"task.mix.{name}", f"must be a number > 0, got {w!r}")
    limit = cfg.task.eval.get("limit")  # -1 evaluated every test quintuple but the last (held_out[:-1])
    need(limit is None or (is_int(limit) and limit >= 1), "task.eval.limit",
         f"must be null (every test quintuple) or an integer >= 1, got {limit!r}")
    if cfg.task.downstream.datasets:  # checked in the run before, after the lock and the tracker had started
        if any(str(k) != "0" for k in cfg.task.downstream.shots):  # zero-shot alone never reads finetune.*
            # dev_size: a count of items held out of train_path (int(): 0.5 was read as 0, 1.5 as 1), checked
            # against the file by check_downstream_settings where no dev_path is given
            need_counts(cfg, "task.downstream.finetune.steps", "task.downstream.finetune.eval_every",
                        "task.downstream.finetune.dev_size", "task.downstream.finetune.batch_size")
            n = cfg.task.downstream.finetune.get("max_target_length")  # the Collator as in pre-training: n-1 + EOS
            need(is_int(n) and n >= 2, "task.downstream.finetune.max_target_length",
                 f"must be an integer >= 2 (one token is the end of sequence), got {n!r}")
        try:
            check_downstream_settings(cfg)
        except (KeyError, ValueError, OSError) as e:
            raise ConfigError(e.args[0] if isinstance(e, KeyError) else str(e)) from None


def check_pretrain(cfg) -> None:
    """task.pretrain's optimiser settings and lengths: lr=-1 or warmup_ratio=3 trained without a word, a length of 0
    failed in the tokenizer only after the textualize stage."""
    from i2d2.config import is_int, is_num, need, need_counts

    pre = cfg.task.pretrain
    need_counts(cfg, "task.pretrain.max_source_length", "task.eval.max_new_tokens")
    need_counts(cfg, "task.pretrain.val_max_per_task", null_ok=True)  # 0 was read as null (all), -1 failed in numpy
    n = pre.max_target_length  # targets are cut to n - 1 tokens and end with EOS: 1 left nothing to learn
    need(is_int(n) and n >= 2, "task.pretrain.max_target_length",
         f"must be an integer >= 2 (one token is the end of sequence), got {n!r}")
    need(is_num(pre.lr) and pre.lr > 0, "task.pretrain.lr", f"must be > 0, got {pre.lr!r}")
    need(is_num(pre.weight_decay) and pre.weight_decay >= 0, "task.pretrain.weight_decay",
         f"must be >= 0, got {pre.weight_decay!r}")
    w = pre.warmup_ratio  # a share of task.pretrain.max_steps
    need(is_num(w) and 0 <= w < 1, "task.pretrain.warmup_ratio", f"must be in [0, 1), got {w!r}")


def check_data(cfg) -> None:
    """data.split_by, data.val_fraction / data.test_fraction and data.corpus, read only by the first stage (after the
    run lock and the tracker had started)."""
    from i2d2.config import is_num, need

    d = cfg.data
    by = d.get("split_by", "entity")
    need(by in ("entity", "field"), "data.split_by",
         f"must be entity (held-out entities) or field (the rows' own 'split' fields), got {by!r}")
    fractions = {key: d.get(key) for key in ("val_fraction", "test_fraction")}
    for key, f in fractions.items():
        need(is_num(f), f"data.{key}", f"must be a number in (0, 1), got {f!r}")
        # a share of each category's entities, held out: 0 left the split empty, which make_splits refuses
        need(by == "field" or 0 < f < 1, f"data.{key}", f"must be in (0, 1), got {f!r}")
    total = sum(fractions.values())
    need(by == "field" or total < 1, "data.val_fraction + data.test_fraction",
         f"must be < 1 (training keeps the rest), got {total!r}")
    corpus = resolve_path(d.corpus) or BUNDLED / "corpus.jsonl"
    need(corpus.is_file(), "data.corpus", f"quintuple file {corpus} not found")
    try:  # its rows (every problem, file:line) and the split they make: both failed in the first stage, after the
        # run lock and the tracker had started, with a traceback (the bundled corpus: a quarter of a second)
        _splits(cfg, load_quintuples(corpus, check_links=bool(d.check_links)), corpus)
    except ValueError as e:
        raise ConfigError(f"data.corpus: {e}") from None


def check_tasks(t) -> None:
    """task.tasks: a non-empty list of the Table 2 tasks."""
    bad = [x for x in t.tasks if x not in TASKS]
    if bad or not t.tasks:
        raise ConfigError(f"task.tasks: must be a non-empty subset of {list(TASKS)}, got {list(t.tasks)}")


def resolve_path(p: str | None) -> Path | None:
    """``bundled:<rel>`` names a file shipped under i2d2/data/cmp/; anything else is a path."""
    if p in (None, "", "bundled"):
        return None
    p = str(p)
    return BUNDLED / p[len("bundled:"):] if p.startswith("bundled:") else Path(p).expanduser()


def load_model(name: str, t: DictConfig, seed: int | None = None):
    """``(model, tokenizer, separator)``: a seq2seq model with its D1/D2 separator (never its EOS). ``seed`` fixes
    the weights a warm-started model draws at random (packaged:minilm's cross-attention), which otherwise follow
    whatever state the RNG was left in: 'base' is then the model pre-training started from, in a rerun too."""
    if seed is not None:
        seed_fit(seed)
    model, tok = load_seq2seq(name)
    return model, tok, resolve_separator(model, tok, str(t.get("sep", "auto")))


def _builder(tok, t: DictConfig, summaries: dict, sep: str) -> ExampleBuilder:
    pre = t.pretrain
    budget = max(16, (int(pre.max_source_length) - PROMPT_RESERVE) // 2)
    inf = t.infilling
    return ExampleBuilder(summaries, inf.mask_token or mask_token_for(tok), sep=sep, mask_ratio=float(inf.mask_ratio),
                          poisson_lambda=float(inf.poisson_lambda), trunc=make_truncator(tok, budget))


def textualize(quints: list[Quintuple], realiser_cfg, out_dir: Path) -> dict:
    realiser = hydra.utils.instantiate(realiser_cfg)
    texts = realiser(quints)
    write_jsonl(out_dir / "summaries.jsonl", [{"id": q.id, "summary": s} for q, s in zip(quints, texts)])
    return {"n": len(texts)}


# the Trainer arguments pretrain sets itself (the trainer config's are replaced): not part of its fingerprint
PRETRAIN_FIT_ARGS = ("max_steps", "max_epochs", "logger", "callbacks", "default_root_dir", "val_check_interval",
                     "check_val_every_n_epoch", "num_sanity_val_steps", "enable_checkpointing")


def pretrain(cfg: DictConfig, splits: dict, summaries: dict, out_dir: Path, logger) -> dict:
    from i2d2.lightning_setup import ModelCheckpoint  # resumable in a run folder that moved

    from i2d2.resume import EpochProgress, ResumeState
    from trainers.cmp import CMPModule, MixedTaskBatches, TaskBatches, per_task_sizes, train_loader, val_loader

    t, pre = cfg.task, cfg.task.pretrain
    tasks = list(t.tasks)
    model, tok, sep = load_model(t.model, t, seed=int(cfg.seed))
    untrained = untrained_parts(model)
    builder = _builder(tok, t, summaries, sep)
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
    # no version counter: a killed run's best.ckpt is overwritten by the rerun, not kept beside a best-v1.ckpt
    ckpt = ModelCheckpoint(dirpath=ckpt_dir, filename="best", monitor="val/loss", mode="min", save_top_k=1,
                           save_last=True, enable_version_counter=False)
    # exact resume (i2d2/resume.py): the loader's position and the RNG state travel in last.ckpt
    progress = EpochProgress()
    trainer = build_trainer(  # PRETRAIN_FIT_ARGS
        cfg.trainer, micro_batch=int(pre.batch_size), max_steps=steps, max_epochs=-1,
        logger=logger if logger is not None else False, callbacks=[ResumeState(progress, "cmp"), ckpt],
        default_root_dir=str(out_dir),
        val_check_interval=min(int(pre.val_every), steps) * accum, check_val_every_n_epoch=None,
        num_sanity_val_steps=0, enable_checkpointing=True)
    initial_path = out_dir / "initial_val.json"
    if initial_path.exists():  # resumed run: the untrained model's loss was measured already
        initial = json.loads(initial_path.read_text())
    else:
        trainer.validate(module, val_loader(module, val_ds), verbose=False)
        initial = module.last_val
        write_json(initial_path, initial)
    # a fresh fit starts from the same RNG state whatever ran before it in this process (the initial validation
    # draws from it and is skipped by a rerun); a resumed fit takes the checkpoint's RNG state instead
    seed_fit(int(cfg.seed))
    t0 = time.time()
    trainer.fit(module, train_loader(module, train_ds, progress=progress), val_loader(module, val_ds),
                ckpt_path=resume_checkpoint(ckpt_dir / "last.ckpt", trainer))
    train_s = time.time() - t0
    # the steps after the last val_every check (max_steps not a multiple of it) were never scored, so best.ckpt
    # could not be them: score the final weights too and keep them unless an earlier checkpoint did better
    trainer.validate(module, val_loader(module, val_ds), verbose=False)
    final = module.last_val
    best = ckpt.best_model_score
    use_best = bool(ckpt.best_model_path) and best is not None and float(best) < final["val/loss"]
    if use_best:
        state = checkpoint_weights(ckpt.best_model_path) if trainer.is_global_zero else None
        with full_weights(trainer, module, modifier_rank=0):  # ZeRO-3: rank 0 loads, every rank gets the weights
            if trainer.is_global_zero:
                module.load_state_dict(state)
        trainer.validate(module, val_loader(module, val_ds), verbose=False)
        final = module.last_val
    with full_weights(trainer, module):
        if trainer.is_global_zero:
            with atomic_dir(out_dir / "model") as tmp:
                model.save_pretrained(tmp)
                tok.save_pretrained(tmp)
    if not t.get("keep_checkpoints", False):
        shutil.rmtree(ckpt_dir, ignore_errors=True)
    summary = {"initial": initial, "final": final, "steps": int(trainer.global_step), "train_seconds": train_s,
               # None: the final weights scored best and were kept
               "best_checkpoint": Path(ckpt.best_model_path).name if use_best else None,
               # the validation examples behind val/loss (val_max_per_task caps them), per task
               "val_examples": val_ds.counts(),
               "per_step_examples": sizes, "separator": sep, "untrained_at_start": untrained,
               "tokenizer_lowercases": tokenizer_lowercases(tok)}
    write_json(out_dir / "metrics.json", summary)
    return summary


def zero_shot_eval(cfg, splits, summaries, model_dir: Path, out_dir: Path, tracker: Tracker) -> dict:
    from collections import Counter

    from i2d2.cmp.evaluation import normalize_answer

    t, ev = cfg.task, cfg.task.eval
    held_out = splits["test"]
    if ev.get("limit"):
        held_out = held_out[: int(ev.limit)]
    candidates = {"pretrained": lambda: load_model(str(model_dir), t)}
    if ev.get("compare_base", True):
        candidates = {"base": lambda: load_model(t.model, t, seed=int(cfg.seed)), **candidates}
    out = {}
    for name, loader in candidates.items():
        model, tok, sep = loader()
        metrics, rows = evaluate_synthetic_qa(model, tok, held_out, _builder(tok, t, summaries, sep),
                                              int(ev.batch_size), int(t.pretrain.max_source_length),
                                              int(ev.max_new_tokens))
        write_jsonl(out_dir / f"predictions_{name}.jsonl", rows)
        # a model that gives one answer to everything scores like the constant baseline: say so beside its F1
        answers = Counter(normalize_answer(r["prediction"]) for r in rows)  # as EM reads them: 'No' = 'no.'
        top_pred, n_top = answers.most_common(1)[0] if rows else (None, 0)
        metrics = {**metrics, "n_distinct_predictions": len(answers),
                   "top_prediction": top_pred, "top_prediction_share": n_top / len(rows) if rows else None}
        out[name] = metrics  # its numbers reach the loggers once, with the report (cmp/zero_shot/<name>/*)
        # W&B off: in the stage's folder beside the predictions (at the top of run_dir it was written only when the
        # stage ran, and no _DONE record covered it); a finished eval/ from before keeps its recorded outputs
        tracker.log_table(f"cmp/zero_shot/{name}/samples", ["template", "question", "answer", "prediction"],
                          [[r["template"], r["question"], r["answer"], r["prediction"]] for r in rows[:50]], out_dir)
        del model
    # reference point: always answering the most frequent training answer (e.g. "yes")
    from i2d2.cmp.evaluation import qa_scores

    top = Counter(p.answer for q in splits["train"] for p in qa_pairs(q)).most_common(1)[0][0]
    refs = [p.answer for q in held_out for p in qa_pairs(q)]
    out["constant"] = {**qa_scores([top] * len(refs), refs), "answer": top}
    write_json(out_dir / "metrics.json", out)
    return out


def downstream_dataset(cfg: DictConfig, key: str) -> dict:
    """``data.downstream[key]`` with resolved paths and its ``smoke`` flag: files under the bundled
    fixtures (a handful of items, for checking that a run works) are smoke unless said otherwise."""
    if key not in cfg.data.downstream:
        raise KeyError(f"task.downstream.datasets names {key!r}, not in data.downstream "
                       f"({', '.join(cfg.data.downstream)})")
    ds = _container(cfg.data.downstream[key])
    ds = {**ds, "name": key, **{k: resolve_path(ds.get(k)) for k in ("eval_path", "train_path", "dev_path")}}
    fixtures = BUNDLED / "fixtures"
    ds["smoke"] = bool(ds.get("smoke", any(p is not None and p.resolve().is_relative_to(fixtures)
                                           for p in (ds["eval_path"], ds["train_path"], ds["dev_path"]))))
    return ds


def downstream_protocol(t: DictConfig) -> dict:
    d = t.downstream
    return {"seeds": list(d.seeds), "lr_grid": list(d.lr_grid), "allow_fewer_shots": bool(d.allow_fewer_shots),
            "finetune": _container(d.finetune)}


def check_downstream_settings(cfg: DictConfig) -> None:
    """Refuse impossible fine-tuning settings (k > training items, no dev set) before pre-training."""
    from i2d2.cmp.downstream import load_downstream
    from i2d2.recipes.cmp_runners import check_eval_disjoint, dev_and_pool, shot_count

    d = cfg.task.downstream
    bad = [m for m in d.models if m not in ("base", "pretrained")]
    if bad:
        raise ValueError(f"task.downstream.models: {bad} not base or pretrained")
    bad = [k for k in d.shots if str(k) != "full" and not (isinstance(k, int) and k >= 0)]
    if bad:  # a negative k trained on all of the pool but the last k items
        raise ValueError(f"task.downstream.shots: {bad} not 0 (zero-shot), a number of items >= 1 or full")
    tuned = [k for k in d.shots if str(k) != "0"]
    if tuned and not (d.seeds and d.lr_grid):
        raise ValueError("task.downstream.seeds and task.downstream.lr_grid must not be empty (fine-tuned shots "
                         f"{list(tuned)})")
    for key in d.datasets:
        ds = downstream_dataset(cfg, key)
        # zero-shot alone (the default shots: [0]) read no file here: a missing one failed after pre-training, as
        # "<path>: downstream file not found" (exit 1), naming no key
        for which in ("eval_path",) + (("train_path", "dev_path") if tuned else ()):
            if ds.get(which) is not None and not Path(ds[which]).exists():
                raise ValueError(f"data.downstream.{key}.{which}: downstream file {ds[which]} not found")
        if tuned:
            task = ds.get("task") or "qa"
            dev, pool, _ = dev_and_pool(ds, task, int(d.finetune.get("dev_size", 100)))
            # a dev_path naming the evaluation file picked checkpoints and learning rates on the reported rows
            check_eval_disjoint(ds, load_downstream(ds["eval_path"], ds["format"], task, ds.get("types")), dev, pool)
            for k in tuned:
                shot_count(k, len(pool), key, bool(d.allow_fewer_shots))


def downstream(cfg, model_dir: Path, out_dir: Path) -> dict:
    t, d = cfg.task, cfg.task.downstream
    loaders = {"pretrained": lambda: load_model(str(model_dir), t), "base": lambda: load_model(t.model, t)}
    protocol = downstream_protocol(t)
    results = {}
    for key in d.datasets:
        ds = downstream_dataset(cfg, key)
        for which in d.models:
            for k in d.shots:
                unit = out_dir / f"{key}_{which}_k{k}.json"
                if not unit.exists():  # else: finished unit of a resumed stage
                    # zero-shot base: seeded as in pre-training (fine-tuned settings seed each run themselves)
                    loader = (lambda: load_model(t.model, t, seed=int(cfg.seed))) if which == "base" and str(k) == "0" \
                        else loaders[which]
                    res = run_downstream(loader, ds, k, cfg.trainer, protocol,
                                         max_source_length=int(t.pretrain.max_source_length))
                    write_json(unit, {**res, "model": which, "smoke": ds["smoke"]})
                res = {m: v for m, v in json.loads(unit.read_text()).items() if m != "predictions"}
                results[unit.stem] = res  # logged with the report: cmp/downstream/<unit>/metrics/*
    return results


def _fmt(v, sd=None) -> str:
    return f"{v:.2f}" if sd is None else f"{v:.2f} ± {sd:.2f}"


def _downstream_rows(runs: dict) -> list[str]:
    lines = ["| dataset (eval file, n) | model | setting | metrics | seeds | lr (by dev) |",
             "|---|---|---|---|---|---|"]
    for r in runs.values():
        setting = "zero-shot" if r["k"] == "0" else "full data" if r["k"] == "full" else f"{r['k']}-shot"
        if r["k"] != "0":
            setting += f" ({r['k_used']} train, dev {r['n_dev']})"
        std = r.get("std") or {}
        metrics = ", ".join(f"{m} {_fmt(v, std.get(m))}" for m, v in r["metrics"].items() if m != "n")
        lr = f"{r['lr']:g} of {'/'.join(map(str, r['dev_by_lr']))}" if r.get("lr") is not None else "–"
        lines.append(f"| {r['dataset']} ({Path(r['eval_file']).name}, {r['n_eval']}) | {r['model']} | {setting} "
                     f"| {metrics} | {r['n_seeds']} | {lr} |")
    return lines


def _model_notes(summary: dict) -> list[str]:
    pre = summary.get("pretrain", {})
    notes = []
    if pre.get("untrained_at_start"):
        notes.append(f"- **{summary.get('model')} starts with untrained weights**: "
                     f"{', '.join(pre['untrained_at_start'])} are randomly initialised (warm-started "
                     "encoder-decoder), so 'base' numbers measure a model whose decoder cannot yet read the "
                     "encoder, and pre-training has to learn cross-attention from scratch.")
    if pre.get("tokenizer_lowercases"):
        notes.append("- The tokenizer folds case (uncased vocabulary; no cased tokenizer fits these weights "
                     "offline): outputs are lower-case, so BLEU is reported case-insensitively as `bleu_uncased`.")
    if pre.get("separator"):
        notes.append(f"- D1/D2 separator: `{pre['separator']}` (distinct from the end-of-sequence token).")
    return notes


def _short(text: str, n: int = 40) -> str:
    """A model's answer for a report cell: cut to ``n`` characters, '|' escaped (it would end the table cell)."""
    text = text if len(text) <= n else text[: n - 1] + "…"
    return text.replace("|", "\\|")


def _report(summary: dict) -> str:
    lines = ["# CMP run report", ""]
    notes = _model_notes(summary)
    if notes:
        lines += ["## Model", "", *notes, ""]
    pre = summary.get("pretrain", {})
    if pre.get("final"):
        counts = pre.get("val_examples")
        lines += ["## Pre-training (validation loss, summed over tasks)", "",
                  # the validation split picked pretrain/model: its 'after' is a selected minimum, never a result
                  "Measured on the validation split, the split that picked the checkpoint (lowest `val/loss`): "
                  "'after' is the best of the checkpoints scored, not a held-out estimate"
                  + (f"; validation examples per task: {', '.join(f'{k} {n}' for k, n in counts.items())}"
                     if counts else "")
                  + ".", "",
                  "| | " + " | ".join(pre["final"]) + " |", "|---" * (len(pre["final"]) + 1) + "|",
                  "| before | " + " | ".join(f"{pre['initial'].get(k, float('nan')):.3f}" for k in pre["final"]) + " |",
                  "| after | " + " | ".join(f"{v:.3f}" for v in pre["final"].values()) + " |", "",
                  f"{pre['steps']} steps (the time they took: report.json, `pretrain.train_seconds`)", ""]
    zs, sp = summary.get("zero_shot", {}), summary.get("splits", {})
    if zs:
        # 'unseen entities' only where the test split shares nothing with training (a data.split_by=field split can)
        shared = sum(sp["shared_with_train"]["test"].values()) if sp else None
        lines += [f"## Zero-shot synthetic comparative QA on {'the test split' if shared else 'unseen entities'}", ""]
        if {"qa", "qag"} & set(summary.get("tasks", [])):
            # the test asks what pre-training taught (same templates, qa: same prompt) about other entities
            seen = [x for x in summary["tasks"] if x in ("qa", "qag")]
            lines += [f"Pre-training ({', '.join(seen)}) trained the model on these Table 1 templates for the training "
                      f"entities{', in this very prompt' if 'qa' in seen else ''}: for the pre-trained model this test "
                      "is zero-shot only in its entities; for base it is zero-shot.", ""]
        if sp:
            lines += [f"Split by {sp['by']} (seed {summary.get('seed')}): {sp['train']} train / {sp['validation']} "
                      f"validation / {sp['test']} test quintuples ({sp['dropped']} dropped: they pair a training "
                      f"entity with a held-out one); test entities {sp['entities']['test']}, entities, documents "
                      f"and facts shared with training: {sum(sp['shared_with_train']['test'].values())}.", ""]
        const = zs.get("constant")
        for m, v in zs.items():
            share = v.get("top_prediction_share") or 0
            top = (f"it answers '{_short(v['top_prediction'])}' to {share:.1%} of the questions"
                   if share >= 0.5 else "")
            if m != "constant" and const and v["f1"] <= const["f1"]:
                lines += [f"> **Warning: {m} does not beat always answering {const['answer']!r}** (F1 {v['f1']:.2f} "
                          f"against {const['f1']:.2f}){'; ' + top if top else ''}.", ""]
            elif m != "constant" and share >= 0.9:
                lines += [f"> **Warning: {m} nearly always gives one answer**: {top} (F1 {v['f1']:.2f}, the constant "
                          f"answer's {const['f1']:.2f})." if const else f"> **Warning: {m}: {top}.**", ""]
        lines += ["| model | EM | F1 | n | distinct answers (most common, share) |", "|---|---|---|---|---|"]
        lines += [f"| {m}{' (' + repr(v['answer']) + ')' if 'answer' in v else ''} | {v['em']:.2f} | {v['f1']:.2f} "
                  f"| {v['n']} | " + (f"{v['n_distinct_predictions']} ('{_short(v['top_prediction'])}', "
                                      f"{v['top_prediction_share']:.1%})" if v.get("top_prediction") is not None
                                      else "–") + " |" for m, v in zs.items()]
        lines.append("")
    ds = summary.get("downstream", {})
    real = {k: r for k, r in ds.items() if not r.get("smoke")}
    smoke = {k: r for k, r in ds.items() if r.get("smoke")}
    if real:
        lines += ["## Downstream", "", "Mean ± std over seeds; fine-tuned settings keep the best dev checkpoint by "
                  "F1 (QA), BLEU (QG) or ROUGE-L (summaries) and the learning rate with the best mean dev score.", "",
                  *_downstream_rows(real), ""]
    if smoke:
        lines += ["## Smoke checks on bundled fixtures (not results)", "",
                  "These runs use the handful of items shipped in i2d2/data/cmp/fixtures to check that the pipeline "
                  "works; their numbers say nothing about the model. Point data.downstream.<name>.eval_path / "
                  "train_path at the released files for results.", "", *_downstream_rows(smoke), ""]
    return "\n".join(lines) + "\n"


def _splits(cfg: DictConfig, quints: list[Quintuple], corpus: Path) -> dict:
    """``split_quintuples`` by the config; a split with no validation or test quintuple is an error."""
    by = str(cfg.data.get("split_by", "entity"))
    splits = split_quintuples(quints, float(cfg.data.val_fraction), float(cfg.data.test_fraction), int(cfg.seed), by)
    if not splits["validation"] or not splits["test"]:
        raise ValueError(f"{corpus}: need validation and test quintuples (got {len(splits['validation'])}, "
                         f"{len(splits['test'])}); raise data.val_fraction / data.test_fraction")
    return splits


def make_splits(cfg: DictConfig, quints: list[Quintuple], corpus: Path) -> tuple[dict, dict]:
    """Train/validation/test by ``data.split_by`` (default: by entity), with a summary of what each
    split holds and what it shares with training (must be nothing for entity splits)."""
    by = str(cfg.data.get("split_by", "entity"))
    splits = _splits(cfg, quints, corpus)
    leaks = split_leaks(splits)
    n_leaks = {s: {k: len(v) for k, v in kinds.items()} for s, kinds in leaks.items()}
    if by == "entity" and any(any(v.values()) for v in n_leaks.values()):
        raise AssertionError(f"entity split leaks into training: {leaks}")  # split_quintuples guarantees none
    info = {"by": by, **{s: len(splits[s]) for s in ("train", "validation", "test", "dropped")},
            "entities": {s: len({e for q in splits[s] for e in (q.e1, q.e2)}) for s in ("train", "validation", "test")},
            "shared_with_train": n_leaks}
    log.info("CMP corpus %s split by %s: %s", corpus, by, info)
    if by == "field" and any(any(v.values()) for v in n_leaks.values()):
        log.warning("%s: the rows' own splits share entities/documents/facts with training: %s", corpus, n_leaks)
    return splits, info


def pretrain_fingerprint(cfg: DictConfig, fp_text: str, split_info: dict) -> str:
    """The pre-training stage's inputs (eval and downstream include it)."""
    t = cfg.task
    # the trainer too (eval and downstream follow): accumulate_grad_batches or precision changed kept the old model
    return fingerprint(fp_text, named("model", model_fingerprint(t.model)),
                       named("pretrain format version", "cmp-pretrain-v1"),
                       named("trainer settings", fit_settings(cfg.trainer, PRETRAIN_FIT_ARGS)),
                       named("tasks", list(t.tasks)), named("mix", _container(t.get("mix"))),
                       named("pretrain config", _container(t.pretrain)),
                       named("infilling config", _container(t.infilling)),
                       named("sep", t.sep), named("seed", int(cfg.seed)),
                       named("val_fraction", float(cfg.data.val_fraction)),
                       named("test_fraction", float(cfg.data.test_fraction)), named("splits", split_info),
                       # the documents pre-training (and evaluation) read are cut to this many sentences; the
                       # default stays out of the hash so that runs from before it was fingerprinted keep theirs
                       *([named("segment config", {"segment_sentences": int(t.segment_sentences)})]
                         if int(t.segment_sentences) != 10 else []))


def run(cfg: DictConfig) -> dict:
    t = cfg.task
    check_tasks(t)
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_text(run_dir / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
    with tracked_run(cfg, run_dir) as tracker:
        return _run(cfg, run_dir, tracker)


def _run(cfg: DictConfig, run_dir: Path, tracker: Tracker) -> dict:
    t, logger = cfg.task, tracker.logger

    corpus = resolve_path(cfg.data.corpus) or BUNDLED / "corpus.jsonl"
    quints = cut_documents(load_quintuples(corpus, check_links=bool(cfg.data.check_links)), int(t.segment_sentences))
    splits, split_info = make_splits(cfg, quints, corpus)
    if t.downstream.datasets:
        check_downstream_settings(cfg)

    realiser_cfg = _container(t.summary.realiser)
    fp_text = fingerprint(corpus, named("realiser config", realiser_cfg),  # corpus bytes; v: the stage's output format
                          named("textualize format version", "cmp-textualize-v1"))
    run_stage(run_dir / "textualize", fp_text, lambda d: textualize(quints, realiser_cfg, d), "textualize")
    summaries = {r["id"]: r["summary"] for r in read_jsonl(run_dir / "textualize" / "summaries.jsonl")}

    summary = {"corpus": str(corpus), "model": t.model, "seed": int(cfg.seed), "splits": split_info,
               "tasks": list(t.tasks)}
    fp_pre = pretrain_fingerprint(cfg, fp_text, split_info)
    summary["pretrain"] = run_stage(run_dir / "pretrain", fp_pre,
                                    lambda d: pretrain(cfg, splits, summaries, d, logger), "pretrain")
    model_dir = run_dir / "pretrain" / "model"

    # v2: answer counts per model; v3: n per template
    fp_eval = fingerprint(fp_pre, named("eval config", _container(t.eval)), named("eval format version", "cmp-eval-v3"))
    summary["zero_shot"] = run_stage(run_dir / "eval", fp_eval,
                                     lambda d: zero_shot_eval(cfg, splits, summaries, model_dir, d, tracker), "eval")
    if t.downstream.datasets:
        # the bytes of every file the chosen datasets read, not only their paths: an edited file is a new input
        ds_cfg = _container(cfg.data.downstream)
        ds_files = [resolve_path(ds_cfg.get(name, {}).get(k)) for name in t.downstream.datasets
                    for k in ("eval_path", "train_path", "dev_path")]
        fp_ds = fingerprint(fp_pre, named("downstream config", _container(t.downstream)),
                            named("downstream data config", ds_cfg), *[f for f in ds_files if f is not None])
        summary["downstream"] = run_stage(run_dir / "downstream", fp_ds,
                                          lambda d: downstream(cfg, model_dir, d), "downstream")
    # every stage's numbers reach the loggers here, once, also when a stage is reused: cmp/pretrain/{initial,final}/*,
    # cmp/zero_shot/<model>/*, cmp/downstream/<unit>/*; those measured on labelled rows that chose nothing are named
    # test_*: the zero-shot QA on the test split, a downstream unit's scores (and their spread over seeds) on its
    # evaluation file (its learning rate is chosen on rows held out of its train file: dev_by_lr)
    publish_report(run_dir, summary, _report(summary), tracker, prefix="cmp",
                   splits={"zero_shot": "test", "downstream/*/metrics": "test", "downstream/*/std": "test"})
    log.info("CMP report:\n%s", _report(summary))
    return summary
