"""The critic's truth: labelled generations, three concept-grouped splits, the surface-only floor, the
invariance probes, undefined precision, near-duplicates, prompt forms and the blind per-iteration evaluation."""

import csv
import json

import numpy as np
import torch
import pytest

from critics.data import ANNOTATION_DIR, grouped_split3, load_annotations
from critics.metrics import precision_recall_at
from critics.surface import PROBES, SurfaceClassifier, auc, surface_features, surface_floor
from i2d2.io import read_jsonl, write_jsonl

GEMMA = ANNOTATION_DIR / "generics_gemma.jsonl"
LABELS = {"true", "false", "vague", "episodic", "ad_copy", "garbled", "dont_know"}


# ----------------------------------------------------------------------------- the shipped label set

def test_label_set_is_labelled_generations_with_guide_and_config():
    rows = read_jsonl(GEMMA)
    assert len(rows) >= 1500 and len({r["statement"] for r in rows}) == len(rows)
    assert {r["label"] for r in rows} <= LABELS
    assert len({r["concept"] for r in rows}) >= 150
    kinds = [r["kind"] for r in rows]
    assert kinds.count("goal") >= 0.08 * len(rows) and sum(bool(r.get("related")) for r in rows) >= 0.10 * len(rows)
    assert all(r["annotator"] == "maintainers" for r in rows)
    assert (ANNOTATION_DIR / "GUIDE.md").exists()
    cfg = json.loads((ANNOTATION_DIR / "generics_gemma.config.json").read_text())
    assert cfg["model"] == "packaged:gemma3-270m" and cfg["decoding"]["beam_size"] >= 1
    # the default run's concepts and the fixed held-out concepts are not in it
    excluded = set(cfg["excluded_concepts"])
    assert excluded and not excluded & {r["concept"].lower() for r in rows}
    loaded = load_annotations([GEMMA])  # every label is known to the default map
    assert 0.15 < np.mean([r["y"] for r in loaded]) < 0.85


def test_second_pass_covers_the_test_split_and_agreement_is_measured(monkeypatch):
    """The blind second labelling covers every test statement, and scripts/label_agreement.py computes agreement
    and the second labeller's AP from it (the reference a critic's test AP is read against)."""
    from i2d2.filtering import ends_sentence
    from i2d2.schemas import CriticConfig, defaults

    monkeypatch.syspath_prepend(str(ANNOTATION_DIR.parents[2] / "scripts"))
    import label_agreement

    second = read_jsonl(ANNOTATION_DIR / "generics_gemma.second_pass.jsonl")
    assert {r["label"] for r in second} <= LABELS and len({r["statement"] for r in second}) == len(second)
    d = defaults(CriticConfig)
    rows = [r for r in load_annotations([GEMMA]) if ends_sentence(r["statement"])]
    _, _, te = grouped_split3([r["concept"] for r in rows], np.array([r["y"] for r in rows]), d["dev_fraction"],
                              d["test_fraction"], d["seed"])
    assert {rows[i]["statement"] for i in te} <= {r["statement"] for r in second}
    pairs = label_agreement.paired_labels(GEMMA, ANNOTATION_DIR / "generics_gemma.second_pass.jsonl", None)
    res = label_agreement.agreement(pairs)
    assert res["n"] >= 600 and 0.6 < res["kappa_valid"] <= 1 and 0 < res["second_ap"] <= 1
    # the measure can fail: labels that ignore the first ones agree by chance only
    shuffled = [(s, a, b) for (s, a, _), (_, _, b) in zip(pairs, pairs[1:] + pairs[:1])]
    assert abs(label_agreement.agreement(shuffled)["kappa_valid"]) < 0.2


def test_no_surface_cue_exists_only_in_the_training_split():
    """A surface-only classifier fit on the critic's training split must not do much better there (out of fold,
    grouped by concept) than on the test split: a larger gap is a cue (adverb, article, length, comma, prompt type,
    relation) of the training labels alone."""
    from i2d2.schemas import CriticConfig, defaults

    DEFAULTS = defaults(CriticConfig)

    from i2d2.filtering import ends_sentence

    rows = [r for r in load_annotations([GEMMA]) if ends_sentence(r["statement"])]  # critic.complete_only
    y = np.array([r["y"] for r in rows])
    tr, _, te = grouped_split3([r["concept"] for r in rows], y, DEFAULTS["dev_fraction"], DEFAULTS["test_fraction"],
                               DEFAULTS["seed"])
    out = surface_floor([rows[i] for i in tr], y[tr], [rows[i] for i in te], y[te])
    assert out["surface_auc_train"] - out["surface_auc_test"] <= 0.05, out


def test_surface_gap_test_can_fail_on_a_train_only_cue():
    rng = np.random.default_rng(0)
    def rows(n, cue):
        out, ys = [], []
        for i in range(n):
            y = int(rng.random() < 0.5)
            adverb = ("Generally, " if y == 0 else "") if cue else ("Generally, " if rng.random() < 0.5 else "")
            out.append({"statement": f"{adverb}things of kind {i} do stuff number {rng.integers(9)}.",
                        "concept": f"c{i % 40}"})
            ys.append(y)
        return out, np.array(ys)
    tr, ytr = rows(300, cue=True)
    te, yte = rows(300, cue=False)
    out = surface_floor(tr, ytr, te, yte)
    assert out["surface_auc_train"] > 0.95 and out["surface_auc_train"] - out["surface_auc_test"] > 0.3


def test_surface_features_see_wording_only():
    f = surface_features({"statement": "Generally, the dogs bark, loudly.", "relation": "are", "kind": "noun"})
    assert f["adverb"] == 1.0 and f["article=the"] == 1.0 and f["n_commas"] == 2.0 and f["relation=are"] == 1.0
    g = surface_features({"statement": "In order to bake bread, you need flour."})
    assert g["goal"] == 1.0 and g["article=none"] == 1.0
    clf = SurfaceClassifier().fit([{"statement": "A b."}, {"statement": "Generally, c d e f."}], [1, 0])
    assert clf.score([{"statement": "A b."}]).shape == (1,)
    assert auc([1, 1], [0.2, 0.3]) is None


# ----------------------------------------------------------------------------- splits, δ, undefined precision

def test_three_splits_are_disjoint_by_concept_and_cover_everything():
    rng = np.random.default_rng(1)
    concepts = [f"c{rng.integers(60)}" for _ in range(900)]
    y = rng.integers(0, 2, 900)
    tr, dev, te = grouped_split3(concepts, y, 0.15, 0.2, seed=3)
    assert sorted(np.r_[tr, dev, te].tolist()) == list(range(900))
    sets = [{concepts[i] for i in idx} for idx in (tr, dev, te)]
    assert not (sets[0] & sets[1] or sets[0] & sets[2] or sets[1] & sets[2])
    assert 0.12 < len(sets[2]) / 60 < 0.3 and 0.08 < len(sets[1]) / 60 < 0.25
    for idx in (tr, dev, te):
        assert set(y[idx].tolist()) == {0, 1}


def test_precision_of_an_empty_kept_set_is_undefined():
    p, r, n = precision_recall_at([1, 0, 1], [0.2, 0.3, 0.4], 0.9)
    assert p is None and r == 0.0 and n == 0
    # so are recall and precision at a recall where no row is positive (a one-class split), not 0.0
    from critics.metrics import precision_at_recall

    assert precision_recall_at([0, 0, 0], [0.9, 0.2, 0.1], 0.5) == (0.0, None, 1)
    assert precision_at_recall([0, 0, 0], [0.9, 0.2, 0.1]) is None


# ----------------------------------------------------------------------------- probes

def test_probe_set_pairs_rewrites_and_falsehoods():
    rows = read_jsonl(PROBES)
    groups = {}
    for r in rows:
        groups.setdefault(r["group"], []).append(r)
    rewrites = [g for g in groups.values() if g[0]["type"] == "rewrite"]
    assert len(rewrites) >= 20 and all(len(g) >= 4 and len({r["y"] for r in g}) == 1 for g in rewrites)
    assert any(r["statement"].startswith("Generally,") for r in rows)
    assert sum(r["type"] == "falsehood" for r in rows) >= 20
    assert "The moon is made of cheese." in {r["statement"] for r in rows}


def test_probe_shift_measures_wording_sensitivity(caplog):
    import logging

    from critics.surface import score_probes

    flat = score_probes(lambda texts: np.full(len(texts), 0.7))
    assert flat["probe_shift"] == 0.0 and flat["probe_n_pairs"] >= 80
    with caplog.at_level(logging.WARNING):
        adverb_hater = score_probes(lambda texts: np.array([0.01 if t.startswith(("Generally", "Typically", "Usually"))
                                                            else 0.99 for t in texts]))
    assert adverb_hater["probe_shift"] > 0.1 and "PROBE SHIFT" in caplog.text


# ----------------------------------------------------------------------------- near-duplicates

def test_near_duplicates_fold_case_hyphens_and_close_wordings():
    from i2d2.filtering import dedupe_key, near_duplicates

    assert dedupe_key("Well-known DOGS bark!") == "well known dogs bark"
    texts = ["The hotel was small, but we were very happy with our room.",
             "The hotel was small, but we were very pleased with our room.",
             "Dogs bark.", "dogs-bark", "Cats purr.", "Dogs bark."]
    rep = near_duplicates(texts, ["h", "h", "d", "d", "c", "x"], order=[0.1, 0.9, 0.5, 0.6, 0.1, 0.1])
    assert rep.tolist() == [1, 1, 3, 3, 4, 5]  # best-scored represents; other concepts never merge


def test_a_list_that_repeats_an_item_is_flagged_and_labelled_garbled_every_time():
    from i2d2.filtering import repeats_list_item

    assert repeats_list_item("Generally, kitchen knives can be used to cut meat, vegetables, fruits, fruits, vegetables, etc.")
    assert repeats_list_item("A fireplace should be a place where you can relax, relax, relax.")
    assert not repeats_list_item("Generally, kitchen knives can be used to cut meat, fish, vegetables, fruits, etc.")
    assert not repeats_list_item("Dogs chase cats, and cats chase mice.")  # clauses, not list items
    assert not repeats_list_item("Birds can fly, walk, or swim, and some can walk and swim.")  # two lists
    flagged = [r["label"] for r in read_jsonl(GEMMA) if repeats_list_item(r["statement"])]
    assert len(flagged) >= 30 and set(flagged) == {"garbled"}  # the rule's evidence: the labels


def test_near_duplicates_ignore_word_order_article_number_and_modal_but_not_negation():
    from i2d2.filtering import content_key, near_duplicates

    # pairs from a real kept set (runs of the default loop): the character ratio alone missed each one
    texts = ["Generally, chairs may be made of wood, metal, plastic, etc.",
             "Generally, chairs may be made of wood, plastic, metal, etc.",
             "Generally, a table is used to store information.",
             "Generally, tables can be used to store information.",
             "Birds can fly.", "Birds cannot fly.", "Birds can’t fly.",
             "Chairs may be made of wood.", "Chairs should always be made of wood."]
    assert content_key(texts[0]) == content_key(texts[1]) == "chair made metal of plastic wood"
    groups = ["chair", "chair", "table", "table", "bird", "bird", "bird", "chair", "chair"]
    rep = near_duplicates(texts, groups, by_content=True)
    # a negation (curly apostrophe too) never merges with its affirmative; "should always" changes the claim
    assert rep.tolist() == [0, 0, 2, 2, 4, 5, 5, 7, 8]
    assert near_duplicates(texts, groups).tolist()[:4] == [0, 1, 2, 3]  # comparatives: word order matters
    assert near_duplicates(["Cats are bigger than mice.", "Mice are bigger than cats."]).tolist() == [0, 1]


def test_content_key_meets_singular_nouns_ending_in_s_and_verb_agreement():
    from i2d2.filtering import content_key

    # inflect strips the "s" of a singular noun ("gas" -> "ga") while "gases" -> "gas": the pairs never met
    pairs = [("Gas is flammable.", "Gases are flammable."), ("A lens focuses light.", "Lenses focus light."),
             ("A bus carries people.", "Buses carry people."), ("A virus causes disease.", "Viruses cause disease."),
             ("A tree has leaves.", "Trees have leaves."), ("A cat doesn't bark.", "Cats do not bark.")]
    for one, many in pairs:
        assert content_key(one) == content_key(many), (one, many)
    assert content_key("Gas is flammable.") == "flammable gas"
    assert content_key("Knives cut bread.") == content_key("A knife cuts bread.") == "bread cut knife"


# ----------------------------------------------------------------------------- prompt forms

def test_prompt_forms_select_the_preferred_surface_form():
    from i2d2.concepts import Concept
    from i2d2.prompts import noun_variants, select_by_form

    data = {"articles": ["a", "an", "the"], "adverbs": ["Generally", "Typically"], "modal_verbs": ["can", "may"]}
    groups = [noun_variants(Concept("bicycle"), "can", data), noun_variants(Concept("bicycle"), "is", data),
              noun_variants(Concept("owl"), "are", data)]
    chosen, missing = select_by_form(groups, ["bare_plural", "indefinite"])
    assert [v.text for v in chosen] == ["Bicycles can", "A bicycle is", "Owls are"] and missing == 0
    chosen, missing = select_by_form(groups, ["adverb+indefinite"])
    assert [v.text for v in chosen] == ["Generally, a bicycle can", "Generally, a bicycle is"] and missing == 1
    assert {v.form for g in groups for v in g} >= {"bare_plural", "indefinite", "definite", "adverb+bare_plural"}


def test_default_prompt_form_is_set_from_measured_yield():
    from hydra import compose, initialize_config_dir

    from i2d2 import config  # noqa: F401
    from i2d2.prompts import check_prompt_selection

    with initialize_config_dir(str(ANNOTATION_DIR.parents[2] / "conf"), version_base="1.3"):
        cfg = compose("train")
    selection, forms = check_prompt_selection(cfg.data)
    yields = json.loads((ANNOTATION_DIR / "prompt_form_yield.json").read_text())
    assert selection == "forms"
    # compared where the form is a choice (phrases that leave the number open), train + dev concepts only
    best = max(yields["choose"]["by_form_free"].items(), key=lambda kv: kv[1]["yield"])[0]
    assert forms[0] == best and list(forms) == yields["recommend"]["prompt_forms"][:len(forms)]
    from i2d2.concepts import load_phrases

    assert load_phrases(ANNOTATION_DIR.parent / "generics" / "relations" / "measured.txt") == \
        yields["recommend"]["relations"]
    with pytest.raises(ValueError, match="data.prompt_forms"):
        check_prompt_selection({"prompt_selection": "forms", "prompt_forms": ["plural"]})


# ----------------------------------------------------------------------------- blind per-iteration evaluation

def _fake_run(tmp_path):
    for k, texts in enumerate([["Dogs bark.", "Dogs fly.", "Cats purr."], ["Dogs bark.", "Owls hoot.", "Cats are."]]):
        d = tmp_path / f"iter_{k}" / "heldout"
        d.mkdir(parents=True)
        write_jsonl(d / "statements.jsonl", [{"statement": t, "concept": t.split()[0].lower(), "critic_score": 0.5 + k / 10,
                                              "prompt_id": f"p{i}"} for i, t in enumerate(texts)])
    return tmp_path


def test_blind_export_carries_no_score_or_iteration_and_imports_back(tmp_path):
    from i2d2.annotation import export_blind, heldout_accuracy, heldout_store, import_blind

    run = _fake_run(tmp_path / "run")
    out = tmp_path / "blind.csv"
    items = export_blind(run, out, n_per_iteration=3, seed=0)
    with open(out, newline="") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == ["item_id", "statement", "label", "votes"]
        rows = list(reader)
    assert len(rows) == len(items) == 5  # "Dogs bark." came from both iterations: one item
    text = out.read_text()
    for leak in ("0.5", "0.6", "iter", "critic", "p0"):
        assert leak not in text
    assert all(len(r["item_id"]) == 12 for r in rows)
    truth = {"Dogs bark.": "true", "Dogs fly.": "false", "Cats purr.": "true", "Owls hoot.": "true", "Cats are.": "garbled"}
    for r in rows:
        r["label"] = truth[r["statement"]]
    with open(tmp_path / "done.csv", "w", newline="") as f:
        w = csv.DictWriter(f, ["item_id", "statement", "label", "votes"])
        w.writeheader()
        w.writerows(rows)
    labelled = import_blind(tmp_path / "done.csv", run)
    assert len(labelled) == 5 and heldout_store(run).exists()
    assert not (run / "annotations" / "labels.jsonl").exists()  # never where a critic would train on it
    acc = {r["iteration"]: r for r in heldout_accuracy(run)}
    assert acc[0]["accuracy"] == pytest.approx(2 / 3) and acc[1]["accuracy"] == pytest.approx(2 / 3)
    assert acc[0]["n_labelled"] == 3
    # a second export skips what is labelled already
    assert export_blind(run, tmp_path / "again.csv", n_per_iteration=3) == []


def test_blind_import_counts_majority_votes_and_names_the_labellers_file_line(tmp_path):
    from i2d2.annotation import export_blind, heldout_accuracy, import_blind
    from i2d2.io import DataError

    run = _fake_run(tmp_path / "run")
    rows = {r["statement"]: r for r in export_blind(run, tmp_path / "b.csv", n_per_iteration=3, seed=0)}
    votes = {"Dogs bark.": "true|true|false", "Dogs fly.": "false|false|true", "Cats purr.": "true|false",  # a tie
             "Owls hoot.": "true|true|true", "Cats are.": "garbled|garbled|true"}
    lines = ["item_id,statement,label,votes"] + [f"{rows[t]['item_id']},{t},,{v}" for t, v in votes.items()]
    (tmp_path / "votes.csv").write_text("\n".join(lines) + "\n")
    assert len(import_blind(tmp_path / "votes.csv", run)) == 5
    acc = {r["iteration"]: r for r in heldout_accuracy(run)}
    # iteration 0: Dogs bark (true), Dogs fly (false), Cats purr (tie: not counted); 1: Dogs bark, Owls hoot, Cats are
    assert (acc[0]["n_labelled"], acc[0]["accuracy"]) == (2, pytest.approx(1 / 2))
    assert (acc[1]["n_labelled"], acc[1]["accuracy"]) == (3, pytest.approx(2 / 3))
    # an unknown label names the labeller's file and its line (the 4th data row is CSV line 5)
    lines[4] = lines[4].replace(",,", ",maybe,")
    (tmp_path / "bad_label.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"^\S*bad_label\.csv:5: unknown label"):
        import_blind(tmp_path / "bad_label.csv", run)
    assert not list(tmp_path.glob(".*mapped*"))


def test_blind_import_rejects_unknown_items(tmp_path):
    from i2d2.annotation import export_blind, import_blind
    from i2d2.io import DataError

    run = _fake_run(tmp_path / "run")
    export_blind(run, tmp_path / "b.csv", n_per_iteration=1)
    (tmp_path / "bad.csv").write_text("item_id,statement,label\nnope,Dogs bark.,true\n")
    with pytest.raises(DataError, match="bad.csv:2: item_id 'nope'"):
        import_blind(tmp_path / "bad.csv", run)


# ----------------------------------------------------------------------------- the probe critic

def test_probe_critic_trains_scores_and_ignores_leading_adverbs(tmp_path):
    from critics.scoring import score_texts
    from critics.train import train_critic

    sub = tmp_path / "labels.jsonl"
    sub.write_text("".join(GEMMA.read_text().splitlines(keepends=True)[:400]))
    cfg = {"kind": "probe", "probe_lm": "tiny:gpt2", "probe_layer": 1, "probe_C": [0.01, 0.1], "canonicalize": True,
           "complete_only": True, "min_examples": 10, "eval_batch_size": 16}
    res = train_critic(cfg, [sub], tmp_path / "critic")
    model_dir = tmp_path / "critic" / "model"
    meta = json.loads((model_dir / "critic_meta.json").read_text())
    assert meta["kind"] == "probe" and meta["canonicalize"] and meta["C"] in (0.01, 0.1)
    assert sorted(p.name for p in model_dir.iterdir()) == ["critic_meta.json", "probe.safetensors"]  # no pickle
    assert res["n_unfinished_left_out"] > 0 and res["n_train"] + res["n_dev"] + res["n_test"] < 400
    a, b = score_texts(model_dir, ["Generally, birds can fly.", "Birds can fly."], progress=False)
    assert a == b  # canonicalised: the adverb is not seen
    # same canonical text, scored in batches of different padding: equal up to float noise
    assert res["probe_shift_by_rewrite"]["generally"] < 1e-6
    test = read_jsonl(tmp_path / "critic" / "test_scores.jsonl")
    again = score_texts(model_dir, [r["statement"] for r in test], progress=False)
    np.testing.assert_allclose(again, [r["critic_score"] for r in test], atol=1e-5)
    # reused, not refitted
    assert train_critic(cfg, [sub], tmp_path / "critic")["fit_seconds"] is None


def test_probe_features_are_the_hidden_states_without_the_vocabulary_logits():
    # lm_features asks the LM head for one position only (logits_to_keep=1): the features must be exactly the
    # layer's states of a full forward, padding and all
    from critics.probe import lm_features
    from i2d2.models import load_causal_lm

    model, tok = load_causal_lm("tiny:gpt2")
    texts = ["Birds can fly.", "A knife is used for cutting bread and meat.", "Ovens"]
    seen = []
    hook = model.register_forward_hook(lambda m, a, kw, out: seen.append((kw.get("logits_to_keep"), out.logits.shape)),
                                       with_kwargs=True)
    got = lm_features(model, tok, texts, layer=1, batch_size=2, progress=False)
    hook.remove()
    assert seen and all(k == 1 and shape[1] == 1 for k, shape in seen)
    want = []
    for t in texts:
        enc = tok(t, return_tensors="pt")
        with torch.no_grad():
            h = model(**enc, output_hidden_states=True).hidden_states[1][0].float()
        want.append(torch.cat([h.mean(0), h[-1]]).numpy())
    np.testing.assert_allclose(got, np.stack(want), atol=1e-5)



def test_heldout_confirmation_concepts_are_in_no_critic_label_set():
    # the per-iteration accuracy is measured on concepts no critic trains or chooses anything on
    critic_concepts = {r["concept"] for r in read_jsonl(GEMMA)}
    for path in sorted(ANNOTATION_DIR.glob("heldout_confirmation*.jsonl")):
        rows = read_jsonl(path)
        assert rows and not {r["concept"] for r in rows} & critic_concepts, path.name
        assert len({r["statement"] for r in rows}) == len(rows), path.name  # each distinct statement once

def test_probe_critic_reads_each_statement_after_a_fewshot_context_of_train_statements(tmp_path):
    from critics.data import canonical_statement, normalize_label
    from critics.scoring import score_texts
    from critics.train import train_critic

    sub = tmp_path / "labels.jsonl"
    sub.write_text("".join(GEMMA.read_text().splitlines(keepends=True)[:400]))
    cfg = {"kind": "probe", "probe_lm": "tiny:gpt2", "probe_layer": 1, "probe_C": [0.01, 0.1], "canonicalize": True,
           "complete_only": True, "min_examples": 10, "eval_batch_size": 16, "max_length": 32,
           # tiny:gpt2 has 256 positions (and a 1,000-word tokenizer): a short instruction and short examples
           "probe_context": {"examples": 4, "not_true": ["false", "too_vague_to_judge"], "instruction": "Judge.\n\n",
                             "max_words": 6}}
    res = train_critic(cfg, [sub], tmp_path / "critic")
    model_dir = tmp_path / "critic" / "model"
    meta = json.loads((model_dir / "critic_meta.json").read_text())
    shown = [line[len("Statement: "):] for line in meta["context"].splitlines() if line.startswith("Statement: ")]
    verdicts = [line.split(": ")[1] for line in meta["context"].splitlines() if line.startswith("Judgement: ")]
    assert meta["context_examples"] == 4 and len(shown) == 4 and verdicts == ["true", "false"] * 2
    # the examples are read, not fitted on: they leave the training rows
    assert res["n_train_fit"] == meta["n_fit"] == res["n_train"] - 4
    labels = {canonical_statement(r["statement"]): r["label"] for r in read_jsonl(sub)}
    assert [normalize_label(labels[s]) for s in shown[1::2]] == ["false", "too_vague_to_judge"]  # not_true, in turn
    assert meta["context"].startswith("Judge.\n\nStatement: ") and all(len(x.split()) <= 6 for x in shown)
    # the examples come from train concepts only: no dev or test statement shares a concept with one
    split = json.loads((tmp_path / "critic" / "split.json").read_text())
    held_out = set(split["dev_concepts"]) | set(split["test_concepts"])
    concept_of = {canonical_statement(r["statement"]): r["concept"] for r in read_jsonl(sub)}  # as the critic reads
    assert all(concept_of[s] not in held_out for s in shown) and len({concept_of[s] for s in shown}) == 4
    # the saved critic reads through the same context: it reproduces its own test scores
    test = read_jsonl(tmp_path / "critic" / "test_scores.jsonl")
    again = score_texts(model_dir, [r["statement"] for r in test], progress=False)
    np.testing.assert_allclose(again, [r["critic_score"] for r in test], atol=1e-5)
    assert res["probe_shift_by_rewrite"]["generally"] < 1e-6  # canonicalised before the context, as without it


def test_context_features_equal_an_uncached_forward_of_context_and_statement():
    # the context runs once and each batch copies its KV cache, statements right-padded after it: every feature
    # must equal a plain forward of context + "Statement: <s>\nJudgement:", one statement at a time
    from critics.probe import context_features, context_ids, context_text, item_ids
    from i2d2.models import load_causal_lm

    model, tok = load_causal_lm("tiny:gpt2")
    prefix = context_ids(tok, context_text("Judge each.\n\n", ["Dogs bark.", "The bed is soft."], [True, False]))
    texts = ["Birds can fly.", "A knife is used for cutting bread and meat in a kitchen.", "Ovens", "Fish swim."]
    got = context_features(model, tok, prefix, texts, layer=2, batch_size=3, progress=False)
    n_head = len(tok("Statement:", add_special_tokens=False)["input_ids"])
    want = []
    for t in texts:
        ids, n = item_ids(tok, t)
        with torch.no_grad():
            h = model(input_ids=torch.tensor([prefix + ids]), output_hidden_states=True).hidden_states[2][0].float()
        a, b = len(prefix) + n_head, len(prefix) + n_head + n
        want.append(torch.cat([h[a:b].mean(0), h[b - 1], h[-1]]).numpy())
    np.testing.assert_allclose(got, np.stack(want), atol=1e-4)
    # several layers from one forward: each layer's features side by side, in the order asked
    both = context_features(model, tok, prefix, texts, layer=[1, 2], batch_size=4, progress=False)
    one = context_features(model, tok, prefix, texts, layer=1, batch_size=4, progress=False)
    np.testing.assert_allclose(both, np.concatenate([one, got], 1), atol=1e-4)


def test_context_examples_refuse_labels_that_are_not_invalid_and_too_few_candidates():
    from critics.probe import context_examples

    rows = [{"statement": f"S{i}.", "concept": f"c{i}", "label": lab, "y": int(lab == "true")}
            for i, lab in enumerate(["true", "true", "false", "episodic"])]
    texts = [r["statement"] for r in rows]
    picked = context_examples(rows, texts, [0, 1, 2, 3], 4, ["false", "episodic"], seed=0, max_words=14)
    assert sorted(picked) == [0, 1, 2, 3] and [rows[i]["y"] for i in picked] == [1, 0, 1, 0]
    with pytest.raises(ValueError, match="not_true: 'true' is not a label"):
        context_examples(rows, texts, [0, 1, 2, 3], 4, ["true"], seed=0, max_words=14)
    with pytest.raises(ValueError, match="only 1 train statements labelled 'false'"):
        context_examples(rows, texts, [0, 1, 2, 3], 4, ["false"], seed=0, max_words=14)
    twice = context_examples(rows, texts, [0, 1, 2, 3], 4, ["False", "false", "episodic"], seed=0, max_words=14)
    assert sorted(twice) == [0, 1, 2, 3]  # one label named twice (spellings alike) is drawn from once
    # an odd seed starts with a not-true example; max_words leaves longer statements out
    odd = context_examples(rows, texts, [0, 1, 2, 3], 4, ["false", "episodic"], seed=1, max_words=14)
    assert [rows[i]["y"] for i in odd] == [0, 1, 0, 1]
    with pytest.raises(ValueError, match="only 0 train statements labelled 'true' of at most 0 words"):
        context_examples(rows, texts, [0, 1, 2, 3], 2, ["false"], seed=0, max_words=0)
    with pytest.raises(ValueError, match="true examples only"):  # no invalid label in train
        context_examples(rows, texts, [0, 1], 2, [], seed=0, max_words=14)


def test_a_context_longer_than_the_lm_reads_is_refused_naming_the_key():
    from critics.probe import context_features
    from i2d2.models import load_causal_lm

    model, tok = load_causal_lm("tiny:gpt2")  # 256 positions
    with pytest.raises(ValueError, match=r"critic\.probe_context: .* over the LM's 256 positions"):
        context_features(model, tok, [5] * 200, ["Birds can fly."], layer=1, progress=False)  # 200 + 64 > 256

def test_canonical_statement_strips_only_a_leading_hedge():
    from critics.data import canonical_statement

    assert canonical_statement("Generally, birds can fly.") == "Birds can fly."
    assert canonical_statement("typically , a bird can fly.") == "A bird can fly."
    assert canonical_statement("Birds generally fly.") == "Birds generally fly."
    assert canonical_statement("Generally birds fly.") == "Generally birds fly."  # no comma: not the template's adverb


def test_surface_floor_fires_on_the_old_hand_written_seed_set():
    """The old seed set's labels were readable from wording alone; the same floor that the shipped labels pass
    separates them almost perfectly, out of fold, by concept."""
    from pathlib import Path

    seed = Path(__file__).parent / "fixtures" / "generics_seed_handwritten.jsonl"
    old = load_annotations([seed])
    y_old = np.array([r["y"] for r in old])
    tr, _, te = grouped_split3([r["concept"] for r in old], y_old, 0.15, 0.2, 0)
    out = surface_floor([old[i] for i in tr], y_old[tr], [old[i] for i in te], y_old[te])
    from i2d2.filtering import ends_sentence

    new = [r for r in load_annotations([GEMMA]) if ends_sentence(r["statement"])]  # critic.complete_only
    y_new = np.array([r["y"] for r in new])
    tr, _, te = grouped_split3([r["concept"] for r in new], y_new, 0.15, 0.2, 0)
    ref = surface_floor([new[i] for i in tr], y_new[tr], [new[i] for i in te], y_new[te])
    assert out["surface_auc_train"] > 0.8 and out["surface_auc_test"] > 0.8
    assert out["surface_auc_test"] > ref["surface_auc_test"] + 0.1


def test_comparatives_label_set_is_labelled_gemma_output_without_votes():
    nc = ANNOTATION_DIR.parent / "comparatives"
    rows = read_jsonl(nc / "annotations_gemma.jsonl")
    six = {"True", "False", "Invalid", "Too vague to judge", "Too subjective to judge", "Too unfamiliar to judge"}
    assert len(rows) >= 600 and {r["label"] for r in rows} <= six
    assert not any(r.get("votes") for r in rows) and all(r["annotator"] == "maintainers" for r in rows)
    assert all(r["statement"].startswith("Compared to ") for r in rows) and len({r["concept"] for r in rows}) >= 80
    assert (nc / "GUIDE.md").exists() and (nc / "annotations_gemma.config.json").exists()
    assert not (nc / "annotations_seed.jsonl").exists()  # the invented-votes set is gone


def test_an_iterations_blind_accuracy_counts_its_own_draws_not_statements_another_iteration_drew(tmp_path):
    """A statement two iterations share, drawn for iteration 0's sample, counted in iteration 1's accuracy too:
    iteration 1's labelled set was its random draw plus what it shares with iteration 0's draw (n=47 and 46 of 40
    drawn each on the Gemma loop). Each iteration counts the draws made for it; a later round still reaches every
    statement (a statement labelled for another iteration is recorded as drawn, not exported again)."""
    import csv

    from i2d2.annotation import export_blind, heldout_accuracy, import_blind

    run = tmp_path / "run"
    texts = [["Shared fact."], ["Shared fact.", "Dogs bark.", "Cats purr.", "Owls hoot."]]
    for k, ts in enumerate(texts):
        d = run / f"iter_{k}" / "heldout"
        d.mkdir(parents=True)
        write_jsonl(d / "statements.jsonl", [{"statement": t, "concept": "c", "prompt_id": f"p{i}"} for i, t in enumerate(ts)])
    truth = {"Shared fact.": "false", "Dogs bark.": "true", "Cats purr.": "true", "Owls hoot.": "true"}

    def label(items, name):
        with open(tmp_path / name, "w", newline="") as f:
            w = csv.DictWriter(f, ["item_id", "statement", "label", "votes"])
            w.writeheader()
            w.writerows({"item_id": it["item_id"], "statement": it["statement"], "label": truth[it["statement"]],
                         "votes": ""} for it in items)
        import_blind(tmp_path / name, run)

    items = export_blind(run, tmp_path / "b1.csv", n_per_iteration=1, seed=0)
    drawn_1 = [it["statement"] for it in items if 1 in it["iterations"]]
    assert drawn_1 and drawn_1 != ["Shared fact."]  # this seed's draw for iteration 1: the case checked
    label(items, "done1.csv")
    acc = {r["iteration"]: r for r in heldout_accuracy(run)}
    assert (acc[0]["n_labelled"], acc[0]["accuracy"]) == (1, 0.0)
    assert (acc[1]["n_labelled"], acc[1]["accuracy"]) == (1, 1.0)  # was 2, 0.5: "Shared fact." counted too
    # a second round labels the rest of iteration 1; "Shared fact." needs no second label, only the record
    items = export_blind(run, tmp_path / "b2.csv", n_per_iteration=10, seed=0)
    assert sorted(it["statement"] for it in items) == sorted(set(truth) - {"Shared fact."} - set(drawn_1))
    label(items, "done2.csv")
    acc = {r["iteration"]: r for r in heldout_accuracy(run)}
    assert (acc[1]["n_labelled"], acc[1]["accuracy"]) == (4, 0.75) and acc[0]["n_labelled"] == 1
    assert export_blind(run, tmp_path / "b3.csv", n_per_iteration=10) == []  # every statement judged for each


def test_a_statement_generated_twice_counts_once_in_its_iterations_blind_accuracy(tmp_path):
    """The export draws distinct statements; the accuracy counted a labelled one once per generation that made it:
    n_labelled exceeded the labels (and the draws), and the Wilson interval was narrower than they support."""
    import csv

    from i2d2.annotation import export_blind, heldout_accuracy, import_blind

    run = tmp_path / "run"
    d = run / "iter_0" / "heldout"
    d.mkdir(parents=True)
    texts = ["Dogs bark.", "Dogs bark.", "Dogs bark.", "Cats fly."]
    write_jsonl(d / "statements.jsonl", [{"statement": t, "concept": "c", "prompt_id": f"p{i}"} for i, t in enumerate(texts)])
    items = export_blind(run, tmp_path / "b.csv", n_per_iteration=10)
    assert len(items) == 2
    with open(tmp_path / "done.csv", "w", newline="") as f:
        w = csv.DictWriter(f, ["item_id", "statement", "label", "votes"])
        w.writeheader()
        w.writerows({"item_id": it["item_id"], "statement": it["statement"],
                     "label": "true" if it["statement"] == "Dogs bark." else "false", "votes": ""} for it in items)
    import_blind(tmp_path / "done.csv", run)
    (acc,) = heldout_accuracy(run)
    assert (acc["n_generations"], acc["n_labelled"], acc["accuracy"]) == (4, 2, 0.5)


def test_a_blind_export_does_not_draw_a_statement_labelled_with_no_key(tmp_path):
    """A held-out label put into the store by hand (no key row) counts for every iteration; the export drew it again
    in every round, recorded nothing for it, and gave the iteration one statement fewer than --n."""
    from i2d2.annotation import export_blind, heldout_store

    run = tmp_path / "run"
    d = run / "iter_0" / "heldout"
    d.mkdir(parents=True)
    write_jsonl(d / "statements.jsonl", [{"statement": t, "concept": "c"} for t in ("Dogs bark.", "Cats purr.", "Owls hoot.")])
    heldout_store(run).parent.mkdir(parents=True)
    write_jsonl(heldout_store(run), [{"statement": "Dogs bark.", "concept": "c", "label": "true"}])
    for seed in range(5):
        items = export_blind(run, tmp_path / f"b{seed}.csv", n_per_iteration=2, seed=seed)
        assert sorted(it["statement"] for it in items) == ["Cats purr.", "Owls hoot."], seed
