"""The worker's checks, in-process (no fork, no server): which requests a worker may serve,
and when it may serve another command after one."""
from __future__ import annotations

import atexit
import os
import signal

import pytest

from gpuhpc.cmdserver.codewatch import CodeWatch
from gpuhpc.cmdserver.protocol import Decline, Identity, Request
from gpuhpc.cmdserver.state import WorkerState, set_environ
from gpuhpc.cmdserver.worker import EventLog, Worker


@pytest.fixture
def worker(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text("[cmdserver]\nenabled = true\n")
    code = CodeWatch(config=[str(config), str(tmp_path / "absent.toml")])
    env = {"PATH": "/usr/bin", "PYTHONPATH": "/x"}
    yield Worker(None, code, env, -1, os.getppid(), Identity.of_this_process(), EventLog())
    code.close()


def _req(**kw) -> Request:
    base = dict(cwd="/", umask=0o22, identity=Identity.of_this_process(), argv=["gpuhpc", "submit"],
                env={"PATH": "/bin", "PYTHONPATH": "/x", "OTHER": "y"})
    return Request(**{**base, **kw})


def test_a_caller_set_up_like_the_worker_is_served(worker):
    assert worker.check(_req()) is None               # other variables may differ


def test_python_variables_must_match(worker):
    assert worker.check(_req(env={"PYTHONPATH": "/y"}))[0] is Decline.PYTHON_ENV
    assert worker.check(_req(env={"PYTHONPATH": "/x", "PYTHONWARNINGS": "ignore"}))[0] is Decline.PYTHON_ENV


def test_ids_and_limits_must_match(worker):
    me = Identity.of_this_process()
    assert worker.check(_req(identity=Identity("1 1 1 1", me.groups, me.rlimits)))[0] is Decline.IDENTITY
    assert worker.check(_req(identity=Identity(me.ids, me.groups, "1 0 0")))[0] is Decline.LIMITS


def test_a_config_change_makes_the_worker_stale(worker, tmp_path):
    (tmp_path / "absent.toml").write_text("[cmdserver]\nallowed = false\n")
    assert worker.check(_req())[0] is Decline.STALE


def test_worker_state_notices_what_a_command_leaves_behind():
    state = WorkerState()
    assert state.unchanged() and state.reusable_after(["gpuhpc", "submit"], 0)
    assert not state.reusable_after(["gpuhpc", "jobs"], 0)
    assert not state.reusable_after(["gpuhpc", "submit"], 130)
    old = signal.signal(signal.SIGUSR1, lambda *_: None)
    try:
        assert not state.unchanged()
    finally:
        signal.signal(signal.SIGUSR1, old)
    assert state.unchanged()

    def hook() -> None:
        pass

    atexit.register(hook)
    try:
        assert not state.reusable_after(["gpuhpc", "submit"], 0)
    finally:
        atexit.unregister(hook)


def test_restore_puts_env_umask_and_cwd_back(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUHPC_TEST_KEEP", "1")
    state = WorkerState()
    saved = dict(os.environ)
    old = os.umask(0o077)
    os.chdir(tmp_path)
    set_environ({"ONLY": "this"})
    try:
        assert dict(os.environ) == {"ONLY": "this"}
        state.restore(saved)
        assert dict(os.environ) == saved and os.getcwd() == state.cwd
        assert os.umask(old) == state.umask
    finally:
        os.environ.clear()
        os.environ.update(saved)
        os.chdir(state.cwd)
