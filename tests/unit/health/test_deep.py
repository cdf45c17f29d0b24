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
