"""I2D2 prompt construction (i2d2.txt §2.1, Table 1, A.1.2, A.1.4).

For every (noun concept, relational phrase) pair all variants of the Table 1 template

    [Generally|Typically|Usually]? [a|an|the]? <noun_phrase> <relational_phrase>

are built, with the noun inflected (``inflect``) to agree with the phrase's verb (``is/has/produces`` take a
singular subject, ``are/have/produce`` a plural one, modal verbs either; ``a/an`` only before a singular
noun). All variants are scored by LM per-word perplexity in batches and the lowest one is kept; kept prompts
above the threshold (250 in the paper) are dropped. Goals get the four prefixes ("In order to", "Before you",
"After you", "While you"), one prompt each, subject to the same threshold.

Each prompt carries its NeuroLogic constraints (A.1.4): ``count(function_words) <= 1``,
``count(connectives) = 0``, ``¬source_concept``, ``¬relational_phrase``, and a positive clause for the
related concept when the prompt has one. Word lists come from the data config (conf/data/generics.yaml).
"""

from __future__ import annotations

import logging
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from i2d2.concepts import Concept, load_concepts, load_phrases, resolve_path, validate_concept
from i2d2.io import DataError, atomic_path, fingerprint, write_json, write_text
from i2d2.progress import LoggedBar

log = logging.getLogger(__name__)

PROMPT_FIELDS = ["prompt_id", "prompt", "constraints", "concept", "kind", "template", "surface", "relation", "related",
                 "perplexity", "adverb", "article", "number", "form", "source"]

# The surface forms of a noun prompt. "adverb+" before a form is the same with a leading Generally/Typically/...
#   bare_plural "Bicycles can" | indefinite "A bicycle can" | definite "The bicycle can" | bare_singular "Chess is"
BASE_FORMS = ("bare_plural", "indefinite", "definite", "bare_singular")
PROMPT_FORMS = BASE_FORMS + tuple(f"adverb+{f}" for f in BASE_FORMS)
SELECTIONS = ("forms", "perplexity")


def _get(cfg, key, default=None):
    v = cfg.get(key, default) if cfg is not None else default
    return default if v is None else v


@dataclass
class Variant:
    text: str
    concept: Concept
    relation: str          # relational phrase (nouns) or goal prefix (goals)
    template: str          # the prompt with the concept replaced by {concept} / {goal}
    surface: str           # the concept as it appears in the prompt
    adverb: str | None = None
    article: str | None = None
    number: str | None = None   # sg | pl | None (goals)

    @property
    def form(self) -> str:
        """One of PROMPT_FORMS for a noun prompt, ``goal`` for a goal prompt."""
        if self.number is None:
            return "goal"
        if self.article in ("a", "an"):
            base = "indefinite"
        elif self.article == "the":
            base = "definite"
        else:
            base = "bare_plural" if self.number == "pl" else "bare_singular"
        return f"adverb+{base}" if self.adverb else base


# ----------------------------------------------------------------------------- inflection

def _engine():
    import inflect

    return inflect.engine()


def noun_forms(concept: Concept, engine=None) -> tuple[str, str]:
    """(singular, plural) of a noun phrase; ``concept.plural`` overrides inflect's guess of the given number."""
    from dataclasses import replace

    from i2d2.comparatives.entities import split_of

    p = engine or _engine()
    text = concept.text
    head, tail = split_of(text)
    if tail:  # "cup of tea": the head carries the number ("cups of tea"); inflect reads the whole as invariant
        sing, plur = noun_forms(replace(concept, text=head), p)
        return sing + tail, plur + tail
    if concept.plural is True:
        return (p.singular_noun(text) or text), text
    if concept.plural is False:
        return text, p.plural_noun(text)
    sing = p.singular_noun(text)
    if sing and sing == text:  # invariant: sheep, news, scissors
        return text, text
    last = text.split()[-1].lower()
    # inflect un-pluralises too eagerly (bus -> bu, glass -> glas): trust it only when it round-trips.
    if sing and p.plural_noun(sing) == text and not last.endswith(("ss", "us", "is")):
        return sing, text
    return text, p.plural_noun(text)


def phrase_number(phrase: str, modal_verbs=(), engine=None) -> str:
    """'sg' if the phrase's verb needs a singular subject (is, has, produces), 'pl' for a plural one
    (are, have, produce), 'any' for modal verbs (can, may, should ...)."""
    p = engine or _engine()
    first = phrase.split()[0].lower()
    if first in {m.lower() for m in modal_verbs}:
        return "any"
    return "sg" if p.plural_verb(first) != first else "pl"


def _cap(s: str) -> str:
    return s[:1].upper() + s[1:]


def noun_kind(concept: Concept, forms: tuple[str, str]) -> str:
    """``mass`` for a mass noun (the uncountable-noun lexicon: "honey", "rice", "homework": singular verb, no a/an,
    no plural), ``plural_only`` for a noun with no singular in use (the plural-only lexicon: "jeans", "glasses",
    "pliers"; or any invariant noun in -s such as "scissors": plural verb, no a/an), else ``count`` (invariant zero
    plurals such as "sheep" and "fish" are count nouns: "a sheep can", "sheep can"). ``forms``: its (singular,
    plural), ``noun_forms``."""
    from i2d2.comparatives.entities import is_mass_noun, is_plural_only, split_of

    if concept.plural is not None:  # the concept file says which number it is given in
        return "count"
    if is_mass_noun(concept.text):
        return "mass"
    singular, plural = forms
    head = split_of(concept.text)[0]  # "sheep of the hills" is invariant by "sheep", not by its last "s"
    if is_plural_only(concept.text) or (singular == plural and head.lower().endswith("s")):
        return "plural_only"
    return "count"


def noun_variants(concept: Concept, relation: str, cfg_data, engine=None) -> list[Variant]:
    """All Table 1 variants of (concept, relation) that agree in number; de-duplicated by text. A mass noun
    takes only singular phrases and no a/an ("Generally, honey is": its bare form is ``bare_singular``); a
    plural-only noun only plural phrases ("Generally, scissors can", never "a scissors")."""
    p = engine or _engine()
    singular, plural = noun_forms(concept, p)
    kind = noun_kind(concept, (singular, plural))
    number = phrase_number(relation, _get(cfg_data, "modal_verbs", []), p)
    articles = [a.lower() for a in _get(cfg_data, "articles", ["a", "an", "the"])]
    sep = _get(cfg_data, "adverb_separator", ", ")
    forms: list[tuple[str, str, str | None]] = []
    if number in ("sg", "any") and kind != "plural_only":
        indef = p.a(singular).split()[0].lower()
        sg_articles = [a for a in (indef, "the") if a in articles and (kind == "count" or a == "the")]
        forms += [(singular, "sg", a) for a in [None, *sg_articles]]
    if number in ("pl", "any") and kind != "mass":
        forms += [(plural, "pl", a) for a in [None, *(["the"] if "the" in articles else [])]]
    out, seen = [], {}
    for adverb in [None, *_get(cfg_data, "adverbs", [])]:
        for noun, num, article in forms:
            body = " ".join(x for x in (article, "{concept}", relation) if x)
            template = f"{adverb}{sep}{body}" if adverb else _cap(body)  # "{concept} is" stays as is
            text = _cap(template.replace("{concept}", noun))
            v = Variant(text, concept, relation, template, noun, adverb, article, num)
            if text in seen:
                # an invariant noun before a modal ("Sheep can", "Scissors can") is also the bare plural: keep
                # that reading, or the forms selection skips it for "A scissors can"
                if num == "pl" and out[seen[text]].number == "sg":
                    out[seen[text]] = v
                continue
            seen[text] = len(out)
            out.append(v)
    return out


def goal_variants(concept: Concept, cfg_data) -> list[Variant]:
    """One prompt per goal prefix ("In order to get better at chess,")."""
    suffix = _get(cfg_data, "goal_suffix", "")
    out = []
    for prefix in _get(cfg_data, "goal_prefixes", ["In order to", "Before you", "After you", "While you"]):
        template = f"{prefix} {{goal}}{suffix}"
        out.append(Variant(template.replace("{goal}", concept.text), concept, prefix, template, concept.text))
    return out


# ----------------------------------------------------------------------------- constraints

def build_constraints(variant: Variant, related: str | None, cfg_constraints, engine=None) -> dict:
    """The A.1.4 constraints of one prompt as ``ConstraintSet.to_dict()``."""
    from i2d2.decoding import Clause, ConstraintSet, CountConstraint, Literal
    from i2d2.decoding.constraints import occurs_in, phrase_words

    c = cfg_constraints
    p = engine or _engine()
    clauses = []
    if _get(c, "forbid_concept", True):
        if variant.concept.kind == "noun":
            forms = [variant.surface, *noun_forms(variant.concept, p)]
        else:
            forms = [variant.concept.text]
        for form in _unique_lower(forms):
            clauses.append(Clause([Literal(form, positive=False)], name=f"no_concept:{form}"))
    if _get(c, "forbid_relation", True):
        rel = variant.relation.lower()
        clauses.append(Clause([Literal(rel, positive=False)], name=f"no_relation:{rel}"))
    counts = [
        CountConstraint(_words(c, "function_words"), int(_get(c, "max_function_words", 1)), name="function_words"),
        CountConstraint(_words(c, "connectives"), 0, name="connectives"),
    ]
    counts = [k for k in counts if k.words]
    if related and _get(c, "require_related", True):
        sing, plur = noun_forms(Concept(related), p)
        forms = _unique_lower([related, plur]) if sing.lower() == related.lower() else _unique_lower([related, sing])
        # never require what is forbidden, or what holds a forbidden word: related == concept, "hot dog" beside
        # "dog", "salt and pepper" beside the connective "and" (validate refuses such a set: it cannot be met);
        # nor a form with more counted words than its count allows ("cup of tea in a pot" holds two function
        # words where one is allowed: generating it would break the count)
        forbidden = [phrase_words(lit.text) for cl in clauses for lit in cl.literals]
        forms = [f for f in forms if not any(occurs_in(w, phrase_words(f)) for w in forbidden)
                 and all(_count_in(k.words, phrase_words(f)) <= k.max_count for k in counts)]
        if forms:
            clauses.append(Clause([Literal(f) for f in forms], name=f"related:{related.lower()}"))
    return ConstraintSet(clauses=clauses, counts=counts).to_dict()


def _count_in(words, text: tuple) -> int:
    """How many times the (possibly multi-word) ``words`` occur in the canonical words ``text``."""
    from i2d2.decoding.constraints import count_in, phrase_words

    # a word listed twice counts once, as in the decoder
    return sum(count_in(part, text) for part in dict.fromkeys(phrase_words(w) for w in words))


def _words(c, key: str) -> list[str]:
    words = list(_get(c, key, []))
    for i, w in enumerate(words):
        if not isinstance(w, str):  # YAML 1.1 reads on/no/yes/off as booleans
            raise ValueError(f"data.constraints.{key}[{i}] is {w!r}, not a word: quote it in the YAML (\"on\", \"no\")")
    return words


def _unique_lower(items) -> list[str]:
    seen, out = set(), []
    for x in items:
        x = x.lower()
        if x not in seen:
            seen.add(x)
            out.append(x)
    return out


# ----------------------------------------------------------------------------- candidates and scoring

def candidate_groups(concepts: list[Concept], cfg_data) -> list[list[Variant]]:
    """Groups of competing variants: one group per (noun, relation) pair, one singleton per goal prefix."""
    p = _engine()
    lists: dict[str, list[str]] = {}
    groups = []
    for c in concepts:
        if c.kind == "goal":
            groups += [[v] for v in goal_variants(c, cfg_data)]
            continue
        name = c.relations or "general"
        if name not in lists:
            rel_cfg = _get(cfg_data, "relations", {})
            if name not in rel_cfg:
                raise DataError(f"{c.source}: relational-phrase list {name!r} is not in data.relations "
                                f"({', '.join(rel_cfg)})")
            lists[name] = load_phrases(resolve_path(rel_cfg[name], cfg_data.get("dir")))
        for rel in lists[name]:
            group = noun_variants(c, rel, cfg_data, p)
            if group:  # none agrees: a mass noun before a plural phrase ("honey are"), a plural-only one before "is"
                groups.append(group)
    return groups


def score_texts(model, tokenizer, texts: list[str], work_dir: Path, batch_size: int = 32, per: str = "word",
                chunk: int = 1024, progress: bool = True) -> np.ndarray:
    """Per-word perplexity of ``texts`` in batches, saved chunk by chunk under ``work_dir`` so that a
    killed run resumes where it stopped (chunks of another text list or model are discarded)."""
    from i2d2.perplexity import perplexity

    work_dir = Path(work_dir)
    # chunk: a resume with another chunk_size crashed on the old chunks' shape; dtype: bf16 scores are not float32's
    fp = fingerprint(texts, per, getattr(model.config, "_name_or_path", ""), type(model).__name__,
                     int(sum(p.numel() for p in model.parameters())), int(chunk), str(getattr(model, "dtype", "")))
    meta = work_dir / "_fingerprint.txt"
    if work_dir.exists() and (not meta.exists() or meta.read_text() != fp):
        shutil.rmtree(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    write_text(meta, fp)
    out = np.empty(len(texts))
    starts = range(0, len(texts), chunk)
    parts = [work_dir / f"chunk-{i:05d}.npy" for i in range(len(starts))]
    done = [p.exists() for p in parts]
    # chunks a killed run scored count as done before the bar starts (initial): its rate and time left are this
    # run's, not inflated by the chunks read back in no time
    bar = LoggedBar(total=len(texts), initial=sum(min(chunk, len(texts) - s) for s, d in zip(starts, done) if d),
                    desc="prompt perplexity", unit="prompt", disable=not progress, logger=log)
    for start, part, was_done in zip(starts, parts, done):
        if was_done:
            out[start:start + chunk] = np.load(part)
            continue
        ppl = perplexity(model, tokenizer, texts[start:start + chunk], batch_size=batch_size, per=per)
        with atomic_path(part) as tmp:
            with open(tmp, "wb") as f:
                np.save(f, ppl)
        out[start:start + chunk] = ppl
        bar.update(min(chunk, len(texts) - start))
    bar.close()
    return out


def select_variants(groups: list[list[Variant]], ppl: np.ndarray, threshold: float | None):
    """Lowest-perplexity variant of each group; those above ``threshold`` are dropped.

    Returns ``(kept, dropped)``: lists of ``(variant, perplexity)``.
    """
    sizes = np.array([len(g) for g in groups])
    if (sizes == 0).any():
        raise ValueError("empty variant group")
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    # vectorised group argmin: sort by (group, perplexity) and take each group's first entry
    group_of = np.repeat(np.arange(len(groups)), sizes)
    order = np.lexsort((ppl, group_of))
    best = order[np.searchsorted(group_of[order], np.arange(len(groups)))]
    kept, dropped = [], []
    for gi, flat in enumerate(best):
        v, score = groups[gi][flat - offsets[gi]], float(ppl[flat])
        (dropped if threshold is not None and not score <= threshold else kept).append((v, score))
    return kept, dropped


def select_by_form(groups: list[list[Variant]], forms) -> tuple[list[Variant], int]:
    """The variant of each group with the most preferred form in ``forms`` (an ordered list of PROMPT_FORMS;
    with several adverbs, the first adverb). Goal prompts pass through. Returns (chosen, n_groups_without_form)."""
    rank = {f: i for i, f in enumerate(forms)}
    chosen, missing = [], 0
    for g in groups:
        if g[0].number is None:  # goal prompt
            chosen.append(g[0])
            continue
        best = min((v for v in g if v.form in rank), key=lambda v: rank[v.form], default=None)
        if best is None:
            missing += 1
        else:
            chosen.append(best)
    return chosen, missing


def check_prompt_selection(cfg_data) -> tuple[str, list[str]]:
    """``data.prompt_selection`` and ``data.prompt_forms``, checked; ValueError names the key."""
    selection = _get(cfg_data, "prompt_selection", "perplexity")
    if selection not in SELECTIONS:
        raise ValueError(f"data.prompt_selection must be one of {SELECTIONS}, got {selection!r}")
    forms = list(_get(cfg_data, "prompt_forms", []))
    bad = [f for f in forms if f not in PROMPT_FORMS]
    if bad:
        raise ValueError(f"data.prompt_forms: unknown form(s) {bad}; known: {list(PROMPT_FORMS)}")
    if selection == "forms" and not forms:
        raise ValueError("data.prompt_forms must name at least one form when data.prompt_selection=forms")
    return selection, forms


def check_prompt_config(cfg_data) -> None:
    """The prompt builder's data.* choices, for a start-up check (they were read only in the prompts stage, the
    related_prompts one after the perplexity pass); ValueError names the key."""
    check_prompt_selection(cfg_data)
    mode = _get(cfg_data, "related_prompts", "both")
    if mode not in ("both", "related", "none"):
        raise ValueError(f"data.related_prompts must be both|related|none, got {mode!r}")
    for key, empty_ok in (("adverbs", True), ("goal_prefixes", False)):
        # goal_prefixes=[]: the goal concepts gave no prompt, silently (switch the goals off with data.sources.goals=null)
        v = _get(cfg_data, key, None)
        if v is not None and (isinstance(v, str) or not all(isinstance(w, str) and w.strip() for w in v)
                              or (not empty_ok and not len(v))):
            raise ValueError(f"data.{key} must be a {'' if empty_ok else 'non-empty '}list of non-empty strings, "
                             f"got {v!r}" + ("" if empty_ok else " (data.sources.goals=null switches goals off)"))
    from i2d2.perplexity import UNITS

    per = _get(_get(cfg_data, "perplexity", {}), "per", "word")
    if per not in UNITS:
        raise ValueError(f"data.perplexity.per must be one of {'|'.join(UNITS)}, got {per!r}")


def heldout_keys(cfg_heldout) -> set[str]:
    """Lower-cased texts of the fixed evaluation concepts (``task.heldout``): kept out of every critic label set."""
    if not cfg_heldout:
        return set()
    return {c.text.lower() for c in heldout_concepts(cfg_heldout)}


# ----------------------------------------------------------------------------- the stage

def _heldout_text(value, where: str) -> str:
    """A held-out concept normalised as the concept loaders normalise theirs ("Board  games" must still exclude
    "board games" from the loop); ValueError naming the key otherwise (inflect failed on it in the held-out stage)."""
    try:
        return validate_concept(value if value is None else str(value))
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def heldout_concepts(cfg_heldout) -> list[Concept]:
    """The fixed evaluation concepts of ``task.heldout`` as Concepts (nouns paired with ``relations``)."""
    rel = cfg_heldout.get("relations") or "genericskb"
    nouns, goals = cfg_heldout.get("nouns") or [], cfg_heldout.get("goals") or []
    return ([Concept(_heldout_text(n, f"task.heldout.nouns[{i}]"), "noun", source="task.heldout.nouns", relations=rel)
             for i, n in enumerate(nouns)]
            + [Concept(_heldout_text(g, f"task.heldout.goals[{i}]"), "goal", source="task.heldout.goals")
               for i, g in enumerate(goals)])


@dataclass
class Candidates:
    """The prompt variants of a concept list, grouped per (concept, phrase) pair, and the texts the LM scores."""
    concepts: list[Concept]
    errors: list[str]           # malformed concept lines, skipped
    groups: list[list[Variant]]
    selection: str
    forms: list[str]
    n_without_form: int
    threshold: float | None     # data.perplexity.threshold
    n_built: int = 0            # the variants built, before prompt_selection=forms kept one per pair

    def to_score(self) -> list[str]:
        """What the LM must score: every variant, or nothing when no variant is chosen or dropped by perplexity."""
        if self.selection == "forms" and self.threshold is None:
            return []
        return [v.text for g in self.groups for v in g]


def prompt_candidates(cfg_data, concepts: list[Concept] | None = None, exclude: set[str] = frozenset()) -> Candidates:
    """Load concepts (or take ``concepts``) and build their variant groups; under ``prompt_selection=forms`` each
    group is already down to its form's variant. Deterministic: every rank that calls it gets the same texts."""
    errors: list[str] = []
    concepts = load_concepts(cfg_data, errors) if concepts is None else concepts
    held = sorted({c.text for c in concepts if c.text.lower() in exclude})
    if held:  # task.heldout: evaluation concepts only, never prompted, kept, labelled or fine-tuned on in the loop
        log.info("prompts: %d concept(s) of data.sources left out, being task.heldout's: %s", len(held), held)
        concepts = [c for c in concepts if c.text.lower() not in exclude]
    if not concepts:
        sources = [f"data.sources.{name}={resolve_path(src.get('path'), cfg_data.get('dir'))}"
                   for name, src in (_get(cfg_data, "sources", {}) or {}).items() if src]
        raise DataError(f"no concepts loaded from {', '.join(sources) or 'data.sources (every source is off)'}"
                        + (f" ({len(held)} left out as task.heldout's)" if held else "")
                        + (f"; {'; '.join(errors[:3])}" if errors else " (empty files?)"))
    selection, forms = check_prompt_selection(cfg_data)
    groups = candidate_groups(concepts, cfg_data)
    n_built, n_without_form = sum(len(g) for g in groups), 0
    if selection == "forms":  # the measured-yield forms (README: prompt forms); perplexity only for the threshold
        chosen, n_without_form = select_by_form(groups, forms)
        groups = [[v] for v in chosen]
    threshold = _get(cfg_data, "perplexity", {}).get("threshold", 250)
    return Candidates(concepts, errors, groups, selection, forms, n_without_form,
                      None if threshold is None else float(threshold), n_built)


def build_generic_prompts(cfg_data, model, tokenizer, out_path: Path, tracker=None,
                          concepts: list[Concept] | None = None, candidates: Candidates | None = None,
                          ppl: np.ndarray | None = None, what: str = "prompts") -> dict:
    """Load concepts (or take ``concepts``), build and score prompt variants, attach constraints, write the
    prompts JSONL.

    ``candidates``: ``prompt_candidates(cfg_data, concepts)``, already built; ``ppl``: the perplexities of its
    ``to_score()`` texts, already computed (the loop splits that pass over its ranks); without it the LM scores
    them here. ``what`` names the pool in the log line (the loop's held-out prompts are built here too).

    The table is a ``datasets.Dataset`` written with ``to_json`` into a temporary file renamed over
    ``out_path``. Malformed concept lines are skipped (``on_error: skip``, listed in the summary and in
    ``<out_path>.errors.txt``) or raise ``DataError`` (``on_error: raise``).
    """
    import datasets

    t0 = time.time()
    out_path = Path(out_path)
    cand = candidates or prompt_candidates(cfg_data, concepts)
    concepts, errors, groups, selection, forms = cand.concepts, cand.errors, cand.groups, cand.selection, cand.forms
    n_without_form, threshold = cand.n_without_form, cand.threshold
    for msg in errors[:20]:
        log.warning("skipped malformed concept line %s", msg)
    if len(errors) > 20:
        log.warning("... and %d more malformed concept lines", len(errors) - 20)
    texts = [v.text for g in groups for v in g]
    to_score = cand.to_score()
    ppl_cfg = _get(cfg_data, "perplexity", {})
    if ppl is not None:
        if len(ppl) != len(to_score):
            raise ValueError(f"{len(ppl)} perplexities given for {len(to_score)} prompt variants")
        ppl = np.asarray(ppl, dtype=float)
    if not to_score:  # nothing to choose or drop by perplexity: no LM pass
        ppl = np.full(len(texts), np.nan)
    elif ppl is None:
        ppl = score_texts(model, tokenizer, texts, out_path.parent / f".{out_path.name}.ppl",
                          batch_size=int(_get(ppl_cfg, "batch_size", 32)), per=_get(ppl_cfg, "per", "word"),
                          chunk=int(_get(ppl_cfg, "chunk_size", 1024)))
    kept, dropped = select_variants(groups, ppl, threshold)

    mode = _get(cfg_data, "related_prompts", "both")
    if mode not in ("both", "related", "none"):
        raise ValueError(f"data.related_prompts must be both|related|none, got {mode!r}")
    cons_cfg = _get(cfg_data, "constraints", {})
    engine = _engine()
    rows = []
    for v, score in kept:
        related = v.concept.related if mode != "none" else []
        todo = ([None] if mode == "both" or not related else []) + list(related)
        for rel in todo:
            rows.append(dict(
                prompt_id=f"p{len(rows):06d}", prompt=v.text,
                constraints=build_constraints(v, rel, cons_cfg, engine),
                concept=v.concept.text, kind=v.concept.kind, template=v.template, surface=v.surface,
                relation=v.relation,
                related=rel, perplexity=None if math.isnan(score) else round(score, 4), adverb=v.adverb, article=v.article, number=v.number,
                form=v.form, source=v.concept.source,
            ))
    if not rows:
        raise DataError(f"every prompt was dropped by the perplexity threshold {threshold} "
                        f"(lowest: {min((s for _, s in dropped), default=math.nan):.1f})")
    ds = datasets.Dataset.from_list(rows)
    with atomic_path(out_path) as tmp:
        ds.to_json(str(tmp), lines=True, force_ascii=False)
    err_path = out_path.with_name(out_path.name + ".errors.txt")
    if errors:
        write_text(err_path, "\n".join(errors) + "\n")
    elif err_path.exists():
        err_path.unlink()
    shutil.rmtree(out_path.parent / f".{out_path.name}.ppl", ignore_errors=True)

    summary = dict(
        n_concepts=len(concepts), n_nouns=sum(c.kind == "noun" for c in concepts),
        n_goals=sum(c.kind == "goal" for c in concepts), n_concept_errors=len(errors),
        prompt_selection=selection, n_pairs_without_form=n_without_form,
        n_pairs=len(groups), n_variants=len(texts), n_kept=len(kept), n_dropped_threshold=len(dropped),
        n_prompts=len(rows), n_with_related=sum(r["related"] is not None for r in rows),
        median_perplexity=float(np.nanmedian([s for _, s in kept])) if kept and not np.isnan(ppl).all() else None,
        seconds=round(time.time() - t0, 2), concept_errors=errors[:50],
    )
    write_json(out_path.with_name(out_path.name + ".summary.json"), summary)
    if selection == "forms":
        chosen = (f"{cand.n_built} variants built; per pair the first of the forms {forms} it has (a goal: its "
                  f"first template) -> {len(texts)} variants" + (f"; {n_without_form} pairs have none of those forms, "
                                                                 "skipped" if n_without_form else ""))
    else:
        chosen = f"{len(texts)} variants; per pair the one of lowest perplexity"
    log.info("%s: %d concepts -> %d pairs (%s) -> %d kept, %d over the perplexity threshold -> %d prompts (%d of "
             "them with a related concept)", what, summary["n_concepts"], len(groups) + n_without_form, chosen,
             len(kept), len(dropped), len(rows), summary["n_with_related"])
    if tracker is not None:
        tracker.log_metrics({f"prompts/{k}": v for k, v in summary.items() if isinstance(v, (int, float))})
        step = max(1, len(rows) // 20)
        tracker.log_table("prompts/samples", ["prompt_id", "prompt", "concept", "kind", "related", "perplexity"],
                          [[r["prompt_id"], r["prompt"], r["concept"], r["kind"], r["related"], r["perplexity"]]
                           for r in rows[::step][:20]], out_path.parent)
    return summary
