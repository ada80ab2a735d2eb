"""CMP tasks: Table 2 prompt formats, text infilling, metrics, downstream readers, config."""

import json

import numpy as np
import pytest

from i2d2.cmp.data import Quintuple
from i2d2.cmp.evaluation import bleu, exact_match, normalize_answer, qa_scores, rouge, task_scores, unigram_f1
from i2d2.cmp.tasks import ExampleBuilder, corrupt, infill_mask, split_qag

Q = Quintuple("France", "Spain", "currency", "euro", "euro", "France uses the euro. It is in Europe.",
              "Spain uses the euro.", id="fr-es")


def builder(**kw):
    return ExampleBuilder({"fr-es": "France uses the euro, as does Spain."}, "<mask>", **kw)


def test_prompt_formats_match_table_2():
    b = builder()
    qa = b.examples(Q, "qa")
    assert len(qa) == 5
    assert qa[0].source == ("Answer the comparative question. Question: Do France and Spain have "
                            f"{'the same value' if 'same value' in qa[0].source else 'different values'} of currency?"
                            " Context: France uses the euro. It is in Europe. [SEP] Spain uses the euro.")
    assert {e.target for e in qa} >= {"yes", "euro", "Spain"}
    qag = b.examples(Q, "qag")
    assert qag[0].source == ("Generate a comparative question-answer pair. Context: France uses the euro. "
                             "It is in Europe. [SEP] Spain uses the euro.")
    assert [split_qag(e.target) for e in qag] == [(p.source.split("Question: ")[1].split(" Context:")[0], p.target)
                                                 for p in qa]
    (s,) = b.examples(Q, "sum")
    assert s.source == "Generate a comparative summary. Context: France uses the euro. It is in Europe. [SEP] Spain uses the euro."
    assert s.target == "France uses the euro, as does Spain."
    (ti,) = b.examples(Q, "ti", seed=3)
    assert ti.target == "France uses the euro. It is in Europe. [SEP] Spain uses the euro."
    c1, c2 = ti.source.split(" [SEP] ")
    assert "<mask>" in ti.source and len([w for w in c1.split() if w != "<mask>"]) == 8 - round(0.3 * 8)
    assert ti.source == b.examples(Q, "ti", seed=3)[0].source  # deterministic per seed
    with pytest.raises(ValueError, match="unknown CMP task"):
        b.examples(Q, "nli")


def test_infilling_masks_thirty_percent_in_poisson_spans():
    rng = np.random.default_rng(0)
    span_lengths = []
    for n in (10, 37, 100, 513):
        for _ in range(20):
            m = infill_mask(n, rng, ratio=0.3, poisson_lambda=3.0)
            assert m.sum() == round(0.3 * n)
            edges = np.flatnonzero(np.diff(np.concatenate([[0], m.astype(int), [0]])))
            span_lengths += (edges[1::2] - edges[::2]).tolist()
    assert 2.5 < np.mean(span_lengths) < 4.0  # Poisson(3) without zero draws has mean ~3.16 (last spans are cut)
    words = [f"w{i}" for i in range(200)]
    out = corrupt(" ".join(words), np.random.default_rng(1), "<mask>").split()
    kept = [w for w in out if w != "<mask>"]
    assert len(words) - len(kept) == 60                 # 30% of the words are gone ...
    assert kept == [w for w in words if w in set(kept)]  # ... the rest keep their order
    n_spans = out.count("<mask>")
    assert 10 <= n_spans <= 30 and "<mask> <mask>" not in " ".join(out)  # one mask token per span
    assert corrupt("", rng, "<mask>") == ""
    with pytest.raises(ValueError, match="poisson_lambda must be > 0"):  # Poisson(0): every span empty, no end
        infill_mask(10, rng, ratio=0.3, poisson_lambda=0.0)


def test_qa_metrics_on_hand_checked_examples():
    assert normalize_answer("The  Eiffel Tower!") == "eiffel tower"
    assert exact_match("The Eiffel Tower!", "eiffel tower") == 1.0
    assert exact_match("Eiffel", "eiffel tower") == 0.0
    # pred {cat, sat, on, mat} vs gold {cat, on, mat}: P = 3/4, R = 1, F1 = 6/7
    assert unigram_f1("a cat sat on the mat", "the cat on a mat") == pytest.approx(6 / 7)
    assert unigram_f1("yes", "no") == 0.0
    s = qa_scores(["Yes.", "Paris, France", "blue"], ["yes", ["Paris", "Paris, France"], "red"])
    assert s["em"] == pytest.approx(200 / 3) and s["f1"] == pytest.approx(200 / 3) and s["n"] == 3


def test_generation_metrics_on_hand_checked_examples():
    assert bleu(["the cat sat on the mat today"], ["the cat sat on the mat today"]) == pytest.approx(100.0)
    assert bleu(["completely different words here"], ["the cat sat on the mat"]) == pytest.approx(0.0)
    # "the cat sat" vs "the cat sat on the mat": LCS 3 -> P 1, R 1/2, F 2/3; bigrams 2 of 2 / 5 -> F 4/7
    r = rouge(["the cat sat"], ["the cat sat on the mat"])
    assert r["rougeL"] == pytest.approx(200 / 3) and r["rouge2"] == pytest.approx(400 / 7)
    # several references: each example scores its best one
    assert rouge(["the cat sat"], [["a dog ran", "the cat sat"]])["rougeL"] == pytest.approx(100.0)
    assert set(task_scores("qg", ["a b"], ["a b"])) == {"bleu", "rougeL", "n"}
    assert set(task_scores("sum", ["a b"], ["a b"])) == {"rouge2", "rougeL", "n"}
    with pytest.raises(ValueError, match="2 predictions but 1 references"):
        qa_scores(["a", "b"], ["a"])


def test_downstream_readers_on_fixtures():
    from i2d2.cmp.data import BUNDLED
    from i2d2.cmp.downstream import load_downstream

    fx = BUNDLED / "fixtures"
    hot = load_downstream(fx / "hotpotqa_dev.json", "hotpotqa", "qa")
    assert len(hot) == 4  # the bridge question is not a comparison
    assert hot[0].question.startswith("Which lake is deeper") and hot[0].references == ("Lake Baikal",)
    assert "Baikal" in hot[0].doc1 and "Tanganyika" in hot[0].doc2
    qg = load_downstream(fx / "hotpotqa_dev.json", "hotpotqa", "qg")
    assert qg[0].task == "qg" and qg[0].references == (hot[0].question,)
    wiki = load_downstream(fx / "2wiki_dev.json", "2wiki", "qa")
    assert len(wiki) == 4  # comparison + bridge_comparison, not compositional
    bridge = [x for x in wiki if x.id == "2w-dev-3"][0]
    assert "Kurosawa" in bridge.doc1 and "Bergman" in bridge.doc2
    coco = load_downstream(fx / "cocotrip_test.json", "cocotrip")
    assert coco[0].task == "sum" and len(coco[0].references) == 2
    diffen = load_downstream(fx / "diffen_dev.jsonl", "diffen")
    assert diffen[0].doc1.startswith("Alligators") and diffen[0].references[0].startswith("Alligators and")


def test_downstream_reader_errors(tmp_path):
    from i2d2.cmp.downstream import load_downstream
    from i2d2.io import DataError

    p = tmp_path / "hp.json"
    p.write_text(json.dumps([{"_id": "x", "question": "q", "type": "comparison"}]))
    with pytest.raises(DataError, match=r"example 0 \(x\): missing answer, context, supporting_facts"):
        load_downstream(p, "hotpotqa")
    d = tmp_path / "d.jsonl"
    d.write_text(json.dumps({"entity1": "a", "entity2": "b", "doc1": "x", "doc2": "y", "summary": "s"}) + "\n{bad\n")
    with pytest.raises(DataError, match=r"d.jsonl:2"):
        load_downstream(d, "diffen")


def test_config_variants_and_table_8():
    from hydra import compose, initialize_config_dir

    from i2d2.config import CONF_DIR

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["task=cmp"])
        assert cfg.task.recipe == "i2d2.recipes.cmp.run" and list(cfg.task.tasks) == ["qa", "qag", "sum", "ti"]
        assert cfg.task.model == "packaged:minilm" and cfg.data.corpus == "bundled:corpus.jsonl"
        assert cfg.task.infilling.mask_ratio == 0.3
        paper = compose("train", overrides=["task=cmp", "cmp/pretrain=paper"]).task.pretrain
        assert (paper.batch_size, paper.lr, paper.warmup_ratio, paper.max_source_length, paper.max_target_length,
                paper.max_steps) == (192, 3e-5, 0.01, 512, 512, 70000)
        for v, tasks in [("cmp_qa", ["qa"]), ("cmp_qag", ["qag"]), ("cmp_sum", ["sum"])]:
            assert list(compose("train", overrides=["task=cmp", f"cmp/variant={v}"]).task.tasks) == tasks


def test_per_task_batch_split():
    from trainers.cmp import per_task_sizes

    assert per_task_sizes(8, ["qa", "qag", "sum", "ti"]) == {"qa": 2, "qag": 2, "sum": 2, "ti": 2}
    assert per_task_sizes(10, ["qa", "ti"], {"qa": 4, "ti": 1}) == {"qa": 8, "ti": 2}
    assert per_task_sizes(2, ["qa", "qag", "sum"]) == {"qa": 1, "qag": 1, "sum": 1}
    with pytest.raises(ValueError, match="positive"):
        per_task_sizes(8, ["qa"], {"qa": 0})
