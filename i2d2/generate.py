"""On-demand generic knowledge: ``python -m i2d2.generate generate.concepts='[board games, violins]'``.

Takes an iteration's model (``generate.iteration=k`` -> ``{run_dir}/iter_k/model``; -1 = the newest), builds
I2D2 prompts and constraints for the given unseen concepts (same templates and perplexity selection as the
loop), decodes them with NeuroLogic decoding, scores every statement with the run's critic and prints the best
``top_k`` per concept with their critic scores (✓ = above δ). ``generate.out_dir`` keeps the files, and a rerun
into it resumes from the finished generation shards (Ctrl-C exits with code 130 saying so).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import sys
import tempfile
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from i2d2 import config  # noqa: F401  (registers the ${i2d2.*} resolvers)

log = logging.getLogger(__name__)


class GenerateError(ValueError):
    pass


def _iteration_of(folder: Path) -> int | None:
    """k of a run's ``iter_k`` folder; None for any other name (a copy such as ``iter_0_old`` is no iteration)."""
    n = folder.name[len("iter_"):]
    return int(n) if folder.name.startswith("iter_") and n.isdigit() else None


def _iterations(run_dir: Path) -> list[int]:
    ks = [_iteration_of(p.parent.parent) for p in run_dir.glob("iter_*/model/config.json")]
    return sorted(k for k in ks if k is not None)


def resolve_model(cfg) -> tuple[str, int | None]:
    """The model to generate with: ``generate.model`` (a name or a folder), else ``generate.iteration=k`` (iteration
    k's model in run_dir; -1 the newest), else ``model.name``; and the iteration it is, when known. A folder a run's
    fine-tuning stage recorded (``<run>/iter_k/model`` however it is named) is checked against that record first."""
    from i2d2.io import DataError, iteration_model_dir, verified_iteration_model, verify_model_folder

    g, run_dir = cfg.generate, Path(cfg.run_dir)
    if g.get("model") or g.get("iteration") is None:
        key, name = ("generate.model", str(g.model)) if g.get("model") else ("model.name", str(cfg.model.name))
        try:  # a truncated safetensors failed in transformers, naming no file; a hand-made folder: unchecked
            verify_model_folder(name)
        except DataError as e:
            raise GenerateError(f"{key}={name}: {e}") from None
        return name, None
    have = _iterations(run_dir)
    k = int(g.iteration)
    if k == -1:
        if not have:
            raise GenerateError(f"generate.iteration=-1: no finished iteration in run_dir={run_dir} "
                                "(no iter_*/model). Run `python -m i2d2.train iteration=0` first, set run_dir, "
                                "or use generate.iteration=null for the base model.")
        k = have[-1]
    try:  # as its fine-tuning stage recorded it: a truncated safetensors failed in transformers, naming no file
        path = verified_iteration_model(run_dir, k)
    except DataError as e:
        raise GenerateError(f"generate.iteration={k}: {e}") from None
    if path is None:
        raise GenerateError(f"generate.iteration={k}: {iteration_model_dir(run_dir, k)} does not exist (finished "
                            f"iterations in {run_dir}: {have or 'none'})")
    return str(path), k


def resolve_critic(cfg, upto: int | None) -> dict:
    import json

    from i2d2.io import in_run

    g, run_dir = cfg.generate, Path(cfg.run_dir)
    if g.get("critic"):
        path = Path(g.critic)
        if not (path / "critic_meta.json").exists() and not (path / "config.json").exists():
            raise GenerateError(f"generate.critic={path}: not a critic model folder (no critic_meta.json or config.json)")
        meta = path.parent / "metrics.json"
        delta = json.loads(meta.read_text()).get("delta") if meta.exists() else None
        return {"model_dir": str(path), "delta": delta}
    # by the same iter_k parse as the models: iter_x was a ValueError traceback, iter_1_old counted as iteration 1
    done = {p: _iteration_of(p.parent.parent) for p in run_dir.glob("iter_*/critic/_DONE.json")}
    dirs = sorted((p for p, j in done.items() if j is not None and (upto is None or j <= upto)), key=done.get)
    if not dirs:
        raise GenerateError(f"no trained critic in run_dir={run_dir}; run the loop first or set generate.critic=DIR")
    info = json.loads(dirs[-1].read_text())["summary"]
    return {**info, "model_dir": str(in_run(info["model_dir"], run_dir))}  # recorded relative to run_dir


def read_concepts(g) -> list[str]:
    from i2d2.concepts import _dedupe, validate_concept
    from i2d2.io import text_lines

    items = [str(c) for c in (g.get("concepts") or [])]
    if g.get("concepts_file"):
        path = Path(g.concepts_file)
        if not path.exists():
            raise GenerateError(f"generate.concepts_file={path}: file not found")
        for lineno, line in enumerate(text_lines(path), 1):
            line = line.rstrip("\r\n")
            if line.strip() and not line.lstrip().startswith("#"):
                items.append((line, f"{path}:{lineno}"))
    out = []
    for item in items:
        text, where = item if isinstance(item, tuple) else (item, "generate.concepts")
        try:
            out.append(validate_concept(text))
        except ValueError as e:
            raise GenerateError(f"{where}: {e}") from None
    if not out:
        raise GenerateError("no concepts: set generate.concepts='[board games, violins]' or generate.concepts_file=PATH")
    return _dedupe(out)  # case-insensitive, as the prompt builder merges them ("Violins" printed no statement)


def check_args(g) -> None:
    """The generate.* values, before any model loads: a bad one is a GenerateError naming its key (a negative top_k
    printed all but the last statements, a non-numeric delta failed with a traceback)."""
    from i2d2.config import is_int, is_num

    if g.kind not in ("noun", "goal"):
        raise GenerateError(f"generate.kind must be noun or goal, got {g.kind!r}")
    it = g.get("iteration")
    if not (it is None or (is_int(it) and it >= -1)):  # int() took 1.5 as iteration 1
        raise GenerateError(f"generate.iteration: must be null (model.name), -1 (the newest) or an integer >= 0, "
                            f"got {it!r}")
    for key in ("top_k", "prompts_per_concept"):
        v = g.get(key)
        if not (is_int(v) and v >= 1):
            raise GenerateError(f"generate.{key}: must be an integer >= 1, got {v!r}")
    d = g.get("delta")
    if not (d is None or (is_num(d) and 0.0 <= d < 1.0)):
        raise GenerateError(f"generate.delta: must be null (the critic's δ) or a number in [0, 1), got {d!r}")
    if not isinstance(g.get("only_accepted", False), bool):
        raise GenerateError(f"generate.only_accepted: must be true or false, got {g.get('only_accepted')!r}")
    blocker = config.file_in_the_way(g.out_dir) if g.get("out_dir") else None
    if blocker is not None:  # was "[Errno 17] cannot write <file>/.i2d2.lock: File exists", naming no key
        raise GenerateError(f"generate.out_dir: must name a folder, but {blocker} is a file")


def prompt_data(cfg, concepts_path: Path) -> dict:
    """The data config the prompts are built from: the run's, with ``concepts_path`` as the one concept source,
    checked (GenerateError naming the key)."""
    from i2d2.prompts import check_prompt_config

    g = cfg.generate
    data = OmegaConf.to_container(cfg.data, resolve=True)
    if g.kind == "noun" and g.relations not in (data.get("relations") or {}):
        raise GenerateError(f"generate.relations={g.relations!r} is not a data.relations list "
                            f"({', '.join(data.get('relations') or {})})")
    data["sources"] = {"cli": {"path": str(Path(concepts_path).resolve()), "format": "lines", "kind": g.kind,
                               "relations": g.relations, "max_concepts": None}}
    data["related_prompts"] = "none"
    data.setdefault("perplexity", {})["threshold"] = None
    try:  # before the model loads, naming the key (was a traceback from the prompt builder)
        check_prompt_config(data)
    except ValueError as e:
        raise GenerateError(str(e)) from None
    return data


def check_config(cfg: DictConfig) -> None:
    """Every value this command reads, checked before the ``generate.out_dir`` lock and any model load (``main``
    runs it after ``check_start``, which refuses unknown ``generate.*`` keys; ``generate`` runs it again for callers
    that skip ``main``): the generate.* values, the concepts, the prompt data config, the decoding ranges (a
    ``decoding.beam_size=0`` was a traceback after the prompts were built), the model and critic folders it would
    read from ``run_dir``, the shard and perplexity batch sizes and the inference device. Raises a ValueError or RuntimeError naming the key."""
    from i2d2.config import ConfigError, need_counts
    from i2d2.lightning_setup import resolve_device
    from i2d2.schemas import DecodingConfig

    g = cfg.generate
    check_args(g)
    read_concepts(g)
    prompt_data(cfg, Path("concepts.txt"))  # the source's path is only recorded here, not read
    try:
        DecodingConfig(**OmegaConf.to_container(cfg.decoding, resolve=True))
    except (TypeError, ValueError) as e:
        raise ConfigError(f"decoding.{e}") from None
    need_counts(cfg, "data.generation.shard_size", "data.perplexity.batch_size", "data.perplexity.chunk_size",
                null_ok=True)
    resolve_device(cfg.trainer)
    # the run's model and critic folders (read only): a missing one was refused after the out_dir lock and setup
    resolve_critic(cfg, resolve_model(cfg)[1])


def generate(cfg: DictConfig) -> list[dict]:
    """Run the on-demand pipeline; return the scored statements (best first within each concept)."""
    import numpy as np

    from critics.scoring import score_texts
    from i2d2.generation import generate_stage
    from i2d2.io import model_fingerprint, read_jsonl, write_jsonl
    from i2d2.lightning_setup import resolve_device
    from i2d2.models import load_causal_lm
    from i2d2.prompts import build_generic_prompts
    from trainers.lm_finetune import join_statement

    g = cfg.generate
    check_config(cfg)
    concepts = read_concepts(g)
    name, k = resolve_model(cfg)
    critic = resolve_critic(cfg, k)
    delta = float(g.delta) if g.get("delta") is not None else critic.get("delta")
    device = resolve_device(cfg.trainer)
    work = Path(g.out_dir) if g.get("out_dir") else Path(tempfile.mkdtemp(prefix="i2d2-generate-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        (work / "concepts.txt").write_text("\n".join(concepts) + "\n")
        data = prompt_data(cfg, work / "concepts.txt")
        model, tok = load_causal_lm(name, cache=cfg.get("cache_dir"), dtype=cfg.model.get("dtype"))
        model = model.to(device).eval()  # as the loop's stages: it stayed on the CPU under trainer=gpu
        log.info("generate: %d concepts with %s on %s", len(concepts), name, device)
        build_generic_prompts(OmegaConf.create(data), model, tok, work / "all_prompts.jsonl")
        prompts = read_jsonl(work / "all_prompts.jsonl")
        by_concept: dict[str, list[dict]] = {}
        # lowest perplexity first under the paper's rule; with measured forms the file order (phrases by yield)
        for p in sorted(prompts, key=lambda r: r.get("perplexity") or 0.0):
            by_concept.setdefault(p["concept"], [])
            if len(by_concept[p["concept"]]) < int(g.prompts_per_concept):
                by_concept[p["concept"]].append(p)
        chosen = [p for c in concepts for p in by_concept.get(c, [])]
        write_jsonl(work / "prompts.jsonl", chosen)
        # the model by its weights and dtype, not its path: shards an earlier call left in out_dir from another
        # model at the same path (an iteration trained again into iter_k/model) are decoded again, not reused
        generate_stage(model, tok, work / "prompts.jsonl", work / "generations", OmegaConf.to_container(cfg.decoding, resolve=True),
                       shard_size=int(OmegaConf.select(cfg, "data.generation.shard_size", default=64) or 64),
                       model_key=[model_fingerprint(name), str(cfg.model.get("dtype"))])
        rows = read_jsonl(work / "generations" / "generations.jsonl")
        for r in rows:
            r["statement"] = join_statement(r["prompt"], r["generation"])
        scores = score_texts(critic["model_dir"], [r["statement"] for r in rows], device=device) if rows else np.zeros(0)
        for r, s in zip(rows, scores):
            r["critic_score"] = float(s)
            r["accepted"] = bool(delta is None or s > delta)
        rows.sort(key=lambda r: (concepts.index(r["concept"]) if r["concept"] in concepts else 0, -r["critic_score"]))
        write_jsonl(work / "scored.jsonl", rows)
    finally:
        if not g.get("out_dir"):
            shutil.rmtree(work, ignore_errors=True)
    _print(rows, concepts, int(g.top_k), delta, bool(g.only_accepted), name, critic["model_dir"])
    return rows


def _print(rows, concepts, top_k, delta, only_accepted, model_name, critic_dir, file=None):
    file = file or sys.stdout  # looked up at call time: a default bound at import would miss a redirected stdout
    print(f"# model: {model_name}\n# critic: {critic_dir} (δ = {'–' if delta is None else f'{delta:.3f}'})", file=file)
    for c in concepts:
        mine, seen = [], set()
        for r in rows:
            key = r["statement"].lower()
            if r["concept"] != c or key in seen or (only_accepted and not r["accepted"]):
                continue
            seen.add(key)
            mine.append(r)
        print(f"\n== {c} ==", file=file)
        if not mine:
            print("  (no statement" + (" above δ" if only_accepted else "") + ")", file=file)
        for r in mine[:top_k]:
            mark = "✓" if r["accepted"] else " "
            print(f"  {r['critic_score']:.3f} {mark} {r['statement']}", file=file)


def main():
    """The command (``i2d2-generate``): a config Hydra cannot compose (``generate.concept=...``) exits with code 2,
    as ``i2d2.train`` does."""
    from i2d2.train import start_up_exit_code

    start_up_exit_code(hydra_main)


@hydra.main(version_base="1.3", config_path=config.HYDRA_CONFIG_PATH, config_name="generate")
def hydra_main(cfg: DictConfig):
    """Checks first (config keys, model names, the values: ``check_config``; then the lock on ``generate.out_dir``,
    the one folder this command writes; run_dir is only read, and every file in it is written atomically), then
    the pipeline. SIGTERM stops it as Ctrl-C does (exit 143, one line), with the lock released."""
    from i2d2.train import mark_composed, sigterm_raises

    mark_composed()
    with sigterm_raises():
        _checked_generate(cfg)


def _checked_generate(cfg: DictConfig):
    from i2d2.io import DataError, RunLock
    from i2d2.train import Terminated, check_start, discard_launch_folders

    try:
        check_start(cfg)
        if cfg.generate.get("model"):
            from i2d2.models import check_model_name

            check_model_name(str(cfg.generate.model), "causal LM", "generate.model")
        check_config(cfg)  # the values too, before the lock (they were checked after it and setup_run, or never)
        lock = RunLock(cfg.generate.out_dir).acquire() if cfg.generate.get("out_dir") else None
    except (ValueError, RuntimeError, OSError) as e:
        with contextlib.suppress(Exception):  # Hydra's log folder for a launch that never ran (no lock taken yet)
            discard_launch_folders(None)
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except (KeyboardInterrupt, Terminated) as e:
        # the checks import torch and Lightning (seconds): a Ctrl-C or SIGTERM then printed Hydra's traceback and
        # exited 1, where the README promises one line and 130 / 143
        with contextlib.suppress(Exception):
            discard_launch_folders(None)
        _exit_stopped(e, "")
    try:
        config.setup_run(cfg)
        generate(cfg)
    except (GenerateError, DataError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except (KeyboardInterrupt, Terminated) as e:  # one line and 128 + SIGINT / SIGTERM, as i2d2.train
        _exit_stopped(e, f"; generation shards finished so far are in {cfg.generate.out_dir}: rerun the same command "
                      "to resume" if cfg.generate.get("out_dir") else "")
    finally:
        if lock is not None:
            lock.release()


def _exit_stopped(e: BaseException, kept: str) -> None:
    from i2d2.train import Terminated

    sigterm = isinstance(e, Terminated)
    print(f"{'terminated (SIGTERM)' if sigterm else 'interrupted'}: i2d2.generate{kept}", file=sys.stderr)
    sys.exit(143 if sigterm else 130)


if __name__ == "__main__":
    main()
