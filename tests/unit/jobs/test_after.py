"""Dependencies (``after=``, ``--after``, sweep ``after:``) and many calls (``batch()``, the one
watcher) without a cluster: ids checked at the edge, rendered to sbatch's ``--dependency``,
unknown or failed predecessors refused before sbatch, one Slurm query per poll."""
from __future__ import annotations

import types

import pytest

from gpuhpc.errors import GpuhpcError, UserInputError
from gpuhpc.jobs import api, python_mode
from gpuhpc.jobs.spec import JobSpec, after_dependency, after_ids, sbatch_options
from gpuhpc.jobs.watch import Watcher, as_completed
from gpuhpc.slurm.state import JobState, SlurmState


def _row(job_id: str, state: str):
    return types.SimpleNamespace(job_id=job_id, array_job_id=job_id.split("_", 1)[0],
                                 state=SlurmState.parse(state))


class Client:
    """What check_after, submit_spec and the watcher ask: scontrol records, sacct rows, sbatch."""

    def __init__(self, show=None, acct=()):
        self.show = dict(show or {})         # job id -> JobState text while slurmctld knows it
        self.acct = list(acct)               # sacct rows
        self.calls: list[tuple] = []
        self.scripts: list[str] = []
        self.runner = types.SimpleNamespace(is_local=True, makedirs=lambda p: None)

    def show_job(self, job_id):
        self.calls.append(("show_job", job_id))
        return {"JobState": self.show[job_id]} if job_id in self.show else None

    def accounting(self, *, job_ids=(), **kw):
        self.calls.append(("accounting", tuple(job_ids)))
        return [r for r in self.acct if r.job_id in job_ids or r.array_job_id in job_ids]

    def submit_script(self, script, **kw):
        self.scripts.append(script)
        return "500"

    def nodes(self):
        return []


# ---------------------------------------------------------------- the ids and their rendering
@pytest.mark.parametrize("value, ids", [("12", ("12",)), ("12,13_4", ("12", "13_4")), (12, ("12",)),
                                        ([12, "13", 12], ("12", "13")),
                                        ([types.SimpleNamespace(job_id="7_1")], ("7_1",)), (None, ())])
def test_after_ids_take_ids_lists_and_job_handles(value, ids):
    assert after_ids(value) == ids


@pytest.mark.parametrize("value, field", [("12x", "after[0]"), ("1,,2", "after[1]"), (["1", "2;rm"], "after[1]"),
                                          ([True], "after[0]"), ({"a": 1}, "after"), (1.5, "after"),
                                          ("1_2_3", "after[0]"), ("-1", "after[0]")])
def test_bad_after_ids_name_the_field(value, field):
    with pytest.raises(UserInputError) as e:
        after_ids(value)
    assert e.value.field == field


def test_after_renders_to_one_dependency_option():
    spec = JobSpec(command=("true",), after="1,2_3", after_any=[5])
    assert ("dependency", "afterok:1:2_3,afterany:5") in sbatch_options(spec.resources, spec)
    assert after_dependency() is None
    plain = JobSpec(command=("true",))
    assert not [o for o in sbatch_options(plain.resources, plain) if o[0] == "dependency"]


def test_after_and_a_raw_dependency_together_are_refused():
    with pytest.raises(UserInputError) as e:
        JobSpec(command=("true",), after=["1"], dependency="afterok:2")
    assert e.value.field == "after"
    assert JobSpec(command=("true",), dependency="afterok:2").dependency == "afterok:2"    # -d alone: as before


def test_job_file_after_keys():
    spec = JobSpec.from_mapping({"command": ["x"], "after": [12, "13_1"], "after_any": "14"})
    assert spec.after == ("12", "13_1") and spec.after_any == ("14",)


def test_cli_after_flags_build_the_spec():
    from gpuhpc.cli.submit import build_spec

    ns = types.SimpleNamespace(file=None, env=None, command=("--", "true"), after="3,4", after_any="5",
                               after_sweep=None)
    spec = build_spec(ns)
    assert spec.after == ("3", "4") and spec.after_any == ("5",)


def test_sweep_file_after():
    from gpuhpc.sweeps.spec import SweepSpec, spec_from_json, spec_json

    data = {"name": "s", "method": "grid", "parameters": {"x": [1, 2]}, "metric": {"name": "loss"},
            "command": "echo {x}", "after": "41,42"}
    spec = SweepSpec.from_mapping(data)
    assert spec.after == ("41", "42") and spec_from_json(spec_json(spec)).after == ("41", "42")
    with pytest.raises(UserInputError) as e:
        SweepSpec.from_mapping({**data, "after": "41;x"})
    assert e.value.field == "after[0]"


# ---------------------------------------------------------------- predecessors Slurm must know
def test_unknown_predecessor_is_job_not_found_and_nothing_is_submitted():
    c = Client()
    with pytest.raises(GpuhpcError) as e:
        api.submit_spec(JobSpec(command=("true",), after=["99"]), client=c, reserve=False)
    assert not isinstance(e.value, UserInputError) and "job 99 not found" in e.value.message
    assert c.scripts == []


def test_afterok_on_a_failed_job_is_refused_afterany_is_not():
    c = Client(acct=[_row("8", "FAILED")])
    with pytest.raises(GpuhpcError) as e:
        api.check_after(c, ("8",))
    assert "job 8 ended FAILED" in e.value.message
    api.check_after(c, (), ("8",))
    c = Client(show={"9": "RUNNING", "10": "COMPLETED"})
    api.check_after(c, ("9", "10"))
    assert [k for k, _ in c.calls] == ["show_job", "show_job"]         # slurmctld knew both: no sacct


def test_an_array_is_found_through_its_tasks_in_sacct():
    c = Client(acct=[_row("30_0", "COMPLETED"), _row("30_1", "COMPLETED")])
    api.check_after(c, ("30",))
    c = Client(acct=[_row("30_0", "COMPLETED"), _row("30_1", "TIMEOUT")])
    with pytest.raises(GpuhpcError):
        api.check_after(c, ("30",))


def test_submit_spec_renders_the_dependency_once_predecessors_exist(tmp_path):
    c = Client(show={"41": "PENDING"})
    api.submit_spec(JobSpec(command=("true",), after_any=["41"], log_dir=str(tmp_path)), client=c, reserve=False)
    assert "#SBATCH --dependency=afterany:41" in c.scripts[0]


def test_submit_after_kind_checked():
    with pytest.raises(UserInputError) as e:
        api.submit(JobSpec(command=("true",)), after=["1"], after_kind="ok-ish", client=Client())
    assert e.value.field == "after_kind"


# ---------------------------------------------------------------- batch()
def test_batch_collects_and_submits_once_on_exit(monkeypatch):
    sent: list = []

    def fake_calls(calls, **opts):
        sent.append((calls, opts))
        return [api.Job(f"70_{i}", client=Client(), name="f") for i in range(len(calls))]

    monkeypatch.setattr(python_mode, "submit_calls", fake_calls)
    with api.batch(parallelism=2):
        jobs = [api.submit(abs, x, resources={"time": "5m"}) for x in (-1, -2, -3)]
        assert sent == [] and [j.job_id for j in jobs] == [None, None, None]
    assert len(sent) == 1 and [c[1] for c in sent[0][0]] == [(-1,), (-2,), (-3,)]
    assert sent[0][1]["parallelism"] == 2
    assert [j.job_id for j in jobs] == ["70_0", "70_1", "70_2"]


def test_batch_submits_nothing_when_its_block_raises_or_calls_differ(monkeypatch):
    sent: list = []
    monkeypatch.setattr(python_mode, "submit_calls", lambda calls, **o: sent.append(calls) or [])
    with pytest.raises(RuntimeError):
        with api.batch():
            api.submit(abs, 1, resources={"time": "5m"})
            raise RuntimeError("boom")
    with pytest.raises(UserInputError) as e:
        with api.batch():
            api.submit(abs, 1, resources={"time": "5m"})
            api.submit(abs, 2, resources={"time": "6m"})
    assert e.value.field == "resources" and sent == []
    with pytest.raises(UserInputError):
        with api.batch():
            api.submit(JobSpec(command=("true",)))


def test_map_array_over_ssh_is_refused():
    c = Client()
    c.runner = types.SimpleNamespace(is_local=False)
    with pytest.raises(UserInputError) as e:
        api.map_array(abs, [1, 2], resources={"time": "5m"}, client=c)
    assert e.value.field == "cluster"
    with pytest.raises(UserInputError) as e:
        api.map_array(abs, "12", client=c)
    assert e.value.field == "iterable"


# ---------------------------------------------------------------- the one watcher
class Handle:
    def __init__(self, job_id, client):
        self.job_id, self.client = job_id, client

    def done(self):
        raise AssertionError("the watcher asked a job on its own")


def test_watcher_asks_once_per_poll_for_all_jobs_arrays_by_their_id(monkeypatch):
    c = Client(acct=[_row("5", "COMPLETED"), _row("6_0", "RUNNING"), _row("6_1", "FAILED"), _row("7", "PENDING")])
    jobs = [Handle(j, c) for j in ("5", "6_0", "6_1", "7", "8")]
    w = Watcher(c)
    assert w.states([j.job_id for j in jobs]) == {"5": JobState.COMPLETED, "6_0": JobState.RUNNING,
                                                  "6_1": JobState.FAILED, "7": JobState.PENDING,
                                                  "8": JobState.UNKNOWN}
    assert c.calls == [("accounting", ("5", "6", "7", "8"))] and w.polls == 1


def test_as_completed_yields_in_finish_order_one_query_per_poll(monkeypatch):
    c = Client(acct=[_row("1", "RUNNING"), _row("2", "COMPLETED"), _row("3", "RUNNING")])
    monkeypatch.setattr("gpuhpc.jobs.watch.time.sleep", lambda s: None)
    jobs = [Handle(j, c) for j in ("1", "2", "3")]
    w = Watcher(c)
    out = []
    for job in as_completed(jobs, watcher=w):
        out.append(job.job_id)
        if job.job_id == "2":
            c.acct = [_row("1", "CANCELLED"), _row("3", "RUNNING")]
        elif job.job_id == "1":
            c.acct = [_row("3", "TIMEOUT")]
    assert out == ["2", "1", "3"] and w.polls == 3 and [k for k, _ in c.calls] == ["accounting"] * 3
    assert c.calls[-1] == ("accounting", ("3",))                   # only the jobs still running


def test_as_completed_refuses_unsubmitted_batch_handles():
    with pytest.raises(UserInputError):
        list(as_completed([Handle(None, Client())]))


# ---------------------------------------------------------------- a job after a sweep
class FakeSweep:
    INFOS = {5: {"driver_job_id": "900", "chunks": [{"job_id": "880"}], "directory": ""},
             6: {"driver_job_id": None, "chunks": [{"job_id": "881"}, {"job_id": "882"}, {"job_id": None}],
                 "directory": ""}}
    best_row: dict | None = {"trial": 3, "params": {"lr": 0.01}, "objective": 0.5}
    # accounting behind the sweep's real end: so many done() calls see a trial not final yet,
    # and best() until then is the best of the others
    lagging = 0
    early_row = {"trial": 1, "params": {"lr": 0.1}, "objective": 0.9}

    def __init__(self, sid):
        self.id = int(sid)

    def done(self):
        if FakeSweep.lagging:
            FakeSweep.lagging -= 1
            return False
        return True

    @classmethod
    def load(cls, sid, **kw):
        if int(sid) not in cls.INFOS:
            raise UserInputError(f"no sweep {sid}", field="ID")
        return cls(sid)

    def info(self):
        return self.INFOS[self.id]

    def best(self):
        return self.early_row if FakeSweep.lagging else self.best_row


@pytest.fixture
def fake_sweeps(monkeypatch):
    from gpuhpc.sweeps import api as sweeps_api
    from gpuhpc.sweeps import store

    monkeypatch.setattr(sweeps_api, "Sweep", FakeSweep)
    monkeypatch.setattr(store, "db_url", lambda url=None: "sqlite:////nowhere/gpuhpc.db")
    return FakeSweep


def _ns(sweep_id):
    return types.SimpleNamespace(file=None, env=None, command=("--", "python", "f.py"), after=None, after_any=None,
                                 after_sweep=sweep_id)


def test_after_sweep_waits_for_the_driver_or_else_every_array(fake_sweeps):
    from gpuhpc.cli.submit import build_spec

    spec = build_spec(_ns("5"))
    assert spec.after == ("900",) and spec.after_any == ()
    assert spec.command[1:] == ("-m", "gpuhpc.sweeps.best", "5", "--", "python", "f.py")
    assert spec.env["GPUHPC_DB_URL"] == "sqlite:////nowhere/gpuhpc.db"
    spec = build_spec(_ns("6"))
    assert spec.after_any == ("881", "882") and spec.after == ()
    with pytest.raises(GpuhpcError) as e:
        build_spec(_ns("7"))
    assert not isinstance(e.value, UserInputError) and "sweep 7 not found" in e.value.message
    with pytest.raises(UserInputError) as e:
        build_spec(_ns("7;x"))
    assert e.value.field == "--after-sweep"


def test_best_params_reach_the_command(fake_sweeps, tmp_path, monkeypatch):
    import json
    import os

    from gpuhpc.sweeps import best

    FakeSweep.INFOS[5]["directory"] = str(tmp_path)
    ran: list = []
    monkeypatch.setattr(os, "execvp", lambda prog, argv: ran.append((prog, argv, dict(os.environ))))
    monkeypatch.setattr(os, "environ", dict(os.environ))
    assert best.main(["5", "--", "python", "f.py"]) == 0
    prog, argv, env = ran[0]
    assert argv == ["python", "f.py"] and json.loads(env["GPUHPC_BEST_PARAMS"]) == {"lr": 0.01}
    assert json.loads((tmp_path / "best-params.json").read_text()) == {"lr": 0.01}
    assert env["GPUHPC_BEST_PARAMS_FILE"] == str(tmp_path / "best-params.json") and env["GPUHPC_BEST_TRIAL"] == "3"
    monkeypatch.setattr(FakeSweep, "best_row", None)
    ran.clear()
    assert best.main(["5", "--", "python", "f.py"]) == 1 and ran == []           # no completed trial: not run
    assert best.main(["5", "python"]) == 2


def test_python_sweep_after_reaches_its_spec(monkeypatch):
    from gpuhpc.sweeps import api as sweeps_api
    from gpuhpc.sweeps import submission

    made: list = []
    monkeypatch.setattr(submission, "create", lambda spec, **kw: made.append(spec) or 1)
    client = types.SimpleNamespace(runner=types.SimpleNamespace(is_local=True))
    sweeps_api.sweep(abs, {"x": [1, 2]}, method="grid", after=[types.SimpleNamespace(job_id="44")], client=client)
    assert made[0].after == ("44",)


def test_map_array_is_one_array_per_max_array_size_calls(monkeypatch):
    import contextlib

    import submitit

    arrays: list = []

    class Executor:
        """submitit's SlurmExecutor as map_array uses it: parameters, a batch, submits."""

        def __init__(self, folder, max_num_timeout=0, **kw):
            self.params: dict = {}

        def update_parameters(self, **params):
            self.params.update(params)

        @contextlib.contextmanager
        def batch(self):
            self.jobs: list = []
            yield
            arrays.append((self.params["array_parallelism"], [j.args for j in self.jobs]))
            for i, j in enumerate(self.jobs):
                j.job_id = f"{100 + len(arrays)}_{i}"

        def submit(self, fn, *args, **kwargs):
            job = types.SimpleNamespace(job_id=None, args=args, paths=types.SimpleNamespace(stdout="/dev/null"))
            self.jobs.append(job)
            return job

    monkeypatch.setattr(submitit, "SlurmExecutor", Executor)
    monkeypatch.setenv("GPUHPC_LEDGER", "off")
    c = Client()
    c.config = lambda: {"MaxArraySize": "3"}
    jobs = api.map_array(pow, range(7), [2] * 7, resources={"time": "5m"}, client=c, parallelism=2)
    assert arrays == [(2, [(0, 2), (1, 2), (2, 2)]), (2, [(3, 2), (4, 2), (5, 2)]), (1, [(6, 2)])]
    assert [j.job_id for j in jobs] == ["101_0", "101_1", "101_2", "102_0", "102_1", "102_2", "103_0"]


def test_the_best_waits_until_accounting_has_every_trial_final(fake_sweeps, tmp_path, monkeypatch):
    """The job after a driverless sweep starts when its arrays end; sacct may not have the last
    trial's end yet. The best is taken once every trial is final, not from the trials seen so far."""
    import os

    from gpuhpc.sweeps import best

    FakeSweep.INFOS[5]["directory"] = str(tmp_path)
    ran: list = []
    monkeypatch.setattr(os, "execvp", lambda prog, argv: ran.append(dict(os.environ)))
    monkeypatch.setattr(os, "environ", dict(os.environ))
    monkeypatch.setattr(best.time, "sleep", lambda s: None)
    monkeypatch.setattr(FakeSweep, "lagging", 3)
    assert best.main(["5", "--", "python", "f.py"]) == 0
    assert ran[0]["GPUHPC_BEST_TRIAL"] == "3" and FakeSweep.lagging == 0
    # past GPUHPC_BEST_WAIT_S: the best of the trials that are final, said on stderr
    ran.clear()
    monkeypatch.setattr(FakeSweep, "lagging", 10**6)
    monkeypatch.setenv("GPUHPC_BEST_WAIT_S", "0")
    assert best.main(["5", "--", "python", "f.py"]) == 0 and ran[0]["GPUHPC_BEST_TRIAL"] == "1"
    monkeypatch.setenv("GPUHPC_BEST_WAIT_S", "soon")
    assert best.main(["5", "--", "python", "f.py"]) == 2



@pytest.mark.parametrize("value", [0, -2, 1.5, True, "4"])
def test_bad_parallelism_names_the_field_and_submits_nothing(value, monkeypatch):
    """map_array's and batch()'s ``parallelism``: exit 2 naming it, before submitit is asked."""
    import submitit

    monkeypatch.setattr(submitit, "SlurmExecutor", lambda *a, **k: pytest.fail("submitit was asked"))
    monkeypatch.setenv("GPUHPC_LEDGER", "off")
    with pytest.raises(UserInputError) as e:
        api.map_array(abs, [1, 2], resources={"time": "5m"}, client=Client(), parallelism=value)
    assert e.value.field == "parallelism" and e.value.exit_code == 2
    with pytest.raises(UserInputError) as e:
        with api.batch(parallelism=value):
            api.submit(abs, 1, resources={"time": "5m"}, client=Client())
    assert e.value.field == "parallelism" and e.value.exit_code == 2
