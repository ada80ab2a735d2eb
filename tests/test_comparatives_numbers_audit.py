"""Regressions from an audit of the numbers the NeuroComparatives recipe reports (the discriminator's splits, its
cuts' test precision, what the tracker gets)."""

from pathlib import Path

import numpy as np
import pytest


# ----------------------------------------------------------------------------- splits grouped by entity pair

def _pair_rows(n_pairs: int = 20, per_order: int = 3):
    """Every entity pair in both orders (``data.both_orders``), each order with its own statements."""
    concepts, ys = [], []
    for p in range(n_pairs):
        for a, b in ((f"thing{p}a", f"thing{p}b"), (f"thing{p}b", f"thing{p}a")):
            for k in range(per_order):
                concepts.append(f"{a} | {b}")
                ys.append((p + k) % 2)
    return concepts, np.array(ys)


def test_an_entity_pair_in_either_order_sits_on_one_side_of_the_critic_split():
    from critics.data import grouped_split3

    concepts, ys = _pair_rows()
    unordered = [frozenset(c.split(" | ")) for c in concepts]
    for seed in range(3):
        sides = grouped_split3(concepts, ys, 0.15, 0.2, seed)
        where = {}
        for side, idx in enumerate(sides):
            for i in idx:
                where.setdefault(unordered[i], set()).add(side)
        split_apart = [sorted(p) for p, s in where.items() if len(s) > 1]
        assert not split_apart, f"seed {seed}: pairs trained in one order and tested in the other: {split_apart}"


def test_the_bundled_comparatives_split_is_the_one_the_readme_measured():
    """Pairs that share an entity sit on one side (``split_groups`` joins them): the README's 165 test statements of
    23 pairs, 0.448 valid, and no test entity in train or dev (the split by pair alone had 55 of 149 test
    statements about an entity with training pairs)."""
    from hydra import compose, initialize_config_dir

    from critics.train import critic_config, labelled_splits
    from i2d2.config import CONF_DIR
    from i2d2.recipes.comparatives import SEED_ANNOTATIONS, critic_cfg

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["task=comparatives"])
    rows, _, ys, (train, dev, test), _ = labelled_splits(critic_config(critic_cfg(cfg)), [SEED_ANNOTATIONS])
    assert (len(train), len(dev), len(test)) == (451, 92, 165)
    assert len({rows[i]["concept"] for i in test}) == 23 and round(float(ys[test].mean()), 3) == 0.448
    entities = [{e.strip().lower() for i in side for e in rows[i]["concept"].split("|")} for side in (train, dev, test)]
    assert not (entities[0] & entities[1] or entities[0] & entities[2] or entities[1] & entities[2])


def test_pairs_sharing_an_entity_are_one_split_group():
    from critics.data import split_groups

    concepts = ["tulip | daffodil", "Rose | Daffodil", "oak | pine", "daffodil | tulip", "pine | birch", "lily",
                "rose | lily", "fern"]
    g = split_groups(concepts)
    # tulip-daffodil-rose-lily are one component, oak-pine-birch another; each group keeps its first concept's key
    assert g == ["tulip | daffodil"] * 2 + ["oak | pine", "tulip | daffodil", "oak | pine"] + ["tulip | daffodil"] * 2 \
        + ["fern"]
    # concepts that share nothing keep their own keys, so a generics label set splits as it did
    assert split_groups(["Dog", "dog", "cat"]) == ["dog", "dog", "cat"]


def test_surface_floor_out_of_fold_auc_holds_out_both_orders_of_a_pair():
    """surface_auc_train is out-of-fold so that a cue found only in training labels shows as a train/test gap. With
    a pair's two orders in different folds, each order's label was read off the other's (a pair-specific cue,
    here its relation word) and the floor looked near-perfect on train."""
    from critics.surface import surface_floor

    concepts, ys = _pair_rows(n_pairs=20, per_order=2)
    # the label is the pair's (both orders agree), and only the pair's own relation word tells it
    ys = np.array([int(c.split(" | ")[0][-2] in "02468") for c in concepts])
    rows = [{"statement": "Compared to x, y are z.", "concept": c, "relation": "".join(sorted(c.split(" | ")))}
            for c in concepts]
    test_rows = rows[:4]
    out = surface_floor(rows, ys, test_rows, ys[:4], seed=0)
    assert out["surface_auc_train_in_sample"] > 0.95  # the cue is there
    assert out["surface_auc_train"] < 0.75, out["surface_auc_train"]  # but never about a held-out pair


# ----------------------------------------------------------------------------- a cut's precision on test rows

def test_cut_precision_on_test_does_not_depend_on_the_order_of_tied_scores():
    from critics.metrics import precision_at_top

    # a critic whose float32 P(valid) saturates: six rows tie at 1.0, three of them valid; the top 20 % is 2 rows
    y = np.array([0, 0, 0, 1, 1, 1, 0, 1, 0, 0])
    s = np.array([1.0] * 6 + [0.4, 0.3, 0.2, 0.1])
    values = {precision_at_top(y[p], s[p], 0.2) for p in (np.arange(10), np.r_[3, 4, 5, 0, 1, 2, 6, 7, 8, 9])}
    assert values == {(0.5, 2)}  # the tie's share valid, whichever order the file lists it in
    # the rows above the tie count in full, the tie fills the rest at its mean
    y2, s2 = np.array([1, 0, 0, 1, 0]), np.array([0.9, 0.5, 0.5, 0.5, 0.1])
    assert precision_at_top(y2, s2, 0.4) == (pytest.approx((1 + 1 / 3) / 2), 2)
    # without ties nothing changes: the top rows' share valid
    assert precision_at_top(np.array([1, 0, 1, 0]), np.array([0.9, 0.8, 0.7, 0.6]), 0.5) == (0.5, 2)


def _run_discriminator(tmp_path, monkeypatch):
    """discriminator_stage on 5 statements with a stand-in critic whose 10 test rows rank best first, every second
    one valid (5 valid): (its return value, the metrics the tracker got)."""
    import critics.scoring
    import critics.train
    from hydra import compose, initialize_config_dir

    from i2d2.config import CONF_DIR
    from i2d2.io import write_jsonl
    from i2d2.recipes.comparatives import discriminator_stage

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["task=comparatives", "experiment=smoke", "logger=csv",
                                          f"run_dir={tmp_path}"])
    test_rows = [{"statement": f"s{i}", "concept": f"a{i} | b{i}", "label": "True", "y": i % 2,
                  "critic_score": 1.0 - i / 10} for i in range(10)]

    def fake_train_critic(ccfg, paths, out_dir, trainer_cfg=None, tracker=None, lm=None, keys=None,
                          delta_applied=True):
        (Path(out_dir) / "model").mkdir(parents=True, exist_ok=True)
        write_jsonl(Path(out_dir) / "test_scores.jsonl", test_rows)
        summary = {"model_dir": str(Path(out_dir) / "model"), "ap": 0.5, "n_test": 10, "test_valid_rate": 0.5,
                   "delta": 0.7, "precision": 0.75, "recall": 0.5, "n_kept_test": 4, "dev_precision": 0.8}
        critics.train.log_critic_metrics(tracker, summary, delta_applied)  # as train_critic logs them
        return summary

    monkeypatch.setattr(critics.train, "train_critic", fake_train_critic)
    monkeypatch.setattr(critics.scoring, "score_texts", lambda model, texts, **kw: np.linspace(1, 0, len(texts)))
    in_path = tmp_path / "kept.jsonl"
    write_jsonl(in_path, [{"statement": f"c{i}", "pair_id": "x | y", "text": f"c{i}"} for i in range(5)])

    class Recorder:
        logger = None

        def __init__(self):
            self.metrics = {}

        def log_metrics(self, m, step=None):
            self.metrics.update(m)

    tracker = Recorder()
    out = discriminator_stage(cfg, in_path, tmp_path / "critic", tmp_path / "discriminator", tracker)
    return out, tracker.metrics


def test_discriminator_stage_logs_each_cut_precision_with_its_n_kept(tmp_path, monkeypatch):
    """The tracker got critic/test_precision_<cut> alone: a precision without the rows it was measured on."""
    out, logged = _run_discriminator(tmp_path, monkeypatch)
    cuts = out["critic"]["cuts_test"]
    assert {n: c["n_kept"] for n, c in cuts.items()} == {"nc_xl": 10, "nc_l": 5, "nc_s": 2}
    for name, c in cuts.items():
        assert logged[f"critic/test_precision_{name}"] == c["precision"]
        assert logged[f"critic/test_n_kept_{name}"] == c["n_kept"]


def test_each_cut_precision_comes_with_its_recall_and_fraction_on_test(tmp_path, monkeypatch):
    """A cut's test precision came with its row count only: NC-S's 0.500 on 2 rows did not say that it keeps 1 of the
    5 valid test statements. Its recall (share of the test's valid statements kept) goes beside it, in the run's
    record, the tracker and the report, with the fraction the cut takes of the test statements and the source."""
    from i2d2.recipes.comparatives import _discriminator_lines

    out, logged = _run_discriminator(tmp_path, monkeypatch)
    cuts = out["critic"]["cuts_test"]
    # rows best first with labels 0 1 0 1 0 1 0 1 0 1: top 2 hold 1 valid, top 5 hold 2, all 10 hold 5
    assert {n: (c["precision"], c["recall"], c["fraction"]) for n, c in cuts.items()} == {
        "nc_xl": (0.5, 1.0, 1.0), "nc_l": (0.4, 0.4, 0.5), "nc_s": (0.5, 0.2, 0.2)}
    assert all(logged[f"critic/test_recall_{n}"] == c["recall"] for n, c in cuts.items())
    assert "test" in out["critic"]["sources"]["cuts_test"] and "fraction" in out["critic"]["sources"]["cuts_test"]
    assert "never applied" in out["critic"]["sources"]["delta (here)"]  # the critic's δ cut is not a cut of this task
    md = "\n".join(_discriminator_lines(out["critic"]))
    assert ("| precision of the nc_s cut on test, its best-scored 20 % of them (kept; recall; 95 % interval) "
            "| 0.500 (2; recall 0.200; ") in md


def test_each_cut_is_also_measured_on_test_at_the_score_it_stops_at_on_the_run(tmp_path, monkeypatch):
    """The test precision of a cut was that of the best-scored fraction of the test rows, which says how the critic
    ranks them, not what the kept set's rule keeps: the run's NC-S stops at some score of its own statements, and the
    test rows at or above that score are what that rule keeps of labelled statements (no label set the threshold)."""
    from i2d2.recipes.comparatives import _discriminator_lines

    out, logged = _run_discriminator(tmp_path, monkeypatch)
    cuts = out["critic"]["cuts_test"]
    # the run's 5 statements score 1, .75, .5, .25, 0: nc_s keeps ceil(.2 * 5) = 1 (stops at 1.0), nc_l 3 (at 0.5),
    # nc_xl all 5 (at 0.0); the test rows score 1, .9, ..., .1 with labels 0 1 0 1 0 1 0 1 0 1
    at = {n: c["at_run_threshold"] for n, c in cuts.items()}
    assert {n: (t["threshold"], t["n_kept"]) for n, t in at.items()} == {
        "nc_s": (1.0, 1), "nc_l": (0.5, 6), "nc_xl": (0.0, 10)}
    assert (at["nc_s"]["precision"], at["nc_s"]["recall"]) == (0.0, 0.0)
    assert (at["nc_l"]["precision"], at["nc_l"]["recall"]) == (pytest.approx(3 / 6), pytest.approx(3 / 5))
    assert logged["critic/test_at_run_threshold_n_kept_nc_l"] == 6
    assert "threshold" in out["critic"]["sources"]["cuts_test.*.at_run_threshold"]
    md = "\n".join(_discriminator_lines(out["critic"]))
    assert ("| precision on test at the nc_l cut's threshold on this run's statements (score ≥ 0.500; kept; recall) "
            "| 0.500 (6; recall 0.600) |") in md


def test_the_critics_numbers_are_logged_named_by_their_split_and_not_the_unused_cut_at_delta(tmp_path, monkeypatch):
    """critic/ap was the test AP beside critic/dev_ap, and critic/precision the test precision at a δ this task never
    applies (it keeps fractions): W&B showed neither which split nor that the cut was unused."""
    _, logged = _run_discriminator(tmp_path, monkeypatch)
    assert logged["critic/test_ap"] == 0.5 and logged["critic/n_test"] == 10 and "critic/ap" not in logged
    assert not {"critic/delta", "critic/precision", "critic/test_precision", "critic/recall", "critic/test_recall",
                "critic/n_kept_test", "critic/test_n_kept", "critic/dev_precision"} & set(logged)
