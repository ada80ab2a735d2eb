"""Inputs the loop reads only after generation (or after the LM loads), read at start-up now: each bad one is
refused by the recipe's check_config, naming its key (and file:line), before anything loads or is overwritten."""

import json

import pytest

from i2d2.config import CONF_DIR, ConfigError


def _cfg(tmp_path, *overrides):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return compose("train", overrides=["logger=none", f"run_dir={tmp_path}/run", *overrides])


@pytest.fixture
def labels(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "broken.jsonl").write_text('{"statement": "Dogs bark."\n')
    return tmp_path


GENERICS = [  # critic.seed_annotations: read by the critic stage, after generation
    ("critic.seed_annotations=[{t}/missing.jsonl]", r"critic\.seed_annotations: annotation file '.*missing\.jsonl' not found"),
    ("critic.seed_annotations=[{t}/empty.jsonl]", r"critic\.seed_annotations: only 0 usable annotated statements .*"
                                                  r"critic\.min_examples = 20"),
    ("critic.seed_annotations=[{t}/broken.jsonl]", r"critic\.seed_annotations: .*broken\.jsonl:1: broken row"),
    ("critic.seed_annotations=[]", r"critic\.seed_annotations: no annotation files"),
]


@pytest.mark.parametrize("override,pattern", GENERICS, ids=[g[0].split("=", 1)[1] for g in GENERICS])
def test_generics_critic_labels_are_read_at_start_up(labels, override, pattern):
    from i2d2.recipes.generics import check_config

    for kind in ("probe", "finetune"):  # the probe read them for its few-shot context only; a fine-tuned critic never
        with pytest.raises(ConfigError, match=pattern):
            check_config(_cfg(labels, f"critic.kind={kind}", override.format(t=labels)))


def test_generics_default_labels_pass(tmp_path):
    from i2d2.recipes.generics import check_config

    check_config(_cfg(tmp_path))


@pytest.mark.parametrize("task", ["i2d2", "comparatives"])
def test_the_start_up_check_reads_the_labels_without_logging_them(tmp_path, caplog, task):
    """check_config reads the critic's labels as its stage will; each reading logged "annotations: 3658 rows ...",
    three times in a default run (i2d2.train's check, the recipe's run() again, the critic stage): now only the
    stage that trains on them logs the line."""
    import logging
    import importlib

    from critics.train import critic_config, labelled_splits

    cfg = _cfg(tmp_path, f"task={task}")
    with caplog.at_level(logging.INFO):
        importlib.import_module(f"i2d2.recipes.{'generics' if task == 'i2d2' else task}").check_config(cfg)
        assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("annotations:")] == []
        labelled_splits(critic_config(cfg.critic), list(cfg.critic.seed_annotations))  # as the critic stage reads
    assert len([r for r in caplog.records if r.getMessage().startswith("annotations:")]) == 1


NC = [
    ("task.filters.discriminator.annotations=[{t}/empty.jsonl]",
     r"task\.filters\.discriminator\.annotations: only 0 usable annotated statements"),
    ("task.filters.discriminator.annotations=[{t}/broken.jsonl]",
     r"task\.filters\.discriminator\.annotations: .*broken\.jsonl:1: broken row"),
    ("task.filters.discriminator.annotations=[{t}/missing.jsonl]",
     r"^task\.filters\.discriminator\.annotations: .*missing\.jsonl not found"),
    # failed with a KeyError in the groups filter after generation and dedup, having removed filtered/groups/ first
    ("task.filters.groups.keys=[aux,bogus]", r"task\.filters\.groups\.keys: must be a non-empty list of"),
    ("data.prompt_filter.per=char", r"data\.prompt_filter\.per: must be word or token, got 'char'"),
    ("data.entity_filter.min_count=-5", r"data\.entity_filter\.min_count: must be a number > 0, got -5"),
    ("data.entity_filter.source={t}/missing.txt", r"data\.entity_filter\.source: must be wordfreq or a text file"),
    ("data.entity_filter.min_count=1e12",  # was prefixed data.classes
     r"^data\.entity_filter\.min_count: .*no entity pairs .*\d+ entities loaded, 0 left after data\.entity_filter"),
    ("data.format=csv", r"^data\.format: must be one of auto, json, tsv, wikidata, got 'csv'"),  # was data.classes
    ("task.constraints.negatives=[bogus]", r"task\.constraints: unknown negative set\(s\) \['bogus'\]"),
    ("task.wordlists={t}/missing.yaml", r"task\.wordlists: comparatives word lists not found"),
    # named the generated prompts.jsonl, at generation, not the key
    ("task.constraints.order.aux=[0]", r"task\.constraints: aux: positions must be a non-empty list of ints"),
    ("+task.constraints.order.bogus=[1]", r"task\.constraints\.order: must map some of"),
    # scikit-learn's split failed on it once the contradiction stage had begun
    ("task.filters.contradiction.cross_encoder.val_fraction=2",
     r"task\.filters\.contradiction\.cross_encoder\.val_fraction: must be in \(0, 1\), got 2"),
    ("task.filters.contradiction.cross_encoder.lr=0", r"cross_encoder\.lr: must be > 0"),
    ("task.filters.contradiction.cross_encoder.max_steps=0", r"cross_encoder\.max_steps: must be -1"),
]


@pytest.mark.parametrize("override,pattern", NC, ids=[n[0] for n in NC])
def test_comparatives_inputs_are_read_at_start_up(labels, override, pattern):
    from i2d2.recipes.comparatives import check_config

    # the benchmark reads the discriminator's labels too, first (test_comparatives_recipe.py): here the discriminator
    cfg = _cfg(labels, "task=comparatives", "task.qa.benchmark=false", override.format(t=labels))
    with pytest.raises(ConfigError, match=pattern):
        check_config(cfg)


def test_comparatives_discriminator_labels_are_read_without_the_benchmark(labels):
    # they were read at start-up only when task.qa.benchmark and task.qa.evaluate were both on
    from i2d2.recipes.comparatives import check_config

    cfg = _cfg(labels, "task=comparatives", "task.qa.benchmark=false",
               f"task.filters.discriminator.annotations=[{labels}/empty.jsonl]")
    with pytest.raises(ConfigError, match="only 0 usable"):
        check_config(cfg)
    check_config(_cfg(labels, "task=comparatives", "task.qa.benchmark=false", "task.filters.discriminator.enabled=false",
                      f"task.filters.discriminator.annotations=[{labels}/empty.jsonl]"))


def test_no_concepts_names_the_sources_read(tmp_path):
    from i2d2.io import DataError
    from i2d2.prompts import prompt_candidates

    (tmp_path / "nouns.txt").write_text("# nothing yet\n")
    cfg = _cfg(tmp_path, f"data.sources.nouns.path={tmp_path}/nouns.txt", "data.sources.related=null",
               "data.sources.goals=null")
    with pytest.raises(DataError, match=rf"no concepts loaded from data\.sources\.nouns={tmp_path}/nouns\.txt "
                                        r"\(empty files\?\)"):
        prompt_candidates(cfg.data)


@pytest.mark.parametrize("override,pattern", [
    ("data.goal_prefixes=[]", r"data\.goal_prefixes must be a non-empty list .*data\.sources\.goals=null"),
    ("data.adverbs=[Generally,'']", r"data\.adverbs must be a list of non-empty strings"),
])
def test_prompt_word_lists_are_checked_at_start_up(tmp_path, override, pattern):
    from i2d2.recipes.generics import check_config

    with pytest.raises(ConfigError, match=pattern):
        check_config(_cfg(tmp_path, override))
    check_config(_cfg(tmp_path, "data.adverbs=[]"))  # bare forms only: a choice, not an error


@pytest.mark.parametrize("overrides,pattern", [
    (["task.report.samples=-3"], r"task\.report\.samples: must be an integer >= 0, got -3"),
    (["task.report.self_bleu_sample=1"], r"task\.report\.self_bleu_sample: must be an integer >= 2, got 1"),
    (["task=comparatives", "task.samples=-3"], r"task\.samples: must be an integer >= 0, got -3"),
])
def test_report_sample_sizes_are_checked(tmp_path, overrides, pattern):
    # a negative count was taken as "all but n" by a slice or head()
    from importlib import import_module

    recipe = import_module(f"i2d2.recipes.{'comparatives' if 'task=comparatives' in overrides else 'generics'}")
    with pytest.raises(ConfigError, match=pattern):
        recipe.check_config(_cfg(tmp_path, *overrides))


def test_lora_target_modules_are_checked_against_the_generator_at_start_up(tmp_path):
    # peft refused them only when fine-tuning began, after generation and the critic
    from i2d2.recipes.generics import check_config

    lora = ["model=tiny_gpt2", "task.finetune.lora.enabled=true"]
    with pytest.raises(ConfigError, match=r"task\.finetune\.lora: cannot apply LoRA to GPT2LMHeadModel: Target "
                                          r"modules \{'nope'\} not found"):
        check_config(_cfg(tmp_path, *lora, "task.finetune.lora.target_modules=[nope]"))
    check_config(_cfg(tmp_path, *lora, "task.finetune.lora.target_modules=[c_attn]"))
    check_config(_cfg(tmp_path, *lora))  # null: peft's default for the architecture


def test_comparatives_start_up_does_not_build_every_pair(tmp_path, monkeypatch):
    # entity_pairs built all pairs (1.7M at the paper's scale: 12 s and 1.6 GB more at start-up) to see one exists
    import i2d2.recipes.comparatives as C

    monkeypatch.setattr(C, "make_pairs", lambda *a, **k: (_ for _ in ()).throw(AssertionError("pairs built")))
    C.check_config(_cfg(tmp_path, "task=comparatives", "task.qa.benchmark=false"))


def test_home_relative_input_paths_are_read_where_start_up_found_them(tmp_path, monkeypatch):
    # '~/' passed the start-up existence checks (which expand it), then the readers opened a literal './~/...'
    # (FileNotFoundError in the prompts stage; the cross-encoder's statements once the contradiction stage began)
    import shutil

    from critics.contradiction import ComparativeDirectionScorer, cross_encoder_config, cross_encoder_dir, \
        source_statements
    from i2d2.comparatives.entities import BUNDLED
    from i2d2.recipes.comparatives import check_config, entity_classes, prompt_input_files

    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(BUNDLED, home / BUNDLED.name)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)  # where a literal '~' would be looked for
    (home / "corpus.txt").write_text("A car and a bicycle.\nCars, bicycles and a motorcycle.\n")
    (home / "statements.jsonl").write_text(json.dumps({"statement": "Compared to bikes, cars are usually faster."})
                                           + "\n")
    cfg = _cfg(tmp_path, "task=comparatives", "task.qa.benchmark=false", "task.filters.discriminator.enabled=false",
               "data.entity_filter.source='~/corpus.txt'", "data.entity_filter.min_count=1",
               f"data.classes='~/{BUNDLED.name}'",
               "task.filters.contradiction.scorer=cross_encoder",
               "task.filters.contradiction.cross_encoder.statements=['~/statements.jsonl']",
               "task.filters.contradiction.cross_encoder.dir='~/ce'")
    check_config(cfg)
    classes, _, freq = entity_classes(cfg)  # the prompts stage's reader
    assert freq["n_entities_out"] == 3 and {e.name for e in classes["road vehicle"]} == {"car", "bicycle", "motorcycle"}
    # the prompts stage's fingerprint reads the files themselves (a '~/' path was hashed as missing)
    assert prompt_input_files(cfg) == (home / BUNDLED.name, home / "corpus.txt")
    ce = cross_encoder_config(cfg.task.filters.contradiction.cross_encoder)
    assert [r["statement"] for r in source_statements(ce["statements"])] == [
        "Compared to bikes, cars are usually faster."]
    assert cross_encoder_dir(ce, ComparativeDirectionScorer()) == home / "ce"
    # the cache folder's name fingerprints the statements' bytes (a '~/' file was hashed as missing)
    ce["dir"] = None
    before = cross_encoder_dir(ce, ComparativeDirectionScorer())
    (home / "statements.jsonl").write_text(json.dumps({"statement": "Compared to cars, bikes are usually slower."})
                                           + "\n")
    assert cross_encoder_dir(ce, ComparativeDirectionScorer()) != before


def test_cross_encoder_statements_files_are_checked_only_for_the_cross_encoder(labels):
    # the existence check sat in CrossEncoderConfig.__post_init__: a missing file was refused even with another
    # scorer, which never reads it; the value ranges are still checked whichever scorer is chosen
    from i2d2.recipes.comparatives import check_config

    missing = f"task.filters.contradiction.cross_encoder.statements=[{labels}/missing.jsonl]"
    base = ("task=comparatives", "task.qa.benchmark=false", "task.filters.discriminator.enabled=false", missing)
    for scorer in ("offline", "roberta-large-mnli"):
        check_config(_cfg(labels, *base, f"task.filters.contradiction.scorer={scorer}"))
        with pytest.raises(ConfigError, match=r"^task\.filters\.contradiction\.cross_encoder\.lr: must be > 0"):
            check_config(_cfg(labels, *base, f"task.filters.contradiction.scorer={scorer}",
                              "task.filters.contradiction.cross_encoder.lr=0"))
    for scorer in ("cross_encoder", "null"):  # null: load_contradiction_scorer's default, the cross-encoder
        with pytest.raises(ConfigError, match=r"^task\.filters\.contradiction\.cross_encoder\.statements: "
                                              r".*missing\.jsonl is not a file"):
            check_config(_cfg(labels, *base, f"task.filters.contradiction.scorer={scorer}"))


def test_too_few_discriminator_labels_name_the_min_examples_key_that_set_the_limit(tmp_path):
    # the limit was always named critic.min_examples, also where the task's override
    # task.filters.discriminator.critic.min_examples had set it
    from i2d2.recipes.comparatives import check_config

    rows = [{"statement": f"Compared to cats, dogs are usually louder {i}.", "concept": f"cat{i} | dog{i}",
             "label": "True" if i % 2 else "False"} for i in range(4)]
    (tmp_path / "few.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    base = ("task=comparatives", "task.qa.benchmark=false", f"task.filters.discriminator.annotations=[{tmp_path}/few.jsonl]")
    files = r"^task\.filters\.discriminator\.annotations: only 4 usable annotated statements in \[.*few\.jsonl'\] "
    with pytest.raises(ConfigError, match=files + r"\(need >= critic\.min_examples = 7\)"):
        check_config(_cfg(tmp_path, *base, "critic.min_examples=7"))
    with pytest.raises(ConfigError, match=files + r"\(need >= task\.filters\.discriminator\.critic\.min_examples = 9\)"):
        check_config(_cfg(tmp_path, *base, "critic.min_examples=7", "+task.filters.discriminator.critic.min_examples=9"))
    unfinished = r"; 1 unfinished left out \(task\.filters\.discriminator\.critic\.complete_only\)"
    (tmp_path / "few.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows)
                                        + json.dumps({**rows[0], "statement": "Compared to cats, dogs are"}) + "\n")
    with pytest.raises(ConfigError, match=files + r".*" + unfinished):
        check_config(_cfg(tmp_path, *base, "task.filters.discriminator.critic.complete_only=true"))


def test_one_label_check_serves_the_generics_critic_and_the_comparatives_discriminator(tmp_path):
    """The discriminator's start-up check was its own copy of critics.train.checked_labels (read, split, prefix the
    key); the one function names the key the files came from and the key each limit came from."""
    from critics.train import checked_labels
    from i2d2.schemas import CriticConfig, fill

    rows = [{"statement": f"Compared to cats, dogs are usually louder {i}.", "concept": f"cat{i} | dog{i}",
             "label": "True" if i % 2 else "False"} for i in range(4)]
    (tmp_path / "few.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    ccfg = fill(CriticConfig, {"min_examples": 9}, where="critic")
    disc = "task.filters.discriminator"
    with pytest.raises(ConfigError, match=rf"^{disc}\.annotations: only 4 usable .*\(need >= {disc}\.critic\."
                                          r"min_examples = 9\)"):
        checked_labels(ccfg, [tmp_path / "few.jsonl"], where=f"{disc}.annotations",
                       keys={"min_examples": f"{disc}.critic.min_examples"})
    with pytest.raises(ConfigError, match=r"^critic\.seed_annotations: only 4 usable .*\(need >= critic\.min_examples"):
        checked_labels(ccfg, [tmp_path / "few.jsonl"])


def test_entity_class_errors_name_the_classes_or_the_filter_key(tmp_path):
    # every error of the classes check was prefixed data.classes, also a data.entity_filter that left no pair; and
    # classes without a pair were blamed on the filter ('2 entities loaded, 2 left after data.entity_filter')
    from i2d2.recipes.comparatives import check_config

    (tmp_path / "single.json").write_text(json.dumps({"pet": ["dog"], "tool": ["hammer"]}))
    base = ("task=comparatives", "task.qa.benchmark=false", "task.filters.discriminator.enabled=false")
    for enabled in ("true", "false"):
        with pytest.raises(ConfigError, match=r"^data\.classes: .*single\.json: no entity pairs \(need classes with "
                                              r">= 2 distinct entities\)$"):
            check_config(_cfg(tmp_path, *base, f"data.classes={tmp_path}/single.json", "data.min_entities=1",
                              f"data.entity_filter.enabled={enabled}"))
    from i2d2.comparatives.entities import load_classes

    n = sum(len(v) for v in load_classes(None, "auto", 2).values())  # the bundled classes: no count to keep in step
    with pytest.raises(ConfigError, match=rf"^data\.entity_filter\.min_count: .*no entity pairs .*; {n} entities "
                                          r"loaded, 0 left after data\.entity_filter"):
        check_config(_cfg(tmp_path, *base, "data.entity_filter.min_count=1e12"))
    check_config(_cfg(tmp_path, *base, "data.entity_filter.min_count=1e12", "data.entity_filter.enabled=false"))


def test_start_up_checks_do_not_log_what_the_stages_log_again(tmp_path, caplog):
    # check_config reads the labels and the entity classes as their stages do: their INFO summaries ("annotations:
    # 708 rows (267 valid) ...", "entity frequency filter ...") were printed twice, the labels' three times; the
    # check reads them quietly and the stage that uses them logs them
    import logging

    from i2d2.recipes.comparatives import entity_classes
    from i2d2.train import check_recipe

    cfg = _cfg(tmp_path, "task=comparatives")
    with caplog.at_level(logging.INFO):
        check_recipe(cfg)
        assert not [r for r in caplog.records if r.levelno < logging.WARNING], caplog.text
        entity_classes(cfg)  # the prompts stage's reader
    assert [r.getMessage() for r in caplog.records].count(caplog.records[0].getMessage()) == 1
    assert caplog.records[0].getMessage().startswith("entity frequency filter (wordfreq, >= 100 occurrences)")
