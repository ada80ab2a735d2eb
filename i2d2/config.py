"""Hydra/OmegaConf glue: resolvers used by conf/, and the shared run set-up."""

from __future__ import annotations

import logging
import os
from importlib.resources import files
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

# conf/ sits at the top of the checkout and is installed as this package (setup.py): in a wheel it is
# site-packages/i2d2/_conf, in an editable install the checkout's conf/.
CONF_PACKAGE = "i2d2._conf"
HYDRA_CONFIG_PATH = f"pkg://{CONF_PACKAGE}"  # config_path of the Hydra entry points


def _conf_dir() -> Path:
    try:
        return Path(str(files(CONF_PACKAGE)))
    except ModuleNotFoundError:
        raise ModuleNotFoundError(f"{CONF_PACKAGE} (the configs) is not installed: run `pip install -e .` in the "
                                  "checkout, or install the i2d2 wheel") from None


CONF_DIR = _conf_dir()


def conf_path(rel: str) -> str:
    """Absolute path of a file under conf/ (e.g. the DeepSpeed JSON a trainer option names)."""
    path = CONF_DIR / rel
    if not path.exists():
        raise FileNotFoundError(f"conf file {rel!r} not found under {CONF_DIR}")
    return str(path)


def wandb_mode() -> str:
    """'online' only when the user configured W&B; a run never waits on the network otherwise."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    netrc = Path.home() / ".netrc"
    if netrc.exists() and "api.wandb.ai" in netrc.read_text(errors="ignore"):
        return "online"
    return "offline"


# Hydra's log folders this process named (absolute path -> run_dir and whether it existed before Hydra made it), so
# that a launch refused at start-up removes only what it made (i2d2.train.discard_launch_folders)
LAUNCH_DIRS: dict[str, dict] = {}


def file_in_the_way(run_dir) -> Path | None:
    """The file at ``run_dir`` or at one of its parents, which makes it no folder (Hydra's ``mkdir`` of its log
    folder inside it was a NotADirectoryError traceback); None when run_dir is, or can be made, a folder."""
    for path in (Path(str(run_dir)), *Path(str(run_dir)).parents):
        if path.exists():
            return None if path.is_dir() else path
    return None


def launch_dir(run_dir, name: str) -> str:
    """``hydra.run.dir``: ``<run_dir>/hydra/<name>_<pid>``. The pid makes it this process's own (two launches in
    the same second shared one folder and one log), and Hydra resolves this before it makes any folder, so whether
    run_dir already existed is known here. An empty or null run_dir (``run_dir=`` put the log folder at /hydra,
    ``run_dir=null`` in a folder named None) gets a folder under the temporary directory instead, for as long as
    the start-up check takes to refuse it (an error raised here was a page of Hydra traceback); so does a run_dir
    that is a file, or inside one."""
    if run_dir is None or not str(run_dir).strip() or file_in_the_way(run_dir):
        import tempfile

        run_dir = Path(tempfile.gettempdir()) / f"i2d2-no-run-dir-{os.getpid()}"
    path = Path(str(run_dir)) / "hydra" / f"{name}_{os.getpid()}"
    LAUNCH_DIRS.setdefault(str(path.absolute()), {"run_dir": Path(str(run_dir)).absolute(),
                                                  "run_dir_existed": Path(str(run_dir)).exists()})
    return str(path)


def run_dir_key(*, _root_) -> str:
    """``run_dir`` for the hydra node's folders (conf/train.yaml). A run or a multirun resolves them in the whole
    config; ``--cfg hydra --resolve`` resolves the hydra node with every other key deleted (``${run_dir}``: "key
    'run_dir' not found"), but Hydra set HydraConfig first, and its hydra node keeps the whole config as parent."""
    if "run_dir" in _root_:
        return _root_.run_dir
    from hydra.core.hydra_config import HydraConfig

    return OmegaConf.select(HydraConfig.get(), "..run_dir", throw_on_missing=True)


# conf/ folders that Hydra sees as config groups but a user does not pick, left out of --help's group listing: data
# files the code reads itself (negverse/cues.yaml, wordlists/comparatives.yaml) and the task shares experiment=smoke
# composes (experiment/smoke/<task>, refused when chosen alone: i2d2.train.check_preset_overrides)
UNPICKED_GROUPS = ("negverse", "wordlists", "experiment/smoke")


def help_config_groups() -> str:
    """``hydra.help.template``'s group listing (conf/train.yaml): Hydra's ``$APP_CONFIG_GROUPS`` (every group but
    hydra/*, as ``group: option, ...`` lines) less ``UNPICKED_GROUPS``. Resolved while Hydra prints --help, when its
    config loader is set up; empty elsewhere (a config resolved outside a Hydra app)."""
    from hydra.core.global_hydra import GlobalHydra

    app = GlobalHydra.instance().hydra if GlobalHydra.instance().is_initialized() else None
    if app is None:
        return ""
    return app.format_config_groups(
        lambda group: group.split("/")[0] != "hydra" and group not in UNPICKED_GROUPS).rstrip("\n")


def register_resolvers() -> None:
    for name, fn in {"i2d2.conf_path": conf_path, "i2d2.wandb_mode": wandb_mode, "i2d2.launch_dir": launch_dir,
                     "i2d2.run_dir": run_dir_key, "i2d2.help_config_groups": help_config_groups}.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)


register_resolvers()

from i2d2 import schemas  # noqa: E402  (typed defaults: decoding, critic, fine-tuning, NegVerse)

schemas.register()


def _drop_lightning_tips(record: logging.LogRecord) -> bool:
    """Lightning prints an advertisement ("💡 Tip: ... try installing litlogger") for every Trainer it builds,
    several times a run."""
    return not str(record.msg).startswith("💡 Tip:")


def _drop_deepspeed_cpu_notice(record: logging.LogRecord) -> bool:
    """DeepSpeed's import warns "Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to
    detect it." on a machine without a GPU, and transformers imports it wherever it is installed: the first
    ``save_pretrained`` of a run (the critic's, the fine-tuned model's) unwraps the model through accelerate, which
    checks for a DeepSpeed engine. A run that does not train with DeepSpeed has no use for the line."""
    return not str(record.msg).startswith("Setting accelerator to CPU")


def setup_run(cfg) -> None:
    """Process-wide settings every entry point wants: seeds, quiet libraries, offline hubs, the model cache."""
    import lightning as L

    from i2d2.models import use_cache_dir

    # Model hubs are unreachable on our machines; users with a hub can set HF_HUB_OFFLINE=0.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s %(name)s] %(message)s", datefmt="%H:%M:%S")
    for noisy in ("httpx", "urllib3", "filelock", "datasets", "DeepSpeed"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # `import lightning` gives its logger a console handler of its own, and the root logger (Hydra's, or the one
    # basicConfig just set) prints every record too: each Lightning line came out twice, once as "INFO: ..."
    lightning_log = logging.getLogger("lightning")
    for handler in [h for h in lightning_log.handlers if type(h) is logging.StreamHandler]:
        lightning_log.removeHandler(handler)
    rank_zero_log = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if _drop_lightning_tips not in rank_zero_log.filters:  # setup_run runs once per entry point, tests many times
        rank_zero_log.addFilter(_drop_lightning_tips)
    # a filter, not a level: DeepSpeed's import sets its logger's level (to WARNING, the notice's) but keeps filters
    from i2d2.lightning_setup import is_deepspeed

    deepspeed_log = logging.getLogger("DeepSpeed")
    deepspeed_log.removeFilter(_drop_deepspeed_cpu_notice)
    if not is_deepspeed(cfg.get("trainer") or {}):
        deepspeed_log.addFilter(_drop_deepspeed_cpu_notice)
    L.seed_everything(int(cfg.seed), workers=True, verbose=False)
    use_cache_dir(cfg.get("cache_dir"))  # every loader's cache, those not handed the config included


# ----------------------------------------------------------------------------- unknown keys

class UnknownKeyError(ValueError):
    """A config key that nothing reads (a typo would otherwise run the default, silently, until a late stage)."""


class ConfigError(ValueError):
    """A bad setting; the message names the config field."""


def need(cond, field: str, msg: str) -> None:
    """A recipe's start-up value check: ConfigError('<field>: <msg>') unless ``cond``."""
    if not cond:
        raise ConfigError(f"{field}: {msg}")


def is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def need_counts(cfg, *keys: str, null_ok: bool = False) -> None:
    """Each of ``keys`` (dotted, from the config's root) an integer >= 1: batch sizes and the like, which a stage
    steps or divides by (``range(0, n, 0)``, an empty batch) only after the stages before it ran. ``null_ok``: for
    keys whose reader takes a null as its default."""
    for key in keys:
        v = OmegaConf.select(cfg, key)
        need((null_ok and v is None) or schemas.is_count(v), key,
             f"must be {'null (the default) or ' if null_ok else ''}an integer >= 1, got {v!r}")


def need_one_pass(cfg, task: str, what: str) -> None:
    """A recipe without iterations refuses ``iteration`` / ``num_iterations`` other than 0 / 1 (not ignore them)."""
    for key, one in (("iteration", 0), ("num_iterations", 1)):
        need(cfg.get(key, one) == one, key,
             f"task={task} has no iterations ({what}): leave it at {one}, got {cfg.get(key)!r}")


class ConfigTypeError(ValueError):
    """A value that cannot be what its key's shipped default stands for (a string where a number belongs)."""


def _load(path: Path) -> dict:
    return OmegaConf.to_container(OmegaConf.load(path), resolve=False) or {}


def _schema(group: str, recipe: str | None = None) -> dict:
    """The keys the shipped YAML files define for ``group``: for ``task``, :func:`_task_schema`; for ``data``,
    :func:`_data_schema`; for another group, the whole files plus what task files set in it."""
    if group == "task":
        return _task_schema(recipe)
    if group == "data":
        return _data_schema(recipe)
    if group == "generate":  # i2d2.generate's own node, conf/generate.yaml (not a config group)
        return _load(CONF_DIR / "generate.yaml").get("generate") or {}
    schema: dict = {}
    for path in sorted((CONF_DIR / group).glob("*.yaml")):
        _merge(schema, {k: v for k, v in _load(path).items() if k != "defaults"})
    for path in sorted((CONF_DIR / "task").glob("*.yaml")):
        _merge(schema, _load(path).get(group) or {})
    return schema


def _task_files(recipe: str | None) -> list[dict]:
    """The loaded conf/task/*.yaml files whose ``task.recipe`` is ``recipe``."""
    raws = [_load(path) for path in sorted((CONF_DIR / "task").glob("*.yaml"))]
    return [raw for raw in raws if (raw.get("task") or {}).get("recipe") == recipe]


def _data_schema(recipe: str | None) -> dict:
    """The data keys of ``recipe``: the conf/data file its task files pick (``override /data: cmp``) and their
    ``data:`` nodes. Not the union of every data file: ``task=cmp +data.max_pairs=3`` (a comparatives key that
    nothing in CMP reads) passed the check that way."""
    schema: dict = {}
    for raw in _task_files(recipe):
        for entry in raw.get("defaults") or []:
            choice = entry.get("override /data") if isinstance(entry, dict) else None
            if choice and (CONF_DIR / "data" / f"{choice}.yaml").exists():
                _merge(schema, {k: v for k, v in _load(CONF_DIR / "data" / f"{choice}.yaml").items()
                                if k != "defaults"})
        _merge(schema, raw.get("data") or {})
    return schema


def _task_schema(recipe: str | None) -> dict:
    """The task keys of ``recipe``: its task files' ``task:`` node and the option groups those files pick that are
    packaged into the task node (``/cmp/pretrain`` -> ``# @package task.pretrain``). Empty (nothing checked) for a
    recipe no shipped task file names. The presets (conf/experiment) are not part of it: they are checked against
    it like any other override, so a misspelt key in a preset, a user's own included, is refused rather than
    becoming a known key (``task.mix.summ`` in a user's experiment file passed that way)."""
    schema: dict = {}
    for raw in _task_files(recipe):
        node = raw.get("task") or {}
        _merge(schema, {k: v for k, v in node.items() if k != "defaults"})
        for entry in raw.get("defaults") or []:
            for key in entry if isinstance(entry, dict) else ():
                group = key.removeprefix("override").strip().lstrip("/").split("@")[0]
                for opt in sorted((CONF_DIR / group).glob("*.yaml")) if (CONF_DIR / group).is_dir() else ():
                    head = opt.read_text(encoding="utf-8").split("\n", 1)[0].strip()
                    if head == "# @package task" or head.startswith("# @package task."):
                        sub = _load(opt)
                        for part in reversed(head[len("# @package "):].split(".")[1:]):
                            sub = {part: sub}
                        _merge(schema, sub, keep_free=True)
    return schema


def _merge(into: dict, node: dict, keep_free: bool = False) -> None:
    """``node``'s keys into ``into``; with ``keep_free``, a section ``into`` leaves free-form (an empty or null
    default: typed by i2d2/schemas.py, or open) stays free-form."""
    for k, v in node.items():
        if keep_free and k in into and not into[k] and isinstance(into[k], (dict, type(None))):
            continue
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v, keep_free)
        elif isinstance(v, dict) and v:
            into[k] = dict(v)
        else:
            into.setdefault(k, v)


# maps whose keys are the user's to choose (cut names, label names) or another schema's fields (overrides of
# the shared critic config): path -> None (any key) or a dataclass whose fields are the keys
OPEN_SECTIONS = {"task.filters.discriminator.cuts": None, "task.filters.discriminator.critic": schemas.CriticConfig,
                 "task.filters.discriminator.critic.label_map": None,
                 # the user names concept sources, phrase lists and downstream data sets (+data.sources.gkb=...),
                 # and their optional keys have no shipped default (a source's options / on_error, a data set's
                 # dev_path / types / limit)
                 "data.sources": None, "data.relations": None, "data.downstream": None}


def _field_names(schema: type) -> list[str]:
    import dataclasses

    return sorted(f.name for f in dataclasses.fields(schema))


def _list_hint(d: list) -> str:
    """A list default as it is written on the command line, its first items only: ``[in, on, of, ...]``."""
    return "[" + ", ".join(map(str, d[:3])) + (", ...]" if len(d) > 3 else "]")


def _unknown_keys(node, schema: dict, where: str, wrong: list | None = None) -> list[str]:
    """Keys of ``node`` that ``schema`` (the shipped defaults) does not define; with ``wrong``, also collect the
    values that cannot be what a numeric or boolean default stands for (``lr=1e-2x`` reaches a stage as a string),
    and a scalar or a map where the default is a list (``function_words=7``; a null stays allowed, as for the others).
    A node built by ``_target_`` takes its constructor's keyword arguments, and ``OPEN_SECTIONS`` their own keys."""
    if "_target_" in schema:
        return []
    if where in OPEN_SECTIONS:
        if OPEN_SECTIONS[where] is None:
            return []
        schema = {**dict.fromkeys(_field_names(OPEN_SECTIONS[where])), **schema}
    out = []
    for k, v in node.items():
        if k not in schema:
            out.append(f"{where}.{k}")
        elif isinstance(schema[k], dict) and schema[k] and isinstance(v, dict):
            out += _unknown_keys(v, schema[k], f"{where}.{k}", wrong)  # an empty or null default is free-form
        elif wrong is not None:
            _check_type(f"{where}.{k}", v, schema[k], wrong)
    return out


def _check_type(key: str, v, d, wrong: list) -> None:
    """Append to ``wrong`` a value ``v`` that cannot be what the numeric, boolean or list default ``d`` stands
    for (a null, or an interpolation, is the reader's or the referenced value's business)."""
    if v is None or (isinstance(v, str) and v.startswith("${")):
        return
    if isinstance(d, bool) and not isinstance(v, bool):
        wrong.append(f"{key}={v!r} (expected true or false)")
    elif isinstance(d, (int, float)) and not isinstance(d, bool) and (
            isinstance(v, bool) or not isinstance(v, (int, float))):
        wrong.append(f"{key}={v!r} (expected a number, like its default {d!r})")
    elif isinstance(d, list) and not isinstance(v, list):  # function_words=7: a TypeError in a late stage
        wrong.append(f"{key}={v!r} (expected a list, like its default {_list_hint(d)})")


def _trainer_types() -> dict:
    """The ``trainer`` keys whose shipped values (conf/trainer/*.yaml and the presets' ``trainer:`` nodes) are all
    true/false or all numbers: one of them as its key's default. The trainer node takes any Lightning Trainer
    argument, so its keys are not checked, only these values; a key whose shipped values differ in kind
    (``devices``: 1 or auto) is left to Lightning."""
    shipped: dict = {}
    files = [*sorted((CONF_DIR / "trainer").glob("*.yaml")), *sorted((CONF_DIR / "experiment").rglob("*.yaml"))]
    for path in files:
        node = _load(path)
        node = node if path.parent.name == "trainer" else node.get("trainer") or {}
        for k, v in node.items():
            shipped.setdefault(k, []).append(v)

    def kind(v):
        return "bool" if isinstance(v, bool) else "number" if isinstance(v, (int, float)) else None

    return {k: vs[0] for k, vs in shipped.items() if kind(vs[0]) and all(kind(v) == kind(vs[0]) for v in vs)}


# sections without a structured config (i2d2/schemas.py types the others at composition): the whole task node,
# against the shipped task files of the same recipe (typed sub-sections there are empty, hence free-form), the
# data node against the data file those task files pick, and i2d2.generate's node (absent from the train config)
# against conf/generate.yaml (+generate.top_kk=3 ran with the default top_k)
CHECKED_SECTIONS = ("task", "data", "generate")


def _typed_unknown_keys(node, where: str, out: dict) -> None:
    """Keys of config nodes typed by an i2d2.schemas dataclass that the dataclass does not define (``+key=...``
    on the command line adds them past Hydra's own check): {section: (unknown, known)}."""
    import dataclasses

    from omegaconf import DictConfig

    if not isinstance(node, DictConfig):
        return
    kind = OmegaConf.get_type(node)
    if dataclasses.is_dataclass(kind):
        known = [f.name for f in dataclasses.fields(kind)]
        extra = [k for k in node.keys() if k not in known]
        if extra:
            out[where] = (extra, known)
    for k in node.keys():
        child = node._get_node(k)
        if isinstance(child, DictConfig) and not child._is_missing() and not child._is_none():
            _typed_unknown_keys(child, f"{where}.{k}" if where else str(k), out)


def _root_keys() -> list[str]:
    """The keys a composed config may hold at its root: its config file's own (conf/train.yaml, or generate.yaml,
    which adds ``generate``; both outside a Hydra job) and the groups their defaults pick, but for ``experiment``:
    its presets are ``_global_`` and leave no key of that name (``+experiment.smoke=1`` was accepted, and so was
    ``+generate.top_k=3`` in i2d2.train, which never reads it)."""
    from hydra.core.hydra_config import HydraConfig

    names = ("train", "generate")  # generate.yaml composes train.yaml and adds its own
    if HydraConfig.initialized() and HydraConfig.get().job.config_name == "train":
        names = ("train",)
    keys = set()
    for name in names:
        raw = OmegaConf.to_container(OmegaConf.load(CONF_DIR / f"{name}.yaml"), resolve=False)
        keys |= {k for k in raw if k not in ("defaults", "hydra")}
        keys |= {k.split("/")[0] for d in raw.get("defaults", []) if isinstance(d, dict) for k in d}
    return sorted(keys - {"experiment"})


def check_keys(cfg, sections=CHECKED_SECTIONS) -> None:
    """Reject, naming the key, any key that nothing reads, at start-up before any model loads.

    Sections typed by a structured config (i2d2/schemas.py) are checked against their dataclass (Hydra refuses a
    misspelt override; this catches ``+key=`` additions too). The untyped ``sections`` are checked against the
    shipped YAML files (every key a stage reads has a documented default there): ``task`` against
    :func:`_task_schema` of its ``task.recipe``, ``data`` against :func:`_data_schema` of it (both skipped for a recipe no shipped file names: its own code reads them). The ``trainer`` node takes any Lightning
    Trainer argument; its values are checked against the kind of the shipped ones (:func:`_trainer_types`)."""
    recipe = OmegaConf.select(cfg, "task.recipe")
    bad, known, wrong = [], {}, []
    # Hydra refuses a misspelt root key and suggests "+iteraton=1", which it then takes: the run started at
    # iteration 0 with the setting unread
    roots = _root_keys()
    if [k for k in cfg if k not in roots]:
        bad, known["root"] = [k for k in cfg if k not in roots], roots
    typed: dict = {}
    _typed_unknown_keys(cfg, "", typed)
    for where, (extra, fields_) in typed.items():
        bad += [f"{where}.{k}" for k in extra]
        known[where] = fields_
    for section in sections:
        node = OmegaConf.select(cfg, section)
        if node is None:
            continue
        group, *rest = section.split(".")
        if group == "data" and not _schema("task", recipe):  # a recipe no shipped file names reads its own data keys
            continue
        schema = _schema(group, recipe)
        for part in rest:
            schema = schema.get(part) if isinstance(schema, dict) else None
        if not schema:
            continue
        found = _unknown_keys(OmegaConf.to_container(node, resolve=False), schema, section, wrong)
        for f in found:  # the misspelt key's siblings: where the right spelling is
            bad.append(f)
            parent, here = f.rpartition(".")[0], schema
            for part in parent.split(".")[len(section.split(".")):]:
                here = here.get(part) if isinstance(here, dict) else None
            known[parent] = sorted(here) if isinstance(here, dict) else []
            if OPEN_SECTIONS.get(parent):  # overrides of another schema: its fields are the keys
                known[parent] = _field_names(OPEN_SECTIONS[parent])
    trainer = OmegaConf.select(cfg, "trainer")
    if trainer is not None:  # trainer.max_epochs=abc reached Lightning (ignored under max_steps, or a late error)
        types = _trainer_types()
        for k, v in OmegaConf.to_container(trainer, resolve=False).items():
            if k in types:
                _check_type(f"trainer.{k}", v, types[k], wrong)
    if wrong or bad:  # both kinds at once: a user fixes everything in one go
        msgs = [f"config value(s) of the wrong type: {', '.join(dict.fromkeys(wrong))}"] if wrong else []
        if bad:
            msgs.append(f"unknown config key(s): {', '.join(bad)} (not defined by i2d2/schemas.py or any shipped "
                        f"config under {CONF_DIR}; check the spelling). Known keys: "
                        + "; ".join(f"{s}: {', '.join(ks)}" for s, ks in known.items()))
        raise (UnknownKeyError if bad else ConfigTypeError)("; ".join(msgs))


def plain(node: Any) -> Any:
    """A config node (DictConfig, ListConfig, or dicts/lists holding them) as resolved plain dicts and lists."""
    if OmegaConf.is_config(node):
        return OmegaConf.to_container(node, resolve=True)
    if isinstance(node, Mapping):
        return {k: plain(v) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return [plain(v) for v in node]
    return node
