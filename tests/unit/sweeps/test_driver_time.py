"""The driver's time limit is its partition's MaxTime when that is shorter than 7 days (issue
32.2: a fixed 7 days left it pending for ever, PartitionTimeLimit, under EnforcePartLimits=NO),
and `sweep wait` says once on stderr why a pending driver does not start instead of hanging
silently."""
from __future__ import annotations

import datetime as dt
from types import SimpleNamespace

import pytest

from gpuhpc.ledger import db
from gpuhpc.ledger.orm import Sweep, SweepTrial
from gpuhpc.slurm.parsers import parse_partitions
from gpuhpc.slurm.state import SlurmState
from gpuhpc.sweeps import store, submission
from gpuhpc.sweeps.api import Sweep as SweepHandle
from gpuhpc.sweeps.spec import SweepSpec, spec_json

PARTS = parse_partitions(
    "PartitionName=gpu AllowAccounts=ALL Default=YES MaxTime=2-00:00:00 State=UP Nodes=g[1-2]\n"
    "PartitionName=cpu AllowAccounts=ALL Default=NO MaxTime=00:30:00 State=UP Nodes=c1\n"
    "PartitionName=long AllowAccounts=ALL Default=NO MaxTime=30-00:00:00 State=UP Nodes=c1\n"
    "PartitionName=all AllowAccounts=ALL Default=NO MaxTime=UNLIMITED State=UP Nodes=c1,g[1-2]\n")


@pytest.mark.parametrize("partition, time", [
    ("cpu", "00:30:00"),                 # shorter than 7 days: the partition's
    (None, "2-00:00:00"),                # no partition named: the default partition's
    ("all", "7-00:00:00"),               # no limit: 7 days
    ("long", "7-00:00:00"),              # longer than 7 days: 7 days (the template requeues it)
    ("gone", "7-00:00:00"),              # a partition Slurm did not list
])
def test_the_driver_gets_its_partitions_max_time(partition, time):
    assert submission.driver_time(PARTS, partition) == time


def test_no_partitions_known_keeps_7_days():
    assert submission.driver_time([], None) == submission.DRIVER_TIME == "7-00:00:00"


class _Queue:
    """squeue showing the driver pending for ``reason``."""

    def __init__(self, reason: str) -> None:
        self.reason, self.calls = reason, 0

    def queue(self, job_ids=()):
        self.calls += 1
        return [SimpleNamespace(job_id=j, state=SlurmState.parse("PENDING"), reason=self.reason) for j in job_ids]


def _pending_driver_sweep(url: str, tmp_path) -> int:
    spec = SweepSpec.from_mapping({"name": "p", "command": "echo {x}", "method": "grid",
                                   "parameters": {"x": {"type": "int", "low": 0, "high": 3}}, "parallelism": 2,
                                   "resources": {"partition": "cpu", "time": "5m"},
                                   "metric": {"name": "loss", "goal": "minimize"}})
    old = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=10)     # no heartbeat: it never ran
    with db.session_scope(url) as s:
        sw = Sweep(name="p", user_name="u", cluster="c", spec=spec_json(spec), status="running",
                   directory=str(tmp_path), n_trials=4, driver_job_id="900", updated_at=old, created_at=old)
        s.add(sw)
        s.flush()
        for i in range(4):
            s.add(SweepTrial(sweep_id=sw.id, number=i, params=f'{{"x": {i}}}', state="waiting", updated_at=old))
        return sw.id


@pytest.mark.parametrize("reason, said", [("PartitionTimeLimit", True), ("Priority", False)])
def test_wait_says_once_why_a_pending_driver_does_not_start(tmp_path, capsys, reason, said):
    url = f"sqlite:///{tmp_path / 'sweeps.db'}"
    db.upgrade(url)
    sid = _pending_driver_sweep(url, tmp_path)
    q = _Queue(reason)
    sw = SweepHandle(sid, client=q, url=url)
    for _ in range(3):                              # three rounds of wait, each ended by its timeout
        with pytest.raises(TimeoutError):
            sw.wait(timeout=0, poll=0)
    err = capsys.readouterr().err
    assert q.calls == 3
    if said:
        assert err.count("\n") == 1 and f"driver (job 900) is pending ({reason})" in err, err
    else:
        assert err == ""


def test_sweep_run_asks_for_the_partitions_once():
    """The driver's partition (create) and its MaxTime (start_driver) come from one
    ``scontrol show partition`` per client: the time limit costs no extra Slurm command."""
    class Client:
        calls = 0

        def partitions(self):
            Client.calls += 1
            return PARTS

    c = Client()
    spec = SweepSpec.from_mapping({"name": "p", "command": "echo {x}", "method": "grid",
                                   "parameters": {"x": {"type": "int", "low": 0, "high": 3}},
                                   "resources": {"partition": "gpu", "time": "5m"}, "metric": {"name": "loss"}})
    assert submission.driver_partition(spec, c) == "cpu"
    assert submission.driver_time(submission.cluster_partitions(c), submission.driver_partition(spec, c)) == "00:30:00"
    assert Client.calls == 1
