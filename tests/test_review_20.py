"""Review of the day's change (6eb8fd9..): the recall cut's δ between adjacent scores and the comparatives critic's
fingerprint after the split by entity."""

import numpy as np
import pytest

from critics.metrics import choose_delta, cut_at_recall, precision_at_recall, precision_recall_at


def test_a_cut_between_adjacent_float64_scores_keeps_the_rows_it_chose():
    # float64 P(valid) near 1 (a scikit-learn classifier's predict_proba): the midpoint of two adjacent floats rounds
    # onto the higher one, and ``score > δ`` then kept nothing (precision None) although the cut chose the top row
    hi, lo = 1.0, float(np.nextafter(1.0, 0.0))
    y, s = [1, 0, 1, 0], [hi, lo, 0.5, 0.2]
    cut = cut_at_recall(y, s, 0.5)
    assert lo <= cut < hi
    assert precision_recall_at(y, s, cut) == (1.0, 0.5, 1)
    assert precision_recall_at(y, s, cut)[0] == precision_at_recall(y, s, 0.5)
    d = choose_delta(y, s, 0.9)
    assert (d["precision"], d["recall"], d["n_kept"], d["reached"]) == (1.0, 0.5, 1, True)
    # scores apart by more than a rounding step still get the midpoint
    assert cut_at_recall([1, 0], [0.9, 0.5], 0.5) == pytest.approx(0.7)


def test_a_comparatives_critic_split_by_pair_alone_is_not_reused():
    """The split changed (pairs sharing an entity are one group) but the critic stage's fingerprint did not: a run
    from before reused its critic, split by pair alone (55 of the bundled 149 test statements about an entity it
    trained on), under a report that now says its test entities were never seen (the cross-encoder's cache key was
    bumped for the same change)."""
    from hydra import compose, initialize_config_dir

    from critics.train import fingerprint_view
    from i2d2.config import CONF_DIR
    from i2d2.io import fingerprint
    from i2d2.recipes.comparatives import _plain, annotation_paths, critic_cfg, critic_fingerprint

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["task=comparatives"])
    ccfg, paths = critic_cfg(cfg), annotation_paths(cfg)
    before = fingerprint(fingerprint_view(ccfg), *paths, _plain(cfg.trainer))  # the stage's key before the change
    now = critic_fingerprint(cfg, ccfg, paths, False, None)
    assert now != before
    assert now == critic_fingerprint(cfg, ccfg, paths, False, None)  # still a function of the inputs alone
    assert critic_fingerprint(cfg, ccfg, paths, True, None) != now
