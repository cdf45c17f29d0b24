"""``Job.wait`` through the one shared watcher (gpuhpc.jobs.watch): N jobs waited on at once in N
threads cost one Slurm query per round (counted through the client's calls), not N; the rounds
grow apart while nothing changes; nothing is left behind once the waits end. No Slurm needed."""
from __future__ import annotations

import threading
import types

import pytest
from polling import wait_for

from gpuhpc.errors import UserInputError
from gpuhpc.jobs import watch
from gpuhpc.jobs.handle import Job
from gpuhpc.slurm.client import SlurmClient
from gpuhpc.slurm.state import JobState, SlurmState
from gpuhpc.transport.local import LocalRunner


class Slurm:
    """A client whose squeue answers RUNNING for the first ``running`` calls, then ``final``, and
    shows none of the ``forgotten`` jobs (sacct does, ``final``); it records every call (its call
    counter) and calls ``before`` first, if set."""

    def __init__(self, running: int, final: str = "COMPLETED", forgotten=()) -> None:
        self.running, self.final, self.forgotten = running, final, set(forgotten)
        self.calls: list[tuple[str, tuple[str, ...]]] = []
        self.before = None
        self.lock = threading.Lock()

    def queue(self, *, user=None, job_ids=()):
        if self.before is not None:
            self.before()
        with self.lock:
            self.calls.append(("queue", tuple(job_ids)))
            state = "RUNNING" if len(self.calls) <= self.running else self.final
        return [types.SimpleNamespace(job_id=j, name="n", state=SlurmState.parse(state), reason="", elapsed="",
                                      time_limit="", nodes=1, nodelist="", partition="", account="", user="",
                                      tres_per_node="") for j in job_ids if j not in self.forgotten]

    def accounting(self, *, job_ids=(), **kw):
        with self.lock:
            self.calls.append(("accounting", tuple(job_ids)))
        return [types.SimpleNamespace(job_id=j, state=SlurmState.parse(self.final)) for j in job_ids]

    def show_job(self, job_id):
        return {"Requeue": "0"}         # a PREEMPTED job that is not requeueable is done (Job.done)


def _wait_in_threads(jobs, **kw):
    out: dict[str, object] = {}

    def run(job):
        try:
            out[job.job_id] = job.wait(**kw)
        except BaseException as exc:    # reported below, never lost in a thread
            out[job.job_id] = exc

    threads = [threading.Thread(target=run, args=(j,)) for j in jobs]
    for t in threads:
        t.start()
    return threads, out


def test_n_jobs_waited_on_at_once_cost_one_query_per_round_not_n():
    n, running = 8, 4
    client = Slurm(running)
    jobs = [Job(str(100 + i), client=client) for i in range(n)]
    intervals: list[float] = []
    with watch.shared(client) as watcher:
        def first_round_waits_for_every_waiter():
            intervals.append(watcher.interval)
            if not client.calls:            # the first round: once all N waits have joined
                wait_for(lambda: watcher.watched() == n, 10, f"{n} waits to join the shared watcher", 0.01)

        client.before = first_round_waits_for_every_waiter
        threads, out = _wait_in_threads(jobs, timeout=60, poll=0.001, max_poll=0.01)
        for t in threads:
            t.join()
    assert out == {j.job_id: JobState.COMPLETED for j in jobs}
    # round 1 (started by the first waiter) asked for its job; every later round for all N at once
    assert len(client.calls) == running + 1 == watcher.rounds
    assert all(call == ("queue", tuple(sorted(j.job_id for j in jobs))) for call in client.calls[1:])
    # rounds with no change in between grow apart (x1.5, up to max_poll)
    assert intervals[2] == 0.001 and intervals[2] < intervals[3] < intervals[4] <= 0.01


def test_rounds_grow_apart_while_nothing_changes_and_come_back_on_a_change():
    steps, interval = [], 2.0
    for changed in (False, False, False, False, False, False, False, False, False, True, False):
        interval = watch.next_interval(interval, changed, 2.0, 30.0)
        steps.append(interval)
    assert steps == [3.0, 4.5, 6.75, 10.125, 15.1875, 22.78125, 30.0, 30.0, 30.0, 2.0, 3.0]


def test_a_finished_job_is_not_asked_again_while_the_watcher_lives():
    client = Slurm(running=0, final="FAILED")
    job = Job("7", client=client)
    with watch.shared(client) as watcher:
        assert job.wait(poll=0.001) is JobState.FAILED
        assert Job("7", client=client).wait(poll=0.001) is JobState.FAILED      # from the watcher's memory
        assert client.calls == [("queue", ("7",))] and watcher.rounds == 1
    # no waits and no holder: the shared watcher is gone, the next wait asks Slurm again
    assert job.wait(poll=0.001) is JobState.FAILED and client.calls == [("queue", ("7",))] * 2


def test_jobs_slurmctld_forgot_are_read_from_sacct_in_the_same_round():
    client = Slurm(running=0, final="TIMEOUT", forgotten={"11"})
    threads, out = _wait_in_threads([Job("10", client=client), Job("11", client=client)], poll=0.001,
                                   timeout=10)
    for t in threads:
        t.join()
    assert out == {"10": JobState.TIMEOUT, "11": JobState.TIMEOUT}
    assert ("accounting", ("11",)) in client.calls and all(ids != ("10",) for k, ids in client.calls if k == "accounting")


def test_preempted_and_not_requeueable_ends_the_wait():
    client = Slurm(running=0, final="PREEMPTED")
    assert Job("8", client=client).wait(poll=0.001) is JobState.PREEMPTED


def test_a_wait_times_out_naming_the_last_state():
    client = Slurm(running=10**9)
    with pytest.raises(TimeoutError, match="job 9 still RUNNING after 0.05s"):
        Job("9", client=client).wait(timeout=0.05, poll=0.001, max_poll=0.002)


def test_local_clients_of_one_cluster_share_a_watcher_others_do_not(monkeypatch):
    monkeypatch.delenv("SLURM_CONF", raising=False)
    a, b = SlurmClient(LocalRunner()), SlurmClient(LocalRunner())
    other = SlurmClient(LocalRunner(env={"SLURM_CONF": "/private/slurm.conf"}))
    assert watch.cluster_key(a) == watch.cluster_key(b) != watch.cluster_key(other)
    with watch.shared(a) as wa, watch.shared(b) as wb, watch.shared(other) as wo:
        assert wa is wb and wo is not wa


def test_poll_is_checked():
    with pytest.raises(UserInputError, match="poll must be a positive number"):
        Job("9", client=Slurm(0)).wait(poll=0)
