"""Train the critic on annotated statements, choose the threshold δ and compare with an LM-perplexity ranker.

``train_critic(cfg_critic, annotation_paths, out_dir, trainer_cfg, tracker=None, lm=None)`` writes into
``out_dir``:

    model/                 the critic (save_pretrained + tokenizer + critic_meta.json), renamed into place
    pr_curve.png           critic vs surface floor vs LM perplexity on the test concepts (I2D2 Fig. 6), δ marked
    score_histogram.png    P(valid) by gold label with δ;  perplexity_histogram.png when lm is given
    dev_scores.jsonl       dev statements (checkpoint + δ) with gold label and critic score
    test_scores.jsonl      test statements (every reported number) with gold label, critic score, perplexity
    probe_scores.jsonl     the invariance probes (i2d2/data/annotations/probes.jsonl) with their scores
    split.json             the train / dev / test concepts (no concept on two sides)
    metrics.json           the summary this function returns (its paths relative to out_dir)
    epochs/                per-epoch validation PR curve + histogram (PRCurveCallback)
    checkpoints/           Lightning checkpoints while training (a killed run resumes from last.ckpt);
                           removed once model/ exists unless keep_checkpoints=true

A finished ``model/`` is reused (training skipped); the caller wraps the whole call in
``i2d2.io.run_stage`` so that a finished critic stage is not redone.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from critics.data import (Collator, LoadReport, StatementDataset, canonical_statement, grouped_split3, label_mapping,
                          load_annotations, normalize_statement)
from critics.metrics import average_precision, choose_delta, cut_at_recall, precision_at_recall, precision_recall_at
from i2d2.io import atomic_dir, write_json, write_jsonl
from i2d2.schemas import CriticConfig, fill
from i2d2.lightning_setup import (build_trainer, checkpoint_weights, full_weights, optimizer_steps, plain,
                                  resolve_device, resume_checkpoint)

log = logging.getLogger(__name__)


def critic_config(cfg_critic) -> dict:
    """The critic config as a plain dict, every key filled from i2d2.schemas.CriticConfig (unknown keys, wrong
    types and values out of range, such as an unknown ``kind``, are an error naming the key)."""
    return fill(CriticConfig, cfg_critic, where="critic")


def default_critic_data():
    """The default critic's config (``critic`` of conf/train.yaml) and its labelled data as ``train_critic`` splits
    it: (config, rows, texts, labels, (train, dev, test)). For experiments on the default critic (scripts/critic_*)."""
    from hydra import compose, initialize_config_dir

    from i2d2.config import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        c = critic_config(compose(config_name="train").critic)
    rows, texts, ys, splits, _ = labelled_splits(c, list(c["seed_annotations"]))
    return c, rows, texts, ys, splits


def fingerprint_view(cfg_critic: dict) -> dict:
    """The critic config as stage fingerprints read it: ``lora`` only when it is on, so that a run from before
    critic LoRA existed keeps its fingerprints (no retraining on resume) and a probe's ignores a setting it never uses;
    ``probe_context`` likewise only for a probe that reads one."""
    out = dict(cfg_critic or {})
    unused = (("name", "lr", "weight_decay", "warmup_ratio", "dropout", "batch_size", "max_epochs", "patience",
               "monitor", "lora") if out.get("kind") == "probe" else ("probe_lm", "probe_layer", "probe_C"))
    from i2d2.schemas import CriticConfig, defaults

    base = defaults(CriticConfig)
    for key in unused + ("keep_checkpoints", "ckpt_every_n_steps"):  # never change the critic's numbers: read as
        if key in out and key in base:                               # their defaults, so old fingerprints hold
            out[key] = base[key]
    if not (out.get("lora") or {}).get("enabled"):
        out.pop("lora", None)
    if out.get("kind") != "probe" or not (out.get("probe_context") or {}).get("examples"):
        out.pop("probe_context", None)
    return out


def _model_complete(model_dir: Path) -> bool:
    from critics.probe import WEIGHTS

    return (model_dir / "critic_meta.json").exists() and ((model_dir / "config.json").exists()
                                                          or (model_dir / WEIGHTS).exists())


# the Trainer arguments _fit sets itself (the trainer config's are replaced): not part of a critic's fingerprint
FIT_ARGS = ("max_epochs", "callbacks", "logger", "default_root_dir", "enable_checkpointing", "use_distributed_sampler")


def _fit(cfg: dict, texts, ys, train_idx, val_idx, out_dir: Path, model_dir: Path, trainer_cfg, tracker):
    from lightning.pytorch.callbacks import EarlyStopping
    from lightning.pytorch.loggers import CSVLogger
    import torch
    from torch.utils.data import DataLoader

    from callbacks.pr_curve import PRCurveCallback
    from critics.critic import CriticModule
    from i2d2.lightning_setup import ModelCheckpoint  # resumable in a run folder that moved
    from i2d2.resume import EpochProgress, ResumeState, batches_per_rank, resumable_loader, seed_fit

    seed_fit(int(cfg["seed"]))
    # exact resume (i2d2/resume.py): batch order fixed by (seed, epoch), position and RNG state in last.ckpt
    progress = EpochProgress()
    ckpt_dir = out_dir / "checkpoints"
    # best weights by the monitored metric, and the full state every ckpt_every_n_steps steps to resume a killed run
    ckpt = ModelCheckpoint(dirpath=ckpt_dir, filename="best", monitor=cfg["monitor"], mode="max", save_top_k=1,
                           save_weights_only=True, enable_version_counter=False)
    # two writers of last.ckpt: Lightning's step trigger excludes its epoch trigger, and the epoch-end one holds
    # the validation / early-stopping state of the finished epoch
    last_epoch = ModelCheckpoint(dirpath=ckpt_dir, filename="last", save_top_k=1, enable_version_counter=False)
    last_step = ModelCheckpoint(dirpath=ckpt_dir, filename="last", save_top_k=1, enable_version_counter=False,
                                every_n_train_steps=max(1, int(cfg["ckpt_every_n_steps"])))
    callbacks = [ckpt, last_epoch, last_step, ResumeState(progress, "critic"),
                 PRCurveCallback(out_dir / "epochs", prefix="critic_val", name="critic")]
    if cfg["patience"]:
        callbacks.append(EarlyStopping(monitor=cfg["monitor"], mode="max", patience=int(cfg["patience"])))
    logger = tracker.logger if tracker is not None and tracker.logger is not None else CSVLogger(out_dir, name="logs")
    # under DDP the train loader is this rank's shard (i2d2/resume.py), and every rank validates on the whole dev
    # set, so that each one picks the same best epoch: Lightning must not swap in its own distributed samplers
    trainer = build_trainer(trainer_cfg, micro_batch=int(cfg["batch_size"]), where="critic trainer",  # FIT_ARGS
                            max_epochs=int(cfg["max_epochs"]), callbacks=callbacks, logger=logger,
                            default_root_dir=str(out_dir), enable_checkpointing=True, use_distributed_sampler=False)
    # the trainer's world is the one count of ranks: the schedule's steps and the loader's shard both read it
    module = CriticModule(name=cfg["name"], lr=float(cfg["lr"]), weight_decay=float(cfg["weight_decay"]),
                          warmup_ratio=float(cfg["warmup_ratio"]), target_recall=float(cfg["target_recall"]),
                          dropout=cfg["dropout"], lora=cfg["lora"],
                          total_steps=optimizer_steps(batches_per_rank(len(train_idx), int(cfg["batch_size"]),
                                                                       trainer.world_size),
                                                      int(cfg["max_epochs"]), plain(trainer_cfg)))
    tok = module.tokenizer
    tok.padding_side = "right"
    collate = Collator(tok, int(cfg["max_length"]))
    # the validation loader gets its own generator so that iterating it never draws from the global RNG
    val = DataLoader(StatementDataset([texts[i] for i in val_idx], [ys[i] for i in val_idx]),
                     batch_size=int(cfg["eval_batch_size"]), shuffle=False, collate_fn=collate,
                     generator=torch.Generator().manual_seed(int(cfg["seed"])))
    train = resumable_loader(StatementDataset([texts[i] for i in train_idx], [ys[i] for i in train_idx]),
                             int(cfg["batch_size"]), progress=progress, seed=int(cfg["seed"]), collate_fn=collate,
                             rank=trainer.global_rank, world_size=trainer.world_size)
    resume = resume_checkpoint(ckpt_dir / "last.ckpt", trainer)
    if resume:
        log.info("critic: resuming training from %s", resume)
    t0 = time.time()
    trainer.fit(module, train, val, ckpt_path=resume)
    fit_s = time.time() - t0
    with full_weights(trainer, module, modifier_rank=0):  # ZeRO-3: every rank joins; rank 0 loads and saves
        if trainer.is_global_zero:
            _save_best(cfg, module, tok, ckpt, trainer, model_dir, fit_s)
    if not trainer.is_global_zero:
        return None
    if not cfg["keep_checkpoints"]:
        shutil.rmtree(ckpt_dir, ignore_errors=True)
    return fit_s


def _save_best(cfg: dict, module, tok, ckpt, trainer, model_dir: Path, fit_s: float) -> None:
    """The checkpoint best by ``monitor`` into ``model_dir`` (save_pretrained + critic_meta.json), atomically."""
    best = ckpt.best_model_path
    if best and Path(best).exists():
        module.load_weights(checkpoint_weights(best))
        log.info("critic: best epoch by %s = %.4f (%s)", cfg["monitor"], float(ckpt.best_model_score), best)
    with atomic_dir(model_dir) as tmp:  # a temporary sibling renamed into place
        module.export_model().save_pretrained(tmp)
        tok.save_pretrained(tmp)
        write_json(tmp / "critic_meta.json", {
            "kind": "finetune", "name": cfg["name"], "lora": bool(cfg["lora"]["enabled"]), "valid_label_index": 1,
            "max_length": int(cfg["max_length"]),
            "canonicalize": bool(cfg["canonicalize"]),
            "best_score": None if ckpt.best_model_score is None else float(ckpt.best_model_score),
            "monitor": cfg["monitor"], "epochs_trained": int(trainer.current_epoch),  # no timings: these bytes are fingerprinted
            "label_map": label_mapping(cfg["label_map"]),
        })


def _lm_name(model) -> str:
    path = str(getattr(model.config, "_name_or_path", "") or "")
    return Path(path).name if path else getattr(model.config, "model_type", "LM")


def _scores_rows(idx, texts, concepts, rows, ys, scores, ppl=None) -> list[dict]:
    out = []
    for j, i in enumerate(idx):
        row = {"statement": texts[i], "concept": concepts[i], "label": rows[i]["label"], "y": int(ys[i]),
               "critic_score": float(scores[j])}
        if ppl is not None:
            row["perplexity"] = float(ppl[j])
        out.append(row)
    return out


def labelled_splits(cfg: dict, paths: Sequence[str | Path], report: LoadReport | None = None,
                    keys: dict | None = None, quiet: bool = False):
    """The critic's labelled data as it trains on it (``cfg``: ``critic_config``): rows of ``paths`` (unfinished
    statements left out under ``complete_only``), the texts the critic reads (canonicalised under ``canonicalize``),
    labels, the (train, dev, test) indices grouped by concept, and how many unfinished rows were left out.
    No file, or fewer than ``min_examples`` usable rows, is refused here, before the split (an empty file was a
    misleading "need at least 2 concept groups"). ``keys``: the config key each setting came from, where it is not
    ``critic.<setting>`` (NeuroComparatives' discriminator: ``task.filters.discriminator.critic.<setting>``).
    ``quiet``: as for ``load_annotations`` (a start-up check)."""
    keys = {k: f"critic.{k}" for k in ("min_examples", "complete_only")} | (keys or {})
    if not paths:
        raise ValueError("critic.seed_annotations: no annotation files: it is empty and the run has no labels store "
                         "(name at least one, e.g. the bundled generics_gemma.jsonl)")
    report = report if report is not None else LoadReport()
    rows = load_annotations(paths, cfg["label_map"], cfg["on_error"], float(cfg["min_agreement"]), report, quiet)
    n_unfinished = 0
    if cfg["complete_only"]:  # the loop drops unfinished generations before the critic (task.filter.require_sentence_end)
        from i2d2.filtering import ends_sentence

        n_unfinished = sum(not ends_sentence(r["statement"]) for r in rows)
        rows = [r for r in rows if ends_sentence(r["statement"])]
    texts = [r["statement"] for r in rows]
    if cfg["canonicalize"]:  # what the critic reads; scoring applies the same (critic_meta.json "canonicalize")
        texts = [canonical_statement(t) for t in texts]
        # "Generally, X." and "X." are one text to the critic (load_annotations keys the raw statement): keep its
        # newest label (rows follow the annotation order), so that it is never read twice, under two labels, or
        # with one copy in train and one in test
        newest = sorted({normalize_statement(t): i for i, t in enumerate(texts)}.values())
        if report is not None:
            report.duplicates += len(rows) - len(newest)
        rows, texts = [rows[i] for i in newest], [texts[i] for i in newest]
    if len(rows) < int(cfg["min_examples"]):
        raise ValueError(f"only {len(rows)} usable annotated statements in {[str(p) for p in paths]} (need >= "
                         f"{keys['min_examples']} = {cfg['min_examples']}); {report.summary()}"
                         + (f"; {n_unfinished} unfinished left out ({keys['complete_only']})" if n_unfinished else ""))
    ys = np.array([r["y"] for r in rows])
    splits = grouped_split3([r["concept"] for r in rows], ys, float(cfg["dev_fraction"]), float(cfg["test_fraction"]),
                            int(cfg["seed"]))
    return rows, texts, ys, splits, n_unfinished


# The logged name of each summary number measured on labelled rows: ``<split>_<what>``, so that a run compared in
# W&B says which split a number is (a bare ``critic/ap`` beside ``critic/dev_ap`` read as either). metrics.json keeps
# the summary's keys, which its ``sources`` explain; keys already named by their split (``dev_ap``, ``probe_*``,
# ``test_valid_rate``) are logged as they are.
LOGGED_NAMES = {
    "ap": "test_ap", "ap_perplexity": "test_ap_perplexity", "precision": "test_precision", "recall": "test_recall",
    "n_kept_test": "test_n_kept", "n_kept_dev": "dev_n_kept", "p_at_r": "test_p_at_r",
    "p_at_r_recall": "test_p_at_r_recall", "p_at_r_n_kept": "test_p_at_r_n_kept", "recall_cut": "dev_recall_cut",
    "recall_cut_precision": "test_recall_cut_precision", "recall_cut_recall": "test_recall_cut_recall",
    "recall_cut_n_kept": "test_recall_cut_n_kept", "surface_ap": "test_surface_ap",
    "surface_auc_test": "test_surface_auc", "surface_auc_train": "train_surface_auc",
    "surface_auc_train_in_sample": "train_surface_auc_in_sample",
    "surface_auc_gap": "train_minus_test_surface_auc", "ap_over_surface": "test_ap_over_surface",
}
# the numbers of the cut at δ (chosen on dev): left out of the log where a task never applies δ
DELTA_CUT = frozenset({"delta", "precision", "recall", "n_kept_test", "dev_precision", "dev_recall", "n_kept_dev"})


def log_critic_metrics(tracker, summary: Mapping, delta_applied: bool = True) -> None:
    """The critic's numbers to the tracker as ``critic/<LOGGED_NAMES or key>``: after its fit, and in a later
    iteration that reuses it (its run has no other record of them). ``delta_applied=False`` (a task that keeps
    fractions, not ``score > δ``): the cut at δ is not logged, as it would read as the cut the task used."""
    tracker.log_metrics({f"critic/{LOGGED_NAMES.get(k, k)}": v for k, v in summary.items()
                         if isinstance(v, (int, float)) and not isinstance(v, bool) and v is not None
                         and (delta_applied or k not in DELTA_CUT)})


def train_critic(cfg_critic, annotation_paths: Sequence[str | Path], out_dir: str | Path, trainer_cfg=None,
                 tracker=None, lm=None, keys: dict | None = None, delta_applied: bool = True) -> dict:
    """Train (or reuse) the critic in ``out_dir``; return its summary.

    Three splits grouped by concept (``grouped_split3``): train fits the critic; **dev** picks the checkpoint
    (``monitor``) and δ (``target_precision``); **test** gives every number returned without a ``dev_`` prefix:
    ``ap``, ``precision``/``recall``/``n_kept_test`` of ``score > δ`` (precision is None when nothing is kept),
    ``p_at_r``, the LM-perplexity ranker's ``ap_perplexity`` (None without ``lm``), the surface-only floor
    (``surface_ap``, ``surface_auc_train/test``) and the hand-written invariance probes (``probe_shift``,
    ``probe_ap``). ``sources`` names the split of each number; the tracker gets them named by it (``LOGGED_NAMES``).
    ``keys``: as for ``labelled_splits``; ``delta_applied``: as for ``log_critic_metrics``.
    """
    from critics.probe import fit_probe
    from critics.scoring import critic_meta, load_critic, score_loaded
    from critics.surface import floor_warning, score_probes, surface_floor
    from callbacks.plots import plot_pr_curves, plot_score_histogram

    cfg = critic_config(cfg_critic)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model_dir = out_dir / "model"
    paths = [Path(p) for p in annotation_paths]
    report = LoadReport()
    rows, texts, ys, (train_idx, dev_idx, test_idx), n_unfinished = labelled_splits(cfg, paths, report, keys)
    if report.errors:
        write_jsonl(out_dir / "annotation_errors.jsonl", [{"error": e} for e in report.errors])
    concepts = [r["concept"] for r in rows]
    split_concepts = {name: sorted({concepts[i] for i in idx})
                      for name, idx in (("train", train_idx), ("dev", dev_idx), ("test", test_idx))}
    write_json(out_dir / "split.json", {**{f"{k}_concepts": v for k, v in split_concepts.items()},
                                        "n_train": len(train_idx), "n_dev": len(dev_idx), "n_test": len(test_idx)})
    log.info("critic: %d train / %d dev / %d test statements (%d / %d / %d concepts), %.0f%% valid", len(train_idx),
             len(dev_idx), len(test_idx), *(len(v) for v in split_concepts.values()), 100 * ys.mean())

    fit_s = None
    if _model_complete(model_dir):
        log.info("critic: reusing the finished model in %s", model_dir)
    elif cfg["kind"] == "probe":
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_rank() != 0:
            return {"model_dir": str(model_dir)}  # a probe fits in seconds on rank 0
        fit_s = fit_probe(cfg, rows, texts, ys, train_idx, dev_idx, model_dir, device=resolve_device(trainer_cfg))
    else:
        fit_s = _fit(cfg, texts, ys, train_idx, dev_idx, out_dir, model_dir, trainer_cfg, tracker)
        if fit_s is None:  # non-zero rank of a multi-process fit: rank 0 evaluates and writes
            return {"model_dir": str(model_dir)}

    # ---- evaluation with the saved model (what the filter will use): δ on dev, every number on test
    critic = load_critic(model_dir, resolve_device(trainer_cfg))

    def critic_scores(batch: list[str]) -> np.ndarray:
        return score_loaded(critic, batch, batch_size=int(cfg["eval_batch_size"]), progress=True)

    y_dev, y_test = ys[dev_idx], ys[test_idx]
    s_dev = critic_scores([texts[i] for i in dev_idx])
    test_texts = [texts[i] for i in test_idx]
    s_test = critic_scores(test_texts)
    if cfg["delta"] is None:
        chosen = choose_delta(y_dev, s_dev, float(cfg["target_precision"]))
        delta, reached = chosen["delta"], chosen["reached"]
    else:
        delta, reached = float(cfg["delta"]), None
    delta_from = "dev" if cfg["delta"] is None else "critic.delta"  # chosen on dev, or set in the config
    dev_precision, dev_recall, dev_kept = precision_recall_at(y_dev, s_dev, delta)
    ap = average_precision(y_test, s_test)
    precision, recall, n_kept = precision_recall_at(y_test, s_test, delta)

    surface = surface_floor([rows[i] for i in train_idx], ys[train_idx], [rows[i] for i in test_idx], y_test,
                            seed=int(cfg["seed"]))
    reads = canonical_statement if critic_meta(critic).get("canonicalize") else None  # as score_loaded reads
    probes = (score_probes(critic_scores, warn_shift=float(cfg["probe_warn_shift"]), reads=reads)
              if cfg["probes"] else {})
    if probes:
        write_jsonl(out_dir / "probe_scores.jsonl", probes.pop("rows"))

    curves = {"critic": (y_test, s_test), "surface-only (logistic regression)": (y_test, surface.pop("surface_scores"))}
    ppl = ap_ppl = None
    if lm is not None:
        from i2d2.perplexity import perplexity

        lm_model, lm_tok = lm[0], lm[1]
        ppl = perplexity(lm_model, lm_tok, test_texts, batch_size=int(cfg["perplexity_batch_size"]),
                         per=cfg["perplexity_per"], progress=True)
        ppl_score = -np.log(ppl)  # lower perplexity = ranked as more valid
        ap_ppl = average_precision(y_test, ppl_score)
        curves[f"LM perplexity ({_lm_name(lm_model)})"] = (y_test, ppl_score)
    marks = ({f"δ={delta:.2f} (from {delta_from})": (recall, precision)}
             if precision is not None and recall is not None else {})
    plot_pr_curves(curves, out_dir / "pr_curve.png", title="Test concepts: critic vs surface floor vs perplexity",
                   marks=marks)
    plot_score_histogram(s_test, y_test, out_dir / "score_histogram.png", delta=delta,
                         title="Critic scores on test concepts", xlabel="P(valid)")
    if ppl is not None:
        plot_score_histogram(np.log(ppl), y_test, out_dir / "perplexity_histogram.png",
                             title="LM log-perplexity on test concepts", xlabel="log perplexity")
    write_jsonl(out_dir / "dev_scores.jsonl", _scores_rows(dev_idx, texts, concepts, rows, ys, s_dev))
    test_rows = _scores_rows(test_idx, texts, concepts, rows, ys, s_test, ppl)
    write_jsonl(out_dir / "test_scores.jsonl", test_rows)

    # precision at the target recall as a filter would get it: the cut is chosen on dev, measured on test
    r_cut = cut_at_recall(y_dev, s_dev, float(cfg["target_recall"]))
    r_cut_p, r_cut_r, r_cut_n = (None, None, None) if r_cut is None else precision_recall_at(y_test, s_test, r_cut)
    # p_at_r's own cut, picked on test: its recall and rows kept beside it (the precision alone was logged bare)
    oracle = cut_at_recall(y_test, s_test, float(cfg["target_recall"]))
    _, p_at_r_recall, p_at_r_n = (None, None, None) if oracle is None else precision_recall_at(y_test, s_test, oracle)
    summary = {
        "model_dir": str(model_dir), "ap": ap, "ap_perplexity": ap_ppl, "delta": float(delta),
        "precision": precision, "recall": recall, "n_kept_test": n_kept, "target_precision_reached": reached,
        "p_at_r": precision_at_recall(y_test, s_test, float(cfg["target_recall"])),
        "p_at_r_recall": p_at_r_recall, "p_at_r_n_kept": p_at_r_n,
        "target_recall": cfg["target_recall"], "recall_cut": r_cut, "recall_cut_precision": r_cut_p,
        "recall_cut_recall": r_cut_r, "recall_cut_n_kept": r_cut_n,
        "dev_ap": average_precision(y_dev, s_dev), "dev_precision": dev_precision, "dev_recall": dev_recall,
        "n_kept_dev": dev_kept, **surface, **probes,
        "ap_over_surface": None if surface["surface_ap"] is None else ap - surface["surface_ap"],
        "n_train": int(len(train_idx)), "n_dev": int(len(dev_idx)), "n_test": int(len(test_idx)),
        # a probe's few-shot context examples are train rows it reads but does not fit on
        "n_train_fit": int(critic_meta(critic).get("n_fit", len(train_idx))),
        "n_test_concepts": len(split_concepts["test"]), "test_valid_rate": float(y_test.mean()),
        "fit_seconds": fit_s, "annotations": report.summary(), "n_unfinished_left_out": n_unfinished,
        "sources": {"delta": delta_from, "recall_cut": "dev (best precision at target_recall)",
                    "recall_cut_*": "test, at the dev cut",
                    "p_at_r": "test, its cut chosen on test (a ranking summary like ap)",
                    "p_at_r_recall, p_at_r_n_kept": "test, at p_at_r's cut (chosen on test)",
                    "checkpoint": f"dev ({cfg['monitor']})",
                    # measured on the rows that picked δ and the checkpoint: a selected value, not an estimate
                    "dev_*": "dev, the split that chose the checkpoint" + (" and δ" if delta_from == "dev" else ""),
                    "ap, precision, recall, ap_perplexity, surface_ap": "test",
                    "probe_*": "probes.jsonl (hand-written, never trained on)"},
        "pr_curve": str(out_dir / "pr_curve.png"), "score_histogram": str(out_dir / "score_histogram.png"),
    }
    # the file names its files relative to out_dir, so the folder can move (with its run); the caller gets paths
    write_json(out_dir / "metrics.json", {**summary, **{k: Path(summary[k]).relative_to(out_dir).as_posix()
                                                        for k in ("model_dir", "pr_curve", "score_histogram")}})
    if tracker is not None:
        log_critic_metrics(tracker, summary, delta_applied)
        tracker.log_image("critic/pr_curve", out_dir / "pr_curve.png")
        tracker.log_image("critic/score_histogram", out_dir / "score_histogram.png")
        tracker.log_table("critic/test_scores", list(test_rows[0]), [list(r.values()) for r in test_rows],
                          out_dir)
    below_floor = floor_warning(ap, summary["surface_ap"])
    if below_floor:
        log.warning("!!! CRITIC BELOW THE SURFACE FLOOR: %s. See %s.", below_floor, out_dir / "metrics.json")
    log.info("critic: test AP %.3f (surface floor %s, LM perplexity %s) on %d statements / %d concepts; δ=%.3f from %s "
             "-> test precision %s recall %s (%d kept); probe shift %s (%s on pairs it reads as two texts), probe AP %s",
             ap, _f(surface["surface_ap"]), _f(ap_ppl), len(test_idx), len(split_concepts["test"]), delta, delta_from,
             _f(precision), _f(recall), n_kept, _f(probes.get("probe_shift")), _f(probes.get("probe_shift_read")),
             _f(probes.get("probe_ap")))
    return summary


def _f(v) -> str:
    return "–" if v is None or (isinstance(v, float) and np.isnan(v)) else f"{v:.3f}"


def checked_labels(cfg: dict, seed_annotations: list, run_dir=None, where: str = "critic.seed_annotations",
                   keys: dict | None = None) -> tuple[list[Path], tuple]:
    """The label files (``run_dir``: with its labels store) and ``labelled_splits`` of them, read as the critic stage
    will (quietly: it logs them): a broken row or too few rows fails at start-up as a ConfigError naming ``where``
    (the key the files come from) and file:line (``critics.train``: before ``--out`` holds this config's start
    marker, after which the command run again on the corrected file was refused as "other work"); a message that
    already names a key of ``where``'s section is left as it is. NeuroComparatives' discriminator passes its own
    files (``task.filters.discriminator.annotations``) and ``keys`` (as for ``labelled_splits``)."""
    from i2d2.annotation import critic_annotation_paths
    from i2d2.config import ConfigError

    try:
        paths = critic_annotation_paths(seed_annotations, run_dir)
        return paths, labelled_splits(cfg, paths, keys=keys, quiet=True)
    except (ValueError, OSError) as e:
        msg = str(e)
        raise ConfigError(msg if msg.startswith(f"{where.split('.')[0]}.") else f"{where}: {msg}") from None


def _error_message(e: Exception) -> str:
    """A start-up error as the user needs it: Hydra's first line names the override ("Error merging override
    critic.lr=abc") and its cause says what is wrong with it ("Value 'abc' of type 'str' could not be converted to
    Float"); the checks' own messages are whole (a model name's list of known names)."""
    from hydra.errors import HydraException

    if not isinstance(e, HydraException):
        return str(e)
    cause = str(e.__cause__ or "").strip()
    return str(e).splitlines()[0] + (f" ({cause.splitlines()[0]})" if cause else "")


def main(argv=None) -> int:
    """``python -m critics.train --out DIR [key=value ...]``: train and evaluate the configured critic alone, on the
    bundled labels (``critic.seed_annotations``) with the splits, δ and test numbers of the I2D2 loop's critic stage
    (without a run's labels store or the LM-perplexity baseline). The overrides compose conf/train.yaml
    (``critic=gemma_lora``, ``critic.lora.r=32``, ``trainer=gpu``). DIR works as a stage folder: a finished critic of
    the same config and labels is reused, a killed one resumes, and a DIR holding anything else is refused. Prints
    the summary as one JSON line; ``DIR/metrics.json`` keeps it."""
    import argparse
    import json
    import sys

    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    from i2d2 import config
    from i2d2.io import fingerprint, run_stage, stage_fingerprint
    from i2d2.lightning_setup import single_device_trainer
    from i2d2.models import check_models, use_cache_dir

    ap = argparse.ArgumentParser(prog="python -m critics.train", description=main.__doc__)
    ap.add_argument("--out", required=True, help="output folder (a stage folder: reused, resumed or refused)")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides of conf/train.yaml")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    out = Path(args.out)
    try:
        with initialize_config_dir(str(config.CONF_DIR), version_base="1.3"):
            cfg = compose("train", overrides=args.overrides)
        config.check_keys(cfg)
        use_cache_dir(cfg.get("cache_dir"))  # a Gemma critic body converts into the configured cache
        critic_config(cfg.critic)  # a bad value fails here, before the folder is touched
        # a misspelt critic.name failed once the folder held this config's split: the corrected rerun was then
        # refused as "other work"
        check_models(cfg, prefix="critic.")
        blocker = config.file_in_the_way(out)  # was a NotADirectoryError traceback from the stage's first write
        config.need(blocker is None, "--out", f"must name a folder, but {blocker} is a file")
        paths, _ = checked_labels(critic_config(cfg.critic), list(cfg.critic.seed_annotations))
        # the split by entity (split_groups) is an input: a folder trained on a split by pair alone is refused
        fp = fingerprint("critic", *paths, fingerprint_view(plain(cfg.critic)), "split-by-entity")
        if out.is_dir() and any(out.iterdir()) and stage_fingerprint(out) != fp:
            raise ValueError(f"--out {out} holds other work (another critic config or labels, or not a critic "
                             "folder): choose a new folder")
        summary = run_stage(out, fp, lambda d: train_critic(cfg.critic, paths, d, single_device_trainer(plain(cfg.trainer))),
                            name="critic")
    except (HydraException, ValueError, FileNotFoundError) as e:
        print(f"error: {_error_message(e)}", file=sys.stderr)
        return 2
    # the last line of stdout, one JSON object (Lightning prints its model table above it)
    print(json.dumps({k: v for k, v in summary.items() if not isinstance(v, dict)}, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
