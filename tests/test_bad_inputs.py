"""The bad-input table (issue 17): every malformed input fails with an error naming its file and line, or the
config key, or the model name, before any model loads. Each row is one parametrized test.

``python tests/test_bad_inputs.py`` prints the table (input, message, exit code) in markdown.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from process_env import launch_env

ROOT = Path(__file__).resolve().parent.parent
LATIN1 = "café au lait\n".encode("latin-1")  # 'é' as 0xE9: not UTF-8


def write(path: Path, *lines: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(x if isinstance(x, bytes) else (x + "\n").encode() for x in lines))
    return path


def compose(*overrides: str):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from i2d2.config import CONF_DIR

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return hydra_compose("train", overrides=["model=tiny_gpt2", "critic=tiny", "logger=none", *overrides])


# ----------------------------------------------------------------------------- the cases
# Each: (input, function(tmp_path) that must raise, exception type, regex the message must match).

def concepts_lines(t):
    from i2d2.concepts import load_lines

    load_lines(write(t / "nouns.txt", "violin", LATIN1))


def concepts_jsonl(t):
    from i2d2.concepts import load_jsonl

    load_jsonl(write(t / "c.jsonl", '{"concept": "violin"}', "", b'{"concept": "caf\xe9"}\n'))


def genericskb_tsv(t):
    from i2d2.concepts import load_genericskb

    load_genericskb(write(t / "kb.tsv", "term\tgeneric_sentence", "violin\tViolins have strings.", LATIN1))


def conceptnet_csv(t):
    from i2d2.concepts import load_conceptnet

    load_conceptnet(write(t / "cn.csv", "/a/1\t/r/IsA\t/c/en/violin\t/c/en/artifact\t{}", b"\xff\xfe\n"))


def phrases_latin1(t):
    from i2d2.concepts import load_phrases

    load_phrases(write(t / "relations.txt", "can", LATIN1))


def concepts_utf16(t):
    from i2d2.concepts import load_lines

    (t / "nouns.txt").write_text("violin\ncello\n", encoding="utf-16")
    load_lines(t / "nouns.txt")


def phrases_empty(t):
    from i2d2.concepts import load_phrases

    load_phrases(write(t / "relations.txt", "# only a comment"))


def genericskb_empty(t):
    from i2d2.concepts import load_genericskb

    load_genericskb(write(t / "kb.tsv"))


def concepts_missing(t):
    from i2d2.concepts import load_source

    load_source({"path": "nouns_typo.txt", "format": "lines"}, base_dir=str(t))


def concepts_raise_bad_line(t):
    from i2d2.concepts import load_lines

    load_lines(write(t / "nouns.txt", "violin", "a\tb"), on_error="raise")


def jsonl_broken_line(t):
    from i2d2.io import read_jsonl

    read_jsonl(write(t / "rows.jsonl", '{"statement": "x"}', '{"statement": "y"'))


def jsonl_not_object(t):
    from i2d2.io import read_jsonl

    read_jsonl(write(t / "rows.jsonl", '{"statement": "x"}', "", '["statement", "y"]'))


def jsonl_missing_field(t):
    from i2d2.io import read_jsonl

    read_jsonl(write(t / "rows.jsonl", '{"statement": "x"}', '{"label": "true"}'), required=("statement",))


def json_invalid(t):
    from i2d2.io import read_json

    read_json(write(t / "meta.json", "{", '  "delta": 0.5,', "}"))


def labels_latin1(t):
    from critics.data import load_annotations

    load_annotations([write(t / "labels.jsonl", '{"statement": "Violins have strings.", "concept": "violin", '
                                                '"label": "true"}', b'{"statement": "caf\xe9"}\n')])


def labels_csv_missing_column(t):
    from critics.data import load_annotations

    load_annotations([write(t / "labels.csv", "statement,label", "Violins have strings.,true")])


def labels_unknown_label(t):
    from critics.data import load_annotations

    load_annotations([write(t / "labels.jsonl", '{"statement": "Violins have strings.", "concept": "violin", '
                                                '"label": "maybe-ish"}')])


def negverse_sentences_latin1(t):
    from i2d2.negverse.data import read_sentences

    read_sentences(write(t / "eval_sentences.txt", "The sky is blue.", LATIN1))


def negverse_pairs_columns(t):
    from i2d2.negverse.data import read_pairs

    read_pairs(write(t / "pairs.tsv", "# original\tnegated\ttype", "The sky is blue.\tThe sky is not blue."))


def negverse_pairs_empty_original(t):
    from i2d2.negverse.data import read_pairs

    read_pairs(write(t / "pairs.tsv", "# original\tnegated\ttype", " \tThe sky is not blue.\tverbal"))


def labels_statement_not_text(t):
    from critics.data import load_annotations

    load_annotations([write(t / "labels.jsonl", '{"statement": 123, "concept": "dog", "label": "true"}')])


def cmp_corpus_latin1(t):
    from i2d2.cmp.data import load_quintuples

    load_quintuples(write(t / "corpus.jsonl", LATIN1))


def cmp_corpus_broken_row(t):
    from i2d2.cmp.data import BUNDLED, load_quintuples

    first = (BUNDLED / "corpus.jsonl").read_text().splitlines()[0]
    load_quintuples(write(t / "corpus.jsonl", first, '{"entity": "Paris", '))


def classes_latin1(t):
    from i2d2.comparatives.entities import load_classes_tsv

    load_classes_tsv(write(t / "classes.tsv", "class\tentity", "fruit\tapple", b"fruit\tcaf\xe9\n"))


def classes_bad_row(t):
    from i2d2.comparatives.entities import load_classes_tsv

    load_classes_tsv(write(t / "classes.tsv", "class\tentity", "fruit"))


def probes_broken(t):
    import numpy as np

    from critics.surface import score_probes

    score_probes(lambda xs: np.zeros(len(xs)), write(t / "probes.jsonl", '{"group": "g", "statement": "x"}'))


def generate_concepts_file_latin1(t):
    from omegaconf import OmegaConf

    from i2d2.generate import read_concepts

    read_concepts(OmegaConf.create({"concepts": [], "concepts_file": str(write(t / "mine.txt", "violin", LATIN1))}))


def generate_concepts_file_missing(t):
    from omegaconf import OmegaConf

    from i2d2.generate import read_concepts

    read_concepts(OmegaConf.create({"concepts": [], "concepts_file": str(t / "nope.txt")}))


def unknown_key(section_key):
    def case(t):
        from i2d2.train import check_start

        check_start(compose(f"+{section_key}=1"))
    return case


def unknown_model(name, key="model.name"):
    def case(t):
        from i2d2.train import check_start

        check_start(compose(f"{key}={name}"))
    return case


def bad_number(override):
    def case(t):
        from i2d2.recipes.generics import check_config

        check_config(compose(override))
    return case


def truncated_checkpoint(t):
    import torch

    from i2d2.io import load_state_dict

    torch.save({"state_dict": {"w": torch.ones(64)}}, t / "best.ckpt")
    (t / "best.ckpt").write_bytes((t / "best.ckpt").read_bytes()[:300])
    load_state_dict(t / "best.ckpt")


def run_dir_in_use(t):
    from i2d2.io import RunLock

    with RunLock(t / "run"):
        RunLock(t / "run").acquire()


def dir_is_a_file(t):
    from i2d2.io import write_jsonl

    write(t / "run_dir", "not a folder")
    write_jsonl(t / "run_dir" / "iter_0" / "rows.jsonl", [{"a": 1}])


CASES = [
    ("concept file (lines) not UTF-8", concepts_lines, "DataError", r"nouns\.txt:2: not valid UTF-8 .*column 4"),
    ("concept file (jsonl) not UTF-8", concepts_jsonl, "DataError", r"c\.jsonl:3: not valid UTF-8"),
    ("GenericsKB TSV not UTF-8", genericskb_tsv, "DataError", r"kb\.tsv:3: not valid UTF-8"),
    ("ConceptNet CSV not UTF-8", conceptnet_csv, "DataError", r"cn\.csv:2: not valid UTF-8"),
    ("relational-phrase list not UTF-8", phrases_latin1, "DataError", r"relations\.txt:2: not valid UTF-8"),
    ("concept file saved as UTF-16", concepts_utf16, "DataError", r"nouns\.txt:1: file is UTF-16"),
    ("empty relational-phrase list", phrases_empty, "DataError", r"relations\.txt: no relational phrases"),
    ("empty GenericsKB TSV", genericskb_empty, "DataError", r"kb\.tsv:1: empty file"),
    ("missing concept file", concepts_missing, "FileNotFoundError", r"concept file not found: .*nouns_typo\.txt"),
    ("TSV line in a lines file (on_error=raise)", concepts_raise_bad_line, "DataError", r"nouns\.txt:2: .*tab"),
    ("malformed JSONL line", jsonl_broken_line, "DataError", r"rows\.jsonl:2: "),
    ("JSONL line that is not an object", jsonl_not_object, "DataError", r"rows\.jsonl:3: expected a JSON object"),
    ("JSONL row without a required field", jsonl_missing_field, "DataError", r"rows\.jsonl:2: missing field\(s\) statement"),
    ("invalid JSON file", json_invalid, "DataError", r"meta\.json:3: invalid JSON"),
    ("label file not UTF-8", labels_latin1, "DataError", r"labels\.jsonl:2: not valid UTF-8"),
    ("label CSV without 'concept' column", labels_csv_missing_column, "DataError", r"labels\.csv:1: header lacks column\(s\) concept"),
    ("unknown label value", labels_unknown_label, "DataError", r"labels\.jsonl:1: .*maybe-ish"),
    ("NegVerse sentence file not UTF-8", negverse_sentences_latin1, "DataError", r"eval_sentences\.txt:2: not valid UTF-8"),
    ("NegVerse pairs TSV with 2 columns", negverse_pairs_columns, "DataError", r"pairs\.tsv:2: expected 'original<TAB>negated<TAB>type'"),
    ("NegVerse pairs TSV with an empty original", negverse_pairs_empty_original, "DataError", r"pairs\.tsv:2: the original sentence \(column 1\) is empty"),
    ("label file with a number as statement", labels_statement_not_text, "DataError", r"labels\.jsonl:1: field 'statement' must be text, got 123"),
    ("CMP corpus not UTF-8", cmp_corpus_latin1, "DataError", r"corpus\.jsonl:1: not valid UTF-8"),
    ("CMP corpus truncated row", cmp_corpus_broken_row, "DataError", r"corpus\.jsonl:2: invalid JSON"),
    ("comparatives class file not UTF-8", classes_latin1, "DataError", r"classes\.tsv:3: not valid UTF-8"),
    ("comparatives class file, row without entity", classes_bad_row, "DataError", r"classes\.tsv:2: expected 'class<TAB>entity"),
    ("critic probe file without fields", probes_broken, "DataError", r"probes\.jsonl:1: missing field\(s\) y, type"),
    ("generate.concepts_file not UTF-8", generate_concepts_file_latin1, "DataError", r"mine\.txt:2: not valid UTF-8"),
    ("generate.concepts_file missing", generate_concepts_file_missing, "GenerateError", r"generate\.concepts_file=.*nope\.txt: file not found"),
    ("unknown key +task.filter.dleta=1", unknown_key("task.filter.dleta"), "UnknownKeyError", r"task\.filter\.dleta"),
    ("unknown key +task.finetune.lrr=1", unknown_key("task.finetune.lrr"), "UnknownKeyError", r"task\.finetune\.lrr"),
    ("unknown key +task.finetune.lora.rank=1", unknown_key("task.finetune.lora.rank"), "UnknownKeyError", r"task\.finetune\.lora\.rank"),
    ("unknown key +decoding.beam_szie=1", unknown_key("decoding.beam_szie"), "UnknownKeyError", r"decoding\.beam_szie.*Known keys: decoding: .*beam_size"),
    ("model.name=nonexistent", unknown_model("nonexistent"), "UnknownModelError", r"'nonexistent' \(set by model\.name\)[\s\S]*packaged:gemma3-270m[\s\S]*tiny:gpt2"),
    ("model.name=packaged:gemma", unknown_model("packaged:gemma"), "UnknownModelError", r"'packaged:gemma'[\s\S]*packaged:gemma3-270m"),
    ("critic.name=tiny:robert", unknown_model("tiny:robert", "critic.name"), "UnknownModelError", r"'tiny:robert' \(set by critic\.name\)[\s\S]*tiny:roberta"),
    ("model.name=./runs/x/iter_0/model (missing folder)", unknown_model("./runs/x/iter_0/model"), "UnknownModelError", r"looks like a folder but does not exist"),
    ("task.filter.delta=2", bad_number("task.filter.delta=2"), "ConfigError", r"task\.filter\.delta: must be null .*got 2"),
    ("task.finetune.lr=0", bad_number("task.finetune.lr=0"), "ConfigError", r"task\.finetune\.lr: must be > 0"),
    ("iteration=-1", bad_number("iteration=-1"), "ConfigError", r"iteration: must be an integer >= 0"),
    ("decoding.beam_size=0", bad_number("decoding.beam_size=0"), "ConfigError", r"decoding\.beam_size: must be an integer >= 1, got 0"),
    ("task.max_prompts=0", bad_number("task.max_prompts=0"), "ConfigError", r"task\.max_prompts"),
    ("truncated checkpoint file", truncated_checkpoint, "DataError", r"best\.ckpt: damaged checkpoint: not a readable checkpoint"),
    ("run_dir already in use", run_dir_in_use, "RunLockedError", rf"run_dir .*run is in use by pid {os.getpid()}"),
    ("run_dir path is a file", dir_is_a_file, "FileExistsError|NotADirectoryError", r"cannot write .*rows\.jsonl"),
]


@pytest.mark.parametrize("what,case,exc,pattern", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_refused_naming_it(tmp_path, what, case, exc, pattern):
    with pytest.raises(Exception) as e:
        case(tmp_path)
    assert re.fullmatch(exc, type(e.value).__name__), f"{what}: {type(e.value).__name__}: {e.value}"
    assert re.search(pattern, str(e.value)), f"{what}: {e.value}"


def test_unknown_model_fails_in_under_a_second():
    from i2d2.models import UnknownModelError, check_model_name

    t0 = time.perf_counter()
    with pytest.raises(UnknownModelError):
        check_model_name("nonexistent", "causal LM", "model.name")
    assert time.perf_counter() - t0 < 1.0


# ----------------------------------------------------------------------------- read-only run_dir (real permissions)

def as_unprivileged(fn) -> tuple[str, str]:
    """Run ``fn()`` in a forked child without root's right to write anywhere; (exception type, message)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(r)
        try:
            if os.geteuid() == 0:
                os.setgid(65534)
                os.setuid(65534)  # nobody
            fn()
            out = ("", "")
        except BaseException as e:  # noqa: BLE001  (reported to the parent)
            out = (type(e).__name__, str(e))
        os.write(w, json.dumps(out).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        data = f.read()
    os.waitpid(pid, 0)
    return tuple(json.loads(data))


@pytest.fixture
def read_only_dir():
    d = Path(tempfile.mkdtemp(prefix="i2d2-ro-"))
    (d / "iter_0").mkdir()
    (d / "iter_0" / "rows.jsonl").write_text('{"a": 1}\n')
    for p in (d, d / "iter_0"):
        p.chmod(0o555)
    yield d
    for p in (d, d / "iter_0"):
        p.chmod(0o755)
    import shutil

    shutil.rmtree(d)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_read_only_run_dir_lock_fails_naming_the_file(read_only_dir):
    from i2d2.io import RunLock

    kind, msg = as_unprivileged(lambda: RunLock(read_only_dir).acquire())
    assert kind == "PermissionError" and f"cannot write {read_only_dir}/.i2d2.lock" in msg, (kind, msg)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_read_only_run_dir_writes_fail_and_leave_no_temp_file(read_only_dir):
    from i2d2.checkpoints import VerifiedCheckpointIO
    from i2d2.io import write_jsonl

    out = read_only_dir / "iter_0" / "rows.jsonl"
    kind, msg = as_unprivileged(lambda: write_jsonl(out, [{"a": 2}]))
    assert kind == "PermissionError" and f"cannot write {out}" in msg, (kind, msg)
    ckpt = read_only_dir / "iter_0" / "last.ckpt"
    kind, msg = as_unprivileged(lambda: VerifiedCheckpointIO().save_checkpoint({"state_dict": {}}, ckpt))
    assert kind == "PermissionError" and f"cannot write {ckpt}" in msg, (kind, msg)
    assert sorted(p.name for p in (read_only_dir / "iter_0").iterdir()) == ["rows.jsonl"]
    assert out.read_text() == '{"a": 1}\n'


# ----------------------------------------------------------------------------- the command line

def cli(*args: str, module: str = "i2d2.train") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=120, env=launch_env())


CLI_CASES = [
    ("python -m i2d2.train model.name=nonexistent", ["model.name=nonexistent"], r"Cannot resolve causal LM model 'nonexistent'"),
    ("python -m i2d2.train +task.filter.dleta=0.5", ["+task.filter.dleta=0.5"], r"unknown config key\(s\): task\.filter\.dleta"),
    # Hydra refuses iteraton=1 suggesting +iteraton=1, which it then took: the run started at iteration 0
    ("python -m i2d2.train +iteraton=1", ["+iteraton=1"], r"unknown config key\(s\): iteraton .*root: cache_dir"),
    # a preset group leaves no root key, and i2d2.train reads no generate section: both were accepted unread
    ("python -m i2d2.train +experiment.smoke=1", ["+experiment.smoke=1"], r"unknown config key\(s\): experiment "),
    ("python -m i2d2.train +generate.top_k=3", ["+generate.top_k=3"], r"unknown config key\(s\): generate "),
    ("python -m i2d2.train task.filter.delta=2", ["task.filter.delta=2"], r"task\.filter\.delta: must be null"),
    ("python -m i2d2.train task=negverse task.train.lr=1e-2x", ["task=negverse", "task.train.lr=1e-2x"],
     r"error: config value\(s\) of the wrong type: task\.train\.lr='1e-2x'"),
    ("python -m i2d2.train critic.monitor=val/foo", ["critic.monitor=val/foo"], r"critic\.monitor: must be"),
    ("python -m i2d2.train critic.perplexity_per=wrd", ["critic.perplexity_per=wrd"],
     r"critic\.perplexity_per: must be word or token"),
    # typed sections: Hydra's own message names the key; the exit code is the start-up one, 2
    ("python -m i2d2.train decoding.beam_size=abc", ["decoding.beam_size=abc"],
     r"full_key: decoding\.beam_size"),
    ("python -m i2d2.train critic=nonexistent", ["critic=nonexistent"], r"Could not find 'critic/nonexistent'"),
    ("python -m i2d2.train task.max_prompts=abc", ["task.max_prompts=abc"],
     r"error: config value\(s\) of the wrong type: task\.max_prompts='abc'"),
    ("python -m i2d2.train task=comparatives task.qa.source=nc_small", ["task=comparatives", "task.qa.source=nc_small"],
     r"error: task\.qa\.source: must be one of the cuts"),
    *((f"python -m i2d2.train task={t} trainer=ddp trainer.devices=2",  # one-process recipes: no racing ranks
       ["experiment=smoke", f"task={t}", "trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2"],
       rf"trainer\.devices: task={t} runs in one process, and this trainer config asks for 2")
      for t in ("comparatives", "negverse", "cmp")),
]


@pytest.mark.parametrize("what,args,pattern", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_cli_fails_at_start_up(tmp_path, what, args, pattern):
    r = cli(f"run_dir={tmp_path}/run", *args)
    assert r.returncode == 2 and re.search(pattern, r.stderr), r.stderr[-2000:]
    # nothing ran, and nothing is left: Hydra's log folder for the launch and the lock file were a new, misleading
    # run_dir of their own
    assert not (tmp_path / "run").exists(), sorted(p.name for p in (tmp_path / "run").rglob("*"))


@pytest.mark.parametrize("override,key", [("generate.concept=[violins]", "generate.concept"),
                                          ("decoding.beam_size=abc", "decoding.beam_size")])
def test_generate_exits_2_on_a_config_hydra_cannot_compose(tmp_path, override, key):
    # Hydra's own message names the key; the exit code was Hydra's 1 (a failed run), not the start-up 2 of i2d2.train
    r = cli(f"run_dir={tmp_path}/run", override, module="i2d2.generate")
    assert r.returncode == 2 and f"full_key: {key}" in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]


@pytest.mark.parametrize("module,usage", [("i2d2.train", "python -m i2d2.train (i2d2-train) [task="),
                                          ("i2d2.generate", "python -m i2d2.generate (i2d2-generate) generate.concepts=")])
def test_help_says_how_to_call_the_command(module, usage):
    # --help began with Hydra's "train is powered by Hydra." and the config groups: no word on what the command does
    r = cli("--help", module=module)
    assert r.returncode == 0 and r.stdout.startswith(usage), r.stdout[:500]


@pytest.mark.parametrize("module", ["i2d2.train", "i2d2.generate"])
def test_help_lists_only_the_config_groups_a_user_picks(module):
    # the typed configs (i2d2/schemas.py) were stored as config groups: --help listed "schema: cross_encoder,
    # finetune, negverse_filters, ..." beside task and model, and "schema" among the decoding and critic options
    r = cli("--help", module=module)
    assert r.returncode == 0, r.stderr[-2000:]
    groups = r.stdout.split("== Configuration groups ==", 1)[1].split("== Config ==", 1)[0]
    listed = dict(line.split(": ", 1) for line in groups.splitlines() if ": " in line)
    assert {"task", "model", "critic", "decoding", "data", "trainer", "logger", "experiment"} <= set(listed), groups
    assert "schema" not in groups, groups
    assert listed["decoding"] == "comparatives, i2d2" and "minilm" in listed["critic"].split(", "), groups
    # nor the conf/ folders no one picks: "negverse: cues" and "wordlists: comparatives" (data files the code reads)
    # and "experiment/smoke: cmp, ..." (the task shares experiment=smoke composes, refused when chosen alone)
    assert not {"negverse", "wordlists", "experiment/smoke"} & set(listed), groups
    assert listed["experiment"].split(", ") == ["paper_cmp", "paper_comparatives", "paper_i2d2", "paper_negverse",
                                                "smoke"] and "cmp, cmp_qa" in listed["cmp/variant"], groups
    assert r.stdout.rstrip().endswith("Use --hydra-help to view Hydra specific help") and "\ntask:" in r.stdout


@pytest.mark.parametrize("value", ["", "null"])
def test_a_run_dir_that_names_no_folder_is_refused(tmp_path, value):
    # run_dir= ran in the working directory (Hydra's log folder went to /hydra); run_dir=null into a folder 'None'
    (tmp_path / "cwd").mkdir()
    (tmp_path / "tmp").mkdir()
    r = subprocess.run([sys.executable, "-m", "i2d2.train", f"run_dir={value}"], capture_output=True, text=True,
                       cwd=tmp_path / "cwd", timeout=120, env=launch_env(TMPDIR=str(tmp_path / "tmp")))
    assert r.returncode == 2 and "error: run_dir: must name a folder" in r.stderr, r.stderr[-2000:]
    assert list((tmp_path / "cwd").iterdir()) == [] and list((tmp_path / "tmp").iterdir()) == []


def test_a_cache_dir_that_is_a_file_is_refused(tmp_path):
    # a FileExistsError traceback once the run had started (lock taken, loggers up)
    (tmp_path / "notes.txt").write_text("kept\n")
    r = cli(f"run_dir={tmp_path}/run", f"cache_dir={tmp_path}/notes.txt/cache")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert f"error: cache_dir: must name a folder, but {tmp_path}/notes.txt is a file" in r.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("module", ["i2d2.train", "i2d2.generate"])
@pytest.mark.parametrize("inside", ["", "/run"])
def test_a_run_dir_that_is_a_file_is_refused(tmp_path, module, inside):
    # Hydra made its log folder inside it first: a NotADirectoryError traceback, naming no key
    (tmp_path / "tmp").mkdir()
    (tmp_path / "notes.txt").write_text("kept\n")
    r = subprocess.run([sys.executable, "-m", module, f"run_dir={tmp_path}/notes.txt{inside}",
                        "generate.concepts=[violins]" if module == "i2d2.generate" else "iteration=0"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120,
                       env=launch_env(TMPDIR=str(tmp_path / "tmp")))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert f"error: run_dir: must name a folder, but {tmp_path}/notes.txt is a file" in r.stderr, r.stderr[-2000:]
    assert (tmp_path / "notes.txt").read_text() == "kept\n" and list((tmp_path / "tmp").iterdir()) == []


def test_a_refused_launch_removes_only_what_it_made(tmp_path):
    run = tmp_path / "run"
    live = run / "hydra" / "2026-01-01_00-00-00_1"  # another launch's log folder: Hydra's files only
    (live / ".hydra").mkdir(parents=True)
    (live / "train.log").write_text("")
    (run / "iter_0").mkdir()
    (run / "iter_0" / "rows.jsonl").write_text('{"a": 1}\n')
    before = sorted(str(p.relative_to(run)) for p in run.rglob("*"))

    def files():
        return sorted(str(p.relative_to(run)) for p in run.rglob("*") if p.name not in (".i2d2.lock", "_LOCK.json"))

    r = cli(f"run_dir={run}", "task.filter.delta=2")  # refused after the lock was taken
    assert r.returncode == 2 and "task.filter.delta" in r.stderr, r.stderr[-2000:]
    assert files() == before
    from i2d2.io import RunLock

    with RunLock(run):  # a live launch holds it: the refused one removes its own log folder, nothing of the other's
        r = cli(f"run_dir={run}")
        assert r.returncode == 2 and "is in use by" in r.stderr, r.stderr[-2000:]
        assert files() == before
    # run_dirs that existed before the launch stay, empty or not, the working directory too
    for where, run_dir in ((tmp_path, "empty"), (tmp_path / "empty", ".")):
        (tmp_path / "empty").mkdir(exist_ok=True)
        r = subprocess.run([sys.executable, "-m", "i2d2.train", f"run_dir={run_dir}", "task.filter.delta=2"],
                           capture_output=True, text=True, cwd=where, timeout=120, env=launch_env())
        assert r.returncode == 2 and (tmp_path / "empty").is_dir(), r.stderr[-2000:]
        assert not (tmp_path / "empty" / "hydra").exists()
    # a log folder named by hand is the user's, not this launch's
    fixed = run / "hydra" / "main"
    r = cli(f"run_dir={run}", f"hydra.run.dir={fixed}", "task.filter.delta=2")
    assert r.returncode == 2 and (fixed / ".hydra").is_dir(), r.stderr[-2000:]


def table() -> str:
    """The bad-input table of the issue, from the cases above. Exit codes: the CLI rows are measured; for the
    function-level rows, 2 = refused by ``python -m i2d2.train`` at start-up (``error:`` line, nothing loaded),
    1 = raised inside the run (Hydra prints the message and exits 1)."""
    rows = ["| # | input | message (first line) | exit code |", "|---|---|---|---|"]
    startup = ("UnknownKeyError", "UnknownModelError", "RunLockedError", "ConfigError")
    for i, (what, case, exc, _) in enumerate(CASES, 1):
        with tempfile.TemporaryDirectory() as d:
            try:
                case(Path(d))
                msg, code = "(no error!)", 0
            except Exception as e:  # noqa: BLE001
                msg = f"{type(e).__name__}: {str(e).splitlines()[0]}".replace(d, "$TMP")
                code = 2 if type(e).__name__ in startup else 1
        rows.append(f"| {i} | {what} | `{msg[:150]}` | {code} |")
    for what, args, _ in CLI_CASES:
        with tempfile.TemporaryDirectory() as d:
            r = cli(f"run_dir={d}/run", *args)
        first = next((ln for ln in r.stderr.splitlines() if ln.startswith("error:")), r.stderr[-150:])
        rows.append(f"| {len(rows) - 1} | `{what}` | `{first[:150]}` | {r.returncode} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(table())


def test_a_cache_dir_under_home_that_is_a_file_is_refused(tmp_path, monkeypatch):
    # models.use_cache_dir expands ~; the start-up check looked at a literal '~' folder and let it through
    from i2d2.config import ConfigError
    from i2d2.train import check_start

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "notes.txt").write_text("kept\n")
    with pytest.raises(ConfigError, match=rf"cache_dir: must name a folder, but {tmp_path}/notes.txt is a file"):
        check_start(compose(f"run_dir={tmp_path}/run", "cache_dir='~/notes.txt/cache'"))
