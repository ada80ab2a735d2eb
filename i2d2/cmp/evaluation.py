"""Downstream metrics: EM / unigram F1 with SQuAD-style answer normalisation (Chen et al., 2017;
as in KILT), corpus BLEU (sacrebleu) and ROUGE-2 / ROUGE-L (rouge-score). Scores are in [0, 100];
with several references an example scores its best reference (KILT's convention)."""

from __future__ import annotations

import re
import string
from collections import Counter

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize_answer(s: str) -> str:
    """Lower-case, drop punctuation and the articles a/an/the, squeeze whitespace."""
    s = "".join(ch for ch in str(s).lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", s).split())


def exact_match(prediction: str, reference: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(reference))


def unigram_f1(prediction: str, reference: str) -> float:
    pred, gold = normalize_answer(prediction).split(), normalize_answer(reference).split()
    if not pred or not gold:
        return float(pred == gold)
    common = sum((Counter(pred) & Counter(gold)).values())
    if common == 0:
        return 0.0
    p, r = common / len(pred), common / len(gold)
    return 2 * p * r / (p + r)


def _refs(references) -> list[list[str]]:
    return [[r] if isinstance(r, str) else list(r) for r in references]


def qa_scores(predictions: list[str], references) -> dict:
    refs = _refs(references)
    _check(predictions, refs)
    em = [max(exact_match(p, r) for r in rs) for p, rs in zip(predictions, refs)]
    f1 = [max(unigram_f1(p, r) for r in rs) for p, rs in zip(predictions, refs)]
    return {"em": 100 * sum(em) / len(em), "f1": 100 * sum(f1) / len(f1), "n": len(em)}


def bleu(predictions: list[str], references, lowercase: bool = False) -> float:
    """Corpus BLEU (sacrebleu defaults: 13a tokenisation, 4-grams); references may vary in number.
    ``lowercase``: case-insensitive BLEU, for models whose tokenizer folds case."""
    import sacrebleu

    refs = _refs(references)
    _check(predictions, refs)
    width = max(map(len, refs))
    streams = [[rs[i] if i < len(rs) else rs[0] for rs in refs] for i in range(width)]
    return float(sacrebleu.corpus_bleu(predictions, streams, lowercase=lowercase).score)


def rouge(predictions: list[str], references, types=("rouge2", "rougeL")) -> dict:
    """Mean ROUGE F-measure per type (Porter stemming), best reference per example."""
    from rouge_score import rouge_scorer

    refs = _refs(references)
    _check(predictions, refs)
    scorer = rouge_scorer.RougeScorer(list(types), use_stemmer=True)
    tot = {t: 0.0 for t in types}
    for p, rs in zip(predictions, refs):
        per = [scorer.score(r, p) for r in rs]
        for t in types:
            tot[t] += max(s[t].fmeasure for s in per)
    return {t: 100 * v / len(refs) for t, v in tot.items()}


def _check(predictions, refs):
    if len(predictions) != len(refs):
        raise ValueError(f"{len(predictions)} predictions but {len(refs)} references")
    if not predictions:
        raise ValueError("nothing to score")


# A.3: checkpoints are selected by the highest F1 (QA), BLEU (QG) and ROUGE-L (summaries).
SELECTION_METRIC = {"qa": "f1", "qg": "bleu", "sum": "rougeL"}


def selection_metric(task: str, lowercase: bool = False) -> str:
    m = SELECTION_METRIC[task]
    return "bleu_uncased" if m == "bleu" and lowercase else m


def task_scores(task: str, predictions: list[str], references, lowercase: bool = False) -> dict:
    """The paper's metrics per downstream task: QA -> EM/F1, QG -> BLEU/ROUGE-L, SUM -> ROUGE-2/L.

    ``lowercase`` (a case-folding tokenizer): BLEU is computed case-insensitively and reported as
    ``bleu_uncased``, never under the paper's case-sensitive name. (EM/F1 and ROUGE fold case anyway.)
    """
    if task == "qa":
        return qa_scores(predictions, references)
    if task == "qg":
        return {selection_metric("qg", lowercase): bleu(predictions, references, lowercase),
                "rougeL": rouge(predictions, references, ("rougeL",))["rougeL"], "n": len(predictions)}
    if task == "sum":
        return {**rouge(predictions, references), "n": len(predictions)}
    raise ValueError(f"unknown downstream task {task!r} (qa, qg, sum)")
