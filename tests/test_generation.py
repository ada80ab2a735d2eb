"""The generation stage: rows, DDP shard split (simulated and a real 2-process gloo run), resume after a kill."""

import json
import os
import socket
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from i2d2 import config  # noqa: F401  (resolvers)

ROOT = Path(__file__).resolve().parent.parent
DECODING = dict(beam_size=2, num_return=2, max_new_tokens=4, min_new_tokens=1, batch_size=4)
SHARD = 3


def _rows(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory, tiny_gpt2):
    """10 prompts (2 nouns x 3 relational phrases + 1 goal x 4 prefixes), one with a related concept."""
    from i2d2.prompts import build_generic_prompts

    d = tmp_path_factory.mktemp("prompts")
    (d / "nouns.txt").write_text("umbrella\nchild\n")
    (d / "goals.txt").write_text("bake bread\n")
    (d / "rel.txt").write_text("is\nare\ncan be\n")
    (d / "related.jsonl").write_text('{"concept": "umbrella", "related": ["rain"]}\n')
    cfg = OmegaConf.load(ROOT / "conf/data/generics.yaml")
    cfg.sources = {"nouns": {"path": str(d / "nouns.txt"), "format": "lines", "kind": "noun", "relations": "t"},
                   "related": {"path": str(d / "related.jsonl"), "format": "jsonl", "relations": "t"},
                   "goals": {"path": str(d / "goals.txt"), "format": "lines", "kind": "goal"}}
    cfg.relations = {"t": str(d / "rel.txt")}
    cfg.related_prompts = "related"  # umbrella's prompts require "rain"
    cfg.perplexity.threshold = None
    cfg.prompt_selection = "perplexity"  # the paper's rule: one lowest-perplexity variant per pair
    cfg.goal_prefixes = ["In order to", "Before you", "After you", "While you"]
    out = d / "prompts.jsonl"
    build_generic_prompts(cfg, *tiny_gpt2, out)
    assert len(_rows(out)) == 10
    return out


class RecordingTracker:
    def __init__(self):
        self.metrics, self.tables = {}, {}

    def log_metrics(self, metrics, step=None):
        self.metrics.update(metrics)

    def log_table(self, key, columns, rows, out_dir=None):
        self.tables[key] = (columns, rows, out_dir)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_gpt2, prompts_file):
    """An uninterrupted single-process run."""
    from i2d2.generation import generate_stage

    out = tmp_path_factory.mktemp("gen_ref")
    tracker = RecordingTracker()
    summary = generate_stage(*tiny_gpt2, prompts_file, out, DECODING, tracker=tracker, shard_size=SHARD)
    return out, summary, tracker


def test_generation_rows_union_and_summary(reference, prompts_file):
    out, summary, tracker = reference
    prompts = _rows(prompts_file)
    rows = _rows(out / "generations.jsonl")
    assert sorted(p.name for p in out.glob("shard-*.jsonl")) == [f"shard-{i:05d}.jsonl" for i in range(4)]
    assert rows == [r for i in range(4) for r in _rows(out / f"shard-{i:05d}.jsonl")]
    # every prompt decoded, in prompt order, at most num_return generations each, ranked
    order = [p["prompt_id"] for p in prompts]
    seen = list(dict.fromkeys(r["prompt_id"] for r in rows))
    assert seen == order
    by_prompt = {pid: [r for r in rows if r["prompt_id"] == pid] for pid in order}
    for p in prompts:
        got = by_prompt[p["prompt_id"]]
        assert 1 <= len(got) <= DECODING["num_return"]
        assert [r["rank_in_prompt"] for r in got] == list(range(len(got)))
        for r in got:
            assert r["prompt"] == p["prompt"] and r["concept"] == p["concept"] and r["template"] == p["template"]
            assert r["perplexity"] == p["perplexity"] and r["related"] == p["related"]
            n_clauses = len(p["constraints"]["clauses"]) + len(p["constraints"]["dynamic"])
            assert len(r["satisfied"]) == len(r["matched"]) == len(r["constraint_names"]) == n_clauses
            assert isinstance(r["score"], float) and isinstance(r["all_satisfied"], bool)
            if r["all_satisfied"]:
                assert all(r["satisfied"])
            for name, sat, match in zip(r["constraint_names"], r["satisfied"], r["matched"]):
                if name.startswith("related:") and sat:
                    assert match in ("rain", "rains")
    assert summary["complete"] and summary["n_prompts"] == 10 and summary["n_generations"] == len(rows)
    assert summary["constraint_satisfaction_rate"] == pytest.approx(sum(r["all_satisfied"] for r in rows) / len(rows))
    assert summary["prompts_per_s"] > 0 and summary["shards_decoded"] == 4
    assert tracker.metrics["generation/n_generations"] == len(rows)
    cols, table, folder = tracker.tables["generation/samples"]
    assert "generation" in cols and 1 <= len(table) <= 20
    assert folder == out  # W&B off: the stage's own folder, among its outputs
    assert not list(out.glob(".*tmp"))


def test_ddp_shard_split_simulated_ranks(tmp_path, tiny_gpt2, prompts_file, reference):
    from i2d2.generation import generate_stage, shard_indices

    assert shard_indices(10, 3, 0, 2) == [0, 2] and shard_indices(10, 3, 1, 2) == [1, 3]
    assert sorted(shard_indices(100, 7, 0, 3) + shard_indices(100, 7, 1, 3) + shard_indices(100, 7, 2, 3)) == \
        list(range(15))
    s1 = generate_stage(*tiny_gpt2, prompts_file, tmp_path, DECODING, shard_size=SHARD, rank=1, world_size=2)
    assert not s1["complete"] and not (tmp_path / "generations.jsonl").exists()
    assert sorted(p.name for p in tmp_path.glob("shard-*.jsonl")) == ["shard-00001.jsonl", "shard-00003.jsonl"]
    s0 = generate_stage(*tiny_gpt2, prompts_file, tmp_path, DECODING, shard_size=SHARD, rank=0, world_size=2)
    assert s0["complete"] and s0["shards_decoded"] == 2
    rank_of = {i: json.loads((tmp_path / f"shard-{i:05d}.meta.json").read_text())["rank"] for i in range(4)}
    assert rank_of == {0: 0, 1: 1, 2: 0, 3: 1}
    rows = _rows(tmp_path / "generations.jsonl")
    ids = [r["prompt_id"] for r in rows if r["rank_in_prompt"] == 0]
    assert len(ids) == len(set(ids)) == 10  # union = all prompts, no duplicates
    assert rows == _rows(reference[0] / "generations.jsonl")


def test_resume_after_simulated_kill_gives_identical_output(tmp_path, tiny_gpt2, prompts_file, reference,
                                                            monkeypatch):
    from i2d2 import decoding
    from i2d2.generation import generate_stage

    real = decoding.NeuroLogicDecoder.decode
    calls = []

    def dying(self, *a, **k):
        calls.append(1)
        if len(calls) > 2:
            raise KeyboardInterrupt("simulated kill")
        return real(self, *a, **k)

    monkeypatch.setattr(decoding.NeuroLogicDecoder, "decode", dying)
    with pytest.raises(KeyboardInterrupt):
        generate_stage(*tiny_gpt2, prompts_file, tmp_path, DECODING, shard_size=SHARD)
    done = sorted(p.name for p in tmp_path.glob("shard-*.jsonl"))
    assert done == ["shard-00000.jsonl", "shard-00001.jsonl"] and not (tmp_path / "generations.jsonl").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no half-written shard
    mtimes = {n: (tmp_path / n).stat().st_mtime_ns for n in done}

    calls.clear()
    monkeypatch.setattr(decoding.NeuroLogicDecoder, "decode",
                        lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    s = generate_stage(*tiny_gpt2, prompts_file, tmp_path, DECODING, shard_size=SHARD)
    assert len(calls) == 2 and s["shards_skipped"] == 2 and s["shards_decoded"] == 2
    assert {n: (tmp_path / n).stat().st_mtime_ns for n in done} == mtimes  # finished shards untouched
    assert (tmp_path / "generations.jsonl").read_text() == (reference[0] / "generations.jsonl").read_text()

    # a third run with the same inputs decodes nothing; a changed decoding config redoes every shard
    calls.clear()
    assert generate_stage(*tiny_gpt2, prompts_file, tmp_path, DECODING, shard_size=SHARD)["shards_decoded"] == 0
    assert not calls
    s = generate_stage(*tiny_gpt2, prompts_file, tmp_path, dict(DECODING, num_return=1), shard_size=SHARD)
    assert s["shards_decoded"] == 4 and s["n_generations"] == 10


def test_bad_inputs_name_the_problem(tmp_path, tiny_gpt2, prompts_file, monkeypatch):
    from i2d2.generation import generate_stage
    from i2d2.io import DataError

    rows = _rows(prompts_file)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows[:2] + [rows[1]]))
    with pytest.raises(DataError, match="duplicate prompt_id"):
        generate_stage(*tiny_gpt2, bad, tmp_path / "o1", DECODING)
    bad.write_text(json.dumps({"prompt_id": "x", "prompt": "A cup is"}) + "\n")
    with pytest.raises(DataError, match=r"bad.jsonl:1: missing field\(s\) constraints"):
        generate_stage(*tiny_gpt2, bad, tmp_path / "o2", DECODING)
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows[:SHARD]) + json.dumps(dict(
        rows[0], prompt_id="late", constraints={"clauses": [{"literals": [], "name": "empty clause"}]})) + "\n")
    from i2d2 import decoding

    calls, real = [], decoding.NeuroLogicDecoder.decode
    monkeypatch.setattr(decoding.NeuroLogicDecoder, "decode",
                        lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    with pytest.raises(DataError, match="prompt late: empty clause"):
        generate_stage(*tiny_gpt2, bad, tmp_path / "o4", DECODING, shard_size=SHARD)
    assert not calls  # checked before any shard is decoded
    with pytest.raises(ValueError, match="decoding config"):
        generate_stage(*tiny_gpt2, prompts_file, tmp_path / "o3", dict(DECODING, beams=3))


# ----------------------------------------------------------------------------- a real 2-process DDP run

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ddp_worker(rank, world, port, prompts, out):
    import torch
    import torch.distributed as dist

    from i2d2.generation import generate_stage
    from i2d2.models import tiny_model

    torch.set_num_threads(1)  # more threads in a forked child can deadlock OpenMP
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        model, tok = tiny_model("gpt2")
        s = generate_stage(model, tok, prompts, out, DECODING, shard_size=SHARD)  # rank/world from torch.distributed
        (Path(out) / f"summary-rank{rank}.json").write_text(json.dumps(s))
    finally:
        dist.destroy_process_group()


def test_real_two_process_gloo_run(tmp_path, prompts_file, tiny_gpt2):
    import torch
    import torch.multiprocessing as mp

    from i2d2.generation import generate_stage

    # Reference with the workers' thread count: other counts change float summation order.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        generate_stage(*tiny_gpt2, prompts_file, tmp_path / "ref", DECODING, shard_size=SHARD)
    finally:
        torch.set_num_threads(threads)

    out = tmp_path / "ddp"
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    mp.start_processes(_ddp_worker, args=(2, _free_port(), str(prompts_file), str(out)), nprocs=2,
                       start_method="fork", join=True)
    s0 = json.loads((out / "summary-rank0.json").read_text())
    s1 = json.loads((out / "summary-rank1.json").read_text())
    assert s0["complete"] and s1["complete"] and s0["shards_decoded"] == s1["shards_decoded"] == 2
    ranks = [json.loads((out / f"shard-{i:05d}.meta.json").read_text())["rank"] for i in range(4)]
    assert ranks == [0, 1, 0, 1]
    assert (out / "generations.jsonl").read_text() == (tmp_path / "ref" / "generations.jsonl").read_text()


def test_shards_of_another_decoder_revision_are_decoded_again(tmp_path, tiny_gpt2, prompts_file, monkeypatch):
    """A decoder change that alters its rows (``matched`` naming) must not leave a resumed stage mixing shards."""
    from i2d2 import decoding
    from i2d2.generation import generate_stage

    assert generate_stage(*tiny_gpt2, prompts_file, tmp_path, DECODING, shard_size=SHARD)["shards_decoded"] == 4
    assert generate_stage(*tiny_gpt2, prompts_file, tmp_path, DECODING, shard_size=SHARD)["shards_decoded"] == 0
    monkeypatch.setattr(decoding, "OUTPUT_REVISION", decoding.OUTPUT_REVISION + 1)
    assert generate_stage(*tiny_gpt2, prompts_file, tmp_path, DECODING, shard_size=SHARD)["shards_decoded"] == 4


def test_reused_generations_of_another_decoder_revision_are_named(tmp_path, tiny_gpt2, prompts_file, monkeypatch,
                                                                   caplog):
    """A finished stage is reused by its stage fingerprint, which does not name the decoder revision: the summary
    records the revision and the recipes warn (naming the folder to delete) when it is not this decoder's."""
    import logging

    from i2d2 import decoding
    from i2d2.generation import generate_stage, warn_if_older_decoder

    summary = generate_stage(*tiny_gpt2, prompts_file, tmp_path, DECODING, shard_size=SHARD)
    assert summary["decoder_output_revision"] == decoding.OUTPUT_REVISION
    with caplog.at_level(logging.WARNING, logger="i2d2.generation"):
        assert not warn_if_older_decoder(tmp_path) and not caplog.records
        monkeypatch.setattr(decoding, "OUTPUT_REVISION", decoding.OUTPUT_REVISION + 1)
        assert warn_if_older_decoder(tmp_path)
        assert f"decoder output revision {decoding.OUTPUT_REVISION - 1}" in caplog.text and str(tmp_path) in caplog.text
        # written before revisions were recorded
        s = json.loads((tmp_path / "generation_summary.json").read_text())
        s.pop("decoder_output_revision")
        (tmp_path / "generation_summary.json").write_text(json.dumps(s))
        assert warn_if_older_decoder(tmp_path) and "did not record its revision" in caplog.text
        assert not warn_if_older_decoder(tmp_path / "absent")
        caplog.clear()
        assert warn_if_older_decoder(tmp_path, stage_dir=tmp_path.parent) and f"Delete {tmp_path.parent} " in caplog.text


def test_generation_progress_reaches_the_log_not_only_the_bar(tmp_path, tiny_gpt2, prompts_file, caplog, monkeypatch):
    """A log file (Hydra's train.log) showed nothing between "N shards to decode" and the summary: the tqdm bar
    reaches a terminal only. Progress lines, one each tenth of the prompts at most, counting shards done earlier."""
    import logging
    import re

    from i2d2 import generation, progress as logged_progress

    def progress():
        return [r.getMessage() for r in caplog.records
                if r.name == "i2d2.generation" and re.search(r"\d+/\d+ prompts \(", r.getMessage())]

    with caplog.at_level(logging.INFO, logger="i2d2.generation"):
        generation.generate_stage(*tiny_gpt2, prompts_file, tmp_path / "a", DECODING, shard_size=SHARD)
    lines = progress()
    # 10 prompts in shards of 3, 3, 3, 1: every shard crosses a tenth
    assert [re.search(r"(\d+)/10 prompts", m).group(1) for m in lines] == ["3", "6", "9", "10"]
    assert "(100%)" in lines[-1] and "prompts/s" in lines[-1]
    caplog.clear()
    monkeypatch.setattr(logged_progress, "LINES", 2)  # bounded: one prompt a shard, two lines
    with caplog.at_level(logging.INFO, logger="i2d2.generation"):
        generation.generate_stage(*tiny_gpt2, prompts_file, tmp_path / "b", DECODING, shard_size=1)
    assert [re.search(r"(\d+)/10 prompts", m).group(1) for m in progress()] == ["5", "10"]
