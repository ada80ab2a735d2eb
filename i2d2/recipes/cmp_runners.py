"""Zero-shot, few-shot and full-data fine-tune-and-evaluate runners.

``evaluate_synthetic_qa`` scores a model on held-out synthetic comparative QA (all Table 1 templates
of held-out quintuples); ``run_downstream`` runs one downstream setting the way A.3 describes: for
k > 0 (or ``full``) it fine-tunes once per (learning rate, seed), keeps the checkpoint with the best
dev score by the paper's metric (F1 / BLEU / ROUGE-L), picks the learning rate with the best mean
dev score and reports the evaluation file's metrics as mean ± std over the seeds.
"""

from __future__ import annotations

import logging
from collections import defaultdict

import numpy as np

from i2d2.cmp.data import Quintuple
from i2d2.cmp.downstream import DownstreamExample, load_downstream
from i2d2.cmp.evaluation import qa_scores, selection_metric, task_scores
from i2d2.cmp.tasks import (SEP, Collator, Example, ExampleBuilder, eos_id, generate, make_truncator, source_text,
                            tokenizer_lowercases)

log = logging.getLogger(__name__)
MAX_NEW_TOKENS = {"qa": 32, "qg": 32, "sum": 128}   # A.3: output lengths 32 (QA, QG) and 128 (summaries)


def evaluate_synthetic_qa(model, tokenizer, quintuples: list[Quintuple], builder: ExampleBuilder,
                          batch_size: int = 16, max_source_length: int = 512, max_new_tokens: int = 32,
                          progress: bool = True) -> tuple[dict, list[dict]]:
    """EM/F1 of the model's answers to every QA template of ``quintuples`` (overall and per template)."""
    exs = [e for q in quintuples for e in builder.examples(q, "qa")]
    preds = generate(model, tokenizer, [e.source for e in exs], batch_size, max_new_tokens, max_source_length,
                     progress=progress)
    refs = [e.target for e in exs]
    metrics = qa_scores(preds, refs)
    groups = defaultdict(list)
    for i, e in enumerate(exs):
        groups[e.template].append(i)
    for t, idx in sorted(groups.items()):
        s = qa_scores([preds[i] for i in idx], [refs[i] for i in idx])
        # the count beside each template's EM / F1: templates hold from a handful to every quintuple's question
        metrics[f"{t}/em"], metrics[f"{t}/f1"], metrics[f"{t}/n"] = s["em"], s["f1"], s["n"]
    rows = [{"qid": e.qid, "template": e.template, "question": e.source.split(" Context: ")[0], "answer": e.target,
             "prediction": p} for e, p in zip(exs, preds)]
    return metrics, rows


def downstream_examples(examples: list[DownstreamExample], trunc=None, sep: str = SEP) -> list[Example]:
    trunc = trunc or (lambda d: d)
    return [Example(x.task, source_text(x.task, trunc(x.doc1), trunc(x.doc2), x.question, sep), x.references[0], x.id)
            for x in examples]


def finetune(model, tokenizer, examples: list[Example], trainer_cfg, steps: int, batch_size: int, lr: float,
             max_source_length: int, max_target_length: int, seed: int = 0, warmup_ratio: float = 0.0,
             callbacks: list | None = None):
    """Fine-tuning: ``steps`` optimiser steps over ``examples`` (a Lightning fit); ``callbacks`` (e.g.
    ``trainers.cmp.DevSelection``) belong to this fit."""
    from i2d2.lightning_setup import build_trainer
    from trainers.cmp import CMPModule, ExampleSteps, train_loader

    coll = Collator(tokenizer, eos_id(model, tokenizer), max_source_length, max_target_length)
    module = CMPModule(model, tokenizer, coll, lr=lr, warmup_ratio=warmup_ratio, total_steps=steps,
                       tasks=sorted({e.task for e in examples}), callbacks=callbacks)
    trainer = build_trainer(trainer_cfg, micro_batch=batch_size, max_steps=steps, max_epochs=-1, logger=False,
                            enable_checkpointing=False, enable_model_summary=False, num_sanity_val_steps=0,
                            limit_val_batches=0)
    trainer.fit(module, train_loader(module, ExampleSteps(examples, batch_size, steps, seed)))
    model.eval()
    return model


def shot_count(k, pool_size: int, name: str, allow_fewer: bool = False) -> int:
    """Training items for setting ``k`` (an int, or ``full`` = the whole pool). Fewer items than k
    is refused unless ``allow_fewer`` (then all of them are used, and reported as ``k_used``)."""
    if str(k) == "full":
        return pool_size
    k = int(k)
    if k > pool_size:
        if not allow_fewer:
            raise ValueError(f"{name}: k={k} shots asked but its training pool holds only {pool_size} item(s) "
                             f"(after the dev set is held out); set task.downstream.allow_fewer_shots=true to "
                             f"fine-tune on all {pool_size} anyway (reported as k_used)")
        log.warning("%s: k=%d but only %d training items: using them all (allow_fewer_shots)", name, k, pool_size)
        return pool_size
    return k


def dev_and_pool(dataset: dict, task: str, dev_size: int) -> tuple[list, list, str]:
    """(dev examples for checkpoint selection, training pool, where the dev set came from): the
    dataset's ``dev_path``, or else ``dev_size`` items held out of ``train_path`` (a fixed draw, the
    same for every seed and learning rate)."""
    if not dataset.get("train_path"):
        raise ValueError(f"fine-tuning on {dataset['name']} needs data.downstream.{dataset['name']}.train_path")
    pool = load_downstream(dataset["train_path"], dataset["format"], task, dataset.get("types"))
    if dataset.get("dev_path"):
        return load_downstream(dataset["dev_path"], dataset["format"], task, dataset.get("types")), pool, \
            str(dataset["dev_path"])
    if dev_size < 1 or dev_size >= len(pool):
        raise ValueError(f"{dataset['name']}: no dev_path, and {dataset['train_path']} holds {len(pool)} item(s): "
                         f"cannot hold out task.downstream.finetune.dev_size={dev_size} for checkpoint selection and "
                         "keep any to train on; give data.downstream.<name>.dev_path or a smaller dev_size")
    order = np.random.default_rng(0).permutation(len(pool))
    dev, rest = [pool[i] for i in order[:dev_size]], [pool[i] for i in order[dev_size:]]
    return dev, rest, f"{dev_size} held out of {dataset['train_path']}"


def _item_key(x: DownstreamExample) -> tuple:
    return x.task, " ".join(x.doc1.split()), " ".join(x.doc2.split()), " ".join(x.question.split()), x.references


def check_eval_disjoint(dataset: dict, evals: list[DownstreamExample], dev: list, pool: list) -> None:
    """Refuse a fine-tuned setting whose dev set (it picks the checkpoint and the learning rate) or training pool
    holds evaluation items (the same documents, question and references): its numbers would be tuned, or trained,
    on the rows they are reported on. ``dev_path`` naming the evaluation file did this without a word."""
    ev = {_item_key(x) for x in evals}
    dev_src = "dev_path" if dataset.get("dev_path") else "train_path"
    for what, src, rows in (("dev items (they pick the checkpoint and learning rate)", dev_src, dev),
                            ("training items", "train_path", pool)):
        shared = ev & {_item_key(x) for x in rows}
        if shared:
            raise ValueError(f"{dataset['name']}: the {what}, from {src} {dataset.get(src)}, hold {len(shared)} of "
                             f"the {len(ev)} evaluation items of {dataset['eval_path']}: the reported numbers would be "
                             "tuned or trained on the rows they are measured on; take those items out of one file")


def _score(model, tok, task: str, exs: list[Example], refs: list[list[str]], lowercase: bool, batch_size: int,
           max_source_length: int, progress: bool = False) -> tuple[dict, list[str]]:
    preds = generate(model, tok, [e.source for e in exs], batch_size, MAX_NEW_TOKENS[task], max_source_length,
                     progress=progress)
    return task_scores(task, preds, refs, lowercase), preds


def _mean_std(runs: list[dict]) -> tuple[dict, dict]:
    keys = [k for k, v in runs[0].items() if k != "n" and isinstance(v, (int, float))]
    vals = {k: np.array([r[k] for r in runs], dtype=float) for k in keys}
    return ({k: float(v.mean()) for k, v in vals.items()},
            {k: float(v.std(ddof=1)) if len(v) > 1 else None for k, v in vals.items()})  # one seed: undefined


def run_downstream(model_loader, dataset: dict, k, trainer_cfg, protocol: dict,
                   max_source_length: int = 512, eval_batch_size: int = 16, progress: bool = True) -> dict:
    """One downstream setting: ``k`` = 0 (zero-shot), an int (k-shot) or ``full`` (the whole pool).

    ``dataset``: {name, format, task, eval_path, train_path?, dev_path?, types?, limit?};
    ``model_loader()`` returns a fresh ``(model, tokenizer, separator)``; ``protocol``: {seeds, lr_grid,
    allow_fewer_shots, finetune: {steps, batch_size, max_target_length, eval_every, dev_size}}.
    Returns the mean metrics, their std over seeds, the chosen learning rate, every run's dev score,
    the data sizes, and the predictions of the first seed at the chosen learning rate.
    """
    task = dataset.get("task")
    evals = load_downstream(dataset["eval_path"], dataset["format"], task, dataset.get("types"))
    if dataset.get("limit"):
        evals = evals[: int(dataset["limit"])]
    if not evals:
        raise ValueError(f"{dataset['eval_path']}: no {task or ''} examples to evaluate")
    task = evals[0].task
    refs = [list(x.references) for x in evals]
    out = {"dataset": dataset["name"], "task": task, "eval_file": str(dataset["eval_path"]), "n_eval": len(evals),
           "k": str(k)}
    if str(k) == "0":  # greedy decoding of a fixed model: one run
        model, tok, sep = model_loader()
        trunc = make_truncator(tok, max(16, (max_source_length - 48) // 2))
        lowercase = tokenizer_lowercases(tok)
        metrics, preds = _score(model, tok, task, downstream_examples(evals, trunc, sep), refs, lowercase,
                                eval_batch_size, max_source_length, progress)
        rows = [{"id": x.id, "prediction": p, "references": list(x.references)} for x, p in zip(evals, preds)]
        return {**out, "metrics": metrics, "std": None, "n_seeds": 1, "lowercased": lowercase, "predictions": rows}
    from i2d2.resume import seed_fit  # imported here: importing this module stays light (no torch, Lightning)

    ft = protocol["finetune"]
    dev, pool, dev_source = dev_and_pool(dataset, task, int(ft.get("dev_size", 100)))
    check_eval_disjoint(dataset, evals, dev, pool)
    n_shots = shot_count(k, len(pool), dataset["name"], bool(protocol.get("allow_fewer_shots", False)))
    seeds, grid = [int(x) for x in protocol["seeds"]], [float(x) for x in protocol["lr_grid"]]
    if not seeds or not grid:
        raise ValueError("task.downstream.seeds and task.downstream.lr_grid must not be empty")
    runs, first_rows = [], {}
    for lr in grid:
        for seed in seeds:
            seed_fit(seed)  # the seed also fixes dropout (and any freshly initialised weights)
            model, tok, sep = model_loader()
            trunc = make_truncator(tok, max(16, (max_source_length - 48) // 2))
            lowercase = tokenizer_lowercases(tok)
            metric = selection_metric(task, lowercase)
            dev_exs, dev_refs = downstream_examples(dev, trunc, sep), [list(x.references) for x in dev]
            pick = np.random.default_rng(seed).permutation(len(pool))[:n_shots]
            shots = downstream_examples([pool[i] for i in pick], trunc, sep)
            selection = _dev_selection(lambda m: _score(m, tok, task, dev_exs, dev_refs, lowercase, eval_batch_size,
                                                        max_source_length)[0][metric], int(ft.get("eval_every", 10)))
            finetune(model, tok, shots, trainer_cfg, int(ft["steps"]), int(ft["batch_size"]), lr, max_source_length,
                     int(ft.get("max_target_length", MAX_NEW_TOKENS[task] * 2)), seed, callbacks=[selection])
            metrics, preds = _score(model, tok, task, downstream_examples(evals, trunc, sep), refs, lowercase,
                                    eval_batch_size, max_source_length, progress)
            runs.append({"lr": lr, "seed": seed, "dev": selection.best, "best_step": selection.best_step,
                         "metrics": metrics})
            first_rows.setdefault(lr, [{"id": x.id, "prediction": p, "references": list(x.references)}
                                       for x, p in zip(evals, preds)])
            del model
    dev_by_lr = {lr: float(np.mean([r["dev"] for r in runs if r["lr"] == lr])) for lr in grid}
    best_lr = max(grid, key=lambda lr: dev_by_lr[lr])
    mean, std = _mean_std([r["metrics"] for r in runs if r["lr"] == best_lr])
    return {**out, "metrics": {**mean, "n": len(evals)}, "std": std, "n_seeds": len(seeds), "lr": best_lr,
            "selection_metric": metric, "dev_by_lr": {str(k_): v for k_, v in dev_by_lr.items()},
            "k_used": n_shots, "n_train_pool": len(pool), "n_dev": len(dev), "dev_source": dev_source,
            "lowercased": lowercase, "runs": runs, "predictions": first_rows[best_lr]}


def _dev_selection(score, every: int):
    from trainers.cmp import DevSelection

    return DevSelection(score, every)
