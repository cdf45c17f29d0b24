"""Submission through a fake SlurmClient: the quota hook order, the Job handle's states."""
from __future__ import annotations

import pytest

from gpuhpc.errors import QuotaExceeded, SlurmError
from gpuhpc.jobs import api
from gpuhpc.jobs.spec import JobSpec, Resources
from gpuhpc.slurm.parsers import QueueRow
from gpuhpc.slurm.state import JobState, SlurmState


class FakeClient:
    def __init__(self, fail: bool = False, queue_rows=(), show=None):
        self.fail = fail
        self.scripts: list[str] = []
        self.rows = list(queue_rows)
        self.show = show

    def cluster_name(self):
        return "testc"

    def submit_script(self, script, **kw):
        if self.fail:
            raise SlurmError("sbatch failed", stderr="sbatch: error: Invalid account")
        self.scripts.append(script)
        return "77"

    def queue(self, **kw):
        return self.rows

    def accounting(self, **kw):
        return []

    def show_job(self, job_id):
        return self.show


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
    return JobSpec(command=("python", "t.py"), name="n",
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
    p = api._submitit_params(Resources(gpus=2, gpu_type="h100", nodes=1, time="20m", partition="gpu"),
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
