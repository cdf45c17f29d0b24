"""`gpuhpc node reboot`: its argument checks (exit 2, one line naming the field) and its batches,
against `scontrol --oneliner show node` records captured from Slurm (the local cluster's 22.05 and
the lab's 24.11 during a real reboot, tests/integration/lab/test_lab_reboot.py), replayed in order."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from cli_helpers import gpuhpc
from gpuhpc.errors import UserInputError
from gpuhpc.slurm import reboot as rb
from gpuhpc.transport import CommandResult

REPO = Path(__file__).resolve().parents[3]

# the local cluster (Slurm 22.05.8), an idle node
LOCAL_IDLE = (
    "NodeName=cpu-node1 Arch=x86_64 CoresPerSocket=8  CPUAlloc=0 CPUEfctv=16 CPUTot=16 CPULoad=1.08 "
    "AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null) NodeAddr=127.0.0.1 NodeHostName=localhost "
    "Port=17104 Version=22.05.8 OS=Linux 6.18.44-fc-v1098 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=32000 "
    "AllocMem=0 FreeMem=19836 Sockets=2 Boards=1 State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A "
    "MCS_label=N/A Partitions=cpu,all  BootTime=2026-12-02T20:47:18 SlurmdStartTime=2026-12-03T12:50:16 "
    "LastBusyTime=2026-12-03T12:50:49 CfgTRES=cpu=16,mem=32000M,billing=16 AllocTRES= CapWatts=n/a "
    "CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s")

# ---------------------------------------------------------------- the lab's c1 (Slurm 24.11) during
# `gpuhpc node reboot c1 --reason "driver update"` with a job on it: the records as they changed
LAB_IDLE = (
    'NodeName=c1 Arch=x86_64 CoresPerSocket=2  CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=8.55 '
    'AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null) NodeAddr=c1 NodeHostName=c1 '
    'Version=24.11.5 OS=Linux 6.18.44-fc-v1098 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=2000 AllocMem=0 '
    'FreeMem=18504 Sockets=1 Boards=1 State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A '
    'MCS_label=N/A Partitions=compute  BootTime=2026-12-03T12:59:31 SlurmdStartTime=2026-12-03T13:08:47 '
    'LastBusyTime=2026-12-03T13:08:47 ResumeAfterTime=None CfgTRES=cpu=2,mem=2000M,billing=2 AllocTRES= '
    'CurrentWatts=0 AveWatts=0 ')
LAB_MIXED = (
    'NodeName=c1 Arch=x86_64 CoresPerSocket=2  CPUAlloc=1 CPUEfctv=2 CPUTot=2 CPULoad=8.55 '
    'AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null) NodeAddr=c1 NodeHostName=c1 '
    'Version=24.11.5 OS=Linux 6.18.44-fc-v1098 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=2000 AllocMem=500 '
    'FreeMem=18504 Sockets=1 Boards=1 State=MIXED ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A '
    'MCS_label=N/A Partitions=compute  BootTime=2026-12-03T12:59:31 SlurmdStartTime=2026-12-03T13:08:47 '
    'LastBusyTime=2026-12-03T13:08:47 ResumeAfterTime=None CfgTRES=cpu=2,mem=2000M,billing=2 '
    'AllocTRES=cpu=1,mem=500M CurrentWatts=0 AveWatts=0 ')
LAB_REQUESTED = (
    'NodeName=c1 Arch=x86_64 CoresPerSocket=2  CPUAlloc=1 CPUEfctv=2 CPUTot=2 CPULoad=8.55 '
    'AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null) NodeAddr=c1 NodeHostName=c1 '
    'Version=24.11.5 OS=Linux 6.18.44-fc-v1098 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=2000 AllocMem=500 '
    'FreeMem=18504 Sockets=1 Boards=1 State=MIXED+DRAIN+REBOOT_REQUESTED ThreadsPerCore=1 TmpDisk=0 '
    'Weight=1 Owner=N/A MCS_label=N/A NextState=RESUME Partitions=compute  BootTime=2026-12-03T12:59:31 '
    'SlurmdStartTime=2026-12-03T13:08:47 LastBusyTime=2026-12-03T13:08:47 ResumeAfterTime=None '
    'CfgTRES=cpu=2,mem=2000M,billing=2 AllocTRES=cpu=1,mem=500M CurrentWatts=0 AveWatts=0  Reason=driver '
    'update [root@2026-12-03T13:09:41]')
LAB_REQUESTED_IDLE = (
    'NodeName=c1 Arch=x86_64 CoresPerSocket=2  CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=8.55 '
    'AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null) NodeAddr=c1 NodeHostName=c1 '
    'Version=24.11.5 OS=Linux 6.18.44-fc-v1098 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=2000 AllocMem=0 '
    'FreeMem=18504 Sockets=1 Boards=1 State=IDLE+DRAIN+REBOOT_REQUESTED ThreadsPerCore=1 TmpDisk=0 '
    'Weight=1 Owner=N/A MCS_label=N/A NextState=RESUME Partitions=compute  BootTime=2026-12-03T12:59:31 '
    'SlurmdStartTime=2026-12-03T13:08:47 LastBusyTime=2026-12-03T13:09:43 ResumeAfterTime=None '
    'CfgTRES=cpu=2,mem=2000M,billing=2 AllocTRES= CurrentWatts=0 AveWatts=0  Reason=driver update '
    '[root@2026-12-03T13:09:41]')
LAB_ISSUED = (
    'NodeName=c1 Arch=x86_64 CoresPerSocket=2  CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=8.55 '
    'AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null) NodeAddr=c1 NodeHostName=c1 '
    'Version=24.11.5 OS=Linux 6.18.44-fc-v1098 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=2000 AllocMem=0 '
    'FreeMem=18504 Sockets=1 Boards=1 State=DOWN+DRAIN+REBOOT_ISSUED ThreadsPerCore=1 TmpDisk=0 Weight=1 '
    'Owner=N/A MCS_label=N/A NextState=RESUME Partitions=compute  BootTime=2026-12-03T12:59:31 '
    'SlurmdStartTime=2026-12-03T13:08:47 LastBusyTime=2026-12-03T13:09:43 ResumeAfterTime=None '
    'CfgTRES=cpu=2,mem=2000M,billing=2 AllocTRES= CurrentWatts=0 AveWatts=0  Reason=driver update : '
    'reboot issued [slurm@2026-12-03T13:09:43]')
LAB_BACK = (
    'NodeName=c1 Arch=x86_64 CoresPerSocket=2  CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=8.68 '
    'AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null) NodeAddr=c1 NodeHostName=c1 '
    'Version=24.11.5 OS=Linux 6.18.44-fc-v1098 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=2000 AllocMem=0 '
    'FreeMem=18680 Sockets=1 Boards=1 State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A '
    'MCS_label=N/A Partitions=compute  BootTime=2026-12-03T13:09:43 SlurmdStartTime=2026-12-03T13:09:45 '
    'LastBusyTime=2026-12-03T13:09:45 ResumeAfterTime=None CfgTRES=cpu=2,mem=2000M,billing=2 AllocTRES= '
    'CurrentWatts=0 AveWatts=0 ')
# the sequence one node shows: before the request (a job runs), then as the reads see it after
LAB_REBOOT = [LAB_MIXED, LAB_REQUESTED, LAB_REQUESTED_IDLE, LAB_ISSUED, LAB_BACK]


def _record(name: str, text: str) -> str:
    """A recorded record under another node name (the records hold no other trace of the name)."""
    first = text.split(" ", 1)
    return f"NodeName={name} {first[1]}"


class Replay:
    """A runner that answers `scontrol --oneliner show node NODES` from recorded records: each node
    has its records in the order Slurm showed them, the first until its reboot is asked, then one
    more per read (the last one stays). It records every argv it was given."""
    is_local = False

    def __init__(self, steps: dict[str, list[str]], refuse: str | None = None):
        self.steps = steps
        self.pos = {n: 0 for n in steps}
        self.asked: set[str] = set()
        self.argvs: list[list[str]] = []
        self.reboots: list[tuple[str, dict[str, int]]] = []    # (NODES, every node's position then)
        self.refuse = refuse

    def getenv(self, name, default=None):
        return default

    def run(self, argv, *, input=None, timeout=None, env=None, cwd=None):
        argv = list(argv)
        self.argvs.append(argv)
        if argv[:2] == ["scontrol", "reboot"]:
            if self.refuse:
                return CommandResult(tuple(argv), 1, "", self.refuse)
            self.reboots.append((argv[-1], dict(self.pos)))
            self.asked.update(argv[-1].split(","))
            return CommandResult(tuple(argv), 0, "", "")
        assert argv[:4] == ["scontrol", "--oneliner", "show", "node"], argv
        names = argv[4].split(",") if len(argv) > 4 else list(self.steps)
        lines = []
        for n in names:
            recs = self.steps[n]
            lines.append(recs[min(self.pos[n], len(recs) - 1)])
            if n in self.asked:
                self.pos[n] += 1
        return CommandResult(tuple(argv), 0, "\n".join(lines) + "\n", "")


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.t += s


# ---------------------------------------------------------------- argument checks
@pytest.mark.parametrize("args, field", [
    (["c1", "--batch", "0", "--reason", "x"], "--batch"),
    (["c1", "--batch", "-2", "--reason", "x"], "--batch"),
    (["c1", "--reason", "  "], "--reason"),
    (["c1", "--reason", "driver\nupdate"], "--reason"),
    (["c1", "--reason", 'say "hi"'], "--reason"),
    (["c1", "--reason", "x" * 201], "--reason"),
    (["c[1-", "--reason", "x"], "NODES"),
    (["c1", "--reason", "x", "--timeout", "0"], "--timeout"),
])
def test_bad_input_exits_2_with_one_line_naming_the_field_before_any_slurm_call(args, field):
    res = gpuhpc("node", "reboot", *args, env={"PATH": "/nonexistent"})   # no scontrol could run
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and field in lines[0], res.stderr


def test_a_missing_reason_is_a_usage_error():
    res = gpuhpc("node", "reboot", "c1", env={"PATH": "/nonexistent"})
    assert res.returncode == 2 and "--reason" in res.stderr


def test_an_unknown_node_exits_2_naming_it_and_nothing_is_rebooted(monkeypatch):
    from gpuhpc.cli import node as node_cli

    replay = Replay({"cpu-node1": [LOCAL_IDLE]})
    monkeypatch.setattr(node_cli, "_runner", lambda: replay)
    res = CliRunner().invoke(node_cli.node_group, ["reboot", "cpu-node[1-2]", "--reason", "fw"],
                             standalone_mode=False)
    assert isinstance(res.exception, UserInputError) and res.exception.field == "NODES"
    assert "cpu-node2" in str(res.exception)
    assert not any(a[:2] == ["scontrol", "reboot"] for a in replay.argvs)


def test_the_reason_is_one_argv_word_after_asap_and_nextstate_resume():
    assert rb.reboot_argv("c[1-2]", "driver 550 update; rm -rf /") == [
        "scontrol", "reboot", "ASAP", "nextstate=RESUME", "reason=driver 550 update; rm -rf /", "c[1-2]"]
    with pytest.raises(UserInputError):
        rb.reboot_argv("c1", "a'b")


def test_batches_keep_the_order_and_the_last_may_be_short():
    assert rb.batches(["a", "b", "c", "d", "e"], 2) == [["a", "b"], ["c", "d"], ["e"]]
    assert rb.batches(["a"], 8) == [["a"]]
    with pytest.raises(UserInputError):
        rb.batches(["a"], 0)


# ---------------------------------------------------------------- recorded records
def test_the_recorded_22_05_record_parses_with_its_boot_time():
    node = rb.parse_node_boots(LOCAL_IDLE)["cpu-node1"]
    assert node.base == "IDLE" and node.flags == frozenset() and node.reason == ""
    import datetime as dt
    assert node.boot_time == dt.datetime(2026, 12, 2, 20, 47, 18).timestamp()


def test_the_recorded_24_11_reboot_is_pending_until_the_node_is_back_with_a_later_boot_time():
    seq = [rb.parse_node_boots(r)["c1"] for r in LAB_REBOOT]
    before = seq[0]
    assert [rb.progress(before, n) for n in seq[1:]] == ["pending", "pending", "pending", "back"]
    assert seq[1].flags == {"DRAIN", "REBOOT_REQUESTED"} and seq[1].reason.startswith("driver update [root@")
    assert seq[3].base == "DOWN" and "REBOOT_ISSUED" in seq[3].flags      # DOWN while it reboots: not a failure
    assert seq[4].boot_time > before.boot_time and seq[4].reason == ""
    # the same record before and after: not back, whatever its state
    assert rb.progress(before, seq[0]) == "pending"


def _steps(*names: str, seq=LAB_REBOOT) -> dict[str, list[str]]:
    return {n: [_record(n, r) for r in seq] for n in names}


def test_batches_reboot_one_after_another_each_once_the_previous_is_back():
    replay = Replay(_steps("c1", "c2", "c3"))
    clock = Clock()
    lines = []
    out = rb.rollout(_client(replay), ["c1", "c2", "c3"], batch=2, reason="driver update", poll=5,
                     report=lines.append, clock=clock, sleep=clock.sleep)
    assert out.rebooted == ["c1", "c2", "c3"] and out.failed == [] and out.untouched == []
    last = len(LAB_REBOOT) - 1
    # the second batch was asked only once both nodes of the first showed their new boot
    assert [(nodes, pos) for nodes, pos in replay.reboots] == [
        ("c1,c2", {"c1": 0, "c2": 0, "c3": 0}), ("c3", {"c1": last + 1, "c2": last + 1, "c3": 0})]
    assert replay.argvs[1] == ["scontrol", "reboot", "ASAP", "nextstate=RESUME", "reason=driver update", "c1,c2"]
    assert lines[0].startswith("batch 1/2: reboot requested for c1,c2")


def test_no_wait_asks_every_batch_at_once():
    replay = Replay(_steps("c1", "c2", "c3"))
    out = rb.rollout(_client(replay), ["c1", "c2", "c3"], batch=1, reason="fw", wait=False)
    assert [n for n, _ in replay.reboots] == ["c1", "c2", "c3"] and out.requested == ["c1", "c2", "c3"]


def test_a_node_that_stays_rebooting_past_the_timeout_stops_the_rollout_and_later_batches_are_not_asked():
    steps = _steps("c1", "c3")
    steps.update(_steps("c2", seq=[LAB_MIXED, LAB_REQUESTED, LAB_ISSUED]))     # never registers again
    replay = Replay(steps)
    clock = Clock()
    out = rb.rollout(_client(replay), ["c1", "c2", "c3"], batch=1, reason="fw", timeout=240, poll=5,
                     clock=clock, sleep=clock.sleep)
    assert out.rebooted == ["c1"] and out.untouched == ["c3"]
    assert [n for n, _ in replay.reboots] == ["c1", "c2"]
    assert out.failed == [("c2", "not back after 240 s: DOWN+DRAIN+REBOOT_ISSUED (driver update : reboot issued "
                                 "[slurm@2026-12-03T13:09:43])")]
    assert clock.t >= 240


def test_the_command_exits_1_naming_the_node_and_the_nodes_left(monkeypatch):
    from gpuhpc.cli import node as node_cli
    from gpuhpc.errors import GpuhpcError

    steps = _steps("c1", "c3")
    steps.update(_steps("c2", seq=[LAB_MIXED, LAB_REQUESTED, LAB_ISSUED]))
    replay = Replay(steps)
    clock = Clock()
    monkeypatch.setattr(node_cli, "_runner", lambda: replay)
    monkeypatch.setattr(rb, "time", SimpleNamespace(monotonic=clock, sleep=clock.sleep))
    res = CliRunner().invoke(node_cli.node_group, ["reboot", "c[1-3]", "--reason", "fw", "--timeout", "30"],
                             standalone_mode=False)
    assert isinstance(res.exception, GpuhpcError) and res.exception.exit_code == 1, res.output
    assert str(res.exception) == ("rollout stopped: c2 not back after 30 s: DOWN+DRAIN+REBOOT_ISSUED (driver update : "
                                  "reboot issued [slurm@2026-12-03T13:09:43]); not rebooted: c3")
    assert "rebooted and back: c1" in res.output


# the lab's scontrol (24.11) when slurm.conf has no RebootProgram (exit 1)
REFUSED = "scontrol: error: RebootProgram isn't defined\nscontrol_reboot_nodes error: Unspecified error\n"


def test_slurm_refusing_the_reboot_stops_the_rollout_with_its_words():
    from gpuhpc.errors import GpuhpcError

    replay = Replay(_steps("c1", "c2"), refuse=REFUSED)
    with pytest.raises(GpuhpcError) as err:
        rb.rollout(_client(replay), ["c1", "c2"], batch=1, reason="fw")
    assert str(err.value) == ("Slurm refused to reboot c1: scontrol: error: RebootProgram isn't defined; "
                              "scontrol_reboot_nodes error: Unspecified error")
    assert err.value.exit_code == 1
    assert [a[:2] for a in replay.argvs].count(["scontrol", "reboot"]) == 1


def _client(replay):
    from gpuhpc.slurm.client import SlurmClient

    return SlurmClient(replay)


def test_a_node_booted_but_left_drained_or_down_is_not_back():
    # derived from the recorded records: what a health check's drain, or ResumeTimeout, leaves
    before = rb.parse_node_boots(LAB_MIXED)["c1"]
    drained = rb.parse_node_boots(LAB_BACK.replace("State=IDLE ", "State=IDLE+DRAIN "))["c1"]
    timed_out = rb.parse_node_boots(LAB_ISSUED.replace("State=DOWN+DRAIN+REBOOT_ISSUED ", "State=DOWN+DRAIN "))["c1"]
    assert rb.progress(before, drained) == "settled"
    assert rb.progress(before, timed_out) == "down"
    replay = Replay({"c1": [LAB_MIXED, LAB_REQUESTED, LAB_BACK.replace("State=IDLE ", "State=IDLE+DRAIN ")],
                     **_steps("c2")})
    clock = Clock()
    out = rb.rollout(_client(replay), ["c1", "c2"], batch=1, reason="fw", settle=30, poll=5,
                     clock=clock, sleep=clock.sleep)
    assert [n for n, _ in out.failed] == ["c1"] and "not returned to service: IDLE+DRAIN" in out.failed[0][1]
    assert out.untouched == ["c2"] and [n for n, _ in replay.reboots] == ["c1"]


# ---------------------------------------------------------------- slurm.conf's side
def _slurm_conf(**runtime) -> str:
    import yaml

    from gpuhpc.conf.render import render_spec
    from gpuhpc.spec.cluster import spec_from_data

    data = yaml.safe_load((REPO / "examples" / "clusters" / "dgx-h100-pod.yaml").read_text())
    data.setdefault("runtime", {}).update(runtime)
    files, _ = render_spec(spec_from_data(data))
    return files["slurm.conf"]


def test_reboot_program_and_its_resume_timeout_follow_the_spec():
    conf = _slurm_conf(reboot_program="/usr/local/sbin/site-reboot", reboot_timeout=900).splitlines()
    assert "RebootProgram=/usr/local/sbin/site-reboot" in conf and "ResumeTimeout=900" in conf
    conf = _slurm_conf(reboot_program=None)
    assert "RebootProgram" not in conf and "ResumeTimeout" not in conf


@pytest.mark.parametrize("runtime", [{"reboot_program": "reboot"}, {"reboot_program": "/sbin/reboot now"},
                                     {"reboot_timeout": 30}])
def test_a_bad_reboot_setting_is_refused_naming_it(runtime):
    from gpuhpc.errors import SpecError

    with pytest.raises(SpecError) as err:
        _slurm_conf(**runtime)
    assert err.value.field == f"runtime.{next(iter(runtime))}"
