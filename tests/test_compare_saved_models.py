"""scripts/compare_saved_models.py (the GPU checks' reload-and-compare step): equal saves compare equal, a changed
weight shows, a save of the starting weights is flagged as untrained, and a save that does not hold the model's
parameters (what an un-gathered ZeRO-3 save looks like) fails."""

import copy
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def _save(model, tok, run: Path, it: int = 0):
    d = run / f"iter_{it}" / "model"
    model.save_pretrained(d)
    tok.save_pretrained(d)


def test_compare_saved_models(tmp_path, tiny_gpt2, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import compare_saved_models as C

    model, tok = tiny_gpt2
    _save(model, tok, tmp_path / "ref")
    _save(model, tok, tmp_path / "same")
    moved = copy.deepcopy(model)
    with torch.no_grad():
        moved.transformer.h[0].mlp.c_fc.weight[0, 0] += 0.5
    _save(moved, tok, tmp_path / "moved")
    rows = C.compare([tmp_path / "ref", tmp_path / "same", tmp_path / "moved"], start="tiny:gpt2")
    ref, same, mv = rows
    assert ref["params"] == ref["params_expected"] and ref["finite"] and ref["moved_from_start"] == 0.0
    assert same["max_weight_diff_vs_ref"] == 0.0 and same["max_logprob_diff_vs_ref"] == 0.0
    assert abs(mv["max_weight_diff_vs_ref"] - 0.5) < 1e-6 and mv["moved_from_start"] > 0.49
    assert ref["trained"] is False and mv["trained"] is True  # a save of the starting weights is flagged
    assert C.main([str(tmp_path / "ref"), "--start", "tiny:gpt2"]) == 1
    assert C.main([str(tmp_path / "moved"), "--start", "tiny:gpt2", "--iteration", "0"]) == 0
    assert C.compare([tmp_path / "moved"], iteration=1) == []
    assert C.main([str(tmp_path / "moved"), str(tmp_path / "no_such_run")]) == 1  # the missing run is reported

    # a save whose tensors are empty placeholders, as ZeRO-3 partitions look when saved without gathering
    broken = copy.deepcopy(model)
    broken.transformer.h[0].mlp.c_fc.weight = torch.nn.Parameter(torch.empty(0))
    _save(broken, tok, tmp_path / "broken")
    assert C.main([str(tmp_path / "ref"), str(tmp_path / "broken")]) == 1
    assert C.main([str(tmp_path / "ref"), str(tmp_path / "same"), "--json", str(tmp_path / "c.json")]) == 0
    assert (tmp_path / "c.json").exists()
