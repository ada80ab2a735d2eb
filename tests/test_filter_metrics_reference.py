"""The filter's and the metrics' functions against slow, obviously-correct references, on random and edge inputs."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from critics.metrics import (average_precision, choose_delta, cut_at_recall, precision_at_recall,  # noqa: E402
                             precision_at_top, precision_recall_at)
from i2d2.filtering import dedupe_key, near_duplicates, threshold_filter  # noqa: E402
from i2d2.metrics import chapman_estimate, entropy, self_bleu, wilson_interval  # noqa: E402
from i2d2.recipes.generics import _cap_per_group  # noqa: E402

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# scores drawn from a few values so that ties are common
scores_st = st.lists(st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.5000001, 0.75, 0.9, 1.0]), min_size=1, max_size=12)


def labelled(draw_scores=scores_st):
    return draw_scores.flatmap(lambda s: st.tuples(st.just(s), st.lists(st.booleans(), min_size=len(s),
                                                                        max_size=len(s))))


def _cuts_ref(y, s):
    """Every cut ``score >= v`` over the distinct scores v, highest first: (v, tp, n_kept) in exact integers."""
    return [(v, sum(yi for yi, si in zip(y, s) if si >= v), sum(si >= v for si in s)) for v in sorted(set(s), reverse=True)]


# ---------------------------------------------------------------------------------------------- critics/metrics.py
@FAST
@given(labelled(), st.sampled_from([-1.0, 0.0, 0.3, 0.5, 0.5000001, 0.99, 1.0]))
def test_precision_recall_at_matches_counting(ys, delta):
    s, y = ys
    kept = [yi for yi, si in zip(y, s) if si > delta]
    p, r, n = precision_recall_at(y, s, delta)
    assert n == len(kept)
    assert p == (sum(kept) / len(kept) if kept else None)
    assert r == (sum(kept) / sum(y) if any(y) else None)


@FAST
@given(labelled(), st.sampled_from([0.0, 0.5, 0.6, 0.8, 1.0]))
def test_choose_delta_is_the_most_recall_at_the_target_precision(ys, target):
    s, y = ys
    cuts = _cuts_ref(y, s)
    ok = [c for c in cuts if Fraction(c[1], c[2]) >= Fraction(target).limit_denominator(1000)]
    if ok:  # most recall, then fewest rows kept
        v, tp, n = max(ok, key=lambda c: (c[1], -c[2]))
    else:  # the most precise cut, the highest among equals
        v, tp, n = max(cuts, key=lambda c: (Fraction(c[1], c[2]), c[0]))
    got = choose_delta(y, s, target)
    assert got["reached"] == bool(ok)
    assert [si > got["delta"] for si in s] == [si >= v for si in s]  # δ keeps exactly the chosen cut
    assert got["n_kept"] == n and got["precision"] == tp / n
    assert got["recall"] == (tp / sum(y) if any(y) else None)


@FAST
@given(labelled(), st.sampled_from([0.0, 0.3, 0.5, 0.8, 1.0]))
def test_cut_at_recall_and_precision_at_recall(ys, min_recall):
    s, y = ys
    if not any(y):
        assert cut_at_recall(y, s, min_recall) is None and precision_at_recall(y, s, min_recall) is None
        return
    cuts = [c for c in _cuts_ref(y, s) if Fraction(c[1], sum(y)) >= Fraction(min_recall).limit_denominator(1000)]
    v, tp, n = max(cuts, key=lambda c: (Fraction(c[1], c[2]), c[0]))  # best precision, the highest cut among equals
    assert precision_at_recall(y, s, min_recall) == tp / n
    delta = cut_at_recall(y, s, min_recall)
    assert [si > delta for si in s] == [si >= v for si in s]


@FAST
@given(labelled(), st.sampled_from([0.01, 0.2, 0.5, 0.7, 1.0]))
def test_precision_at_top_is_the_mean_over_every_order_of_the_tie(ys, fraction):
    s, y = ys
    k = math.ceil(fraction * len(s))
    lowest = sorted(s, reverse=True)[k - 1]
    above = [yi for yi, si in zip(y, s) if si > lowest]
    tied = [yi for yi, si in zip(y, s) if si == lowest]
    picks = list(itertools.combinations(tied, k - len(above)))  # every way the cut can take tied rows, equally likely
    expected = Fraction(sum(sum(above) + sum(p) for p in picks), len(picks) * k)
    p, n = precision_at_top(y, s, fraction)
    assert n == k and p == pytest.approx(float(expected), abs=1e-12)


def _ap_ref(y, s):
    """Step AP: sum over distinct thresholds of (recall gain) x precision."""
    total, prev_r, ap = sum(y), 0, 0.0
    for v, tp, n in _cuts_ref(y, s):
        ap += (tp / total - prev_r) * tp / n
        prev_r = tp / total
    return ap


@FAST
@given(labelled())
def test_average_precision_matches_the_step_definition(ys):
    s, y = ys
    got = average_precision(y, s)
    if len(set(y)) < 2:  # undefined with one class
        assert math.isnan(got)
    else:
        assert got == pytest.approx(_ap_ref(y, s))


# ---------------------------------------------------------------------------------------------- i2d2/metrics.py
def _wilson_ref(k, n, z=1.96):
    """The interval's ends as the roots of (k/n - p)^2 = z^2 p (1 - p) / n, found by bisection."""
    from scipy.optimize import brentq

    f = lambda p: (k / n - p) ** 2 - z * z * p * (1 - p) / n  # noqa: E731
    lo = 0.0 if k == 0 else brentq(f, 0.0, k / n - 1e-15, xtol=1e-14)
    hi = 1.0 if k == n else brentq(f, k / n + 1e-15, 1.0, xtol=1e-14)  # f(0), f(1) > 0 > f(k/n)
    return lo, hi


@FAST
@given(st.integers(1, 2000).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))))
def test_wilson_interval_solves_the_score_equation(kn):
    k, n = kn
    assert wilson_interval(k, n) == pytest.approx(_wilson_ref(k, n), abs=1e-9)
    assert wilson_interval(0, 0) is None


def test_chapman_and_entropy_by_hand():
    from scipy.stats import entropy as scipy_entropy

    assert chapman_estimate(["a", "b", "b"], ["b", "c"]) == 3 * 3 / 2 - 1  # sets: n1 2, n2 2, m 1
    assert chapman_estimate([], []) == 0.0
    items = list("aabbbcd")
    assert entropy(items) == pytest.approx(scipy_entropy([2, 3, 1, 1], base=2))
    assert entropy([]) == 0.0 and entropy(["x"]) == 0.0


def test_self_bleu_is_the_mean_sentence_bleu_against_the_others():
    from sacrebleu import sentence_bleu

    texts = ["Dogs bark at night.", "Dogs bark loudly at night.", "Cats purr.", "Birds can fly south in winter."]
    ref = np.mean([sentence_bleu(t, [o for o in texts if o is not t], smooth_method="exp").score for t in texts]) / 100
    assert self_bleu(texts) == pytest.approx(ref)
    assert self_bleu(["same words here", "same words here"]) == pytest.approx(1.0)
    assert self_bleu(["one"]) is None and self_bleu([]) is None


# ---------------------------------------------------------------------------------------------- i2d2/filtering.py
@pytest.mark.parametrize("a,b", [("Well-known dogs.", "well known dogs"), ("Dogs  bark!", "dogs bark"),
                                 ("DOGS\tBARK...", "dogs bark"), ("Éclairs are sweet.", "éclairs are SWEET"),
                                 ("Dogs bark.\"", "dogs bark")])
def test_dedupe_key_folds_case_hyphens_spacing_and_end_punctuation(a, b):
    assert dedupe_key(a) == dedupe_key(b)


def test_threshold_filter_keeps_strictly_above_delta_and_refuses_nan():
    rows = [{"s": i} for i in range(4)]
    kept, dropped = threshold_filter(rows, [0.5, 0.6, 0.4, 0.5], 0.5)
    assert [r["s"] for r in kept] == [1] and [r["s"] for r in dropped] == [0, 2, 3]
    with pytest.raises(ValueError, match="NaN"):
        threshold_filter(rows, [0.5, float("nan"), 0.4, 0.5], 0.5)


@FAST
@given(st.lists(st.tuples(st.sampled_from([0, 1, 2]), st.sampled_from([0.1, 0.5, 0.9])), max_size=15),
       st.integers(1, 6))
def test_cap_per_group_keeps_each_groups_best_scored_rows(rows, cap):
    groups = np.array([g for g, _ in rows], dtype=np.int64)
    scores = np.array([s for _, s in rows], dtype=float)
    ref = set()
    for g in set(groups.tolist()):
        members = sorted((i for i in range(len(rows)) if groups[i] == g), key=lambda i: (-scores[i], i))
        ref |= set(members[:cap])  # a cap larger than the group keeps all of it
    assert set(np.flatnonzero(_cap_per_group(scores, groups, cap)).tolist()) == ref


WORDS = ["Dogs bark.", "dogs BARK", "Dogs-bark!", "Dogs bark loudly.", "Dogs can't bark.", "Dogs cannot bark.",
         "Cats chase mice.", "Mice chase cats.", "A cat chases mice.", "Cats are pets.", "Cats are pets!!"]


def _near_duplicates_ref(texts, groups, scores, threshold, by_content):
    """Greedy clustering in score order (ties: earlier rows), pair by pair."""
    from rapidfuzz import fuzz

    from i2d2.filtering import _negated, content_key

    def close(i, j):
        same = fuzz.ratio(dedupe_key(texts[i]), dedupe_key(texts[j])) >= threshold or (
            by_content and content_key(texts[i]) == content_key(texts[j]))
        return groups[i].lower() == groups[j].lower() and same and _negated(texts[i]) == _negated(texts[j])

    order = sorted(range(len(texts)), key=lambda i: (-scores[i], i))
    rep = list(range(len(texts)))
    taken = set()
    for a in order:
        if a in taken:
            continue
        for b in order:
            if b != a and b not in taken and order.index(b) > order.index(a) and close(a, b):
                rep[b] = a
                taken.add(b)
    return rep


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(WORDS), st.sampled_from(["dog", "Dog", "cat"]),
                          st.sampled_from([0.2, 0.5, 0.8])), max_size=10),
       st.sampled_from([80.0, 90.0, 100.0]), st.booleans())
def test_near_duplicates_matches_pairwise_greedy_clustering(rows, threshold, by_content):
    texts, groups, scores = ([r[k] for r in rows] for k in range(3))
    rep = near_duplicates(texts, groups, threshold=threshold, order=scores, by_content=by_content)
    assert rep.tolist() == _near_duplicates_ref(texts, groups, scores, threshold, by_content)
    for i, r in enumerate(rep.tolist()):  # a representative is its own and the best-scored of its cluster
        assert rep[r] == r and scores[r] >= scores[i] and groups[r].lower() == groups[i].lower()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(WORDS), max_size=10, unique=True), st.randoms(use_true_random=False))
def test_near_duplicates_kept_set_does_not_depend_on_row_order(texts, rnd):
    scores = list(np.linspace(0, 1, len(texts)))  # distinct scores: no ties to break by position
    kept = {texts[i] for i, r in enumerate(near_duplicates(texts, None, order=scores, by_content=True)) if r == i}
    perm = list(range(len(texts)))
    rnd.shuffle(perm)
    t2, s2 = [texts[i] for i in perm], [scores[i] for i in perm]
    assert kept == {t2[i] for i, r in enumerate(near_duplicates(t2, None, order=s2, by_content=True)) if r == i}


# ---------------------------------------------------------------------------------------------- the whole filter
GENERATIONS = ["bark loudly.", "bark loudly!", "Bark  loudly", "bark-loudly.", "have four legs.", "have 4 legs",
               "eat meat, bones, meat.", "", "are loyal pets.", "are loyal, friendly pets.", "can't fly.", "cannot fly.",
               "like naïve owners.", "are used to guard homes."]


@settings(max_examples=12, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["dog", "Dog", "cat", "naïve"]), st.sampled_from(GENERATIONS),
                          st.booleans()), min_size=1, max_size=14),
       st.randoms(use_true_random=False), st.sampled_from([None, 1, 2, 50]), st.sampled_from([None, 1, 3]))
def test_filter_gives_each_row_one_fate_independent_of_row_order(tmp_path_factory, rows, rnd, cap, frame_cap):
    import zlib

    from i2d2.io import write_arrow
    from i2d2.recipes.generics import DROP_REASONS, filter_generations

    def score(texts):  # a fixed score per statement, distinct between statements
        return np.array([zlib.crc32(t.encode()) / 2 ** 32 for t in texts])

    fcfg = {"truncate": "sentence", "require_sentence_end": True, "require_constraints": True, "dedupe": True,
            "near_duplicate_ratio": 90, "max_per_concept": cap, "max_per_frame": frame_cap}

    def run(rows):
        tmp = tmp_path_factory.mktemp("f")
        write_arrow(tmp / "generations" / "table" / "shard-00000.arrow",
                    [{"prompt_id": f"p{i}", "prompt": c.capitalize() + "s", "generation": g, "rank_in_prompt": 0,
                      "all_satisfied": ok, "concept": c} for i, (c, g, ok) in enumerate(rows)])
        (tmp / "out").mkdir()
        summary, kept, dropped = filter_generations(tmp / "generations", tmp / "out", score, 0.3, fcfg)
        assert summary["n_kept"] + summary["n_dropped"] == len(rows) == len(kept) + len(dropped)
        assert set(dropped["drop_reason"]) <= set(DROP_REASONS) and None not in dropped["drop_reason"]
        assert all(s > 0.3 for s in kept["critic_score"])
        return sorted(kept["statement"]), sorted(dropped["drop_reason"])

    first = run(rows)
    perm = list(range(len(rows)))
    rnd.shuffle(perm)
    assert run([rows[i] for i in perm]) == first
