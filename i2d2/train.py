"""Entry point: ``python -m i2d2.train [task=...] iteration=k [key=value ...]``.

Thin on purpose: compose the config, check it, take the run_dir lock, set the run up, hand it to the task's
recipe (``cfg.task.recipe``, a function ``run(cfg)`` under ``i2d2/recipes/``).

Start-up order: what fails on a bad config (unknown keys, unknown model names) fails first, in about a second,
before torch/Lightning are imported; then the run_dir lock (a second launch on the same run_dir fails at once
naming the process that holds it); then the recipe's value checks (``check_config``); only then the run.
Each of these exits with code 2 and a one-line ``error:`` message. Ctrl-C exits with code 130 and a one-line
``interrupted:`` message, SIGTERM (``kill``, a cluster's pre-emption or time limit) with 143 and a ``terminated:``
one: every stage writes atomically and resumes from its last finished unit.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import threading
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from i2d2 import config  # noqa: F401  (registers the ${i2d2.*} resolvers before Hydra composes)
from i2d2.models import check_models
from i2d2.ranks import LAUNCHED_RANKS, launched_rank


def check_start(cfg: DictConfig) -> None:
    """The checks that need neither a model nor torch: unknown config keys, unknown model names."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():  # first: a smoke share chosen alone fails the key check on its task's keys
        check_preset_overrides(HydraConfig.get().overrides.task)
    config.check_keys(cfg)
    # read by setup_run's seed_everything, after the run_dir lock: seed=abc was a traceback there
    config.need(config.is_int(cfg.get("seed")), "seed", f"must be an integer, got {cfg.get('seed')!r}")
    # run_dir= (empty) ran in the working directory (Hydra's log folder: config.launch_dir)
    config.need(isinstance(cfg.get("run_dir"), str) and cfg.run_dir.strip() != "", "run_dir",
                f"must name a folder, got {cfg.get('run_dir')!r}")
    for key in ("run_dir", "cache_dir"):  # cache_dir: a FileExistsError traceback once the run had started
        # cache_dir as models.use_cache_dir reads it (~ expanded); run_dir as Hydra does (it does not expand ~)
        where = Path(str(cfg[key])).expanduser() if key == "cache_dir" and cfg.get(key) else cfg.get(key)
        blocker = config.file_in_the_way(where) if where else None
        config.need(blocker is None, key, f"must name a folder, but {blocker} is a file"
                    + ("" if str(blocker) == str(cfg[key]) else f" ({key}={cfg[key]})"))
    if HydraConfig.initialized():
        check_logger_overrides(HydraConfig.get().overrides.task)
    check_models(cfg)


def check_logger_overrides(overrides) -> None:
    """``logger=[wandb,csv]`` on the command line is a list *selection* of the logger group, which Hydra merges
    into one logger config (the last file's ``_target_`` with the other's keys): CSVLogger then fails mid-run on
    W&B's ``project`` key, and ``logger=[csv,wandb]`` silently logs to W&B alone. Refused at start-up."""
    for o in overrides:
        key, _, value = str(o).partition("=")
        if key.lstrip("+~") == "logger" and value.strip().startswith("["):
            raise ValueError(f"{o}: Hydra merges a list of logger configs into a single logger (their keys mixed), "
                             "so this would not log to each of them; use logger=wandb_csv (W&B and CSV), or a "
                             "config file whose logger: node is a dict or list of logger configs")


def check_preset_overrides(overrides) -> None:
    """``experiment=smoke/i2d2`` (or ``experiment/smoke=cmp``) picks only a task's share of ``experiment=smoke``
    (``conf/experiment/smoke/<task>.yaml``; ``--help`` leaves the group out): without the preset's tiny models, its
    task or its critic. ``smoke/i2d2`` ran the default Gemma models at smoke sizes, ``smoke/cmp`` failed on CMP keys
    unknown to the I2D2 task. Refused at start-up, naming the preset to use."""
    for o in overrides:
        key, _, value = str(o).partition("=")
        key, value = key.lstrip("+~"), value.strip()
        share = value[len("smoke/"):] if key == "experiment" and value.startswith("smoke/") else (
            value if key == "experiment/smoke" and value not in ("", "null") else None)
        if share is not None:
            raise ValueError(f"{o}: this is only the {share} share of the smoke preset "
                             f"(conf/experiment/smoke/{share}.yaml: no tiny models); use experiment=smoke task={share}")


def check_recipe(cfg: DictConfig) -> None:
    """The recipe's own ``check_config(cfg)``, when its module has one (values such as ``task.filter.delta=2``
    or ``iteration=-1``), at start-up rather than when the recipe gets to it; a recipe whose module sets
    ``ONE_PROCESS = True`` refuses a trainer config that asks for several processes."""
    import importlib

    from i2d2.lightning_setup import check_one_process

    module_name = str(cfg.task.recipe).rpartition(".")[0]
    try:
        recipe_module = importlib.import_module(module_name) if module_name else None
    except ModuleNotFoundError as e:
        if not (module_name == e.name or module_name.startswith(f"{e.name}.")):
            raise  # the recipe module exists but one of its imports is missing: that traceback is the useful one
        recipe_module = None
    if recipe_module is None or not callable(getattr(recipe_module, str(cfg.task.recipe).rpartition(".")[2], None)):
        raise ValueError(f"task.recipe={cfg.task.recipe!r}: no such function (a recipe is module.function, e.g. "
                         "i2d2.recipes.generics.run)")
    if getattr(recipe_module, "ONE_PROCESS", False):
        check_one_process(cfg.trainer, module_name.rpartition(".")[2])
    if callable(getattr(recipe_module, "check_config", None)):
        recipe_module.check_config(cfg)


def holds_lock(cfg: DictConfig) -> bool:
    """Rank 0 of a run holds the run_dir lock for all its ranks; another rank skips it only when the trainer
    config does ask for several processes (two ranks of a mis-set single-process job both try, and the second
    fails: that is the point)."""
    if launched_rank() == 0:
        return True
    from i2d2.lightning_setup import world_size_of

    return world_size_of(OmegaConf.to_container(cfg.trainer, resolve=True)) == 1


def interrupted(e: BaseException) -> bool:
    """Ctrl-C: a KeyboardInterrupt, or the ``sys.exit(1)`` a Lightning fit turns one into (raised while handling
    it, so the KeyboardInterrupt is its context)."""
    return isinstance(e, KeyboardInterrupt) or (
        isinstance(e, SystemExit) and isinstance(e.__context__, KeyboardInterrupt))


class Terminated(BaseException):
    """SIGTERM, raised where the process is (as Ctrl-C raises KeyboardInterrupt); a BaseException, so that no
    ``except Exception`` of a stage takes it for a failure of its own."""


_OWNER_PID: int | None = None  # the process that installed the handler (sigterm_raises)


def _pass_sigterm_on() -> None:
    """Rank 0 of a launched run passes its SIGTERM on to the ranks it launched (``i2d2.ranks.LAUNCHED_RANKS``):
    ``kill <pid>`` of the command a user started reaches rank 0 alone."""
    for proc in LAUNCHED_RANKS:
        if proc.poll() is None:  # a rank that has already ended (its pid may be another process's by now) is skipped
            with contextlib.suppress(OSError):
                proc.send_signal(signal.SIGTERM)


_SIGTERM_SEEN = False  # this process got a SIGTERM (hydra_main: a rank's failure after it is the signal's doing)


def _stop_under_way() -> bool:
    """A SIGTERM's stop is unwinding in this thread: the exception being handled where the signal came (an ``except``
    or ``finally`` block, a ``with`` block's exit) is ``Terminated`` or Lightning's SIGTERMException, or came up while
    one was being handled (its ``__context__``)."""
    e, seen = sys.exc_info()[1], set()
    while e is not None and id(e) not in seen:
        if terminated(e):
            return True
        seen.add(id(e))
        e = e.__context__
    return False


def _raise_terminated(signum, frame):
    global _SIGTERM_SEEN
    if os.getpid() == _OWNER_PID and not _SIGTERM_SEEN:  # not in a forked worker, which inherited the ranks' list
        _SIGTERM_SEEN = True
        _pass_sigterm_on()
    if signal.getsignal(signal.SIGTERM) is not _raise_terminated:
        # called by a Lightning fit's handler, which ran its own first: every rank got the signal (a scheduler's, or
        # rank 0's passed on) and stops at the end of its step (SIGTERMException, which ``terminated`` recognises);
        # raising here would leave the other ranks of a launched run waiting in a collective for this one
        return
    if os.getpid() != _OWNER_PID:
        # a forked child (datasets.map / multiprocessing pool, DataLoader worker) inherited the handler: no
        # hydra_main there reports a Terminated, which printed a traceback per worker (a pool's terminate() and a
        # cluster's SIGTERM to the whole job both send it); it ends as SIGTERM ended it before
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    if _stop_under_way():
        # a second SIGTERM (a scheduler's and rank 0's both reach a launched rank) leaves the first one's cleanup alone.
        # Not every later one: a Terminated that was caught and not raised again (a finaliser's, which Python reports
        # and carries on from) is not unwinding any more, and the process, still running, must stop at this one
        return
    raise Terminated()


def _raised_in_a_finaliser(previous_hook, unraisable) -> None:
    """``sys.unraisablehook`` while ``sigterm_raises``' block runs. A SIGTERM whose handler runs inside a finaliser
    (``__del__``, a weakref callback: a DataLoader iterator joins its workers in one, for seconds) raises Terminated
    there, which Python prints ("Exception ignored in ...", a traceback) and carries on from: the run went on as if
    never signalled. The signal is sent again instead, a moment later from another thread, so that its handler runs
    where the main thread is by then (raised in this hook, it would be ignored the same way); in a finaliser again,
    it comes back here."""
    if isinstance(unraisable.exc_value, Terminated) and os.getpid() == _OWNER_PID:
        again = threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGTERM))
        again.daemon = True
        again.start()
        return
    previous_hook(unraisable)


@contextlib.contextmanager
def sigterm_raises():
    """SIGTERM raises ``Terminated`` in the main thread while the block runs (the previous handler is restored after).
    Python's default ends the process at once, with no message and no tidying up. Inside a Lightning fit, whose own
    handler calls this one after it, the fit stops at the end of the step on every rank by raising its
    SIGTERMException, a SystemExit with no code: the run exited 0, like a finished one, halfway through; ``hydra_main``
    now reports it as terminated. A Terminated raised inside a finaliser, which Python ignores, is raised again
    (``_raised_in_a_finaliser``)."""
    global _OWNER_PID, _SIGTERM_SEEN
    # kept after the block: hydra_main reads _SIGTERM_SEEN once it has ended; reset first, so that a block that
    # cannot handle signals (not the main thread) does not inherit an earlier run's SIGTERM
    _SIGTERM_SEEN = False
    try:
        previous = signal.signal(signal.SIGTERM, _raise_terminated)
    except ValueError:  # not the main thread: signals cannot be handled here
        yield
        return
    owner, _OWNER_PID = _OWNER_PID, os.getpid()
    previous_hook = sys.unraisablehook
    sys.unraisablehook = functools.partial(_raised_in_a_finaliser, previous_hook)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        sys.unraisablehook = previous_hook
        _OWNER_PID = owner


def terminated(e: BaseException) -> bool:
    """SIGTERM: ``Terminated``, or Lightning's SIGTERMException (a fit that saw the signal before our handler did,
    e.g. in a rank launched without it)."""
    return isinstance(e, Terminated) or type(e).__name__ == "SIGTERMException" and isinstance(e, SystemExit)


def main():
    """The command: Hydra composes the config and calls ``hydra_main``."""
    start_up_exit_code(hydra_main)


def start_up_exit_code(hydra_fn) -> None:
    """Call a ``@hydra.main`` function (which calls ``mark_composed`` first). An override or config file that does
    not compose (``decoding.beam_size=abc``, a misspelt group option) is Hydra's error, printed by Hydra naming the
    key; it exits with code 2 like every other start-up error, not Hydra's 1, which is left to a run that failed."""
    global _composed
    _composed = False
    try:
        hydra_fn()
    except SystemExit as e:
        if e.code == 1 and not _composed:
            sys.exit(2)
        raise


_composed = False  # set once Hydra hands the command's function a config


def mark_composed() -> None:
    global _composed
    _composed = True


@hydra.main(version_base="1.3", config_path=config.HYDRA_CONFIG_PATH, config_name="train")
def hydra_main(cfg: DictConfig):
    mark_composed()
    try:
        with sigterm_raises():
            return checked_run(cfg)
    except (KeyboardInterrupt, SystemExit, Terminated) as e:
        if terminated(e):
            _exit_terminated(cfg)
        if not interrupted(e):
            raise
        if launched_rank() == 0:  # one line, not one per rank (every rank of a launched run gets the SIGINT)
            print(f"interrupted: the {cfg.task.name} run in {cfg.run_dir}; rerun the same command to resume",
                  file=sys.stderr)
        sys.exit(130)  # 128 + SIGINT, as a shell reports a command Ctrl-C stopped
    except Exception as e:
        if _SIGTERM_SEEN:
            # a rank told of rank 0's SIGTERM while it waited in a collective, which failed once rank 0 had left
            # (gloo: "Connection closed by peer"): it stops as a signalled rank does, not with that traceback
            _exit_terminated(cfg)
        from i2d2.io import DataError

        # the run's log file ends with why it stopped (Hydra prints the error on the terminal only)
        _to_log_files(f"run stopped: {type(e).__name__}: {e}")
        if not isinstance(e, DataError):
            raise  # a bug: its traceback
        # stopped by what it was given or produced mid-way (no generation passed the filter, a stage's output
        # damaged since start-up): the message names the file or key to change; a traceback would bury it
        if launched_rank() == 0:
            print(f"error: {e}", file=sys.stderr)
        sys.exit(1)


def _exit_terminated(cfg: DictConfig) -> None:
    if launched_rank() == 0:  # one line, not one per rank
        print(f"terminated (SIGTERM): the {cfg.task.name} run in {cfg.run_dir}; rerun the same command to resume",
              file=sys.stderr)
    sys.exit(143)  # 128 + SIGTERM: a scheduler or script must not take it for a finished run (exit 0)


def _to_log_files(message: str) -> None:
    import logging

    record = logging.makeLogRecord({"name": __name__, "levelno": logging.ERROR, "levelname": "ERROR",
                                    "msg": message})
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


def checked_run(cfg: DictConfig):
    """The start-up checks, the run_dir lock, then the recipe; the lock is released however it ends."""
    from i2d2.io import RunLock

    lock = None
    try:
        check_start(cfg)
        if holds_lock(cfg):
            lock = RunLock(cfg.run_dir).acquire()
        check_recipe(cfg)
    except BaseException as e:  # noqa: BLE001  (the lock is released whatever stopped the checks, Ctrl-C too)
        try:
            with contextlib.suppress(Exception):  # tidying up never hides the error that stopped the launch
                discard_launch_folders(lock)
        finally:
            if lock is not None:
                lock.release()
        if not isinstance(e, (ValueError, TypeError, RuntimeError, OSError)):
            raise
        # bad key/name/value (TypeError: a null where a check compares a number), run_dir held or not writable
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    try:  # the lock is already held: entering it as a context manager would try to take it a second time
        from tqdm.contrib.logging import logging_redirect_tqdm

        config.setup_run(cfg)
        recipe = hydra.utils.get_method(cfg.task.recipe)
        with logging_redirect_tqdm():  # a log line printed while a bar is drawn lands above it, not inside it
            return recipe(cfg)
    finally:
        try:
            close_process_group()
        finally:  # the lock is released even where closing the group fails
            if lock is not None:
                lock.release()


def discard_launch_folders(lock) -> None:
    """What a launch refused at start-up made is removed: the log folder Hydra made for it before any check ran
    (``<run_dir>/hydra/<time>_<pid>/``, this process's own by its name: ``config.launch_dir``), and a run_dir this
    launch created (a misspelt one) that now holds nothing, or only the lock file this launch held. A folder
    ``hydra.run.dir`` names by hand (or a multirun's) is left alone, and so is a run_dir that existed before."""
    import shutil

    from hydra.core.hydra_config import HydraConfig

    from i2d2.io import LOCK, LOCK_INFO

    if not HydraConfig.initialized():
        return
    launch = Path(HydraConfig.get().runtime.output_dir).absolute()
    made = config.LAUNCH_DIRS.get(str(launch))
    if made is None:  # not named by i2d2.launch_dir: hydra.run.dir set by hand, or a multirun's folder
        return
    shutil.rmtree(launch, ignore_errors=True)
    with contextlib.suppress(OSError):
        launch.parent.rmdir()  # run_dir/hydra, when this launch was its only one
    run = made["run_dir"]
    if made["run_dir_existed"] or run == Path.cwd().absolute() or not run.is_dir():
        return
    left = {p.name for p in run.iterdir()}
    if not left or (lock is not None and left <= {LOCK, LOCK_INFO}):
        with contextlib.suppress(OSError):  # while the lock is still held: no other launch can be inside it
            for name in (LOCK_INFO, LOCK):
                (run / name).unlink(missing_ok=True)
            run.rmdir()  # only ever an empty folder


def close_process_group() -> None:
    """Lightning's DDP and DeepSpeed strategies open a process group and leave it open; closing it here, once the
    run is over, is what torch asks (it warns "destroy_process_group() was not called" at exit otherwise)."""
    if "torch" not in sys.modules:  # the run failed before torch was imported: no group can be open
        return
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception as e:  # noqa: BLE001  (e.g. NCCL already aborted after a timeout: the run's own error, if
            # any, is what the user must see, not this one)
            print(f"warning: closing the process group failed: {e}", file=sys.stderr)


if __name__ == "__main__":
    main()
