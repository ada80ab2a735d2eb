"""Stage I/O: atomic writes, readers that name file:line, fingerprints and stage skipping."""

import json
from pathlib import Path

import numpy as np
import pytest

from i2d2 import io
from i2d2.metrics import chapman_estimate, entropy
from i2d2.perplexity import perplexity, sequence_nll


def test_read_jsonl_names_file_and_line(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_text('{"statement": "x", "label": "true"}\n\nnot json\n{"label": "false"}\n')
    with pytest.raises(io.DataError, match=r"a.jsonl:3:"):
        io.read_jsonl(p, required=["statement"])
    errors = []
    rows = io.read_jsonl(p, required=["statement"], on_error="skip", errors=errors)
    assert rows == [{"statement": "x", "label": "true"}]
    assert errors[0].endswith("a.jsonl:3: Expecting value: line 1 column 1 (char 0)")
    assert "a.jsonl:4: missing field(s) statement" in errors[1]


def test_atomic_write_keeps_old_file_on_failure(tmp_path):
    p = tmp_path / "out.jsonl"
    io.write_jsonl(p, [{"a": 1}])

    def rows():
        yield {"a": 2}
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        io.write_jsonl(p, rows())
    assert io.read_jsonl(p) == [{"a": 1}]
    assert [q.name for q in tmp_path.iterdir()] == ["out.jsonl"]


def test_run_stage_skips_finished_and_redoes_changed(tmp_path):
    calls = []

    def fn(out):
        calls.append(out)
        (out / "x.txt").write_text(str(len(calls)))
        return {"n": len(calls)}

    src = tmp_path / "in.txt"
    src.write_text("v1")
    out = tmp_path / "stage"
    assert io.run_stage(out, io.fingerprint({"k": 1}, src), fn) == {"n": 1}
    assert io.run_stage(out, io.fingerprint({"k": 1}, src), fn) == {"n": 1}  # skipped
    assert len(calls) == 1
    src.write_text("v2")  # input changed: redo from scratch
    assert io.run_stage(out, io.fingerprint({"k": 1}, src), fn) == {"n": 2}
    assert (out / "x.txt").read_text() == "2"


def test_interrupted_stage_is_resumed_not_wiped(tmp_path):
    out = tmp_path / "stage"
    fp = io.fingerprint({"k": 1})

    def dies(o):
        (o / "unit-0.done").write_text("ok")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        io.run_stage(out, fp, dies)
    seen = []
    io.run_stage(out, fp, lambda o: seen.append(sorted(p.name for p in o.glob("unit-*"))))
    assert seen == [["unit-0.done"]]


def test_perplexity_is_batch_invariant_and_prefix_aware(tiny_gpt2):
    model, tok = tiny_gpt2
    texts = ["a bicycle can carry a rider", "dogs bark", "the sun rises in the east and sets in the west"]
    p1 = perplexity(model, tok, texts, batch_size=1, per="token")
    p3 = perplexity(model, tok, texts, batch_size=3, per="token")
    np.testing.assert_allclose(p1, p3, rtol=1e-4)
    # NLL(prefix + continuation) = NLL(prefix) + NLL(continuation | prefix)
    full, n_full = sequence_nll(model, tok, ["the sun rises in the east"])
    pre, n_pre = sequence_nll(model, tok, ["the sun rises"])
    cont, n_cont = sequence_nll(model, tok, ["the sun rises in the east"], prefixes=["the sun rises"])
    assert n_cont[0] == n_full[0] - n_pre[0] and n_cont[0] > 0
    np.testing.assert_allclose(full, pre + cont, rtol=1e-4)


def test_chapman_and_entropy():
    assert chapman_estimate(["a", "b", "c"], ["b", "c", "d"]) == pytest.approx(4 * 4 / 3 - 1)
    assert entropy(["x", "y"]) == pytest.approx(1.0)
    assert entropy(["x", "x"]) == 0.0


def test_load_state_dict_refuses_pickled_code(tmp_path):
    import argparse

    import pytest
    import torch

    from i2d2.io import DataError, load_state_dict

    torch.save({"state_dict": {"w": torch.ones(2)}, "epoch": 3}, tmp_path / "ok.ckpt")
    assert torch.equal(load_state_dict(tmp_path / "ok.ckpt")["w"], torch.ones(2))
    torch.save({"state_dict": {}, "obj": argparse.Namespace(a=1)}, tmp_path / "bad.ckpt")  # needs unpickling code
    with pytest.raises(DataError, match="bad.ckpt: not a loadable weights-only checkpoint"):
        load_state_dict(tmp_path / "bad.ckpt")
    (tmp_path / "cut.ckpt").write_bytes((tmp_path / "ok.ckpt").read_bytes()[:40])
    with pytest.raises(DataError, match="cut.ckpt"):
        load_state_dict(tmp_path / "cut.ckpt")
