"""NegVerse with tiny causal LMs: special tokens, loss mask, padding, prompt-tuning step, save/load, recipe."""

import pytest
import torch

from i2d2.models import tiny_model
from i2d2.negverse.formatting import ANSWER, IGNORE, SPECIAL_TOKENS, build_prompt, build_target, collate, encode
from i2d2.negverse.masking import BLANK
from i2d2.negverse.model import NegVerseLM

P1 = build_prompt("She likes apples.", f"She {BLANK} apples.")
T1 = build_target(["does not like"])
P2 = build_prompt("The cat is on the mat in the big old house today.", f"The cat {BLANK} on the {BLANK} today.")
T2 = build_target(["is not", "mat in the big old house"])


@pytest.fixture(params=["gpt2", "llama"])
def lm(request):
    base, tok = tiny_model(request.param)
    torch.manual_seed(0)
    return NegVerseLM(base, tok, num_virtual_tokens=4)


def test_special_tokens_are_single_ids_and_embeddings_resized(lm):
    tok = lm.tok
    for t in SPECIAL_TOKENS:
        ids = tok(f"a {t} b", add_special_tokens=False)["input_ids"]
        assert tok.convert_tokens_to_ids(t) in ids
    assert lm.base.get_input_embeddings().weight.shape[0] >= max(lm.new_ids_list) + 1
    # new rows start at the mean embedding of describing words, not at zeros / random
    assert lm.new_in.norm(dim=-1).min() > 0
    assert not any(p.requires_grad for p in lm.base.parameters())


def test_loss_mask_covers_only_answers_and_eos(lm):
    tok = lm.tok
    r = encode(tok, P1, T1)
    n_prompt = len(tok(P1)["input_ids"])
    assert r["labels"][:n_prompt] == [IGNORE] * n_prompt
    answer_ids = r["labels"][n_prompt:]
    assert answer_ids[-1] == tok.eos_token_id
    assert tok.decode(answer_ids[:-1]).replace(" ", "") == T1.replace(" ", "")
    assert tok.convert_tokens_to_ids(ANSWER) in answer_ids


def test_padding_uses_real_pad_token_and_masks(lm):
    tok = lm.tok
    rows = [encode(tok, P1, T1), encode(tok, P2, T2)]
    b = collate(rows, tok.pad_token_id, side="right")
    short = len(rows[0]["input_ids"])
    assert (b["input_ids"][0, short:] == tok.pad_token_id).all()
    assert b["attention_mask"][0, short:].sum() == 0 and b["attention_mask"][0, :short].all()
    assert (b["labels"][0, short:] == IGNORE).all()
    assert tok.pad_token != "!"
    left = collate(rows, tok.pad_token_id, side="left")
    assert left["attention_mask"][0, : left["input_ids"].shape[1] - short].sum() == 0


def test_padding_does_not_change_loss_or_generation(lm):
    tok = lm.tok
    r1, r2 = encode(tok, P1, T1), encode(tok, P2, T2)
    alone = lm.loss(**collate([r1], tok.pad_token_id))
    # per-example loss inside a padded batch equals the loss alone (the mean is over answer tokens)
    batch = collate([r1, r2], tok.pad_token_id)
    n1 = sum(x != IGNORE for x in r1["labels"][1:])
    n2 = sum(x != IGNORE for x in r2["labels"][1:])
    other = lm.loss(**collate([r2], tok.pad_token_id))
    assert torch.allclose(lm.loss(**batch), (alone * n1 + other * n2) / (n1 + n2), atol=1e-5)
    # greedy continuation of a left-padded prompt equals its continuation alone
    g_alone = lm.generate([P1], do_sample=False, max_new_tokens=6)
    g_batch = lm.generate([P1, P2], do_sample=False, max_new_tokens=6)
    assert g_alone[0] == g_batch[0]


def test_own_loss_matches_peft_forward(lm):
    tok = lm.tok
    b = collate([encode(tok, P1, T1), encode(tok, P2, T2)], tok.pad_token_id)
    ref = lm.peft(input_ids=b["input_ids"], attention_mask=b["attention_mask"], labels=b["labels"]).loss
    assert torch.allclose(lm.loss(**b), ref, atol=1e-5)


def test_prompt_tuning_steps_lower_the_loss_and_train_only_prompt_and_new_tokens(lm):
    tok = lm.tok
    b = collate([encode(tok, P1, T1), encode(tok, P2, T2)], tok.pad_token_id)
    frozen = {k: v.clone() for k, v in lm.base.named_parameters() if "wte" in k or "embed_tokens" in k}
    trainable = lm.trainable_state()
    assert set(trainable) == {"new_in", "peft.prompt_encoder.default.embedding.weight"} or \
        set(trainable) == {"new_in", "new_out", "peft.prompt_encoder.default.embedding.weight"}
    opt = torch.optim.AdamW(trainable.values(), lr=0.05)
    first = float(lm.loss(**b))
    for _ in range(15):
        loss = lm.loss(**b)
        loss.backward()
        opt.step()
        opt.zero_grad()
    assert float(lm.loss(**b)) < first - 0.5
    for k, v in lm.base.named_parameters():  # base rows other than the special tokens never change
        if k in frozen:
            keep = torch.ones(v.shape[0], dtype=torch.bool)
            keep[lm.new_ids] = False
            assert torch.equal(v[keep], frozen[k][keep])


def test_stopping_on_answer_count_and_save_load_roundtrip(tmp_path):
    base, tok = tiny_model("gpt2")
    lm = NegVerseLM(base, tok, num_virtual_tokens=3)
    with torch.no_grad():
        lm.prompt_weight().normal_()
        lm.new_in.add_(0.1)
    out = lm.save(tmp_path / "adapter", "tiny:gpt2")
    assert (out / "negverse.json").exists() and not list(tmp_path.glob(".adapter.*"))
    lm2 = NegVerseLM.load(out)
    assert torch.allclose(lm2.prompt_weight(), lm.prompt_weight())
    assert torch.allclose(lm2.new_in, lm.new_in)
    b = collate([encode(tok, P1, T1)], tok.pad_token_id)
    assert torch.allclose(lm2.loss(**b), lm.loss(**b), atol=1e-5)
    with pytest.raises(FileNotFoundError, match="not a NegVerse adapter"):
        NegVerseLM.load(tmp_path)


def test_recipe_end_to_end_with_tiny_model_and_resume(tmp_path):
    from negverse_setup import negverse_cfg

    from i2d2.config import setup_run
    from i2d2.recipes.negverse import run

    cfg = negverse_cfg(tmp_path, "task.train.max_steps=3", "task.train.checkpoint_every=1",
                       "task.prompt.num_virtual_tokens=2", "task.generate.num_candidates=2",
                       "task.generate.max_new_tokens=6", "task.train.val_fraction=0.3",
                       "+trainer.enable_progress_bar=false", "+trainer.enable_model_summary=false", logger="csv")
    setup_run(cfg)
    out = run(cfg)
    assert out["data"]["n_pairs"] >= 4 and out["data"]["n_rule_pairs"] >= 1
    assert out["train"]["steps"] == 3
    run_dir = tmp_path / "run"
    assert (run_dir / "train" / "adapter" / "negverse.json").exists()
    assert (run_dir / "train" / "checkpoints" / "last.ckpt").exists()
    from i2d2.io import load_state_dict

    assert set(load_state_dict(run_dir / "train" / "checkpoints" / "last.ckpt")) <= {"lm.new_in", "lm.new_out", "lm.peft.prompt_encoder.default.embedding.weight"}
    assert out["eval"]["n_candidates"] > 0 and (run_dir / "eval" / "metrics.json").exists()
    # a second run reuses every finished stage; so does one that changes only generation-time masking or the
    # checkpoint cadence (neither changes the training pairs or what the prompt learns): only evaluation is redone
    from omegaconf import open_dict

    adapter_mtime = (run_dir / "train" / "adapter" / "negverse.json").stat().st_mtime_ns
    again = run(cfg)
    assert again["train"] == out["train"]
    with open_dict(cfg):
        cfg.task.masking.max_variants = 3
        cfg.task.train.checkpoint_every = 2
    assert run(cfg)["train"] == out["train"]
    assert (run_dir / "train" / "adapter" / "negverse.json").stat().st_mtime_ns == adapter_mtime
    with open_dict(cfg):
        cfg.task.masking.max_variants = 6
        cfg.task.train.checkpoint_every = 1
    # a killed training resumes from its last checkpoint: 3 steps done, budget 5 -> 2 more steps
    import shutil

    from i2d2.recipes.negverse import train_stage

    resume = tmp_path / "resume"
    shutil.copytree(run_dir / "train" / "checkpoints", resume / "checkpoints")
    with open_dict(cfg):
        cfg.task.train.max_steps = 5
    summary = train_stage(cfg, run_dir / "data", resume, None)
    assert summary["steps"] == 5 and summary["steps_this_session"] == 2
