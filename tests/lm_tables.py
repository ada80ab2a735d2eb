"""Shared by the decoder tests: turn a model into a bigram LM whose next-token logits come from a small table, so
the text an unconstrained search wants is known."""

import torch


def bigram_lm(model, tok, rows, default):
    """Logits of the next token depend only on the last token ({prev: {next: logit}}; ``default`` after any other
    token; tokens not listed get -inf). Returns the hook handle (``.remove()`` restores the model)."""
    V = model.get_output_embeddings().weight.shape[0]  # includes added tokens, unlike config.vocab_size

    def tid(t):
        i = tok.eos_token_id if t == "EOS" else tok.convert_tokens_to_ids(t)
        assert i is not None and i != tok.unk_token_id, t
        return i

    def row(spec):
        r = torch.full((V,), float("-inf"))
        for t, v in spec.items():
            r[tid(t)] = v
        return r

    table = row(default).expand(V, V).clone()
    for prev, spec in rows.items():
        table[tid(prev)] = row(spec)

    def hook(mod, args, kwargs, out):
        out.logits = table[kwargs["input_ids"]].to(out.logits.dtype)
        return out

    return model.register_forward_hook(hook, with_kwargs=True)
