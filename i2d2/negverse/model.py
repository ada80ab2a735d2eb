"""A frozen causal LM + peft prompt tuning + trainable embeddings for the NegVerse special tokens.

The base LM is frozen (prompt tuning). The special tokens (``<|perturb|>``, ``[BLANK]``, ``[ANSWER]`` ...)
are new rows in the embedding matrix; frozen rows would leave e.g. ``[ANSWER]`` unable to win over the
word it was initialised from, so their rows are small trainable parameters of their own (initialised
from the mean embedding of describing words, see formatting.INIT_WORDS), used for the input embedding
and, for untied heads, a separate output row. ``sync_new_tokens`` writes them into the base matrices
before generation and saving, so the saved adapter (peft prompt + ``new_tokens.safetensors``) restores
exactly the trained model.

The training loss computes the LM head only at answer positions (the prompt is not scored): with a
262k-word vocabulary the head dominates the cost on CPU.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from i2d2.negverse.formatting import ANSWER, IGNORE, INIT_WORDS, SPECIAL_TOKENS

DEFAULT_INIT_TEXT = ("Rewrite the sentence as its negation by filling every blank; "
                     "use not, never, no, nobody, nothing, none, or a negative prefix such as un- or dis-.")


def add_special_tokens(model, tok) -> list[int]:
    """Register the NegVerse tokens with ``tok`` and grow ``model``'s embeddings if the ids need it."""
    from tokenizers import AddedToken

    tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS], special_tokens=True)
    ids = tok.convert_tokens_to_ids(SPECIAL_TOKENS)
    need = max(ids) + 1
    if need > model.get_input_embeddings().weight.shape[0]:
        model.resize_token_embeddings(need, mean_resizing=False)
    return ids


class NegVerseLM(nn.Module):
    def __init__(self, base, tok, num_virtual_tokens: int = 24, init_text: str | None = DEFAULT_INIT_TEXT,
                 train_new_tokens: bool = True):
        super().__init__()
        from peft import PromptTuningConfig, get_peft_model

        self.tok = tok
        self.new_ids_list = add_special_tokens(base, tok)
        for p in base.parameters():
            p.requires_grad_(False)
        self.num_virtual_tokens = int(num_virtual_tokens)
        self.peft = get_peft_model(base, PromptTuningConfig(task_type="CAUSAL_LM",
                                                           num_virtual_tokens=self.num_virtual_tokens))
        self.base = base
        self.register_buffer("new_ids", torch.tensor(self.new_ids_list), persistent=False)
        emb = base.get_input_embeddings()
        self.embed_scale = float(getattr(emb, "embed_scale", 1.0))
        w_in = emb.weight
        out = base.get_output_embeddings()
        self.tied = out is None or out.weight is w_in or out.weight.data_ptr() == w_in.data_ptr()
        with torch.no_grad():
            init_in = torch.stack([self._word_mean(w_in, INIT_WORDS[t]) for t in SPECIAL_TOKENS])
            self.new_in = nn.Parameter(init_in.clone(), requires_grad=train_new_tokens)
            if not self.tied:
                init_out = torch.stack([self._word_mean(out.weight, INIT_WORDS[t]) for t in SPECIAL_TOKENS])
                self.new_out = nn.Parameter(init_out.clone(), requires_grad=train_new_tokens)
            else:
                self.new_out = None
            if init_text:  # Lester et al.: initialising the prompt from vocabulary embeddings trains better
                ids = tok(init_text, add_special_tokens=False)["input_ids"]
                ids = (ids * (self.num_virtual_tokens // max(len(ids), 1) + 1))[: self.num_virtual_tokens]
                w = self.prompt_weight()
                w.copy_(w_in[torch.tensor(ids)] * self.embed_scale)
        self.sync_new_tokens()

    # ------------------------------------------------------------------ pieces
    def _word_mean(self, weight, words: str) -> torch.Tensor:
        ids = self.tok(words, add_special_tokens=False)["input_ids"]
        ids = [i for i in ids if i < weight.shape[0] and i not in self.new_ids_list] or [self.tok.eos_token_id]
        return weight[torch.tensor(ids)].float().mean(0).to(weight.dtype)

    def prompt_weight(self) -> torch.Tensor:
        return self.peft.prompt_encoder[self.peft.active_adapter].embedding.weight

    def trainable_state(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in self.named_parameters() if v.requires_grad}

    @torch.no_grad()
    def sync_new_tokens(self) -> None:
        """Copy the trained special-token rows into the base model's embedding (and head) matrices."""
        w_in = self.base.get_input_embeddings().weight
        w_in[self.new_ids] = self.new_in.to(w_in.dtype)
        if self.new_out is not None:
            self.base.get_output_embeddings().weight[self.new_ids] = self.new_out.to(w_in.dtype)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        emb = self.base.get_input_embeddings()(input_ids)
        is_new = torch.isin(input_ids, self.new_ids)
        if is_new.any():
            lookup = torch.full((int(self.new_ids.max()) + 1,), 0, dtype=torch.long, device=input_ids.device)
            lookup[self.new_ids] = torch.arange(len(self.new_ids), device=input_ids.device)
            rows = self.new_in[lookup[input_ids.clamp(max=len(lookup) - 1)]] * self.embed_scale
            emb = torch.where(is_new.unsqueeze(-1), rows.to(emb.dtype), emb)
        return emb

    def with_prompt(self, input_ids, attention_mask):
        b = input_ids.shape[0]
        emb = self.embed(input_ids)
        prompt = self.peft.get_prompt(batch_size=b).to(emb.dtype)
        x = torch.cat([prompt, emb], dim=1)
        am = torch.cat([torch.ones(b, self.num_virtual_tokens, dtype=attention_mask.dtype,
                                   device=attention_mask.device), attention_mask], dim=1)
        return x, am

    def head(self, h: torch.Tensor) -> torch.Tensor:
        out = self.base.get_output_embeddings()
        logits = out(h)
        new_rows = self.new_in if self.new_out is None else self.new_out
        logits = logits.index_copy(-1, self.new_ids, (h @ new_rows.to(h.dtype).T))
        cap = getattr(self.base.config, "final_logit_softcapping", None)
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits

    # ------------------------------------------------------------------ training
    def loss(self, input_ids, attention_mask, labels) -> torch.Tensor:
        """Mean cross-entropy over the answer tokens (labels != IGNORE), prompt-tuned forward."""
        x, am = self.with_prompt(input_ids, attention_mask)
        backbone = self.base.base_model
        h = backbone(inputs_embeds=x, attention_mask=am).last_hidden_state[:, self.num_virtual_tokens:]
        tgt = labels[:, 1:]
        sel = tgt != IGNORE
        if not sel.any():
            raise ValueError("batch has no answer tokens to train on (all labels are ignored)")
        logits = self.head(h[:, :-1][sel])
        return F.cross_entropy(logits.float(), tgt[sel])

    # ------------------------------------------------------------------ generation
    @torch.no_grad()
    def generate(self, prompts: list[str], n_blanks: list[int] | None = None, num_return_sequences: int = 1,
                 max_new_tokens: int = 40, do_sample: bool = True, top_p: float = 0.9,
                 temperature: float = 1.0, num_beams: int = 1) -> list[list[str]]:
        """Continuations (special tokens kept) for each prompt, batched with left padding."""
        from transformers import StoppingCriteria, StoppingCriteriaList

        self.sync_new_tokens()
        tok = self.tok
        side = tok.padding_side
        tok.padding_side = "left"
        try:
            enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=True)
        finally:
            tok.padding_side = side
        dev = self.new_in.device
        ids, mask = enc["input_ids"].to(dev), enc["attention_mask"].to(dev)
        x, am = self.with_prompt(ids, mask)
        criteria = StoppingCriteriaList()
        answer_id = tok.convert_tokens_to_ids(ANSWER)
        if n_blanks is not None:
            rows_per_prompt = num_beams if num_beams > 1 else num_return_sequences  # generate's batch expansion
            need = torch.tensor(n_blanks, device=dev).repeat_interleave(rows_per_prompt)

            class _Answers(StoppingCriteria):  # stop a row once it closed all its blanks
                def __call__(self, input_ids, scores, **kw):
                    return (input_ids == answer_id).sum(-1) >= need[: input_ids.shape[0]]

            criteria.append(_Answers())
        out = self.base.generate(
            inputs_embeds=x, attention_mask=am, max_new_tokens=max_new_tokens, do_sample=do_sample,
            top_p=top_p if do_sample else None, temperature=temperature if do_sample else None,
            num_beams=num_beams, num_return_sequences=num_return_sequences, stopping_criteria=criteria,
            pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, top_k=None)
        texts = tok.batch_decode(out, skip_special_tokens=False)
        drop = [t for t in (tok.pad_token, tok.eos_token, tok.bos_token) if t]
        clean = []
        for t in texts:
            for d in drop:
                t = t.replace(d, "")
            clean.append(t.strip())
        k = num_return_sequences
        return [clean[i * k:(i + 1) * k] for i in range(len(prompts))]

    # ------------------------------------------------------------------ persistence
    def save(self, out_dir: str | Path, base_name: str, extra: dict | None = None) -> Path:
        """Write the adapter atomically: a temp dir renamed into place (a killed save leaves no adapter)."""
        from safetensors.torch import save_file

        from i2d2.io import atomic_dir

        out_dir = Path(out_dir)
        self.sync_new_tokens()
        with atomic_dir(out_dir) as tmp:
            self.peft.save_pretrained(tmp, save_embedding_layers=False)  # new-token rows: new_tokens.safetensors
            tensors = {"new_in": self.new_in.detach().cpu().contiguous()}
            if self.new_out is not None:
                tensors["new_out"] = self.new_out.detach().cpu().contiguous()
            save_file(tensors, str(tmp / "new_tokens.safetensors"))
            self.tok.save_pretrained(tmp)
            meta = {"base_model": base_name, "special_tokens": SPECIAL_TOKENS, "new_ids": self.new_ids_list,
                    "num_virtual_tokens": self.num_virtual_tokens, **(extra or {})}
            (tmp / "negverse.json").write_text(json.dumps(meta, indent=2))
        return out_dir

    @classmethod
    def load(cls, adapter_dir: str | Path, base_name: str | None = None, cache: str | None = None) -> "NegVerseLM":
        from peft import set_peft_model_state_dict
        from peft.utils import load_peft_weights
        from safetensors.torch import load_file

        from i2d2.io import verify_recorded
        from i2d2.models import load_causal_lm

        adapter_dir = Path(adapter_dir)
        meta_path = adapter_dir / "negverse.json"
        if not meta_path.exists():
            raise FileNotFoundError(f"{adapter_dir} is not a NegVerse adapter (no negverse.json); "
                                    f"train one with `python -m i2d2.train task=negverse`")
        verify_recorded(adapter_dir, adapter_dir.parent)  # as the train stage wrote it (a copy elsewhere: unchecked)
        meta = json.loads(meta_path.read_text())
        base, tok = load_causal_lm(base_name or meta["base_model"], cache=cache)
        m = cls(base, tok, num_virtual_tokens=meta["num_virtual_tokens"], init_text=None)
        if m.new_ids_list != meta["new_ids"]:
            raise ValueError(f"{meta_path}: special-token ids {meta['new_ids']} differ from the tokenizer's "
                             f"{m.new_ids_list}; was the adapter trained on another base model?")
        set_peft_model_state_dict(m.peft, load_peft_weights(str(adapter_dir), device="cpu"))
        rows = load_file(str(adapter_dir / "new_tokens.safetensors"))
        with torch.no_grad():
            m.new_in.copy_(rows["new_in"])
            if m.new_out is not None and "new_out" in rows:
                m.new_out.copy_(rows["new_out"])
        m.sync_new_tokens()
        m.eval()
        return m
