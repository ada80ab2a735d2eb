"""Regressions from an audit of the I2D2 critic (critics/train.py, surface.py, data.py; i2d2/labels.py): what the
critic reads is deduplicated and canonicalised the same way everywhere, and the invariance warning measures only
rewrites the critic can see."""

import json
import logging

import numpy as np

from critics.data import ANNOTATION_DIR, canonical_statement
from i2d2.io import read_jsonl

GEMMA = ANNOTATION_DIR / "generics_gemma.jsonl"


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_one_text_to_the_critic_is_one_row_with_its_newest_label_on_one_side(tmp_path):
    # "Generally, dogs have fur." (seed, true) and "Dogs have fur." (a newer round, false, another concept) are one
    # text once canonicalised: both were kept, under two labels, and some seeds trained one and tested the other
    from critics.data import LoadReport
    from critics.train import critic_config, labelled_splits

    seed = [{"statement": f"Generally, {c}s have {w}.", "label": "true", "concept": c}
            for c, w in [("dog", "fur"), ("cat", "claws"), ("owl", "wings"), ("fish", "fins"), ("ant", "legs")]]
    seed += [{"statement": f"A {c} is a {c}.", "label": "false", "concept": c} for c in ("dog", "cat", "owl", "fish", "ant")]
    paths = [_write(tmp_path / "seed.jsonl", seed),
             _write(tmp_path / "store.jsonl", [{"statement": "Dogs have fur.", "label": "false", "concept": "puppy"}])]
    for s in range(10):
        report = LoadReport()
        cfg = critic_config({"min_examples": 2, "dev_fraction": 0.3, "test_fraction": 0.3, "seed": s})
        rows, texts, ys, splits, _ = labelled_splits(cfg, paths, report)
        assert len(texts) == len(set(texts)) == 10 and report.duplicates == 1
        i = texts.index("Dogs have fur.")
        assert ys[i] == 0 and rows[i]["concept"] == "puppy"  # the newest label wins
        assert sorted(np.concatenate(splits).tolist()) == list(range(10))


def test_canonicalising_twice_reads_what_the_critic_was_fitted_on():
    for s in ("Generally, usually, birds can fly.", "In general, often, a bird can fly.", "Typically , birds fly."):
        once = canonical_statement(s)
        assert canonical_statement(once) == once
    assert canonical_statement("Generally, usually, birds can fly.") == "Birds can fly."


def test_probe_shift_read_leaves_out_pairs_the_critic_reads_as_one_text(caplog):
    # a canonicalising critic that moves 0.2 whenever the article changes: 3 of the 5 pairs per group are adverb
    # rewrites it never sees (0 by construction), which diluted the shift to 0.08, under the 0.1 warning
    from critics.surface import score_probes

    def article_sensitive(texts):
        return np.array([0.3 if canonical_statement(t).startswith(("A ", "An ")) else 0.5 for t in texts])

    with caplog.at_level(logging.WARNING):
        out = score_probes(article_sensitive, reads=canonical_statement)
    assert abs(out["probe_shift_read"] - 0.2) < 1e-9 and out["probe_n_pairs_read"] == 44 and "PROBE SHIFT" in caplog.text
    assert abs(out["probe_shift"] - 0.08) < 1e-9 and out["probe_n_pairs"] == 110  # the mean: every pair
    assert out["probe_shift_by_rewrite"]["generally"] == 0.0  # listed, and not in probe_shift_read
    assert score_probes(article_sensitive)["probe_n_pairs_read"] == 110  # a critic that reads the raw text: every pair


def test_surface_floor_folds_group_a_concept_however_it_is_spelled():
    # the out-of-fold train AUC groups by concept: "Dog" and "dog" are one concept (grouped_split's key), so they
    # must fall in one fold, as if spelled alike
    from critics.surface import surface_floor

    rows = [r for r in read_jsonl(GEMMA)[:600] if r["label"] != "dont_know"]
    y = np.array([int(r["label"] == "true") for r in rows])
    variant = [dict(r, concept=r["concept"].upper() if k % 2 else r["concept"]) for k, r in enumerate(rows)]
    a, b = surface_floor(rows, y, rows[:50], y[:50]), surface_floor(variant, y, rows[:50], y[:50])
    assert a["surface_auc_train"] == b["surface_auc_train"]


def test_probe_critic_scores_dev_and_test_as_the_loop_scores_them(tmp_path):
    # train_critic scored dev (δ) and test with texts it had already canonicalised, and score_loaded canonicalised
    # them again: "Generally, usually, X" was fitted as "Usually, X" but evaluated as "X"
    from critics.scoring import score_texts
    from critics.train import train_critic

    rows = read_jsonl(GEMMA)[:300]
    for r in rows:
        r["statement"] = "Generally, usually, " + canonical_statement(r["statement"])
    sub = _write(tmp_path / "labels.jsonl", rows)
    cfg = {"kind": "probe", "probe_lm": "tiny:gpt2", "probe_layer": 1, "probe_C": [0.1], "canonicalize": True,
           "complete_only": True, "min_examples": 10, "eval_batch_size": 16, "probes": False}
    train_critic(cfg, [sub], tmp_path / "critic")
    test = read_jsonl(tmp_path / "critic" / "test_scores.jsonl")
    raw = {canonical_statement(r["statement"]): r["statement"] for r in rows}  # the text read -> the generation
    again = score_texts(tmp_path / "critic" / "model", [raw[r["statement"]] for r in test], progress=False)
    np.testing.assert_allclose(again, [r["critic_score"] for r in test], atol=1e-5)
