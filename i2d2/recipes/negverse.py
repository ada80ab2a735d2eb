"""NegVerse recipe (``python -m i2d2.train task=negverse``): data -> prompt tuning -> negate held-out sentences.

Layout under ``cfg.run_dir``:
  data/   pairs.jsonl (written + rule-generated), train.jsonl, val.jsonl, stats.json
  train/  checkpoints/ (resumable, trainable tensors only), adapter/ (peft prompt + special tokens), summary
  eval/   negations.jsonl (kept), dropped.jsonl, metrics.json, samples.md
Each stage is fingerprinted (i2d2.io.run_stage): a finished stage is reused, a changed one redone, and a
killed training resumes from its last checkpoint.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import hydra
from omegaconf import DictConfig

from i2d2.lightning_setup import fit_settings, plain as _c  # plain: config node -> plain dicts/lists
from i2d2.io import DataError, fingerprint, model_fingerprint, named, read_jsonl, run_relative, run_stage, write_json, \
    write_jsonl, write_text
from i2d2.tracking import Tracker, publish_report, tracked_run
from i2d2.resume import seed_fit

log = logging.getLogger(__name__)
# runs in one process: python -m i2d2.train refuses a trainer config asking for several at start-up
ONE_PROCESS = True


def check_config(cfg) -> None:
    """Values the run cannot use, refused by ``python -m i2d2.train`` before any model loads (a stage would fail
    on them only after removing its own earlier output)."""
    from i2d2.config import ConfigError, is_int, is_num, need, need_counts, need_one_pass
    from i2d2.schemas import NegverseFilters, NegverseGenerate, NegverseTrainMasking, fill

    need_one_pass(cfg, "negverse", "one data / train / eval pass")
    t = cfg.task
    for key, schema in (("generate", NegverseGenerate), ("masking", NegverseTrainMasking), ("filters", NegverseFilters)):
        try:
            fill(schema, t[key], where=f"task.{key}")
        except (TypeError, ValueError) as e:
            msg = str(e)
            raise ConfigError(msg if msg.startswith("task.") else f"task.{msg}") from None
    tr = t.train
    need(is_num(tr.lr) and tr.lr > 0, "task.train.lr", f"must be > 0, got {tr.lr!r}")
    need(is_num(tr.new_token_lr) and tr.new_token_lr >= 0, "task.train.new_token_lr", f"must be >= 0, got {tr.new_token_lr!r}")
    need(is_num(tr.weight_decay) and tr.weight_decay >= 0, "task.train.weight_decay",
         f"must be >= 0, got {tr.weight_decay!r}")
    need(is_int(tr.warmup_steps) and tr.warmup_steps >= 0, "task.train.warmup_steps",  # -1 was read as 1
         f"must be an integer >= 0, got {tr.warmup_steps!r}")
    need(is_num(tr.val_fraction) and 0 < tr.val_fraction < 1, "task.train.val_fraction",
         f"must be in (0, 1), got {tr.val_fraction!r}")
    need(is_int(tr.max_steps) and (tr.max_steps == -1 or tr.max_steps >= 1), "task.train.max_steps",
         f"must be -1 (epochs) or an integer >= 1, got {tr.max_steps!r}")
    need_counts(cfg, *(f"task.train.{k}" for k in ("batch_size", "epochs", "max_length", "val_batches",
                                                   "checkpoint_every")))
    need(t.get("cue_tagger_mode", "union") in ("union", "replace"), "task.cue_tagger_mode",
         f"must be union or replace, got {t.get('cue_tagger_mode')!r}")
    need_counts(cfg, "task.prompt.num_virtual_tokens")
    # the cue lexicon was read only by the evaluation, after training: a missing or malformed file is refused now
    import yaml
    from omegaconf.errors import OmegaConfBaseException

    from i2d2.negverse.cues import load_lexicon

    try:
        load_lexicon(t.cue_lexicon)
    except (OSError, ValueError, TypeError, yaml.YAMLError, OmegaConfBaseException) as e:
        msg = " ".join(str(e).split())  # YAML's messages span lines
        raise ConfigError(f"task.cue_lexicon: {msg if str(t.cue_lexicon) in msg else f'{t.cue_lexicon}: {msg}'}") \
            from None
    # the evaluation reads these sentences only after training: a missing or empty file is refused now, by name
    from i2d2.negverse.data import read_sentences, resolve, seen_in_training

    d = cfg.data
    for key, bundled in (("eval_sentences", "eval_sentences.txt"), ("affirmatives", "affirmatives.txt"),
                         ("pairs", "pairs.tsv")):  # data.eval_sentences=3 was 'expected str, bytes or os.PathLike'
        need(d.get(key) is None or isinstance(d.get(key), str), f"data.{key}",
             f"must be a file path, or null for the bundled {bundled}, got {d.get(key)!r}")
    def data_file(key, bundled):  # a missing file named with its key ("NegVerse data file ... not found" did not say which)
        try:
            return resolve(d.get(key), bundled)
        except FileNotFoundError as e:
            raise FileNotFoundError(f"data.{key}: {e}") from None

    ev = data_file("eval_sentences", "eval_sentences.txt")
    affirmatives = data_file("affirmatives", "affirmatives.txt") if d.use_rules else None

    def sentences_of(path, key):  # a file of the wrong kind (a TSV) named with its key, as other start-up errors are
        try:
            return read_sentences(path)
        except DataError as e:
            raise ConfigError(f"{key}: {e}") from None

    sentences = sentences_of(ev, "data.eval_sentences")
    if affirmatives is not None:
        sentences_of(affirmatives, "data.affirmatives")
    need(bool(sentences), "data.eval_sentences", f"{ev} holds no sentences (empty, or only blank and '#' lines)")
    # the evaluation reports on held-out sentences: one the prompt trained on (a pair's either side, or an
    # affirmative the rules derive pairs from), also re-cased or re-punctuated, is refused (this was only assumed)
    seen = seen_in_training(sentences, data_file("pairs", "pairs.tsv"), affirmatives)
    need(not seen, "data.eval_sentences",
         f"{len(seen)} sentence(s) of {ev} are also training sentences (case and punctuation ignored): "
         + "; ".join(f"{e!r} ~ {t!r}" for e, t in seen[:5]) + (" ..." if len(seen) > 5 else ""))


def data_stage(cfg, nlp, out_dir: Path) -> dict:
    from i2d2.negverse.data import build_examples, build_pairs, resolve, split_by_original

    t, d = cfg.task, cfg.data
    pairs_path = resolve(d.pairs, "pairs.tsv")
    pairs = build_pairs(nlp, pairs_path, resolve(d.affirmatives, "affirmatives.txt"),
                        use_rules=bool(d.use_rules), rules_on_pairs=bool(d.rules_on_pairs), seed=int(cfg.seed))
    write_jsonl(out_dir / "pairs.jsonl", pairs)
    examples, stats = build_examples(nlp, pairs, rules=list(t.masking.rules), max_blanks=int(t.masking.max_blanks),
                                     max_variants=int(t.masking.train_max_variants), seed=int(cfg.seed))
    train, val = split_by_original(examples, float(t.train.val_fraction), seed=int(cfg.seed))
    if not train:  # else training fails later with advice about max_length, which is not the cause
        raise DataError(f"{pairs_path}: no training examples ({len(pairs)} pair(s), {stats['n_unaligned_pairs']} "
                        f"without an aligned mask, {len(val)} example(s) held out for validation)")
    write_jsonl(out_dir / "train.jsonl", train)
    write_jsonl(out_dir / "val.jsonl", val)
    types: dict[str, int] = {}
    for p in pairs:
        types[p["type"]] = types.get(p["type"], 0) + 1
    stats.update(n_train=len(train), n_val=len(val), n_rule_pairs=sum(p["source"].startswith("rule:") for p in pairs),
                 **{f"pairs_{k}": v for k, v in types.items()})
    write_json(out_dir / "stats.json", stats)
    return stats


# the Trainer arguments train_stage sets itself (the trainer config's are replaced): not part of fp_train
TRAIN_FIT_ARGS = ("max_steps", "max_epochs", "callbacks", "logger", "default_root_dir", "limit_val_batches",
                  "num_sanity_val_steps")


def train_stage(cfg, data_dir: Path, out_dir: Path, logger) -> dict:
    # lightning_setup's ModelCheckpoint: resumable in a run folder that moved
    from i2d2.lightning_setup import ModelCheckpoint, build_trainer, full_weights, resume_checkpoint
    from i2d2.models import load_causal_lm
    from i2d2.negverse.model import NegVerseLM
    from i2d2.resume import EpochProgress, ResumeState
    from trainers.negverse import NegVerseModule, make_loader

    t = cfg.task
    tr = t.train
    base, tok = load_causal_lm(cfg.model.name, cache=cfg.get("cache_dir"))
    seed_fit(int(cfg.seed))  # the soft prompt starts random (init_text overwrites it, an empty one does not)
    lm = NegVerseLM(base, tok, num_virtual_tokens=int(t.prompt.num_virtual_tokens), init_text=t.prompt.init_text,
                    train_new_tokens=bool(t.prompt.train_new_tokens))
    train = read_jsonl(data_dir / "train.jsonl", required=["prompt", "target"])
    val = read_jsonl(data_dir / "val.jsonl", required=["prompt", "target"])
    progress = EpochProgress()  # exact resume: batch position + RNG state in last.ckpt (i2d2/resume.py)
    train_dl, skipped = make_loader(tok, train, int(tr.batch_size), int(tr.max_length), True, int(cfg.seed), progress)
    val_dl = make_loader(tok, val, int(tr.batch_size), int(tr.max_length), False)[0] if val else None
    max_steps = int(tr.max_steps)
    # the schedule counts optimiser steps: with gradient accumulation an epoch holds ceil(batches / accum) of them
    accum = int(cfg.trainer.get("accumulate_grad_batches", 1) or 1)
    total = max_steps if max_steps > 0 else -(-len(train_dl) // accum) * int(tr.epochs)
    module = NegVerseModule(lm, lr=float(tr.lr), new_token_lr=float(tr.new_token_lr),
                            weight_decay=float(tr.weight_decay), warmup_steps=int(tr.warmup_steps), total_steps=total)
    ckpt_dir = out_dir / "checkpoints"
    ckpt = ModelCheckpoint(dirpath=ckpt_dir, save_last=True, save_top_k=1, enable_version_counter=False,
                           every_n_train_steps=int(tr.checkpoint_every))
    trainer = build_trainer(  # TRAIN_FIT_ARGS
        cfg.trainer, micro_batch=int(tr.batch_size), max_steps=max_steps,
        max_epochs=int(tr.epochs) if max_steps <= 0 else -1, callbacks=[ResumeState(progress, "negverse"), ckpt],
        logger=logger if logger is not None else False, default_root_dir=str(out_dir),
        limit_val_batches=int(tr.val_batches), num_sanity_val_steps=0)

    seed_fit(int(cfg.seed))  # a fresh fit starts from one RNG state; a resumed one takes the checkpoint's
    t0 = time.time()
    trainer.fit(module, train_dl, ckpt_path=resume_checkpoint(ckpt_dir / "last.ckpt", trainer))
    fit_s = time.time() - t0
    val_loss, n_val_loss = None, 0
    if val_dl is not None:
        trainer.validate(module, val_dl, verbose=False)  # val/loss is not logged (trainers.negverse): read it back
        val_loss = float(trainer.callback_metrics["val/loss"])
        # the loss reads the first task.train.val_batches batches only (16 of the bundled data's 84 validation
        # examples at the defaults): its count goes beside it, n_val in the data table is the whole split
        n_val_loss = min(len(val_dl.dataset), int(tr.val_batches) * int(tr.batch_size))
    with full_weights(trainer, module):  # ZeRO-3: every rank joins the gather; rank 0 writes the adapter
        if trainer.is_global_zero:
            lm.save(out_dir / "adapter", cfg.model.name, extra={"task": _c(t)})
    summary = {"steps": int(trainer.global_step), "fit_s": fit_s, "val_loss": val_loss, "n_val_loss_examples": n_val_loss,
               "train_loss_first10": _mean(module.loss_history[:10]), "train_loss_last10": _mean(module.loss_history[-10:]),
               "steps_this_session": module.steps_this_session,
               "n_train_examples": len(train), "skipped_too_long": skipped,
               "adapter": run_relative(out_dir / "adapter", cfg.run_dir)}  # recorded relative to run_dir
    write_json(out_dir / "summary.json", summary)
    return summary


def _mean(xs):
    return float(sum(xs) / len(xs)) if xs else None


def eval_stage(cfg, nlp, adapter: Path, out_dir: Path, tracker: Tracker) -> dict:
    from i2d2.negverse.cues import CueDetector
    from i2d2.negverse.data import read_sentences, resolve
    from i2d2.negverse.metrics import negation_metrics
    from i2d2.negverse.model import NegVerseLM
    from i2d2.negverse.pipeline import negate

    t = cfg.task
    sentences = read_sentences(resolve(cfg.data.eval_sentences, "eval_sentences.txt"))
    lm = NegVerseLM.load(adapter, cache=cfg.get("cache_dir"))
    tagger = hydra.utils.instantiate(t.cue_tagger) if t.get("cue_tagger") else None
    detector = CueDetector(nlp, lexicon=t.cue_lexicon, tagger=tagger, tagger_mode=t.get("cue_tagger_mode", "union"))
    kept, dropped, stats = negate(lm, nlp, detector, sentences, **_c(t.generate), **_negate_opts(t), seed=int(cfg.seed))
    metrics = {**stats, **negation_metrics(kept, nlp)}
    write_jsonl(out_dir / "negations.jsonl", kept)
    write_jsonl(out_dir / "dropped.jsonl", dropped)
    write_json(out_dir / "metrics.json", metrics)
    write_text(out_dir / "samples.md", samples_markdown(kept, sentences))
    # the numbers reach the loggers once, as negverse/eval/* (publish_report, also when this stage is reused);
    # logging them here too put every metric under a second name (negverse/keep_rate beside negverse/eval/keep_rate)
    tracker.log_table("negverse/eval/negations", ["original", "negation", "type", "masked", "lev_distance"],
                      [[r["original"], r["negation"], r["negation_type"], r["masked"], r["lev_distance"]]
                       for r in kept])
    return metrics


def _negate_opts(t) -> dict:
    return {"rules": list(t.masking.rules), "max_blanks": int(t.masking.max_blanks),
            "max_variants": int(t.masking.max_variants), "min_two_blank": int(t.masking.get("min_two_blank", 1)),
            **_c(t.filters)}


def samples_markdown(kept: list[dict], sentences: list[str], per_sentence: int = 4) -> str:
    lines = ["| original | negation | type |", "|---|---|---|"]
    for s in sentences:
        rows = [r for r in kept if r["original"] == s.strip()]
        # one of each type first, then the rest
        seen, ordered = set(), []
        for r in rows:
            if r["negation_type"] not in seen:
                seen.add(r["negation_type"])
                ordered.append(r)
        ordered += [r for r in rows if r not in ordered]
        if not ordered:
            lines.append(f"| {s} | (none kept) | |")
        for r in ordered[:per_sentence]:
            lines.append(f"| {s} | {r['negation']} | {r['negation_type']} |")
    return "\n".join(lines) + "\n"


def run(cfg: DictConfig) -> dict:
    with tracked_run(cfg, Path(cfg.run_dir) / "eval") as tracker:
        return _run(cfg, tracker)


def _run(cfg: DictConfig, tracker: Tracker) -> dict:
    from i2d2.models import load_spacy
    from i2d2.negverse.data import DATA_DIR
    from i2d2.negverse.rules import AFFIXAL_PAIRS

    run_dir = Path(cfg.run_dir)
    logger = tracker.logger
    nlp = load_spacy(cfg.task.spacy)
    d = cfg.data
    files = [Path(d.pairs or DATA_DIR / "pairs.tsv"), Path(d.affirmatives or DATA_DIR / "affirmatives.txt"), AFFIXAL_PAIRS]
    # only what the data stage reads: the evaluation file and generation-time masking (max_variants,
    # min_two_blank) change the evaluation, not the training pairs
    m = cfg.task.masking
    fp_data = fingerprint(*files, named("data config", {k: d.get(k) for k in ("pairs", "affirmatives", "use_rules",
                                                                              "rules_on_pairs")}),
                          named("masking config", {"rules": list(m.rules), "max_blanks": int(m.max_blanks),
                                                   "train_max_variants": int(m.train_max_variants)}),
                          named("val_fraction", float(cfg.task.train.val_fraction)), named("seed", int(cfg.seed)),
                          named("data format version", "negverse-data-v3"),
                          *[named("spacy pipeline", p) for p in _spacy_fingerprint(cfg.task.spacy, nlp)])
    data_dir = run_dir / "data"
    data_stats = run_stage(data_dir, fp_data, lambda out: data_stage(cfg, nlp, out), "negverse-data")
    log.info("negverse data: %s", data_stats)

    fp_train = train_fingerprint(cfg, fp_data)
    train_dir = run_dir / "train"
    train_summary = run_stage(train_dir, fp_train, lambda out: train_stage(cfg, data_dir, out, logger), "negverse-train")
    log.info("negverse training: %s", train_summary)

    eval_file = Path(d.eval_sentences or DATA_DIR / "eval_sentences.txt")
    fp_eval = fingerprint(fp_train, eval_file, Path(cfg.task.cue_lexicon),
                          named("generate config", _c(cfg.task.generate)),
                          named("filters config", _c(cfg.task.filters)), named("masking config", _c(cfg.task.masking)),
                          named("seed", int(cfg.seed)),
                          named("cue_tagger config", _c(cfg.task.cue_tagger) if cfg.task.get("cue_tagger") else None),
                          named("eval format version", "negverse-eval-v9"))
    # eval format: v3 verb checks, v4 subject / lone "no" / preposition, v5 questions, imperatives, inversion...,
    # v6 each sentence once, dedupe folds a final .!? and ’, counts beside the rates, untyped shares null,
    # v7 neither / nor after a determiner, a cue for a determiner, a changed tense, v8 a changed verb number,
    # v9 neither / nor after a pronoun, "not one", neither ... nor subjects stand
    eval_dir = run_dir / "eval"
    metrics = run_stage(eval_dir, fp_eval, lambda out: eval_stage(cfg, nlp, train_dir / "adapter", out, tracker),
                        "negverse-eval")
    log.info("negverse eval metrics: %s", {k: (round(v, 4) if isinstance(v, float) else v) for k, v in metrics.items()})
    summary = {"data": data_stats, "train": train_summary, "eval": metrics}
    # the bundled file given by its path is still the one the filters were written from
    bundled = eval_file.resolve() == (DATA_DIR / "eval_sentences.txt").resolve()
    publish_report(run_dir, summary, _report(summary, bundled_eval=bundled,
                                             eval_name="bundled eval_sentences.txt" if bundled else str(eval_file)),
                   tracker, prefix="negverse")
    return summary


def train_fingerprint(cfg: DictConfig, fp_data: str) -> str:
    """The prompt-tuning stage's inputs: the data stage's, the model, the prompt and training settings, and the
    trainer's (accumulate_grad_batches, precision or gradient clipping changed kept the old soft prompt). The
    checkpoint cadence is where a killed fit resumes from, not what it learns."""
    train_keys = {k: v for k, v in _c(cfg.task.train).items() if k != "checkpoint_every"}
    return fingerprint(fp_data, named("model", model_fingerprint(cfg.model.name)),
                       named("prompt config", _c(cfg.task.prompt)), named("train config", train_keys),
                       named("trainer settings", fit_settings(cfg.trainer, TRAIN_FIT_ARGS)),
                       named("train format version", "negverse-train-v3"))


def _spacy_fingerprint(name: str, nlp) -> list:
    """The parser every stage reads (masks, rule pairs, cue and grammar filters): fp_train and fp_eval include
    fp_data, so a different pipeline redoes all three. The packaged default adds nothing, so that runs from before
    the parser was fingerprinted keep their fingerprints."""
    from i2d2.io import model_fingerprint

    if str(name) == "packaged:spacy-sm":
        return []
    meta = getattr(nlp, "meta", {}) or {}
    return [{"spacy": str(name), "content": model_fingerprint(str(name)), "pipes": list(getattr(nlp, "pipe_names", [])),
             "version": f"{meta.get('lang')}_{meta.get('name')}-{meta.get('version')}"}]


# the bundled eval sentences shaped the filters (README, "What the evaluation numbers are not"): the report says so
BUNDLED_EVAL_NOTE = ("The degenerate and grammar filters were in part written from outputs for these bundled sentences: "
                     "keep rate, drop counts and the kept-set metrics describe the filters, they do not measure them "
                     "(measure on a fresh `data.eval_sentences`).")


# what every evaluation number is, whatever the file: the filters and the cue detector that chose the kept set also
# measure it, and no person judged the rows; sentences_with_negation read as a share of sentences correctly negated
SELF_MEASURED_NOTE = ("Every count and rate here is read by this run's own filters and cue detector, the ones that "
                      "chose the kept set; no output was judged. `sentences_with_negation` is the share of sentences "
                      "with at least one candidate the filters kept (`n_sentences_with_negation`), not a share "
                      "negated correctly, and the type shares are the cue detector's reading of the kept rows. The "
                      "share valid among kept needs judged outputs: "
                      "`python -m i2d2.negverse.grammar_eval --judged FILE`.")


def _train_note(train: dict) -> list[str]:
    """Which data the prompt tuning's losses come from: the table gave val_loss beside n_val (the whole split) with no
    word on which examples it read or whether it picked anything."""
    if train.get("val_loss") is None:
        return []
    return [f"`val_loss`: the first {train.get('n_val_loss_examples', '?')} examples of the validation split (masked "
            "variants of original sentences held out of training); nothing was selected on it (the adapter is the "
            "last step's, no early stopping). `train_loss_*`: the mean loss of the first / last 10 training steps, on "
            "training batches.", ""]


def _report(summary: dict, bundled_eval: bool = False, eval_name: str = "eval sentences") -> str:
    def rows(d):  # timings and this process's bookkeeping stay in report.json: same results, same report.md bytes
        return [f"| {k} | {'–' if v is None else round(v, 4) if isinstance(v, float) else v} |" for k, v in d.items()
                if (isinstance(v, (int, float, str)) or v is None) and not k.endswith(("_s", "seconds"))
                and k not in ("steps_this_session", "resumed_from")]

    return "\n".join(["# NegVerse run", "", "Sample negations: `eval/samples.md`; all kept: `eval/negations.jsonl`.", "",
                      f"## Evaluation ({summary['eval'].get('n_sentences', '?')} sentences of `{eval_name}`)", "", *([BUNDLED_EVAL_NOTE, ""] if bundled_eval else []),
                      SELF_MEASURED_NOTE, "",
                      "| metric | value |", "|---|---|", *rows(summary["eval"]), "",
                      "## Prompt tuning", "", *_train_note(summary["train"]),
                      "| key | value |", "|---|---|", *rows(summary["train"]), "",
                      "## Training data", "", "| key | value |", "|---|---|", *rows(summary["data"])]) + "\n"
