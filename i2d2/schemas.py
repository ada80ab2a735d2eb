"""Typed configs: the one place where the defaults of decoding, the critic, LM fine-tuning and NegVerse generation
live (Hydra structured configs).

Each dataclass is stored in Hydra's ConfigStore (``register``, called when ``i2d2.config`` is imported) and is
the first entry of its YAML files' defaults list (``conf/critic/minilm.yaml``: ``defaults: [/schema_critic, _self_]``),
so a composed config has every key with its type, and a misspelt key or a wrong type fails at start-up naming
the key. The Python entry points that take plain dicts (tests, notebooks) fill and check them through
``fill``, against the same dataclass. A field's comment is its documentation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Dict, List, Optional

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException


def is_count(v) -> bool:
    """An integer >= 1 (a batch size): a null or a string fails here with the key named, not in ``int()``."""
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def _sentence_ends() -> list[str]:
    return [".", "!", "?", "\n"]


PERPLEXITY_UNITS = ("word", "token")  # what a perplexity is normalised by (i2d2.perplexity per=)

@dataclass
class DecodingConfig:
    """NeuroLogic decoding (I2D2 A.1.4 values). ``num_return`` may exceed ``beam_size``: hypotheses ended by
    EOS / a stop string are pooled from every step, and at ``max_new_tokens`` up to ``max(beam_size,
    num_return)`` of the last step's candidates are kept, so fewer than ``num_return`` come back only when fewer
    distinct valid candidates exist."""

    beam_size: int = 10
    num_return: int = 10
    max_new_tokens: int = 30
    min_new_tokens: int = 2
    length_penalty: float = 0.1
    no_repeat_ngram_size: int = 0
    prune_factor: int = 50
    sat_tolerance: int = 2
    beta: float = 0.0  # reward for in-progress constraints (NeuroComparatives: 1.25)
    block_eos_until_satisfied: bool = True
    early_stopping: bool = True
    batch_size: int = 8
    candidates_per_beam: Optional[int] = None  # top tokens per hypothesis (None: 2 * beam_size)
    lookahead: Optional[int] = None  # lookahead tokens per hypothesis (None: beam_size)
    # A hypothesis also ends after a token whose text contains one of these (e.g. "." so that a generic or a
    # comparative is one sentence); it is subject to min_new_tokens and EOS blocking like EOS itself.
    stop_strings: Optional[List[str]] = None

    def __post_init__(self):
        for k in ("beam_size", "num_return", "max_new_tokens", "batch_size", "prune_factor"):
            if int(getattr(self, k)) < 1:
                raise ValueError(f"{k}: must be an integer >= 1, got {getattr(self, k)!r}")
        for k in ("min_new_tokens", "sat_tolerance", "no_repeat_ngram_size"):  # each named alone (callers prefix
            # "decoding."): one message named all three, whichever was wrong
            if int(getattr(self, k)) < 0:
                raise ValueError(f"{k}: must be an integer >= 0, got {getattr(self, k)!r}")
        # 0 was read as null (the decoder's `or` took the default), -1 failed in the decoder's topk mid-generation
        for k, default in (("candidates_per_beam", "2 * beam_size"), ("lookahead", "beam_size")):
            v = getattr(self, k)
            if v is not None and not is_count(v):
                raise ValueError(f"{k}: must be null (the default: {default}) or an integer >= 1, got {v!r}")


@dataclass
class LoraConfig:
    enabled: bool = False  # peft LoRA instead of full fine-tuning; adapters are merged into the saved model
    r: int = 8
    alpha: int = 16
    dropout: float = 0.05
    target_modules: Optional[Any] = None  # None: peft's default for the architecture; or [q_proj, v_proj] / all-linear
    bias: str = "none"


@dataclass
class ProbeContextConfig:
    """Few-shot context for the probe critic (critics/probe.py ``context_features``): ``examples`` labelled
    statements of the TRAIN split (half true, the rest drawn in turn from the ``not_true`` labels; at most
    ``max_words`` words, one per concept, drawn with ``seed``) are written after ``instruction`` as
    "Statement: ...\nJudgement: true|false" and put before every statement the probe reads, as
    "Statement: <s>\nJudgement:". The probe then reads the statement's states and the state at "Judgement:".
    Grouped 5-fold CV on train + dev: AP 0.716 vs 0.697 without context (README: "Which critic")."""

    examples: int = 0  # 0: no context (the plain probe)
    # labels the not-true half is drawn from, in turn; empty: every label the label map makes invalid, by name
    not_true: List[str] = field(default_factory=list)
    seed: int = 0
    max_words: int = 14
    instruction: str = ("Each statement is judged true when it is a complete, generally true fact about a kind of "
                        "thing or about how to reach a goal, and false when it is false, vague or empty, about one "
                        "particular situation, or advertising.\n\n")

    def __post_init__(self):
        if not (isinstance(self.examples, int) and self.examples >= 0) or self.examples == 1:
            raise ValueError(f"critic.probe_context.examples: must be 0 (no context) or an integer >= 2 (half true, "
                             f"half not), got {self.examples!r}")
        if not is_count(self.max_words):
            raise ValueError(f"critic.probe_context.max_words: must be an integer >= 1, got {self.max_words!r}")


@dataclass
class CriticConfig:
    """The I2D2 critic (§2.3): a valid/invalid classifier trained on labelled generations (critics/train.py)."""

    kind: str = "finetune"  # finetune: a sequence classifier trained end to end | probe: a linear probe on LM states
    name: str = "packaged:minilm"  # the classifier body (finetune); users with a hub: roberta-large, ...
    # labelled Gemma 3 270M generations (GUIDE.md): bundled names (i2d2/data/annotations/) or paths
    seed_annotations: List[str] = field(default_factory=lambda: ["generics_gemma.jsonl"])
    # probe: the LM whose hidden states are probed, the layer, and the inverse regularisation strengths tried on dev
    probe_lm: str = "packaged:gemma3-270m"
    probe_layer: int = 12
    probe_C: List[float] = field(default_factory=lambda: [0.001, 0.003, 0.01, 0.03, 0.1])
    probe_context: ProbeContextConfig = field(default_factory=ProbeContextConfig)  # few-shot context (probe only)
    # finetune: peft LoRA adapters on the body instead of training every weight (the head trains in full); merged
    # into the saved classifier. For large bodies (a 7B LM with a hub); on Gemma 3 270M: README "Which critic"
    lora: LoraConfig = field(default_factory=LoraConfig)
    lr: float = 1.0e-4
    weight_decay: float = 0.01
    warmup_ratio: float = 0.1
    dropout: Optional[float] = None  # None: the body's own dropout
    batch_size: int = 16
    eval_batch_size: int = 64
    max_epochs: int = 12
    patience: int = 4  # early stopping on `monitor` (epochs without improvement; 0 = off)
    monitor: str = "val/p_at_r"  # precision at target_recall on dev (NeuroComparatives); or val/ap
    complete_only: bool = True  # leave out statements that do not end a sentence: the loop's filter drops them first
    canonicalize: bool = True  # drop a leading Generally/Typically/Usually before the critic reads (GUIDE.md)
    probes: bool = True  # score i2d2/data/annotations/probes.jsonl after training (rewrite shift, probe AP)
    probe_warn_shift: float = 0.1  # warn loudly when rewrites move the score by more than this on average
    max_length: int = 64
    dev_fraction: float = 0.15  # concepts for early stopping, the checkpoint and δ (splits grouped by concept)
    test_fraction: float = 0.2  # concepts for every reported number; never used to choose anything
    seed: int = 0
    target_recall: float = 0.8
    target_precision: float = 0.9  # δ = lowest threshold whose kept dev set reaches this precision
    delta: Optional[float] = None  # a number sets δ directly instead
    on_error: str = "raise"  # unknown labels / broken rows: raise (file:line) or skip and report
    min_agreement: float = 0.5  # majority vote: the top label needs more than this share of the votes
    min_examples: int = 20
    keep_checkpoints: bool = False
    ckpt_every_n_steps: int = 50  # last.ckpt cadence: a killed training resumes from it

    def __post_init__(self):
        if self.kind not in ("finetune", "probe"):
            raise ValueError(f"critic.kind: must be finetune or probe, got {self.kind!r}")
        for k in ("target_precision", "target_recall"):
            if not 0.0 < float(getattr(self, k)) <= 1.0:
                raise ValueError(f"critic.{k}: must be in (0, 1], got {getattr(self, k)!r}")
        if self.delta is not None and not 0.0 <= float(self.delta) < 1.0:
            raise ValueError(f"critic.delta: must be null (chosen on dev) or in [0, 1), got {self.delta!r}")
        for k in ("dev_fraction", "test_fraction"):
            if not 0.0 < float(getattr(self, k)) < 1.0:
                raise ValueError(f"critic.{k}: must be in (0, 1), got {getattr(self, k)!r}")
        if self.dev_fraction + self.test_fraction >= 1.0:
            raise ValueError("critic.dev_fraction + critic.test_fraction: must leave concepts to train on (< 1)")
        if self.on_error not in ("raise", "skip"):
            raise ValueError(f"critic.on_error: must be raise or skip, got {self.on_error!r}")
        from i2d2.labels import label_mapping, normalize_label

        if self.label_map is not None and not isinstance(self.label_map, Mapping):
            raise ValueError(f"critic.label_map: must be a map of label -> 1 / 0 / null, got {self.label_map!r}")
        try:  # at start-up, not when the labels are first read
            mapping = label_mapping(self.label_map)
        except ValueError as e:
            raise ValueError(f"critic.{e}") from None
        pc = ProbeContextConfig(**self.probe_context) if isinstance(self.probe_context, dict) else self.probe_context
        if pc.examples:  # at start-up, not after the run has generated: the labels its examples are drawn from
            for lab in pc.not_true:
                if mapping.get(normalize_label(lab)) != 0:
                    raise ValueError(f"critic.probe_context.not_true: {lab!r} is not a label the label map makes "
                                     f"invalid (those: {sorted(k for k, v in mapping.items() if v == 0)})")
        if not self.probe_C or any(float(c) <= 0 for c in self.probe_C):
            raise ValueError(f"critic.probe_C: must be a non-empty list of numbers > 0, got {self.probe_C!r}")
        if not 0.0 <= float(self.min_agreement) < 1.0:
            raise ValueError(f"critic.min_agreement: must be in [0, 1), got {self.min_agreement!r}")
        # each reached its fit only after generation: a negative lr trained the critic uphill, a dropout above 1
        # failed building the body
        if not float(self.lr) > 0:
            raise ValueError(f"critic.lr: must be > 0, got {self.lr!r}")
        for k in ("weight_decay", "patience"):
            if float(getattr(self, k)) < 0:
                raise ValueError(f"critic.{k}: must be >= 0, got {getattr(self, k)!r}")
        for k in ("warmup_ratio", "dropout"):
            v = getattr(self, k)
            if v is not None and not 0.0 <= float(v) < 1.0:
                raise ValueError(f"critic.{k}: must be in [0, 1), got {v!r}")
        for k in ("batch_size", "eval_batch_size", "perplexity_batch_size", "max_length", "max_epochs", "min_examples"):
            if not is_count(getattr(self, k)):
                raise ValueError(f"critic.{k}: must be an integer >= 1, got {getattr(self, k)!r}")
        # both failed only mid-run, the first after the stage had removed its finished output: monitored with
        # mode=max, so only the dev metrics that rise as the critic improves
        if self.monitor not in ("val/p_at_r", "val/ap"):
            raise ValueError(f"critic.monitor: must be val/p_at_r or val/ap, got {self.monitor!r}")
        if self.perplexity_per not in PERPLEXITY_UNITS:
            raise ValueError(f"critic.perplexity_per: must be {' or '.join(PERPLEXITY_UNITS)}, got {self.perplexity_per!r}")
    perplexity_batch_size: int = 16
    perplexity_per: str = "word"  # the baseline ranker's perplexity unit (word | token)
    # raw label (normalised: lower case, punctuation -> _) -> 1 valid, 0 invalid, None dropped, over
    # i2d2.labels.DEFAULT_LABEL_MAP (both papers' schemes and GUIDE.md's finer kinds): name only what changes.
    # Typed Any: OmegaConf cannot merge a command-line map into a None typed as Dict
    # (``++critic.label_map.dont_know=0`` or ``critic.label_map={dont_know: 0}``)
    label_map: Optional[Any] = None


@dataclass
class CrossEncoderConfig:
    """NeuroComparatives' contradiction cross-encoder (critics/contradiction.py), trained on rule pairs."""

    name: str = "packaged:minilm"
    # None: {cache_dir, else $I2D2_CACHE or ~/.cache/i2d2}/contradiction/<fingerprint> (a killed fit resumes there)
    dir: Optional[str] = None
    # jsonl files with a 'statement' field to build rule pairs from; None: the bundled Gemma comparatives
    statements: Optional[List[str]] = None
    lr: float = 3e-5
    weight_decay: float = 0.01
    batch_size: int = 16
    max_length: int = 64
    max_epochs: int = 1
    max_steps: int = -1
    val_fraction: float = 0.1
    seed: int = 0

    def __post_init__(self):
        key = "task.filters.contradiction.cross_encoder"  # named where conf/task/comparatives.yaml places this schema
        for name in ("batch_size", "max_length", "max_epochs"):
            if not is_count(getattr(self, name)):
                raise ValueError(f"{key}.{name}: must be an integer >= 1, got {getattr(self, name)!r}")
        if not (self.max_steps == -1 or is_count(self.max_steps)):
            raise ValueError(f"{key}.max_steps: must be -1 (no cap) or an integer >= 1, got {self.max_steps!r}")
        if not self.lr > 0:
            raise ValueError(f"{key}.lr: must be > 0, got {self.lr!r}")
        if not self.weight_decay >= 0:
            raise ValueError(f"{key}.weight_decay: must be >= 0, got {self.weight_decay!r}")
        if not 0 < self.val_fraction < 1:  # 2 failed in scikit-learn's split, after the contradiction stage began
            raise ValueError(f"{key}.val_fraction: must be in (0, 1), got {self.val_fraction!r}")
        # the statements files exist only where the cross-encoder is the chosen scorer: checked by the comparatives
        # recipe's check_config (a missing file under another scorer is never read)


@dataclass
class FinetuneConfig:
    """Self-imitation fine-tuning: P_{k+1} = argmax E log P_k(y | x) over the kept (prompt x, generation y)."""

    # measured: with 5e-5, person-judged held-out accuracy went 0.44 -> 0.69 -> 0.41 (the second step undid the
    # first); with 1e-5, 0.44 -> 0.67 -> 0.66 (README: "What the numbers mean")
    lr: float = 1.0e-5
    epochs: int = 1
    max_steps: int = -1  # > 0 caps the optimizer steps
    batch_size: int = 8
    accumulate_grad_batches: int = 1
    max_length: int = 64  # tokens of prompt + generation
    weight_decay: float = 0.0
    warmup_ratio: float = 0.1
    ckpt_every_n_steps: int = 10  # last.ckpt cadence; a killed fine-tuning resumes from it
    keep_checkpoints: bool = False  # keep finetune/checkpoints once model/ is saved (optimizer state: ~4x the model)
    gradient_checkpointing: bool = False
    lora: LoraConfig = field(default_factory=LoraConfig)


class OptionError(ValueError):
    """A value a schema refuses, with the field it concerns (``key``: ``top_p``; a nested one as its path), so that a
    caller can say where that value came from (``i2d2.negate``: the command-line flag) without reading the message."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


@dataclass
class NegverseGenerate:
    num_candidates: int = 2  # sampled continuations per masked variant (raise on a GPU)
    batch_size: int = 16
    max_new_tokens: int = 32
    do_sample: bool = True
    top_p: float = 0.9
    temperature: float = 0.8

    def __post_init__(self):
        for k in ("num_candidates", "batch_size", "max_new_tokens"):
            if int(getattr(self, k)) < 1:
                raise OptionError(k, f"generate.{k}: must be an integer >= 1, got {getattr(self, k)!r}")
        if self.do_sample and not 0 < self.top_p <= 1:  # (both unused by greedy decoding)
            raise OptionError("top_p", f"generate.top_p: must be in (0, 1], got {self.top_p!r}")
        if self.do_sample and self.temperature <= 0:
            raise OptionError("temperature", f"generate.temperature: must be > 0, got {self.temperature!r}")


@dataclass
class NegverseMasking:
    rules: List[str] = field(default_factory=lambda: ["verb", "subj_obj", "adv", "adj", "prep", "det"])
    max_blanks: int = 2
    max_variants: int = 6  # masked versions per sentence at generation, incl. the whole sentence (paper: 6)
    min_two_blank: int = 1  # of those, kept for two-blank variants where the parse offers two disjoint spans

    def __post_init__(self):
        from i2d2.negverse.masking import RULES

        unknown = sorted(set(self.rules) - set(RULES))
        if unknown or not self.rules:
            raise OptionError("rules", f"masking.rules: unknown or no rule(s) {unknown}; known: {list(RULES)}")
        for k, least in (("max_blanks", 1), ("max_variants", 1), ("min_two_blank", 0)):
            if getattr(self, k) < least:
                raise OptionError(k, f"masking.{k}: must be >= {least}, got {getattr(self, k)!r}")


@dataclass
class NegverseFilters:
    max_distance: float = 0.5  # keep normalised Levenshtein distance < this
    max_len_ratio: float = 2.0
    require_cue: bool = True
    grammar: bool = True  # drop candidates whose negation cue the parse puts where English does not (filters.py)

    def __post_init__(self):
        if not self.max_distance > 0:  # a distance above 1 keeps every length
            raise OptionError("max_distance", f"filters.max_distance: must be > 0, got {self.max_distance!r}")
        if self.max_len_ratio < 1:
            raise OptionError("max_len_ratio", f"filters.max_len_ratio: must be >= 1, got {self.max_len_ratio!r}")


@dataclass
class NegverseTrainMasking(NegverseMasking):
    train_max_variants: int = 4  # masked versions per training pair

    def __post_init__(self):
        super().__post_init__()
        if self.train_max_variants < 1:
            raise OptionError("train_max_variants",
                              f"masking.train_max_variants: must be >= 1, got {self.train_max_variants!r}")


@dataclass
class NegationOptions(NegverseGenerate, NegverseMasking, NegverseFilters):
    """Everything ``i2d2.negverse.pipeline.negate`` takes: the recipe's generate / masking / filters sections."""

    seed: int = 0

    def __post_init__(self):
        for base in (NegverseGenerate, NegverseMasking, NegverseFilters):
            base.__post_init__(self)


# (name, node): root configs, in no config group, so that Hydra's --help, which lists every group, does not offer
# them beside task, model, ... as if a user picked them. ``conf/decoding/*.yaml`` and ``conf/critic/minilm.yaml`` list
# ``/schema_<group>`` first in their defaults (at the file's own package); a task file places the others at the
# section they type (``- /schema_finetune@task.finetune``)
SCHEMAS = [
    ("schema_decoding", DecodingConfig),
    ("schema_critic", CriticConfig),
    ("schema_finetune", FinetuneConfig),
    ("schema_cross_encoder", CrossEncoderConfig),
    ("schema_negverse_generate", NegverseGenerate),
    ("schema_negverse_masking", NegverseTrainMasking),
    ("schema_negverse_filters", NegverseFilters),
]


def register() -> None:
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    for name, node in SCHEMAS:
        cs.store(name=name, node=node)


def fill(schema: type, cfg: Any = None, where: str | None = None, none_means_default: bool = True) -> dict:
    """``cfg`` (a dict or config node, possibly partial) checked against ``schema`` and completed with its
    defaults, as a plain dict. An unknown key or a value of the wrong type is a ValueError naming the key and
    the known keys. With ``none_means_default``, a None given for a field whose default is not None takes the
    default (a YAML ``null`` that means "unset")."""
    where = where or schema.__name__
    given = OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else dict(cfg or {})
    given.pop("_target_", None)
    known = sorted(f.name for f in fields(schema))
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; known: {known}")
    base = OmegaConf.structured(schema)
    if none_means_default:
        given = {k: v for k, v in given.items() if not (v is None and base[k] is not None)}
    try:
        merged = OmegaConf.merge(base, given)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None)  # a nested key's path: critic.lora.rank
        message = f"{where}.{key}" if key else where
        message = f"{message}: {e.msg if hasattr(e, 'msg') else e}".split("\n")[0]
        raise (OptionError(key, message) if key else ValueError(message)) from None
    out = OmegaConf.to_container(merged, resolve=True)
    if hasattr(schema, "__post_init__"):  # range checks (OmegaConf checks types only)
        schema(**out)
    return out


def defaults(schema: type) -> dict:
    """The schema's defaults as a plain dict."""
    return OmegaConf.to_container(OmegaConf.structured(schema), resolve=True)
