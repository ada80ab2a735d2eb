"""Polyjuice-style prompt format for NegVerse and its tokenisation (loss on the answers only).

    {original} <|perturb|> [negation] {masked} [SEP] answer1 [ANSWER] answer2 [ANSWER]<eos>

The prompt ends at [SEP]; the model writes one answer per [BLANK], each closed by [ANSWER]; [EMPTY]
stands for a deletion.
"""

from __future__ import annotations

import torch

from i2d2.negverse.masking import BLANK, EMPTY

PERTURB, NEGATION, SEP, ANSWER = "<|perturb|>", "[negation]", "[SEP]", "[ANSWER]"
SPECIAL_TOKENS = [PERTURB, NEGATION, BLANK, SEP, ANSWER, EMPTY]
# New token embeddings start as the mean embedding of these words (then train, see model.py).
INIT_WORDS = {PERTURB: "change rewrite", NEGATION: "negation not", BLANK: "blank gap", SEP: "answers:",
              ANSWER: "end ;", EMPTY: "nothing empty"}
IGNORE = -100


def build_prompt(original: str, masked: str, control: str = NEGATION) -> str:
    return f"{original.strip()} {PERTURB} {control} {masked.strip()} {SEP}"


def build_target(answers: list[str]) -> str:
    return "".join(f" {a.strip() or EMPTY} {ANSWER}" for a in answers)


def parse_answers(generated: str, n_blanks: int) -> list[str] | None:
    """The first ``n_blanks`` answers of a generated continuation; None if fewer were closed by [ANSWER]."""
    parts = generated.split(ANSWER)
    if len(parts) - 1 < n_blanks:
        return None
    return [p.strip() for p in parts[:n_blanks]]


def encode(tok, prompt: str, target: str | None = None, max_length: int | None = None) -> dict:
    """Token ids of prompt (+ target + eos) and labels that are IGNORE on the prompt.

    The prompt is tokenised exactly as at generation time (with the tokenizer's BOS if it adds one); the
    target is tokenised separately so that the boundary never merges prompt and answer tokens.
    """
    p = tok(prompt, add_special_tokens=True)["input_ids"]
    if target is None:
        return {"input_ids": p, "labels": [IGNORE] * len(p)}
    t = tok(target, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    ids, labels = p + t, [IGNORE] * len(p) + t
    if max_length is not None and len(ids) > max_length:
        return {}
    return {"input_ids": ids, "labels": labels}


def collate(rows: list[dict], pad_id: int, side: str = "right") -> dict[str, torch.Tensor]:
    """Pad a batch with the tokenizer's real pad token; attention_mask marks the real tokens."""
    if pad_id is None:
        raise ValueError("tokenizer has no pad token: load it with i2d2.models.load_causal_lm")
    n = max(len(r["input_ids"]) for r in rows)
    ids = torch.full((len(rows), n), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), n), IGNORE, dtype=torch.long)
    mask = torch.zeros((len(rows), n), dtype=torch.long)
    for i, r in enumerate(rows):
        k = len(r["input_ids"])
        sl = slice(0, k) if side == "right" else slice(n - k, n)
        ids[i, sl] = torch.tensor(r["input_ids"])
        labels[i, sl] = torch.tensor(r.get("labels", [IGNORE] * k))
        mask[i, sl] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}
