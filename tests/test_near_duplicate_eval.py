"""scripts/near_duplicate_eval.py: stratum-weighted precision / recall, a threshold chosen on dev only, the
negation guard on cosine merges, and the shipped near-duplicate pair file is well formed."""

import json
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _pair(split, a, b, same, cosine, rule, stratum, population):
    return {"concept": "bird", "split": split, "a": a, "b": b, "same": same, "cosine": cosine, "rule_merges": rule,
            "stratum": stratum, "stratum_population": population, "annotator": "maintainers"}


# dev: t = 0.97 is the only threshold with precision >= 0.9; test: weights 2, 2 ("hi": 4 pairs, 2 drawn) and 30
SIX = [_pair("dev", "Birds fly.", "Birds can fly.", True, 0.97, False, "hi", 10),
       _pair("dev", "Birds fly.", "Birds fly south.", False, 0.92, False, "hi", 10),
       _pair("dev", "Birds fly.", "Birds lay eggs.", False, 0.50, False, "lo", 100),
       _pair("test", "Birds sing.", "Birds can sing.", True, 0.98, False, "hi", 4),
       _pair("test", "Birds can fly.", "Birds can't fly.", False, 0.99, False, "hi", 4),
       _pair("test", "Birds have wings.", "A bird has wings.", True, 0.40, True, "lo", 30)]


@pytest.fixture
def E(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import near_duplicate_eval

    return near_duplicate_eval


def test_six_pairs(E, tmp_path, capsys):
    res = E.evaluate(SIX, min_precision=0.9)
    assert res["thresholds"] == {"cosine": 0.97, "rule|cosine": 0.97}
    test = res["test"]
    assert test["rule"] == {"precision": 1.0, "recall": pytest.approx(30 / 32), "tp": 1, "fp": 0, "fn": 1}
    # the 0.99 pair is a negation: never merged by cosine (without the guard it is a false positive, precision 0.5)
    assert test["cosine"] == {"precision": 1.0, "recall": pytest.approx(2 / 32), "tp": 1, "fp": 0, "fn": 1}
    assert test["rule|cosine"] == {"precision": 1.0, "recall": 1.0, "tp": 2, "fp": 0, "fn": 0}
    assert test["population"] == 34 and res["dev"]["population"] == 110
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in SIX))
    assert E.main(["--pairs", str(path)]) == 0
    assert "rule|cosine" in capsys.readouterr().out


def test_no_threshold_reaches_the_precision(E):
    dev = [dict(r, same=False) for r in SIX if r["split"] == "dev"]  # no dev pair is a same claim
    assert E.choose_threshold(E.arrays(dev), False, 0.9) is None


def test_shipped_pairs_are_well_formed():
    rows = [json.loads(line) for line in (ROOT / "i2d2/data/annotations/near_duplicate_pairs.jsonl").open()]
    assert len(rows) >= 400
    drawn, population = defaultdict(int), {}
    for r in rows:
        assert r["split"] in ("dev", "test") and isinstance(r["same"], bool) and r["annotator"] == "maintainers"
        # two labelling passes; the settled label is one of theirs (the same where they agree)
        assert isinstance(r["same_1"], bool) and isinstance(r["same_2"], bool)
        assert r["same"] in (r["same_1"], r["same_2"])
        assert r["a"] != r["b"] and -1 <= r["cosine"] <= 1 and isinstance(r["rule_merges"], bool)
        key = (r["split"], r["stratum"])
        drawn[key] += 1
        assert population.setdefault(key, r["stratum_population"]) == r["stratum_population"]
    assert all(drawn[k] <= population[k] for k in drawn)


def test_a_missing_or_broken_pairs_file_is_named_without_a_traceback(E, tmp_path, capsys):
    (tmp_path / "broken.jsonl").write_text('{"split": "dev"\n')
    (tmp_path / "short.jsonl").write_text('{"split": "dev", "a": "Birds fly."}\n')
    for name, said in (("none.jsonl", "No such file"), ("broken.jsonl", "broken.jsonl:1:"),
                       ("short.jsonl", "short.jsonl:1: missing field(s) b, same")):
        with pytest.raises(SystemExit) as e:
            E.main(["--pairs", str(tmp_path / name)])
        assert e.value.code == 2 and said in capsys.readouterr().err
