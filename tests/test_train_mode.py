"""Every LightningModule that trains a pretrained model (the LM fine-tune, NegVerse, CMP, the fine-tuned critic)
trains it in train mode (dropout on), set before Lightning reads the modes (model summary, fit-loop check):
from_pretrained returns eval-mode models, and Lightning keeps a module's mode as it finds it."""

import warnings

import lightning as L
import pytest
import torch

from i2d2.models import load_seq2seq, tiny_model


def _fit_one_step(module, loader):
    """Fit ``module`` for one step; return whether every module was in train mode at the fit's start (where the model
    summary reads the modes), when the fit loop started and at the step, and the warnings."""
    seen = []

    class AtStart(L.Callback):  # callbacks' hooks run before the module's: the model summary reads modes here
        def on_fit_start(self, trainer, pl_module):
            seen.append(all(m.training for m in pl_module.modules()))  # BART's dropout is functional: every module

        def on_train_start(self, trainer, pl_module):
            seen.append(all(m.training for m in pl_module.modules()))

    step = module.training_step

    def spy(batch, batch_idx):
        seen.append(all(m.training for m in module.modules()))
        return step(batch, batch_idx)

    module.training_step = spy
    trainer = L.Trainer(max_steps=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        callbacks=[AtStart()])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(module, loader)
    return seen, [str(w.message) for w in caught]


def _self_imitation():
    from trainers.lm_finetune import SelfImitationDataModule, SelfImitationModule

    model, tok = tiny_model("gpt2")
    dm = SelfImitationDataModule([{"prompt": "Dogs are", "generation": "loyal animals."}] * 2, tok, batch_size=2)
    return SelfImitationModule(model, lr=1e-3, total_steps=1), dm.train_dataloader(), model


def _negverse():
    from i2d2.negverse.formatting import build_prompt, build_target
    from i2d2.negverse.masking import BLANK
    from i2d2.negverse.model import NegVerseLM
    from trainers.negverse import NegVerseModule, make_loader

    base, tok = tiny_model("gpt2")
    lm = NegVerseLM(base, tok, num_virtual_tokens=4)
    ex = {"prompt": build_prompt("She likes apples.", f"She {BLANK} apples."), "target": build_target(["does not like"])}
    return NegVerseModule(lm, total_steps=1), make_loader(tok, [ex, ex], 2, 64, False)[0], base


def _cmp():
    from i2d2.cmp.data import load_quintuples
    from i2d2.cmp.tasks import Collator, ExampleBuilder, eos_id, make_truncator, mask_token_for
    from i2d2.cmp.textualize import TemplateRealiser
    from trainers.cmp import CMPModule, MixedTaskBatches, per_task_sizes, train_loader

    model, tok = load_seq2seq("tiny:bart")
    qs = [q for q in load_quintuples() if q.category == "planet"][:4]
    b = ExampleBuilder(dict(zip([q.id for q in qs], TemplateRealiser()(qs))), mask_token_for(tok),
                       trunc=make_truncator(tok, 48))
    module = CMPModule(model, tok, Collator(tok, eos_id(model, tok), 128, 64), lr=1e-3, warmup_ratio=0.0,
                       total_steps=1, tasks=["qa"])
    ds = MixedTaskBatches(qs, b, ["qa"], per_task_sizes(2, ["qa"]), num_steps=1, seed=0)
    return module, train_loader(module, ds), model


def _critic():
    from torch.utils.data import DataLoader

    from critics.critic import CriticModule
    from critics.data import Collator, StatementDataset

    module = CriticModule(name="tiny:bert", total_steps=1)
    data = StatementDataset(["Birds can fly.", "Fish can climb trees."], [1, 0])
    return module, DataLoader(data, batch_size=2, collate_fn=Collator(module.tokenizer, 32)), module.model


@pytest.mark.parametrize("build", [_self_imitation, _negverse, _cmp, _critic],
                         ids=["i2d2-finetune", "negverse", "cmp", "critic"])
def test_pretrained_model_trains_in_train_mode(build):
    torch.manual_seed(0)
    module, loader, pretrained = build()
    pretrained.eval()  # as from_pretrained leaves it
    seen, warned = _fit_one_step(module, loader)
    assert seen == [True, True, True]
    assert not [w for w in warned if "in eval mode" in w], warned
