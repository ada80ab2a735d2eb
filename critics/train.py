"""Train the critic on annotated statements, choose the threshold δ and compare with an LM-perplexity ranker.

``train_critic(cfg_critic, annotation_paths, out_dir, trainer_cfg, tracker=None, lm=None)`` writes into
``out_dir``:

    model/                 the critic (save_pretrained + tokenizer + critic_meta.json), renamed into place
    pr_curve.png           critic vs LM perplexity on the held-out concepts (I2D2 Fig. 6), δ marked
    score_histogram.png    P(valid) by gold label with δ;  perplexity_histogram.png when lm is given
    val_scores.jsonl       each validation statement with its gold label, critic score and perplexity
    split.json             the train / validation concepts (no concept on both sides)
    metrics.json           the summary this function returns
    epochs/                per-epoch validation PR curve + histogram (PRCurveCallback)
    checkpoints/           Lightning checkpoints while training (a killed run resumes from last.ckpt);
                           removed once model/ exists unless keep_checkpoints=true

A finished ``model/`` is reused (training skipped); the caller wraps the whole call in
``i2d2.io.run_stage`` so that a finished critic stage is not redone.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Sequence

import numpy as np
from omegaconf import DictConfig, OmegaConf

from critics.data import Collator, LoadReport, StatementDataset, grouped_split, label_mapping, load_annotations
from critics.metrics import average_precision, choose_delta, precision_at_recall, precision_recall_at
from i2d2.io import write_json, write_jsonl

log = logging.getLogger(__name__)

DEFAULTS = dict(
    name="packaged:minilm", lr=5e-5, weight_decay=0.01, warmup_ratio=0.1, dropout=None, batch_size=16,
    eval_batch_size=64, max_epochs=10, patience=3, max_length=64, val_fraction=0.2, seed=0,
    target_recall=0.8, target_precision=0.9, delta=None, monitor="val/p_at_r", label_map=None,
    on_error="raise", min_agreement=0.5, min_examples=20, keep_checkpoints=False,
    perplexity_batch_size=16, perplexity_per="word",
)


def critic_config(cfg_critic) -> dict:
    """The critic config as a plain dict with every training key filled in (unknown keys are an error)."""
    cfg = OmegaConf.to_container(cfg_critic, resolve=True) if isinstance(cfg_critic, DictConfig) else dict(cfg_critic or {})
    unknown = sorted(set(cfg) - set(DEFAULTS) - {"seed_annotations", "_target_"})
    if unknown:
        raise ValueError(f"critic config: unknown key(s) {unknown}; known: {sorted(DEFAULTS)}")
    return {**DEFAULTS, **{k: v for k, v in cfg.items() if not (k in DEFAULTS and v is None and DEFAULTS[k] is not None)}}


def _model_complete(model_dir: Path) -> bool:
    return (model_dir / "config.json").exists() and (model_dir / "critic_meta.json").exists()


def _fit(cfg: dict, texts, ys, train_idx, val_idx, out_dir: Path, model_dir: Path, trainer_cfg, tracker):
    import hydra
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
    from lightning.pytorch.loggers import CSVLogger
    from torch.utils.data import DataLoader

    from callbacks.pr_curve import PRCurveCallback
    from critics.critic import CriticModule

    L.seed_everything(int(cfg["seed"]), workers=True, verbose=False)
    module = CriticModule(name=cfg["name"], lr=float(cfg["lr"]), weight_decay=float(cfg["weight_decay"]),
                          warmup_ratio=float(cfg["warmup_ratio"]), target_recall=float(cfg["target_recall"]),
                          dropout=cfg["dropout"])
    tok = module.tokenizer
    tok.padding_side = "right"
    collate = Collator(tok, int(cfg["max_length"]))
    train = DataLoader(StatementDataset([texts[i] for i in train_idx], [ys[i] for i in train_idx]),
                       batch_size=int(cfg["batch_size"]), shuffle=True, collate_fn=collate)
    val = DataLoader(StatementDataset([texts[i] for i in val_idx], [ys[i] for i in val_idx]),
                     batch_size=int(cfg["eval_batch_size"]), shuffle=False, collate_fn=collate)
    ckpt_dir = out_dir / "checkpoints"
    # best weights by the monitored metric, and the full state of the latest epoch to resume a killed run
    ckpt = ModelCheckpoint(dirpath=ckpt_dir, filename="best", monitor=cfg["monitor"], mode="max", save_top_k=1,
                           save_weights_only=True, enable_version_counter=False)
    last_ckpt = ModelCheckpoint(dirpath=ckpt_dir, filename="last", save_top_k=1, enable_version_counter=False)
    callbacks = [ckpt, last_ckpt, PRCurveCallback(out_dir / "epochs", prefix="critic_val", name="critic")]
    if cfg["patience"]:
        callbacks.append(EarlyStopping(monitor=cfg["monitor"], mode="max", patience=int(cfg["patience"])))
    logger = tracker.logger if tracker is not None and tracker.logger is not None else CSVLogger(out_dir, name="logs")
    overrides = dict(max_epochs=int(cfg["max_epochs"]), callbacks=callbacks, logger=logger,
                     default_root_dir=str(out_dir), enable_checkpointing=True)
    if trainer_cfg is None:
        trainer = L.Trainer(accelerator="auto", devices=1, **overrides)
    else:
        trainer = hydra.utils.instantiate(trainer_cfg, **overrides)
    last = ckpt_dir / "last.ckpt"
    resume = str(last) if last.exists() else None
    if resume:
        log.info("critic: resuming training from %s", resume)
    t0 = time.time()
    trainer.fit(module, train, val, ckpt_path=resume)
    fit_s = time.time() - t0
    if not trainer.is_global_zero:
        return None
    best = ckpt.best_model_path
    if best and Path(best).exists():
        state = torch.load(best, map_location="cpu", weights_only=False)["state_dict"]
        module.load_state_dict(state)
        log.info("critic: best epoch by %s = %.4f (%s)", cfg["monitor"], float(ckpt.best_model_score), best)
    # write the model folder atomically: a temporary sibling renamed into place
    tmp = Path(tempfile.mkdtemp(prefix=".model.", dir=out_dir))
    try:
        module.model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        write_json(tmp / "critic_meta.json", {
            "name": cfg["name"], "valid_label_index": 1, "max_length": int(cfg["max_length"]),
            "best_score": None if ckpt.best_model_score is None else float(ckpt.best_model_score),
            "monitor": cfg["monitor"], "epochs_trained": int(trainer.current_epoch), "fit_seconds": round(fit_s, 1),
            "label_map": label_mapping(cfg["label_map"]),
        })
        if model_dir.exists():
            shutil.rmtree(model_dir)
        os.replace(tmp, model_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if not cfg["keep_checkpoints"]:
        shutil.rmtree(ckpt_dir, ignore_errors=True)
    return fit_s


def _lm_name(model) -> str:
    path = str(getattr(model.config, "_name_or_path", "") or "")
    return Path(path).name if path else getattr(model.config, "model_type", "LM")


def train_critic(cfg_critic, annotation_paths: Sequence[str | Path], out_dir: str | Path, trainer_cfg=None,
                 tracker=None, lm=None) -> dict:
    """Train (or reuse) the critic in ``out_dir``; return its validation summary.

    Returns ``dict(model_dir, ap, ap_perplexity, delta, precision, recall, p_at_r, n_train, n_val, ...)``;
    ``precision``/``recall`` are those of ``score > delta`` on the held-out concepts. ``ap_perplexity`` is
    None without ``lm``.
    """
    from critics.scoring import load_critic, score_model
    from callbacks.plots import plot_pr_curves, plot_score_histogram

    cfg = critic_config(cfg_critic)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model_dir = out_dir / "model"
    paths = [Path(p) for p in annotation_paths]
    if not paths:
        raise ValueError("train_critic needs at least one annotation file (e.g. the bundled generics_seed.jsonl)")

    report = LoadReport()
    rows = load_annotations(paths, cfg["label_map"], cfg["on_error"], float(cfg["min_agreement"]), report)
    if report.errors:
        write_jsonl(out_dir / "annotation_errors.jsonl", [{"error": e} for e in report.errors])
    if len(rows) < int(cfg["min_examples"]):
        raise ValueError(f"only {len(rows)} usable annotated statements in {[str(p) for p in paths]} "
                         f"(need >= {cfg['min_examples']}); {report.summary()}")
    texts = [r["statement"] for r in rows]
    ys = np.array([r["y"] for r in rows])
    concepts = [r["concept"] for r in rows]
    train_idx, val_idx = grouped_split(concepts, ys, float(cfg["val_fraction"]), int(cfg["seed"]))
    train_c, val_c = sorted({concepts[i] for i in train_idx}), sorted({concepts[i] for i in val_idx})
    write_json(out_dir / "split.json", {"train_concepts": train_c, "val_concepts": val_c,
                                        "n_train": len(train_idx), "n_val": len(val_idx)})
    log.info("critic: %d train / %d val statements (%d / %d concepts), %.0f%% valid", len(train_idx),
             len(val_idx), len(train_c), len(val_c), 100 * ys.mean())

    fit_s = None
    if _model_complete(model_dir):
        log.info("critic: reusing the finished model in %s", model_dir)
    else:
        fit_s = _fit(cfg, texts, ys, train_idx, val_idx, out_dir, model_dir, trainer_cfg, tracker)
        if fit_s is None:  # non-zero rank of a multi-process fit: rank 0 evaluates and writes
            return {"model_dir": str(model_dir)}

    # ---- held-out evaluation with the saved model (what the filter will use)
    model, tok = load_critic(model_dir)
    val_texts = [texts[i] for i in val_idx]
    yv = ys[val_idx]
    scores = score_model(model, tok, val_texts, batch_size=int(cfg["eval_batch_size"]),
                         max_length=int(cfg["max_length"]), progress=True)
    ap = average_precision(yv, scores)
    if cfg["delta"] is None:
        chosen = choose_delta(yv, scores, float(cfg["target_precision"]))
        delta = chosen["delta"]
        reached = chosen["reached"]
    else:
        delta, reached = float(cfg["delta"]), None
    precision, recall, n_kept = precision_recall_at(yv, scores, delta)

    curves = {"critic": (yv, scores)}
    ppl = None
    ap_ppl = None
    if lm is not None:
        from i2d2.perplexity import perplexity

        lm_model, lm_tok = lm[0], lm[1]
        ppl = perplexity(lm_model, lm_tok, val_texts, batch_size=int(cfg["perplexity_batch_size"]),
                         per=cfg["perplexity_per"], progress=True)
        ppl_score = -np.log(ppl)  # lower perplexity = ranked as more valid
        ap_ppl = average_precision(yv, ppl_score)
        curves[f"LM perplexity ({_lm_name(lm_model)})"] = (yv, ppl_score)
    plot_pr_curves(curves, out_dir / "pr_curve.png", title="Held-out concepts: critic vs perplexity",
                   marks={f"δ={delta:.2f}": (recall, precision)})
    plot_score_histogram(scores, yv, out_dir / "score_histogram.png", delta=delta,
                         title="Critic scores on held-out concepts", xlabel="P(valid)")
    if ppl is not None:
        plot_score_histogram(np.log(ppl), yv, out_dir / "perplexity_histogram.png",
                             title="LM log-perplexity on held-out concepts", xlabel="log perplexity")

    val_rows = []
    for j, i in enumerate(val_idx):
        row = {"statement": texts[i], "concept": concepts[i], "label": rows[i]["label"], "y": int(ys[i]),
               "critic_score": float(scores[j])}
        if ppl is not None:
            row["perplexity"] = float(ppl[j])
        val_rows.append(row)
    write_jsonl(out_dir / "val_scores.jsonl", val_rows)

    summary = {
        "model_dir": str(model_dir), "ap": ap, "ap_perplexity": ap_ppl, "delta": float(delta),
        "precision": precision, "recall": recall, "n_kept_val": n_kept, "target_precision_reached": reached,
        "p_at_r": precision_at_recall(yv, scores, float(cfg["target_recall"])), "target_recall": cfg["target_recall"],
        "n_train": int(len(train_idx)), "n_val": int(len(val_idx)), "n_val_concepts": len(val_c),
        "val_valid_rate": float(yv.mean()), "fit_seconds": fit_s, "annotations": report.summary(),
        "pr_curve": str(out_dir / "pr_curve.png"), "score_histogram": str(out_dir / "score_histogram.png"),
    }
    write_json(out_dir / "metrics.json", summary)
    if tracker is not None:
        tracker.log_metrics({f"critic/{k}": v for k, v in summary.items()
                             if isinstance(v, (int, float)) and not isinstance(v, bool) and v is not None})
        tracker.log_image("critic/pr_curve", out_dir / "pr_curve.png")
        tracker.log_image("critic/score_histogram", out_dir / "score_histogram.png")
        tracker.log_table("critic/val_scores", list(val_rows[0]), [list(r.values()) for r in val_rows])
    log.info("critic: AP %.3f on %d held-out statements (%d concepts)%s; δ=%.3f -> precision %.3f recall %.3f",
             ap, len(val_idx), len(val_c), "" if ap_ppl is None else f", LM-perplexity AP {ap_ppl:.3f}",
             delta, precision, recall)
    return summary
