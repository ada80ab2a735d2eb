"""Zero-shot and few-shot (k examples) fine-tune-and-evaluate runners.

``evaluate_synthetic_qa`` scores a model on held-out synthetic comparative QA (all Table 1 templates
of held-out quintuples); ``run_downstream`` fine-tunes on k training examples of a downstream file
(k = 0: zero-shot) and scores the evaluation file with the paper's metrics for that task.
"""

from __future__ import annotations

import logging
from collections import defaultdict

import numpy as np

from i2d2.cmp.data import Quintuple
from i2d2.cmp.downstream import DownstreamExample, load_downstream
from i2d2.cmp.evaluation import qa_scores, task_scores
from i2d2.cmp.tasks import SEP, Collator, Example, ExampleBuilder, eos_id, generate, make_truncator, source_text

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
        metrics[f"{t}/em"], metrics[f"{t}/f1"] = s["em"], s["f1"]
    rows = [{"qid": e.qid, "template": e.template, "question": e.source.split(" Context: ")[0], "answer": e.target,
             "prediction": p} for e, p in zip(exs, preds)]
    return metrics, rows


def downstream_examples(examples: list[DownstreamExample], trunc=None, sep: str = SEP) -> list[Example]:
    trunc = trunc or (lambda d: d)
    return [Example(x.task, source_text(x.task, trunc(x.doc1), trunc(x.doc2), x.question, sep), x.references[0], x.id)
            for x in examples]


def finetune(model, tokenizer, examples: list[Example], trainer_cfg, steps: int, batch_size: int, lr: float,
             max_source_length: int, max_target_length: int, seed: int = 0, warmup_ratio: float = 0.0):
    """Few-shot fine-tuning: ``steps`` optimiser steps over ``examples`` (a Lightning fit)."""
    import hydra

    from trainers.cmp import CMPModule, ExampleSteps, train_loader

    coll = Collator(tokenizer, eos_id(model, tokenizer), max_source_length, max_target_length)
    module = CMPModule(model, tokenizer, coll, lr=lr, warmup_ratio=warmup_ratio, total_steps=steps,
                       tasks=sorted({e.task for e in examples}))
    trainer = hydra.utils.instantiate(trainer_cfg, max_steps=steps, max_epochs=-1, logger=False,
                                      enable_checkpointing=False, enable_model_summary=False,
                                      num_sanity_val_steps=0, limit_val_batches=0)
    trainer.fit(module, train_loader(module, ExampleSteps(examples, batch_size, steps, seed)))
    model.eval()
    return model


def run_downstream(model_loader, dataset: dict, k: int, trainer_cfg, ft: dict, seed: int = 0,
                   max_source_length: int = 512, eval_batch_size: int = 16, progress: bool = True) -> tuple[dict, list]:
    """Zero-shot (k = 0) or k-shot evaluation of one downstream dataset.

    ``dataset``: {name, format, task, eval_path, train_path?, types?, limit?}; ``model_loader()`` returns a
    fresh ``(model, tokenizer)``; ``ft``: {steps, batch_size, lr, max_target_length}.
    """
    model, tok = model_loader()
    task = dataset.get("task")
    evals = load_downstream(dataset["eval_path"], dataset["format"], task, dataset.get("types"))
    if dataset.get("limit"):
        evals = evals[: int(dataset["limit"])]
    if not evals:
        raise ValueError(f"{dataset['eval_path']}: no {task or ''} examples to evaluate")
    task = evals[0].task
    trunc = make_truncator(tok, max(16, (max_source_length - 48) // 2))
    if k > 0:
        if not dataset.get("train_path"):
            raise ValueError(f"few-shot on {dataset['name']} needs train_path")
        pool = load_downstream(dataset["train_path"], dataset["format"], task, dataset.get("types"))
        if len(pool) < k:
            log.warning("%s: only %d training examples for k=%d", dataset["name"], len(pool), k)
        pick = np.random.default_rng(seed).permutation(len(pool))[:k]
        shots = downstream_examples([pool[i] for i in pick], trunc)
        finetune(model, tok, shots, trainer_cfg, int(ft["steps"]), int(ft["batch_size"]), float(ft["lr"]),
                 max_source_length, int(ft.get("max_target_length", MAX_NEW_TOKENS[task] * 2)), seed)
    exs = downstream_examples(evals, trunc)
    preds = generate(model, tok, [e.source for e in exs], eval_batch_size, MAX_NEW_TOKENS[task], max_source_length,
                     progress=progress)
    metrics = task_scores(task, preds, [list(x.references) for x in evals])
    rows = [{"id": x.id, "prediction": p, "references": list(x.references)} for x, p in zip(evals, preds)]
    return metrics, rows
