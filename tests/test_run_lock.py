"""One writer per run_dir: a second launch fails at once naming the holder; a dead holder's lock is taken over."""

import json
import logging
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from i2d2.io import LOCK_INFO, RunLock, RunLockedError
from process_env import launch_env

ROOT = Path(__file__).resolve().parent.parent
HOLDER = ("import sys; from i2d2.io import RunLock; lock = RunLock(sys.argv[1]).acquire(); "
          "print('ready', flush=True); sys.stdin.read(); lock.release()")


def start_holder(run_dir):
    """Another process that takes the lock and keeps it until its stdin closes."""
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(run_dir)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True, cwd=ROOT)
    assert p.stdout.readline().strip() == "ready"
    return p


def test_second_writer_fails_naming_the_holder_and_gets_it_after_release(tmp_path):
    holder = start_holder(tmp_path)
    try:
        with pytest.raises(RunLockedError) as e:
            RunLock(tmp_path).acquire()
        msg = str(e.value)
        assert f"pid {holder.pid}" in msg and socket.gethostname() in msg and str(tmp_path) in msg
    finally:
        holder.communicate("")  # clean exit: lock released, holder file removed
    assert holder.returncode == 0 and not (tmp_path / LOCK_INFO).exists()
    with RunLock(tmp_path):
        info = json.loads((tmp_path / LOCK_INFO).read_text())
        assert info["pid"] == os.getpid() and info["host"] == socket.gethostname()
    assert not (tmp_path / LOCK_INFO).exists()


def test_lock_of_a_killed_holder_is_taken_over_with_a_warning(tmp_path, caplog):
    holder = start_holder(tmp_path)
    holder.send_signal(signal.SIGKILL)  # no release, no cleanup: the holder file stays behind
    holder.wait()
    assert json.loads((tmp_path / LOCK_INFO).read_text())["pid"] == holder.pid
    with caplog.at_level(logging.WARNING, logger="i2d2.io"), RunLock(tmp_path):
        pass
    assert f"pid {holder.pid}" in caplog.text and "taking over" in caplog.text


def test_lock_is_released_when_the_run_fails(tmp_path):
    with pytest.raises(ZeroDivisionError), RunLock(tmp_path):
        1 / 0
    with RunLock(tmp_path):  # not held any more
        pass


def test_same_process_cannot_take_it_twice(tmp_path):
    with RunLock(tmp_path), pytest.raises(RunLockedError, match=f"pid {os.getpid()}"):
        RunLock(tmp_path).acquire()


@pytest.fixture
def no_flock(monkeypatch):
    """A file system without flock (some network mounts): the pid-file fallback."""
    import filelock

    def unsupported(self, *a, **k):
        raise NotImplementedError("FileSystem does not appear to support flock")

    monkeypatch.setattr(filelock.FileLock, "acquire", unsupported)


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_pid_fallback_takes_over_a_dead_pid_and_refuses_a_live_one(tmp_path, no_flock, caplog):
    info = tmp_path / LOCK_INFO
    pid = dead_pid()
    info.write_text(json.dumps({"host": socket.gethostname(), "pid": pid, "command": "old run"}))
    with caplog.at_level(logging.WARNING, logger="i2d2.io"), RunLock(tmp_path):
        assert json.loads(info.read_text())["pid"] == os.getpid()
    assert f"pid {pid}" in caplog.text and "stale" in caplog.text
    assert not info.exists()

    info.write_text(json.dumps({"host": socket.gethostname(), "pid": os.getppid(), "command": "live run"}))
    with pytest.raises(RunLockedError, match=f"pid {os.getppid()}.*live run"):
        RunLock(tmp_path).acquire()
    info.write_text(json.dumps({"host": "elsewhere", "pid": 1, "command": "remote run"}))
    with pytest.raises(RunLockedError, match="host elsewhere.*delete"):
        RunLock(tmp_path).acquire()


def test_cli_second_launch_on_one_run_dir_fails_at_once(tmp_path):
    """python -m i2d2.train on a run_dir another process writes: exit 2, the holder named, nothing started."""
    holder = start_holder(tmp_path)
    try:
        r = subprocess.run([sys.executable, "-m", "i2d2.train", f"run_dir={tmp_path}", "model=tiny_gpt2",
                            "critic=tiny", "logger=none"], capture_output=True, text=True, cwd=ROOT, timeout=120,
                           env=launch_env())
    finally:
        holder.communicate("")
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"is in use by pid {holder.pid}" in r.stderr
    assert not (tmp_path / "iter_0").exists()


def test_a_taken_lock_can_be_entered(tmp_path):
    """train.main takes the lock before the run, then holds it through it: entering it must not take it twice."""
    lock = RunLock(tmp_path).acquire()
    with lock:
        assert json.loads((tmp_path / LOCK_INFO).read_text())["pid"] == os.getpid()
    assert not (tmp_path / LOCK_INFO).exists()
    with RunLock(tmp_path):
        pass
