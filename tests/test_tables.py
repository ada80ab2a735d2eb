"""Stage tables in Arrow: generation shards -> memory-mapped table; the filter over it; JSONL as the export."""

from __future__ import annotations

import json

import numpy as np
import pytest

from i2d2.io import DataError, read_jsonl, read_table, save_table, write_arrow
from i2d2.recipes.generics import _cap_per_group, filter_generations

FCFG = {"truncate": "sentence", "require_sentence_end": True, "require_constraints": True, "dedupe": True,
        "near_duplicate_ratio": 90, "max_per_concept": 2}


def _row(i, concept, generation, ok=True):
    return {"prompt_id": f"p{i // 2}", "prompt": f"{concept.capitalize()}s", "generation": generation,
            "rank_in_prompt": i % 2, "all_satisfied": ok, "matched": [None], "concept": concept, "related": None}


ROWS = [
    _row(0, "dog", "bark loudly. And more"),     # truncated, kept
    _row(1, "dog", "bark loudly!"),              # near-duplicate of row 0 (lower score)
    _row(2, "dog", "have four legs"),            # unfinished (no sentence end)
    _row(3, "dog", "chase cats."),               # below δ
    _row(4, "cat", "."),                          # kept: "Cats ." has a statement
    _row(5, "cat", "purr when happy.", ok=False),  # constraint violated
    _row(6, "cat", "sleep a lot."),              # kept
    _row(7, "cat", "like fish."),                # over the per-concept cap of 2
    _row(8, "cat", "eat fish, mice, birds and mice."),  # a list that names an item twice
]
SCORES = {"Dogs bark loudly.": 0.9, "Dogs bark loudly!": 0.8, "Dogs chase cats.": 0.1, "Cats .": 0.95,
          "Cats purr when happy.": 0.9, "Cats sleep a lot.": 0.85, "Cats like fish.": 0.7,
          "Cats eat fish, mice, birds and mice.": 0.99}


def _gens(tmp_path, rows=ROWS):
    write_arrow(tmp_path / "generations" / "table" / "shard-00000.arrow", rows[:3])
    write_arrow(tmp_path / "generations" / "table" / "shard-00001.arrow", rows[3:])
    return tmp_path / "generations"


def _score(texts):
    return np.array([SCORES[t] for t in texts])


@pytest.mark.parametrize("num_proc", [None, 2])
def test_filter_over_arrow_table(tmp_path, num_proc):
    out = tmp_path / "filtered"
    out.mkdir()
    summary, kept, dropped = filter_generations(_gens(tmp_path), out, _score, 0.5, FCFG, num_proc=num_proc)
    assert kept.cache_files and all(f["filename"].startswith(str(out)) for f in kept.cache_files)  # memory-mapped
    assert kept["statement"] == ["Dogs bark loudly.", "Cats .", "Cats sleep a lot."]
    assert kept["generation_raw"] == ["bark loudly. And more", None, None]
    reasons = dict(zip(dropped["statement"], dropped["drop_reason"]))
    assert reasons == {"Dogs bark loudly!": "duplicate", "Dogs have four legs": "unfinished",
                       "Dogs chase cats.": "critic", "Cats purr when happy.": "constraints",
                       "Cats like fish.": "concept_cap", "Cats eat fish, mice, birds and mice.": "repeated_item"}
    dup = dropped.filter(lambda r: r["drop_reason"] == "duplicate")
    assert dup["duplicate_of"] == ["Dogs bark loudly."]
    assert dropped.filter(lambda r: r["drop_reason"] == "unfinished")["critic_score"] == [None]
    assert summary["n_kept"] == 3 and summary["n_in"] == 9 and summary["n_dropped_unfinished"] == 1
    assert summary["n_truncated"] == 1 and summary["n_dropped_duplicates"] == 1
    assert summary["n_dropped_constraints"] == 1 and summary["n_dropped_concept_cap"] == 1
    assert summary["n_dropped_repeated_items"] == 1
    assert summary["accepted_rate"] == 7 / 9  # critic > δ and not empty, before constraints/dedupe/cap
    # the readable export is the kept table, row for row; the scores table covers every scored row
    assert read_jsonl(out / "kept.jsonl") == kept.to_list()
    assert len(read_table(out / "scores")) == 8 and not (out / ".work").exists()


def test_tables_reject_bad_input(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="not a stage table"):
        read_table(tmp_path / "empty")
    save_table(tmp_path / "t", __import__("pyarrow").Table.from_pylist([{"a": 1}]))
    with pytest.raises(DataError, match=r"lacks column\(s\) \['b'\]"):
        read_table(tmp_path / "t", columns=["a", "b"])


def test_an_empty_table_saves_and_reads_back(tmp_path):
    # datasets 4.x saves zero rows as zero shards and then cannot load them (a filter that keeps nothing)
    import pyarrow as pa

    save_table(tmp_path / "t", pa.table({"statement": pa.array([], pa.string()), "score": pa.array([], pa.float64())}))
    t = read_table(tmp_path / "t", columns=["statement", "score"])
    assert len(t) == 0 and t.column_names == ["statement", "score"]


def test_a_filter_that_keeps_or_drops_nothing_writes_readable_tables(tmp_path):
    for delta, n_kept in ((2.0, 0), (-1.0, None)):  # everything below δ / nothing dropped by a permissive filter
        out = tmp_path / f"filtered_{delta}"
        out.mkdir()
        cfg = {**FCFG, "dedupe": False, "dedupe_by_content": False, "max_per_concept": None, "require_constraints": False,
               "require_sentence_end": False, "drop_repeated_items": False}
        summary, kept, dropped = filter_generations(_gens(tmp_path), out, lambda t: np.array([SCORES.get(x, 0.5) for x in t]),
                                                    delta, cfg)
        assert len(read_table(out / "kept")) == summary["n_kept"] and len(read_table(out / "dropped")) == summary["n_dropped"]
        if n_kept is not None:
            assert summary["n_kept"] == n_kept
    assert summary["n_dropped"] == 0  # the permissive filter drops nothing: an empty dropped table


def test_shards_with_all_null_fields_concatenate(tmp_path):
    write_arrow(tmp_path / "shard-00000.arrow", [{"a": None, "m": []}])
    write_arrow(tmp_path / "shard-00001.arrow", [{"a": "x", "m": ["y", None]}])
    assert read_table(tmp_path).to_list() == [{"a": None, "m": []}, {"a": "x", "m": ["y", None]}]


def test_cap_per_group_keeps_best_per_concept():
    keep = _cap_per_group(np.array([0.1, 0.9, 0.5, 0.7, 0.7]), np.array([0, 0, 0, 1, 1]), 2)
    assert keep.tolist() == [False, True, True, True, True]


def test_frame_cap_keeps_the_best_fillings_of_one_template_across_concepts(tmp_path):
    from i2d2.filtering import frame_key

    assert frame_key("Chairs can be made of wood, metal, plastic, etc.", "chair") == \
        frame_key("A bed may be made of wood, plastic, metal.", "bed")
    assert frame_key("A kitchen knife is used to cut food.", "kitchen knife") != \
        frame_key("Scissors are used to cut paper.", "scissors")
    rows = [_row(0, "chair", "can be made of wood, metal, plastic, etc."), _row(1, "bed", "may be made of wood, plastic, metal."),
            _row(2, "lamp", "can be made of plastic, wood, metal."), _row(3, "lamp", "can light up a room."),
            _row(4, "table", "can be made of wood.")]
    scores = {"Chairs can be made of wood, metal, plastic, etc.": 0.8, "Beds may be made of wood, plastic, metal.": 0.9,
              "Lamps can be made of plastic, wood, metal.": 0.85, "Lamps can light up a room.": 0.7,
              "Tables can be made of wood.": 0.6}
    (tmp_path / "filtered").mkdir()
    summary, kept, dropped = filter_generations(_gens(tmp_path, rows), tmp_path / "filtered",
                                                lambda t: np.array([scores[x] for x in t]), 0.5,
                                                {**FCFG, "max_per_frame": 2})
    assert dict(zip(dropped["statement"], dropped["drop_reason"])) == {
        "Chairs can be made of wood, metal, plastic, etc.": "frame_cap"}  # the lowest-scored of three fillings
    assert summary["n_dropped_frame_cap"] == 1 and summary["n_kept"] == 4


def test_generation_table_matches_export(tmp_path):
    from i2d2.generation import generations_table

    gens = _gens(tmp_path)
    (gens / "generations.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    assert generations_table(gens).to_list() == read_jsonl(gens / "generations.jsonl")


def test_annotate_exports_from_a_table_folder(tmp_path):
    from i2d2.annotate import main

    out = tmp_path / "filtered"
    out.mkdir()
    filter_generations(_gens(tmp_path), out, _score, 0.5, FCFG)
    assert main(["export", "--input", str(out / "kept.jsonl"), "--input", str(out / "dropped"),
                 "--out", str(tmp_path / "s.jsonl"), "--k", "10"]) == 0
    got = {r["statement"] for r in read_jsonl(tmp_path / "s.jsonl")}
    assert "Dogs chase cats." in got and "Cats sleep a lot." in got  # rows from both inputs


def test_the_filter_refuses_a_nan_delta(tmp_path):
    write_arrow(tmp_path / "generations" / "table" / "shard-00000.arrow",
                [{"prompt_id": "p0", "prompt": "Dogs", "generation": "bark.", "rank_in_prompt": 0, "concept": "dog"}])
    (tmp_path / "out").mkdir()
    with pytest.raises(ValueError, match="δ is NaN"):
        filter_generations(tmp_path / "generations", tmp_path / "out", lambda t: np.full(len(t), 0.9), float("nan"), {})
