"""Submission through a fake SlurmClient: the quota hook order, the Job handle's states."""
from __future__ import annotations

import pytest

from gpuhpc.errors import QuotaExceeded, SlurmError
from gpuhpc.jobs import api
from gpuhpc.jobs.submitit_adapters import submitit_params
from gpuhpc.jobs.spec import JobSpec, Resources
from gpuhpc.slurm.parsers import NodeInfo, QueueRow
from gpuhpc.slurm.state import JobState, SlurmState


def _node(name: str, partitions: tuple[str, ...], gpus: dict[str, int]) -> NodeInfo:
    return NodeInfo(name=name, state="IDLE", cpus=16, cpus_alloc=0, real_memory_mb=64000, alloc_memory_mb=0,
                    partitions=partitions, gpus_total=gpus)


# the local cluster's nodes (docs/DEVELOPING.md)
NODES = [_node("gpu-node1", ("gpu", "gpu-hi", "all"), {"h100": 8}),
         _node("gpu-node2", ("gpu", "gpu-hi", "all"), {"h100": 8}),
         _node("mig-node1", ("mig", "all"), {"1g.10gb": 7, "3g.40gb": 2}),
         _node("cpu-node1", ("cpu", "all"), {})]


class FakeClient:
    """SlurmClient's methods that the jobs API calls, with SlurmClient's own signatures
    (test_fake_client_matches_slurm_client keeps them in step)."""

    def __init__(self, fail: bool = False, queue_rows=(), show=None, nodes=NODES):
        self.fail = fail
        self.scripts: list[str] = []
        self.rows = list(queue_rows)
        self.show = show
        self._nodes = list(nodes)
        self.cancelled: list[str] = []

    def cluster_name(self):
        return "testc"

    def nodes(self):
        return self._nodes

    def submit_script(self, script, *, extra=(), workdir=None, script_dir=None):
        if self.fail:
            raise SlurmError("sbatch failed", stderr="sbatch: error: Invalid account")
        self.scripts.append(script)
        return "77"

    def queue(self, *, user=None, job_ids=()):
        return self.rows

    def accounting(self, *, job_ids=(), user=None, all_users=False, since=None, until=None, duplicates=False,
                   allocations=True):
        return []

    def show_job(self, job_id):
        return self.show

    def restarts(self, job_id):
        return int((self.show or {}).get("Restarts", 0))

    def cancel(self, job_id, *, signal=None, full=False):
        self.cancelled.append(job_id)


def test_fake_client_matches_slurm_client():
    """Every FakeClient method exists on SlurmClient with the same parameters (names, kinds,
    defaults), so the fake cannot drift from what the API really calls."""
    import inspect

    from gpuhpc.slurm.client import SlurmClient

    def params(fn):
        return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]

    methods = [n for n, v in vars(FakeClient).items() if callable(v) and not n.startswith("_")]
    assert methods
    for name in methods:
        assert hasattr(SlurmClient, name), f"SlurmClient has no {name}"
        assert params(getattr(FakeClient, name)) == params(getattr(SlurmClient, name)), name


class FakeReservation:
    def __init__(self, log):
        self.log = log

    def attach_job(self, job_id):
        self.log.append(("attach", job_id))

    def release(self):
        self.log.append(("release",))


@pytest.fixture
def ledger(monkeypatch):
    from gpuhpc.ledger import hooks

    log: list = []

    def reserve(req):
        log.append(("reserve", req))
        if req.account == "broke":
            raise QuotaExceeded("quota exceeded for account broke")
        return FakeReservation(log)

    monkeypatch.setattr(hooks, "ledger_in_use", lambda: "sqlite:///x")
    monkeypatch.setattr(hooks, "reserve", reserve)
    return log


def _spec(**res):
    return JobSpec(command=("python", "t.py"), name="n", template="torchrun",
                   resources=Resources(nodes=2, gpus=8, gpu_type="h100", time="2h", partition="gpu", **res))


def test_reserve_then_sbatch_then_attach(ledger, tmp_path, monkeypatch):
    monkeypatch.setenv("GPUHPC_LOG_DIR", str(tmp_path))
    c = FakeClient()
    job = api.submit(_spec(account="research"), client=c)
    assert job.job_id == "77" and len(c.scripts) == 1
    kind, req = ledger[0]
    assert kind == "reserve" and req.gpus == 16 and req.time_limit_s == 7200 and req.gpu_type == "h100"
    assert req.cluster == "testc" and req.account == "research" and req.partition == "gpu"
    assert req.array_size == 1 and req.job_name == "n"
    assert ledger[1] == ("attach", "77")
    assert job._log_path == str(tmp_path / "n-77.out")


def test_sbatch_failure_releases_and_reraises(ledger, tmp_path, monkeypatch):
    monkeypatch.setenv("GPUHPC_LOG_DIR", str(tmp_path))
    with pytest.raises(SlurmError):
        api.submit(_spec(), client=FakeClient(fail=True))
    assert [e[0] for e in ledger] == ["reserve", "release"]


def test_quota_exceeded_submits_nothing(ledger, tmp_path, monkeypatch):
    monkeypatch.setenv("GPUHPC_LOG_DIR", str(tmp_path))
    c = FakeClient()
    with pytest.raises(QuotaExceeded) as exc:
        api.submit(_spec(account="broke"), client=c)
    assert exc.value.exit_code == 3 and c.scripts == []


def test_ledger_off_submits_without_reservation(monkeypatch, tmp_path):
    monkeypatch.setenv("GPUHPC_LOG_DIR", str(tmp_path))
    monkeypatch.setenv("GPUHPC_LEDGER", "off")
    assert api.submit(_spec(), client=FakeClient()).job_id == "77"


def _row(state: str) -> QueueRow:
    return QueueRow(job_id="77", job_id_raw="77", array_job_id="77", array_task_id="N/A", name="n",
                    state=SlurmState.parse(state), elapsed="1:00", time_limit="2:00:00", nodes=2,
                    tres_per_node="gres:gpu:h100:8", partition="gpu", user="u", account="a",
                    nodelist="gpu-node[1-2]", reason="None", qos="normal")


@pytest.mark.parametrize("raw,state,done", [
    ("RUNNING", JobState.RUNNING, False), ("PREEMPTED", JobState.PREEMPTED, False),
    ("REQUEUED", JobState.REQUEUED, False), ("NODE_FAIL", JobState.NODE_FAIL, False),
    ("COMPLETED", JobState.COMPLETED, True), ("CANCELLED by 0", JobState.CANCELLED, True),
])
def test_job_state_keeps_raw_and_requeue_states_are_not_finished(raw, state, done):
    job = api.Job("77", client=FakeClient(queue_rows=[_row(raw)], show={"Requeue": "1"}))
    assert job.state is state and job.slurm_state.raw == raw and job.done() is done


def test_preempted_and_not_requeueable_is_done():
    job = api.Job("77", client=FakeClient(queue_rows=[_row("PREEMPTED")], show={"Requeue": "0"}))
    assert job.done()


def test_script_result_raises_on_failure():
    job = api.Job("77", client=FakeClient(queue_rows=[_row("FAILED")]))
    with pytest.raises(api.JobFailed):
        job.result(timeout=1)


@pytest.mark.parametrize("bad", ["12;rm", "$(x)", "", "12 13"])
def test_job_ids_are_validated(bad):
    from gpuhpc.errors import UserInputError

    with pytest.raises(UserInputError):
        api.Job(bad)


def test_submitit_parameters_come_from_the_one_translation():
    p = submitit_params(Resources(gpus=2, gpu_type="h100", nodes=1, time="20m", partition="gpu"),
                             "f", 60, None)
    assert p["time"] == 20 and p["signal_delay_s"] == 60
    assert p["additional_parameters"] == {"nodes": "1", "gres": "gpu:h100:2", "time": "00:20:00",
                                          "partition": "gpu", "requeue": True}
    assert any("GPUHPC_SCRATCH" in line for line in p["setup"])


def test_callable_names_are_restricted():
    from gpuhpc.errors import UserInputError

    with pytest.raises(UserInputError):
        api.submit(print, resources=Resources(), name="a b", client=FakeClient())


def test_gpus_per_node_from_squeue():
    from gpuhpc.cli.jobs import _gpus_per_node

    assert _gpus_per_node("gres:gpu:h100:8") == 8
    assert _gpus_per_node("gres/gpu:h100=8") == 8
    assert _gpus_per_node("gres:gpu:2") == 2
    assert _gpus_per_node("N/A") == 0


def test_resources_as_mapping_lists_valid_names():
    from gpuhpc.errors import UserInputError

    with pytest.raises(UserInputError) as exc:
        api.submit(print, resources={"gpu_count": 2}, client=FakeClient())
    assert "gpu_type" in exc.value.one_line() and "gpus" in exc.value.one_line()


def test_gpu_request_no_node_can_hold_is_refused_before_reserve_and_sbatch(ledger, tmp_path, monkeypatch):
    from gpuhpc.errors import UserInputError

    monkeypatch.setenv("GPUHPC_LOG_DIR", str(tmp_path))
    c = FakeClient()
    for res, field, words in [
        (dict(gpus=1, gpu_type="nosuch"), "gpu_type", ["no GPU type 'nosuch'", "1g.10gb, 3g.40gb, h100"]),
        (dict(gpus=100000), "gpus", ["100000 GPUs per node", "(mig-node1) has 9"]),
        (dict(gpus=9, gpu_type="h100", partition="gpu"), "gpus", ["largest node of partition gpu", "has 8"]),
        (dict(gpus=1, gpu_type="1g.10gb", partition="gpu"), "gpu_type", ["partition gpu", "it has: h100"]),
        (dict(gpus=1, partition="cpu"), "gpus", ["partition cpu has no GPUs"]),
        (dict(gpus=8, gpu_type="h100", nodes=3), "nodes", ["3 nodes", "has 2"]),
    ]:
        spec = JobSpec(command=("true",), template="torchrun", resources=Resources(time="1h", **res))
        with pytest.raises(UserInputError) as exc:
            api.submit(spec, client=c)
        assert exc.value.exit_code == 2 and exc.value.field == field
        assert all(w in exc.value.one_line() for w in words), exc.value.one_line()
    assert c.scripts == [] and ledger == []


def test_gpu_requests_that_fit_are_submitted(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUHPC_LOG_DIR", str(tmp_path))
    monkeypatch.setenv("GPUHPC_LEDGER", "off")
    for res in (dict(gpus=8, gpu_type="h100", nodes=2), dict(gpus=7, gpu_type="1g.10gb", partition="mig"),
                dict(gpus=0, partition="cpu"), dict(gpus=2, gpu_type="h100", partition="all")):
        spec = JobSpec(command=("true",), template="torchrun", resources=Resources(time="1h", **res))
        assert api.submit(spec, client=FakeClient()).job_id == "77"
    # Slurm cannot list its nodes: sbatch decides
    broken = FakeClient()
    broken.nodes = lambda: (_ for _ in ()).throw(SlurmError("scontrol failed"))
    assert api.submit(_spec(), client=broken).job_id == "77"


def test_status_asks_slurm_once_per_source():
    calls = []

    class Counting(FakeClient):
        def queue(self, *, user=None, job_ids=()):
            calls.append("squeue")
            return super().queue(user=user, job_ids=job_ids)

        def show_job(self, job_id):
            calls.append("scontrol")
            return super().show_job(job_id)

        def accounting(self, **kw):
            calls.append("sacct")
            return super().accounting(**kw)

    job = api.Job("77", client=Counting(queue_rows=[_row("RUNNING")],
                                         show={"JobState": "RUNNING", "Restarts": "2", "StdOut": "/logs/n-77.out",
                                               "Requeue": "1", "RunTime": "00:01:02"}))
    info = job.status()
    assert info["restarts"] == 2 and info["log"] == "/logs/n-77.out" and info["finished"] is False
    assert info["state"] == "RUNNING" and info["elapsed"] == "1:02"
    assert calls == ["scontrol"]                            # slurmctld knows it: one question

    from types import SimpleNamespace

    class Gone(Counting):                                   # slurmctld forgot it: one sacct, nothing else
        def accounting(self, **kw):
            calls.append("sacct")
            assert kw["duplicates"]
            run = dict(job_id="77", name="n", elapsed_s=5, time_limit="5:00", nodelist="c1", partition="cpu",
                       account="a", user="u", exit_code="0:0", gpus=0)
            return [SimpleNamespace(**run, state=SlurmState.parse(s)) for s in ("REQUEUED", "COMPLETED")]

    calls.clear()
    info = api.Job("77", client=Gone()).status()
    assert calls == ["scontrol", "sacct"]
    assert info["state"] == "COMPLETED" and info["restarts"] == 1 and info["finished"] is True


def test_status_of_an_unknown_job_is_an_error():
    from gpuhpc.errors import GpuhpcError

    with pytest.raises(GpuhpcError, match="not found"):
        api.Job("77", client=FakeClient()).status()


def test_cancel_reports_unknown_and_ended_jobs():
    from gpuhpc.cli.jobs import not_cancellable

    class Acct(FakeClient):
        def accounting(self, *, job_ids=(), user=None, all_users=False, since=None, until=None,
                       duplicates=False, allocations=True):
            from types import SimpleNamespace

            return [SimpleNamespace(job_id="50", array_job_id="50", state=SlurmState.parse("COMPLETED"))]

    c = Acct(queue_rows=[_row("RUNNING")])
    assert not_cancellable(c, ["77", "50", "99999"]) == {"50": "already ended (COMPLETED)",
                                                         "99999": "no such job"}
    assert not_cancellable(Acct(queue_rows=[_row("CANCELLED by 0")]), ["77"]) == {
        "77": "already ended (CANCELLED by 0)"}


def test_follow_log_reads_from_the_last_offset_until_the_job_ends():
    """Each poll asks the runner for the bytes after what was already printed, and the bytes
    written just before the job ended are printed too."""
    log = [b"a\n", b"", b"bc\n", b"d\n"]        # what the file grows by between polls
    reads: list[int] = []

    class Runner:
        def __init__(self):
            self.data = b""

        def read_from(self, path, offset):
            reads.append(offset)
            if log:
                self.data += log.pop(0)
            return self.data[offset:]

    class Client(FakeClient):
        runner = Runner()

        def queue(self, *, user=None, job_ids=()):
            return [_row("RUNNING" if log else "COMPLETED")]

    job = api.Job("77", client=Client(show={"StdOut": "/logs/x.out"}))
    out = b"".join(job.follow_log(poll=0, check_every=0))
    assert out == b"a\nbc\nd\n"
    assert reads == sorted(reads) and reads[:3] == [0, 2, 2]


def test_jobs_table_keeps_one_line_per_job_and_no_escape_sequences():
    from gpuhpc.cli.jobs import _table

    row = dict(job_id="1", name="a\x1b[31mred\nx", raw_state="RUNNING", partition="gpu", nodes=1, gpus=8,
               elapsed="1:00", gpu_hours=0.125, reason="None")
    lines = _table([row, {**row, "job_id": "12345", "name": "n"}]).splitlines()
    assert len(lines) == 3 and "\x1b" not in "".join(lines)
    assert lines[0].split() == ["JOBID", "NAME", "STATE", "PARTITION", "NODES", "GPUS", "ELAPSED", "GPU-H", "REASON"]
    assert lines[1].split()[:3] == ["1", "a?[31mred", "x"] and lines[1].rstrip().endswith("0.12")
    assert lines[0].index("GPUS") + 4 == lines[2].index(" 8 ") + 2          # numbers right-aligned


def test_status_reraises_what_scontrol_raised():
    class Failing(FakeClient):
        def show_job(self, job_id):
            raise SlurmError("scontrol show job failed", stderr="slurm_load_jobs error: Unable to contact slurm controller")

    with pytest.raises(SlurmError, match="Unable to contact"):
        api.Job("77", client=Failing(queue_rows=[_row("RUNNING")])).status()
