"""NeuroComparatives (neurocomparatives.txt §2-3) as a task: ``python -m i2d2.train task=comparatives``.

Stages, each in ``{run_dir}/iter_{k}/`` and skipped when finished with the same inputs (i2d2.io.run_stage):

  prompts/        entity pairs -> "Compared to X, Y" prompts, worst 30% by LM perplexity dropped,
                  one prompt row per (pair, aux x adverb pass) with its NeuroLogic ConstraintSet
  generations/    the shared NeuroLogic generation stage (i2d2.generation.generate_stage)
  filtered/dedup/          agglomerative clustering of sentence embeddings, best S per cluster   (§2.3.1)
  filtered/groups/         best S per (pair, aux verb, adverb, comparative)                       (§2.3.2)
  filtered/contradiction/  drop statements contradicting most of their pair's others; k best   (§2.3.3)
  critic/                  the shared critic trained on comparative annotations                   (§2.3.4)
  filtered/discriminator/  NC-XL / NC-L / NC-S cuts by critic score                              (§3)
  filtered/stage_counts.json, metrics.json, comparative_qa.jsonl, report.md
  qa_eval/                 an LM scored on comparative_qa.jsonl                                   (§4.3)
  qa_benchmark/            the same LM on the labelled comparatives judged true                   (§4.1)
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from i2d2.lightning_setup import plain as _plain  # config node -> plain dicts/lists
from i2d2.config import ConfigError
from i2d2.comparatives import filters as F
from i2d2.comparatives.entities import BUNDLED, FORMATS, UNCOUNTABLE, load_classes
from i2d2.comparatives.frequency import FrequencyFilter, filter_obscure, log_filter_summary
from i2d2.comparatives.metrics import corpus_metrics, fmt
from i2d2.metrics import wilson_interval
from i2d2.comparatives.prompts import make_pairs, perplexity_filter, prompt_rows, select_passes
from i2d2.comparatives.qa import export_qa
from i2d2.comparatives.wordlists import load_wordlists
from i2d2.tracking import publish_report, scalars
from i2d2.io import DataError, fingerprint, in_run, iteration_model_dir, model_fingerprint, named, read_jsonl, \
    run_relative, run_stage, stream_jsonl, write_json, write_jsonl, write_text

log = logging.getLogger(__name__)
# runs in one process: python -m i2d2.train refuses a trainer config asking for several at start-up
ONE_PROCESS = True

SEED_ANNOTATIONS = Path(__file__).resolve().parent.parent / "data" / "comparatives" / "annotations_gemma.jsonl"
FILTER_STAGES = ("dedup", "groups", "contradiction")


def _df(path: Path) -> pd.DataFrame:
    return pd.DataFrame(read_jsonl(path))


def _write_df(path: Path, df: pd.DataFrame) -> None:
    write_jsonl(path, df.to_dict("records"))


# ----------------------------------------------------------------------------- start-up checks

def check_config(cfg) -> None:
    """Values the run cannot use, refused by ``python -m i2d2.train`` before any model loads (a stage would fail
    on them only after the stages before it, and after removing its own earlier output)."""
    from i2d2.comparatives.qa_eval import QAEvalConfig
    from i2d2.config import is_int, is_num, need, need_counts
    from i2d2.schemas import CriticConfig, CrossEncoderConfig, DecodingConfig, fill

    task, data = cfg.task, cfg.data
    first, n = cfg.get("iteration"), cfg.get("num_iterations", 1)
    need(is_int(first) and first >= 0, "iteration", f"must be an integer >= 0, got {first!r}")
    need(is_int(n) and n >= 1, "num_iterations", f"must be an integer >= 1, got {n!r}")
    for k in range(max(first, 1), first + n):  # nothing here writes a model
        prev = iteration_model_dir(cfg.run_dir, k - 1)
        need((prev / "config.json").exists(), "iteration" if k == first else "num_iterations",
             f"iteration {k} generates with {prev}, which does not exist: NeuroComparatives has no fine-tuning step "
             "to write it (run iteration=0 num_iterations=1, or put a model there)")
    need(is_int(task.samples) and task.samples >= 0, "task.samples",  # -3 was taken as "all but 3" by head()
         f"must be an integer >= 0, got {task.samples!r}")
    mp = task.get("max_passes")
    need(mp is None or (is_int(mp) and mp >= 1), "task.max_passes", f"must be null (all 30) or an integer >= 1, got {mp!r}")
    df = data.prompt_filter.drop_fraction
    need(is_num(df) and 0 <= df < 1, "data.prompt_filter.drop_fraction", f"must be in [0, 1), got {df!r}")
    dd = task.filters.dedup
    need(is_num(dd.distance_threshold) and dd.distance_threshold >= 0, "task.filters.dedup.distance_threshold",
         f"must be a number >= 0, got {dd.distance_threshold!r}")
    need(dd.linkage in ("single", "complete", "average"), "task.filters.dedup.linkage",
         f"must be single, complete or average, got {dd.linkage!r}")
    # top_k: the dynamic comparative clause's adjectives per step (the decoder refuses 0 too, but at generation)
    need_counts(cfg, "task.constraints.top_k", "task.filters.contradiction.k", "task.shard_size",
                "data.prompt_filter.batch_size", "task.filters.dedup.batch_size",
                "task.filters.contradiction.batch_size", "task.filters.discriminator.batch_size")
    disc = task.filters.discriminator
    cuts = _plain(disc.cuts) or {}
    for name, frac in cuts.items():
        need(is_num(frac) and 0 < frac <= 1, f"task.filters.discriminator.cuts.{name}",
             f"must be a kept fraction in (0, 1], got {frac!r}")
    if disc.enabled:  # without the discriminator the QA comes from every statement that passed the filters
        need(bool(cuts), "task.filters.discriminator.cuts", "must name at least one cut")
        need(task.qa.source in cuts, "task.qa.source", f"must be one of the cuts {sorted(cuts)}, got {task.qa.source!r}")
    need(isinstance(task.qa.get("benchmark"), bool), "task.qa.benchmark", f"must be true or false, got {task.qa.get('benchmark')!r}")
    qe = {k: v for k, v in _plain(task.qa.evaluate).items() if k not in ("enabled", "model")}
    for key in ("shots", "max_share", "batch_size"):
        need(is_num(qe.get(key)), f"task.qa.evaluate.{key}", f"must be a number, got {qe.get(key)!r}")
    try:
        QAEvalConfig(**qe)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"task.qa.evaluate: {e}") from None
    try:  # the discriminator's critic (the shared config with the task's overrides), the contradiction
        # cross-encoder and the decoding settings
        ccfg = fill(CriticConfig, critic_cfg(cfg), where="critic")
        ce = fill(CrossEncoderConfig, task.filters.contradiction.cross_encoder,
                  where="task.filters.contradiction.cross_encoder")
        DecodingConfig(**_plain(cfg.decoding))
    except (TypeError, ValueError) as e:
        msg = str(e)
        if msg.startswith("critic"):
            msg += " (the discriminator's critic: critic.* with task.filters.discriminator.critic.* over it)"
        raise ConfigError(msg if msg.startswith(("critic", "task.", "decoding")) else f"decoding.{msg}") from None
    _check_template(data.template)
    for key in ("min_entities", "wikidata.max_depth"):
        v = OmegaConf.select(data, key)
        need(is_int(v) and v >= 0, f"data.{key}", f"must be an integer >= 0, got {v!r}")
    for key in ("max_pairs", "max_pairs_per_class"):  # -1 failed in pandas' sample after the perplexity stage
        v = data.get(key)
        need(v is None or (is_int(v) and v >= 1), f"data.{key}", f"must be null (all) or an integer >= 1, got {v!r}")
    con = task.filters.contradiction
    if con.get("scorer") in (None, "", "cross_encoder"):  # load_contradiction_scorer's names for the cross-encoder:
        # it trains on these files (its cache is looked up by their bytes) once the contradiction stage has begun
        for path in ce["statements"] or []:
            need(Path(str(path)).expanduser().is_file(), "task.filters.contradiction.cross_encoder.statements",
                 f"{path} is not a file (jsonl rows with a 'statement', which the cross-encoder scorer trains on)")
    for key in ("contradiction_threshold", "entailment_threshold"):  # probabilities: above 1 flags nothing, silently
        need(is_num(con[key]) and 0 <= con[key] <= 1, f"task.filters.contradiction.{key}",
             f"must be a probability in [0, 1], got {con[key]!r}")
    _check_prompt_inputs(cfg)
    if task.qa.benchmark and task.qa.evaluate.enabled:
        benchmark_items(cfg)  # a labels file it cannot use fails here, naming file:line, not after the iteration
    if disc.enabled:  # the discriminator's labels, read and split as its stage will (after generation and the
        # filters): a missing, broken or too small file fails here, naming file:line
        from critics.train import checked_labels

        try:
            paths = annotation_paths(cfg)
        except OSError as e:  # its message names the key
            raise ConfigError(str(e)) from None
        checked_labels(ccfg, paths, where="task.filters.discriminator.annotations", keys=critic_keys(cfg))


def _check_prompt_inputs(cfg) -> None:
    """What the prompts stage reads, read now (seconds): the entity classes and pairs, the entity and perplexity
    filters' settings, the word lists and each pass's constraints. Each failed only after the LM had loaded, or
    once generation had started, and some with the generated prompts.jsonl named instead of the key."""
    from i2d2.comparatives.prompts import DEFAULT_ORDER, constraint_set
    from i2d2.config import is_num, need
    from i2d2.decoding import ConstraintError
    from i2d2.decoding.constraints import validate
    from i2d2.schemas import PERPLEXITY_UNITS

    data, task = cfg.data, cfg.task
    per = data.prompt_filter.per
    need(per in PERPLEXITY_UNITS, "data.prompt_filter.per", f"must be {' or '.join(PERPLEXITY_UNITS)}, got {per!r}")
    ef = data.entity_filter
    corpus = ef.enabled and ef.source != "wordfreq"
    if ef.enabled:
        for key in ("min_count", "corpus_words"):
            need(is_num(ef[key]) and ef[key] > 0, f"data.entity_filter.{key}", f"must be a number > 0, got {ef[key]!r}")
        need(not corpus or Path(str(ef.source)).expanduser().is_file(), "data.entity_filter.source",
             f"must be wordfreq or a text file, one document a line; {ef.source!r} is neither")
    # the loader's error for it was prefixed data.classes, the file's key
    need(data.format in FORMATS, "data.format", f"must be one of {', '.join(FORMATS)}, got {data.format!r}")
    try:  # a missing, empty or malformed classes file named with its line, or classes with no pair; the classes
        # only: building every pair (1.7M at the paper's scale) is the prompts stage's work
        classes, n_loaded = loaded_entity_classes(cfg)
    except (OSError, ValueError) as e:
        raise ConfigError(f"data.classes: {e}") from None
    if ef.enabled and not corpus:  # a filter that leaves no pair (a corpus is counted once, in the run: it may be
        # large; wordfreq takes a fraction of a second)
        try:
            filtered_entity_classes(cfg, classes, n_loaded)
        except DataError as e:  # no pair left: the threshold dropped them
            raise ConfigError(f"data.entity_filter.min_count: {e}") from None
        except (OSError, ValueError) as e:
            raise ConfigError(f"data.entity_filter: {e}") from None
    try:
        wl = load_wordlists(task.wordlists)
    except (OSError, ValueError) as e:
        raise ConfigError(f"task.wordlists: {e}") from None
    c = task.constraints
    order = _plain(c.order) or {}
    need(isinstance(order, dict) and set(order) <= set(DEFAULT_ORDER), "task.constraints.order",
         f"must map some of {sorted(DEFAULT_ORDER)} to satisfaction positions, got {order!r}")
    negatives = _plain(c.negatives)
    need(negatives is None or isinstance(negatives, list), "task.constraints.negatives",
         f"must be null (all) or a list of negative sets of {task.wordlists}, got {negatives!r}")
    checked: set = set()
    for aux, adverb in select_passes(wl, task.max_passes):
        for countable in (True, False):  # the aux verb agrees with entity2 (wl.agree): both forms are prompted
            try:
                validate(constraint_set(wl.agree(aux, countable), adverb, wl, int(c.top_k), order, negatives),
                         checked=checked)
            except (ConstraintError, ValueError) as e:
                raise ConfigError(f"task.constraints: {e} (pass {aux!r} {adverb!r})") from None
    keys = _plain(task.filters.groups["keys"])
    need(isinstance(keys, list) and bool(keys) and set(keys) <= set(DEFAULT_ORDER), "task.filters.groups.keys",
         f"must be a non-empty list of {sorted(DEFAULT_ORDER)} (the matched clauses a group shares), got {keys!r}")


def _check_template(template) -> None:
    """data.template: formatted with the two entities in make_pairs, and read back by the ComparativeQA export,
    which asks about the subject, so entity2 must end the prompt ('Compared to {entity1}, {entity2}')."""
    import string

    from i2d2.config import need

    need(isinstance(template, str), "data.template", f"must be a string, got {template!r}")
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as e:
        raise ConfigError(f"data.template: {e} in {template!r}") from None
    need(sorted(fields) == ["entity1", "entity2"], "data.template",
         f"must hold {{entity1}} and {{entity2}} once each and no other field, got {template!r}")
    need(template.rstrip().endswith("{entity2}"), "data.template",
         f"must end with {{entity2}} (the subject the statement continues about, which ComparativeQA asks "
         f"for), got {template!r}")


# ----------------------------------------------------------------------------- stages

def entity_classes(cfg):
    """The entity classes (§2.1.1) and their obscure entities out (§2.1.3, ``data.entity_filter``): (classes,
    entities loaded, the frequency record or None). No class with two distinct entities (no pair) is an error."""
    classes, n_loaded, freq = filtered_entity_classes(cfg, *loaded_entity_classes(cfg))
    if freq is not None:
        log_filter_summary(freq)
    return classes, n_loaded, freq


def _has_pair(classes) -> bool:
    return any(len({e.name.lower() for e in ents}) >= 2 for ents in classes.values())


def loaded_entity_classes(cfg):
    """The entity classes as ``data.classes`` gives them, before ``data.entity_filter``: (classes, entities loaded).
    No class with two distinct entities is an error about the classes, not the filter."""
    data = cfg.data
    classes = load_classes(data.classes, data.format, int(data.min_entities),
                           list(data.wikidata.roots), int(data.wikidata.max_depth))
    n_entities_loaded = sum(len(v) for v in classes.values())
    if not _has_pair(classes):
        _no_pairs(cfg, n_entities_loaded, None, classes)
    return classes, n_entities_loaded


def filtered_entity_classes(cfg, classes, n_entities_loaded):
    """``loaded_entity_classes``' classes with their obscure entities out (§2.1.3, ``data.entity_filter``): (classes,
    entities loaded, the frequency record or None). A filter that leaves no pair is an error."""
    data = cfg.data
    freq = None
    if data.entity_filter.enabled:  # §2.1.3: obscure entities out, then classes with < 2 entities
        ef = data.entity_filter
        classes, freq = filter_obscure(classes, FrequencyFilter(str(ef.source), float(ef.min_count),
                                                                float(ef.corpus_words), int(data.min_entities)))
        if not _has_pair(classes):
            _no_pairs(cfg, n_entities_loaded, freq, classes)
    return classes, n_entities_loaded, freq


def _no_pairs(cfg, n_entities_loaded, freq, classes):
    data = cfg.data
    left = "" if freq is None else (f"; {n_entities_loaded} entities loaded, "
                                    f"{sum(len(v) for v in classes.values())} left after data.entity_filter "
                                    f"(min_count {data.entity_filter.min_count})")
    raise DataError(f"{data.classes or BUNDLED}: no entity pairs (need classes with >= 2 distinct entities{left})")


def entity_pairs(cfg):
    """``entity_classes`` and the pairs to prompt with: (classes, entities loaded, the frequency record or None,
    pairs). No pair is an error."""
    data = cfg.data
    classes, n_entities_loaded, freq = entity_classes(cfg)
    pairs = make_pairs(classes, data.template, bool(data.both_orders), data.max_pairs_per_class, int(cfg.seed))
    if pairs.empty:
        _no_pairs(cfg, n_entities_loaded, freq, classes)
    return classes, n_entities_loaded, freq, pairs


def build_prompts(cfg, model, tok, out_dir: Path, tracker=None) -> dict:
    """Pairs, perplexity filter and (pair, pass) prompt rows into ``out_dir``."""
    from i2d2.perplexity import perplexity

    data, task = cfg.data, cfg.task
    wl = load_wordlists(task.wordlists)
    classes, n_entities_loaded, freq, pairs = entity_pairs(cfg)
    if freq is not None:
        write_json(out_dir / "entity_frequency.json", freq)
    pf = data.prompt_filter
    t0 = time.time()
    ppl = perplexity(model, tok, pairs["prompt"].tolist(), batch_size=int(pf.batch_size), per=pf.per, progress=True)
    scored = perplexity_filter(pairs, ppl, float(pf.drop_fraction))
    _write_df(out_dir / "pairs.jsonl", scored)
    kept = scored.loc[scored["kept"]]
    if data.max_pairs is not None and len(kept) > int(data.max_pairs):
        kept = kept.sample(n=int(data.max_pairs), random_state=int(cfg.seed)).sort_index()
    passes = select_passes(wl, task.max_passes)
    c = task.constraints
    rows = prompt_rows(kept, passes, wl, int(c.top_k), _plain(c.order), _plain(c.negatives))
    write_jsonl(out_dir / "prompts.jsonl", rows)
    summary = {"n_classes": len(classes), "n_entities": sum(len(v) for v in classes.values()),
               "n_entities_loaded": n_entities_loaded,
               "n_entities_dropped_obscure": None if freq is None else len(freq["dropped_entities"]),
               "n_pairs": len(pairs), "n_pairs_after_perplexity": int(scored["kept"].sum()),
               "n_pairs_used": len(kept), "n_passes": len(passes), "n_prompts": len(rows),
               "perplexity_seconds": round(time.time() - t0, 1),
               "passes": [f"{a} {d}" for a, d in passes]}
    log.info("prompts: %d classes, %d pairs -> %d after the perplexity filter -> %d used x %d passes = %d prompts",
             summary["n_classes"], len(pairs), summary["n_pairs_after_perplexity"], len(kept), len(passes), len(rows))
    if tracker is not None:
        tracker.log_metrics({f"prompts/{k}": v for k, v in summary.items() if isinstance(v, (int, float))})
        cols = ["pair_id", "class", "prompt", "perplexity", "kept"]
        tracker.log_table("prompts/pairs", cols, scored[cols].head(50).values.tolist(), out_dir)
    return summary


def candidates(gen_rows: list[dict], first_sentence: bool = True, at_clause: bool = False,
               comparatives: list[str] | None = None) -> pd.DataFrame:
    """Generation rows -> one row per non-empty generation with text, statement and matched literals
    (``comparatives``: what ``at_clause`` keeps coordinated, see filters.first_sentence)."""
    df = pd.DataFrame(gen_rows)
    if df.empty:
        return df
    names = df["constraint_names"].map(tuple).unique()
    if len(names) != 1:
        raise DataError(f"generations mix constraint layouts {list(names)[:3]}")
    matched = pd.DataFrame(df["matched"].tolist(), columns=list(names[0]), index=df.index)
    text = F.first_sentence(df["generation"], at_clause, comparatives) if first_sentence \
        else df["generation"].fillna("").str.strip()
    df = df.drop(columns=[c for c in matched.columns if c in df.columns])
    df = df.assign(text=text, statement=df["prompt"] + " " + text, **{c: matched[c] for c in matched.columns})
    return df.loc[df["text"].str.len() > 0].reset_index(drop=True)


def _fingerprinted_cfg(name: str, stage_cfg: dict) -> dict:
    """What of a filter's config decides its output: the contradiction scorer's cache folder is a location (often
    under run_dir), not an input, and a cross-encoder block is irrelevant unless that scorer is chosen; fingerprinting
    them would redo the stage after a run folder moves. A dedup that splits opposites reads the lexicon rule too."""
    if name == "dedup":  # the lexicon rule's reading decides a split; off (the default), runs from before the key
        # existed keep their fingerprint
        if not stage_cfg.get("split_contradictions"):
            return {k: v for k, v in stage_cfg.items() if k != "split_contradictions"}
        from critics.contradiction import ComparativeDirectionScorer

        return {**stage_cfg, "offline_rule": ComparativeDirectionScorer.reading()}
    if name != "contradiction":
        return stage_cfg
    cfg = {k: v for k, v in stage_cfg.items() if k != "cross_encoder"}
    if stage_cfg.get("scorer") in ("offline", "comparative-direction"):  # the rule's reading decides the output
        from critics.contradiction import ComparativeDirectionScorer

        cfg["offline_rule"] = ComparativeDirectionScorer.reading()
    if stage_cfg.get("scorer") == "cross_encoder":
        cfg["cross_encoder"] = {k: v for k, v in (stage_cfg.get("cross_encoder") or {}).items() if k != "dir"}
    return cfg


def _filter_stage(name: str, in_path: Path, out_dir: Path, fp_cfg, fn, tracker=None) -> dict:
    def body(d: Path):
        df = _df(in_path)
        t0 = time.time()
        kept = fn(df) if len(df) else df
        # a filter with several steps returns (kept, rows each step dropped), which the summary records
        kept, dropped = kept if isinstance(kept, tuple) else (kept, {})
        _write_df(d / "kept.jsonl", kept)
        summary = {"in": int(len(df)), "out": int(len(kept)), **dropped, "seconds": round(time.time() - t0, 2)}
        log.info("filter %s: %d -> %d statements%s", name, summary["in"], summary["out"],
                 f" (dropped: {', '.join(f'{k} {v}' for k, v in dropped.items())})" if dropped else "")
        return summary

    summary = run_stage(out_dir, fingerprint(in_path, named(f"{name} config", fp_cfg)), body, name=f"filter/{name}")
    if tracker is not None:  # its seconds too: the report leaves counts/<stage>/* to the stage (logged_by_stages)
        tracker.log_metrics({f"filter/{name}/{k}": v for k, v in summary.items()})
    return summary


def _dedup_fn(fcfg, wl):
    def fn(df):
        from critics.contradiction import load_contradiction_scorer
        from i2d2.models import load_sentence_encoder

        enc = load_sentence_encoder(fcfg.encoder)
        emb = enc.encode(df["text"].tolist(), batch_size=int(fcfg.batch_size), normalize_embeddings=True,
                         show_progress_bar=len(df) > 256, convert_to_numpy=True)
        # opposites ("are larger." / "are smaller.") embed within the distance: the lexicon rule (whatever scorer
        # the contradiction filter uses, this one is offline and 0/1) keeps them apart for that filter to weigh
        scorer = load_contradiction_scorer("offline", scales=wl.scales, comparatives=wl.comparatives) \
            if fcfg.get("split_contradictions", False) else None  # a task file from before the key: off
        return F.dedup(df, emb, float(fcfg.distance_threshold), fcfg.linkage, scorer=scorer)
    return fn


def _groups_fn(fcfg):
    return lambda df: F.constraint_groups(df, list(fcfg["keys"]), require_satisfied=False)


def _contradiction_fn(fcfg, wl, device: str, trainer_cfg=None):
    def fn(df):
        from critics.contradiction import ComparativeDirectionScorer, load_contradiction_scorer

        # scorer: cross_encoder (trained by the framework on rule-built pairs, cached) | offline | an NLI model
        scorer = load_contradiction_scorer(fcfg.scorer, scales=wl.scales, comparatives=wl.comparatives,
                                           batch_size=int(fcfg.batch_size),
                                           label_indices=_plain(fcfg.get("label_indices")), device=device,
                                           cross_encoder=_plain(fcfg.get("cross_encoder")), trainer_cfg=trainer_cfg)
        # the offline scorer reads the continuation (the shared prompt's entity names could look like
        # comparatives, e.g. 'coolers'); classifiers read the whole statement
        col = "text" if isinstance(scorer, ComparativeDirectionScorer) else "statement"
        dropped = {}
        kept = F.contradiction_filter(df, scorer, float(fcfg.contradiction_threshold),
                                      float(fcfg.entailment_threshold), fcfg.k, text_col=col, dropped=dropped)
        return kept, dropped
    return fn


def critic_cfg(cfg) -> dict:
    """The shared critic's config with the task's overrides (comparative label map, epochs)."""
    base = _plain(cfg.critic) or {}
    over = _plain(cfg.task.filters.discriminator.get("critic")) or {}
    merged = {**base, **over}
    merged.pop("seed_annotations", None)
    merged["probes"] = over.get("probes", False)  # the invariance probes are generics; none for comparatives yet
    return merged


def critic_keys(cfg) -> dict:
    """The key each of the discriminator's critic settings that its errors name came from: the task's override
    (task.filters.discriminator.critic.<key>) where it sets one, else the shared critic.<key>."""
    over = _plain(cfg.task.filters.discriminator.get("critic")) or {}
    return {k: f"task.filters.discriminator.critic.{k}" if k in over else f"critic.{k}"
            for k in ("min_examples", "complete_only")}


def annotation_paths(cfg) -> list[Path]:
    paths = _plain(cfg.task.filters.discriminator.annotations)
    if isinstance(paths, str):  # one file: it was read one character a path ("annotations: t not found")
        paths = [paths]
    out = [SEED_ANNOTATIONS] if not paths else [Path(p).expanduser() for p in paths]
    for p in out:
        if not p.exists():
            raise FileNotFoundError(f"task.filters.discriminator.annotations: {p} not found")
    return out


def _recorded(critic: dict, cfg) -> dict:
    """The critic's summary as the run records it: its files relative to run_dir (read back with in_run)."""
    return {**critic, **{k: run_relative(critic[k], cfg.run_dir) for k in ("model_dir", "pr_curve", "score_histogram")
                         if critic.get(k)}}


def critic_fingerprint(cfg, ccfg: dict, paths: list[Path], perplexity_baseline: bool, lm_key: str | None) -> str:
    """The critic stage's inputs. The LM-perplexity baseline (ap_perplexity) is computed inside the stage: with it on,
    which LM it used is an input too; with it off nothing is added, so earlier runs keep their fingerprints. The split
    is one as well: pairs sharing an entity sit on one side (``critics.data.split_groups``), and a critic split by pair
    alone (its test pairs shared entities with training ones) is trained again, not reported as never having seen
    its test entities."""
    from critics.train import FIT_ARGS, fingerprint_view
    from i2d2.lightning_setup import fit_settings

    ppl = [named("baseline ranker", {"perplexity_baseline": lm_key or "generator"})] if perplexity_baseline else []
    return fingerprint(named("critic config", fingerprint_view(ccfg)), *paths,
                       named("trainer settings", fit_settings(cfg.trainer, FIT_ARGS)), *ppl,
                       named("split", "split-by-entity"))


def discriminator_stage(cfg, in_path: Path, critic_dir: Path, out_dir: Path, tracker=None, lm=None,
                        lm_key: str | None = None) -> dict:
    from critics.metrics import precision_at_top
    from critics.scoring import score_texts
    from critics.train import train_critic
    from i2d2.lightning_setup import resolve_device

    dcfg = cfg.task.filters.discriminator
    ccfg = critic_cfg(cfg)
    paths = annotation_paths(cfg)
    critic = run_stage(critic_dir, critic_fingerprint(cfg, ccfg, paths, lm is not None, lm_key),
                       # this task keeps fractions (cuts), never score > δ: δ's cut is not logged as if it were used
                       lambda d: _recorded(train_critic(ccfg, paths, d, cfg.trainer, tracker=tracker, lm=lm,
                                                          keys=critic_keys(cfg), delta_applied=False), cfg),
                       name="critic")
    critic_model = in_run(critic["model_dir"], cfg.run_dir)

    def body(d: Path):
        df = _df(in_path)
        t0 = time.time()
        scores = score_texts(critic_model, df["statement"].tolist(), batch_size=int(dcfg.batch_size),
                             device=resolve_device(cfg.trainer)) \
            if len(df) else np.zeros(0)
        cuts = F.discriminator_cuts(df, scores, _plain(dcfg.cuts))
        for name, part in cuts.items():
            _write_df(d / f"{name}.jsonl", part)
        return {"in": int(len(df)), **{name: int(len(part)) for name, part in cuts.items()},
                "out": int(min(len(p) for p in cuts.values())) if cuts else 0,
                "seconds": round(time.time() - t0, 2)}  # logged as filter/discriminator/seconds, like the others

    summary = run_stage(out_dir, fingerprint(in_path, critic_model, named("discriminator config", _plain(dcfg))), body,
                        name="filter/discriminator")
    # what each cut holds on the critic's test split (labelled comparatives of pairs it never trained on): the
    # cuts keep fractions, so their precision beside the test base rate says whether a smaller set is a better one
    test = read_jsonl(critic_dir / "test_scores.jsonl")
    y, s = np.asarray([r["y"] for r in test]), np.asarray([r["critic_score"] for r in test])
    cut_test = {}
    for name, frac in (_plain(dcfg.cuts).items() if len(test) else ()):
        prec, n_kept = precision_at_top(y, s, float(frac))
        # the yield beside the precision: the share of the test split's valid statements the cut keeps (a smaller
        # cut's precision alone hid how much of what is valid it throws away)
        recall = None if prec is None or not y.sum() else prec * n_kept / float(y.sum())
        cut_test[name] = {"precision": prec, "n_kept": n_kept, "recall": recall, "fraction": float(frac),
                          # a 95 % Wilson interval: what n_kept rows can show
                          "ci95": None if prec is None else list(wilson_interval(round(prec * n_kept), n_kept)),
                          "at_run_threshold": _at_run_threshold(y, s, out_dir / f"{name}.jsonl")}
    if tracker is not None:
        tracker.log_metrics({f"filter/discriminator/{k}": v for k, v in summary.items()})
        # each precision with the rows it is measured on and its recall: a precision alone does not say what it is worth
        tracker.log_metrics({f"critic/test_{k}_{name}": c[k] for name, c in cut_test.items()
                             if c["precision"] is not None for k in ("precision", "n_kept", "recall")})
        tracker.log_metrics({f"critic/test_at_run_threshold_{k}_{name}": c["at_run_threshold"][k]
                             for name, c in cut_test.items() if c["at_run_threshold"]
                             for k in ("precision", "n_kept", "recall") if c["at_run_threshold"][k] is not None})
    # which data each number comes from, as the critic records it (p_at_r picks its cut on the test rows it scores)
    sources = {**(critic.get("sources") or {}),
               # δ is the generics filter's cut: read beside the cuts, its precision looked like the discriminator's
               "delta (here)": "chosen on dev for critic.target_precision, never applied: this task keeps fractions "
                               "(cuts); precision / recall / n_kept_test are that unused cut's, on test (not "
                               "logged to the tracker)",
               "cuts_test": "test: each cut's fraction of the test statements, best scored first (the cut's share, "
                            "not the score it stops at on this run's statements); recall over the test's valid ones",
               "cuts_test.*.at_run_threshold": "test: the test statements scoring at least the lowest score the cut "
                                               "kept of this run's statements (a threshold set on unlabelled rows)"}
    return {**summary, "critic": {**{k: critic.get(k) for k in (
        "ap", "ap_perplexity", "delta", "precision", "recall", "p_at_r", "p_at_r_recall", "p_at_r_n_kept",
        "recall_cut", "recall_cut_precision",
        "recall_cut_recall", "recall_cut_n_kept", "n_train", "n_dev", "n_test",
        "n_test_concepts", "test_valid_rate", "surface_ap", "n_kept_test")},
        "cuts_test": cut_test, "sources": sources}}


def _at_run_threshold(y: np.ndarray, s: np.ndarray, cut_path: Path) -> dict | None:
    """What the cut in ``cut_path`` keeps of the labelled test rows at its own threshold: the lowest critic score it
    kept of this run's statements (no label chose it). The top-fraction figure ranks the test rows among themselves;
    this one is the kept set's rule applied to them. None where the cut kept nothing."""
    kept_scores = [r["critic_score"] for r in read_jsonl(cut_path)] if cut_path.exists() else []
    if not kept_scores:
        return None
    threshold = float(min(kept_scores))
    keep = s >= threshold
    n_kept, tp, n_valid = int(keep.sum()), float(y[keep].sum()), float(y.sum())
    return {"threshold": threshold, "n_kept": n_kept, "precision": tp / n_kept if n_kept else None,
            "recall": tp / n_valid if n_valid else None}


# ----------------------------------------------------------------------------- the iteration

def prompt_input_files(cfg) -> tuple[Path, Path | None]:
    """The files the prompts stage reads, for its fingerprint: the entity classes and a user corpus for the entity
    filter (None: wordfreq or no filter), '~' expanded as their readers expand it (a '~/' file was hashed as missing,
    so editing it did not redo the stage)."""
    ef = cfg.data.entity_filter
    classes = Path(str(cfg.data.classes)).expanduser() if cfg.data.classes else BUNDLED
    corpus = Path(str(ef.source)).expanduser() if ef.enabled and ef.source != "wordfreq" else None
    return classes, corpus


def _model_name(cfg, k: int) -> str:
    if k == 0:
        return cfg.model.name
    prev = iteration_model_dir(cfg.run_dir, k - 1)
    if not (prev / "config.json").exists():
        raise FileNotFoundError(f"iteration {k} needs the generator of iteration {k - 1} in {prev}; NeuroComparatives "
                                f"itself has no fine-tuning step, run iteration=0 (or put a model there)")
    return str(prev)


def run_iteration(cfg, k: int, tracker) -> dict:
    from i2d2.generation import generate_stage, read_generations, warn_if_older_decoder
    from i2d2.lightning_setup import resolve_device
    from i2d2.models import load_causal_lm

    it = Path(cfg.run_dir) / f"iter_{k}"
    it.mkdir(parents=True, exist_ok=True)
    write_text(it / "config.yaml", OmegaConf.to_yaml(cfg))
    task = cfg.task
    wl = load_wordlists(task.wordlists)
    name = _model_name(cfg, k)
    model_key = model_fingerprint(name)  # a model folder by its content, not its path: the run folder can move
    t0 = time.time()
    model, tok = load_causal_lm(name, cache=cfg.cache_dir, dtype=cfg.model.get("dtype"))
    model.to(resolve_device(cfg.trainer)).eval()
    log.info("loaded generator %s in %.1fs", name, time.time() - t0)
    timings = {}

    t0 = time.time()
    classes_path, corpus = prompt_input_files(cfg)
    fp = fingerprint(named("data config", _plain(cfg.data)), classes_path, Path(task.wordlists),
                     named("constraints config", _plain(task.constraints)), named("max_passes", task.max_passes),
                     named("model", model_key), named("seed", cfg.seed), named("uncountable nouns", UNCOUNTABLE),
                     corpus)
    prompts = run_stage(it / "prompts", fp, lambda d: build_prompts(cfg, model, tok, d, tracker), name="prompts")
    timings["prompts"] = time.time() - t0

    t0 = time.time()
    prompts_path = it / "prompts" / "prompts.jsonl"
    gen_fp = fingerprint(prompts_path, named("decoding config", _plain(cfg.decoding)), named("model", model_key),
                         named("shard_size", int(task.shard_size)))
    generation = run_stage(it / "generations", gen_fp,
                           lambda d: generate_stage(model, tok, prompts_path, d, _plain(cfg.decoding), tracker,
                                                    shard_size=int(task.shard_size)), name="generations")
    timings["generation"] = time.time() - t0
    warn_if_older_decoder(it / "generations")
    fdir = it / "filtered"
    gen_union = it / "generations" / "generations.jsonl"

    keys = list(task.filters.groups["keys"])

    def cand_body(d: Path):
        df = candidates(read_generations(it / "generations"), bool(task.first_sentence), bool(task.cut_at_clause),
                        wl.comparatives)
        if task.require_satisfied and len(df):
            # NeuroLogic output that missed a clause (or lost it to the first-sentence cut) is no comparative
            df = df.loc[F.satisfied_mask(df, keys)]
        _write_df(d / "kept.jsonl", df)
        return {"in": int(generation.get("n_generations", 0)), "out": int(len(df))}

    cand_fp = fingerprint(gen_union, named("first_sentence", bool(task.first_sentence)),
                          named("cut_at_clause", bool(task.cut_at_clause)),
                          named("require_satisfied", bool(task.require_satisfied)), named("group keys", keys),
                          named("comparatives word list", wl.comparatives),
                          named("format version", "coordinated-comparatives-v1"))
    counts = {"generated": {"in": int(prompts["n_prompts"]), "out": int(generation.get("n_generations", 0))},
              "candidates": run_stage(fdir / "candidates", cand_fp, cand_body, name="candidates")}
    cand_path = fdir / "candidates" / "kept.jsonl"

    fcfg = task.filters
    stage_fns = {"dedup": _dedup_fn(fcfg.dedup, wl), "groups": _groups_fn(fcfg.groups),
                 "contradiction": _contradiction_fn(fcfg.contradiction, wl, resolve_device(cfg.trainer),
                                                    cfg.get("trainer"))}
    prev = cand_path
    for s in FILTER_STAGES:
        t0 = time.time()
        counts[s] = _filter_stage(s, prev, fdir / s, _fingerprinted_cfg(s, _plain(fcfg[s])), stage_fns[s], tracker)
        timings[s] = time.time() - t0
        prev = fdir / s / "kept.jsonl"

    final = _df(prev)
    disc = None
    if fcfg.discriminator.enabled:
        t0 = time.time()
        lm = (model, tok) if fcfg.discriminator.perplexity_baseline else None
        disc = discriminator_stage(cfg, prev, it / "critic", fdir / "discriminator", tracker, lm, model_key)
        counts["discriminator"] = {k: v for k, v in disc.items() if k != "critic"}
        timings["discriminator"] = time.time() - t0
    write_json(fdir / "stage_counts.json", {"stages": [{"stage": k, **v} for k, v in counts.items()]})

    # ---- metrics: Self-BLEU per pair, relation entropy, per-stage and per-pass counts
    metrics = {"counts": counts}
    metrics["passes"] = pass_counts(prompts_path, gen_union,
                                    {"candidates": cand_path, **{s: fdir / s / "kept.jsonl" for s in FILTER_STAGES}},
                                    wl.passes())
    sets = {"nc": final}
    if disc is not None:
        sets = {cut: _df(fdir / "discriminator" / f"{cut}.jsonl") for cut in fcfg.discriminator.cuts}
    for set_name, df in sets.items():  # not ``name``: that is the generator, which the QA evaluation names below
        metrics[set_name] = corpus_metrics(df, wl.comparatives)
    metrics["timings_s"] = {k: round(v, 1) for k, v in timings.items()}
    # earlier invocations' seconds stay: a rerun that finds its stages finished takes ~0 s a stage (a name ending in
    # _s: a timing, which the fault tests' run comparison leaves out)
    old = it / "metrics.json"
    old = json.loads(old.read_text(encoding="utf-8")) if old.exists() else {}
    metrics["earlier_timings_s"] = old.get("earlier_timings_s", []) + ([old["timings_s"]] if "timings_s" in old else [])
    if disc is not None:
        metrics["critic"] = disc["critic"]
    qa_src = task.qa.source if disc is not None else "nc"  # (check_config: the source is one of the cuts)
    metrics["qa_source"] = qa_src
    write_json(it / "metrics.json", metrics)
    if tracker is not None:  # the sets' metrics reach the loggers with the report, as comparatives/<set>/*
        # W&B off: the report's tables beside report.md in iter_k/ (each stage's own tables are in its folder)
        tracker.log_table("comparatives/stage_counts", ["stage", "in", "out"],
                          [[s, c.get("in"), c.get("out")] for s, c in counts.items()], it)
        if metrics["passes"]:
            tracker.log_table("comparatives/passes", list(metrics["passes"][0]),
                              [list(r.values()) for r in metrics["passes"]], it)

    # ---- ComparativeQA export (App. E.2) from the chosen set
    log.info("ComparativeQA from %s (%d statements)", qa_src, len(sets[qa_src]))
    qa = export_qa(sets[qa_src].to_dict("records"), balance=bool(task.qa.balance), seed=int(cfg.seed))
    write_jsonl(it / "comparative_qa.jsonl", qa)
    if task.qa.evaluate.enabled:
        t0 = time.time()
        # the scoring model by its content: a folder retrained in place is a new input
        qa_model_key = model_fingerprint(task.qa.evaluate.model) if task.qa.evaluate.model else model_key
        metrics["comparative_qa"] = run_stage(
            # v2: runs before it recorded a statement set's name as the scoring model's
            it / "qa_eval", fingerprint(it / "comparative_qa.jsonl",
                                        named("qa.evaluate config", _plain(task.qa.evaluate)),
                                        named("qa model", qa_model_key), named("seed", cfg.seed),
                                        named("format version", "qa-eval-v2")),
            lambda d: qa_eval_stage(cfg, it / "comparative_qa.jsonl", d, (model, tok), name), name="qa_eval")
        metrics["timings_s"]["qa_eval"] = round(time.time() - t0, 1)
        write_json(it / "metrics.json", metrics)
        if tracker is not None:
            tracker.log_metrics(scalars(metrics["comparative_qa"], "qa"))
        if task.qa.benchmark:  # the same LM on the comparatives people judged true (§4.1), not on its own cut
            t0 = time.time()
            items = benchmark_items(cfg)
            metrics["comparative_qa_benchmark"] = run_stage(
                it / "qa_benchmark", fingerprint(named("benchmark items", items),
                                                 named("qa.evaluate config", _plain(task.qa.evaluate)),
                                                 named("qa model", qa_model_key), named("seed", cfg.seed),
                                                 named("format version", "qa-benchmark-v2")),
                lambda d: qa_benchmark_stage(cfg, items, d, (model, tok), name), name="qa_benchmark")
            metrics["timings_s"]["qa_benchmark"] = round(time.time() - t0, 1)
            write_json(it / "metrics.json", metrics)
            if tracker is not None:
                tracker.log_metrics(scalars(metrics["comparative_qa_benchmark"], "qa_benchmark"))
    del model

    # ---- samples + report
    cols = ["pair_id", "statement", "score"] + (["critic_score"] if "critic_score" in sets[qa_src] else [])
    if sets[qa_src].empty:
        samples = pd.DataFrame(columns=cols)
        log.warning("comparatives: no statement survived the filters (see %s)", fdir / "stage_counts.json")
    else:
        best = sets[qa_src].sort_values(["pair_id", "score"], ascending=[True, False])
        samples = best[cols].head(int(task.samples))
    if tracker is not None and len(samples):
        tracker.log_table("comparatives/samples", cols, samples.values.tolist(), it)
    # what the stages logged under their own names (filter/<stage>/*, critic/*, qa/*, qa_benchmark/*) is not logged
    # again under comparatives/
    publish_report(it, metrics, _report(k, prompts, counts, metrics, samples, qa[:5]), tracker, prefix="comparatives",
                   logged_by_stages=[*(f"counts/{s}" for s in (*FILTER_STAGES, "discriminator")), "critic",
                                     "comparative_qa", "comparative_qa_benchmark"])
    log.info("comparatives iteration %d: %s", k, {s: c.get("out") for s, c in counts.items()})
    return metrics


def qa_eval_stage(cfg, qa_path: Path, out_dir: Path, generator, generator_name: str) -> dict:
    """§4.3: accuracy of an LM on the exported ComparativeQA (task.qa.evaluate; model null = the generator)."""
    from i2d2.comparatives.qa_eval import QAEvalConfig, evaluate_qa
    from i2d2.lightning_setup import resolve_device
    from i2d2.models import load_causal_lm

    ecfg = _plain(cfg.task.qa.evaluate)
    name = ecfg.get("model") or generator_name
    if ecfg.get("model"):
        model, tok = load_causal_lm(name, cache=cfg.cache_dir)
        model.to(resolve_device(cfg.trainer)).eval()
    else:
        model, tok = generator
    qcfg = QAEvalConfig(**{k: v for k, v in ecfg.items() if k not in ("enabled", "model")}, seed=int(cfg.seed))
    metrics, rows = evaluate_qa(model, tok, read_jsonl(qa_path), qcfg, where=str(qa_path))
    write_jsonl(out_dir / "predictions.jsonl", rows)
    metrics["model"] = name
    metrics["model_is_generator"] = not ecfg.get("model")  # QA built from its own output: no independent test
    return metrics


def benchmark_items(cfg) -> list[dict]:
    """The ComparativeQA benchmark's items (§4.1): the comparatives judged true in the discriminator's annotations,
    read as the discriminator reads them (its label map, ``on_error``, ``min_agreement``), balanced by the run's seed."""
    from critics.data import load_annotations
    from i2d2.comparatives.qa import benchmark_qa

    ccfg, paths = critic_cfg(cfg), annotation_paths(cfg)
    rows = load_annotations(paths, ccfg.get("label_map"), ccfg.get("on_error", "raise"),
                            float(ccfg.get("min_agreement", 0.5)), quiet=True)  # the discriminator's stage logs them
    items = benchmark_qa(rows, balance=True, seed=int(cfg.seed))
    if not items:
        raise DataError(f"task.qa.benchmark: no comparative labelled valid in {', '.join(map(str, paths))} "
                        "(task.qa.benchmark=false to go without)")
    return items


def qa_benchmark_stage(cfg, items: list[dict], out_dir: Path, generator, generator_name: str) -> dict:
    """Scores ``benchmark_items`` (written to ``items.jsonl``) like the exported QA (``qa_eval_stage``)."""
    write_jsonl(out_dir / "items.jsonl", items)
    metrics = qa_eval_stage(cfg, out_dir / "items.jsonl", out_dir, generator, generator_name)
    metrics["labels"] = [p.name for p in annotation_paths(cfg)]
    return metrics


def pass_counts(prompts_path: Path, gen_path: Path, stage_files: dict[str, Path],
                passes: list[tuple[str, str]]) -> list[dict]:
    """Per pass (aux verb + adverb, §2.2.1): its prompts, generations, those meeting every clause ("satisfied"),
    and what each stage in ``stage_files`` keeps. A pass whose clauses the decoder cannot meet reads as zeros from
    "satisfied" on, where the stage totals would hide it (one whose adverb ranked outside the prune factor lost a
    fifth of a job's prompts). Each file is streamed once."""
    rows: dict[int, dict] = {}
    for r in read_jsonl(prompts_path, required=("pass",)):
        i = int(r["pass"])
        name = " ".join(passes[i]) if 0 <= i < len(passes) else f"{r['aux']} {r['adverb']}"
        row = rows.setdefault(i, {"pass": name, "prompts": 0, "generations": 0, "satisfied": 0,
                                  **{s: 0 for s in stage_files}})
        row["prompts"] += 1

    def each(path: Path):
        if path.exists():
            for r in stream_jsonl(path, required=("pass",)):
                if int(r["pass"]) in rows:
                    yield rows[int(r["pass"])], r

    for row, g in each(gen_path):
        row["generations"] += 1
        row["satisfied"] += int(bool(g.get("all_satisfied")))
    for stage, path in stage_files.items():
        for row, _ in each(path):
            row[stage] += 1
    return [rows[i] for i in sorted(rows)]


def _report(k, prompts, counts, metrics, samples, qa) -> str:
    lines = [f"# NeuroComparatives, iteration {k}", "",
             f"{prompts['n_classes']} classes / {prompts['n_entities']} entities, {prompts['n_pairs']} pairs, "
             f"{prompts['n_pairs_after_perplexity']} after the perplexity filter, {prompts['n_pairs_used']} used; "
             f"passes: {', '.join(prompts['passes'])}", "", "## Stage counts", "", "| stage | in | out |", "|---|---|---|"]
    lines += [f"| {s} | {c.get('in')} | {_stage_out(s, c)} |" for s, c in counts.items()]
    con = counts.get("contradiction") or {}
    if "contradicted" in con:  # the stage also keeps only the k best per pair: its in -> out is not all contradictions
        beyond = f" and {con['beyond_k']} beyond the k best (by S) per pair" if "beyond_k" in con else ""
        lines += ["", f"The contradiction stage dropped {con['contradicted']} statements that contradict more than half "
                      f"of their pair's others{beyond}."]
    by_pass = metrics.get("passes") or []
    if by_pass:
        stages = [c for c in by_pass[0] if c not in ("pass", "prompts")]
        lines += ["", "## Per pass", "", "| pass | prompts | " + " | ".join(stages) + " |",
                  "|---" * (len(stages) + 2) + "|"]
        lines += [f"| {r['pass']} | {r['prompts']} | " + " | ".join(str(r[c]) for c in stages) + " |" for r in by_pass]
    lines += ["", "## Metrics", "", "| set | n | pairs | Self-BLEU-2 | Self-BLEU-3 | relation entropy |",
              "|---|---|---|---|---|---|"]
    for name, m in metrics.items():
        if isinstance(m, dict) and "n_pairs" in m and m["n"]:  # the statement sets (nc / nc_xl / nc_l / nc_s)
            lines.append(f"| {name} | {m['n']} | {m['n_pairs']} | {fmt(m['self_bleu_2'])} | {fmt(m['self_bleu_3'])} "
                         f"| {fmt(m['relation_entropy'])} |")
    c = metrics.get("critic")
    if c:
        lines += _discriminator_lines(c)
    # the set they come from (the QA's source, nc_s by default: the critic's smallest cut), not every statement kept
    lines += ["", f"## Samples (from `{metrics.get('qa_source', '–')}`, by pair, best S first)", ""]
    lines += [f"- {r.statement} (S={r.score:.3f})" for r in samples.itertuples()]
    lines += ["", "## ComparativeQA", "", f"From `{metrics.get('qa_source', '–')}` ({len(qa)} items).", ""]
    lines += [f"- {q['text']}" for q in qa]
    e = metrics.get("comparative_qa")
    if e:
        who = f"{e['model']}" + (" (the generator, on QA from its own output)" if e["model_is_generator"] else "")
        lines += ["", f"Scored by {who}: accuracy {fmt(e['accuracy'])} on {e['n']} items "
                      f"(answers {e['answer_counts']}, constant-guess baseline {fmt(e['majority_baseline'])}, "
                      f"predicted A {fmt(e['predicted_A_share'])})"]
    b = metrics.get("comparative_qa_benchmark")
    if b:
        lo, hi = wilson_interval(round(b["accuracy"] * b["n"]), b["n"])
        guess = lo <= b["majority_baseline"] <= hi
        lines += ["", "### ComparativeQA benchmark (§4.1: the labelled comparatives people judged true)", "",
                  f"{b['model']} on {b['n']} items built from the true rows of {', '.join(b['labels'])}: accuracy "
                  f"**{fmt(b['accuracy'])}** (95 % interval {lo:.2f}–{hi:.2f}; constant-guess baseline "
                  f"{fmt(b['majority_baseline'])}, predicted A {fmt(b['predicted_A_share'])}; `qa_benchmark/`)"
                  + (": **not distinguishable from guessing**." if guess else ".")
                  + (" The bundled labels judge the packaged Gemma's own comparatives, so for that generator the "
                     "items are its own wording." if b["labels"] == [SEED_ANNOTATIONS.name] and b["model_is_generator"]
                     else "")]
    return "\n".join(lines) + "\n"


def _stage_out(stage: str, c: dict) -> str:
    """A stage's out for the report's stage counts. The discriminator's is its smallest cut, which alone read as the
    stage keeping that many of its statements: every cut is a kept set (NC-XL / L / S), each is named."""
    if stage != "discriminator":
        return str(c.get("out"))
    cuts = {k: v for k, v in c.items() if k not in ("in", "out", "seconds")}
    return f"{c.get('out')} (the smallest cut; " + ", ".join(f"{k} {v}" for k, v in cuts.items()) + ")" if cuts \
        else str(c.get("out"))


def _discriminator_lines(c: dict) -> list[str]:
    """The report's discriminator section: every number from the critic's test split (pairs it never trained on)."""
    from critics.surface import floor_warning, margin_text

    lines = ["", "## Discriminator (test split: labelled comparatives about entities the critic never trained on)", ""]
    below = floor_warning(c.get("ap"), c.get("surface_ap"), what="the discriminator")
    if below:
        lines += [f"> **Warning: {below}.** What the smaller cuts gain over keeping everything is their test "
                  "precision below, against the share valid.", ""]
    base, ap = c.get("test_valid_rate"), c.get("ap")
    if base is not None and ap is not None and ap <= base + 0.05:
        # AP of a random ranking is the base rate: NC-L / NC-S are then random subsets, smaller but no better
        lines += [f"> **Warning: the discriminator ranks at chance on test** (AP {fmt(ap)}, share valid "
                  f"{fmt(base)}): the smaller cuts are smaller sets, not more precise ones.", ""]
    lines += ["| measure | value |", "|---|---|",
              f"| labelled statements train / dev / test (test pairs) | {c.get('n_train')} / {c.get('n_dev')} / "
              f"{c.get('n_test')} ({fmt(c.get('n_test_concepts'))}) |",
              f"| share valid, test (the precision of keeping everything) | {fmt(c.get('test_valid_rate'))} |",
              f"| discriminator AP, test | {fmt(c.get('ap'))} |",
              f"| surface-only floor AP, test (must beat it by ≥ {margin_text(c.get('surface_ap'))}) | {fmt(c.get('surface_ap'))} |",
              ] + ([f"| LM-perplexity AP, test | {fmt(c['ap_perplexity'])} |"] if c.get("ap_perplexity") is not None
                   else [])
    # a cut keeps a fraction of this run's statements; on test it is that fraction of the test statements
    lines += [f"| precision of the {name} cut on test{_fraction_text(v)} (kept; recall; 95 % interval) | "
              f"{fmt(v['precision'])} ({v['n_kept']}; recall {fmt(v.get('recall'))}"
              + ("" if not v.get("ci95") else "; {:.2f}–{:.2f}".format(*v["ci95"])) + ") |"
              for name, v in (c.get("cuts_test") or {}).items()]
    # the same cuts by the score each stops at on this run's statements: the kept set's own rule on the test rows
    lines += [f"| precision on test at the {name} cut's threshold on this run's statements (score ≥ "
              f"{fmt(t['threshold'])}; kept; recall) | {fmt(t['precision'])} ({t['n_kept']}; "
              f"recall {fmt(t['recall'])}) |"
              for name, v in (c.get("cuts_test") or {}).items() if (t := v.get("at_run_threshold"))]
    return lines


def _fraction_text(cut: dict) -> str:
    """', its best-scored 50 % of them' for a cut that records its fraction (runs from before it did: nothing)."""
    frac = cut.get("fraction")
    return "" if frac is None else f", its best-scored {100 * frac:g} % of them"


def run(cfg) -> dict:
    from i2d2.tracking import tracked_run

    # no folder for tables without one: each table names its stage's (at the top of run_dir none was recorded)
    with tracked_run(cfg, None) as tracker:
        return {k: run_iteration(cfg, k, tracker)
                for k in range(int(cfg.iteration), int(cfg.iteration) + int(cfg.num_iterations))}
