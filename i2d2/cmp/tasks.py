"""The four pre-training tasks of Table 2, their prompt formats, text infilling, and seq2seq I/O."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass

import numpy as np

from i2d2.cmp.data import Quintuple
from i2d2.cmp.textualize import qa_pairs
from i2d2.progress import progress as progress_log

log = logging.getLogger(__name__)

TASKS = ("qa", "qag", "sum", "ti")
TASK_NAMES = {
    "qa": "comparative answer generation",
    "qag": "comparative QA pairs generation",
    "sum": "comparative summary generation",
    "ti": "text infilling",
}
SEP = "[SEP]"

# Table 2 source formats. {q}: question, {d1}/{d2}: the two (possibly corrupted) documents.
PROMPTS = {
    "qa": "Answer the comparative question. Question: {q} Context: {d1} {sep} {d2}",
    "qag": "Generate a comparative question-answer pair. Context: {d1} {sep} {d2}",
    "sum": "Generate a comparative summary. Context: {d1} {sep} {d2}",
    "ti": "{d1} {sep} {d2}",
    # downstream comparative question generation (questions only, the QAG prompt's sibling)
    "qg": "Generate a comparative question. Context: {d1} {sep} {d2}",
}


@dataclass(frozen=True)
class Example:
    task: str
    source: str
    target: str
    qid: str = ""
    template: str = ""


def source_text(task: str, d1: str, d2: str, question: str = "", sep: str = SEP) -> str:
    if task not in PROMPTS:
        raise ValueError(f"unknown CMP task {task!r}; expected one of {', '.join(PROMPTS)}")
    return PROMPTS[task].format(q=question, d1=d1, d2=d2, sep=sep)


def qag_target(question: str, answer: str) -> str:
    """Table 2's ``Q;A`` target."""
    return f"{question}; {answer}"


def split_qag(text: str) -> tuple[str, str]:
    q, _, a = text.rpartition(";")
    return (q.strip(), a.strip()) if q else (text.strip(), "")


# ----------------------------------------------------------------------------- text infilling

def infill_mask(n: int, rng: np.random.Generator, ratio: float = 0.3, poisson_lambda: float = 3.0) -> np.ndarray:
    """Boolean mask over ``n`` tokens: exactly ``round(ratio*n)`` masked, in spans whose lengths are
    drawn from Poisson(λ) (zero-length draws dropped), spans separated by at least one kept token."""
    if not poisson_lambda > 0:  # Poisson(0) draws only empty spans, and the loop below would never end
        raise ValueError(f"poisson_lambda must be > 0, got {poisson_lambda!r}")
    k_mask = int(round(n * ratio))
    mask = np.zeros(n, dtype=bool)
    if k_mask == 0 or n == 0:
        return mask
    lengths = rng.poisson(poisson_lambda, size=k_mask + 8)
    lengths = lengths[lengths > 0]
    while lengths.sum() < k_mask:  # rare: extend with more draws
        more = rng.poisson(poisson_lambda, size=k_mask)
        lengths = np.concatenate([lengths, more[more > 0]])
    csum = np.cumsum(lengths)
    n_spans = int(np.searchsorted(csum, k_mask) + 1)
    lengths = lengths[:n_spans].copy()
    lengths[-1] -= csum[n_spans - 1] - k_mask
    # spans need n_spans-1 separating kept tokens; merge spans until they fit
    while len(lengths) > 1 and (n - k_mask) < len(lengths) - 1:
        lengths = np.concatenate([lengths[:-2], [lengths[-2] + lengths[-1]]])
    free = (n - k_mask) - (len(lengths) - 1)
    gaps = rng.multinomial(free, np.full(len(lengths) + 1, 1.0 / (len(lengths) + 1)))
    gaps[1:-1] += 1
    starts = np.cumsum(np.concatenate([[gaps[0]], (gaps[1:-1] + lengths[:-1])]))
    idx = np.repeat(starts, lengths) + (np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths))
    mask[idx] = True
    return mask


def corrupt(text: str, rng: np.random.Generator, mask_token: str, ratio: float = 0.3,
            poisson_lambda: float = 3.0) -> str:
    """BART-style text infilling on whitespace tokens: each masked span becomes one ``mask_token``."""
    words = np.array(text.split(), dtype=object)
    if len(words) == 0:
        return text
    mask = infill_mask(len(words), rng, ratio, poisson_lambda)
    span_start = mask & ~np.concatenate([[False], mask[:-1]])
    keep = ~mask | span_start
    out = np.where(span_start, mask_token, words)[keep]
    return " ".join(out.tolist())


def mask_token_for(tokenizer) -> str:
    tok = getattr(tokenizer, "mask_token", None)
    if tok:
        return tok
    if "<extra_id_0>" in tokenizer.get_vocab():  # T5 sentinels
        return "<extra_id_0>"
    raise ValueError("the tokenizer has no mask token; set task.infilling.mask_token")


# ----------------------------------------------------------------------------- examples

def _seed(*parts) -> int:
    return int.from_bytes(hashlib.sha1("|".join(map(str, parts)).encode()).digest()[:8], "little")


class ExampleBuilder:
    """Turns quintuples into (source, target) examples for each task of Table 2.

    ``summaries`` maps quintuple id to its summary (from a realiser); ``trunc`` (optional) cuts each
    document to its share of the source length, so that both documents survive truncation.
    """

    def __init__(self, summaries: dict[str, str], mask_token: str, sep: str = SEP, mask_ratio: float = 0.3,
                 poisson_lambda: float = 3.0, trunc=None):
        self.summaries, self.mask_token, self.sep = summaries, mask_token, sep
        self.mask_ratio, self.poisson_lambda = mask_ratio, poisson_lambda
        self.trunc = trunc or (lambda d: d)

    def docs(self, q: Quintuple) -> tuple[str, str]:
        return self.trunc(q.doc1), self.trunc(q.doc2)

    def examples(self, q: Quintuple, task: str, seed: int = 0) -> list[Example]:
        """All examples of ``task`` for ``q`` (QA/QAG: one per QA pair; SUM/TI: one)."""
        d1, d2 = self.docs(q)
        if task == "qa":
            return [Example("qa", source_text("qa", d1, d2, p.question, self.sep), p.answer, q.id, p.template)
                    for p in qa_pairs(q)]
        if task == "qag":
            src = source_text("qag", d1, d2, sep=self.sep)
            return [Example("qag", src, qag_target(p.question, p.answer), q.id, p.template) for p in qa_pairs(q)]
        if task == "sum":
            if q.id not in self.summaries:
                raise KeyError(f"no summary for quintuple {q.id!r}")
            return [Example("sum", source_text("sum", d1, d2, sep=self.sep), self.summaries[q.id], q.id)]
        if task == "ti":
            rng = np.random.default_rng(_seed(q.id, seed))
            c1 = corrupt(d1, rng, self.mask_token, self.mask_ratio, self.poisson_lambda)
            c2 = corrupt(d2, rng, self.mask_token, self.mask_ratio, self.poisson_lambda)
            return [Example("ti", source_text("ti", c1, c2, sep=self.sep), f"{d1} {self.sep} {d2}", q.id)]
        raise ValueError(f"unknown CMP task {task!r}; expected one of {', '.join(TASKS)}")

    def sample(self, q: Quintuple, task: str, rng: np.random.Generator, seed: int = 0) -> Example:
        exs = self.examples(q, task, seed)
        return exs[int(rng.integers(len(exs)))]


def make_truncator(tokenizer, max_tokens: int):
    """A cached ``doc -> doc`` cutting each document to ``max_tokens`` tokens (at a token boundary)."""
    cache: dict[str, str] = {}

    def trunc(doc: str) -> str:
        if doc not in cache:
            enc = tokenizer(doc, add_special_tokens=False, return_offsets_mapping=True)
            offs = enc["offset_mapping"]
            cache[doc] = doc if len(offs) <= max_tokens else doc[: offs[max_tokens - 1][1]]
        return cache[doc]

    return trunc


# ----------------------------------------------------------------------------- tensors and generation

def eos_id(model, tokenizer) -> int:
    for cand in (getattr(getattr(model, "generation_config", None), "eos_token_id", None),
                 getattr(model.config, "eos_token_id", None), tokenizer.eos_token_id, tokenizer.sep_token_id):
        if isinstance(cand, list):
            cand = cand[0] if cand else None
        if cand is not None:
            return int(cand)
    raise ValueError("cannot tell the model's end-of-sequence token")


DOC_SEP = "[DOC]"  # dedicated D1/D2 separator for tokenizers whose "[SEP]" is the end-of-sequence token


def resolve_separator(model, tokenizer, sep: str = "auto") -> str:
    """The D1/D2 separator for this model, never its end-of-sequence token: a text-infilling target
    ``D1 <sep> D2`` whose separator is EOS would teach the model to stop after D1.

    ``auto``: Table 2's "[SEP]" where it is plain text to the tokenizer (BART, T5); otherwise (BERT
    WordPiece, where "[SEP]" is EOS) the special token ``[DOC]``, added with a new embedding row
    unless the tokenizer has it already (a model pre-trained here saves it with its tokenizer).
    """
    eos = eos_id(model, tokenizer)
    if sep != "auto":
        if eos in tokenizer(sep, add_special_tokens=False)["input_ids"]:
            raise ValueError(f"task.sep {sep!r} encodes to the model's end-of-sequence token (id {eos}); "
                             "use task.sep=auto or another separator")
        return sep
    if eos not in tokenizer(SEP, add_special_tokens=False)["input_ids"]:
        return SEP
    if DOC_SEP not in tokenizer.get_vocab():
        tokenizer.add_tokens([DOC_SEP], special_tokens=True)
    _fit_embeddings(model, len(tokenizer))
    return DOC_SEP


def _fit_embeddings(model, n: int) -> None:
    from transformers import EncoderDecoderModel

    if isinstance(model, EncoderDecoderModel):  # its own resize_token_embeddings is not implemented
        for part in (model.encoder, model.decoder):
            if part.get_input_embeddings().num_embeddings < n:
                part.resize_token_embeddings(n)
        model.config.encoder.vocab_size, model.config.decoder.vocab_size = (
            model.encoder.config.vocab_size, model.decoder.config.vocab_size)
    elif model.get_input_embeddings().num_embeddings < n:
        model.resize_token_embeddings(n)


def untrained_parts(model) -> list[str]:
    """Decoder parameters of a warm-started ``EncoderDecoderModel`` that its decoder checkpoint did not
    hold, so they start randomly initialised (for a BERT-style checkpoint: every layer's
    cross-attention and the LM-head transform); [] for other models."""
    import re

    from transformers import AutoModelForCausalLM, EncoderDecoderModel

    if not isinstance(model, EncoderDecoderModel):
        return []
    src = getattr(model.config.decoder, "_name_or_path", "")
    try:
        _, info = AutoModelForCausalLM.from_pretrained(src, is_decoder=True, add_cross_attention=True,
                                                       output_loading_info=True)
    except (OSError, ValueError):  # decoder source not available offline: cannot tell
        return []
    names = {re.sub(r"\.\d+\.", ".*.", k).rsplit(".", 1)[0] for k in info["missing_keys"]}
    return sorted({re.sub(r"\.(crossattention|transform)\..*", r".\1", n) for n in names})


def tokenizer_lowercases(tokenizer) -> bool:
    """Whether the tokenizer folds case (uncased WordPiece): its outputs can never match cased text."""
    ids = tokenizer("Zq", add_special_tokens=False)["input_ids"]
    return tokenizer.decode(ids).replace(" ", "") == "zq"


class Collator:
    """Tokenises (source, target) pairs: sources with the tokenizer's specials, targets as plain tokens
    followed by the model's EOS (so tokenizers that add no specials still teach the model to stop);
    padding in the labels is -100."""

    def __init__(self, tokenizer, eos: int, max_source_length: int = 512, max_target_length: int = 512):
        self.tok, self.eos = tokenizer, eos
        self.max_source_length, self.max_target_length = max_source_length, max_target_length

    def __call__(self, sources: list[str], targets: list[str] | None = None) -> dict:
        import torch

        enc = self.tok(sources, max_length=self.max_source_length, truncation=True, padding=True,
                       return_tensors="pt")
        out = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
        if targets is not None:
            ids = self.tok(targets, add_special_tokens=False, truncation=True,
                           max_length=self.max_target_length - 1)["input_ids"]
            ids = [x + [self.eos] for x in ids]
            width = max(map(len, ids))
            labels = torch.full((len(ids), width), -100, dtype=torch.long)
            for i, x in enumerate(ids):
                labels[i, : len(x)] = torch.tensor(x)
            out["labels"] = labels
        return out


def generate(model, tokenizer, sources: list[str], batch_size: int = 16, max_new_tokens: int = 32,
             max_source_length: int = 512, num_beams: int = 1, progress: bool = False) -> list[str]:
    """Decode ``sources`` (longest first, for tight padding) and return texts in input order."""
    import torch
    model.eval()
    order = np.argsort([-len(s) for s in sources], kind="stable")
    out: list[str] = [""] * len(sources)
    coll = Collator(tokenizer, eos_id(model, tokenizer), max_source_length)
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    for idx in progress_log(batches, desc="generate", disable=not progress, logger=log):
        enc = coll([sources[i] for i in idx])
        enc = {k: v.to(model.device) for k, v in enc.items()}
        with torch.no_grad():
            gen = model.generate(**enc, max_new_tokens=max_new_tokens, num_beams=num_beams, do_sample=False)
        for i, text in zip(idx, tokenizer.batch_decode(gen, skip_special_tokens=True)):
            out[i] = " ".join(text.split())
    return out
