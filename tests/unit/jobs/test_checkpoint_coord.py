"""gpuhpc.should_stop without torch: several local processes agree on one stop step through
the file protocol, whether they exchange a "collective" every step (a barrier) or not."""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time

import pytest

from gpuhpc.jobs import coord

CTX = mp.get_context("fork")


def _rank(r: int, world: int, directory: str, barrier, ready, out, step_s: float, limit: int) -> None:
    c = coord.StopCoordinator(rank=r, world_size=world, directory=directory, timeout=20)
    c.install()
    ready.put(r)
    step = 0
    while step < limit:
        step += 1
        time.sleep(step_s * (1 + r % 3))             # ranks run at different speeds
        if barrier is not None:
            barrier.wait(timeout=30)                  # a collective: nobody gets 2 steps ahead
        if c.should_stop(step):
            break
    out.put((r, step))


def _run(tmp_path, world: int, signal_ranks: list[int], coupled: bool, step_s: float = 0.01,
         limit: int = 100000) -> dict[int, int]:
    barrier = CTX.Barrier(world) if coupled else None
    ready, out = CTX.Queue(), CTX.Queue()
    procs = [CTX.Process(target=_rank, args=(r, world, str(tmp_path / "stop"), barrier, ready, out, step_s, limit))
             for r in range(world)]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=20)
    time.sleep(0.3)
    for i, r in enumerate(signal_ranks):
        os.kill(procs[r].pid, signal.SIGUSR2)
        time.sleep(0.05 * i)                           # the warning reaches ranks at different times
    stops = dict(out.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=10)
        assert p.exitcode == 0
    return stops


@pytest.mark.parametrize("coupled", [True, False])
@pytest.mark.parametrize("signal_ranks", [[3], [0], [1, 2, 3, 0]])
def test_all_ranks_stop_after_the_same_step(tmp_path, coupled, signal_ranks):
    stops = _run(tmp_path, 4, signal_ranks, coupled)
    assert len(set(stops.values())) == 1, stops
    decision = int((tmp_path / "stop" / "decision").read_text())
    assert set(stops.values()) == {decision}


class _Clock:
    """coord's clock in test_a_dead_peer...: ``sleep`` moves it on, nothing really waits."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s
        self.slept += s

    def __getattr__(self, name: str):
        return getattr(time, name)


def test_a_dead_peer_makes_the_others_stop_after_the_timeout(tmp_path, monkeypatch, capsys):
    d = tmp_path / "stop"
    clock = _Clock()
    monkeypatch.setattr(coord, "time", clock)
    c = coord.StopCoordinator(rank=0, world_size=2, directory=d, timeout=5)
    coord.request_stop(d)
    assert c.should_stop(5) is False                  # announced, carries on one step
    assert clock.slept == 0
    assert c.should_stop(6) is True                   # rank 1 never answers
    assert 5 <= clock.slept <= 5.5                    # it polled for the decision for the whole timeout, no longer
    assert "rank 0: no stop decision within 5s (a peer died?); stopping after step 6" in capsys.readouterr().err
    assert not (d / "decision").exists()
    assert c.should_stop(7) is True                   # and stays stopped


def test_single_process_uses_the_local_flag_and_the_request_file(tmp_path):
    c = coord.StopCoordinator(rank=0, world_size=1, directory=tmp_path / "s")
    assert not c.should_stop(1)
    coord.request_stop(tmp_path / "s")
    assert c.should_stop(2) and c.should_stop(3)


def test_rank_zero_removes_the_protocol_dirs_of_earlier_runs(tmp_path):
    old = tmp_path / ".gpuhpc-stop" / "7.0"
    old.mkdir(parents=True)
    (old / "decision").write_text("3\n")
    c = coord.StopCoordinator(rank=0, world_size=2, directory=tmp_path / ".gpuhpc-stop" / "7.1")
    assert not c.should_stop(1)
    assert not old.exists()


def test_shell_entry_point_agrees_with_python(tmp_path):
    """Two shell "ranks" (python -m gpuhpc.jobs.coord should-stop STEP, stateless per call)."""
    d = tmp_path / "stop"
    env = dict(os.environ, GPUHPC_STOP_DIR=str(d), WORLD_SIZE="2", GPUHPC_STOP_TIMEOUT="10")

    def call(r: int, step: int) -> int:
        return subprocess.run([sys.executable, "-m", "gpuhpc.jobs.coord", "should-stop", str(step)],
                              env={**env, "RANK": str(r)}, timeout=30).returncode

    assert call(0, 1) == 1 and call(1, 1) == 1          # nothing requested
    subprocess.run([sys.executable, "-m", "gpuhpc.jobs.coord", "request"], env={**env, "RANK": "0"}, check=True)
    assert call(1, 4) == 1                             # rank 1 announces at 4 and carries on
    assert call(0, 5) == 1                             # rank 0 announces at 5 -> decision 6
    assert (d / "decision").read_text().strip() == "6"
    assert call(1, 5) == 1 and call(1, 6) == 0 and call(0, 6) == 0
    assert subprocess.run([sys.executable, "-m", "gpuhpc.jobs.coord", "bogus"]).returncode == 2


def test_collective_timeout_from_the_environment(monkeypatch):
    monkeypatch.setenv("GPUHPC_COLLECTIVE_TIMEOUT_S", "1800")
    assert coord.collective_timeout().total_seconds() == 1800
    monkeypatch.delenv("GPUHPC_COLLECTIVE_TIMEOUT_S")
    assert coord.collective_timeout().total_seconds() == 600


def test_the_runs_timeout_is_long_and_the_stop_handshakes_short(monkeypatch):
    """In a job (the template's values for --grace 60): the run's collective timeout is torch's
    600 s, not 3/4 of the grace (a 45 s evaluation stall would kill a healthy job); the short
    one is stop_timeout()'s."""
    from gpuhpc.jobs.render import context
    from gpuhpc.jobs.spec import JobSpec

    ctx = context(JobSpec(command=("true",), grace=60))
    monkeypatch.setenv("GPUHPC_COLLECTIVE_TIMEOUT_S", ctx["collective_timeout"])
    monkeypatch.setenv("GPUHPC_STOP_COLLECTIVE_TIMEOUT_S", ctx["stop_timeout"])
    assert coord.collective_timeout().total_seconds() == 600
    assert coord.stop_timeout().total_seconds() == 45
    monkeypatch.delenv("GPUHPC_STOP_COLLECTIVE_TIMEOUT_S")
    assert coord.stop_timeout().total_seconds() == 45
    monkeypatch.setenv("GPUHPC_STOP_COLLECTIVE_TIMEOUT_S", "bogus")
    assert coord.stop_timeout().total_seconds() == 45
