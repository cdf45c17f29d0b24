"""Deep checks on recorded outputs (fixtures/README.md says where their shape comes from): DCGM
diagnostics and nccl all-reduce bandwidth against a baseline; the gate undoes only its own drains."""
from __future__ import annotations

from pathlib import Path

import pytest

from gpuhpc.health import deep, gate
from gpuhpc.health.checks import Status, fail, ok

FIX = Path(__file__).parent / "fixtures"


def _text(name: str) -> str:
    return (FIX / name).read_text()


def test_dcgm_pass_and_fail():
    r = deep.check_dcgm(_text("dcgmi-diag-r2-pass.json"), 0, 2)
    assert r.status is Status.OK and r.message.startswith("dcgm diag -r 2: 41 results pass (DCGM 3.3.5)")
    failures, seen, _ = deep.parse_dcgm_diag(_text("dcgmi-diag-r2-fail.json"))
    assert [(f.category, f.test, f.gpus) for f in failures] == [("Hardware", "GPU Memory", "3")]
    r = deep.check_dcgm(_text("dcgmi-diag-r2-fail.json"), 226, 2)
    assert r.status is Status.FAIL and r.category == "hw"
    assert r.message.startswith("dcgm diag -r 2 GPU Memory gpu 3: Error using CUDA API cudaMemcpy")
    assert gate.reason_for([r]).startswith("gpuhpc:hw: dcgm diag -r 2 GPU Memory gpu 3")


def test_dcgm_odd_outputs():
    noisy = "WARNING: something DCGM says first\n" + _text("dcgmi-diag-r2-pass.json")
    assert deep.check_dcgm(noisy, 0, 2).status is Status.OK
    assert deep.check_dcgm("Error: unable to connect to host engine", 255, 3).message == \
        "dcgm diag -r 3: no result (exit 255)"
    assert deep.check_dcgm('{"DCGM GPU Diagnostic": {"version": "4.2.3"}}', 1, 2).status is Status.FAIL
    assert deep.check_dcgm(None, 127, 2).status is Status.SKIP


def test_nccl_against_baseline():
    good, slow = _text("all_reduce_perf-h100x8.txt"), _text("all_reduce_perf-h100x8-slow.txt")
    assert deep.parse_all_reduce(good) == deep.AllReduce(434.711, 0)
    assert deep.check_nccl(good, 0, 434.711, 0.9).status is Status.OK
    r = deep.check_nccl(slow, 0, 434.711, 0.9)
    assert (r.status, r.category, r.message) == (Status.FAIL, "perf", "nccl 313<391 GB/s")
    assert gate.reason_for([r]) == "gpuhpc:perf: nccl 313<391 GB/s"
    first = deep.check_nccl(good, 0, None, 0.9)
    assert first.status is Status.OK and "no baseline yet" in first.message
    wrong = good.replace("Out of bounds values : 0 OK", "Out of bounds values : 12 FAILED")
    assert deep.check_nccl(wrong, 1, 434.7, 0.9).message == "nccl all_reduce 12 wrong values"
    assert deep.check_nccl("NCCL error: unhandled cuda error", 1, 434.7, 0.9).category == "sw"


def test_each_check_set_undoes_only_its_own_drain():
    nccl = "gpuhpc:perf: nccl 313<391 GB/s"
    hw = "gpuhpc:hw: gpu count 7/8"
    healthy = [ok("gpu-devices")]
    assert deep.is_deep_reason(nccl) and deep.is_deep_reason("gpuhpc:hw: dcgm diag -r 2 GPU Memory gpu 3")
    assert not deep.is_deep_reason(hw) and not deep.is_deep_reason("nccl slow (admin)")
    # the regular checks pass every 30 s: they must not return the node the deep check drained
    assert gate.decide("IDLE+DRAIN", nccl, healthy).action is gate.Action.NONE
    assert gate.decide("IDLE+DRAIN", nccl, healthy, deep=True).action is gate.Action.RESUME
    # a regular hardware drain sticks through clean regular runs: a passing deep run returns it
    assert gate.decide("IDLE+DRAIN", hw, healthy, deep=True).action is gate.Action.RESUME
    assert gate.decide("IDLE+DRAIN", hw, healthy).action is gate.Action.NONE
    sw = "gpuhpc:sw: munge"
    assert gate.decide("IDLE+DRAIN", sw, healthy, deep=True).action is gate.Action.NONE
    assert gate.decide("IDLE+DRAIN", sw, healthy).action is gate.Action.RESUME
    # a deep failure leaves the regular checks' reason (and an admin's) alone
    slow = [fail(deep.NCCL, "nccl 300<391 GB/s", "perf")]
    assert gate.decide("IDLE+DRAIN", hw, slow, deep=True).action is gate.Action.NONE
    assert gate.decide("IDLE+DRAIN", "bad fan [admin@10:00]", slow, deep=True).action is gate.Action.NONE
    d = gate.decide("IDLE", "", slow, deep=True)
    assert (d.action, d.reason) == (gate.Action.DRAIN, "gpuhpc:perf: nccl 300<391 GB/s")
    assert gate.decide("IDLE+DRAIN", nccl + " [root@10:00]", slow, deep=True).action is gate.Action.DRAIN


def test_slots_cap_concurrent_nodes(tmp_path):
    a, b, c = (deep.Slot(str(tmp_path), 2) for _ in range(3))
    assert a.acquire() and b.acquire() and not c.acquire()
    a.release()
    assert c.acquire() and c.index == 0


def test_scheduled_run_skips_a_busy_node():
    from types import SimpleNamespace

    class Client:
        def __init__(self, state):
            self.state = state

        def node(self, name):
            return SimpleNamespace(state=self.state, reason="") if self.state else None

    assert deep.node_busy("n1", Client("IDLE")) is None
    assert deep.node_busy("n1", Client("IDLE+DRAIN")) is None            # drained, nothing running: test it
    assert deep.node_busy("n1", Client("MIXED")) == "running jobs (MIXED)"
    assert deep.node_busy("n1", Client("ALLOCATED+DRAIN")) == "running jobs (ALLOCATED+DRAIN)"
    assert deep.node_busy("n1", Client(None)) == "not a Slurm node"


def test_slots_refuse_a_directory_others_can_write_and_are_private(tmp_path):
    import stat

    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    with pytest.raises(PermissionError, match="must be a directory owned by uid"):
        deep.Slot(str(open_dir), 1).acquire()
    assert list(open_dir.iterdir()) == []
    s = deep.Slot(str(tmp_path / "slots"), 1)
    assert s.acquire()
    assert stat.S_IMODE((tmp_path / "slots").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "slots" / "deep-slot-0").stat().st_mode) == 0o600
    s.release()


# ------------------------------------------------------------------ the job that holds the node
def test_mig_nodes_run_the_checks_that_fit_mig():
    assert deep.is_mig_node({"1g.10gb": 7, "3g.40gb": 2}) and deep.is_mig_node({"nvidia_h100_80gb_hbm3_1g.10gb": 7})
    assert not deep.is_mig_node({"h100": 8}) and not deep.is_mig_node({})
    assert deep.gres_request({"1g.10gb": 7, "3g.40gb": 2}) == "gpu:1g.10gb:7,gpu:3g.40gb:2"
    assert deep.gres_request({"h100": 8}) == "gpu:h100:8" and deep.gres_request({"gpu": 2}) == "gpu:2"

    class Runner:
        is_local = False
        argvs: list = []

        def getenv(self, key):
            return None

        def read_file(self, path):
            return "NodeName=mig-node1 Name=gpu Type=1g.10gb File=/dev/nvidia-caps/nvidia-cap[21-27]\n"

        def run(self, argv, **kw):
            from gpuhpc.transport import CommandResult

            self.argvs.append(list(argv))
            return CommandResult(tuple(argv), 0, _text("dcgmi-diag-r2-pass.json"), "")

    from gpuhpc.health.spec import HealthSpec

    r = Runner()
    report, measured = deep.run_deep_checks("mig-node1", r, HealthSpec(deep_dcgm_level=3), mig=True)
    assert [a[:4] for a in r.argvs] == [["dcgmi", "diag", "-r", "1"]]          # level 1, no all_reduce_perf
    got = {x.check: (x.status, x.message) for x in report.results}
    assert got[deep.NCCL][0] is Status.SKIP and "MIG" in got[deep.NCCL][1] and measured is None
    script = deep.job_script("mig-node1", "/opt/py bin/python", baseline=None, mig=True, spec_path=None)
    assert script.splitlines()[-1] == "exec '/opt/py bin/python' -m gpuhpc.health --mode deep-job --node mig-node1 --mig"


def test_job_result_is_the_jobs_own():
    from gpuhpc.health.checks import Report

    rep = Report("gpu-node1", [ok(deep.DCGM, "41 results pass"), fail(deep.NCCL, "nccl 313<391 GB/s", "perf")])
    line = deep.job_result("gpu-node1", "77", rep, 313.2)
    got = deep.parse_job_result("slurmstepd noise\n" + line + "\n", "gpu-node1", "77")
    assert got is not None and got[1] == 313.2
    assert [(r.check, r.status, r.category) for r in got[0].results] == \
        [(deep.DCGM, Status.OK, "hw"), (deep.NCCL, Status.FAIL, "perf")]
    assert deep.parse_job_result(line, "gpu-node2", "77") is None           # another node's
    assert deep.parse_job_result(line, "gpu-node1", "78") is None           # another job's
    assert deep.parse_job_result("", "gpu-node1", "77") is None
    assert deep.parse_job_result('{"kind": "x"}', "gpu-node1", "77") is None


def test_the_deep_job_goes_where_it_preempts_no_one():
    from types import SimpleNamespace as P

    parts = [P(name="gpu", priority_tier=1), P(name="gpu-hi", priority_tier=10), P(name="all", priority_tier=1)]
    assert deep.pick_partition(("gpu-hi", "gpu", "all"), parts) == "gpu"
    assert deep.pick_partition(("gpu", "gpu-hi"), parts, "maint") == "maint"
    assert deep.pick_partition((), parts) is None


class _Slurm:
    """A node and its controller for the held deep run: the job ends as ``outcome`` says."""

    def __init__(self, state="IDLE", reason="", outcome="pass"):
        self.state, self.reason, self.outcome = state, reason, outcome
        self.calls: list = []
        self.files: dict = {}
        self.polls = 0

    # runner
    is_local = False

    def getenv(self, key):
        return None

    def read_file(self, path):
        from gpuhpc.errors import TransportError

        if path not in self.files:
            raise TransportError("no such file")
        return self.files[path]

    # client
    def run(self, argv, **kw):
        from gpuhpc.transport import CommandResult

        self.calls.append(tuple(argv[:3]))
        return CommandResult(tuple(argv), 0, "", "")

    def node(self, name):
        from gpuhpc.slurm.parsers import NodeInfo

        return NodeInfo(name, self.state, 16, 0, 64000, 0, ("gpu",), {"h100": 8}, reason=self.reason)

    def partitions(self):
        return []

    def drain_node(self, name, reason):
        self.calls.append(("drain", reason))
        self.state, self.reason = "IDLE+DRAIN", reason + " [root@t]"

    def resume_node(self, name):
        self.calls.append(("resume",))
        self.state, self.reason = "IDLE", ""

    def cancel(self, job_id, **kw):
        self.calls.append(("cancel", job_id))

    def makedirs(self, path):
        pass

    def submit_script(self, script, *, extra=()):
        self.calls.append(("submit", tuple(extra)))
        from gpuhpc.health.checks import Report

        if self.outcome in ("pass", "fail"):
            res = [ok(deep.DCGM, "pass"), ok(deep.NCCL, "nccl 435 GB/s", "perf")] if self.outcome == "pass" else \
                [ok(deep.DCGM, "pass"), fail(deep.NCCL, "nccl 313<391 GB/s", "perf")]
            out = next(a for a in extra if a.startswith("--output=")).split("=", 1)[1]
            self.files[out.replace("%j", "9")] = deep.job_result("n1", "9", Report("n1", res), 435.0)
        return "9"

    def queue(self, *, job_ids=(), user=None):
        from types import SimpleNamespace

        from gpuhpc.slurm.state import SlurmState

        self.polls += 1
        if self.outcome == "never":     # the node's jobs never end
            return [SimpleNamespace(state=SlurmState.parse("PENDING"))]
        if self.outcome in ("FAILED", "CANCELLED"):      # ended so, with no result written
            return [SimpleNamespace(state=SlurmState.parse(f"{self.outcome} by 0"))]
        return []


def _held(slurm, **kw):
    from gpuhpc.health import check_node
    from gpuhpc.health.spec import HealthSpec

    return check_node("n1", runner=slurm, client=slurm, spec=HealthSpec(), mode="deep", apply=True,
                      baselines=None, **kw)


def test_a_failing_deep_job_drains_a_node_in_service():
    s = _Slurm(outcome="fail")
    out = _held(s)
    assert out.decision.action.value == "drain" and s.reason.startswith("gpuhpc:perf: nccl 313<391 GB/s")
    kinds = [c[0] if c[0] != "scontrol" else " ".join(c) for c in s.calls]
    # held (reservation), the job, drained once, the reservation gone; never resumed
    assert kinds == ["scontrol delete ReservationName=gpuhpc-deep-n1", "scontrol create reservation", "submit",
                     "drain", "scontrol delete ReservationName=gpuhpc-deep-n1"]
    extra = s.calls[2][1]
    assert {"--exclusive", "--nodelist=n1", "--gres=gpu:h100:8", "--reservation=gpuhpc-deep-n1", "--mem=0"} <= set(extra)


def test_a_drained_node_is_lifted_for_the_job_and_drained_again_unless_it_passes():
    hw = "gpuhpc:hw: gpu3 ecc uncorrected 2"
    s = _Slurm("IDLE+DRAIN", hw + " [root@t]", outcome="fail")
    out = _held(s)              # failing: the hardware drain's reason comes back (the first fault's)
    assert out.decision.action.value == "none" and s.reason == hw + " [root@t]" and "DRAIN" in s.state
    assert [c[0] for c in s.calls if c[0] in ("resume", "submit", "drain")] == ["resume", "submit", "drain"]
    s = _Slurm("IDLE+DRAIN", "gpuhpc:perf: nccl 300<391 GB/s [root@t]", outcome="fail")
    out = _held(s)              # a deep drain, failing again: the new measurement's reason
    assert out.decision.action.value == "drain" and s.reason.startswith("gpuhpc:perf: nccl 313<391")
    s = _Slurm("IDLE+DRAIN", hw + " [root@t]", outcome="pass")
    out = _held(s)
    assert out.decision.action.value == "resume" and "DRAIN" not in s.state
    # a look without --apply leaves the node as it found it
    s = _Slurm("IDLE+DRAIN", hw + " [root@t]", outcome="pass")
    from gpuhpc.health import check_node
    from gpuhpc.health.spec import HealthSpec

    out = check_node("n1", runner=s, client=s, spec=HealthSpec(), mode="deep", apply=False)
    assert out.decision.action.value == "resume" and not out.applied and s.reason == hw + " [root@t]"


def test_an_admins_drain_is_not_held_or_tested():
    s = _Slurm("IDLE+DRAIN", "RMA 7 [alice@t]")
    out = _held(s)
    assert out.decision.action.value == "none" and not s.calls and out.report.healthy
    assert "drained by someone else" in out.report.results[0].message


def test_a_job_that_waits_too_long_is_cancelled_and_tests_nothing():
    s = _Slurm(outcome="never")
    out = _held(s, wait_s=0)
    assert ("cancel", "9") in s.calls and s.calls[-1][:2] == ("scontrol", "delete")
    assert out.decision.action.value == "none" and all(r.status is Status.SKIP for r in out.report.results)


def test_spec_deep_job_keys():
    from gpuhpc.errors import UserInputError
    from gpuhpc.health.spec import load

    s = load("deep: {mig_dcgm_level: 2, partition: maint, wait_s: 600, results_dir: /shared/deep}")
    assert (s.deep_mig_dcgm_level, s.deep_partition, s.deep_wait_s, s.deep_results_dir) == (2, "maint", 600.0,
                                                                                          "/shared/deep")
    for bad, field in (("{mig_dcgm_level: 5}", "deep.mig_dcgm_level"), ("{results_dir: rel}", "deep.results_dir"),
                       ("{partition: 'a b'}", "deep.partition")):
        with pytest.raises(UserInputError) as exc:
            load(f"deep: {bad}")
        assert exc.value.field.endswith(field)


def test_a_job_that_ended_without_a_result():
    """A job that failed on the node is a sw failure (a deep check's own drain); one an admin
    cancelled tested nothing and decides nothing."""
    s = _Slurm(outcome="FAILED")
    out = _held(s)
    assert out.decision.action.value == "drain" and s.reason.startswith(
        "gpuhpc:sw: dcgm diag: deep-check job 9 ended FAILED with no result")
    s = _Slurm(outcome="CANCELLED")
    out = _held(s)
    assert out.decision.action.value == "none" and all(r.status is Status.SKIP for r in out.report.results)
