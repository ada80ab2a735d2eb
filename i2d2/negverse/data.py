"""NegVerse training data: bundled pairs + rule-generated pairs -> masked prompt/answer examples."""

from __future__ import annotations

import random
import re
from pathlib import Path

from tqdm import tqdm

from i2d2.io import DataError, read_text
from i2d2.negverse.formatting import build_prompt, build_target
from i2d2.negverse.masking import RULES, training_variants
from i2d2.negverse.rules import generate_pairs

DATA_DIR = Path(__file__).resolve().parent.parent / "data" / "negverse"
TYPES = ("verbal", "non_verbal", "affixal")


def resolve(path: str | Path | None, default: str) -> Path:
    """A data file: the given path, or the bundled default under i2d2/data/negverse/."""
    p = Path(path) if path else DATA_DIR / default
    if not p.exists():
        raise FileNotFoundError(f"NegVerse data file {p} not found")
    return p


def read_sentences(path: str | Path) -> list[str]:
    """One sentence a line; blank lines and lines starting with '#' are skipped. A tab is refused: the pairs TSV
    given here was read as glued 'original negated type' sentences, which also slipped past the held-out check."""
    out = []
    for lineno, ln in enumerate(read_text(path).splitlines(), 1):
        if "\t" in ln.strip() and not ln.startswith("#"):  # a tab inside the text; trailing whitespace is stripped
            raise DataError(f"{path}:{lineno}: a tab in a one-sentence-a-line file (a TSV such as the pairs file?)")
        if ln.strip() and not ln.startswith("#"):
            out.append(ln.strip())
    return out


def read_pairs(path: str | Path) -> list[dict]:
    """TSV ``original<TAB>negated<TAB>type`` ('#' lines are comments); errors name file:line."""
    path = Path(path)
    rows = []
    for lineno, line in enumerate(read_text(path).splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        cols = [c.strip() for c in line.split("\t")]
        if len(cols) != 3:
            raise DataError(f"{path}:{lineno}: expected 'original<TAB>negated<TAB>type', got {len(cols)} column(s)")
        for i, name in enumerate(("original", "negated")):  # three columns with an empty one said "got 3 column(s)"
            if not cols[i]:
                raise DataError(f"{path}:{lineno}: the {name} sentence (column {i + 1}) is empty")
        if cols[2] not in TYPES:
            raise DataError(f"{path}:{lineno}: type {cols[2]!r} is not one of {TYPES}")
        if cols[0] == cols[1]:
            raise DataError(f"{path}:{lineno}: negated sentence equals the original")
        rows.append({"original": cols[0], "negated": cols[1], "type": cols[2], "source": f"{path.name}:{lineno}"})
    return rows


def sentence_key(text: str) -> str:
    """What makes two sentences the same sentence for the held-out check: case, punctuation, spacing and curly
    apostrophes folded ("she likes apples" is "She likes apples.")."""
    return " ".join(re.sub(r"[^\w\s']", " ", text.lower().replace("\u2019", "'")).split())


def seen_in_training(sentences: list[str], pairs_path: Path, affirmatives_path: Path | None) -> list[tuple[str, str]]:
    """(evaluation sentence, training sentence) for each evaluation sentence the training data holds, up to
    ``sentence_key``: either side of a written pair (the original is in the prompt, the negation is the target) or an
    affirmative the rule generator derives pairs from (``affirmatives_path``: None when the rules are off). The rules
    only negate those sentences, so their outputs hold a negation cue an affirmative evaluation sentence lacks."""
    train: dict[str, str] = {}
    for p in read_pairs(pairs_path):
        for side in (p["original"], p["negated"]):
            train.setdefault(sentence_key(side), side)
    for s in read_sentences(affirmatives_path) if affirmatives_path else []:
        train.setdefault(sentence_key(s), s)
    return [(s, train[sentence_key(s)]) for s in sentences if sentence_key(s) in train]


def build_pairs(nlp, pairs_path: Path, affirmatives_path: Path | None, use_rules: bool = True,
                rules_on_pairs: bool = True, seed: int = 0) -> list[dict]:
    """Written pairs plus rule-generated ones (from the affirmative list and the written originals), deduped."""
    pairs = read_pairs(pairs_path)
    if use_rules:
        sents = read_sentences(affirmatives_path) if affirmatives_path else []
        if rules_on_pairs:
            sents += [p["original"] for p in pairs]
        sents = list(dict.fromkeys(sents))
        docs = list(tqdm(nlp.pipe(sents), total=len(sents), desc="parse (rules)", leave=False))
        pairs += generate_pairs(docs, seed=seed)
    seen, out = set(), []
    for p in pairs:
        key = (p["original"], p["negated"])
        if key not in seen:
            seen.add(key)
            out.append(p)
    return out


def build_examples(nlp, pairs: list[dict], rules=RULES, max_blanks: int = 2, max_variants: int = 4,
                   seed: int = 0) -> tuple[list[dict], dict]:
    """Masked training examples (prompt, target, answers, rules) for each pair; returns (examples, stats)."""
    texts = [t for p in pairs for t in (p["original"], p["negated"])]
    docs = list(tqdm(nlp.pipe(texts), total=len(texts), desc="parse (pairs)", leave=False))
    examples, unaligned = [], 0
    for k, p in enumerate(pairs):
        variants = training_variants(docs[2 * k], docs[2 * k + 1], rules=rules, max_blanks=max_blanks,
                                     max_variants=max_variants, seed=seed)
        if not variants:
            unaligned += 1
        for v in variants:
            examples.append({"original": p["original"], "negated": p["negated"], "type": p["type"],
                             "source": p["source"], "masked": v.text, "answers": v.answers, "rules": v.rules,
                             "prompt": build_prompt(p["original"], v.text), "target": build_target(v.answers)})
    stats = {"n_pairs": len(pairs), "n_examples": len(examples), "n_unaligned_pairs": unaligned}
    return examples, stats


def split_by_original(examples: list[dict], val_fraction: float, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """Train/validation split that keeps all variants of one original sentence on the same side."""
    originals = sorted({e["original"] for e in examples})
    random.Random(seed).shuffle(originals)
    n_val = int(round(len(originals) * val_fraction))
    val = set(originals[:n_val])
    return [e for e in examples if e["original"] not in val], [e for e in examples if e["original"] in val]
